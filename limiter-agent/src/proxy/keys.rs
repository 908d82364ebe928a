//! Which client a request comes from: the peer address, or, when the peer is a
//! trusted proxy, the rightmost address in `X-Forwarded-For` that no trusted proxy
//! added. Everything left of that is whatever the client chose to write. The same
//! goes for the TLS fingerprint a trusted proxy names (`ja4_header`).

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use limiter_core::ja4::Ja4;

pub(super) const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Whether `ip` is one of the configured trusted proxies.
pub(super) fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The client address of a request that arrived from `peer`.
pub(super) fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    // A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d; key them as IPv4.
    let mut client = peer.to_canonical();
    if !is_trusted(client, trusted) {
        return client;
    }
    for hop in forwarded_hops(headers).rev() {
        match hop {
            Some(ip) if is_trusted(ip, trusted) => client = ip,
            Some(ip) => return ip,
            // A trusted proxy passed on something that is not an address: the hop
            // before it is the last one we can vouch for.
            None => return client,
        }
    }
    client
}

/// The fingerprint a trusted proxy names in `header`: its one value, if that is a
/// well-formed JA4; `None` for none, two, or another text.
pub(super) fn believed_ja4(headers: &HeaderMap, header: &HeaderName) -> Option<Ja4> {
    let mut values = headers.get_all(header).iter();
    let (value, another) = (values.next()?, values.next());
    if another.is_some() {
        return None;
    }
    value.to_str().ok()?.trim().parse().ok()
}

/// The `X-Forwarded-For` entries in order, across repeated header lines; `None` for
/// an entry that is not an address.
fn forwarded_hops(headers: &HeaderMap) -> impl DoubleEndedIterator<Item = Option<IpAddr>> {
    headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("\u{0}").split(','))
        .map(parse_hop)
}

/// `192.0.2.1`, `2001:db8::1`, or either with a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_hop(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    let ip = text.parse::<IpAddr>().ok().or_else(|| text.parse::<SocketAddr>().ok().map(|addr| addr.ip()))?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not an address"))
    }

    fn trusted(nets: &[&str]) -> Vec<IpNet> {
        nets.iter().map(|n| n.parse().unwrap_or_else(|_| panic!("{n} is not a net"))).collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(X_FORWARDED_FOR, value.parse().unwrap_or_else(|_| panic!("bad value {value}")));
        }
        headers
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_it_claims() {
        let headers = xff(&["203.0.113.9"]);
        assert_eq!(client_ip(ip("198.51.100.7"), &headers, &trusted(&["10.0.0.0/8"])), ip("198.51.100.7"));
        assert_eq!(client_ip(ip("198.51.100.7"), &headers, &[]), ip("198.51.100.7"));
    }

    #[test]
    fn trusted_peer_gives_rightmost_untrusted_hop() {
        let nets = trusted(&["10.0.0.0/8"]);
        let headers = xff(&["1.1.1.1, 203.0.113.9", "10.0.0.2"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &headers, &nets), ip("203.0.113.9"));
    }

    #[test]
    fn all_hops_trusted_gives_the_leftmost() {
        let nets = trusted(&["10.0.0.0/8"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &xff(&["10.0.0.3, 10.0.0.2"]), &nets), ip("10.0.0.3"));
        assert_eq!(client_ip(ip("10.0.0.1"), &HeaderMap::new(), &nets), ip("10.0.0.1"));
    }

    #[test]
    fn garbage_stops_at_the_last_trusted_hop() {
        let nets = trusted(&["10.0.0.0/8"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &xff(&["203.0.113.9, nonsense, 10.0.0.2"]), &nets), ip("10.0.0.2"));
        assert_eq!(client_ip(ip("10.0.0.1"), &xff(&[""]), &nets), ip("10.0.0.1"));
    }

    #[test]
    fn a_fingerprint_header_is_believed_only_well_formed_and_alone() {
        let name = HeaderName::from_static("x-ja4");
        let with = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(&name, value.parse().unwrap_or_else(|_| panic!("bad value {value}")));
            }
            believed_ja4(&headers, &name).map(|ja4| ja4.to_string())
        };
        let ja4 = "t13d1516h2_8daaf6152771_e5627efa2ab1";
        assert_eq!(with(&[ja4]).as_deref(), Some(ja4));
        assert_eq!(with(&[&format!(" {ja4} ")]).as_deref(), Some(ja4));
        assert_eq!(with(&[]), None);
        assert_eq!(with(&[ja4, ja4]), None);
        assert_eq!(with(&["t13d1516h2_8daaf6152771"]), None);
        assert_eq!(with(&["chrome"]), None);
    }

    #[test]
    fn ports_and_mapped_addresses() {
        let nets = trusted(&["127.0.0.1/32"]);
        assert_eq!(client_ip(ip("::ffff:127.0.0.1"), &xff(&["[2001:db8::1]:4711"]), &nets), ip("2001:db8::1"));
        assert_eq!(client_ip(ip("127.0.0.1"), &xff(&["192.0.2.1:80"]), &nets), ip("192.0.2.1"));
        assert_eq!(client_ip(ip("::ffff:192.0.2.5"), &HeaderMap::new(), &[]), ip("192.0.2.5"));
    }
}
