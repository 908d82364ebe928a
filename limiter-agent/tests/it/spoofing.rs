//! The kernel layer against spoofed sources, through `BPF_PROG_TEST_RUN`: the
//! new-source budget, prefix aggregates, verified sources and the SYN budget.
//! Needs root.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use limiter::xdp::source_key;
use limiter_common::{
    addr::v4_mapped,
    counters::Counter,
    maps::{BUDGET_NEW_SOURCES, BUDGET_SYN, SourceKey},
};
use limiter_lab::support::{
    frames::{ETH_P_IPV4, ETH_P_IPV6, ethernet, extension, ipv4, ipv6, udp4, udp6},
    kernel::{TestKernel, xdp_config},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// Rates of 1 per second: nothing refills while a test runs, so counts are exact.
const SLOW: &str = "[xdp.limit]\npackets_per_second = 1\nburst = 3\n";

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

fn v4(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, last)
}

fn key(ip: impl Into<IpAddr>) -> SourceKey {
    source_key(ip.into(), 64)
}

/// A TCP-over-IPv4 frame from `source` with `flags`.
fn tcp4(source: Ipv4Addr, flags: u8) -> Vec<u8> {
    let mut packet = ipv4(source, 0);
    packet[9] = 6;
    packet.truncate(20);
    packet.extend_from_slice(&tcp_header(flags));
    packet[2..4].copy_from_slice(&40u16.to_be_bytes());
    ethernet(ETH_P_IPV4, &packet)
}

/// A TCP segment header with `flags`, no options.
fn tcp_header(flags: u8) -> [u8; 20] {
    let mut header = [0u8; 20];
    header[12] = 5 << 4;
    header[13] = flags;
    header
}

fn verdicts(kernel: &TestKernel, frame: &[u8], times: usize) -> Vec<u32> {
    (0..times).map(|_| kernel.run(frame)).collect()
}

#[test]
fn an_unknown_source_finding_the_budget_empty_is_dropped_and_not_inserted() {
    let kernel = TestKernel::new(&xdp_config(&format!("{SLOW}[xdp.new_sources]\npackets_per_second = 1\nburst = 2\n")));
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_PASS);
    assert_eq!(kernel.run(&udp4(v4(2))), XDP_PASS);
    assert_eq!(verdicts(&kernel, &udp4(v4(3)), 3), [XDP_DROP; 3], "the budget of 2 is spent");
    assert_eq!(kernel.counters(), [("passed", 2), ("new_sources", 2), ("dropped_new_source", 3)]);
    assert!(kernel.kernel.maps().source(&key(v4(3))).is_none(), "a refused source must not reach the map");
    assert_eq!(kernel.kernel.maps().sources().count(), 2);
    let budget = kernel.kernel.maps().budget(BUDGET_NEW_SOURCES).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (5, 3));
}

#[test]
fn a_known_source_is_unaffected_by_an_empty_budget() {
    let kernel = TestKernel::new(&xdp_config(&format!("{SLOW}[xdp.new_sources]\npackets_per_second = 1\nburst = 1\n")));
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_PASS);
    assert_eq!(kernel.run(&udp4(v4(2))), XDP_DROP, "budget spent");
    // Its own bucket of 3 still decides: two more, then the rate limit.
    assert_eq!(verdicts(&kernel, &udp4(v4(1)), 3), [XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(
        kernel.counters(),
        [("passed", 3), ("dropped_rate_limit", 1), ("new_sources", 1), ("dropped_new_source", 1)]
    );
}

#[test]
fn a_verified_source_skips_the_budget_and_the_aggregate_but_not_its_own_bucket() {
    let mut kernel = TestKernel::new(&xdp_config(&format!(
        "{SLOW}[xdp.new_sources]\npackets_per_second = 1\nburst = 1\n\
         [xdp.aggregate]\npackets_per_second = 1\nburst = 1\n"
    )));
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_PASS, "takes the budget and the /24's token");
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_DROP, "the /24's aggregate is empty");
    assert_eq!(kernel.run(&udp4(v4(2))), XDP_DROP, "the budget is empty");
    assert_eq!(
        kernel
            .kernel
            .maps_mut()
            .verify("192.0.2.2/32".parse().expect("cidr"), Duration::from_secs(60))
            .expect("verify"),
        1
    );
    assert!(kernel.kernel.maps().is_verified(&key(v4(2))));
    assert_eq!(verdicts(&kernel, &udp4(v4(2)), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP], "its own burst of 3");
    assert_eq!(
        kernel.counters(),
        [
            ("passed", 4),
            ("dropped_rate_limit", 1),
            ("new_sources", 2),
            ("dropped_new_source", 1),
            ("dropped_aggregate", 1)
        ]
    );
    let prefix = SourceKey { addr: v4_mapped([192, 0, 2, 0]) };
    let aggregate = kernel.kernel.maps().aggregate(&prefix).expect("the /24 is tracked");
    assert_eq!((aggregate.packets, aggregate.dropped), (2, 1), "the verified source never charged it");
    assert_eq!(kernel.kernel.maps_mut().unverify("192.0.2.0/24".parse().expect("cidr")).expect("unverify"), 1);
    assert!(!kernel.kernel.maps().is_verified(&key(v4(2))));
}

