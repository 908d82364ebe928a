//! Sending a request to the upstream and bringing its response back, as a proxy
//! should: hop-by-hop headers stay on their hop, `X-Forwarded-For` records the peer,
//! `X-JA4` the client's TLS fingerprint.

use std::{net::IpAddr, sync::Arc, time::Duration};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, Version, header, request, uri::PathAndQuery};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use super::{
    body::ProxyBody,
    bounded::{self, BoundedConnector},
    gates::Held,
    keys::X_FORWARDED_FOR,
};
use crate::config::ProxyConfig;
use limiter_core::ja4::Ja4;

/// A dead upstream host must give a quick 502, not hang the client; a refused
/// connection fails at once anyway. Generous enough for a loaded local network.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Pooled connections idle longer than this are closed, below the usual keep-alive
/// timeout of application servers so that we rarely reuse one they are closing.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request did not get an upstream response.
#[derive(Debug, thiserror::Error)]
pub(super) enum ForwardError {
    #[error("cannot build the upstream URI: {0}")]
    Uri(#[from] http::Error),
    #[error("{0}")]
    Client(#[from] hyper_util::client::legacy::Error),
    #[error("the upstream switched protocols unasked")]
    UnaskedUpgrade,
}

impl ForwardError {
    /// Whether no upstream connection was free: `max_upstream_connections` were open.
    pub(super) fn all_in_use(&self) -> bool {
        matches!(self, Self::Client(error) if bounded::all_in_use(error))
    }

    /// Whether the request certainly never reached the upstream: no URI to send it
    /// to, or no connection.
    pub(super) fn never_sent(&self) -> bool {
        match self {
            Self::Uri(_) => true,
            Self::Client(error) => error.is_connect(),
            Self::UnaskedUpgrade => false,
        }
    }
}

/// The upstream's half of an upgraded connection, carried to the server (which holds
/// the client's half) in the extensions of the 101 response, with the places in flight
/// its request holds (a rule's `concurrency`): the tunnel holds them while open.
#[derive(Clone)]
pub(super) struct UpstreamUpgrade {
    pub opened: OnUpgrade,
    pub held: Arc<Held>,
}

/// The upstream client with its connection pool, shared by every request.
#[derive(Debug)]
pub(super) struct Upstream {
    client: Client<BoundedConnector, ProxyBody>,
}

/// Where the request came from, for `X-Forwarded-For`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Origin {
    /// The TCP peer, an IPv4-mapped address as IPv4.
    pub peer: IpAddr,
    /// The peer is a trusted proxy, so the chain it sent is kept.
    pub peer_trusted: bool,
    /// The JA4 fingerprint of the peer's TLS handshake (`[proxy.tls] fingerprint`).
    pub handshake: Option<Ja4>,
}

impl Origin {
    pub(super) fn of(peer: IpAddr, trusted_proxies: &[ipnet::IpNet], handshake: Option<Ja4>) -> Self {
        let peer = peer.to_canonical();
        Self { peer, peer_trusted: super::keys::is_trusted(peer, trusted_proxies), handshake }
    }
}

/// The request's TLS fingerprint, as the upstream is told it: whatever a client sent
/// under this name is removed first.
const X_JA4: &str = "x-ja4";

impl Upstream {
    /// A pool whose connections each hold one of `permits` (shared by every worker).
    pub(super) fn new(permits: std::sync::Arc<tokio::sync::Semaphore>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let connector = BoundedConnector::new(connector, permits);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(POOL_IDLE_TIMEOUT).build(connector);
        Self { client }
    }

