//! An IPv4 and an IPv6 LPM trie holding the same kind of value, addressed by CIDR:
//! the CIDR rules and the runtime blocks are each such a pair, the demotions one
//! trie that holds IPv4 in its mapped form (the last two of entries that lapse,
//! [`LapsingTries`]).

use std::net::IpAddr;

use aya::{
    Pod,
    maps::{Array, LpmTrie, Map, MapData, MapError, lpm_trie::Key},
};
use ipnet::IpNet;
use limiter_common::{
    addr::v4_mapped,
    maps::{Demotion, Expiry},
};

use super::{XdpError, map_access::monotonic_now_ns, maps::set_occupied};

/// The shortest time between two walks of a full trie for room.
const PRUNE_INTERVAL_NS: u64 = 1_000_000_000;

/// Both tries of one kind, with their map names (for errors) and their slots in the
/// occupancy flags.
pub(super) struct CidrTries<V: Pod> {
    /// `None`: IPv4 CIDRs are kept in `v6`, mapped (`::ffff:a.b.c.d`, 96 bits more).
    v4: Option<LpmTrie<MapData, [u8; 4], V>>,
    v6: LpmTrie<MapData, [u8; 16], V>,
    names: [&'static str; 2],
    slots: [u32; 2],
}

impl<V: Pod> CidrTries<V> {
    /// Checks both maps' key and value sizes; `names` and `slots` are (v4, v6).
    pub(super) fn new(maps: [Map; 2], names: [&'static str; 2], slots: [u32; 2]) -> Result<Self, XdpError> {
        let [v4, v6] = maps;
        let error = |name| move |source| XdpError::Map { name, source };
        Ok(Self {
            v4: Some(v4.try_into().map_err(error(names[0]))?),
            v6: v6.try_into().map_err(error(names[1]))?,
            names,
            slots,
        })
    }

    /// One trie of 16-byte keys for both families, IPv4 mapped, under one name and
    /// one occupancy slot.
    pub(super) fn mapped(map: Map, name: &'static str, slot: u32) -> Result<Self, XdpError> {
        let v6 = map.try_into().map_err(|source| XdpError::Map { name, source })?;
        Ok(Self { v4: None, v6, names: [name; 2], slots: [slot; 2] })
    }

    /// The occupancy slot of `cidr`'s family.
    pub(super) fn slot(&self, cidr: IpNet) -> u32 {
        self.slots[family(cidr)]
    }

    /// The occupancy slots, (v4, v6).
    pub(super) fn slots(&self) -> [u32; 2] {
        self.slots
    }

    /// Whether the trie of `slot` holds nothing.
    pub(super) fn is_empty(&self, slot: u32) -> bool {
        match &self.v4 {
            Some(v4) if slot == self.slots[0] => v4.keys().next().is_none(),
            _ => self.v6.keys().next().is_none(),
        }
    }

    /// Adds or replaces the entry of exactly `cidr`. In a mapped trie an IPv6 `cidr`
    /// reaching into `::ffff:0:0/96` is refused: it would cover IPv4 sources too
    /// (`::/0` every one of them), which the same CIDR in a pair of tries does not.
    pub(super) fn insert(&mut self, cidr: IpNet, value: V) -> Result<(), XdpError> {
        if self.v4.is_none() && reaches_mapped(cidr) {
            return Err(XdpError::MappedRange(cidr));
        }
        match (self.v4.as_mut(), cidr) {
            (Some(v4), IpNet::V4(net)) => {
                v4.insert(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), value, 0)
            }
            _ => self.v6.insert(&key16(cidr), value, 0),
        }
        .map_err(|source| self.error(cidr, source))
    }

    /// The entry of exactly `cidr`, if any.
    pub(super) fn get(&self, cidr: IpNet) -> Option<V> {
        match (self.v4.as_ref(), cidr) {
            (Some(v4), IpNet::V4(net)) => v4.get(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), 0),
            _ => self.v6.get(&key16(cidr), 0),
        }
        .ok()
    }

