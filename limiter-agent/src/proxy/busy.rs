//! The requests each client has in flight, over all its connections and HTTP/2
//! streams, from head to the end of the response (`max_requests_in_flight_per_client`):
//! one client asking for large responses and never reading them holds one upstream
//! connection per request, so the streams of many connections (100 each) must not add
//! up without bound.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
};

use ipnet::IpNet;

use super::connections;

/// The clients with requests in flight, by address (IPv6: by /64).
#[derive(Debug, Default)]
pub(super) struct Busy(Mutex<HashMap<IpNet, usize>>);

/// One request in flight; dropping it (with the response body) ends it.
#[derive(Debug)]
pub(super) struct Held {
    busy: Arc<Busy>,
    client: IpNet,
}

impl Busy {
    /// Counts a request of `client`, unless it has `max` in flight already.
    pub(super) fn enter(self: &Arc<Self>, client: IpAddr, max: usize) -> Option<Held> {
        let client = connections::client_net(client);
        let mut busy = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = busy.entry(client).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Held { busy: Arc::clone(self), client })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut busy = self.busy.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = busy.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                busy.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_its_64_and_its_requests_come_back() {
        let busy = Arc::new(Busy::default());
        let ip = |text: &str| text.parse::<IpAddr>().expect("address");
        let first = busy.enter(ip("2001:db8::1"), 2).expect("first");
        let _second = busy.enter(ip("2001:db8::2"), 2).expect("second, same /64");
        assert!(busy.enter(ip("2001:db8::3"), 2).is_none(), "a third of the /64");
        let _other = busy.enter(ip("2001:db8:0:1::1"), 2).expect("another /64");
        drop(first);
        let _again = busy.enter(ip("2001:db8::3"), 2).expect("a request ended");
        assert_eq!(busy.0.lock().expect("lock").len(), 2);
    }
}
