//! Names, keys and values of every map the XDP program shares with user space.
//!
//! All maps are pinned by name under `agent.pin_dir`, so a restarted agent and the
//! CLI find the same state. [`LAYOUT_VERSION`] changes whenever any record below
//! changes shape; an agent refuses pinned maps of another layout.

use core::mem::size_of;

use crate::bucket::{ByteRate, Rate};

/// Bumped on every change of a map's key, value or meaning.
pub const LAYOUT_VERSION: u32 = 5;

/// LRU hash of [`BucketKey`] → [`SourceState`]: each source's bucket, and one more
/// per `[[xdp.port]]` service it sends to; sized from `xdp.max_sources`.
///
/// The services' buckets share this map, under a key one service wider, rather than
/// a map of their own: the program then charges one map at one place, and the
/// verifier walks the inlined charge (two compare-and-swap loops, insert, race) once.
/// With a second map it walked it twice and refused the program at its million
/// instructions. The cost is 8 bytes a key for every source, and a source's
/// services' buckets share `max_sources` with everyone's; the other maps, the CLI
/// and the block and verified paths keep [`SourceKey`].
pub const SOURCES: &str = "SOURCES";
/// LPM trie of IPv4 CIDRs (`Key<[u8; 4]>`) → [`CidrPolicy`].
pub const CIDR_V4: &str = "CIDR_V4";
/// LPM trie of IPv6 CIDRs (`Key<[u8; 16]>`) → [`CidrPolicy`].
pub const CIDR_V6: &str = "CIDR_V6";
/// LPM trie of runtime-blocked IPv4 CIDRs → [`Block`].
pub const BLOCK_V4: &str = "BLOCK_V4";
/// LPM trie of runtime-blocked IPv6 CIDRs → [`Block`].
pub const BLOCK_V6: &str = "BLOCK_V6";
/// Array of [`SETTINGS_SLOTS`] [`Settings`] records; the active one is named by
/// [`SETTINGS_ACTIVE`].
pub const SETTINGS: &str = "SETTINGS";
/// Array of one `u32`: the index of the active [`Settings`] slot.
pub const SETTINGS_ACTIVE: &str = "SETTINGS_ACTIVE";
/// Array of [`BUDGET_SLOTS`] [`SourceState`] records: the global buckets
/// ([`BUDGET_NEW_SOURCES`], [`BUDGET_SYN`]), each one TAT changed only by
/// compare-and-swap like a source's bucket.
pub const BUDGETS: &str = "BUDGETS";
/// LRU hash of [`SourceKey`] (the source masked to `xdp.aggregate.ipv4_prefix` /
/// `ipv6_prefix`) → [`SourceState`]; sized from `xdp.aggregate.max_prefixes`.
pub const AGGREGATES: &str = "AGGREGATES";
/// LRU hash of [`SourceKey`] → [`Verified`]: sources that proved their address (a
/// request the proxy served over a completed TCP handshake, or an operator's
/// `limiter verify`); sized from `xdp.verified.max`.
pub const VERIFIED: &str = "VERIFIED";
/// LRU hash of [`SourceKey`] → [`SourceState`]: each unverified source's share of
/// [`BUDGET_SYN`] ([`Settings::syn_source_rate`]), so that no one source takes the
/// budget. A source gets an entry only with a SYN the budget admitted, so a flood
/// refused by the empty budget never churns it; [`MAX_SYN_SHARES`] entries.
pub const SYN_SHARES: &str = "SYN_SHARES";
/// Per-CPU array of `u64`, indexed by [`crate::counters::Counter`].
pub const COUNTERS: &str = "COUNTERS";
/// Array of [`OCCUPANCY_SLOTS`] `u32` flags, one per trie (`OCCUPIED_*`): 0 means
/// the trie is empty and the program skips its lookup; anything else means it may
/// hold entries. Writers set a flag before (and again after) inserting, and clear
/// it only after seeing the trie empty, re-checking after the clear (see
/// `KernelMaps` in the agent), so a flag of 0 never hides an entry for longer than
/// a concurrent insert takes.
pub const OCCUPANCY: &str = "OCCUPANCY";