#[test]
fn two_sources_in_one_24_share_its_aggregate() {
    let kernel = TestKernel::new(&xdp_config(&format!("{SLOW}[xdp.aggregate]\npackets_per_second = 1\nburst = 3\n")));
    assert_eq!(verdicts(&kernel, &udp4(v4(1)), 2), [XDP_PASS; 2]);
    assert_eq!(verdicts(&kernel, &udp4(v4(200)), 2), [XDP_PASS, XDP_DROP], "the /24 has had its 3");
    assert_eq!(verdicts(&kernel, &udp4(Ipv4Addr::new(192, 0, 3, 1)), 3), [XDP_PASS; 3], "another /24");
    assert_eq!(kernel.counters(), [("passed", 6), ("new_sources", 3), ("dropped_aggregate", 1)]);
    assert_eq!(kernel.kernel.maps().aggregates().count(), 2);
}

#[test]
fn ipv6_sources_share_an_aggregate_per_48() {
    let kernel = TestKernel::new(&xdp_config(&format!("{SLOW}[xdp.aggregate]\npackets_per_second = 1\nburst = 3\n")));
    let a: Ipv6Addr = "2001:db8:1:1::1".parse().expect("addr");
    let b: Ipv6Addr = "2001:db8:1:ff::1".parse().expect("addr");
    let other: Ipv6Addr = "2001:db8:2::1".parse().expect("addr");
    assert_eq!(verdicts(&kernel, &udp6(a), 2), [XDP_PASS; 2]);
    assert_eq!(verdicts(&kernel, &udp6(b), 2), [XDP_PASS, XDP_DROP], "two /64s, one /48");
    assert_eq!(verdicts(&kernel, &udp6(other), 3), [XDP_PASS; 3]);
    assert_eq!(kernel.counters(), [("passed", 6), ("new_sources", 3), ("dropped_aggregate", 1)]);
    let prefix = SourceKey { addr: "2001:db8:1::".parse::<Ipv6Addr>().expect("addr").octets() };
    assert_eq!(kernel.kernel.maps().aggregate(&prefix).map(|s| (s.packets, s.dropped)), Some((4, 1)));
}

#[test]
fn a_rule_sets_its_own_aggregate() {
    let kernel = TestKernel::new(&xdp_config(&format!(
        "{SLOW}[[xdp.cidr]]\ncidr = \"192.0.2.0/24\"\naction = \"limit\"\npackets_per_second = 1\nburst = 5\n\
         aggregate_packets_per_second = 1\naggregate_burst = 2\n"
    )));
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_PASS);
    assert_eq!(verdicts(&kernel, &udp4(v4(2)), 2), [XDP_PASS, XDP_DROP], "the rule's /24 aggregate of 2");
    assert_eq!(verdicts(&kernel, &udp4(Ipv4Addr::new(198, 51, 100, 1)), 3), [XDP_PASS; 3], "no aggregate outside");
    assert_eq!(kernel.counters(), [("passed", 5), ("new_sources", 3), ("dropped_aggregate", 1)]);
}

