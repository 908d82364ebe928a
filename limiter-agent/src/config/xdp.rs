//! `[xdp]`: the kernel layer's interfaces, default bucket and CIDR rules.

use std::num::NonZeroU32;

use ipnet::IpNet;
use limiter_common::bucket::{MAX_PER_SECOND, Rate};
use serde::Deserialize;

/// `[xdp]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct XdpConfig {
    /// Interfaces to attach to.
    pub interfaces: Vec<String>,
    #[serde(default)]
    pub mode: AttachMode,
    /// `false`: dry run, count would-drops and drop nothing.
    #[serde(default = "yes")]
    pub enforce: bool,
    /// Bound on tracked sources (LRU); fixed when the maps are created.
    #[serde(default = "default_max_sources")]
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
    pub cidr: Vec<CidrRule>,
}

/// How to attach the program.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AttachMode {
    /// Native, falling back to generic where the driver has no XDP support.
    #[default]
    Auto,
    Native,
    Generic,
}

/// Verdict for frames whose headers are cut short or inconsistent.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MalformedAction {
    /// Pass (a frame whose source is known is still limited).
    #[default]
    Pass,
    Drop,
}

/// An IPv6 prefix length, 1 to 128.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "u8")]
pub struct Ipv6Prefix(pub u8);

impl TryFrom<u8> for Ipv6Prefix {
    type Error = String;

    fn try_from(bits: u8) -> Result<Self, String> {
        if (1..=128).contains(&bits) {
            Ok(Self(bits))
        } else {
            Err(format!("{bits} is not a prefix length from 1 to 128"))
        }
    }
}

/// A packet rate and burst.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, try_from = "RawPacketLimit")]
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

/// One `[[xdp.cidr]]`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "RawCidrRule")]
pub struct CidrRule {
    pub cidr: IpNet,
    pub action: CidrAction,
}

/// What a CIDR rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        Ok(Self { cidr, action })
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
    /// Checks across rules that serde cannot see one record at a time.
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        for (i, rule) in self.cidr.iter().enumerate() {
            if self.cidr[..i].iter().any(|r| r.cidr == rule.cidr) {
                return Err((format!("xdp.cidr[{i}].cidr"), format!("{} appears twice", rule.cidr)));
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
