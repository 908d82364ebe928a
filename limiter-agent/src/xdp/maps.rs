//! Typed access to the program's maps, checked at construction: every map is opened
//! with the key and value types of `limiter_common::maps`, so a size mismatch fails
//! here instead of corrupting state.

use std::{collections::BTreeMap, path::Path, time::Duration};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray};
use ipnet::IpNet;
use limiter_common::{
    bucket::{Rate, coarse_clock_fits},
    counters::Counter,
    maps::{
        self as names, Action, Block, BucketKey, CidrPolicy, Demotion, Expiry, FEATURE_AGGREGATE, FEATURE_COARSE_CLOCK,
        FEATURE_NEW_SOURCES, FEATURE_PORTS, FEATURE_SERVICES, FEATURE_SYN, FEATURE_SYN_PORTS, LAYOUT_VERSION,
        MAX_PORT_LIMITS, MAX_SYN_PORTS, Network, OCCUPIED_BLOCK_V4, OCCUPIED_BLOCK_V6, OCCUPIED_CIDR_V4,
        OCCUPIED_CIDR_V6, OCCUPIED_DEMOTE, SERVICE_ICMP_PASS, SERVICE_OTHER_PASS, SETTINGS_SLOTS, Settings, SourceKey,
        SourceState, port_key,
    },
};

use super::{
    XdpError,
    map_access::{capacity, coarse_tick_ns, ephemeral_ports, map_error, monotonic_now_ns},
    tries::{CidrTries, LapsingTries, mapped_cidr},
    verified::VerifiedMap,
};
use crate::config::{
    ProxyConfig,
    xdp::{
        CidrAction, CidrRule, MalformedAction, PacketLimit, PortLimit, ServicesConfig, SynPorts, Verdict, XdpConfig,
    },
};

/// The program's maps, opened from a loaded program or from their pins.
pub struct KernelMaps {
    sources: HashMap<MapData, BucketKey, SourceState>,
    sources_capacity: u32,
    cidrs: CidrTries<CidrPolicy>,
    blocks: LapsingTries<Block>,
    demotions: LapsingTries<Demotion>,
    settings: Array<MapData, Settings>,
    settings_active: Array<MapData, u32>,
    counters: PerCpuArray<MapData, u64>,
    /// Per-trie "may hold entries" flags (`names::OCCUPANCY`).
    occupancy: Array<MapData, u32>,
    budgets: Array<MapData, SourceState>,
    syn_shares: HashMap<MapData, SourceKey, SourceState>,
    aggregates: HashMap<MapData, SourceKey, SourceState>,
    aggregates_capacity: u32,
    pub(super) verified: VerifiedMap,
}

impl std::fmt::Debug for KernelMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelMaps").field("sources_capacity", &self.sources_capacity).finish_non_exhaustive()
    }
}

/// A demotion as `limiter stats` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemotionEntry {
    pub cidr: IpNet,
    pub rate: Rate,
    /// Time left; `None` for a demotion without expiry.
    pub expires_in: Option<Duration>,
}

/// A runtime block as `limiter stats` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    pub cidr: IpNet,
    /// Time left; `None` for a block without expiry.
    pub expires_in: Option<Duration>,
}

impl KernelMaps {
    /// Opens the maps pinned under `pin_dir` (works whether or not an agent runs).
    pub fn open_pinned(pin_dir: &Path) -> Result<Self, XdpError> {
        Self::open(|name| {
            let path = pin_dir.join(name);
            if !path.exists() {
                return Err(XdpError::MissingMap(name, pin_dir.display().to_string()));
            }
            MapData::from_pin(&path).and_then(Map::from_map_data).map_err(map_error(name))
        })
    }

    /// Takes the maps out of a freshly loaded program.
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, XdpError> {
        Self::open(|name| ebpf.take_map(name).ok_or_else(|| XdpError::MissingMap(name, "(loaded object)".to_owned())))
    }