/// [`OCCUPANCY`] slot of [`BLOCK_V4`].
pub const OCCUPIED_BLOCK_V4: u32 = 0;
/// [`OCCUPANCY`] slot of [`BLOCK_V6`].
pub const OCCUPIED_BLOCK_V6: u32 = 1;
/// [`OCCUPANCY`] slot of [`CIDR_V4`].
pub const OCCUPIED_CIDR_V4: u32 = 2;
/// [`OCCUPANCY`] slot of [`CIDR_V6`].
pub const OCCUPIED_CIDR_V6: u32 = 3;
/// Entries of [`OCCUPANCY`].
pub const OCCUPANCY_SLOTS: u32 = 4;

/// How many entries a pinned map holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entries {
    Fixed(u32),
    /// Sized from the config when the maps are created.
    Configured(Sizing),
}

/// The `[xdp]` keys that size a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    MaxSources,
    MaxPrefixes,
    MaxVerified,
}

/// The kernel's header of each element of a hash map: its list node and, in an LRU
/// map, the LRU node, then the hash, the key starting 8-aligned (`struct htab_elem`).
const HTAB_ELEMENT_HEADER: usize = 48;
/// The kernel's bucket of a hash map (`struct bucket`: list head and spin lock), one
/// per entry once the entry count is a power of two, as [`Sizing::max_entries`] is.
const HTAB_BUCKET: usize = 16;

impl Sizing {
    /// Every sizing key, for the checks that walk them.
    pub const ALL: [Self; 3] = [Self::MaxSources, Self::MaxPrefixes, Self::MaxVerified];

    /// The key under `[xdp]`.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Self::MaxSources => "max_sources",
            Self::MaxPrefixes => "aggregate.max_prefixes",
            Self::MaxVerified => "verified.max",
        }
    }

    /// Kernel memory the map may take: an LRU map is allocated whole when it is
    /// created (the kernel refuses one without preallocation), so this is what it
    /// costs from the first packet. The sources map holds every client, the two
    /// others a share of them: 1.5 GiB together at most, which a small host (4 GiB)
    /// still has room beside.
    #[must_use]
    pub const fn budget_bytes(self) -> usize {
        match self {
            Self::MaxSources => 1 << 30,
            Self::MaxPrefixes | Self::MaxVerified => 1 << 28,
        }
    }

    /// Kernel memory one entry takes: its key and value, each rounded up to 8 bytes,
    /// behind the element header, and its bucket.
    #[must_use]
    pub const fn entry_bytes(self) -> usize {
        let (key, value) = match self {
            Self::MaxSources => (size_of::<BucketKey>(), size_of::<SourceState>()),
            Self::MaxPrefixes => (size_of::<SourceKey>(), size_of::<SourceState>()),
            Self::MaxVerified => (size_of::<SourceKey>(), size_of::<Verified>()),
        };
        HTAB_ELEMENT_HEADER + key.next_multiple_of(8) + value.next_multiple_of(8) + HTAB_BUCKET
    }

    /// The most entries the key may ask for: as many as [`Self::budget_bytes`] holds
    /// at [`Self::entry_bytes`] each, rounded down to a power of two (the kernel
    /// rounds the bucket array up to one).
    #[must_use]
    pub const fn max_entries(self) -> u32 {
        let fit = self.budget_bytes() / self.entry_bytes();
        // `fit` is far below 2^32, and at least 1.
        1 << (usize::BITS - 1 - fit.leading_zeros())
    }
}

/// A pinned map's name and shape, which pinned maps are checked against before a
/// program reuses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedMap {
    pub name: &'static str,
    pub key_size: usize,
    pub value_size: usize,
    pub entries: Entries,
}

impl PinnedMap {
    const fn new(name: &'static str, key_size: usize, value_size: usize, entries: Entries) -> Self {
        Self { name, key_size, value_size, entries }
    }
}

/// An LPM trie's key: the prefix length, then the address.
const fn lpm_key<const N: usize>() -> usize {
    size_of::<u32>() + N
}

