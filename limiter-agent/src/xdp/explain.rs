//! `limiter explain --ip`: what the kernel layer does with a source's packets, read
//! from the pinned maps in the program's own order (runtime blocks, then the longest
//! CIDR rule, then a demotion, then the source's bucket) without sending a packet.

use std::net::IpAddr;

use ipnet::IpNet;
use limiter_common::maps::Action;
use serde::Serialize;

use super::{
    KernelMaps, XdpError, monotonic_now_ns,
    stats::{local_chatter, tokens},
    verified::source_key,
};

/// The kernel layer's view of one source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct SourceExplanation {
    /// The bucket's key: the address, or its IPv6 prefix.
    pub source: String,
    /// `link-local` or `unspecified` for the link's own chatter.
    pub note: Option<&'static str>,
    /// What a packet from it gets now: `drop: blocked`, `drop: deny rule`,
    /// `pass: allow rule`, `pass` (tokens left, or a new source) or `drop: rate limit`.
    pub verdict: &'static str,
    /// False in dry run: drops are only counted.
    pub enforce: bool,
    /// A runtime block covering it (`limiter block`, escalation), with seconds left.
    pub block: Option<(IpNet, Option<u64>)>,
    /// The longest CIDR rule covering it.
    pub rule: Option<RuleMatch>,
    /// A demotion covering it (`limiter demote`, escalation's `demote_first`), with
    /// seconds left: its rate is the bucket's unless an allow or deny rule decides.
    pub demoted: Option<(IpNet, Option<u64>)>,
    /// The bucket that applies, unless a block or an allow/deny rule decides first.
    pub limit: Option<Limit>,
    /// Verified sources skip the new-source budget, the aggregates and the SYN budget.
    pub verified: bool,
    /// Its bucket, if it has one yet.
    pub bucket: Option<BucketState>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct RuleMatch {
    pub cidr: IpNet,
    /// `allow`, `deny` or `limit`.
    pub action: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub packets_per_second: u64,
    pub burst: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct BucketState {
    pub packets: u64,
    pub dropped: u64,
    pub tokens: u64,
}

impl KernelMaps {
    /// Explains packets from `ip`.
    pub(crate) fn explain_source(&mut self, ip: IpAddr) -> Result<SourceExplanation, XdpError> {
        let settings = self.settings()?;
        let ip = ip.to_canonical();
        let key = source_key(ip, settings.ipv6_prefix);
        let source = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(_) => format!("{}/{}", IpAddr::from(std::net::Ipv6Addr::from(key.addr)), settings.ipv6_prefix),
        };
        let block = self
            .blocks()?
            .into_iter()
            .filter(|entry| entry.cidr.contains(&ip))
            .max_by_key(|entry| entry.cidr.prefix_len())
            .map(|entry| (entry.cidr, entry.expires_in.map(|left| left.as_secs())));
        let rule =
            self.cidrs()?.into_iter().filter(|(net, _)| net.contains(&ip)).max_by_key(|(net, _)| net.prefix_len());
        let demotion = self.demotions()?.into_iter().find(|entry| entry.cidr.contains(&ip));
        let now = monotonic_now_ns();
        let state = self.source(&key);
        let rate = match &rule {
            Some((_, policy)) if policy.action == Action::Limit as u32 => Some(policy.rate),
            Some(_) => None,
            None => Some(settings.default_rate),
        }
        .map(|rate| demotion.as_ref().map_or(rate, |demotion| demotion.rate));
        let limit = rate
            .filter(|_| block.is_none())
            .map(|rate| Limit { packets_per_second: rate.per_second(), burst: rate.burst() });
        let bucket = state.map(|state| BucketState {
            packets: state.packets,
            dropped: state.dropped,
            tokens: rate.map_or(0, |rate| tokens(state.tat_ns, now, rate)),
        });
        let verdict = match (&block, rule.as_ref().map(|(_, policy)| policy.action)) {
            (Some(_), _) => "drop: blocked",
            (None, Some(action)) if action == Action::Deny as u32 => "drop: deny rule",
            (None, Some(action)) if action == Action::Allow as u32 => "pass: allow rule",
            _ if bucket.is_some_and(|bucket| bucket.tokens == 0) => "drop: rate limit",
            _ => "pass",
        };
        Ok(SourceExplanation {
            source,
            note: local_chatter(ip),
            verdict,
            enforce: settings.enforce != 0,
            block,
            rule: rule.map(|(cidr, policy)| RuleMatch { cidr, action: action_name(policy.action) }),
            demoted: demotion.map(|entry| (entry.cidr, entry.expires_in.map(|left| left.as_secs()))),
            limit,
            verified: self.is_verified(&key),
            bucket,
        })
    }
}

fn action_name(action: u32) -> &'static str {
    match action {
        a if a == Action::Allow as u32 => "allow",
        a if a == Action::Deny as u32 => "deny",
        _ => "limit",
    }
}
