use std::{net::IpAddr, path::Path};

use tokio::sync::mpsc;

use super::{BlockRefused, Escalator};
use crate::config::Config;

/// Escalation after three rejections, an IPv6 allow CIDR narrower than the /64
/// prefix, and a trusted proxy.
const CONFIG: &str = r#"
[xdp]
interfaces = ["eth0"]
[xdp.limit]
packets_per_second = 10
burst = 20
[[xdp.cidr]]
cidr = "2001:db8:1::5/128"
action = "allow"
[proxy]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:1"
trusted_proxies = ["2001:db8:2::1/128", "198.51.100.7/32"]
[escalation]
threshold = 3
window = "1m"
block_ttl = "1m"
"#;

fn escalator() -> (Escalator, mpsc::Receiver<super::Escalation>) {
    let config = Config::parse(CONFIG, Path::new("test.toml")).expect("config");
    let (sender, receiver) = mpsc::channel(16);
    (Escalator::new(&config, sender), receiver)
}

/// Whether `source`, rejected ten times, is escalated.
fn escalated(source: &str) -> bool {
    let (escalator, mut receiver) = escalator();
    let source: IpAddr = source.parse().expect("address");
    for _ in 0..10 {
        escalator.record(source);
    }
    receiver.try_recv().is_ok()
}

#[test]
fn a_source_sharing_its_prefix_with_a_narrower_allow_cidr_or_a_trusted_proxy_is_never_escalated() {
    assert!(escalated("2001:db8:3::9"), "an ordinary IPv6 source is escalated");
    assert!(escalated("203.0.113.9"), "an ordinary IPv4 source is escalated");
    assert!(!escalated("2001:db8:1::77"), "its /64 holds an allow CIDR");
    assert!(!escalated("2001:db8:2::2"), "its /64 holds a trusted proxy");
    assert!(!escalated("198.51.100.7"), "a trusted proxy");
}

#[test]
fn blocks_wider_than_one_source_or_over_a_protected_address_are_refused() {
    let (escalator, _receiver) = escalator();
    let check = |cidr: &str| escalator.check(cidr.parse().expect("cidr"));
    assert_eq!(check("203.0.113.9/32"), Ok(()));
    assert_eq!(check("2001:db8:3::/64"), Ok(()));
    for wide in ["0.0.0.0/0", "::/0", "203.0.113.0/24", "2001:db8:3::/48", "2001:db8:3::/96", "::ffff:0.0.0.0/96"] {
        assert!(matches!(check(wide), Err(BlockRefused::NotOneSource(_))), "{wide}");
    }
    // Not truncated to its prefix: another name for a /64 the kernel tracks whole.
    assert!(matches!(check("2001:db8:3::1/64"), Err(BlockRefused::NotOneSource(_))));
    for protected in ["2001:db8:1::/64", "2001:db8:2::/64", "198.51.100.7/32"] {
        assert!(matches!(check(protected), Err(BlockRefused::Protected(..))), "{protected}");
    }
}
