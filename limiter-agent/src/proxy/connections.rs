//! The bounds on open connections, over all clients and per prefix, checked at
//! accept: a client that opens connections and stalls them must run out of its own
//! share before the agent runs out of file descriptors. A peer is bounded at each of
//! the prefixes one owner usually holds (IPv6 /64, /56, /48; IPv4 /32 and, if
//! configured, /24), so that the 256 /64s of one household's /56 cannot hold every
//! place. At `max_connections`, the keep-alive connection idle longest is closed to
//! make room, as nginx reuses connections, rather than the new one refused; a new
//! connection is never taken, since it may not have had the time to send its first
//! request. Also why else a connection is closed before its first request.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::Waker,
};

use futures_util::task::AtomicWaker;
use ipnet::IpNet;

/// A prefix a peer's connections are bounded at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// IPv4 /32, IPv6 /64: `max_connections_per_ip`.
    Ip,
    Ipv6_56,
    Ipv6_48,
    Ipv4_24,
}

/// Why a connection was closed at accept; the value of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// `max_connections` were open, none of them idle between requests.
    Total,
    /// The peer's prefix at this level had its connections open.
    Prefix(Level),
    /// A PROXY protocol header from a peer not in `trusted_proxies`, or a malformed
    /// or missing one from a peer that is.
    ProxyProtocol,
    /// The client is blocked at the application layer (escalated behind a PROXY
    /// protocol balancer, where the kernel layer only sees the balancer).
    Blocked,
}

impl Refused {
    pub(super) const ALL: [Self; 7] = [
        Self::Total,
        Self::Prefix(Level::Ip),
        Self::Prefix(Level::Ipv6_56),
        Self::Prefix(Level::Ipv6_48),
        Self::Prefix(Level::Ipv4_24),
        Self::ProxyProtocol,
        Self::Blocked,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Total => "max_connections",
            Self::Prefix(Level::Ip) => "max_connections_per_ip",
            Self::Prefix(Level::Ipv6_56) => "max_connections_per_ipv6_56",
            Self::Prefix(Level::Ipv6_48) => "max_connections_per_ipv6_48",
            Self::Prefix(Level::Ipv4_24) => "max_connections_per_ipv4_24",
            Self::ProxyProtocol => "proxy_protocol",
            Self::Blocked => "blocked",
        }
    }
}

/// The bounds one peer is admitted under.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub total: usize,
    /// `None` for a trusted proxy, bound by the total only.
    pub prefixes: Option<PrefixBounds>,
}

/// The per-prefix bounds (`max_connections_per_*`).
#[derive(Clone, Copy, Debug)]
pub(super) struct PrefixBounds {
    pub ip: usize,
    pub ipv6_56: usize,
    pub ipv6_48: usize,
    pub ipv4_24: Option<usize>,
}

impl PrefixBounds {
    /// The prefixes of `peer` that are bounded, with their bounds, narrowest first.
    fn of(self, peer: IpAddr) -> Vec<(Level, IpNet, usize)> {
        let levels = match peer {
            IpAddr::V4(_) => vec![(Level::Ip, Some(self.ip)), (Level::Ipv4_24, self.ipv4_24)],
            IpAddr::V6(_) => {
                vec![
                    (Level::Ip, Some(self.ip)),
                    (Level::Ipv6_56, Some(self.ipv6_56)),
                    (Level::Ipv6_48, Some(self.ipv6_48)),
                ]
            }
        };
        levels.into_iter().filter_map(|(level, bound)| Some((level, net(peer, level), bound?))).collect()
    }
}

/// What one client is: its address, IPv6 by its /64.
pub(super) fn client_net(peer: IpAddr) -> IpNet {
    net(peer.to_canonical(), Level::Ip)
}

/// `peer`'s prefix at `level`: IPv4 by its address, IPv6 by its /64 (one host's
/// usual share, which it can fill with addresses at will), and the wider ones.
fn net(peer: IpAddr, level: Level) -> IpNet {
    let prefix = match (level, peer) {
        (Level::Ip, IpAddr::V4(_)) => 32,
        (Level::Ip, IpAddr::V6(_)) => 64,
        (Level::Ipv6_56, _) => 56,
        (Level::Ipv6_48, _) => 48,
        (Level::Ipv4_24, _) => 24,
    };
    IpNet::new(peer, prefix).map_or(IpNet::from(peer), |net| net.trunc())
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_prefix: HashMap<IpNet, usize>,
    /// The keep-alive connections waiting for their next request, by when they began
    /// to wait: the first is closed to make room at `max_connections`.
    waiting: BTreeMap<u64, Arc<Place>>,
    next_wait: u64,
}

