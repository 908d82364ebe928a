//! Kernel-layer figures for `limiter stats` and `limiter top`, read from the maps.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;
use limiter_common::{
    addr::as_v4,
    bucket::{self, Rate},
    counters::Counter,
    maps::{
        Action, BUDGET_NEW_SOURCES, BUDGET_SYN, CidrPolicy, FEATURE_COARSE_CLOCK, FEATURE_NEW_SOURCES, FEATURE_SYN,
        Settings,
    },
};
use serde::Serialize;

use super::{Attachment, BlockEntry, DemotionEntry, KernelMaps, XdpError, monotonic_now_ns};

/// `xdp` in `limiter stats --json`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct XdpStats {
    pub attached: Vec<Attachment>,
    pub enforce: bool,
    /// The buckets read the tick-grained clock: its error fits every rate in force.
    pub coarse_clock: bool,
    pub packets: CounterSnapshot,
    pub sources: SourceCount,
    pub blocks: Vec<BlockRow>,
    /// Sources limited at a demoted rate (`limiter demote`, `[escalation]
    /// demote_first`).
    pub demoted: Vec<DemotedRow>,
    /// `[xdp.new_sources]`; `null` when off.
    pub new_sources: Option<BudgetRow>,
    /// `[xdp.syn]`; `null` when off.
    pub syn: Option<BudgetRow>,
    /// Prefixes with an aggregate bucket.
    pub aggregates: SourceCount,
    /// Sources verified now.
    pub verified: SourceCount,
}

/// A global budget: its rate, what is left and what it has seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct BudgetRow {
    pub packets_per_second: u64,
    pub burst: u64,
    pub tokens: u64,
    /// Packets that asked the budget for a token.
    pub packets: u64,
    /// Of those, refused.
    pub dropped: u64,
}

/// Every counter by name, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CounterSnapshot(pub std::collections::BTreeMap<&'static str, u64>);

