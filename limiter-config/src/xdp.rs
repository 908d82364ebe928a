//! `[xdp]`: the kernel layer's interfaces, default bucket and CIDR rules, and what
//! holds against spoofed sources (`new_sources`, `aggregate`, `verified`, `syn`), and
//! the ports the host serves (`services`).

use std::{
    num::{NonZeroU16, NonZeroU32, NonZeroU64},
    time::Duration,
};

use ipnet::IpNet;
use limiter_common::{
    bucket::{ByteRate, MAX_BYTES_PER_SECOND, MAX_PER_SECOND, MIN_BYTES_PER_SECOND, Rate},
    maps::{MAX_PORT_LIMITS, MAX_SYN_PORTS, MAX_UDP_REPLY_SOURCES, Sizing},
};
use serde::Deserialize;

use super::{ProxyConfig, units::HumanDuration};
use crate::changes::{Changes, Keyed};

/// `[xdp]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Changes)]
#[serde(deny_unknown_fields)]
pub struct XdpConfig {
    /// Interfaces to attach to.
    #[changes(skip = "a reload reports each interface it attaches or detaches")]
    pub interfaces: Vec<String>,
    #[serde(default)]
    #[changes(restart = "attached interfaces keep theirs")]
    pub mode: AttachMode,
    /// `false`: dry run, count would-drops and drop nothing.
    #[serde(default = "yes")]
    pub enforce: bool,
    /// Bound on tracked sources (LRU); fixed when the maps are created.
    #[serde(default = "default_max_sources")]
    #[changes(restart = "the sources map is sized when created")]
    pub max_sources: NonZeroU32,
    /// IPv6 sources share one bucket per prefix of this many bits.
    #[serde(default = "default_ipv6_prefix")]
    pub ipv6_prefix: Ipv6Prefix,
    #[serde(default)]
    pub malformed: MalformedAction,
    /// The bucket (and byte budget) of every source no CIDR rule covers.
    pub limit: SourceLimit,
    /// CIDR rules; the longest matching prefix wins.
    #[serde(default)]
    #[changes(keyed)]
    pub cidr: Vec<CidrRule>,
    /// `[[xdp.port]]`: per-source buckets for one service each, in place of `limit`
    /// for packets to its port.
    #[serde(default)]
    #[changes(keyed)]
    pub port: Vec<PortLimit>,
    /// The budget a source without a bucket takes a token from; `None`: off, every
    /// new source gets a bucket.
    pub new_sources: Option<PacketLimit>,
    /// The bucket every prefix's sources share.
    #[serde(default)]
    pub aggregate: AggregateConfig,
    /// Sources that proved their address.
    #[serde(default)]
    pub verified: VerifiedConfig,
    /// The budget of TCP SYNs from unverified sources; `None`: off.
    pub syn: Option<SynConfig>,
    /// The ports and protocols the host serves; `None`: every packet goes on to the
    /// buckets.
    pub services: Option<ServicesConfig>,
}

/// `[xdp.services]`: what reaches the host past the CIDR rules. TCP and UDP to a port
/// not listed is dropped, but for replies to the host's own traffic (TCP with ACK or
/// RST to an ephemeral port; UDP to one from `udp_replies_from`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct ServicesConfig {
    /// Required: a section that forgot it would cut the host off SSH.
    pub tcp: Vec<Port>,
    #[serde(default)]
    pub udp: Vec<Port>,
    /// ICMP and ICMPv6, but neighbour discovery (which always passes).
    #[serde(default)]
    pub icmp: Verdict,
    /// IP protocols other than TCP, UDP and ICMP.
    #[serde(default = "dropped")]
    pub other: Verdict,
    /// Sources whose UDP may reach the host's ephemeral ports: its resolvers and NTP
    /// servers, whose answers come back there.
    #[serde(default)]
    pub udp_replies_from: Vec<ReplySource>,
}

/// A TCP or UDP port, 1 to 65535.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "i64")]
pub struct Port(pub NonZeroU16);

impl TryFrom<i64> for Port {
    type Error = String;

    fn try_from(port: i64) -> Result<Self, String> {
        u16::try_from(port)
            .ok()
            .and_then(NonZeroU16::new)
            .map(Self)
            .ok_or_else(|| format!("{port} is not a port from 1 to 65535"))
    }
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One network of `udp_replies_from`: a CIDR or a single address.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "String")]
pub struct ReplySource(pub IpNet);

impl TryFrom<String> for ReplySource {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        parse_cidr(&text).map(Self)
    }
}

/// What the service policy does with a kind of packet.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Go on to the buckets, as every packet does without the policy.
    #[default]
    Pass,
    Drop,
}