/// Every pinned map: the one list the loader, the layout check and `limiter detach`
/// walk.
pub const ALL: [PinnedMap; 13] = [
    PinnedMap::new(SOURCES, size_of::<BucketKey>(), size_of::<SourceState>(), Entries::Configured(Sizing::MaxSources)),
    PinnedMap::new(
        AGGREGATES,
        size_of::<SourceKey>(),
        size_of::<SourceState>(),
        Entries::Configured(Sizing::MaxPrefixes),
    ),
    PinnedMap::new(VERIFIED, size_of::<SourceKey>(), size_of::<Verified>(), Entries::Configured(Sizing::MaxVerified)),
    PinnedMap::new(BUDGETS, size_of::<u32>(), size_of::<SourceState>(), Entries::Fixed(BUDGET_SLOTS)),
    PinnedMap::new(SYN_SHARES, size_of::<SourceKey>(), size_of::<SourceState>(), Entries::Fixed(MAX_SYN_SHARES)),
    PinnedMap::new(CIDR_V4, lpm_key::<4>(), size_of::<CidrPolicy>(), Entries::Fixed(MAX_CIDRS)),
    PinnedMap::new(CIDR_V6, lpm_key::<16>(), size_of::<CidrPolicy>(), Entries::Fixed(MAX_CIDRS)),
    PinnedMap::new(BLOCK_V4, lpm_key::<4>(), size_of::<Block>(), Entries::Fixed(MAX_BLOCKS)),
    PinnedMap::new(BLOCK_V6, lpm_key::<16>(), size_of::<Block>(), Entries::Fixed(MAX_BLOCKS)),
    PinnedMap::new(SETTINGS, size_of::<u32>(), size_of::<Settings>(), Entries::Fixed(SETTINGS_SLOTS)),
    PinnedMap::new(SETTINGS_ACTIVE, size_of::<u32>(), size_of::<u32>(), Entries::Fixed(1)),
    PinnedMap::new(COUNTERS, size_of::<u32>(), size_of::<u64>(), Entries::Fixed(crate::counters::Counter::COUNT)),
    PinnedMap::new(OCCUPANCY, size_of::<u32>(), size_of::<u32>(), Entries::Fixed(OCCUPANCY_SLOTS)),
];

/// [`BUDGETS`] slot of the bucket every new source's first packet takes a token from.
pub const BUDGET_NEW_SOURCES: u32 = 0;
/// [`BUDGETS`] slot of the bucket every TCP SYN from an unverified source takes a
/// token from.
pub const BUDGET_SYN: u32 = 1;
/// Entries of [`BUDGETS`].
pub const BUDGET_SLOTS: u32 = 2;

/// Capacity of [`SYN_SHARES`]: a source evicted from it comes back with a full
/// share, which takes more sources opening handshakes at once than the budget
/// could admit anyway.
pub const MAX_SYN_SHARES: u32 = 65_536;
/// Most ports [`Settings::syn_ports`] holds.
pub const MAX_SYN_PORTS: usize = 16;
/// Most `[[xdp.port]]` entries [`Settings::port_keys`] holds: a host serves a
/// handful of services, and the program scans them all for every packet to a port.
pub const MAX_PORT_LIMITS: usize = 16;

/// Capacity of each CIDR trie.
pub const MAX_CIDRS: u32 = 65_536;
/// Capacity of each runtime-block trie.
pub const MAX_BLOCKS: u32 = 65_536;
/// Settings are double-buffered: user space fills the inactive slot, then flips
/// [`SETTINGS_ACTIVE`] with one 4-byte write, so the program never reads a record
/// that is half old and half new.
pub const SETTINGS_SLOTS: u32 = 2;

/// A source: IPv4 as `::ffff:a.b.c.d`, IPv6 masked to `xdp.ipv6_prefix`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// See [`crate::addr`].
    pub addr: [u8; 16],
}

/// The key of a bucket in [`SOURCES`]: a source, and the `[[xdp.port]]` service
/// the bucket is for, or none (0, 0) for its bucket of everything else.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// As [`SourceKey::addr`].
    pub addr: [u8; 16],
    /// The service's destination port, host order.
    pub port: u16,
    /// The service's `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub protocol: u8,
    pub reserved: u8,
}

impl BucketKey {
    /// The bucket of `source` for everything but the listed services.
    #[must_use]
    pub const fn source(source: &SourceKey) -> Self {
        Self { addr: source.addr, port: 0, protocol: 0, reserved: 0 }
    }

    /// Whether this is a service's bucket.
    #[must_use]
    pub const fn is_service(&self) -> bool {
        self.protocol != 0
    }
}

/// A source's bucket and its totals.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    /// GCRA theoretical arrival time, `CLOCK_MONOTONIC` (`bpf_ktime_get_ns`, or its
    /// tick-grained variant under [`FEATURE_COARSE_CLOCK`]); only ever changed by
    /// compare-and-swap.
    pub tat_ns: u64,
    /// TAT of the byte bucket, in ticks of `crate::bucket::BYTE_TICKS_PER_NS` on
    /// the same clock; used only where a byte budget applies (in [`SOURCES`]), and
    /// also only changed by compare-and-swap.
    pub byte_tat: u64,
    /// Packets seen from this source.
    pub packets: u64,
    /// Of those, dropped by the limit, of packets or of bytes (or would-drop in dry
    /// run).
    pub dropped: u64,
}

