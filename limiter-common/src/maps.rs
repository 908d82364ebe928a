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
/// LPM trie of demoted sources (`Key<[u8; 16]>`, IPv4 in its mapped form, see
/// [`crate::addr`]) → [`Demotion`]: their bucket's rate in place of the one their
/// CIDR rule, `[[xdp.port]]` entry or `[xdp.limit]` gives. One trie for both
/// families, unlike the others: a lookup per family doubled the paths the verifier
/// walks through the buckets, and took the program past its limit.
pub const DEMOTE: &str = "DEMOTE";
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
/// [`OCCUPANCY`] slot of [`DEMOTE`].
pub const OCCUPIED_DEMOTE: u32 = 4;
/// Entries of [`OCCUPANCY`].
pub const OCCUPANCY_SLOTS: u32 = 5;

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
pub const ALL: [PinnedMap; 14] = [
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
    PinnedMap::new(DEMOTE, lpm_key::<16>(), size_of::<Demotion>(), Entries::Fixed(MAX_DEMOTIONS)),
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

/// Most networks [`Settings::udp_replies_from`] holds.
pub const MAX_UDP_REPLY_SOURCES: usize = 16;

/// Capacity of each CIDR trie.
pub const MAX_CIDRS: u32 = 65_536;
/// Capacity of each runtime-block trie.
pub const MAX_BLOCKS: u32 = 65_536;
/// Capacity of each demotion trie.
pub const MAX_DEMOTIONS: u32 = 65_536;
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

/// Value of the demotion tries: a source's bucket rate while it is demoted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demotion {
    /// Replaces the source's rate; its bucket's TAT is kept, so the switch refills
    /// nothing.
    pub rate: Rate,
    /// When the demotion lapses.
    pub expiry: Expiry,
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

/// [`Settings::features`] bit: `[xdp.services]` is in force: a packet must be to a
/// port the host serves, a reply to its own traffic, or of a protocol the policy
/// passes ([`Settings::serves`]).
pub const FEATURE_SERVICES: u8 = 32;

/// [`Settings::service_flags`] bit: ICMP (but neighbour discovery, which always
/// passes) goes on to the buckets; without it, dropped.
pub const SERVICE_ICMP_PASS: u8 = 1;
/// [`Settings::service_flags`] bit: IP protocols other than TCP, UDP and ICMP go on
/// to the buckets; without it, dropped.
pub const SERVICE_OTHER_PASS: u8 = 2;

/// IP protocol numbers the service policy tells apart.
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

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
    /// `SERVICE_*` bits (with [`FEATURE_SERVICES`]).
    pub service_flags: u8,
    /// Entries of [`Self::udp_replies_from`] in use.
    pub udp_replies: u8,
    /// The host's ephemeral ports, first and last (`net.ipv4.ip_local_port_range`,
    /// which IPv6 shares): replies to its own connections arrive on them.
    pub ephemeral_ports: [u16; 2],
    /// Sources whose UDP may reach an ephemeral port (resolvers, NTP servers): a
    /// bounded list scanned in place, which costs a reflection flood aimed at
    /// ephemeral ports a few compares per entry and nothing else, where a trie
    /// would cost every such packet a lookup; unused places are never read.
    pub udp_replies_from: [Network; MAX_UDP_REPLY_SOURCES],
    /// The TCP ports the host serves (with [`FEATURE_SERVICES`]).
    pub tcp_ports: PortSet,
    /// The UDP ports the host serves.
    pub udp_ports: PortSet,
}

/// A set of ports as one bit each: a port's lookup is one load from the settings
/// record the program already holds, with no helper call and no loop.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PortSet(pub [u64; 1024]);

impl PortSet {
    pub const EMPTY: Self = Self([0; 1024]);

    /// Whether `port` is in the set (0 never is: no packet is to port 0).
    #[inline(always)]
    #[must_use]
    pub const fn contains(&self, port: u16) -> bool {
        // `port >> 6` is below 1024: no bounds check is left for the verifier.
        (self.0[(port >> 6) as usize] >> (port & 63)) & 1 != 0
    }

