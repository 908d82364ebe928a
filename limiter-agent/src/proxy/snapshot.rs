//! What one config makes of requests, taken apart once per reload: the verifier of
//! its keys, its certificates, which keys are bearer keys and which plans disclose what.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use http::HeaderMap;
use limiter_core::signature::{Verifier, verify::API_KEY_HEADER};

use crate::{
    config::{
        ProxyConfig,
        proxy::{Disclose, KeyAuth},
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
    /// Ids of the keys with `auth = "bearer"`.
    bearer: HashSet<String>,
    /// Keys whose plan sets its own `disclose`.
    disclose_of: HashMap<String, Disclose>,
    /// Some rule is keyed on the body (`json:`, `form:`): only then is a request
    /// asked whether its body is to be read for a key.
    pub body_keyed: bool,
}

impl Snapshot {
    pub(super) fn new(config: Arc<ProxyConfig>, secrets: KeySecrets) -> Self {
        let bearer = config.keys.iter().filter(|key| key.auth == KeyAuth::Bearer).map(|key| key.id.clone()).collect();
        let disclose_of = config
            .keys
            .iter()
            .filter_map(|key| Some((key.id.clone(), config.plans.get(&key.plan)?.disclose?)))
            .collect();
        let tls = secrets.tls().cloned();
        let body_keyed = config.rules.iter().any(|rule| rule.key.needs_body());
        Self { verifier: Verifier::new(secrets.into_keys()), tls, config, bearer, disclose_of, body_keyed }
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
