//! The bounds on open connections, over all clients and per peer, checked at
//! accept: a client that opens connections and stalls them must run out of its own
//! share before the agent runs out of file descriptors. Also why else a connection
//! is closed before its first request.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::{Arc, Mutex, PoisonError},
};

/// Why a connection was closed at accept; the value of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// `max_connections` were open.
    Total,
    /// `max_connections_per_ip` were open from the same peer.
    PerIp,
    /// A PROXY protocol header from a peer not in `trusted_proxies`, or a malformed
    /// or missing one from a peer that is.
    ProxyProtocol,
}

impl Refused {
    pub(super) const ALL: [Self; 3] = [Self::Total, Self::PerIp, Self::ProxyProtocol];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Total => "max_connections",
            Self::PerIp => "max_connections_per_ip",
            Self::ProxyProtocol => "proxy_protocol",
        }
    }
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// The connections open now.
#[derive(Debug, Default)]
pub(super) struct Connections(Mutex<Open>);

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub(super) struct Slot {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Connections {
    /// Takes a place for a connection from `peer`, if there is one under both bounds;
    /// `max_per_peer` is `None` for peers bound by the total only.
    pub(super) fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        max_total: usize,
        max_per_peer: Option<usize>,
    ) -> Result<Slot, Refused> {
        let peer = peer_key(peer);
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if open.total >= max_total {
            return Err(Refused::Total);
        }
        let from_peer = open.per_peer.entry(peer).or_default();
        if max_per_peer.is_some_and(|max| *from_peer >= max) {
            return Err(Refused::PerIp);
        }
        *from_peer += 1;
        open.total += 1;
        Ok(Slot { connections: Arc::clone(self), peer })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.connections.0.lock().unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        if let Some(from_peer) = open.per_peer.get_mut(&self.peer) {
            *from_peer = from_peer.saturating_sub(1);
            if *from_peer == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
    }
}

/// What one peer is: its address, IPv4 as IPv4, IPv6 by its /64 (one host's usual
/// share, which it can fill with addresses at will).
pub(super) fn peer_key(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 @ IpAddr::V4(_) => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not an address"))
    }

    #[test]
    fn bounds_hold_and_freed_places_come_back() {
        let connections = Arc::new(Connections::default());
        let a = connections.admit(ip("192.0.2.1"), 3, Some(2)).expect("first");
        let _b = connections.admit(ip("::ffff:192.0.2.1"), 3, Some(2)).expect("second");
        assert_eq!(connections.admit(ip("192.0.2.1"), 3, Some(2)).err(), Some(Refused::PerIp));
        let _c = connections.admit(ip("192.0.2.2"), 3, Some(2)).expect("another peer");
        assert_eq!(connections.admit(ip("192.0.2.3"), 3, Some(2)).err(), Some(Refused::Total));
        drop(a);
        let _d = connections.admit(ip("192.0.2.1"), 3, Some(2)).expect("a freed place");
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_an_unbounded_peer_only_counts_in_the_total() {
        let connections = Arc::new(Connections::default());
        let _a = connections.admit(ip("2001:db8::1"), 10, Some(1)).expect("first");
        assert_eq!(connections.admit(ip("2001:db8::ffff:2"), 10, Some(1)).err(), Some(Refused::PerIp));
        let _b = connections.admit(ip("2001:db8:0:1::1"), 10, Some(1)).expect("another /64");
        let trusted: Vec<_> = (0..8).map(|_| connections.admit(ip("10.0.0.1"), 10, None)).collect();
        assert!(trusted.iter().all(Result::is_ok));
        assert_eq!(connections.admit(ip("10.0.0.1"), 10, None).err(), Some(Refused::Total));
    }
}