/// What a CIDR rule does to the sources inside it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Never limited.
    Allow = 0,
    /// Always dropped.
    Deny = 1,
    /// Limited per source with the rule's own rate.
    Limit = 2,
}

/// Value of the CIDR tries.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrPolicy {
    /// An [`Action`] as `u32`.
    pub action: u32,
    /// Keeps `rate` 8-byte aligned on both sides.
    pub reserved: u32,
    /// Used when `action` is [`Action::Limit`].
    pub rate: Rate,
    /// The byte budget of each source under the rule, with [`Action::Limit`];
    /// [`ByteRate::NONE`]: none (the default's does not apply either).
    pub bytes: ByteRate,
    /// The prefix aggregate of sources under this rule; an `interval_ns` of 0 means
    /// the rule has none of its own and [`Settings::aggregate_rate`] applies.
    pub aggregate: Rate,
}

impl CidrPolicy {
    /// A rule with no aggregate of its own.
    #[must_use]
    pub const fn new(action: Action, rate: Rate) -> Self {
        Self {
            action: action as u32,
            reserved: 0,
            rate,
            bytes: ByteRate::NONE,
            aggregate: Rate { interval_ns: 0, tolerance_ns: 0 },
        }
    }
}

/// Value of the block tries and of [`VERIFIED`]: an entry that lapses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expiry {
    /// `CLOCK_MONOTONIC` (= `bpf_ktime_get_ns`) instant the entry lapses; 0 never.
    pub expires_at_ns: u64,
}

/// A runtime block.
pub type Block = Expiry;
/// A verified source.
pub type Verified = Expiry;

impl Expiry {
    /// Whether the entry still applies at `now_ns`.
    #[inline(always)]
    #[must_use]
    pub const fn active(&self, now_ns: u64) -> bool {
        self.expires_at_ns == 0 || now_ns < self.expires_at_ns
    }
}

/// [`Settings::features`] bit: new sources take a token from [`BUDGET_NEW_SOURCES`].
pub const FEATURE_NEW_SOURCES: u8 = 1;
/// [`Settings::features`] bit: every packet charges its prefix's aggregate.
pub const FEATURE_AGGREGATE: u8 = 2;
/// [`Settings::features`] bit: SYNs from unverified sources take a token from
/// their share in [`SYN_SHARES`], then from [`BUDGET_SYN`].
pub const FEATURE_SYN: u8 = 4;
/// [`Settings::features`] bit (with [`FEATURE_SYN`]): only SYNs to one of
/// [`Settings::syn_ports`] do; without it, SYNs to every port.
pub const FEATURE_SYN_PORTS: u8 = 16;

/// [`Settings::features`] bit: buckets read `bpf_ktime_get_coarse_ns` (the time of
/// the last tick) instead of `bpf_ktime_get_ns`; set by the agent only when every
/// rate in force passes `crate::bucket::coarse_clock_fits`.
pub const FEATURE_COARSE_CLOCK: u8 = 8;

/// [`Settings::features`] bit: some `[[xdp.port]]` entries are in
/// [`Settings::port_keys`]; without it the program does not look.
pub const FEATURE_PORTS: u8 = 64;

/// [`Settings::port_keys`]' entry for `protocol` and `port`.
#[must_use]
pub const fn port_key(protocol: u8, port: u16) -> u32 {
    (protocol as u32) << 16 | port as u32
}