fn dropped() -> Verdict {
    Verdict::Drop
}

/// The first element of `list` that an earlier one equals.
fn first_repeated<T: PartialEq>(list: &[T]) -> Option<&T> {
    list.iter().enumerate().find(|(i, item)| list[..*i].contains(item)).map(|(_, item)| item)
}

impl ServicesConfig {
    /// Lists that serde reads one element at a time: duplicates and bounds.
    fn validate(&self) -> Result<(), (String, String)> {
        for (key, ports) in [("tcp", &self.tcp), ("udp", &self.udp)] {
            if let Some(twice) = first_repeated(ports) {
                return Err((format!("xdp.services.{key}"), format!("{twice} appears twice")));
            }
        }
        let sources = &self.udp_replies_from;
        if sources.len() > MAX_UDP_REPLY_SOURCES {
            return Err((
                "xdp.services.udp_replies_from".to_owned(),
                format!(
                    "{} networks, more than the {MAX_UDP_REPLY_SOURCES} the kernel checks each packet against: \
                     list the resolvers' and NTP servers' networks",
                    sources.len()
                ),
            ));
        }
        if let Some(twice) = first_repeated(sources) {
            return Err(("xdp.services.udp_replies_from".to_owned(), format!("{} appears twice", twice.0)));
        }
        // IPv4 sources are keyed as `::ffff:a.b.c.d` (and IPv4-mapped IPv6 sources
        // dropped): an IPv6 network over that range would take in IPv4 ones.
        let mapped = IpNet::V6(
            ipnet::Ipv6Net::new(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96).unwrap_or_default(),
        );
        if let Some(wide) = sources.iter().find(|source| source.0.contains(&mapped)) {
            return Err((
                "xdp.services.udp_replies_from".to_owned(),
                format!("{} takes in ::ffff:0:0/96, where IPv4 sources are kept: list IPv4 networks as IPv4", wide.0),
            ));
        }
        Ok(())
    }
}

/// `[xdp.syn]`: the budget of TCP SYNs from unverified sources, each source's share
/// of it, and the ports whose SYNs take from it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawSyn")]
#[changes(display)]
pub struct SynConfig {
    pub limit: PacketLimit,
    /// What one unverified source may take of it; `None`: a tenth of its rate and
    /// burst (see [`SynConfig::per_source`]), told apart from a share set to the same
    /// so that `limiter check` can say what the default does to an older config.
    pub per_source: Option<PacketLimit>,
    /// Only SYNs to these ports take from it; `None`: the proxy's listen port, or
    /// every port without a proxy (see [`XdpConfig::syn_ports`]).
    pub ports: Option<Vec<NonZeroU16>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSyn {
    packets_per_second: NonZeroU32,
    burst: NonZeroU32,
    per_source_packets_per_second: Option<NonZeroU32>,
    per_source_burst: Option<NonZeroU32>,
    ports: Option<Vec<NonZeroU16>>,
}

impl TryFrom<RawSyn> for SynConfig {
    type Error = String;

    fn try_from(raw: RawSyn) -> Result<Self, String> {
        let limit = PacketLimit::new(raw.packets_per_second, raw.burst)?;
        let per_source = optional_limit(raw.per_source_packets_per_second, raw.per_source_burst, "per_source_")?;
        if let Some(ports) = &raw.ports {
            if ports.is_empty() || ports.len() > MAX_SYN_PORTS {
                return Err(format!("ports: 1 to {MAX_SYN_PORTS} ports, or leave it out for the proxy's"));
            }
            if let Some(twice) = first_repeated(ports) {
                return Err(format!("ports: {twice} appears twice"));
            }
        }
        Ok(Self { limit, per_source, ports: raw.ports })
    }
}

impl SynConfig {
    /// The share of one source: `per_source_*`, by default a tenth of the budget's
    /// rate and burst (rounded up), so that it takes ten sources, not one, to empty it.
    #[must_use]
    pub fn per_source(&self) -> PacketLimit {
        let tenth = |n: NonZeroU32| NonZeroU32::new(n.get().div_ceil(10)).unwrap_or(NonZeroU32::MIN);
        self.per_source.unwrap_or(PacketLimit {
            packets_per_second: tenth(self.limit.packets_per_second),
            burst: tenth(self.limit.burst),
        })
    }
}

impl std::fmt::Display for SynConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, at most {} per source", self.limit, self.per_source())?;
        match &self.ports {
            Some(ports) => write!(f, ", to ports {}", port_list(ports)),
            None => Ok(()),
        }
    }
}

