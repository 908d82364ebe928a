use std::{net::IpAddr, path::Path, sync::PoisonError, time::Duration};

use ipnet::IpNet;

use limiter_core::{
    Clock as _, FakeClock,
    limits::{Charge, MemoryStore},
};
use tokio::sync::mpsc;

use super::{BlockRefused, Escalation, Escalator, Penalty};
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
    escalator_on(CONFIG, fleet)
}

fn escalator_on(config: &str, fleet: Option<Fleet>) -> (Escalator<FakeClock>, FakeClock, mpsc::Receiver<Escalation>) {
    let config = Config::parse(config, Path::new("test.toml")).expect("config");
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
    Escalation { cidr: cidr.parse().expect("cidr"), penalty: Penalty::Block, ttl: BLOCK_TTL, local: true }
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
    let Backend::Redis(fleetwide) = &escalator.store else { panic!("counted in memory alone") };
    assert_eq!(remaining(&escalator, fleetwide.counts.fallback(), "203.0.113.9/32"), 0);
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
        let escalation = Escalation {
            cidr: cidr.parse().expect("cidr"),
            penalty: Penalty::Block,
            ttl: Duration::from_secs(1),
            local: false,
        };
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
    let published =
        |ttl| escalator.admit(Escalation { cidr, penalty: Penalty::Block, ttl, local: false }).expect("admitted").ttl;
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
    let fleet = Escalation {
        cidr: "2001:db8:5::/64".parse().expect("cidr"),
        penalty: Penalty::Block,
        ttl: Duration::from_secs(5),
        local: false,
    };
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

const MINUTE: Duration = Duration::from_secs(60);

/// [`CONFIG`] with a ladder: 10, 20, 40 minutes, at most an hour, remembered a day;
/// `demote_first` added to it if given.
fn ladder(demote_first: &str) -> String {
    CONFIG.replace(
        "block_ttl = \"1m\"\n",
        &format!(
            "block_ttl = \"10m\"\nblock_ttl_factor = 2\nblock_ttl_max = \"1h\"\noffence_memory = \"1d\"\n{demote_first}"
        ),
    )
}

const DEMOTE_FIRST: &str = "demote_first = { packets_per_second = 20, burst = 40, ttl = \"10m\" }\n";

/// One offence of [`SOURCE`]: its rejections past the threshold, all at once (the
/// rejections in flight past the first crossing are that same offence).
fn offend(escalator: &Escalator<FakeClock>, receiver: &mut mpsc::Receiver<Escalation>) -> Vec<(Penalty, Duration)> {
    reject(escalator, SOURCE, THRESHOLD + 5);
    sent(receiver).into_iter().map(|e| (e.penalty, e.ttl)).collect()
}

#[test]
fn each_offence_within_the_memory_blocks_factor_times_longer_up_to_the_cap() {
    let (escalator, clock, mut receiver) = escalator_on(&ladder(""), None);
    for minutes in [10, 20, 40, 60, 60] {
        assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, minutes * MINUTE)], "{minutes} min");
        // The crossings while blocked are no offence; once it lapses, the next is.
        clock.advance(minutes * MINUTE - Duration::from_secs(1));
        assert_eq!(offend(&escalator, &mut receiver), [], "still blocked");
        clock.advance(Duration::from_secs(1));
    }
    // A day after the last offence, the ladder starts again.
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 10 * MINUTE)]);
}

#[test]
fn with_demote_first_the_first_offence_demotes_and_the_next_blocks() {
    let (escalator, clock, mut receiver) = escalator_on(&ladder(DEMOTE_FIRST), None);
    let demoted = Penalty::Demote(crate::config::xdp::PacketLimit {
        packets_per_second: 20.try_into().expect("nonzero"),
        burst: 40.try_into().expect("nonzero"),
    });
    assert_eq!(offend(&escalator, &mut receiver), [(demoted, 10 * MINUTE)]);
    assert!(!escalator.blocked(SOURCE.parse().expect("address")), "a demoted source is not blocked");
    // Its rejections within the window of the demotion are that offence still.
    clock.advance(WINDOW - Duration::from_nanos(1));
    assert_eq!(offend(&escalator, &mut receiver), []);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 10 * MINUTE)]);
    assert!(escalator.blocked(SOURCE.parse().expect("address")));
    clock.advance(10 * MINUTE);
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 20 * MINUTE)]);
}

#[tokio::test]
async fn unblock_forgets_the_offences_unless_told_to_keep_them() {
    let (escalator, clock, mut receiver) = escalator_on(&ladder(""), None);
    let cidr = format!("{SOURCE}/32").parse().expect("cidr");
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 10 * MINUTE)]);
    escalator.unblocked(cidr, true).await.expect("in memory");
    assert!(!escalator.blocked(SOURCE.parse().expect("address")), "the proxy lets it in again");
    clock.advance(WINDOW);
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 20 * MINUTE)], "history kept");
    escalator.unblocked(cidr, false).await.expect("in memory");
    clock.advance(WINDOW);
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 10 * MINUTE)], "history cleared");
}

#[test]
fn offences_of_a_protected_source_are_never_punished() {
    let (escalator, _clock, mut receiver) = escalator_on(&ladder(DEMOTE_FIRST), None);
    for protected in ["198.51.100.7", "2001:db8:1::77"] {
        escalator.offend(protected.parse().expect("address"));
    }
    assert_eq!(sent(&mut receiver), []);
    escalator.offend(SOURCE.parse().expect("address"));
    assert_eq!(sent(&mut receiver).len(), 1, "an ordinary source is");
}