    fn open(mut map: impl FnMut(&'static str) -> Result<Map, XdpError>) -> Result<Self, XdpError> {
        let sources = map(names::SOURCES)?;
        let sources_capacity = capacity(&sources, names::SOURCES)?;
        let aggregates = map(names::AGGREGATES)?;
        let aggregates_capacity = capacity(&aggregates, names::AGGREGATES)?;
        Ok(Self {
            sources: sources.try_into().map_err(map_error(names::SOURCES))?,
            sources_capacity,
            cidrs: CidrTries::new(
                [map(names::CIDR_V4)?, map(names::CIDR_V6)?],
                [names::CIDR_V4, names::CIDR_V6],
                [OCCUPIED_CIDR_V4, OCCUPIED_CIDR_V6],
            )?,
            blocks: LapsingTries::new(CidrTries::new(
                [map(names::BLOCK_V4)?, map(names::BLOCK_V6)?],
                [names::BLOCK_V4, names::BLOCK_V6],
                [OCCUPIED_BLOCK_V4, OCCUPIED_BLOCK_V6],
            )?),
            demotions: LapsingTries::new(CidrTries::mapped(map(names::DEMOTE)?, names::DEMOTE, OCCUPIED_DEMOTE)?),
            settings: map(names::SETTINGS)?.try_into().map_err(map_error(names::SETTINGS))?,
            settings_active: map(names::SETTINGS_ACTIVE)?.try_into().map_err(map_error(names::SETTINGS_ACTIVE))?,
            counters: map(names::COUNTERS)?.try_into().map_err(map_error(names::COUNTERS))?,
            occupancy: map(names::OCCUPANCY)?.try_into().map_err(map_error(names::OCCUPANCY))?,
            budgets: map(names::BUDGETS)?.try_into().map_err(map_error(names::BUDGETS))?,
            syn_shares: map(names::SYN_SHARES)?.try_into().map_err(map_error(names::SYN_SHARES))?,
            aggregates: aggregates.try_into().map_err(map_error(names::AGGREGATES))?,
            aggregates_capacity,
            verified: VerifiedMap::new(map(names::VERIFIED)?)?,
        })
    }

    /// The settings the program reads now.
    pub fn settings(&self) -> Result<Settings, XdpError> {
        let active = self.settings_active.get(&0, 0).map_err(map_error(names::SETTINGS_ACTIVE))?;
        self.settings.get(&active, 0).map_err(map_error(names::SETTINGS))
    }

    /// Replaces the settings in one step: the inactive slot is written, then the
    /// active index flips with a single 4-byte store, so the program sees either the
    /// old record or the new one, never a mix.
    pub fn write_settings(&mut self, settings: Settings) -> Result<(), XdpError> {
        let active = self.settings_active.get(&0, 0).map_err(map_error(names::SETTINGS_ACTIVE))?;
        let next = (active + 1) % SETTINGS_SLOTS;
        self.settings.set(next, settings, 0).map_err(map_error(names::SETTINGS))?;
        self.settings_active.set(0, next, 0).map_err(map_error(names::SETTINGS_ACTIVE))
    }

    /// Puts `config` in force, beside `proxy` (whose port the SYN budget covers by
    /// default): settings first (one atomic flip), then the CIDR rules.
    pub fn apply(&mut self, config: &XdpConfig, proxy: Option<&ProxyConfig>) -> Result<(), XdpError> {
        self.apply_tightened(config, proxy, None)
    }

    /// [`Self::apply`], the `new_sources` budget scaled by `tighten` if set (the
    /// upstream shedding, `[proxy.adaptive.kernel]`).
    pub fn apply_tightened(
        &mut self,
        config: &XdpConfig,
        proxy: Option<&ProxyConfig>,
        tighten: Option<f64>,
    ) -> Result<(), XdpError> {
        let mut settings = settings_for(config, &config.syn_ports(proxy), coarse_tick_ns());
        // Read again on every reload: an operator may have widened the range.
        settings.ephemeral_ports = ephemeral_ports();
        if let (Some(factor), Some(budget)) = (tighten, config.new_sources) {
            settings.new_source_rate = budget.scaled(factor).rate();
        }
        self.write_settings(settings)?;
        self.sync_cidrs(&config.cidr)
    }

    /// Whether the pinned settings were written by a build with this map layout
    /// (a fresh, never-written set of maps counts as compatible).
    pub(crate) fn layout_matches(&self) -> Result<bool, XdpError> {
        let version = self.settings()?.layout_version;
        Ok(version == 0 || version == LAYOUT_VERSION)
    }

    /// Makes the CIDR tries hold exactly `rules`. New and changed entries are
    /// written before stale ones are removed, and each write replaces one entry in
    /// place, so no source is ever without its rule mid-sync.
    pub fn sync_cidrs(&mut self, rules: &[CidrRule]) -> Result<(), XdpError> {
        let current = self.cidrs()?;
        // Flags up before the first insert, so no new rule is ever skipped.
        for slot in self.cidrs.slots() {
            if rules.iter().any(|rule| self.cidrs.slot(rule.cidr) == slot) {
                self.set_occupied(slot, true)?;
            }
        }
        for rule in rules {
            let policy = policy_of(rule);
            if current.get(&rule.cidr) != Some(&policy) {
                self.cidrs.insert(rule.cidr, policy)?;
            }
        }
        for cidr in current.keys().filter(|cidr| !rules.iter().any(|rule| rule.cidr == **cidr)) {
            self.cidrs.remove(*cidr)?;
        }
        // Only the agent writes CIDRs, so a trie seen empty here stays empty.
        for slot in self.cidrs.slots() {
            self.set_occupied(slot, !self.cidrs.is_empty(slot))?;
        }
        Ok(())
    }

    fn set_occupied(&mut self, slot: u32, occupied: bool) -> Result<(), XdpError> {
        set_occupied(&mut self.occupancy, slot, occupied)
    }

    /// The CIDR rules the program applies now.
    pub fn cidrs(&self) -> Result<BTreeMap<IpNet, CidrPolicy>, XdpError> {
        Ok(self.cidrs.entries()?.into_iter().collect())
    }

    /// Blocks `cidr` (for `ttl`, or until unblocked).
    pub fn block(&mut self, cidr: IpNet, ttl: Option<Duration>) -> Result<(), XdpError> {
        self.blocks.insert(&mut self.occupancy, cidr, expiry_after(ttl))
    }

    /// Removes a block; `false` if there was none in force for exactly this CIDR
    /// (a lapsed entry is removed all the same).
    pub fn unblock(&mut self, cidr: IpNet) -> Result<bool, XdpError> {
        self.blocks.remove(&mut self.occupancy, cidr)
    }

    /// Active blocks; lapsed ones are removed on the way.
    pub fn blocks(&mut self) -> Result<Vec<BlockEntry>, XdpError> {
        let now = monotonic_now_ns();
        let active = self.blocks.in_force(&mut self.occupancy, now)?;
        Ok(active.into_iter().map(|(cidr, block)| BlockEntry { cidr, expires_in: expires_in(block, now) }).collect())
    }

    /// Demotes `cidr`: its sources' buckets refill at `rate` (for `ttl`, or until
    /// undemoted) in place of their own.
    pub fn demote(&mut self, cidr: IpNet, rate: Rate, ttl: Option<Duration>) -> Result<(), XdpError> {
        self.demotions.insert(&mut self.occupancy, cidr, Demotion { rate, expiry: expiry_after(ttl) })
    }

    /// Lifts a demotion; `false` if there was none in force for exactly this CIDR.
    pub fn undemote(&mut self, cidr: IpNet) -> Result<bool, XdpError> {
        self.demotions.remove(&mut self.occupancy, cidr)
    }

    /// Demotions in force; lapsed ones are removed on the way.
    pub fn demotions(&mut self) -> Result<Vec<DemotionEntry>, XdpError> {
        let now = monotonic_now_ns();
        let active = self.demotions.in_force(&mut self.occupancy, now)?;
        Ok(active
            .into_iter()
            .map(|(cidr, demotion)| DemotionEntry {
                cidr,
                rate: demotion.rate,
                expires_in: expires_in(demotion.expiry, now),
            })
            .collect())
    }

    /// The demoted rates in force, for readers that write nothing.
    pub(crate) fn demoted_rates(&self) -> Result<Vec<(IpNet, Rate)>, XdpError> {
        let active = self.demotions.read(monotonic_now_ns())?;
        Ok(active.into_iter().map(|(cidr, demotion)| (cidr, demotion.rate)).collect())
    }

    /// Every counter, summed over CPUs, in [`Counter`] order.
    pub fn counters(&self) -> Result<[u64; Counter::COUNT as usize], XdpError> {
        let mut totals = [0u64; Counter::COUNT as usize];
        for (index, total) in (0u32..).zip(totals.iter_mut()) {
            let per_cpu = self.counters.get(&index, 0).map_err(map_error(names::COUNTERS))?;
            *total = per_cpu.iter().sum();
        }
        Ok(totals)
    }

    /// Every tracked source and its bucket (its `[[xdp.port]]` services' apart).
    pub fn sources(&self) -> impl Iterator<Item = Result<(SourceKey, SourceState), XdpError>> + '_ {
        self.sources.iter().filter_map(|entry| match entry {
            Ok((key, _)) if key.is_service() => None,
            Ok((key, state)) => Some(Ok((SourceKey { addr: key.addr }, state))),
            Err(error) => Some(Err(map_error(names::SOURCES)(error))),
        })
    }