/// `22, 443`.
fn port_list(ports: &[NonZeroU16]) -> String {
    ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The ports whose SYNs take from the SYN budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SynPorts {
    Every,
    Only(Vec<NonZeroU16>),
}

/// `[xdp.aggregate]`: without a rate, only rules with their own aggregate use it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawAggregate")]
pub struct AggregateConfig {
    pub ipv4_prefix: Ipv4Prefix,
    pub ipv6_prefix: Ipv6Prefix,
    /// Bound on tracked prefixes (LRU); fixed when the maps are created.
    #[changes(restart = "the map is sized when created")]
    pub max_prefixes: NonZeroU32,
    /// The bucket of each prefix; `None`: no aggregate outside rules that set one.
    pub limit: Option<PacketLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregate {
    ipv4_prefix: Option<Ipv4Prefix>,
    ipv6_prefix: Option<Ipv6Prefix>,
    max_prefixes: Option<NonZeroU32>,
    packets_per_second: Option<NonZeroU32>,
    burst: Option<NonZeroU32>,
}

impl Default for AggregateConfig {
    fn default() -> Self {
        Self {
            ipv4_prefix: Ipv4Prefix(24),
            ipv6_prefix: Ipv6Prefix(48),
            max_prefixes: NonZeroU32::new(65_536).unwrap_or(NonZeroU32::MIN),
            limit: None,
        }
    }
}

impl TryFrom<RawAggregate> for AggregateConfig {
    type Error = String;

    fn try_from(raw: RawAggregate) -> Result<Self, String> {
        let defaults = Self::default();
        Ok(Self {
            ipv4_prefix: raw.ipv4_prefix.unwrap_or(defaults.ipv4_prefix),
            ipv6_prefix: raw.ipv6_prefix.unwrap_or(defaults.ipv6_prefix),
            max_prefixes: raw.max_prefixes.unwrap_or(defaults.max_prefixes),
            limit: optional_limit(raw.packets_per_second, raw.burst, "")?,
        })
    }
}

/// `[xdp.verified]`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, default)]
pub struct VerifiedConfig {
    /// How long a request the proxy served vouches for its source.
    pub ttl: HumanDuration,
    /// Bound on verified sources (LRU); fixed when the maps are created.
    #[changes(restart = "the map is sized when created")]
    pub max: NonZeroU32,
    /// Most sources (`ipv6_prefix` keys) of one IPv6 /48 the proxy holds verified at
    /// once, so that one site cannot own the map; `None`: [`Self::DEFAULT_PER_48`],
    /// told apart so that `limiter check` can name the new cap to an older config.
    pub max_per_48: Option<NonZeroU32>,
    /// Most IPv4 sources of one /24 the proxy holds verified at once; `None`:
    /// [`Self::DEFAULT_PER_24`].
    pub max_per_24: Option<NonZeroU32>,
}

impl Default for VerifiedConfig {
    fn default() -> Self {
        Self {
            ttl: HumanDuration(Duration::from_secs(600)),
            max: NonZeroU32::new(65_536).unwrap_or(NonZeroU32::MIN),
            max_per_48: None,
            max_per_24: None,
        }
    }
}

impl VerifiedConfig {
    /// A home or office gets a /48 or a /56 and uses a few of its /64s.
    pub const DEFAULT_PER_48: NonZeroU32 = nonzero(16);
    /// IPv4 addresses are scarce, so an ISP's /24 holds many real clients.
    pub const DEFAULT_PER_24: NonZeroU32 = nonzero(64);

    #[must_use]
    pub fn max_per_48(&self) -> NonZeroU32 {
        self.max_per_48.unwrap_or(Self::DEFAULT_PER_48)
    }

    #[must_use]
    pub fn max_per_24(&self) -> NonZeroU32 {
        self.max_per_24.unwrap_or(Self::DEFAULT_PER_24)
    }
}

/// How to attach the program.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum AttachMode {
    /// Native, falling back to generic where the driver has no XDP support.
    #[default]
    Auto,
    Native,
    Generic,
}

/// Verdict for frames whose headers are cut short or inconsistent.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum MalformedAction {
    /// Pass (a frame whose source is known is still limited).
    #[default]
    Pass,
    Drop,
}

/// An IPv6 prefix length, 1 to 128.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "u8")]
pub struct Ipv6Prefix(pub u8);

impl TryFrom<u8> for Ipv6Prefix {
    type Error = String;

    fn try_from(bits: u8) -> Result<Self, String> {
        prefix_len(bits, 128).map(Self)
    }
}

/// `bits` if it is a prefix length from 1 to `max`.
fn prefix_len(bits: u8, max: u8) -> Result<u8, String> {
    if (1..=max).contains(&bits) { Ok(bits) } else { Err(format!("{bits} is not a prefix length from 1 to {max}")) }
}

