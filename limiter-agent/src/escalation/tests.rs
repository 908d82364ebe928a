use std::{net::IpAddr, path::Path, sync::PoisonError, time::Duration};

use limiter_core::{
    Clock as _, FakeClock,
    limits::{Charge, MemoryStore},
};
use tokio::sync::mpsc;

use super::{BlockRefused, Escalation, Escalator};
use crate::{backend::Backend, config::Config, fleet::Fleet};

/// As [`CONFIG`] says.
const THRESHOLD: usize = 3;
const WINDOW: Duration = Duration::from_secs(10);
const BLOCK_TTL: Duration = Duration::from_secs(60);

/// Escalation past three rejections within ten seconds, an IPv6 allow CIDR narrower
/// than the /64 prefix, and a trusted proxy.
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
window = "10s"
block_ttl = "1m"
"#;

const SOURCE: &str = "203.0.113.9";

/// An escalator on [`CONFIG`] counting in `fleet`'s Redis, or in memory without one,
/// on a clock that moves only when the test advances it.
fn escalator(fleet: Option<Fleet>) -> (Escalator<FakeClock>, FakeClock, mpsc::Receiver<Escalation>) {
    let config = Config::parse(CONFIG, Path::new("test.toml")).expect("config");
    let (sender, receiver) = mpsc::channel(16);
    let clock = FakeClock::new(Duration::from_secs(1_700_000_000));
    (Escalator::new(&config, sender, clock.clone(), fleet), clock, receiver)
}

fn reject(escalator: &Escalator<FakeClock>, source: &str, times: usize) {
    let source: IpAddr = source.parse().expect("address");
    for _ in 0..times {
        escalator.record(source);
    }
}

/// The escalations sent so far: counted in memory, a rejection's is sent before
/// [`Escalator::record`] returns.
fn sent(receiver: &mut mpsc::Receiver<Escalation>) -> Vec<Escalation> {
    std::iter::from_fn(|| receiver.try_recv().ok()).collect()
}

fn block(cidr: &str) -> Escalation {
    Escalation { cidr: cidr.parse().expect("cidr"), ttl: BLOCK_TTL, local: true }
}

/// Rejections `key` may still take in `counts` before it is escalated.
fn remaining(escalator: &Escalator<FakeClock>, counts: &MemoryStore, key: &str) -> u64 {
    let settings = escalator.settings.read().unwrap_or_else(PoisonError::into_inner);
    let bucket = settings.bucket(key).expect("escalation on");
    counts.apply(&[bucket], escalator.clock.now(), Charge::Nothing)[0].before.remaining
}

/// Whether `source`, rejected ten times at once, is escalated.
fn escalated(source: &str) -> bool {
    let (escalator, _clock, mut receiver) = escalator(None);
    reject(&escalator, source, 10);
    !sent(&mut receiver).is_empty()
}

#[test]
fn each_rejection_past_the_threshold_within_the_window_is_escalated() {
    let (escalator, clock, mut receiver) = escalator(None);
    // Three over six seconds: the most the window allows.
    for _ in 0..THRESHOLD {
        reject(&escalator, SOURCE, 1);
        clock.advance(Duration::from_secs(3));
    }
    assert_eq!(sent(&mut receiver), []);
    // The first counts at nine seconds, and still a nanosecond before ten.
    reject(&escalator, SOURCE, 1);
    clock.advance(WINDOW - Duration::from_secs(9) - Duration::from_nanos(1));
    reject(&escalator, SOURCE, 1);
    assert_eq!(sent(&mut receiver), [block("203.0.113.9/32"); 2]);
    // At ten the first has left (the escalated ones were refused, so never counted),
    // and one more fits.
    clock.advance(Duration::from_nanos(1));
    reject(&escalator, SOURCE, 1);
    assert_eq!(sent(&mut receiver), []);
    reject(&escalator, SOURCE, 1);
    assert_eq!(sent(&mut receiver), [block("203.0.113.9/32")]);
}