    /// Removes the entry of exactly `cidr`; `false` if there was none.
    pub(super) fn remove(&mut self, cidr: IpNet) -> Result<bool, XdpError> {
        let removed = match (self.v4.as_mut(), cidr) {
            (Some(v4), IpNet::V4(net)) => v4.remove(&Key::new(u32::from(net.prefix_len()), net.addr().octets())),
            _ => self.v6.remove(&key16(cidr)),
        };
        match removed {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(source) => Err(self.error(cidr, source)),
        }
    }

    /// Every entry, IPv4 first.
    pub(super) fn entries(&self) -> Result<Vec<(IpNet, V)>, XdpError> {
        let mut entries = Vec::new();
        for entry in self.v4.iter().flat_map(LpmTrie::iter) {
            let (key, value) = entry.map_err(|source| XdpError::Map { name: self.names[0], source })?;
            entries.push((net(IpAddr::from(key.data()), key.prefix_len()), value));
        }
        for entry in self.v6.iter() {
            let (key, value) = entry.map_err(|source| XdpError::Map { name: self.names[1], source })?;
            let addr = std::net::Ipv6Addr::from(key.data());
            let cidr = match addr.to_ipv4_mapped() {
                Some(v4) if self.v4.is_none() && key.prefix_len() >= V4_MAPPED_BITS => {
                    net(IpAddr::V4(v4), key.prefix_len() - V4_MAPPED_BITS)
                }
                _ => net(IpAddr::V6(addr), key.prefix_len()),
            };
            entries.push((cidr, value));
        }
        Ok(entries)
    }

    fn error(&self, cidr: IpNet, source: MapError) -> XdpError {
        XdpError::Map { name: self.names[family(cidr)], source }
    }
}

/// The 16-byte key of `cidr`, IPv4 mapped.
fn key16(cidr: IpNet) -> Key<[u8; 16]> {
    let (addr, prefix_len) = mapped_cidr(cidr);
    Key::new(u32::from(prefix_len), addr)
}

/// `cidr` in the 16-byte form of the program's keys (`limiter_common::addr`): IPv4
/// mapped (`::ffff:a.b.c.d`), its prefix 96 bits longer.
pub(super) fn mapped_cidr(cidr: IpNet) -> ([u8; 16], u8) {
    match cidr {
        IpNet::V4(net) => (v4_mapped(net.addr().octets()), limiter_common::addr::V4_MAPPED_BITS + net.prefix_len()),
        IpNet::V6(net) => (net.addr().octets(), net.prefix_len()),
    }
}

/// Whether an IPv6 `cidr` and `::ffff:0:0/96` share an address.
fn reaches_mapped(cidr: IpNet) -> bool {
    let IpNet::V6(net) = cidr else { return false };
    let mapped = ipnet::Ipv6Net::new(std::net::Ipv6Addr::from(v4_mapped([0; 4])), 96).unwrap_or(net);
    net.contains(&mapped) || mapped.contains(&net)
}

/// The bits of the IPv4-mapped prefix (`::ffff:0:0/96`).
const V4_MAPPED_BITS: u32 = limiter_common::addr::V4_MAPPED_BITS as u32;

fn family(cidr: IpNet) -> usize {
    usize::from(matches!(cidr, IpNet::V6(_)))
}

fn net(addr: IpAddr, prefix_len: u32) -> IpNet {
    let prefix_len = u8::try_from(prefix_len).unwrap_or(u8::MAX);
    IpNet::new(addr, prefix_len).unwrap_or_else(|_| IpNet::from(addr))
}

/// A trie value that lapses.
pub(super) trait Lapses: Pod {
    fn expiry(&self) -> Expiry;
}

impl Lapses for Expiry {
    fn expiry(&self) -> Expiry {
        *self
    }
}

impl Lapses for Demotion {
    fn expiry(&self) -> Expiry {
        self.expiry
    }
}