#[test]
fn syns_from_unverified_sources_take_from_the_syn_budget() {
    let mut kernel = TestKernel::new(&xdp_config(
        "[xdp.limit]\npackets_per_second = 1\nburst = 100\n[xdp.syn]\npackets_per_second = 1\nburst = 2\n",
    ));
    assert_eq!(verdicts(&kernel, &tcp4(v4(1), TCP_SYN), 3), [XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(kernel.run(&tcp4(v4(2), TCP_SYN)), XDP_DROP, "the budget is global");
    assert_eq!(verdicts(&kernel, &tcp4(v4(2), TCP_SYN | TCP_ACK), 2), [XDP_PASS; 2], "a SYN-ACK opens nothing");
    assert_eq!(verdicts(&kernel, &tcp4(v4(2), TCP_ACK), 2), [XDP_PASS; 2]);
    kernel.kernel.maps_mut().verify("192.0.2.3/32".parse().expect("cidr"), Duration::from_secs(60)).expect("verify");
    assert_eq!(verdicts(&kernel, &tcp4(v4(3), TCP_SYN), 3), [XDP_PASS; 3], "verified sources skip it");
    assert_eq!(kernel.counters(), [("passed", 9), ("new_sources", 3), ("dropped_syn", 2)]);
    let budget = kernel.kernel.maps().budget(BUDGET_SYN).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (4, 2));
}

#[test]
fn ipv6_syns_are_found_behind_extension_headers() {
    let kernel = TestKernel::new(&xdp_config(
        "[xdp.limit]\npackets_per_second = 1\nburst = 100\n[xdp.syn]\npackets_per_second = 1\nburst = 1\n",
    ));
    let source: Ipv6Addr = "2001:db8::5".parse().expect("addr");
    let syn = ethernet(ETH_P_IPV6, &ipv6(source, 6, 64, &tcp_header(TCP_SYN)));
    let mut behind_options = extension(6).to_vec();
    behind_options.extend_from_slice(&tcp_header(TCP_SYN));
    let hidden = ethernet(ETH_P_IPV6, &ipv6(source, 60, 64, &behind_options));
    let ack = ethernet(ETH_P_IPV6, &ipv6(source, 6, 64, &tcp_header(TCP_ACK)));
    assert_eq!(kernel.run(&syn), XDP_PASS);
    assert_eq!(kernel.run(&hidden), XDP_DROP, "a destination-options header does not hide a SYN");
    assert_eq!(kernel.run(&ack), XDP_PASS);
    assert_eq!(kernel.counters(), [("passed", 2), ("new_sources", 1), ("dropped_syn", 1)]);
}

/// The attack: a heavy hitter empties its bucket, then a flood of spoofed sources
/// churns the LRU until the heavy hitter's bucket is evicted and it comes back with
/// a full one. Each spoofed source sends twice: the kernel's LRU keeps a bucket that
/// was looked up since its insert on its active list, so sources seen twice push
/// out the heavy hitter where one-packet sources would only push out each other.
/// With the budget the flood never reaches the map.
#[test]
fn a_dropped_heavy_hitter_stays_dropped_through_a_spoofed_flood() {
    const FLOOD: u32 = 4_096;
    let heavy = Ipv4Addr::new(198, 51, 100, 7);
    let spoofed = |i: u32| udp4(Ipv4Addr::from(0x0a00_0000 + i));
    let run_attack = |budget: &str| {
        let kernel = TestKernel::new(&xdp_config(&format!("max_sources = 256\n{SLOW}{budget}")));
        assert_eq!(verdicts(&kernel, &udp4(heavy), 4).last(), Some(&XDP_DROP), "the heavy hitter's bucket is empty");
        for i in 0..FLOOD {
            kernel.run(&spoofed(i));
            kernel.run(&spoofed(i));
        }
        let after = kernel.run(&udp4(heavy));
        (after, kernel.kernel.maps().source(&key(heavy)), kernel.counters())
    };

    let (after, state, _) = run_attack("");
    assert_eq!((after, state.map(|s| s.packets)), (XDP_PASS, Some(1)), "without a budget the churn refills it");

    let (after, state, counters) = run_attack("[xdp.new_sources]\npackets_per_second = 1\nburst = 16\n");
    assert_eq!(after, XDP_DROP, "still dropped");
    assert_eq!(state.map(|s| (s.packets, s.dropped)), Some((5, 2)), "the same bucket, not a fresh one");
    // The heavy hitter took one of the 16 tokens; the 15 spoofed sources admitted
    // send their second packet as known sources.
    assert!(counters.contains(&("dropped_new_source", 2 * u64::from(FLOOD) - 30)), "{counters:?}");
}

/// Two CPUs admitting new sources at once take exactly the budget: each thread
/// sends its own sources, so every packet asks the one global bucket.
#[test]
fn the_new_source_budget_is_exact_under_two_cpus() {
    const BUDGET: u64 = 2_000;
    const PER_THREAD: u32 = 6_000;
    let kernel =
        TestKernel::new(&xdp_config(&format!("{SLOW}[xdp.new_sources]\npackets_per_second = 1\nburst = {BUDGET}\n")));
    let frames: [Vec<Vec<u8>>; 2] =
        [0u32, 1].map(|t| (0..PER_THREAD).map(|i| udp4(Ipv4Addr::from(0x0a00_0000 + (t << 20) + i))).collect());
    let start_together = std::sync::Barrier::new(2);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for frames in &frames {
            let (kernel, start_together) = (&kernel, &start_together);
            scope.spawn(move || {
                start_together.wait();
                for frame in frames {
                    kernel.run(frame);
                }
            });
        }
    });
    let refill = started.elapsed().as_secs().saturating_add(1);
    let admitted = kernel.counter(Counter::NewSources);
    assert!((BUDGET..=BUDGET + refill).contains(&admitted), "admitted {admitted} new sources, budget {BUDGET}");
    assert_eq!(kernel.counter(Counter::DroppedNewSource), 2 * u64::from(PER_THREAD) - admitted);
    assert_eq!(kernel.kernel.maps().sources().count() as u64, admitted);
}

