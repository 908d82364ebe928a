//! Verified sources (`names::VERIFIED`): addresses the proxy served a request over a
//! completed TCP handshake (which a spoofed source cannot complete), or that an
//! operator vouched for with `limiter verify`. The program lets them skip the
//! new-source budget, the prefix aggregates and the SYN budget, never their own bucket.

use std::{
    collections,
    net::{IpAddr, Ipv6Addr},
    path::Path,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use aya::maps::{HashMap, Map, MapData, MapError};
use ipnet::{IpNet, Ipv4Net};
use limiter_common::{
    addr::{V4_MAPPED_BITS, as_v4, mask_v6, v4_mapped},
    maps::{self as names, SourceKey, Verified},
};

use super::{
    XdpError,
    map_access::{capacity, map_error, monotonic_now_ns},
};
use crate::config::xdp::XdpConfig;

/// Most sources one `limiter verify` writes: a wider CIDR is what an `allow` rule is for.
const MAX_VERIFY_SOURCES: u64 = 65_536;

/// The key the program looks `ip` up under: IPv4 (and IPv4-mapped) as is, IPv6
/// masked to `ipv6_prefix` like its bucket.
#[must_use]
pub fn source_key(ip: IpAddr, ipv6_prefix: u8) -> SourceKey {
    let addr = match ip.to_canonical() {
        IpAddr::V4(v4) => v4_mapped(v4.octets()),
        IpAddr::V6(v6) => mask_v6(v6.octets(), ipv6_prefix),
    };
    SourceKey { addr }
}

/// The typed map.
pub(super) struct VerifiedMap {
    map: HashMap<MapData, SourceKey, Verified>,
    capacity: u32,
}

impl VerifiedMap {
    pub(super) fn new(map: Map) -> Result<Self, XdpError> {
        let capacity = capacity(&map, names::VERIFIED)?;
        Ok(Self { map: map.try_into().map_err(map_error(names::VERIFIED))?, capacity })
    }

    fn insert(&mut self, key: &SourceKey, ttl: Duration) -> Result<(), XdpError> {
        let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        self.insert_until(key, monotonic_now_ns().saturating_add(ttl_ns).max(1))
    }

    fn insert_until(&mut self, key: &SourceKey, expires_at_ns: u64) -> Result<(), XdpError> {
        self.map.insert(key, Verified { expires_at_ns }, 0).map_err(map_error(names::VERIFIED))
    }

    /// Verifies every source key in `cidr` for `ttl`; how many.
    pub(super) fn verify(&mut self, cidr: IpNet, ipv6_prefix: u8, ttl: Duration) -> Result<usize, XdpError> {
        let keys = keys_in(cidr, ipv6_prefix, MAX_VERIFY_SOURCES.min(u64::from(self.capacity)))?;
        for key in &keys {
            self.insert(key, ttl)?;
        }
        Ok(keys.len())
    }

    /// Removes every verified source in `cidr`; how many there were.
    pub(super) fn unverify(&mut self, cidr: IpNet) -> Result<usize, XdpError> {
        let inside: Vec<SourceKey> =
            self.map.keys().filter_map(Result::ok).filter(|key| cidr.contains(&address(key))).collect();
        let mut removed = 0;
        for key in &inside {
            match self.map.remove(key) {
                Ok(()) => removed += 1,
                // Evicted or expired meanwhile.
                Err(MapError::KeyNotFound) => {}
                Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => return Err(XdpError::Map { name: names::VERIFIED, source }),
            }
        }
        Ok(removed)
    }

    /// Sources whose proof has not lapsed.
    pub(super) fn count(&self) -> Result<usize, XdpError> {
        let now = monotonic_now_ns();
        let mut active = 0;
        for entry in self.map.iter() {
            let (_, verified) = entry.map_err(map_error(names::VERIFIED))?;
            active += usize::from(verified.active(now));
        }
        Ok(active)
    }

    pub(super) fn contains(&self, key: &SourceKey) -> bool {
        self.map.get(key, 0).is_ok_and(|verified| verified.active(monotonic_now_ns()))
    }

    pub(super) fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// The address a key stands for (an IPv6 key is its prefix's first address).
fn address(key: &SourceKey) -> IpAddr {
    IpAddr::from(Ipv6Addr::from(key.addr)).to_canonical()
}

/// Every source key inside `cidr`, refused past `max`.
fn keys_in(cidr: IpNet, ipv6_prefix: u8, max: u64) -> Result<Vec<SourceKey>, XdpError> {
    let cidr = match cidr {
        // An IPv4-mapped CIDR is the IPv4 one: that is how the program keys it.
        IpNet::V6(net) if net.prefix_len() >= 96 => match net.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(Ipv4Net::new(v4, net.prefix_len() - 96).unwrap_or_default()),
            None => cidr,
        },
        other => other,
    };
    // Keys as the program has them (IPv4 as `::ffff:a.b.c.d`): `first`, then one
    // every `1 << step_bits`.
    let (first, host_bits, step_bits) = match cidr {
        IpNet::V4(net) => (u128::from(net.network().to_ipv6_mapped()), 32 - u32::from(net.prefix_len()), 0),
        IpNet::V6(net) => {
            let keyed = ipv6_prefix.clamp(1, 128);
            let first = u128::from_be_bytes(mask_v6(net.network().octets(), keyed));
            (first, u32::from(keyed.saturating_sub(net.prefix_len())), 128 - u32::from(keyed))
        }
    };
    let count = 1u64.checked_shl(host_bits).unwrap_or(u64::MAX);
    if count > max {
        return Err(XdpError::TooManySources { cidr, sources: count, max });
    }
    Ok((0..u128::from(count)).map(|i| SourceKey { addr: (first | (i << step_bits)).to_be_bytes() }).collect())
}

/// The proxy's handle on [`names::VERIFIED`]: the peer of each request served is
/// written with the configured TTL, at most `max_per_48` (`max_per_24`) at once per
/// IPv6 /48 (IPv4 /24), so that one site's many addresses cannot push everyone
/// else's out of the LRU map. The entries present when it opens count too, so a
/// restart does not hand a prefix a second quota; `limiter verify` is never capped.
#[derive(Debug)]
pub struct Verifier {
    state: Mutex<Tracker>,
}

/// The map, and what this agent holds verified in it, by prefix.
struct Tracker {
    map: VerifiedMap,
    ipv6_prefix: u8,
    ttl_ns: u64,
    per_48: usize,
    per_24: usize,
    /// Each prefix's verified keys and their expiry (`CLOCK_MONOTONIC` ns, as the
    /// map's), at most the prefix's cap: looked up on every request served, so that
    /// a source whose entry has more than half its TTL left costs no write to the
    /// map (no syscall).
    prefixes: collections::HashMap<SourceKey, Vec<(SourceKey, u64)>>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker").field("prefixes", &self.prefixes.len()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for VerifiedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedMap").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

/// The /48 (an IPv4 key's /24) `key` is capped under.
fn prefix_of(key: &SourceKey) -> SourceKey {
    let bits = if as_v4(&key.addr).is_some() { V4_MAPPED_BITS + 24 } else { 48 };
    SourceKey { addr: mask_v6(key.addr, bits) }
}

impl Verifier {
    /// Opens the map pinned under `pin_dir`.
    pub fn open(pin_dir: &Path, config: &XdpConfig) -> Result<Self, XdpError> {
        let path = pin_dir.join(names::VERIFIED);
        let map = MapData::from_pin(&path).and_then(Map::from_map_data).map_err(map_error(names::VERIFIED))?;
        let map = VerifiedMap::new(map)?;
        let now = monotonic_now_ns();
        let mut prefixes: collections::HashMap<SourceKey, Vec<(SourceKey, u64)>> = collections::HashMap::new();
        for entry in map.map.iter() {
            let (key, verified) = entry.map_err(map_error(names::VERIFIED))?;
            if verified.active(now) {
                prefixes.entry(prefix_of(&key)).or_default().push((key, verified.expires_at_ns));
            }
        }
        let tracker = Tracker { map, ipv6_prefix: 0, ttl_ns: 0, per_48: 0, per_24: 0, prefixes };
        let verifier = Self { state: Mutex::new(tracker) };
        verifier.reconfigure(config);
        Ok(verifier)
    }

    /// Takes a reloaded config's TTL, IPv6 prefix and caps.
    pub fn reconfigure(&self, config: &XdpConfig) {
        let mut tracker = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        tracker.ipv6_prefix = config.ipv6_prefix.0;
        tracker.ttl_ns = u64::try_from(config.verified.ttl.0.as_nanos()).unwrap_or(u64::MAX);
        tracker.per_48 = usize::try_from(config.verified.max_per_48().get()).unwrap_or(usize::MAX);
        tracker.per_24 = usize::try_from(config.verified.max_per_24().get()).unwrap_or(usize::MAX);
    }

    /// Marks `peer` verified, unless its prefix holds its cap already; whether it is.
    pub fn verify(&self, peer: IpAddr) -> Result<bool, XdpError> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).verify(peer, monotonic_now_ns())
    }
}