    /// How many buckets the sources map holds (a source's and one per service it
    /// uses): one walk over the keys, without reading the buckets (a full map holds
    /// `max_sources` of them).
    #[must_use]
    pub(crate) fn sources_tracked(&self) -> u64 {
        self.sources.keys().count() as u64
    }

    /// One source's bucket, if tracked.
    pub fn source(&self, key: &SourceKey) -> Option<SourceState> {
        self.sources.get(&BucketKey::source(key), 0).ok()
    }

    /// Bound on tracked sources (`xdp.max_sources` when the maps were created).
    #[must_use]
    pub(crate) fn sources_capacity(&self) -> u32 {
        self.sources_capacity
    }

    /// The global bucket in `slot` (`names::BUDGET_*`).
    pub fn budget(&self, slot: u32) -> Result<SourceState, XdpError> {
        self.budgets.get(&slot, 0).map_err(map_error(names::BUDGETS))
    }

    /// One source's share of the SYN budget, if it has one.
    pub fn syn_share(&self, key: &SourceKey) -> Option<SourceState> {
        self.syn_shares.get(key, 0).ok()
    }

    /// Every tracked prefix (`[xdp.aggregate]`) and its bucket.
    pub fn aggregates(&self) -> impl Iterator<Item = Result<(SourceKey, SourceState), XdpError>> + '_ {
        self.aggregates.iter().map(|entry| entry.map_err(map_error(names::AGGREGATES)))
    }

    /// One prefix's bucket, if tracked.
    pub fn aggregate(&self, key: &SourceKey) -> Option<SourceState> {
        self.aggregates.get(key, 0).ok()
    }

    /// Bound on tracked prefixes (`xdp.aggregate.max_prefixes` when the maps were created).
    #[must_use]
    pub(crate) fn aggregates_capacity(&self) -> u32 {
        self.aggregates_capacity
    }

    /// Marks every source in `cidr` verified for `ttl`; the number of sources.
    pub fn verify(&mut self, cidr: IpNet, ttl: Duration) -> Result<usize, XdpError> {
        let ipv6_prefix = self.settings()?.ipv6_prefix;
        self.verified.verify(cidr, ipv6_prefix, ttl)
    }

    /// Removes every verified source in `cidr`; how many there were.
    pub fn unverify(&mut self, cidr: IpNet) -> Result<usize, XdpError> {
        self.verified.unverify(cidr)
    }

    /// Sources verified now.
    pub(crate) fn verified_count(&self) -> Result<usize, XdpError> {
        self.verified.count()
    }

    /// Whether `key` is verified now.
    #[must_use]
    pub fn is_verified(&self, key: &SourceKey) -> bool {
        self.verified.contains(key)
    }
}

