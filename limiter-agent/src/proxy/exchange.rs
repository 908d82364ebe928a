//! One request as it goes through the pipeline's phases: what it is, where it came
//! from and what each phase learned of it, passed from phase to phase instead of an
//! argument list (pingora's session and context in one).

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderValue, header, request};
use hyper::body::{Body as _, Incoming};
use limiter_core::{ja4::Ja4, jwt::Claims, path::CanonicalPath, signature::Authenticated};

use super::{
    forward::{Origin, Upstream},
    heavy::Client,
    keys,
    problem::Refusal,
    snapshot::Snapshot,
};
use crate::{backend::Claim, config::ProxyConfig, limits::RequestInfo};

/// What proves which key a request is.
pub(super) enum Proof {
    /// Nothing: the request is keyless.
    None,
    /// A valid signature, recorded in the replay cache.
    Signed(Authenticated),
    /// The id of an `auth = "bearer"` key.
    Bearer(String),
}

impl Proof {
    /// Whom `limiter top` counts the request for.
    pub(super) fn client(&self, address: IpAddr) -> Client<'_> {
        match self {
            Self::None => Client::Address(address),
            Self::Signed(authenticated) => Client::Signed(&authenticated.key_id),
            Self::Bearer(id) => Client::Bearer(id),
        }
    }

    pub(super) fn key_id(&self) -> Option<&str> {
        match self {
            Self::None => None,
            Self::Signed(authenticated) => Some(&authenticated.key_id),
            Self::Bearer(id) => Some(id),
        }
    }
}

/// A request past its head's checks, on its way to an answer.
pub(super) struct Exchange<'s> {
    /// The config it is served under, whatever a reload does meanwhile.
    pub snapshot: &'s Snapshot,
    /// The pool of the worker serving its connection.
    pub upstream: &'s Upstream,
    pub origin: Origin,
    /// The head as received, with `Host` filled in from an HTTP/2 authority.
    pub parts: request::Parts,
    /// The one path rules, `+route` keys and the upstream see.
    pub path: CanonicalPath,
    /// The body's length as its head told it ([`crate::config::conditions::Seen::body_length`]).
    pub body_length: Option<u64>,
    /// Whom the limits count: the peer, or the client a trusted proxy names.
    pub client: IpAddr,
    /// Set once the request proved a key.
    pub proof: Proof,
    /// The claims of its JWT, once verified (only where a rule that applies needs them).
    pub jwt: Option<Claims>,
    /// The idempotency key this request holds until its response is stored.
    pub claim: Option<Claim>,
    /// The body, once read for a rule keyed on it.
    pub body: Option<Bytes>,
    /// The client's TLS fingerprint: its handshake's, or, from a trusted proxy, the
    /// one `ja4_header` names (the handshake is then the proxy's own).
    pub ja4: Option<Ja4>,
}

impl<'s> Exchange<'s> {
    /// The head of a request from `origin`, checked for what needs no state: it names
    /// one host, and its path has a canonical form.
    pub(super) fn arrive(
        snapshot: &'s Snapshot,
        upstream: &'s Upstream,
        origin: Origin,
        mut parts: request::Parts,
        body: &Incoming,
    ) -> Result<Self, Refusal> {
        let mut hosts = parts.headers.get_all(header::HOST).iter();
        let (host, another) = (hosts.next(), hosts.next());
        let authority = parts.uri.authority();
        let disagree = host
            .zip(authority)
            .is_some_and(|(host, authority)| !host.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()));
        if another.is_some() || disagree {
            return Err(Refusal::AmbiguousHost);
        }
        // HTTP/2 names the host in the URI alone: as a header, rules, signatures and
        // the upstream see it as they do over HTTP/1.1.
        if host.is_none()
            && let Some(host) = authority.and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
        let config = &snapshot.config;
        // The signature covers the target as sent; everything else sees this.
        let path = CanonicalPath::parse(parts.uri.path(), config.path_options()).map_err(Refusal::BadPath)?;
        let client = keys::client_ip(origin.peer, &parts.headers, &config.trusted_proxies);
        // hyper's hint is exact for a `Content-Length` and for a head that ended the
        // request, over either protocol; an HTTP/2 body without `content-length` is
        // as unknown as a chunked one.
        let body_length = body.size_hint().exact();
        let ja4 = if origin.peer_trusted {
            config.ja4_header.as_ref().and_then(|name| keys::believed_ja4(&parts.headers, name))
        } else {
            origin.handshake
        };
        Ok(Self {
            snapshot,
            upstream,
            origin,
            parts,
            path,
            body_length,
            client,
            proof: Proof::None,
            jwt: None,
            claim: None,
            body: None,
            ja4,
        })
    }

    pub(super) fn config(&self) -> &'s ProxyConfig {
        &self.snapshot.config
    }

    /// The plan of the key it proved so far.
    pub(super) fn plan(&self) -> Option<&'s str> {
        let snapshot = self.snapshot;
        self.proof.key_id().and_then(|id| snapshot.key(id)).map(|key| key.plan.as_str())
    }

    /// What rules and the limits see of it, with the key it proved so far.
    pub(super) fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            method: &self.parts.method,
            path: self.path.route(),
            client: self.client,
            api_key: self.proof.key_id(),
            jwt: self.jwt.as_ref(),
            headers: &self.parts.headers,
            query: self.parts.uri.query(),
            body_length: self.body_length,
            body: self.body.as_deref(),
            ja4: self.ja4,
        }
    }
}