impl Tracker {
    fn verify(&mut self, peer: IpAddr, now: u64) -> Result<bool, XdpError> {
        let key = source_key(peer, self.ipv6_prefix);
        let prefix = prefix_of(&key);
        let cap = if as_v4(&key.addr).is_some() { self.per_24 } else { self.per_48 };
        let (ttl_ns, expires) = (self.ttl_ns, now.saturating_add(self.ttl_ns).max(1));
        if !self.prefixes.contains_key(&prefix) {
            self.bound_prefixes(now);
        }
        let keys = self.prefixes.entry(prefix).or_default();
        keys.retain(|(_, expiry)| *expiry > now);
        let place = match keys.iter().position(|(known, _)| *known == key) {
            Some(place) if keys[place].1 - now > ttl_ns / 2 => return Ok(true),
            Some(place) => place,
            None if keys.len() >= cap => return Ok(false),
            None => {
                keys.push((key, 0));
                keys.len() - 1
            }
        };
        keys[place].1 = expires;
        self.map.insert_until(&key, expires).map(|()| true)
    }

    /// Forgets the prefixes left without a live entry once there are twice as many
    /// as the map holds; if even the live ones are that many, everything: the caps
    /// then start again from nothing, which takes more prefixes than the map holds
    /// to bring about, where a cap per prefix no longer decides who is verified.
    fn bound_prefixes(&mut self, now: u64) {
        let bound = 2 * self.map.capacity as usize;
        if self.prefixes.len() < bound {
            return;
        }
        self.prefixes.retain(|_, keys| {
            keys.retain(|(_, expiry)| *expiry > now);
            !keys.is_empty()
        });
        if self.prefixes.len() > bound / 2 {
            self.prefixes.clear();
        }
    }
}