    /// Sends the request to `config.upstream`, for `path` (the canonical path) and the
    /// query as received, asking for an upgrade only to `config.upgrade_protocols`,
    /// with its TLS fingerprint `ja4` in `X-JA4`.
    pub(super) async fn send(
        &self,
        config: &ProxyConfig,
        path: &str,
        mut parts: request::Parts,
        body: ProxyBody,
        (origin, ja4): (Origin, Option<Ja4>),
    ) -> Result<Response<ProxyBody>, ForwardError> {
        parts.headers.remove(X_JA4);
        if let Some(value) = ja4.and_then(|ja4| HeaderValue::from_str(ja4.as_str()).ok()) {
            parts.headers.insert(X_JA4, value);
        }
        let chain = origin.peer_trusted.then(|| forwarded_chain(&parts.headers)).flatten();
        if !origin.peer_trusted {
            remove_forwarding_claims(&mut parts.headers);
            // As a balancer's claim, the client's own would pass for ours.
            if let Some(name) = &config.ja4_header {
                parts.headers.remove(name);
            }
        }
        let upgrade = requested_upgrade(&parts, &config.upgrade_protocols);
        remove_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = &upgrade {
            keep_upgrade(&mut parts.headers, protocol.clone());
        }
        set_forwarded_for(&mut parts.headers, chain, origin.peer);
        parts.uri = upstream_uri(&config.upstream, path, parts.uri.query())?;
        // We speak HTTP/1.1 to the upstream whatever the client spoke to us.
        let version = parts.version;
        parts.version = Version::HTTP_11;
        let mut response = self.client.request(Request::from_parts(parts, body)).await?;
        let opened = if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if upgrade.is_none() {
                return Err(ForwardError::UnaskedUpgrade);
            }
            Some(UpstreamUpgrade { opened: hyper::upgrade::on(&mut response), held: Arc::default() })
        } else {
            None
        };
        let (mut parts, body) = response.into_parts();
        let protocol = parts.headers.get(header::UPGRADE).cloned();
        remove_hop_by_hop(&mut parts.headers);
        if let Some(opened) = opened {
            if let Some(protocol) = protocol {
                keep_upgrade(&mut parts.headers, protocol);
            }
            parts.extensions.insert(opened);
        }
        // Towards the client in its own HTTP/2 or else 1.1: an HTTP/1.0 upstream must
        // not make hyper answer our client in 1.0 (and close its keep-alive connection).
        parts.version = if version == Version::HTTP_2 { Version::HTTP_2 } else { Version::HTTP_11 };
        Ok(Response::from_parts(parts, body.map_err(Into::into).boxed()))
    }
}

fn upstream_uri(base: &Uri, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
    let target = match query {
        Some(query) => PathAndQuery::try_from(format!("{path}?{query}"))?,
        None => PathAndQuery::try_from(path)?,
    };
    let mut uri = Uri::builder().path_and_query(target);
    if let Some(scheme) = base.scheme() {
        uri = uri.scheme(scheme.clone());
    }
    if let Some(authority) = base.authority() {
        uri = uri.authority(authority.clone());
    }
    uri.build()
}

/// The headers of one connection that are hop-by-hop whatever `Connection` says.
const HOP_BY_HOP: [header::HeaderName; 5] =
    [header::CONNECTION, header::TE, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE];

/// Removes the headers that describe one connection rather than the message (RFC 9110
/// §7.6.1): the fixed list, any `Proxy-*`, and whatever `Connection` names.
pub(super) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages have none: one pass over their names is cheaper than a lookup
    // for each name that could be there. `Connection` names others only if present.
    let any = headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(name) || name.as_str() == "keep-alive" || name.as_str().starts_with("proxy-"));
    if !any {
        return;
    }
    for name in connection_options(headers) {
        headers.remove(name.as_str());
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    let proxy_headers: Vec<_> = headers.keys().filter(|name| name.as_str().starts_with("proxy-")).cloned().collect();
    for name in proxy_headers {
        headers.remove(name);
    }
}

/// What `Connection` names, in lower case: headers of this hop, or `upgrade`.
fn connection_options(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The protocols of those an HTTP/1.1 request asks to switch to (`Connection:
/// upgrade` and `Upgrade`) that `allowed` names, which hop-by-hop removal would
/// otherwise drop; `None` where it asks for none of them.
fn requested_upgrade(parts: &request::Parts, allowed: &[String]) -> Option<HeaderValue> {
    let asks = connection_options(&parts.headers).iter().any(|option| option == "upgrade");
    if parts.version != Version::HTTP_11 || !asks {
        return None;
    }
    let offered = parts.headers.get_all(header::UPGRADE).iter().filter_map(|value| value.to_str().ok());
    let kept: Vec<&str> = offered
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|protocol| {
            let name = protocol.split_once('/').map_or(*protocol, |(name, _version)| name);
            allowed.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
        })
        .collect();
    if kept.is_empty() { None } else { HeaderValue::from_str(&kept.join(", ")).ok() }
}

