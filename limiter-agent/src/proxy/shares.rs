//! What each client holds of something every client draws on, counted per client
//! (IPv6 by its /64, as the connection bounds count) so that each holds at most its
//! cap: its requests in flight, over all its connections and HTTP/2 streams
//! (`max_requests_in_flight_per_client`: one client asking for large responses and
//! never reading them holds an upstream connection per request, so the streams of
//! many connections must not add up without bound), and the request bytes its bodies
//! hold in memory (`max_buffered_bytes_per_client`, see `buffered`).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
};

use ipnet::IpNet;

use super::connections::client_net;

/// The amount each client holds now.
#[derive(Debug, Default)]
pub(super) struct Shares(Mutex<HashMap<IpNet, u64>>);

/// What one holder (a request, a body) has of its client's share; dropping it gives
/// that back.
#[derive(Debug)]
pub(super) struct Share {
    shares: Arc<Shares>,
    client: IpNet,
    held: u64,
}

impl Shares {
    /// An empty share of `client`'s.
    pub(super) fn share(self: &Arc<Self>, client: IpAddr) -> Share {
        Share { shares: Arc::clone(self), client: client_net(client), held: 0 }
    }

    /// What all clients hold now.
    pub(super) fn total(&self) -> u64 {
        self.lock().values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpNet, u64>> {
        // Only additions and removals happen under the lock.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Share {
    /// Takes `n` more if the client then holds at most `cap` in all; else nothing.
    pub(super) fn grow(&mut self, n: u64, cap: u64) -> bool {
        let mut clients = self.shares.lock();
        let held = clients.get(&self.client).copied().unwrap_or(0);
        if held.saturating_add(n) > cap {
            return false;
        }
        clients.insert(self.client, held + n);
        self.held += n;
        true
    }

    /// What this holder has taken.
    pub(super) fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if self.held == 0 {
            return;
        }
        let mut clients = self.shares.lock();
        if let Some(held) = clients.get_mut(&self.client) {
            *held = held.saturating_sub(self.held);
            if *held == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_its_64_and_what_it_holds_comes_back() {
        let shares = Arc::new(Shares::default());
        let ip = |text: &str| text.parse::<IpAddr>().expect("address");
        let in_flight = |client: &str| {
            let mut share = shares.share(ip(client));
            share.grow(1, 2).then_some(share)
        };
        let first = in_flight("2001:db8::1").expect("first");
        let _second = in_flight("2001:db8::2").expect("second, same /64");
        assert!(in_flight("2001:db8::3").is_none(), "a third of the /64");
        let _other = in_flight("2001:db8:0:1::1").expect("another /64");
        drop(first);
        let _again = in_flight("2001:db8::3").expect("a request ended");
        let clients = shares.lock().len();
        assert_eq!((clients, shares.total()), (2, 3));
    }
}