/// An IPv4 prefix length, 1 to 32.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "u8")]
pub struct Ipv4Prefix(pub u8);

impl TryFrom<u8> for Ipv4Prefix {
    type Error = String;

    fn try_from(bits: u8) -> Result<Self, String> {
        prefix_len(bits, 32).map(Self)
    }
}

/// A packet rate and burst.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawPacketLimit")]
#[changes(display)]
pub struct PacketLimit {
    pub packets_per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPacketLimit {
    packets_per_second: NonZeroU32,
    burst: NonZeroU32,
}

impl TryFrom<RawPacketLimit> for PacketLimit {
    type Error = String;

    fn try_from(raw: RawPacketLimit) -> Result<Self, String> {
        PacketLimit::new(raw.packets_per_second, raw.burst)
    }
}

impl PacketLimit {
    /// The rate and burst times `factor` (0 to 1), each at least 1.
    #[must_use]
    pub fn scaled(self, factor: f64) -> Self {
        // At most the value scaled, so within u32.
        let scale =
            |value: NonZeroU32| NonZeroU32::new((f64::from(value.get()) * factor) as u32).unwrap_or(NonZeroU32::MIN);
        Self { packets_per_second: scale(self.packets_per_second), burst: scale(self.burst) }
    }

    /// Checked as `[xdp.limit]`'s: at most `MAX_PER_SECOND`.
    pub fn new(packets_per_second: NonZeroU32, burst: NonZeroU32) -> Result<Self, String> {
        if packets_per_second.get() > MAX_PER_SECOND {
            return Err(format!("packets_per_second = {packets_per_second} is above the maximum of {MAX_PER_SECOND}"));
        }
        Ok(Self { packets_per_second, burst })
    }

    /// The bucket as the kernel stores it.
    #[must_use]
    pub fn rate(&self) -> Rate {
        Rate::new(self.packets_per_second.get(), self.burst.get())
    }
}

/// A source's buckets, `[xdp.limit]`'s or a `limit` rule's: its packets, and
/// optionally its bytes.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, try_from = "RawSourceLimit")]
#[changes(display)]
pub struct SourceLimit {
    pub packets: PacketLimit,
    /// `None`: packets alone are limited, and the program does not read a frame's
    /// length.
    pub bytes: Option<ByteLimit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSourceLimit {
    packets_per_second: NonZeroU32,
    burst: NonZeroU32,
    bytes_per_second: Option<NonZeroU64>,
    byte_burst: Option<NonZeroU64>,
}

impl TryFrom<RawSourceLimit> for SourceLimit {
    type Error = String;

    fn try_from(raw: RawSourceLimit) -> Result<Self, String> {
        Ok(Self {
            packets: PacketLimit::new(raw.packets_per_second, raw.burst)?,
            bytes: ByteLimit::new(raw.bytes_per_second, raw.byte_burst)?,
        })
    }
}

impl SourceLimit {
    /// The byte bucket as the kernel stores it; [`ByteRate::NONE`] without one.
    #[must_use]
    pub fn byte_rate(&self) -> ByteRate {
        self.bytes.map_or(ByteRate::NONE, |bytes| bytes.rate())
    }
}

impl std::fmt::Display for SourceLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.packets)?;
        match &self.bytes {
            Some(bytes) => write!(f, ", {bytes}"),
            None => Ok(()),
        }
    }
}

/// A source's byte budget: a second bucket, charged each frame's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteLimit {
    pub bytes_per_second: NonZeroU64,
    pub byte_burst: NonZeroU64,
}

impl ByteLimit {
    /// The smallest `byte_burst`: one full frame of a 1 500-byte MTU with its
    /// Ethernet header. A smaller one would drop every full-size frame forever.
    pub const MIN_BURST: u64 = 1_514;

    /// `bytes_per_second` and `byte_burst` given together, or neither.
    fn new(bytes_per_second: Option<NonZeroU64>, byte_burst: Option<NonZeroU64>) -> Result<Option<Self>, String> {
        let (bytes_per_second, byte_burst) = match (bytes_per_second, byte_burst) {
            (Some(rate), Some(burst)) => (rate, burst),
            (None, None) => return Ok(None),
            _ => return Err("bytes_per_second and byte_burst go together".to_owned()),
        };
        if !(MIN_BYTES_PER_SECOND..=MAX_BYTES_PER_SECOND).contains(&bytes_per_second.get()) {
            return Err(format!(
                "bytes_per_second = {bytes_per_second} is outside {MIN_BYTES_PER_SECOND} to {MAX_BYTES_PER_SECOND} \
                 (100 Gbit/s), the range the kernel's byte buckets count exactly"
            ));
        }
        if byte_burst.get() < Self::MIN_BURST {
            return Err(format!(
                "byte_burst = {byte_burst} is below one full frame ({} bytes: a 1500-byte MTU and its Ethernet \
                 header), so such frames would never pass",
                Self::MIN_BURST
            ));
        }
        Ok(Some(Self { bytes_per_second, byte_burst }))
    }