fn keep_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::UPGRADE, protocol);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// What a proxy in front of us says about the client, other than `X-Forwarded-For`
/// (which [`set_forwarded_for`] rewrites): from a client that is not a trusted proxy
/// these are its own claims, which an upstream trusting us would take as ours (its
/// address, or the scheme and host it links and redirects to).
const FORWARDING_CLAIMS: [&str; 4] = ["forwarded", "x-real-ip", "x-forwarded-proto", "x-forwarded-host"];

fn remove_forwarding_claims(headers: &mut HeaderMap) {
    for name in FORWARDING_CLAIMS {
        headers.remove(name);
    }
}

/// The `X-Forwarded-For` chain as received, joined into one list.
fn forwarded_chain(headers: &HeaderMap) -> Option<String> {
    let values: Vec<&str> = headers.get_all(X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok()).collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// `X-Forwarded-For: <chain>, <peer>`. From an untrusted peer the chain it sent is
/// dropped: passing it on would let any client put words in our mouth towards an
/// upstream that trusts us.
fn set_forwarded_for(headers: &mut HeaderMap, chain: Option<String>, peer: IpAddr) {
    let value = match chain {
        Some(chain) => format!("{chain}, {peer}"),
        None => peer.to_string(),
    };
    headers.remove(X_FORWARDED_FOR);
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(X_FORWARDED_FOR, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::try_from(*name).unwrap_or_else(|_| panic!("bad name {name}")),
                HeaderValue::try_from(*value).unwrap_or_else(|_| panic!("bad value {value}")),
            );
        }
        map
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut map = headers(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-secret", "1"),
            ("x-kept", "1"),
            ("content-length", "4"),
        ]);
        remove_hop_by_hop(&mut map);
        let left: Vec<&str> = map.keys().map(http::HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept", "content-length"]);
    }

    /// Each alone, so that the pass that looks for any of them must see every one.
    #[test]
    fn each_hop_by_hop_header_is_removed_alone() {
        for name in ["connection", "keep-alive", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"]
        {
            let mut map = headers(&[(name, "x"), ("x-kept", "1")]);
            remove_hop_by_hop(&mut map);
            let left: Vec<&str> = map.keys().map(http::HeaderName::as_str).collect();
            assert_eq!(left, ["x-kept"], "{name}");
        }
        let mut map = headers(&[("host", "a"), ("x-kept", "1")]);
        remove_hop_by_hop(&mut map);
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn forwarded_for_keeps_a_trusted_chain_only() {
        let peer: IpAddr = [192, 0, 2, 1].into();
        let mut map = headers(&[("x-forwarded-for", "203.0.113.9"), ("x-forwarded-for", "10.0.0.2")]);
        let chain = forwarded_chain(&map);
        set_forwarded_for(&mut map, chain, peer);
        assert_eq!(map.get_all(X_FORWARDED_FOR).iter().collect::<Vec<_>>(), ["203.0.113.9, 10.0.0.2, 192.0.2.1"]);
        set_forwarded_for(&mut map, None, peer);
        assert_eq!(map.get_all(X_FORWARDED_FOR).iter().collect::<Vec<_>>(), ["192.0.2.1"]);
    }

    #[test]
    fn forwarding_claims_are_removed() {
        let mut map = headers(&[
            ("forwarded", "for=203.0.113.9;proto=https"),
            ("x-real-ip", "203.0.113.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "bank.example"),
            ("x-kept", "1"),
        ]);
        remove_forwarding_claims(&mut map);
        let left: Vec<&str> = map.keys().map(http::HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn upstream_uri_takes_the_path_and_the_query() -> Result<(), http::Error> {
        let base: Uri = "http://127.0.0.1:3000".parse()?;
        assert_eq!(upstream_uri(&base, "/a/b", Some("c=d"))?, "http://127.0.0.1:3000/a/b?c=d");
        assert_eq!(upstream_uri(&base, "/x", None)?, "http://127.0.0.1:3000/x");
        assert_eq!(upstream_uri(&base, "/x", Some(""))?, "http://127.0.0.1:3000/x?");
        Ok(())
    }
}