/// The settings record for `config`, the SYN budget covering `syn_ports`, on a
/// kernel whose coarse clock ticks every `tick_ns`: the buckets read the coarse
/// clock only if its error fits every rate in force
/// (`limiter_common::bucket::coarse_clock_fits`), else the precise one.
#[must_use]
pub(crate) fn settings_for(config: &XdpConfig, syn_ports: &SynPorts, tick_ns: u64) -> Settings {
    let rate = |limit: Option<PacketLimit>| limit.map(|l| l.rate()).unwrap_or_default();
    let feature = |on: bool, bit: u8| if on { bit } else { 0 };
    let mut ports = [0; MAX_SYN_PORTS];
    if let SynPorts::Only(only) = syn_ports {
        for (slot, port) in ports.iter_mut().zip(only) {
            *slot = port.get();
        }
    }
    let mut settings = Settings {
        default_rate: config.limit.packets.rate(),
        new_source_rate: rate(config.new_sources),
        aggregate_rate: rate(config.aggregate.limit),
        syn_rate: rate(config.syn.as_ref().map(|syn| syn.limit)),
        syn_source_rate: rate(config.syn.as_ref().map(|syn| syn.per_source())),
        default_bytes: config.limit.byte_rate(),
        syn_ports: ports,
        port_keys: service_table(config, |entry| port_key(entry.protocol.number(), entry.port.get())),
        port_rates: service_table(config, |entry| entry.limit.packets.rate()),
        port_bytes: service_table(config, |entry| entry.limit.byte_rate()),
        layout_version: LAYOUT_VERSION,
        enforce: u8::from(config.enforce),
        malformed_drop: u8::from(config.malformed == MalformedAction::Drop),
        ipv6_prefix: config.ipv6_prefix.0,
        features: feature(config.new_sources.is_some(), FEATURE_NEW_SOURCES)
            | feature(config.aggregate.limit.is_some(), FEATURE_AGGREGATE)
            | feature(config.syn.is_some(), FEATURE_SYN)
            | feature(matches!(syn_ports, SynPorts::Only(_)), FEATURE_SYN_PORTS)
            | feature(!config.port.is_empty(), FEATURE_PORTS)
            | feature(config.services.is_some(), FEATURE_SERVICES)
            | feature(
                config.rates_in_force().all(|rate| coarse_clock_fits(rate, tick_ns))
                    && config.byte_rates_in_force().all(|rate| rate.coarse_clock_fits(tick_ns)),
                FEATURE_COARSE_CLOCK,
            ),
        aggregate_ipv4_prefix: config.aggregate.ipv4_prefix.0,
        aggregate_ipv6_prefix: config.aggregate.ipv6_prefix.0,
        ..Settings::default()
    };
    if let Some(services) = &config.services {
        write_services(&mut settings, services);
    }
    settings
}