impl CounterSnapshot {
    #[must_use]
    pub fn get(&self, counter: Counter) -> u64 {
        self.0.get(counter.name()).copied().unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct SourceCount {
    pub tracked: u64,
    pub capacity: u32,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct BlockRow {
    pub cidr: String,
    /// Seconds left; `null` for a block without expiry.
    pub expires_in_secs: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct DemotedRow {
    pub cidr: String,
    pub packets_per_second: u64,
    pub burst: u64,
    /// Seconds left; `null` for a demotion without expiry.
    pub expires_in_secs: Option<u64>,
}

/// One row of `limiter top`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct SourceRow {
    pub source: String,
    pub packets: u64,
    pub dropped: u64,
    pub tokens: u64,
    /// `link-local` or `unspecified` for a source that is the link's own chatter
    /// (neighbour discovery, duplicate address detection, DHCP), not a client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

/// Why a source is not a remote client, if it is not: such addresses cannot be
/// routed, so they come from the local link's own protocols.
pub(super) fn local_chatter(addr: IpAddr) -> Option<&'static str> {
    if addr.is_unspecified() {
        return Some("unspecified");
    }
    let link_local = match addr {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    link_local.then_some("link-local")
}

impl KernelMaps {
    pub fn counter_snapshot(&self) -> Result<CounterSnapshot, XdpError> {
        let totals = self.counters()?;
        Ok(CounterSnapshot(Counter::ALL.iter().zip(totals).map(|(c, n)| (c.name(), n)).collect()))
    }

    /// The whole `xdp` object of `limiter stats`.
    pub(crate) fn stats(&mut self, attached: Vec<Attachment>) -> Result<XdpStats, XdpError> {
        let blocks = self
            .blocks()?
            .into_iter()
            .map(|BlockEntry { cidr, expires_in }| BlockRow {
                cidr: cidr.to_string(),
                expires_in_secs: expires_in.map(|d| d.as_secs_f64().ceil() as u64),
            })
            .collect();
        let demoted = self
            .demotions()?
            .into_iter()
            .map(|DemotionEntry { cidr, rate, expires_in }| DemotedRow {
                cidr: cidr.to_string(),
                packets_per_second: rate.per_second(),
                burst: rate.burst(),
                expires_in_secs: expires_in.map(|d| d.as_secs_f64().ceil() as u64),
            })
            .collect();
        let settings = self.settings()?;
        Ok(XdpStats {
            attached,
            enforce: settings.enforce != 0,
            coarse_clock: settings.has(FEATURE_COARSE_CLOCK),
            packets: self.counter_snapshot()?,
            sources: SourceCount { tracked: self.sources_tracked(), capacity: self.sources_capacity() },
            blocks,
            demoted,
            new_sources: self.budget_row(
                &settings,
                FEATURE_NEW_SOURCES,
                BUDGET_NEW_SOURCES,
                settings.new_source_rate,
            )?,
            syn: self.budget_row(&settings, FEATURE_SYN, BUDGET_SYN, settings.syn_rate)?,
            aggregates: SourceCount { tracked: self.aggregates().count() as u64, capacity: self.aggregates_capacity() },
            verified: SourceCount { tracked: self.verified_count()? as u64, capacity: self.verified.capacity() },
        })
    }

    fn budget_row(
        &self,
        settings: &Settings,
        feature: u8,
        slot: u32,
        rate: Rate,
    ) -> Result<Option<BudgetRow>, XdpError> {
        if !settings.has(feature) {
            return Ok(None);
        }
        let state = self.budget(slot)?;
        Ok(Some(BudgetRow {
            packets_per_second: rate.per_second(),
            burst: rate.burst(),
            tokens: bucket::tokens(state.tat_ns, monotonic_now_ns(), rate),
            packets: state.packets,
            dropped: state.dropped,
        }))
    }

    /// The `n` sources with the most packets.
    pub(crate) fn top(&self, n: usize) -> Result<Vec<SourceRow>, XdpError> {
        let mut rows = self.source_rows()?;
        rows.sort_by(|a, b| b.packets.cmp(&a.packets).then_with(|| a.source.cmp(&b.source)));
        rows.truncate(n);
        Ok(rows)
    }

    /// Every tracked source, in the map's order.
    pub(crate) fn source_rows(&self) -> Result<Vec<SourceRow>, XdpError> {
        let settings = self.settings()?;
        let cidrs = self.cidrs()?;
        let demoted = self.demoted_rates()?;
        let now = monotonic_now_ns();
        let mut rows = Vec::new();
        for entry in self.sources() {
            let (key, state) = entry?;
            let addr = match as_v4(&key.addr) {
                Some(v4) => IpAddr::from(v4),
                None => IpAddr::from(Ipv6Addr::from(key.addr)),
            };
            let source = match addr {
                IpAddr::V4(_) => addr.to_string(),
                IpAddr::V6(_) => format!("{addr}/{}", settings.ipv6_prefix),
            };
            let rate = rate_for(addr, &cidrs, &demoted, settings.default_rate);
            let tokens = tokens(state.tat_ns, now, rate);
            rows.push(SourceRow {
                source,
                packets: state.packets,
                dropped: state.dropped,
                tokens,
                note: local_chatter(addr),
            });
        }
        Ok(rows)
    }
}

/// Tokens left at `now` in a bucket at `tat_ns` (none for a rate that admits nothing).
pub(super) fn tokens(tat_ns: u64, now: u64, rate: Rate) -> u64 {
    if rate.interval_ns == 0 { 0 } else { bucket::tokens(tat_ns, now, rate) }
}

/// The bucket the program applies to `addr`: a demotion's, else the longest
/// matching limit rule's, else the default.
fn rate_for(
    addr: IpAddr,
    cidrs: &std::collections::BTreeMap<IpNet, CidrPolicy>,
    demoted: &[(IpNet, Rate)],
    default: Rate,
) -> Rate {
    if let Some((_, rate)) = demoted.iter().find(|(cidr, _)| cidr.contains(&addr)) {
        return *rate;
    }
    cidrs
        .iter()
        .filter(|(net, _)| net.contains(&addr))
        .max_by_key(|(net, _)| net.prefix_len())
        .map_or(default, |(_, policy)| if policy.action == Action::Limit as u32 { policy.rate } else { default })
}

#[cfg(test)]
mod tests {
    use super::local_chatter;

    #[test]
    fn the_links_own_sources_are_marked_and_clients_are_not() {
        for (addr, note) in [
            ("fe80::/64", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("::", Some("unspecified")),
            ("0.0.0.0", Some("unspecified")),
            ("169.254.3.4", Some("link-local")),
            ("2001:db8::", None),
            ("fec0::", None),
            ("192.0.2.7", None),
            ("::ffff:192.0.2.7", None),
        ] {
            let ip = addr.split('/').next().and_then(|a| a.parse().ok()).expect("address");
            assert_eq!(local_chatter(ip), note, "{addr}");
        }
    }
}
