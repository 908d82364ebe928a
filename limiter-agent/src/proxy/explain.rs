//! `limiter explain` at the proxy: a described request taken through the steps that
//! come before the limits (the canonical path, the client address through trusted
//! proxies, the key the request would prove, its scopes), then explained by the engine.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use limiter_core::{Clock, ja4::Ja4, jwt::Claims, path::CanonicalPath, signature::verify::API_KEY_HEADER};
use serde::{Deserialize, Serialize};

use super::keys;
use crate::{
    config::{
        ProxyConfig,
        conditions::http1_body_length,
        proxy::{ApiKey, KeyAuth},
    },
    limits::{Engine, Explanation, RequestInfo, Screened},
};

/// A request as the operator describes it to `limiter explain`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExplainRequest {
    pub method: String,
    pub path: String,
    /// `(name, value)` pairs, in order.
    pub headers: Vec<(String, String)>,
    /// The TCP peer the request would come from.
    pub peer: IpAddr,
    /// Its body, for the rules keyed on it.
    #[serde(default)]
    pub body: Option<Vec<u8>>,
    /// The JA4 fingerprint of the peer's TLS handshake.
    #[serde(default)]
    pub ja4: Option<Ja4>,
}

/// How a request proves its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProofKind {
    /// Its id in `X-API-Key` (`auth = "bearer"`).
    Bearer,
    /// A signature, assumed valid: explain cannot check one it is not given.
    Signature,
}

/// What the proxy would do with an [`ExplainRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProxyExplanation {
    /// The path rules see (canonical, without the query).
    pub route: String,
    /// The client the limits key by: the peer, or the address a trusted proxy names.
    pub client: IpAddr,
    /// The key the request would prove, if any.
    pub key: Option<String>,
    /// How it would prove it.
    pub proof: Option<ProofKind>,
    /// The `deny` rule that would refuse it (403) before the limits.
    pub denied_by: Option<String>,
    /// The `tag` rules that would mark it.
    pub tagged: Vec<String>,
    /// What the scopes make of it; `None`: the config has none.
    pub scopes: Option<ScopeExplanation>,
    #[serde(flatten)]
    pub limits: Explanation,
    /// `[proxy.adaptive]`: the upstream's limit now, with its requests in flight and
    /// queued; `None`: off, or no agent to ask.
    #[serde(default)]
    pub adaptive: Option<AdaptiveNow>,
}

/// The adaptive limit as a running agent has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AdaptiveNow {
    pub limit: u32,
    pub inflight: u64,
    pub queued: u64,
}

/// Where a request stands with the `[[proxy.scopes]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeExplanation {
    /// The scopes whose area it is in, in the config's order; empty: any request may
    /// call it.
    pub covering: Vec<String>,
    /// The first of them its key does not hold (for a keyless request, the first).
    pub missing: Option<String>,
    /// What the proxy answers before the limits: 401 without a key, 403 for a key
    /// without `missing`; `None`: it lets the request on.
    pub status: Option<u16>,
}

/// A described request the proxy would refuse before its limits, or could not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExplainError {
    #[error("method {0:?}: not an HTTP method")]
    Method(String),
    #[error("header {0:?}: not a valid header name and value")]
    Header(String),
    #[error("path {path:?} is refused with 400 before any limit: {reason}")]
    Path { path: String, reason: String },
}

/// The claims of the JWT a request's headers carry, if it verifies.
pub(crate) type VerifyJwt<'a> = dyn Fn(&HeaderMap) -> Option<Claims> + Sync + 'a;

/// Explains `request` under `config`; with `live`, with each bucket's quota now.
/// `jwt` verifies the request's token (the running agent's keys); without it, `jwt:`
/// keys are missing.
pub async fn explain<C: Clock>(
    config: &ProxyConfig,
    engine: &Engine<C>,
    request: &ExplainRequest,
    live: bool,
    jwt: Option<&VerifyJwt<'_>>,
) -> Result<ProxyExplanation, ExplainError> {
    let method =
        Method::from_bytes(request.method.as_bytes()).map_err(|_| ExplainError::Method(request.method.clone()))?;
    let mut headers = HeaderMap::new();
    for (name, value) in &request.headers {
        let header = || ExplainError::Header(name.clone());
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| header())?,
            HeaderValue::from_str(value).map_err(|_| header())?,
        );
    }
    let (path, query) = match request.path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (request.path.as_str(), None),
    };
    let path = CanonicalPath::parse(path, config.path_options())
        .map_err(|reason| ExplainError::Path { path: request.path.clone(), reason: reason.to_string() })?;
    let client = keys::client_ip(request.peer, &headers, &config.trusted_proxies);
    let proven = proven_key(config, &headers);
    let (key, proof) = match proven {
        Some((key, auth)) => (Some(key.id.clone()), Some(auth)),
        None => (None, None),
    };
    let claims = jwt.and_then(|verify| verify(&headers));
    let body_length = http1_body_length(&headers).or_else(|| Some(request.body.as_ref()?.len() as u64));
    // As the proxy reads it: only a body within `[proxy.body_keys] max_bytes`.
    let body = request.body.as_deref().filter(|body| body.len() as u64 <= config.body_keys.max_bytes);
    let info = RequestInfo {
        method: &method,
        path: path.route(),
        client,
        api_key: key.as_deref(),
        jwt: claims.as_ref(),
        headers: &headers,
        query,
        body_length,
        body,
        // As a request's: from a trusted proxy, what its `ja4_header` names.
        ja4: if keys::is_trusted(request.peer.to_canonical(), &config.trusted_proxies) {
            config.ja4_header.as_ref().and_then(|name| keys::believed_ja4(&headers, name))
        } else {
            request.ja4
        },
    };
    let Screened { denied_by, tagged, .. } = engine.would_screen(&info);
    let scopes = (!config.scopes.is_empty()).then(|| {
        let seen = info.seen();
        let missing = config.scope_missing(&seen, proven.map(|(key, _)| key)).map(|scope| scope.name.clone());
        let status = missing.as_ref().map(|_| if proven.is_some() { 403 } else { 401 });
        let covering = config.scopes.iter().filter(|scope| scope.covers(&seen)).map(|s| s.name.clone()).collect();
        ScopeExplanation { covering, missing, status }
    });
    let limits = engine.explain(&info, live).await;
    Ok(ProxyExplanation {
        route: path.route().to_owned(),
        client,
        key,
        proof,
        denied_by,
        tagged,
        scopes,
        limits,
        adaptive: None,
    })
}

/// The configured key `X-API-Key` names (one value only, as the pipeline takes it),
/// and how the request would prove it.
fn proven_key<'c>(config: &'c ProxyConfig, headers: &HeaderMap) -> Option<(&'c ApiKey, ProofKind)> {
    let mut values = headers.get_all(API_KEY_HEADER).iter();
    let id = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let key = config.keys.iter().find(|key| key.id == id)?;
    let proof = match key.auth {
        KeyAuth::Bearer => ProofKind::Bearer,
        KeyAuth::Signature => ProofKind::Signature,
    };
    Some((key, proof))
}