    /// The byte bucket as the kernel stores it.
    #[must_use]
    pub fn rate(&self) -> ByteRate {
        ByteRate::new(self.bytes_per_second.get(), self.byte_burst.get())
    }
}

impl std::fmt::Display for ByteLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} B/s, byte burst {}", self.bytes_per_second, self.byte_burst)
    }
}

/// `packets_per_second` and `burst` (each prefixed by `prefix`) given together, or
/// neither.
fn optional_limit(
    packets_per_second: Option<NonZeroU32>,
    burst: Option<NonZeroU32>,
    prefix: &str,
) -> Result<Option<PacketLimit>, String> {
    match (packets_per_second, burst) {
        (Some(pps), Some(burst)) => PacketLimit::new(pps, burst).map(Some),
        (None, None) => Ok(None),
        _ => Err(format!("{prefix}packets_per_second and {prefix}burst go together")),
    }
}

impl std::fmt::Display for PacketLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pps, burst {}", self.packets_per_second, self.burst)
    }
}

/// One `[[xdp.port]]`: each source's bucket for one service.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawPortLimit")]
#[changes(display)]
pub struct PortLimit {
    pub protocol: PortProtocol,
    pub port: NonZeroU16,
    pub limit: SourceLimit,
}

/// The transport a `[[xdp.port]]` entry serves.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PortProtocol {
    Tcp,
    Udp,
}

impl PortProtocol {
    /// The IP protocol number, as the program reads it.
    #[must_use]
    pub const fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
        }
    }
}

impl std::fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPortLimit {
    protocol: PortProtocol,
    port: NonZeroU16,
    packets_per_second: NonZeroU32,
    burst: NonZeroU32,
    bytes_per_second: Option<NonZeroU64>,
    byte_burst: Option<NonZeroU64>,
}

impl TryFrom<RawPortLimit> for PortLimit {
    type Error = String;

    fn try_from(raw: RawPortLimit) -> Result<Self, String> {
        let limit = SourceLimit::try_from(RawSourceLimit {
            packets_per_second: raw.packets_per_second,
            burst: raw.burst,
            bytes_per_second: raw.bytes_per_second,
            byte_burst: raw.byte_burst,
        })
        .map_err(|e| format!("port {}/{}: {e}", raw.protocol, raw.port))?;
        Ok(Self { protocol: raw.protocol, port: raw.port, limit })
    }
}

impl Keyed for PortLimit {
    fn id(&self) -> String {
        format!("{}/{}", self.protocol, self.port)
    }
}

impl std::fmt::Display for PortLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}: {}", self.protocol, self.port, self.limit)
    }
}

/// One `[[xdp.cidr]]`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawCidrRule")]
pub struct CidrRule {
    pub cidr: IpNet,
    pub action: CidrAction,
    /// With `action = "limit"`: the bucket each prefix (`xdp.aggregate` lengths)
    /// under this rule shares, instead of `[xdp.aggregate]`'s.
    pub aggregate: Option<PacketLimit>,
}

impl Keyed for CidrRule {
    fn id(&self) -> String {
        self.cidr.to_string()
    }
}