#[test]
fn rejections_of_a_window_past_are_forgotten() {
    let (escalator, clock, mut receiver) = escalator(None);
    reject(&escalator, SOURCE, THRESHOLD);
    clock.advance(WINDOW);
    reject(&escalator, SOURCE, THRESHOLD);
    assert_eq!(sent(&mut receiver), [], "twice the threshold, but over two windows");
    clock.advance(WINDOW - Duration::from_nanos(1));
    reject(&escalator, SOURCE, 1);
    assert_eq!(sent(&mut receiver), [block("203.0.113.9/32")], "one more within the second window");
}

#[tokio::test]
async fn with_the_fleets_redis_unreachable_this_agents_own_count_decides() {
    // Nothing listens on port 1: each count fails, at once or refused by the backoff.
    let fleet = Fleet::connect("redis://127.0.0.1:1/", "test:", Duration::from_secs(2)).expect("fleet");
    let (escalator, _clock, mut receiver) = escalator(Some(fleet));
    reject(&escalator, SOURCE, THRESHOLD + 1);
    let escalation = tokio::time::timeout(Duration::from_secs(30), receiver.recv()).await.expect("escalated in time");
    assert_eq!(escalation, Some(block("203.0.113.9/32")));
    // Refused because the first three filled this agent's own window.
    let Backend::Redis(counts) = &escalator.counts else { panic!("counted in memory alone") };
    assert_eq!(remaining(&escalator, counts.fallback(), "203.0.113.9/32"), 0);
}

#[test]
fn a_source_sharing_its_prefix_with_a_narrower_allow_cidr_or_a_trusted_proxy_is_never_escalated() {
    assert!(escalated("2001:db8:3::9"), "an ordinary IPv6 source is escalated");
    assert!(escalated(SOURCE), "an ordinary IPv4 source is escalated");
    assert!(!escalated("2001:db8:1::77"), "its /64 holds an allow CIDR");
    assert!(!escalated("2001:db8:2::2"), "its /64 holds a trusted proxy");
    assert!(!escalated("198.51.100.7"), "a trusted proxy");
}

