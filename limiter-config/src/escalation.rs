//! `[escalation]`: from the proxy's rejections to a block in the kernel layer.

use std::{num::NonZeroU32, time::Duration};

use http::StatusCode;
use serde::Deserialize;

use super::{units::HumanDuration, xdp::PacketLimit};
use crate::changes::Changes;

/// A source (client address, connected directly) that collects more than
/// `threshold` refusals it caused itself (an own bucket's 429, a 401 for credentials it
/// sent, an `escalate = true` deny rule's 403) within `window` commits an offence: it
/// is blocked in the kernel layer, through the blocks map of `limiter block`, for
/// `block_ttl`, each later offence within `offence_memory` for `block_ttl_factor`
/// times the last block, up to `block_ttl_max`; with `demote_first`, its first
/// offence demotes it to a slow kernel bucket instead. Sources in an `[[xdp.cidr]]`
/// with `action = "allow"` never are.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawEscalation")]
pub struct EscalationConfig {
    pub enabled: bool,
    pub threshold: NonZeroU32,
    pub window: Duration,
    pub block_ttl: Duration,
    /// Each later block of a source lasts this many times its last one (1: every
    /// block lasts `block_ttl`).
    pub block_ttl_factor: u32,
    pub block_ttl_max: Duration,
    /// Offences older than this are forgotten: the next one starts the ladder again.
    pub offence_memory: Duration,
    /// The first offence within `offence_memory` demotes instead of blocking.
    pub demote_first: Option<DemoteFirst>,
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
    #[serde(default = "default_factor")]
    block_ttl_factor: u32,
    block_ttl_max: Option<HumanDuration>,
    #[serde(default = "default_offence_memory")]
    offence_memory: HumanDuration,
    demote_first: Option<DemoteFirst>,
    #[serde(default)]
    upstream_statuses: Vec<u16>,
    fingerprint: Option<FingerprintEscalation>,
}

/// `demote_first`: the kernel bucket a source's first offence puts it in, for `ttl`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawDemoteFirst")]
#[changes(display)]
pub struct DemoteFirst {
    pub limit: PacketLimit,
    pub ttl: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemoteFirst {
    packets_per_second: NonZeroU32,
    burst: NonZeroU32,
    ttl: HumanDuration,
}

impl TryFrom<RawDemoteFirst> for DemoteFirst {
    type Error = String;

    fn try_from(raw: RawDemoteFirst) -> Result<Self, String> {
        if raw.ttl.0.is_zero() {
            return Err("ttl must be longer than 0".to_owned());
        }
        let limit = PacketLimit::new(raw.packets_per_second, raw.burst)?;
        Ok(Self { limit, ttl: raw.ttl.0 })
    }
}

impl std::fmt::Display for DemoteFirst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} for {}", self.limit, HumanDuration(self.ttl))
    }
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
        if raw.block_ttl_factor == 0 {
            return Err("block_ttl_factor must be at least 1".to_owned());
        }
        // Unset, it is a day, or block_ttl if that is longer: a long block_ttl alone
        // is no mistake.
        let block_ttl_max = raw.block_ttl_max.map_or(default_block_ttl_max().max(raw.block_ttl.0), |max| max.0);
        if block_ttl_max < raw.block_ttl.0 {
            return Err(format!(
                "block_ttl_max ({}) must be at least block_ttl ({})",
                HumanDuration(block_ttl_max),
                raw.block_ttl
            ));
        }
        if raw.offence_memory.0.is_zero() {
            return Err("offence_memory must be longer than 0".to_owned());
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
            block_ttl_factor: raw.block_ttl_factor,
            block_ttl_max,
            offence_memory: raw.offence_memory.0,
            demote_first: raw.demote_first,
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

fn default_factor() -> u32 {
    1
}

fn default_block_ttl_max() -> Duration {
    Duration::from_secs(86_400)
}

fn default_offence_memory() -> HumanDuration {
    HumanDuration(Duration::from_secs(7 * 86_400))
}

impl EscalationConfig {
    /// Whether offences are remembered: only a ladder with more than one rung needs
    /// them.
    #[must_use]
    pub fn ladder(&self) -> bool {
        self.block_ttl_factor > 1 || self.demote_first.is_some()
    }

    /// The penalty of a source's `offence`-th offence (1 the first) within
    /// `offence_memory`.
    #[must_use]
    pub fn rung(&self, offence: u32) -> Rung {
        let offence = offence.max(1);
        let blocks_before = match self.demote_first {
            Some(demotion) if offence == 1 => return Rung::Demote(demotion),
            Some(_) => offence - 2,
            None => offence - 1,
        };
        let mut ttl = self.block_ttl;
        for _ in 0..blocks_before {
            if ttl >= self.block_ttl_max || self.block_ttl_factor == 1 {
                break;
            }
            ttl = ttl.saturating_mul(self.block_ttl_factor);
        }
        Rung::Block(ttl.min(self.block_ttl_max))
    }

    /// The longest block any offence gets: `block_ttl_max`, or `block_ttl` for a
    /// ladder that never climbs.
    #[must_use]
    pub fn longest_block(&self) -> Duration {
        match self.rung(u32::MAX) {
            Rung::Block(ttl) => ttl,
            Rung::Demote(_) => self.block_ttl_max,
        }
    }
}

/// What one offence costs its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rung {
    Demote(DemoteFirst),
    Block(Duration),
}