/// The SYN budget (the same global-bucket code as the new-source budget) under two
/// CPUs hammering it in-kernel, where any lost update would admit extra packets.
#[test]
fn a_global_budget_is_exact_under_two_cpus_hammering_it() {
    const BURST: u64 = 1_000_000;
    const REPEAT: u32 = 1_000_000;
    let kernel = TestKernel::new(&xdp_config(&format!(
        "[xdp.limit]\npackets_per_second = 1000000000\nburst = 4000000000\n\
         [xdp.syn]\npackets_per_second = 1\nburst = {BURST}\n"
    )));
    let refill = kernel.run_on_two_cpus(&tcp4(v4(1), TCP_SYN), REPEAT).as_secs().saturating_add(1);
    let budget = kernel.kernel.maps().budget(BUDGET_SYN).expect("budget");
    assert_eq!(budget.packets, 2 * u64::from(REPEAT));
    let admitted = budget.packets - budget.dropped;
    assert!((BURST..=BURST + refill).contains(&admitted), "admitted {admitted}, budget {BURST}");
}

#[test]
fn reloading_keeps_the_budget_where_it_was() {
    let budget = "[xdp.new_sources]\npackets_per_second = 1\nburst = 1\n";
    let mut kernel = TestKernel::new(&xdp_config(&format!("{SLOW}{budget}")));
    assert_eq!(kernel.run(&udp4(v4(1))), XDP_PASS);
    let reloaded = xdp_config(&format!("[xdp.limit]\npackets_per_second = 1\nburst = 5\n{budget}"));
    kernel.kernel.maps_mut().apply(&reloaded).expect("apply");
    assert_eq!(kernel.run(&udp4(v4(2))), XDP_DROP, "a reload does not refill the budget");
    assert_eq!(verdicts(&kernel, &udp4(v4(1)), 5).iter().filter(|v| **v == XDP_PASS).count(), 4, "new burst of 5");
}
