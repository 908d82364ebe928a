//! What one config makes of requests, taken apart once per reload: the verifier of
//! its keys, its certificates, what verifies JWTs, which keys are bearer keys, which
//! plans disclose what, and the challenges of its 401s.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use http::{HeaderMap, HeaderValue};
use limiter_core::{
    jwt,
    signature::{Verifier, verify::API_KEY_HEADER},
};

use crate::{
    config::{
        ProxyConfig,
        proxy::{ApiKey, Disclose, KeyAuth},
    },
    signature::KeySecrets,
    tls::ServerTls,
};

/// What one config makes of requests: swapped whole on reload.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub config: Arc<ProxyConfig>,
    /// The listener's certificates, as loaded with the config.
    pub tls: Option<ServerTls>,
    pub verifier: Verifier,
    /// With `[proxy.jwt]`: its keys, as loaded with the config.
    pub jwt: Option<Arc<jwt::Verifier>>,
    /// Ids of the keys with `auth = "bearer"`.
    bearer: HashSet<String>,
    /// Keys whose plan sets its own `disclose`.
    disclose_of: HashMap<String, Disclose>,
    /// Some rule is keyed on the body (`json:`, `form:`): only then is a request
    /// asked whether its body is to be read for a key.
    pub body_keyed: bool,
    /// Each key's place in `config.keys`, by id.
    key_index: HashMap<String, usize>,
    /// The `WWW-Authenticate` of a 401 for a signature that failed.
    pub signature_challenge: HeaderValue,
    /// The `WWW-Authenticate` of a 401 for a request that proves no key where one is
    /// needed: a challenge for each way the config's keys prove themselves. It never
    /// depends on the key id a request names, which it would tell apart.
    pub key_challenge: HeaderValue,
    /// The `WWW-Authenticate` of a 401 for a request without a JWT that verified where
    /// a `jwt:` key needs one (RFC 6750).
    pub jwt_challenge: HeaderValue,
}

impl Snapshot {
    pub(super) fn new(config: Arc<ProxyConfig>, secrets: KeySecrets) -> Self {
        let bearer: HashSet<String> =
            config.keys.iter().filter(|key| key.auth == KeyAuth::Bearer).map(|key| key.id.clone()).collect();
        let disclose_of = config
            .keys
            .iter()
            .filter_map(|key| Some((key.id.clone(), config.plans.get(&key.plan)?.disclose?)))
            .collect();
        let key_index = config.keys.iter().enumerate().map(|(i, key)| (key.id.clone(), i)).collect();
        let realm = &config.realm;
        let signature = format!("Limiter-HMAC realm=\"{realm}\"");
        let signing = config.keys.iter().any(|key| key.auth == KeyAuth::Signature);
        let schemes: Vec<String> = [
            (signing || bearer.is_empty()).then(|| signature.clone()),
            (!bearer.is_empty()).then(|| format!("Bearer realm=\"{realm}\"")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let tls = secrets.tls().cloned();
        let jwt = secrets.jwt().cloned();
        let body_keyed = config.rules.iter().any(|rule| rule.key.needs_body());
        Self {
            verifier: Verifier::new(secrets.into_keys()),
            tls,
            signature_challenge: challenge(&signature),
            key_challenge: challenge(&schemes.join(", ")),
            jwt_challenge: challenge(&format!("Bearer realm=\"{realm}\"")),
            jwt,
            config,
            bearer,
            disclose_of,
            key_index,
            body_keyed,
        }
    }

    /// The configured key `id` names.
    pub(super) fn key(&self, id: &str) -> Option<&ApiKey> {
        self.key_index.get(id).and_then(|&i| self.config.keys.get(i))
    }

    /// What the rate-limit headers and refusals may tell a client that proved `key`.
    pub(super) fn disclose(&self, key: Option<&str>) -> Disclose {
        key.and_then(|key| self.disclose_of.get(key)).copied().unwrap_or(self.config.disclose)
    }

    /// The bearer key `X-API-Key` names, if it names one (and only one).
    pub(super) fn bearer_key(&self, headers: &HeaderMap) -> Option<String> {
        let mut values = headers.get_all(API_KEY_HEADER).iter();
        let id = values.next()?.to_str().ok()?;
        (values.next().is_none() && self.bearer.contains(id)).then(|| id.to_owned())
    }
}

/// A `WWW-Authenticate` value; the config allows only realms that make a valid one.
fn challenge(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or(HeaderValue::from_static("Limiter-HMAC"))
}
