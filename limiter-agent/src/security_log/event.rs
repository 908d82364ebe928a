//! What a security event says: its kind, the client (an address, or a block's
//! CIDR) and what else the kind carries.

use std::{net::IpAddr, time::Duration};

use ipnet::IpNet;
use limiter_core::signature::FailureReason;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A signed request failed its checks (`reason`: the failure).
    SignatureFailure,
    /// A signature seen before (`reason = "replay"`).
    Replay,
    /// A route in a scope's area, with no key proven or a key without the scope.
    ScopeRefused,
    /// A `deny` rule refused the request.
    DenyRule,
    /// This agent's escalation blocked a source it kept refusing.
    EscalationBlock,
    /// A key moved to a lesser plan for what it did: no code demotes yet; whatever
    /// does records [`SecurityEvent::demotion`].
    Demotion,
    /// A block the fleet published that this agent refused (too wide, protected).
    FleetBlockRefused,
    /// A block put in the kernel layer (`reason`: who asked for it).
    KernelBlock,
    /// A block lifted from the kernel layer.
    KernelUnblock,
    /// A source demoted to a slower kernel bucket (`reason`: who asked for it,
    /// `plan`: its rate).
    KernelDemote,
    /// A demotion lifted.
    KernelUndemote,
    /// The events of one client and reason the log left out in the last interval.
    Suppressed,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [Self; 12] = [
        Self::SignatureFailure,
        Self::Replay,
        Self::ScopeRefused,
        Self::DenyRule,
        Self::EscalationBlock,
        Self::Demotion,
        Self::FleetBlockRefused,
        Self::KernelBlock,
        Self::KernelUnblock,
        Self::KernelDemote,
        Self::KernelUndemote,
        Self::Suppressed,
    ];

    /// The `event` of a JSON line and the Signature ID of a CEF one.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::SignatureFailure => "signature_failure",
            Self::Replay => "replay",
            Self::ScopeRefused => "scope_refused",
            Self::DenyRule => "deny_rule",
            Self::EscalationBlock => "escalation_block",
            Self::Demotion => "demotion",
            Self::FleetBlockRefused => "fleet_block_refused",
            Self::KernelBlock => "kernel_block",
            Self::KernelUnblock => "kernel_unblock",
            Self::KernelDemote => "kernel_demote",
            Self::KernelUndemote => "kernel_undemote",
            Self::Suppressed => "suppressed",
        }
    }

    /// CEF's Name and Severity (0 to 10).
    #[must_use]
    pub(super) const fn cef(self) -> (&'static str, u8) {
        match self {
            Self::SignatureFailure => ("Signature refused", 5),
            Self::Replay => ("Signature replayed", 7),
            Self::ScopeRefused => ("Outside the key's scopes", 5),
            Self::DenyRule => ("Denied by rule", 6),
            Self::EscalationBlock => ("Source escalated to a block", 8),
            Self::Demotion => ("Key demoted", 6),
            Self::FleetBlockRefused => ("Fleet block refused", 7),
            Self::KernelBlock => ("Kernel block", 8),
            Self::KernelUnblock => ("Kernel unblock", 3),
            Self::KernelDemote => ("Kernel demotion", 6),
            Self::KernelUndemote => ("Kernel demotion lifted", 3),
            Self::Suppressed => ("Events suppressed", 3),
        }
    }
}

/// One event, as it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityEvent {
    pub kind: EventKind,
    /// The client's address, or a block's CIDR.
    pub client: IpNet,
    pub reason: Option<&'static str>,
    /// As shown ([`shown_key_id`]).
    pub key_id: Option<String>,
    /// A `deny` rule's name, or a scope's.
    pub rule: Option<String>,
    /// A block's; `None` on a kernel block: until unblocked.
    pub ttl: Option<Duration>,
    /// A demotion's new plan, or a kernel demotion's rate.
    pub plan: Option<String>,
}

/// A bearer key's id is its secret, and an id that names no key may be one mistyped:
/// both are shown by their first characters only. A signing key's id is no secret.
#[must_use]
pub fn shown_key_id(id: &str, signing_key: bool) -> String {
    /// Enough to tell keys apart in a log, too few to spend one.
    const SHOWN: usize = 4;
    if signing_key {
        return id.to_owned();
    }
    let mut shown: String = id.chars().take(SHOWN).collect();
    shown.push('…');
    shown
}