#[test]
fn blocks_wider_than_one_source_or_over_a_protected_address_are_refused() {
    let (escalator, _clock, _receiver) = escalator(None);
    let check = |cidr: &str| {
        let escalation = Escalation { cidr: cidr.parse().expect("cidr"), ttl: Duration::from_secs(1), local: false };
        escalator.admit(escalation).map(|_| ())
    };
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

#[test]
fn a_fleet_block_lasts_no_longer_than_this_agents_block_ttl() {
    let (escalator, _clock, _receiver) = escalator(None);
    let cidr = format!("{SOURCE}/32").parse().expect("cidr");
    let published = |ttl| escalator.admit(Escalation { cidr, ttl, local: false }).expect("admitted").ttl;
    assert_eq!(published(Duration::from_secs(365 * 24 * 3600)), BLOCK_TTL, "a year is cut to block_ttl");
    assert_eq!(published(Duration::from_secs(5)), Duration::from_secs(5), "a shorter block is kept as sent");
}

#[test]
fn a_source_is_blocked_for_the_proxy_from_its_escalation_or_a_fleet_block_until_the_block_lapses() {
    let (escalator, clock, _receiver) = escalator(None);
    let ip = |text: &str| text.parse::<IpAddr>().expect("address");
    reject(&escalator, SOURCE, THRESHOLD);
    assert!(!escalator.blocked(ip(SOURCE)), "up to the threshold");
    reject(&escalator, SOURCE, 1);
    assert!(escalator.blocked(ip(SOURCE)));
    assert!(!escalator.blocked(ip("203.0.113.10")), "its neighbour");
    // A fleet block covers the source's whole /64, whichever address of it connects.
    let fleet =
        Escalation { cidr: "2001:db8:5::/64".parse().expect("cidr"), ttl: Duration::from_secs(5), local: false };
    escalator.admit(fleet).expect("admitted");
    assert!(escalator.blocked(ip("2001:db8:5::77")));
    clock.advance(Duration::from_secs(5));
    assert!(!escalator.blocked(ip("2001:db8:5::77")), "the fleet block lapsed");
    assert!(escalator.blocked(ip(SOURCE)), "block_ttl is a minute");
    clock.advance(BLOCK_TTL);
    assert!(!escalator.blocked(ip(SOURCE)));
}

/// [`CONFIG`] with `[escalation.fingerprint]`: past three refusals within ten
/// seconds, at most three sources.
fn fingerprint_escalator() -> (Escalator<FakeClock>, FakeClock, mpsc::Receiver<Escalation>) {
    let text = format!("{CONFIG}[escalation.fingerprint]\nthreshold = 3\nwindow = \"10s\"\nmax_sources = 3\n");
    let config = Config::parse(&text, Path::new("test.toml")).expect("config");
    let (sender, receiver) = mpsc::channel(16);
    let clock = FakeClock::new(Duration::from_secs(1_700_000_000));
    (Escalator::new(&config, sender, clock.clone(), None), clock, receiver)
}

fn ja4(text: &str) -> limiter_core::ja4::Ja4 {
    text.parse().expect("a fingerprint")
}

#[test]
fn a_fingerprint_past_its_threshold_blocks_its_latest_sources_one_each_never_a_protected_one() {
    let (escalator, clock, mut receiver) = fingerprint_escalator();
    let (bot, browser) = (ja4("t13d1516h2_8daaf6152771_e5627efa2ab1"), ja4("t13d1715h2_5b57614c22b0_3d5424432f57"));
    assert!(escalator.counts_fingerprints());
    let ip = |text: &str| -> IpAddr { text.parse().expect("address") };
    // Seen too long ago, then pushed out by three later ones (max_sources = 3), one of
    // them an allowed address and one a trusted proxy's.
    escalator.presented(bot, ip("192.0.2.1"));
    clock.advance(Duration::from_secs(11));
    escalator.presented(bot, ip("192.0.2.2"));
    escalator.presented(bot, ip("2001:db8:1::5"));
    escalator.presented(bot, ip("198.51.100.7"));
    escalator.presented(bot, ip("::ffff:192.0.2.3"));
    escalator.presented(bot, ip("2001:db8:9::1"));
    escalator.presented(browser, ip("192.0.2.4"));
    for _ in 0..THRESHOLD {
        escalator.record_fingerprint(bot);
    }
    assert!(sent(&mut receiver).is_empty(), "three refusals are not past the threshold of three");
    escalator.record_fingerprint(bot);
    let blocked: Vec<String> = sent(&mut receiver).iter().map(|e| e.cidr.to_string()).collect();
    assert_eq!(blocked, ["192.0.2.3/32", "2001:db8:9::/64"]);
    assert!(escalator.blocked(ip("192.0.2.3")) && !escalator.blocked(ip("192.0.2.4")));
    // Its sources were taken: the next refusal blocks none again.
    escalator.record_fingerprint(bot);
    assert!(sent(&mut receiver).is_empty());
    // Each fingerprint counts on its own.
    escalator.record_fingerprint(browser);
    assert!(sent(&mut receiver).is_empty());
}

#[test]
fn without_its_section_no_fingerprint_is_counted() {
    let (escalator, _clock, mut receiver) = escalator(None);
    let bot = ja4("t13d1516h2_8daaf6152771_e5627efa2ab1");
    assert!(!escalator.counts_fingerprints());
    escalator.presented(bot, "192.0.2.1".parse().expect("address"));
    for _ in 0..10 {
        escalator.record_fingerprint(bot);
    }
    assert!(sent(&mut receiver).is_empty());
}
