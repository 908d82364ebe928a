//! `[xdp]`: the kernel layer's interfaces, default bucket and CIDR rules, and what
//! holds against spoofed sources (`new_sources`, `aggregate`, `verified`, `syn`).

use std::{num::NonZeroU32, time::Duration};

use ipnet::IpNet;
use limiter_common::bucket::{MAX_PER_SECOND, Rate};
use serde::Deserialize;

use super::units::HumanDuration;
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
    /// The bucket of every source no CIDR rule covers.
    pub limit: PacketLimit,
    /// CIDR rules; the longest matching prefix wins.
    #[serde(default)]
    #[changes(keyed)]
    pub cidr: Vec<CidrRule>,
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
    pub syn: Option<PacketLimit>,
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
    /// How long a completed handshake vouches for its source.
    pub ttl: HumanDuration,
    /// Bound on verified sources (LRU); fixed when the maps are created.
    #[changes(restart = "the map is sized when created")]
    pub max: NonZeroU32,
}

impl Default for VerifiedConfig {
    fn default() -> Self {
        Self { ttl: HumanDuration(Duration::from_secs(600)), max: NonZeroU32::new(65_536).unwrap_or(NonZeroU32::MIN) }
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
    fn new(packets_per_second: NonZeroU32, burst: NonZeroU32) -> Result<Self, String> {
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
    /// Per-source buckets with their own rate.
    Limit(PacketLimit),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCidrRule {
    cidr: String,
    action: RawAction,
    packets_per_second: Option<NonZeroU32>,
    burst: Option<NonZeroU32>,
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
        let action = match (raw.action, raw.packets_per_second, raw.burst) {
            (RawAction::Limit, Some(pps), Some(burst)) => CidrAction::Limit(PacketLimit::new(pps, burst)?),
            (RawAction::Limit, _, _) => {
                return Err(format!("cidr {cidr}: action = \"limit\" needs packets_per_second and burst"));
            }
            (RawAction::Allow, None, None) => CidrAction::Allow,
            (RawAction::Deny, None, None) => CidrAction::Deny,
            (RawAction::Allow | RawAction::Deny, _, _) => {
                return Err(format!("cidr {cidr}: packets_per_second and burst only go with action = \"limit\""));
            }
        };
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
    pub fn spoofing_summary(&self, proxy: bool) -> Vec<String> {
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
            match self.syn {
                Some(limit) => format!("xdp.syn: {limit} for TCP SYNs from unverified sources"),
                None => "xdp.syn: off: SYNs are limited only by their source's bucket".to_owned(),
            },
            if proxy {
                format!(
                    "xdp.verified: clients that complete a TCP handshake with the proxy skip the budgets and \
                     aggregates for {} (up to {} sources)",
                    self.verified.ttl, self.verified.max
                )
            } else {
                "xdp.verified: no [proxy], so only `limiter verify` marks sources verified".to_owned()
            },
        ]
    }

    /// Every bucket rate the program may charge under this config: the default, each
    /// limit rule's and aggregate, and the budgets and aggregate that are on.
    pub fn rates_in_force(&self) -> impl Iterator<Item = Rate> + '_ {
        let rules = self.cidr.iter().flat_map(|rule| {
            let limit = match rule.action {
                CidrAction::Limit(limit) => Some(limit),
                CidrAction::Allow | CidrAction::Deny => None,
            };
            [limit, rule.aggregate]
        });
        [Some(self.limit), self.new_sources, self.aggregate.limit, self.syn]
            .into_iter()
            .chain(rules)
            .flatten()
            .map(|limit| limit.rate())
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