/// `[xdp.services]` into the settings record; the ephemeral ports are the host's.
fn write_services(settings: &mut Settings, services: &ServicesConfig) {
    for port in &services.tcp {
        settings.tcp_ports.insert(port.0.get());
    }
    for port in &services.udp {
        settings.udp_ports.insert(port.0.get());
    }
    let passes = |verdict: Verdict, bit: u8| if verdict == Verdict::Pass { bit } else { 0 };
    settings.service_flags = passes(services.icmp, SERVICE_ICMP_PASS) | passes(services.other, SERVICE_OTHER_PASS);
    // Validation bounds the list to the record's places.
    for (slot, source) in settings.udp_replies_from.iter_mut().zip(&services.udp_replies_from) {
        let (addr, prefix_len) = mapped_cidr(source.0);
        *slot = Network::new(addr, prefix_len);
    }
    settings.udp_replies = u8::try_from(services.udp_replies_from.len()).unwrap_or(u8::MAX);
}

/// An entry lapsing `ttl` from now, or never.
fn expiry_after(ttl: Option<Duration>) -> Expiry {
    let expires_at_ns = ttl
        .map_or(0, |ttl| monotonic_now_ns().saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX)).max(1));
    Expiry { expires_at_ns }
}

/// Time left at `now` of an entry in force; `None` for one without expiry.
fn expires_in(expiry: Expiry, now: u64) -> Option<Duration> {
    (expiry.expires_at_ns != 0).then(|| Duration::from_nanos(expiry.expires_at_ns.saturating_sub(now)))
}