impl Open {
    fn release(&mut self, place: &Place) {
        for net in &place.nets {
            if let Some(count) = self.per_prefix.get_mut(net) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.per_prefix.remove(net);
                }
            }
        }
    }
}

/// What a connection's place is counted under, and how it is told to give it up.
#[derive(Debug)]
struct Place {
    nets: Vec<IpNet>,
    /// Given up to a new connection, which holds its share of the total now.
    reclaimed: AtomicBool,
    /// The connection's reader, woken when its place is reclaimed.
    reader: AtomicWaker,
}

/// The connections open now.
#[derive(Debug, Default)]
pub(super) struct Connections(Mutex<Open>);

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub(super) struct Slot {
    connections: Arc<Connections>,
    place: Arc<Place>,
    /// Its key in [`Open::waiting`] while it waits for a request.
    waiting: Option<u64>,
}

/// A connection admitted, and whether an idle one was closed to make room for it.
#[derive(Debug)]
pub(super) struct Admitted {
    pub slot: Slot,
    pub reclaimed: bool,
}

impl Connections {
    /// Takes a place for a connection from `peer` under `bounds`, at `max_connections`
    /// the place of the keep-alive connection idle longest.
    pub(super) fn admit(self: &Arc<Self>, peer: IpAddr, bounds: Bounds) -> Result<Admitted, Refused> {
        let peer = peer.to_canonical();
        let prefixes = bounds.prefixes.map(|p| p.of(peer)).unwrap_or_default();
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((level, ..)) =
            prefixes.iter().find(|(_, net, bound)| open.per_prefix.get(net).is_some_and(|count| count >= bound))
        {
            return Err(Refused::Prefix(*level));
        }
        let reclaimed = open.total >= bounds.total;
        if reclaimed {
            let Some((_, oldest)) = open.waiting.pop_first() else { return Err(Refused::Total) };
            // Its share of the total passes to the new connection; it closes when woken.
            oldest.reclaimed.store(true, Ordering::Release);
            open.release(&oldest);
            oldest.reader.wake();
        } else {
            open.total += 1;
        }
        let nets: Vec<IpNet> = prefixes.into_iter().map(|(_, net, _)| net).collect();
        for net in &nets {
            *open.per_prefix.entry(*net).or_default() += 1;
        }
        let place = Arc::new(Place { nets, reclaimed: AtomicBool::new(false), reader: AtomicWaker::new() });
        Ok(Admitted { slot: Slot { connections: Arc::clone(self), place, waiting: None }, reclaimed })
    }

    /// How many connections `peer`'s address (IPv6: its /64) has open, counted only
    /// for peers under the per-prefix bounds.
    pub(super) fn open_from(&self, peer: IpAddr) -> usize {
        let open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        open.per_prefix.get(&client_net(peer)).copied().unwrap_or(0)
    }
}

impl Slot {
    /// Says whether the connection waits for its next request (no byte of it read
    /// yet), so that its place may be given to a new connection.
    pub(super) fn set_waiting(&mut self, waiting: bool) {
        if waiting == self.waiting.is_some() || self.reclaimed() {
            return;
        }
        let mut open = self.connections.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(key) = self.waiting.take() {
            open.waiting.remove(&key);
        }
        if waiting {
            let key = open.next_wait;
            open.next_wait += 1;
            open.waiting.insert(key, Arc::clone(&self.place));
            self.waiting = Some(key);
        }
    }

    /// Whether the place went to a new connection, so this one must close; `waker`
    /// is woken when that happens.
    pub(super) fn reclaimed_or_park(&self, waker: &Waker) -> bool {
        self.place.reader.register(waker);
        self.reclaimed()
    }

