//! Verified sources (`names::VERIFIED`): addresses that completed a TCP handshake
//! with the proxy (which a spoofed source cannot), or that an operator vouched for
//! with `limiter verify`. The program lets them skip the new-source budget, the
//! prefix aggregates and the SYN budget, never their own bucket.

use std::{
    net::{IpAddr, Ipv6Addr},
    path::Path,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{HashMap, Map, MapData, MapError};
use ipnet::{IpNet, Ipv4Net};
use limiter_common::{
    addr::{mask_v6, v4_mapped},
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
        let entry = Verified { expires_at_ns: monotonic_now_ns().saturating_add(ttl_ns).max(1) };
        self.map.insert(key, entry, 0).map_err(map_error(names::VERIFIED))
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

/// The proxy's handle on [`names::VERIFIED`]: each accepted connection's peer is
/// written with the configured TTL.
#[derive(Debug)]
pub struct Verifier {
    map: Mutex<VerifiedMap>,
    ipv6_prefix: AtomicU8,
    ttl_ns: AtomicU64,
}

impl std::fmt::Debug for VerifiedMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedMap").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Verifier {
    /// Opens the map pinned under `pin_dir`.
    pub fn open(pin_dir: &Path, config: &XdpConfig) -> Result<Self, XdpError> {
        let path = pin_dir.join(names::VERIFIED);
        let map = MapData::from_pin(&path).and_then(Map::from_map_data).map_err(map_error(names::VERIFIED))?;
        let verifier =
            Self { map: Mutex::new(VerifiedMap::new(map)?), ipv6_prefix: AtomicU8::new(0), ttl_ns: AtomicU64::new(0) };
        verifier.reconfigure(config);
        Ok(verifier)
    }

    /// Takes a reloaded config's TTL and IPv6 prefix.
    pub fn reconfigure(&self, config: &XdpConfig) {
        self.ipv6_prefix.store(config.ipv6_prefix.0, Ordering::Relaxed);
        self.ttl_ns.store(u64::try_from(config.verified.ttl.0.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Marks `peer` verified.
    pub fn verify(&self, peer: IpAddr) -> Result<(), XdpError> {
        let key = source_key(peer, self.ipv6_prefix.load(Ordering::Relaxed));
        let ttl = Duration::from_nanos(self.ttl_ns.load(Ordering::Relaxed));
        self.map.lock().unwrap_or_else(PoisonError::into_inner).insert(&key, ttl)
    }
}

impl crate::accept::AcceptHook for Verifier {
    fn accepted(&self, peer: IpAddr) {
        if let Err(error) = self.verify(peer) {
            tracing::debug!(%peer, %error, "cannot mark the peer verified");
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