impl crate::proxy::ServedHook for Verifier {
    fn served(&self, peer: IpAddr) {
        match self.verify(peer) {
            Ok(true) => {}
            Ok(false) => tracing::debug!(%peer, "not verified: its prefix holds its cap of verified sources"),
            Err(error) => tracing::debug!(%peer, %error, "cannot mark the peer verified"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{keys_in, source_key};

    #[test]
    fn cidrs_expand_to_the_keys_the_program_uses() {
        let keys = keys_in("192.0.2.0/30".parse().expect("cidr"), 64, 100).expect("keys");
        let expected: Vec<_> = (0..4).map(|i| source_key(format!("192.0.2.{i}").parse().expect("ip"), 64)).collect();
        assert_eq!(keys, expected);
        let keys = keys_in("2001:db8::/62".parse().expect("cidr"), 64, 100).expect("keys");
        assert_eq!(keys.len(), 4);
        assert_eq!(keys[3], source_key("2001:db8:0:3::9".parse().expect("ip"), 64));
        let one = keys_in("2001:db8::1/128".parse().expect("cidr"), 64, 100).expect("keys");
        assert_eq!(one, [source_key("2001:db8::".parse().expect("ip"), 64)]);
        let mapped = keys_in("::ffff:192.0.2.9/128".parse().expect("cidr"), 64, 100).expect("keys");
        assert_eq!(mapped, [source_key("192.0.2.9".parse().expect("ip"), 64)]);
        let error = keys_in("10.0.0.0/8".parse().expect("cidr"), 64, 65_536).expect_err("too wide");
        assert!(error.to_string().contains("16777216"), "{error}");
    }
}