    pub(super) fn reclaimed(&self) -> bool {
        self.place.reclaimed.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.connections.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(key) = self.waiting.take() {
            open.waiting.remove(&key);
        }
        // A reclaimed place was released when it was taken.
        if !self.place.reclaimed.load(Ordering::Acquire) {
            open.total = open.total.saturating_sub(1);
            open.release(&self.place);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not an address"))
    }

    fn bounds(total: usize, ip: usize) -> Bounds {
        Bounds { total, prefixes: Some(PrefixBounds { ip, ipv6_56: 1000, ipv6_48: 1000, ipv4_24: None }) }
    }

    fn admit(connections: &Arc<Connections>, peer: &str, bounds: Bounds) -> Result<Slot, Refused> {
        connections.admit(ip(peer), bounds).map(|admitted| admitted.slot)
    }

    #[test]
    fn bounds_hold_and_freed_places_come_back() {
        let connections = Arc::new(Connections::default());
        let a = admit(&connections, "192.0.2.1", bounds(3, 2)).expect("first");
        let _b = admit(&connections, "::ffff:192.0.2.1", bounds(3, 2)).expect("second");
        assert_eq!(admit(&connections, "192.0.2.1", bounds(3, 2)).err(), Some(Refused::Prefix(Level::Ip)));
        let _c = admit(&connections, "192.0.2.2", bounds(3, 2)).expect("another peer");
        assert_eq!(admit(&connections, "192.0.2.3", bounds(3, 2)).err(), Some(Refused::Total));
        drop(a);
        let _d = admit(&connections, "192.0.2.1", bounds(3, 2)).expect("a freed place");
    }

    #[test]
    fn an_ipv6_peer_is_its_64_and_an_unbounded_peer_only_counts_in_the_total() {
        let connections = Arc::new(Connections::default());
        let _a = admit(&connections, "2001:db8::1", bounds(10, 1)).expect("first");
        assert_eq!(admit(&connections, "2001:db8::ffff:2", bounds(10, 1)).err(), Some(Refused::Prefix(Level::Ip)));
        let _b = admit(&connections, "2001:db8:0:1::1", bounds(10, 1)).expect("another /64");
        let trusted = Bounds { total: 10, prefixes: None };
        let held: Vec<_> = (0..8).map(|_| admit(&connections, "10.0.0.1", trusted)).collect();
        assert!(held.iter().all(Result::is_ok));
        assert_eq!(admit(&connections, "10.0.0.1", trusted).err(), Some(Refused::Total));
    }

    #[test]
    fn wider_prefixes_are_bounded_too() {
        let connections = Arc::new(Connections::default());
        let bounds =
            Bounds { total: 100, prefixes: Some(PrefixBounds { ip: 2, ipv6_56: 3, ipv6_48: 4, ipv4_24: Some(2) }) };
        let mut held = Vec::new();
        // Three /64s of one /56: its bound is reached before any /64's.
        for peer in ["2001:db8:0:100::1", "2001:db8:0:101::1", "2001:db8:0:102::1"] {
            held.push(admit(&connections, peer, bounds).expect("within the /56"));
        }
        assert_eq!(admit(&connections, "2001:db8:0:1ff::1", bounds).err(), Some(Refused::Prefix(Level::Ipv6_56)));
        held.push(admit(&connections, "2001:db8:0:200::1", bounds).expect("another /56 of the /48"));
        assert_eq!(admit(&connections, "2001:db8:0:300::1", bounds).err(), Some(Refused::Prefix(Level::Ipv6_48)));
        held.push(admit(&connections, "2001:db8:1::1", bounds).expect("another /48"));
        held.push(admit(&connections, "192.0.2.1", bounds).expect("IPv4"));
        held.push(admit(&connections, "192.0.2.2", bounds).expect("IPv4, same /24"));
        assert_eq!(admit(&connections, "192.0.2.3", bounds).err(), Some(Refused::Prefix(Level::Ipv4_24)));
        assert_eq!(connections.open_from(ip("2001:db8:0:100::2")), 1);
        drop(held);
        assert_eq!(connections.open_from(ip("2001:db8:0:100::2")), 0);
        assert!(connections.0.lock().expect("lock").per_prefix.is_empty(), "every count returned");
    }

    #[test]
    fn at_the_total_the_connection_waiting_longest_gives_up_its_place() {
        let connections = Arc::new(Connections::default());
        let mut first = admit(&connections, "192.0.2.1", bounds(2, 5)).expect("first");
        let mut second = admit(&connections, "192.0.2.2", bounds(2, 5)).expect("second");
        // Busy connections are never taken.
        assert_eq!(admit(&connections, "192.0.2.3", bounds(2, 5)).err(), Some(Refused::Total));
        second.set_waiting(true);
        first.set_waiting(true);
        let third = connections.admit(ip("192.0.2.3"), bounds(2, 5)).expect("in the place of the second");
        assert!(third.reclaimed);
        assert!(second.reclaimed_or_park(Waker::noop()));
        assert!(!first.reclaimed());
        assert_eq!(connections.open_from(ip("192.0.2.2")), 0, "its share went at once");
        drop(second);
        first.set_waiting(false);
        assert_eq!(admit(&connections, "192.0.2.4", bounds(2, 5)).err(), Some(Refused::Total), "no more waiting");
        drop(third);
        let _fourth = admit(&connections, "192.0.2.4", bounds(2, 5)).expect("a freed place");
        assert_eq!(connections.0.lock().expect("lock").total, 2);
    }
}