#[test]
fn a_fleet_penalty_lasts_no_longer_than_this_agents_ladder_gives() {
    let (escalator, _clock, _receiver) = escalator_on(&ladder(DEMOTE_FIRST), None);
    let cidr = format!("{SOURCE}/32").parse().expect("cidr");
    let year = Duration::from_secs(365 * 24 * 3600);
    let admitted = |penalty| escalator.admit(Escalation { cidr, penalty, ttl: year, local: false }).expect("admitted");
    let slow = crate::config::xdp::PacketLimit {
        packets_per_second: 1.try_into().expect("1"),
        burst: 1.try_into().expect("1"),
    };
    assert_eq!(admitted(Penalty::Demote(slow)).ttl, 10 * MINUTE, "demote_first.ttl");
    assert!(!escalator.blocked(SOURCE.parse().expect("address")), "a demotion closes nothing");
    assert_eq!(admitted(Penalty::Block).ttl, 60 * MINUTE, "block_ttl_max");
}

#[test]
fn fleet_messages_of_either_penalty_parse_and_malformed_ones_do_not() {
    let demote = super::parse("demote 203.0.113.9/32 20 40 600000").expect("a demotion");
    assert_eq!((demote.ttl, demote.local), (10 * MINUTE, false));
    assert!(
        matches!(demote.penalty, Penalty::Demote(limit) if limit.packets_per_second.get() == 20 && limit.burst.get() == 40)
    );
    assert_eq!(super::parse("203.0.113.9/32 600000").map(|e| e.penalty), Some(Penalty::Block));
    for bad in
        ["demote 203.0.113.9/32 0 40 600000", "demote 203.0.113.9/32 20 600000", "demote x 20 40 1", "203.0.113.9/32 0"]
    {
        assert_eq!(super::parse(bad), None, "{bad}");
    }
}

#[test]
fn a_reload_puts_a_new_ladder_in_force_at_once() {
    let (escalator, clock, mut receiver) = escalator(None);
    // One rung: each rejection past the threshold is a block of block_ttl, as before.
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, BLOCK_TTL); 5]);
    clock.advance(BLOCK_TTL);
    escalator.reconfigure(&Config::parse(&ladder(""), Path::new("test.toml")).expect("config"));
    // Nothing was remembered under a ladder of one rung: this is a first offence.
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 10 * MINUTE)]);
    clock.advance(10 * MINUTE);
    assert_eq!(offend(&escalator, &mut receiver), [(Penalty::Block, 20 * MINUTE)]);
}

#[test]
fn past_its_bound_the_memory_forgets_the_source_whose_last_offence_is_oldest() {
    use super::ladder::{Histories, Memory};
    let histories = Histories::default();
    let memory = Memory { window: WINDOW, offence_memory: Duration::from_secs(86_400) };
    let source = |i: u32| IpNet::from(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
    let at = |second: u64| Duration::from_secs(second);
    for i in 0..65_536 {
        assert_eq!(histories.offend(source(i), at(u64::from(i)), memory), Some(1));
    }
    // The first offends again: it is now the newest.
    assert_eq!(histories.offend(source(0), at(65_536), memory), Some(2));
    assert_eq!(histories.len(), (65_536, true));
    // A new source takes the place of the one whose last offence is oldest: the second.
    assert_eq!(histories.offend(source(70_000), at(65_636), memory), Some(1));
    assert_eq!(histories.len(), (65_536, true));
    assert_eq!(histories.offend(source(1), at(65_736), memory), Some(1), "forgotten");
    assert_eq!(histories.offend(source(0), at(65_836), memory), Some(3), "remembered");
    histories.forget(source(0));
    assert_eq!(histories.len(), (65_535, true));
}

/// A fingerprint's escalation is an offence of each of its sources: with
/// `demote_first` the first demotes them, the next (within the memory) blocks them,
/// each one source wide.
#[test]
fn a_fingerprints_escalation_climbs_each_sources_ladder() {
    let text =
        format!("{}[escalation.fingerprint]\nthreshold = 3\nwindow = \"10s\"\nmax_sources = 3\n", ladder(DEMOTE_FIRST));
    let (escalator, clock, mut receiver) = escalator_on(&text, None);
    let bot = ja4("t13d1516h2_8daaf6152771_e5627efa2ab1");
    let sources: [IpAddr; 2] = ["192.0.2.5".parse().expect("address"), "192.0.2.6".parse().expect("address")];
    let mut escalate = || {
        for source in sources {
            escalator.presented(bot, source);
        }
        for _ in 0..=THRESHOLD {
            escalator.record_fingerprint(bot);
        }
        sent(&mut receiver).into_iter().map(|e| (e.cidr.to_string(), e.penalty, e.ttl)).collect::<Vec<_>>()
    };
    let first = escalate();
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().all(|(_, penalty, ttl)| matches!(penalty, Penalty::Demote(_)) && *ttl == 10 * MINUTE));
    clock.advance(Duration::from_secs(11));
    assert_eq!(
        escalate(),
        [
            ("192.0.2.5/32".to_owned(), Penalty::Block, 10 * MINUTE),
            ("192.0.2.6/32".to_owned(), Penalty::Block, 10 * MINUTE)
        ]
    );
}