    pub fn insert(&mut self, port: u16) {
        if port != 0 {
            self.0[usize::from(port >> 6)] |= 1 << (port & 63);
        }
    }
}

impl Default for PortSet {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl core::fmt::Debug for PortSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_set().entries((1..=u16::MAX).filter(|port| self.contains(*port))).finish()
    }
}

/// A network of [`Settings::udp_replies_from`]: the 16-byte form of its first
/// address (`crate::addr`, IPv4 as `::ffff:a.b.c.d`) and of its mask, as two
/// native-endian halves each so that a match is two ANDs and two compares.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Network {
    pub addr: [u64; 2],
    pub mask: [u64; 2],
}

impl Network {
    /// The network of `addr` (16-byte form) with the first `prefix_len` bits of it.
    #[must_use]
    pub fn new(addr: [u8; 16], prefix_len: u8) -> Self {
        let mask = crate::addr::mask_v6([0xff; 16], prefix_len);
        let addr = crate::addr::mask_v6(addr, prefix_len);
        Self { addr: halves(&addr), mask: halves(&mask) }
    }

    /// Whether the 16-byte `addr` is inside.
    #[inline(always)]
    #[must_use]
    pub fn contains(&self, addr: &[u8; 16]) -> bool {
        let [high, low] = halves(addr);
        high & self.mask[0] == self.addr[0] && low & self.mask[1] == self.addr[1]
    }
}

#[inline(always)]
fn halves(addr: &[u8; 16]) -> [u64; 2] {
    let [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p] = *addr;
    [u64::from_ne_bytes([a, b, c, d, e, f, g, h]), u64::from_ne_bytes([i, j, k, l, m, n, o, p])]
}

impl Settings {
    /// Whether `feature` (a `FEATURE_*` bit) is on.
    #[inline(always)]
    #[must_use]
    pub const fn has(&self, feature: u8) -> bool {
        self.features & feature != 0
    }

