//! The proxy's heaviest clients for `limiter top --watch`: requests and refusals per
//! proven key, or per address for keyless requests, and per TLS fingerprint, in
//! bounded tables.
//!
//! The table keeps [`CAPACITY`] clients of each kind. A new client that finds it full
//! takes the place of the lightest one and inherits its count plus one (the
//! space-saving algorithm): a client's count is then at most its true count plus the
//! lightest count at the time, so any client heavier than that stays in the table
//! whatever a flood of one-off clients does.

use std::{
    borrow::Borrow,
    collections::HashMap,
    hash::Hash,
    net::IpAddr,
    sync::{Mutex, PoisonError},
};

use limiter_core::ja4::Ja4;
use serde::{Deserialize, Serialize};

/// Clients tracked of each kind (keys, addresses, fingerprints).
pub(super) const CAPACITY: usize = 128;

/// Who a request was counted for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Client<'a> {
    /// The key a signature proved.
    Signed(&'a str),
    /// The id of an `auth = "bearer"` key: its secret, shown only in part.
    Bearer(&'a str),
    /// A keyless request's address (IPv6 by its /64).
    Address(IpAddr),
}

#[derive(Debug, Default, Clone)]
struct Counts {
    requests: u64,
    refused: u64,
    /// The policy that refused it last.
    refused_by: Option<String>,
    bearer: bool,
}

impl Counts {
    fn count(&mut self, refused_by: Option<&str>) {
        self.requests += 1;
        if let Some(policy) = refused_by {
            self.refused += 1;
            if self.refused_by.as_deref() != Some(policy) {
                self.refused_by = Some(policy.to_owned());
            }
        }
    }
}

/// One client as `limiter top` shows it: counts since it entered the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClientRow {
    /// `key ID`, `key ABCD…` (a bearer key), `ip ADDRESS` or `ja4 FINGERPRINT`.
    pub client: String,
    pub requests: u64,
    pub refused: u64,
    /// The rule or plan that refused it last.
    pub refused_by: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct HeavyClients {
    tables: Mutex<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    keys: HashMap<String, Counts>,
    addresses: HashMap<IpAddr, Counts>,
    fingerprints: HashMap<Ja4, Counts>,
}

impl HeavyClients {
    /// Counts one decided request, for its client and for the TLS fingerprint `ja4`
    /// it presented; `refused_by` names the policy that refused it.
    pub(super) fn record(&self, client: Client<'_>, ja4: Option<Ja4>, refused_by: Option<&str>) {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = match client {
            Client::Signed(id) | Client::Bearer(id) => {
                let counts = entry(&mut tables.keys, id, str::to_owned);
                counts.bearer = matches!(client, Client::Bearer(_));
                counts
            }
            Client::Address(ip) => entry(&mut tables.addresses, &slash_64(ip), |ip: &IpAddr| *ip),
        };
        counts.count(refused_by);
        if let Some(ja4) = ja4 {
            entry(&mut tables.fingerprints, &ja4, |ja4: &Ja4| *ja4).count(refused_by);
        }
    }

    /// The `n` clients with the most requests.
    pub(super) fn top(&self, n: usize) -> Vec<ClientRow> {
        let tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = tables.keys.iter().map(|(id, counts)| (key_name(id, counts.bearer), counts));
        let addresses = tables.addresses.iter().map(|(ip, counts)| (format!("ip {ip}"), counts));
        let fingerprints = tables.fingerprints.iter().map(|(ja4, counts)| (format!("ja4 {ja4}"), counts));
        let mut rows: Vec<ClientRow> = keys
            .chain(addresses)
            .chain(fingerprints)
            .map(|(client, counts)| ClientRow {
                client,
                requests: counts.requests,
                refused: counts.refused,
                refused_by: counts.refused_by.clone(),
            })
            .collect();
        rows.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.client.cmp(&b.client)));
        rows.truncate(n);
        rows
    }
}

/// `client`'s counts, making room for it if it is new.
fn entry<'t, K, Q>(table: &'t mut HashMap<K, Counts>, client: &Q, owned: impl FnOnce(&Q) -> K) -> &'t mut Counts
where
    K: Hash + Eq + Clone + Borrow<Q>,
    Q: Hash + Eq + ?Sized,
{
    if !table.contains_key(client) {
        let mut inherited = 0;
        if table.len() >= CAPACITY
            && let Some((lightest, requests)) =
                table.iter().min_by_key(|(_, counts)| counts.requests).map(|(k, counts)| (k.clone(), counts.requests))
        {
            table.remove::<K>(&lightest);
            inherited = requests;
        }
        table.insert(owned(client), Counts { requests: inherited, ..Counts::default() });
    }
    table.get_mut(client).expect("present: inserted above if it was not")
}

fn key_name(id: &str, bearer: bool) -> String {
    if bearer {
        let shown: String = id.chars().take(4).collect();
        format!("key {shown}…")
    } else {
        format!("key {id}")
    }
}

fn slash_64(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((v6.to_bits() & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::{CAPACITY, Client, ClientRow, HeavyClients};

    #[test]
    fn counts_requests_refusals_and_the_last_refusing_policy_per_client() {
        let heavy = HeavyClients::default();
        let ja4 = "t13d1516h2_8daaf6152771_e5627efa2ab1".parse().ok();
        for _ in 0..3 {
            heavy.record(Client::Signed("k-pay"), None, None);
        }
        heavy.record(Client::Signed("k-pay"), None, Some("per-key"));
        heavy.record(Client::Bearer("bearer-secret"), None, Some("free"));
        heavy.record(Client::Address("2001:db8::1".parse().expect("ip")), ja4, Some("login"));
        heavy.record(Client::Address("2001:db8::2".parse().expect("ip")), ja4, Some("per-ip"));
        heavy.record(Client::Address("::ffff:192.0.2.7".parse().expect("ip")), None, None);
        let row = |client: &str, requests, refused, by: Option<&str>| ClientRow {
            client: client.to_owned(),
            requests,
            refused,
            refused_by: by.map(str::to_owned),
        };
        assert_eq!(
            heavy.top(10),
            [
                row("key k-pay", 4, 1, Some("per-key")),
                row("ip 2001:db8::", 2, 2, Some("per-ip")),
                row("ja4 t13d1516h2_8daaf6152771_e5627efa2ab1", 2, 2, Some("per-ip")),
                row("ip 192.0.2.7", 1, 0, None),
                row("key bear…", 1, 1, Some("free")),
            ]
        );
        assert_eq!(heavy.top(1).len(), 1);
    }

    /// A flood of one-off addresses neither grows the table nor pushes out a client
    /// heavier than the lightest one.
    #[test]
    fn a_heavy_client_stays_through_a_flood_of_one_off_clients() {
        let heavy = HeavyClients::default();
        let attacker = "192.0.2.7".parse().expect("ip");
        for i in 0..10_000_u32 {
            heavy.record(Client::Address(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()), None, None);
            if i % 10 == 0 {
                heavy.record(Client::Address(attacker), None, Some("per-ip"));
            }
        }
        let top = heavy.top(usize::MAX);
        assert_eq!(top.len(), CAPACITY);
        assert_eq!(top[0].client, "ip 192.0.2.7");
        // Space saving overestimates by at most the lightest count; never less.
        assert!(top[0].requests >= 1_000 && top[0].refused == 1_000, "{:?}", top[0]);
    }
}