/// Tries of entries that lapse (blocks, demotions), which the program skips while
/// their occupancy flag is down. The CLI and the agent write them concurrently, and
/// every writer raises the flag before and after its insert; so the flag is cleared
/// only after the trie was seen empty, and raised again if an insert landed
/// meanwhile.
pub(super) struct LapsingTries<V: Lapses> {
    tries: CidrTries<V>,
    /// When an insert last found a trie full and walked it for lapsed entries
    /// (monotonic ns): a trie full of entries in force is walked once per
    /// [`PRUNE_INTERVAL_NS`], not at each insert.
    pruned_at_ns: Option<u64>,
}

impl<V: Lapses> LapsingTries<V> {
    pub(super) fn new(tries: CidrTries<V>) -> Self {
        Self { tries, pruned_at_ns: None }
    }

    /// Adds or replaces the entry of `cidr`.
    pub(super) fn insert(
        &mut self,
        occupancy: &mut Array<MapData, u32>,
        cidr: IpNet,
        value: V,
    ) -> Result<(), XdpError> {
        let slot = self.tries.slot(cidr);
        set_occupied(occupancy, slot, true)?;
        if let Err(error) = self.tries.insert(cidr, value) {
            // Lapsed entries stay in the trie until someone reads it: a full one makes
            // room with them first.
            let now = monotonic_now_ns();
            let pruned_lately = self.pruned_at_ns.is_some_and(|at| now.saturating_sub(at) < PRUNE_INTERVAL_NS);
            if !is_full(&error) || pruned_lately {
                return Err(error);
            }
            self.pruned_at_ns = Some(now);
            self.in_force(occupancy, now)?;
            self.tries.insert(cidr, value)?;
        }
        // Again after the insert: a concurrent `settle` may have cleared the flag
        // between ours and the insert.
        set_occupied(occupancy, slot, true)
    }

    /// Removes the entry of exactly `cidr`; `false` if there was none in force (a
    /// lapsed one is removed all the same).
    pub(super) fn remove(&mut self, occupancy: &mut Array<MapData, u32>, cidr: IpNet) -> Result<bool, XdpError> {
        let in_force = self.tries.get(cidr).is_some_and(|entry| entry.expiry().active(monotonic_now_ns()));
        Ok(self.remove_any(occupancy, cidr)? && in_force)
    }

    fn remove_any(&mut self, occupancy: &mut Array<MapData, u32>, cidr: IpNet) -> Result<bool, XdpError> {
        let removed = self.tries.remove(cidr);
        self.settle(occupancy, self.tries.slot(cidr))?;
        removed
    }

    /// Clears the flag of `slot` if its trie is empty.
    fn settle(&mut self, occupancy: &mut Array<MapData, u32>, slot: u32) -> Result<(), XdpError> {
        if !self.tries.is_empty(slot) {
            return Ok(());
        }
        set_occupied(occupancy, slot, false)?;
        if !self.tries.is_empty(slot) {
            set_occupied(occupancy, slot, true)?;
        }
        Ok(())
    }

    /// The entries in force at `now`; lapsed ones are removed on the way.
    pub(super) fn in_force(
        &mut self,
        occupancy: &mut Array<MapData, u32>,
        now: u64,
    ) -> Result<Vec<(IpNet, V)>, XdpError> {
        let mut active = Vec::new();
        for (cidr, entry) in self.tries.entries()? {
            if entry.expiry().active(now) {
                active.push((cidr, entry));
            } else {
                self.remove_any(occupancy, cidr)?;
            }
        }
        Ok(active)
    }

    /// The entries in force at `now`, lapsed ones left for a writer to remove.
    pub(super) fn read(&self, now: u64) -> Result<Vec<(IpNet, V)>, XdpError> {
        Ok(self.tries.entries()?.into_iter().filter(|(_, entry)| entry.expiry().active(now)).collect())
    }
}

/// Whether an insert failed because its LPM trie is at capacity (the kernel's ENOSPC).
fn is_full(error: &XdpError) -> bool {
    matches!(error, XdpError::Map { source: MapError::SyscallError(call), .. }
        if call.io_error.raw_os_error() == Some(libc::ENOSPC))
}