    /// The place in [`Self::port_rates`] and [`Self::port_bytes`] of the
    /// `[[xdp.port]]` service of `protocol` and `port`, if one is listed: a place
    /// rather than the rates, which the program reads where they lie (a tuple in an
    /// `Option` leaves registers undefined that the verifier refuses to copy).
    #[inline(always)]
    #[must_use]
    pub fn port_entry(&self, protocol: u8, port: u16) -> Option<usize> {
        let key = port_key(protocol, port);
        let mut i = 0;
        while i < MAX_PORT_LIMITS {
            if self.port_keys[i] == key {
                return Some(i);
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

    /// Whether `[xdp.services]` lets the first (or only) fragment of a packet go on
    /// to the buckets: `protocol` its IP protocol, `port` its TCP or UDP destination
    /// port (0 where the header is too short to show it: a tiny first fragment, RFC
    /// 1858, is no service's), `reply` whether TCP has ACK or RST set, `source` the
    /// 16-byte form of its source address.
    ///
    /// TCP and UDP to a served port pass. TCP with ACK or RST to an ephemeral port is
    /// taken for a reply to the host's own connection (a SYN-ACK, data, a reset),
    /// which the stack checks against its sockets; RST too, since a reset answering
    /// a segment that carried ACK carries none itself. UDP has no handshake, so
    /// UDP to an ephemeral port passes only from [`Self::udp_replies_from`].
    #[inline(always)]
    #[must_use]
    pub fn serves(&self, protocol: u8, port: u16, reply: bool, source: &[u8; 16]) -> bool {
        let ephemeral = port != 0 && self.ephemeral_ports[0] <= port && port <= self.ephemeral_ports[1];
        match protocol {
            IPPROTO_TCP => self.tcp_ports.contains(port) || (reply && ephemeral),
            IPPROTO_UDP => self.udp_ports.contains(port) || (ephemeral && self.udp_reply_from(source)),
            IPPROTO_ICMP | IPPROTO_ICMPV6 => self.service_flags & SERVICE_ICMP_PASS != 0,
            _ => self.service_flags & SERVICE_OTHER_PASS != 0,
        }
    }

    #[inline(always)]
    fn udp_reply_from(&self, source: &[u8; 16]) -> bool {
        let mut i = 0;
        while i < MAX_UDP_REPLY_SOURCES && i < self.udp_replies as usize {
            if self.udp_replies_from[i].contains(source) {
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
    unsafe impl aya::Pod for super::Demotion {}
    unsafe impl aya::Pod for super::Settings {}
    unsafe impl aya::Pod for super::PortSet {}
    unsafe impl aya::Pod for super::Network {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::{
        Block, BucketKey, CidrPolicy, Demotion, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, Network,
        PortSet, SERVICE_ICMP_PASS, Settings, Sizing, SourceKey, SourceState,
    };
    use crate::addr::v4_mapped;

    /// The kernel and user space agree on these sizes; a change here is a layout change.
    #[test]
    fn record_sizes_are_stable() {
        assert_eq!(size_of::<SourceKey>(), 16);
        assert_eq!(size_of::<BucketKey>(), 20);
        assert_eq!(size_of::<SourceState>(), 32);
        assert_eq!(size_of::<CidrPolicy>(), 56);
        assert_eq!(size_of::<Block>(), 8);
        assert_eq!(size_of::<Demotion>(), 24);
        assert_eq!(size_of::<Settings>(), 720 + 16 * 32 + 2 * 8192);
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

    #[test]
    fn port_sets_hold_every_port_but_zero() {
        let mut set = PortSet::EMPTY;
        for port in [0, 1, 63, 64, 443, u16::MAX] {
            set.insert(port);
        }
        assert!((0..=u16::MAX).filter(|port| set.contains(*port)).eq([1, 63, 64, 443, u16::MAX]));
    }

    /// The service policy's table: served ports, replies to the host's connections,
    /// UDP replies only from the listed networks, ICMP and other protocols by flag.
    #[test]
    fn the_service_policy_serves_listed_ports_and_replies() {
        let mut settings = Settings { ephemeral_ports: [32_768, 60_999], ..Settings::default() };
        settings.tcp_ports.insert(443);
        settings.udp_ports.insert(443);
        settings.udp_replies_from[0] = Network::new(v4_mapped([10, 0, 0, 0]), 96 + 24);
        let mut v6 = [0u8; 16];
        v6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        settings.udp_replies_from[1] = Network::new(v6, 32);
        settings.udp_replies = 2;
        let (resolver, stranger) = (v4_mapped([10, 0, 0, 53]), v4_mapped([192, 0, 2, 1]));
        let tcp = |port, reply| settings.serves(IPPROTO_TCP, port, reply, &stranger);
        assert!(tcp(443, false) && tcp(443, true));
        assert!(!tcp(22, false) && !tcp(22, true), "not served, not ephemeral");
        assert!(tcp(40_000, true) && !tcp(40_000, false), "a reply, or a SYN to an ephemeral port");
        assert!(!tcp(0, true), "a header too short to show its port");
        assert!(!tcp(60_999 + 1, true) && tcp(60_999, true) && tcp(32_768, true) && !tcp(32_767, true));
        let udp = |port, source: &[u8; 16]| settings.serves(IPPROTO_UDP, port, false, source);
        assert!(udp(443, &stranger));
        assert!(!udp(40_000, &stranger) && udp(40_000, &resolver), "replies only from udp_replies_from");
        let mut inside = v6;
        inside[15] = 1;
        assert!(udp(40_000, &inside), "an IPv6 network");
        assert!(!udp(53, &resolver), "not ephemeral");
        assert!(!settings.serves(IPPROTO_ICMP, 0, false, &stranger));
        assert!(!settings.serves(47, 0, false, &stranger), "GRE under other = drop");
        let mut settings = Settings { service_flags: SERVICE_ICMP_PASS, udp_replies: 1, ..settings };
        assert!(settings.serves(IPPROTO_ICMP, 0, false, &stranger));
        assert!(settings.serves(IPPROTO_ICMPV6, 0, false, &stranger));
        assert!(!settings.serves(IPPROTO_UDP, 40_000, false, &v6), "entries past udp_replies are not read");
        settings.udp_replies = 2;
        assert!(settings.serves(IPPROTO_UDP, 40_000, false, &v6));
    }
}
