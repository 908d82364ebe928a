//! `[escalation]`: from the proxy's rejections to a block in the kernel layer.

use std::{num::NonZeroU32, time::Duration};

use http::StatusCode;
use serde::Deserialize;

use super::units::HumanDuration;
use crate::changes::Changes;

/// A source (client address, connected directly) that collects more than
/// `threshold` refusals it caused itself (an own bucket's 429, a 401 for credentials it
/// sent, an `escalate = true` deny rule's 403) within `window` is blocked in the kernel layer
/// for `block_ttl`, through the blocks map of `limiter block`. Sources in an
/// `[[xdp.cidr]]` with `action = "allow"` never are.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawEscalation")]
pub struct EscalationConfig {
    pub enabled: bool,
    pub threshold: NonZeroU32,
    pub window: Duration,
    pub block_ttl: Duration,
    /// The upstream's own answers with these statuses count as refusals too (a
    /// login's 401): the upstream judged what the client sent.
    pub upstream_statuses: Vec<StatusCode>,
    /// `[escalation.fingerprint]`; `None`: fingerprints are not escalated.
    pub fingerprint: Option<FingerprintEscalation>,
}

/// `[escalation.fingerprint]`: a TLS fingerprint whose requests collect `threshold`
/// refusals within `window` has every source that presented it within `window` (the
/// latest `max_sources` of them) blocked, each as `[escalation]` blocks one source.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawFingerprintEscalation")]
pub struct FingerprintEscalation {
    pub threshold: NonZeroU32,
    pub window: Duration,
    pub max_sources: NonZeroU32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFingerprintEscalation {
    #[serde(default = "default_fingerprint_threshold")]
    threshold: NonZeroU32,
    #[serde(default = "default_window")]
    window: HumanDuration,
    #[serde(default = "default_max_sources")]
    max_sources: NonZeroU32,
}

/// The most sources one fingerprint's escalation blocks: the agent's queue of blocks to put in place holds as many.
pub const MAX_FINGERPRINT_SOURCES: u32 = 1024;

impl TryFrom<RawFingerprintEscalation> for FingerprintEscalation {
    type Error = String;

    fn try_from(raw: RawFingerprintEscalation) -> Result<Self, String> {
        if raw.window.0.is_zero() {
            return Err("window must be longer than 0".to_owned());
        }
        if raw.max_sources.get() > MAX_FINGERPRINT_SOURCES {
            return Err(format!("max_sources is at most {MAX_FINGERPRINT_SOURCES}"));
        }
        Ok(Self { threshold: raw.threshold, window: raw.window.0, max_sources: raw.max_sources })
    }
}

fn default_fingerprint_threshold() -> NonZeroU32 {
    NonZeroU32::new(500).unwrap_or(NonZeroU32::MIN)
}

fn default_max_sources() -> NonZeroU32 {
    NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEscalation {
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default = "default_threshold")]
    threshold: NonZeroU32,
    #[serde(default = "default_window")]
    window: HumanDuration,
    #[serde(default = "default_block_ttl")]
    block_ttl: HumanDuration,
    #[serde(default)]
    upstream_statuses: Vec<u16>,
    fingerprint: Option<FingerprintEscalation>,
}

impl TryFrom<RawEscalation> for EscalationConfig {
    type Error = String;

    fn try_from(raw: RawEscalation) -> Result<Self, String> {
        if raw.window.0.is_zero() {
            return Err("window must be longer than 0".to_owned());
        }
        if raw.block_ttl.0.is_zero() {
            return Err("block_ttl must be longer than 0".to_owned());
        }
        let upstream_statuses = raw
            .upstream_statuses
            .iter()
            .map(|&code| {
                (100..=599)
                    .contains(&code)
                    .then(|| StatusCode::from_u16(code).ok())
                    .flatten()
                    .ok_or_else(|| format!("upstream_statuses: {code} is not an HTTP status (100 to 599)"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            enabled: raw.enabled,
            threshold: raw.threshold,
            window: raw.window.0,
            block_ttl: raw.block_ttl.0,
            upstream_statuses,
            fingerprint: raw.fingerprint,
        })
    }
}

fn yes() -> bool {
    true
}

fn default_threshold() -> NonZeroU32 {
    NonZeroU32::new(50).unwrap_or(NonZeroU32::MIN)
}

fn default_window() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

fn default_block_ttl() -> HumanDuration {
    HumanDuration(Duration::from_secs(600))
}
