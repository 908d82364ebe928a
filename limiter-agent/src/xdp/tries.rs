//! An IPv4 and an IPv6 LPM trie holding the same kind of value, addressed by CIDR:
//! the CIDR rules and the runtime blocks are each such a pair.

use std::net::IpAddr;

use aya::{
    Pod,
    maps::{LpmTrie, Map, MapData, MapError, lpm_trie::Key},
};
use ipnet::IpNet;

use super::XdpError;

/// Both tries of one kind, with their map names (for errors) and their slots in the
/// occupancy flags.
pub(super) struct CidrTries<V: Pod> {
    v4: LpmTrie<MapData, [u8; 4], V>,
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
            v4: v4.try_into().map_err(error(names[0]))?,
            v6: v6.try_into().map_err(error(names[1]))?,
            names,
            slots,
        })
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
        if slot == self.slots[0] { self.v4.keys().next().is_none() } else { self.v6.keys().next().is_none() }
    }

    /// Adds or replaces the entry of exactly `cidr`.
    pub(super) fn insert(&mut self, cidr: IpNet, value: V) -> Result<(), XdpError> {
        match cidr {
            IpNet::V4(net) => self.v4.insert(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), value, 0),
            IpNet::V6(net) => self.v6.insert(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), value, 0),
        }
        .map_err(|source| self.error(cidr, source))
    }

    /// The entry of exactly `cidr`, if any.
    pub(super) fn get(&self, cidr: IpNet) -> Option<V> {
        match cidr {
            IpNet::V4(net) => self.v4.get(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), 0),
            IpNet::V6(net) => self.v6.get(&Key::new(u32::from(net.prefix_len()), net.addr().octets()), 0),
        }
        .ok()
    }

    /// Removes the entry of exactly `cidr`; `false` if there was none.
    pub(super) fn remove(&mut self, cidr: IpNet) -> Result<bool, XdpError> {
        let removed = match cidr {
            IpNet::V4(net) => self.v4.remove(&Key::new(u32::from(net.prefix_len()), net.addr().octets())),
            IpNet::V6(net) => self.v6.remove(&Key::new(u32::from(net.prefix_len()), net.addr().octets())),
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
        for entry in self.v4.iter() {
            let (key, value) = entry.map_err(|source| XdpError::Map { name: self.names[0], source })?;
            entries.push((net(IpAddr::from(key.data()), key.prefix_len()), value));
        }
        for entry in self.v6.iter() {
            let (key, value) = entry.map_err(|source| XdpError::Map { name: self.names[1], source })?;
            entries.push((net(IpAddr::from(key.data()), key.prefix_len()), value));
        }
        Ok(entries)
    }

    fn error(&self, cidr: IpNet, source: MapError) -> XdpError {
        XdpError::Map { name: self.names[family(cidr)], source }
    }
}

fn family(cidr: IpNet) -> usize {
    usize::from(matches!(cidr, IpNet::V6(_)))
}

fn net(addr: IpAddr, prefix_len: u32) -> IpNet {
    let prefix_len = u8::try_from(prefix_len).unwrap_or(u8::MAX);
    IpNet::new(addr, prefix_len).unwrap_or_else(|_| IpNet::from(addr))
}