impl SecurityEvent {
    fn new(kind: EventKind, client: IpNet) -> Self {
        Self { kind, client, reason: None, key_id: None, rule: None, ttl: None, plan: None }
    }

    /// A signed request of `client` refused for `reason` (a replay is an event of its
    /// own kind); `key_id` as shown.
    #[must_use]
    pub fn signature_failure(client: IpAddr, reason: FailureReason, key_id: Option<String>) -> Self {
        let kind = if reason == FailureReason::Replay { EventKind::Replay } else { EventKind::SignatureFailure };
        Self { reason: Some(reason.as_str()), key_id, ..Self::new(kind, client.into()) }
    }

    /// A request refused for want of `scope` (named whatever `disclose` tells the
    /// client); `key_id`: the key proven, none for a keyless request.
    #[must_use]
    pub fn scope_refused(client: IpAddr, scope: &str, key_id: Option<String>) -> Self {
        let reason = if key_id.is_some() { "missing_scope" } else { "no_key" };
        Self {
            reason: Some(reason),
            key_id,
            rule: Some(scope.to_owned()),
            ..Self::new(EventKind::ScopeRefused, client.into())
        }
    }

    /// A request refused by the `deny` rule `rule`.
    #[must_use]
    pub fn deny_rule(client: IpAddr, rule: &str) -> Self {
        Self { rule: Some(rule.to_owned()), ..Self::new(EventKind::DenyRule, client.into()) }
    }

    /// This agent's escalation blocking `cidr` for `ttl`.
    #[must_use]
    pub fn escalation_block(cidr: IpNet, ttl: Duration) -> Self {
        Self { reason: Some("too_many_rejections"), ttl: Some(ttl), ..Self::new(EventKind::EscalationBlock, cidr) }
    }

    /// The key `key_id` of `client` moved to `plan` for `reason`.
    #[must_use]
    pub fn demotion(client: IpAddr, key_id: String, plan: &str, reason: &'static str) -> Self {
        Self {
            reason: Some(reason),
            key_id: Some(key_id),
            plan: Some(plan.to_owned()),
            ..Self::new(EventKind::Demotion, client.into())
        }
    }

    /// A block of `cidr` the fleet published, refused for `reason`.
    #[must_use]
    pub fn fleet_block_refused(cidr: IpNet, reason: &'static str) -> Self {
        Self { reason: Some(reason), ..Self::new(EventKind::FleetBlockRefused, cidr) }
    }

    /// `cidr` blocked in the kernel layer for `ttl` (`None`: until unblocked), asked
    /// for by `by`: `escalation`, `fleet` or `cli`.
    #[must_use]
    pub fn kernel_block(cidr: IpNet, ttl: Option<Duration>, by: &'static str) -> Self {
        Self { reason: Some(by), ttl, ..Self::new(EventKind::KernelBlock, cidr) }
    }

    /// `cidr` demoted in the kernel layer to `limit` for `ttl` (`None`: until
    /// undemoted), asked for by `by`: `escalation`, `fleet` or `cli`.
    #[must_use]
    pub fn kernel_demote(
        cidr: IpNet,
        limit: crate::config::xdp::PacketLimit,
        ttl: Option<Duration>,
        by: &'static str,
    ) -> Self {
        Self { reason: Some(by), ttl, plan: Some(limit.to_string()), ..Self::new(EventKind::KernelDemote, cidr) }
    }

    /// `cidr`'s demotion lifted, by `by`.
    #[must_use]
    pub fn kernel_undemote(cidr: IpNet, by: &'static str) -> Self {
        Self { reason: Some(by), ..Self::new(EventKind::KernelUndemote, cidr) }
    }

    /// `cidr`'s block lifted, by `by`.
    #[must_use]
    pub fn kernel_unblock(cidr: IpNet, by: &'static str) -> Self {
        Self { reason: Some(by), ..Self::new(EventKind::KernelUnblock, cidr) }
    }
}