pub(super) fn set_occupied(occupancy: &mut Array<MapData, u32>, slot: u32, occupied: bool) -> Result<(), XdpError> {
    occupancy.set(slot, u32::from(occupied), 0).map_err(map_error(names::OCCUPANCY))
}

/// One column of the settings' `[[xdp.port]]` table: `column` of each entry, the
/// default value in the unused places.
fn service_table<T: Copy + Default>(config: &XdpConfig, column: impl Fn(&PortLimit) -> T) -> [T; MAX_PORT_LIMITS] {
    let mut table = [T::default(); MAX_PORT_LIMITS];
    for (slot, entry) in table.iter_mut().zip(&config.port) {
        *slot = column(entry);
    }
    table
}

fn policy_of(rule: &CidrRule) -> CidrPolicy {
    let policy = match rule.action {
        CidrAction::Allow => CidrPolicy::new(Action::Allow, Default::default()),
        CidrAction::Deny => CidrPolicy::new(Action::Deny, Default::default()),
        CidrAction::Limit(limit) => {
            CidrPolicy { bytes: limit.byte_rate(), ..CidrPolicy::new(Action::Limit, limit.packets.rate()) }
        }
    };
    CidrPolicy { aggregate: rule.aggregate.map(|a| a.rate()).unwrap_or(policy.aggregate), ..policy }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use limiter_common::maps::FEATURE_COARSE_CLOCK;

    use super::settings_for;
    use crate::config::{Config, xdp::SynPorts};

    const XDP: &str = "[xdp]\ninterfaces = [\"eth0\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 20\n";

    fn parse(text: &str) -> Config {
        Config::parse(text, Path::new("test.toml")).expect("valid")
    }

    #[test]
    fn buckets_read_the_coarse_clock_only_if_it_fits_every_rate() {
        // 250 Hz: 4 ms; a bucket fits with at least 400 ms of refill in its burst.
        let tick = 4_000_000;
        let coarse =
            |text: &str| settings_for(&parse(text).xdp.expect("xdp"), &SynPorts::Every, tick).has(FEATURE_COARSE_CLOCK);
        assert!(coarse(XDP), "10 pps, burst 20: 2 s of refill");
        let rule = |pps: u32, burst: u32| {
            format!(
                "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\npackets_per_second = {pps}\nburst = {burst}\n"
            )
        };
        assert!(coarse(&rule(1_000, 400)));
        assert!(!coarse(&rule(1_000, 399)), "one rule below the bound keeps every bucket precise");
        assert!(!coarse(&format!("{XDP}[xdp.syn]\npackets_per_second = 1000\nburst = 10\n")));
        let bytes = |burst: u32| {
            XDP.replace("burst = 20", &format!("burst = 20\nbytes_per_second = 5_000_000\nbyte_burst = {burst}"))
        };
        assert!(coarse(&bytes(2_000_000)), "400 ms of refill in the byte burst");
        assert!(!coarse(&bytes(1_999_999)), "a byte budget below the bound keeps every bucket precise");
        let xdp = parse(XDP).xdp.expect("xdp");
        assert!(
            !settings_for(&xdp, &SynPorts::Every, u64::MAX).has(FEATURE_COARSE_CLOCK),
            "a kernel that cannot tell its tick"
        );
    }
}