/// What a CIDR rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Changes)]
pub enum CidrAction {
    Allow,
    Deny,
    /// Per-source buckets with their own rate (and byte budget).
    Limit(SourceLimit),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCidrRule {
    cidr: String,
    action: RawAction,
    packets_per_second: Option<NonZeroU32>,
    burst: Option<NonZeroU32>,
    bytes_per_second: Option<NonZeroU64>,
    byte_burst: Option<NonZeroU64>,
    aggregate_packets_per_second: Option<NonZeroU32>,
    aggregate_burst: Option<NonZeroU32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawAction {
    Allow,
    Deny,
    Limit,
}

impl TryFrom<RawCidrRule> for CidrRule {
    type Error = String;

    fn try_from(raw: RawCidrRule) -> Result<Self, String> {
        let cidr = parse_cidr(&raw.cidr)?;
        let bytes = ByteLimit::new(raw.bytes_per_second, raw.byte_burst).map_err(|e| format!("cidr {cidr}: {e}"))?;
        let action = match (raw.action, raw.packets_per_second, raw.burst) {
            (RawAction::Limit, Some(pps), Some(burst)) => {
                CidrAction::Limit(SourceLimit { packets: PacketLimit::new(pps, burst)?, bytes })
            }
            (RawAction::Limit, _, _) => {
                return Err(format!("cidr {cidr}: action = \"limit\" needs packets_per_second and burst"));
            }
            (RawAction::Allow, None, None) => CidrAction::Allow,
            (RawAction::Deny, None, None) => CidrAction::Deny,
            (RawAction::Allow | RawAction::Deny, _, _) => {
                return Err(format!("cidr {cidr}: packets_per_second and burst only go with action = \"limit\""));
            }
        };
        if bytes.is_some() && !matches!(action, CidrAction::Limit(_)) {
            return Err(format!("cidr {cidr}: bytes_per_second and byte_burst only go with action = \"limit\""));
        }
        let aggregate = optional_limit(raw.aggregate_packets_per_second, raw.aggregate_burst, "aggregate_")
            .map_err(|e| format!("cidr {cidr}: {e}"))?;
        if aggregate.is_some() && !matches!(action, CidrAction::Limit(_)) {
            return Err(format!("cidr {cidr}: an aggregate only goes with action = \"limit\""));
        }
        Ok(Self { cidr, action, aggregate })
    }
}

/// A CIDR with no host bits set (`10.0.0.1/8` is refused, not silently widened).
pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let cidr: IpNet = text
        .parse()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{text}` is not a CIDR like \"192.0.2.0/24\" or \"2001:db8::/32\""))?;
    if cidr.trunc() != cidr {
        return Err(format!("`{text}` has host bits set; did you mean \"{}\"?", cidr.trunc()));
    }
    Ok(cidr)
}

const fn nonzero(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => NonZeroU32::MIN,
    }
}

fn yes() -> bool {
    true
}

fn default_max_sources() -> NonZeroU32 {
    NonZeroU32::new(1_000_000).unwrap_or(NonZeroU32::MIN)
}

fn default_ipv6_prefix() -> Ipv6Prefix {
    Ipv6Prefix(64)
}

impl XdpConfig {
    /// What holds against spoofed sources, and what does not, for `limiter check`.
    #[must_use]
    pub fn spoofing_summary(&self, proxy: Option<&ProxyConfig>) -> Vec<String> {
        let aggregate = &self.aggregate;
        let rules_with_aggregate = self.cidr.iter().filter(|r| r.aggregate.is_some()).count();
        vec![
            match self.new_sources {
                Some(limit) => format!(
                    "xdp.new_sources: {limit}: a source without a bucket takes a token from this budget or is dropped \
                     before it reaches the sources map"
                ),
                None => "xdp.new_sources: off: every new source gets a full bucket, so a flood from random (spoofed) \
                         addresses passes whole and churns the sources map; set packets_per_second and burst to bound it"
                    .to_owned(),
            },
            match aggregate.limit {
                Some(limit) => format!(
                    "xdp.aggregate: {limit} per /{} (IPv4) and /{} (IPv6), up to {} prefixes tracked",
                    aggregate.ipv4_prefix.0, aggregate.ipv6_prefix.0, aggregate.max_prefixes
                ),
                None => format!(
                    "xdp.aggregate: off ({rules_with_aggregate} cidr rules set their own): a flood spread over one \
                     prefix is only held source by source"
                ),
            },
            match &self.syn {
                Some(syn) => {
                    let to = match self.syn_ports(proxy) {
                        SynPorts::Every => "any port".to_owned(),
                        SynPorts::Only(ports) => format!("port {}", port_list(&ports)),
                    };
                    format!(
                        "xdp.syn: {}, at most {} per source, for TCP SYNs from unverified sources to {to}",
                        syn.limit,
                        syn.per_source()
                    )
                }
                None => "xdp.syn: off: SYNs are limited only by their source's bucket".to_owned(),
            },
            if proxy.is_some() {
                format!(
                    "xdp.verified: clients the proxy served a response skip the budgets and aggregates for {} (up \
                     to {} sources, {} per IPv6 /48, {} per IPv4 /24)",
                    self.verified.ttl,
                    self.verified.max,
                    self.verified.max_per_48(),
                    self.verified.max_per_24()
                )
            } else {
                "xdp.verified: no [proxy], so only `limiter verify` marks sources verified".to_owned()
            },
            match &self.services {
                Some(services) => {
                    let ports = |ports: &[Port]| match ports {
                        [] => "no port".to_owned(),
                        ports => format!("port {}", ports.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
                    };
                    let verdict = |verdict: Verdict| match verdict {
                        Verdict::Pass => "passed",
                        Verdict::Drop => "dropped",
                    };
                    format!(
                        "xdp.services: TCP to {}, UDP to {} (and to the ephemeral ports from {} udp_replies_from \
                         networks), ICMP {}, other protocols {}: every other packet is dropped before the buckets",
                        ports(&services.tcp),
                        ports(&services.udp),
                        services.udp_replies_from.len(),
                        verdict(services.icmp),
                        verdict(services.other)
                    )
                }
                None => "xdp.services: off: a reflection flood to ports the host does not serve is charged to its \
                         sources' buckets; list the served ports to drop it at the NIC"
                    .to_owned(),
            },
        ]
    }

    /// The source buckets of the default, each limit rule and each service.
    fn source_limits(&self) -> impl Iterator<Item = SourceLimit> + '_ {
        let rules = self.cidr.iter().filter_map(|rule| match rule.action {
            CidrAction::Limit(limit) => Some(limit),
            CidrAction::Allow | CidrAction::Deny => None,
        });
        std::iter::once(self.limit).chain(rules).chain(self.port.iter().map(|port| port.limit))
    }

    /// Every byte budget the program may charge under this config.
    pub fn byte_rates_in_force(&self) -> impl Iterator<Item = ByteRate> + '_ {
        self.source_limits().filter_map(|limit| limit.bytes).map(|bytes| bytes.rate())
    }

    /// Every bucket rate the program may charge under this config: the default, each
    /// limit rule's and aggregate, and the budgets and aggregate that are on (byte
    /// budgets apart: [`Self::byte_rates_in_force`]).
    pub fn rates_in_force(&self) -> impl Iterator<Item = Rate> + '_ {
        let sources = self.source_limits().map(|limit| Some(limit.packets));
        let rule_aggregates = self.cidr.iter().map(|rule| rule.aggregate);
        let syn = self.syn.as_ref().map(|syn| [syn.limit, syn.per_source()]);
        [self.new_sources, self.aggregate.limit]
            .into_iter()
            .chain(syn.into_iter().flatten().map(Some))
            .chain(sources)
            .chain(rule_aggregates)
            .flatten()
            .map(|limit| limit.rate())
    }

    /// The ports whose SYNs take from the SYN budget: `[xdp.syn] ports`, else the
    /// proxy's listen port (the host's service the budget protects), else every port.
    #[must_use]
    pub fn syn_ports(&self, proxy: Option<&ProxyConfig>) -> SynPorts {
        let configured = self.syn.as_ref().and_then(|syn| syn.ports.clone());
        let served = || proxy.and_then(|proxy| NonZeroU16::new(proxy.listen.port())).map(|port| vec![port]);
        configured.or_else(served).map_or(SynPorts::Every, SynPorts::Only)
    }

    /// What `limiter check` says of a config written for the SYN budget as it was
    /// before `ports` and `per_source_*` existed, when every SYN to any port counted
    /// and one source could take all of it.
    #[must_use]
    pub fn syn_warnings(&self, proxy: Option<&ProxyConfig>) -> Vec<String> {
        let Some(syn) = &self.syn else { return Vec::new() };
        let mut warnings = Vec::new();
        if syn.ports.is_none()
            && let SynPorts::Only(ports) = self.syn_ports(proxy)
        {
            warnings.push(format!(
                "xdp.syn.ports is not set: only SYNs to the proxy's port {} take from the SYN budget now (SYNs to \
                 every port did): SYNs to other ports are charged to their source's bucket alone; list the ports \
                 the budget should cover (ports = [...]) to keep them in it",
                ports[0]
            ));
        }
        if syn.per_source.is_none() {
            warnings.push(format!(
                "xdp.syn.per_source_packets_per_second is not set: one unverified source now takes at most {} of \
                 the SYN budget (a tenth, by default; it could take all of it); set per_source_packets_per_second \
                 and per_source_burst to give it another share",
                syn.per_source()
            ));
        }
        warnings
    }

    /// What `limiter check` says of a service policy that leaves out the proxy's own
    /// port: its clients' handshakes through the attached interfaces would be dropped.
    /// A proxy on a loopback address is not reached through them.
    #[must_use]
    pub fn services_warning(&self, proxy: Option<&ProxyConfig>) -> Option<String> {
        let (services, listen) = (self.services.as_ref()?, proxy?.listen);
        let served = services.tcp.iter().any(|port| port.0.get() == listen.port());
        (!served && !listen.ip().is_loopback()).then(|| {
            format!(
                "xdp.services.tcp does not list the proxy's port {}: its clients' connections through {} are \
                 dropped (dropped_service) unless an allow rule covers them; add the port to tcp",
                listen.port(),
                self.interfaces.join(", ")
            )
        })
    }

    /// What `limiter check` says, with a proxy, of a config written when the proxy
    /// verified every peer at its TCP handshake, without a cap per prefix.
    #[must_use]
    pub fn verified_warning(&self, proxy: Option<&ProxyConfig>) -> Option<String> {
        let verified = &self.verified;
        (proxy.is_some() && (verified.max_per_48.is_none() || verified.max_per_24.is_none())).then(|| {
            format!(
                "xdp.verified: the proxy now verifies a client once it has served it a response (it did at the TCP \
                 handshake), so a client that only connects (a TCP health check) no longer skips the budgets, and \
                 holds at most max_per_48 = {} per IPv6 /48 and max_per_24 = {} per IPv4 /24 verified; set both \
                 to keep or change these caps",
                verified.max_per_48(),
                verified.max_per_24()
            )
        })
    }

    /// The aggregate buckets are keyed by prefix alone, so every source of one prefix
    /// must charge it at one rate: a rule that sets its own aggregate covers whole
    /// prefixes, and no narrower `limit` rule inside it splits one.
    fn check_aggregate_prefixes(&self, rule: &CidrRule) -> Result<(), String> {
        let length = match rule.cidr {
            IpNet::V4(_) => self.aggregate.ipv4_prefix.0,
            IpNet::V6(_) => self.aggregate.ipv6_prefix.0,
        };
        if rule.cidr.prefix_len() <= length {
            return Ok(());
        }
        if rule.aggregate.is_some() {
            return Err(format!(
                "{} sets its own aggregate but is narrower than the /{length} prefixes aggregates are kept for: \
                 the rest of its /{length} would share the bucket at another rate; widen it to /{length} or \
                 shorten xdp.aggregate's prefix",
                rule.cidr
            ));
        }
        let splits = |outer: &&CidrRule| outer.aggregate.is_some() && outer.cidr.contains(&rule.cidr);
        if matches!(rule.action, CidrAction::Limit(_))
            && let Some(outer) = self.cidr.iter().find(splits)
        {
            return Err(format!(
                "{} is a limit rule narrower than /{length} inside {}, which sets its own aggregate: its sources \
                 would charge their /{length} at another rate than their neighbours; widen it to /{length} or \
                 shorten xdp.aggregate's prefix",
                rule.cidr, outer.cidr
            ));
        }
        Ok(())
    }

    /// Checks across rules that serde cannot see one record at a time.
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        for sizing in Sizing::ALL {
            let asked = match sizing {
                Sizing::MaxSources => self.max_sources,
                Sizing::MaxPrefixes => self.aggregate.max_prefixes,
                Sizing::MaxVerified => self.verified.max,
            };
            if asked.get() > sizing.max_entries() {
                return Err((
                    format!("xdp.{}", sizing.key()),
                    format!(
                        "{asked} is above the most of {}: the kernel allocates the whole map when it is created, \
                         about {} bytes an entry, and this bound keeps it within {} MiB",
                        sizing.max_entries(),
                        sizing.entry_bytes(),
                        sizing.budget_bytes() >> 20
                    ),
                ));
            }
        }
        if self.verified.ttl.0.is_zero() {
            return Err((
                "xdp.verified.ttl".to_owned(),
                "must be longer than 0, or no source stays verified".to_owned(),
            ));
        }
        for (i, rule) in self.cidr.iter().enumerate() {
            if self.cidr[..i].iter().any(|r| r.cidr == rule.cidr) {
                return Err((format!("xdp.cidr[{i}].cidr"), format!("{} appears twice", rule.cidr)));
            }
            self.check_aggregate_prefixes(rule).map_err(|message| (format!("xdp.cidr[{i}].cidr"), message))?;
        }
        if let Some(services) = &self.services {
            services.validate()?;
        }
        if self.port.len() > MAX_PORT_LIMITS {
            return Err((
                format!("xdp.port[{MAX_PORT_LIMITS}]"),
                format!("at most {MAX_PORT_LIMITS} [[xdp.port]] entries: the program scans them for every packet"),
            ));
        }
        for (i, entry) in self.port.iter().enumerate() {
            if self.port[..i].iter().any(|other| (other.protocol, other.port) == (entry.protocol, entry.port)) {
                return Err((
                    format!("xdp.port[{i}].port"),
                    format!("{}/{} appears twice", entry.protocol, entry.port),
                ));
            }
        }
        for (i, interface) in self.interfaces.iter().enumerate() {
            let problem = if interface.is_empty() || interface.len() > 15 {
                "must be 1 to 15 bytes"
            } else if self.interfaces[..i].contains(interface) {
                "is listed twice"
            } else {
                continue;
            };
            return Err(("xdp.interfaces".to_owned(), format!("interface `{interface}` {problem}")));
        }
        Ok(())
    }
}