/// The program's tunables, read on every packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Bucket of every source no CIDR rule limits otherwise.
    pub default_rate: Rate,
    /// The budget of new sources (with [`FEATURE_NEW_SOURCES`]).
    pub new_source_rate: Rate,
    /// Bucket of each prefix (with [`FEATURE_AGGREGATE`], or a rule's own).
    pub aggregate_rate: Rate,
    /// The budget of SYNs from unverified sources (with [`FEATURE_SYN`]).
    pub syn_rate: Rate,
    /// Each unverified source's share of it ([`SYN_SHARES`]).
    pub syn_source_rate: Rate,
    /// Byte budget of every source no CIDR rule limits otherwise;
    /// [`ByteRate::NONE`]: none, and the frame's length is not even read.
    pub default_bytes: ByteRate,
    /// The ports whose SYNs take from the budget (with [`FEATURE_SYN_PORTS`]); 0
    /// fills the unused places.
    pub syn_ports: [u16; MAX_SYN_PORTS],
    /// The `[[xdp.port]]` services (with [`FEATURE_PORTS`]), as [`port_key`]; 0
    /// fills the unused places.
    pub port_keys: [u32; MAX_PORT_LIMITS],
    /// The bucket of each source for the service in the same place of `port_keys`.
    pub port_rates: [Rate; MAX_PORT_LIMITS],
    /// Its byte budget ([`ByteRate::NONE`]: none).
    pub port_bytes: [ByteRate; MAX_PORT_LIMITS],
    /// [`LAYOUT_VERSION`] of the agent that wrote this record.
    pub layout_version: u32,
    /// 1: drop; 0: dry run, count would-drops.
    pub enforce: u8,
    /// 1: drop malformed frames; 0: pass them (still limited if the source is known).
    pub malformed_drop: u8,
    /// IPv6 sources share a bucket per prefix of this length.
    pub ipv6_prefix: u8,
    /// `FEATURE_*` bits.
    pub features: u8,
    /// IPv4 sources share an aggregate per prefix of this length.
    pub aggregate_ipv4_prefix: u8,
    /// IPv6 sources share an aggregate per prefix of this length.
    pub aggregate_ipv6_prefix: u8,
    /// Keeps the record's size a multiple of 8.
    pub reserved: [u8; 6],
}

impl Settings {
    /// Whether `feature` (a `FEATURE_*` bit) is on.
    #[inline(always)]
    #[must_use]
    pub const fn has(&self, feature: u8) -> bool {
        self.features & feature != 0
    }

    /// The bucket and byte budget of the `[[xdp.port]]` service of `protocol` and
    /// `port`, if one is listed.
    #[inline(always)]
    #[must_use]
    pub fn port_limit(&self, protocol: u8, port: u16) -> Option<(Rate, ByteRate)> {
        let key = port_key(protocol, port);
        let mut i = 0;
        while i < MAX_PORT_LIMITS {
            if self.port_keys[i] == key {
                return Some((self.port_rates[i], self.port_bytes[i]));
            }
            i += 1;
        }
        None
    }

    /// Whether a SYN to `port` takes from the SYN budget.
    #[inline(always)]
    #[must_use]
    pub fn syn_port_counts(&self, port: u16) -> bool {
        if !self.has(FEATURE_SYN_PORTS) {
            return true;
        }
        let mut i = 0;
        while i < MAX_SYN_PORTS {
            if self.syn_ports[i] == port && port != 0 {
                return true;
            }
            i += 1;
        }
        false
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): `repr(C)` plain data without padding bytes or pointers.
    unsafe impl aya::Pod for super::SourceKey {}
    unsafe impl aya::Pod for super::BucketKey {}
    unsafe impl aya::Pod for super::SourceState {}
    unsafe impl aya::Pod for super::CidrPolicy {}
    unsafe impl aya::Pod for super::Expiry {}
    unsafe impl aya::Pod for super::Settings {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::{Block, BucketKey, CidrPolicy, Settings, Sizing, SourceKey, SourceState};

    /// The kernel and user space agree on these sizes; a change here is a layout change.
    #[test]
    fn record_sizes_are_stable() {
        assert_eq!(size_of::<SourceKey>(), 16);
        assert_eq!(size_of::<BucketKey>(), 20);
        assert_eq!(size_of::<SourceState>(), 32);
        assert_eq!(size_of::<CidrPolicy>(), 56);
        assert_eq!(size_of::<Block>(), 8);
        assert_eq!(size_of::<Settings>(), 720);
    }

    /// The bounds README and config/limiter.toml state, and what they cost.
    #[test]
    fn sizing_bounds_fit_their_budgets() {
        assert_eq!(Sizing::MaxSources.max_entries(), 8_388_608);
        assert_eq!(Sizing::MaxPrefixes.max_entries(), 2_097_152);
        assert_eq!(Sizing::MaxVerified.max_entries(), 2_097_152);
        assert_eq!((Sizing::MaxSources.entry_bytes(), Sizing::MaxVerified.entry_bytes()), (120, 88));
        for sizing in Sizing::ALL {
            assert!(sizing.max_entries() as usize * sizing.entry_bytes() <= sizing.budget_bytes(), "{sizing:?}");
        }
    }
}
