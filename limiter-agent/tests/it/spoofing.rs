//! The kernel layer against spoofed sources, through `BPF_PROG_TEST_RUN`: the
//! new-source budget, prefix aggregates, verified sources, the SYN budget and each
//! source's share of it, tiny first fragments and IPv4-mapped IPv6 sources.
//! Needs root.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use limiter::{
    config::Config,
    xdp::{Verifier, source_key},
};
use limiter_common::{
    addr::v4_mapped,
    counters::Counter,
    maps::{BUDGET_NEW_SOURCES, BUDGET_SYN, SourceKey},
};
use limiter_lab::support::{
    frames::{
        self, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_SYN, ethernet, extension, ipv6,
        tcp4 as tcp4_to, udp4, udp6,
    },
    kernel::{TestKernel, xdp_config},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// Rates of 1 per second: nothing refills while a test runs, so counts are exact.
const SLOW: &str = "[xdp.limit]\npackets_per_second = 1\nburst = 3\n";

fn v4(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, last)
}

fn key(ip: impl Into<IpAddr>) -> SourceKey {
    source_key(ip.into(), 64)
}

/// The port the SYN budget covers in these tests, when it covers one.
const SERVED: u16 = 443;

/// A TCP-over-IPv4 frame from `source` with `flags`, to port [`SERVED`].
fn tcp4(source: Ipv4Addr, flags: u8) -> Vec<u8> {
    tcp4_to(source, flags, SERVED)
}

/// An IPv4 packet from `source` carrying `tcp` (all of it, or the first fragment
/// of more when `fragment_field` sets "more fragments").
fn ipv4_carrying(source: Ipv4Addr, tcp: &[u8], fragment_field: u16) -> Vec<u8> {
    let mut packet = frames::ipv4_carrying(source, IPPROTO_TCP, tcp);
    packet[6..8].copy_from_slice(&fragment_field.to_be_bytes());
    packet
}

/// A TCP segment header with `flags`, no options, to port 0.
fn tcp_header(flags: u8) -> [u8; 20] {
    frames::tcp_header(flags, 0)
}

/// The SYN budget of `burst` (1 per second), each source's share of it far larger:
/// the budget alone decides.
fn syn_budget(burst: u32) -> String {
    format!(
        "[xdp.syn]\npackets_per_second = 1\nburst = {burst}\nper_source_packets_per_second = 1\n\
         per_source_burst = 1000\n"
    )
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
    let mut kernel =
        TestKernel::new(&xdp_config(&format!("[xdp.limit]\npackets_per_second = 1\nburst = 100\n{}", syn_budget(2))));
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
    let kernel =
        TestKernel::new(&xdp_config(&format!("[xdp.limit]\npackets_per_second = 1\nburst = 100\n{}", syn_budget(1))));
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
         [xdp.syn]\npackets_per_second = 1\nburst = {BURST}\n\
         per_source_packets_per_second = 1000000000\nper_source_burst = 4000000000\n"
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
    kernel.kernel.maps_mut().apply(&reloaded, None).expect("apply");
    assert_eq!(kernel.run(&udp4(v4(2))), XDP_DROP, "a reload does not refill the budget");
    assert_eq!(verdicts(&kernel, &udp4(v4(1)), 5).iter().filter(|v| **v == XDP_PASS).count(), 4, "new burst of 5");
}

/// The attack: one source floods SYNs past its own limit. Its bucket refuses the
/// surplus before the SYN budget is asked, so the budget keeps its tokens for others
/// (before, every SYN took one first, and the flood emptied it).
#[test]
fn a_syn_its_own_bucket_refuses_takes_nothing_from_the_syn_budget() {
    let kernel = TestKernel::new(&xdp_config(&format!("{SLOW}{}", syn_budget(5))));
    assert_eq!(
        verdicts(&kernel, &tcp4(v4(1), TCP_SYN), 6),
        [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP, XDP_DROP, XDP_DROP]
    );
    let budget = kernel.kernel.maps().budget(BUDGET_SYN).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (3, 0), "only the SYNs its bucket admitted asked the budget");
    assert_eq!(verdicts(&kernel, &tcp4(v4(2), TCP_SYN), 2), [XDP_PASS; 2], "the budget's last two tokens");
    assert_eq!(kernel.counters(), [("passed", 5), ("dropped_rate_limit", 3), ("new_sources", 2)]);
}

/// The attack: `hping3 -S -p 22 --flood` from one real address, at a host whose
/// proxy listens on 443. SYNs to other ports are charged to their source's bucket
/// like any packet; only those to the served port take from the budget.
#[test]
fn syns_to_a_port_the_host_does_not_serve_leave_the_syn_budget_alone() {
    let config = format!("[xdp.limit]\npackets_per_second = 1\nburst = 8\n{}ports = [{SERVED}, 8443]\n", syn_budget(2));
    let kernel = TestKernel::new(&xdp_config(&config));
    let mut expected = vec![XDP_PASS; 8];
    expected.extend([XDP_DROP; 2]);
    assert_eq!(verdicts(&kernel, &tcp4_to(v4(1), TCP_SYN, 22), 10), expected, "its own bucket of 8");
    let budget = kernel.kernel.maps().budget(BUDGET_SYN).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (0, 0), "SYNs to port 22 never asked the budget");
    assert_eq!(kernel.run(&tcp4_to(v4(2), TCP_SYN, 8443)), XDP_PASS);
    assert_eq!(kernel.run(&tcp4_to(v4(3), TCP_SYN, SERVED)), XDP_PASS);
    assert_eq!(kernel.run(&tcp4_to(v4(4), TCP_SYN, SERVED)), XDP_DROP, "the budget of 2 covers both served ports");
    assert_eq!(kernel.counters(), [("passed", 10), ("dropped_rate_limit", 2), ("new_sources", 4), ("dropped_syn", 1)]);

    // Without `ports` and without a proxy, every port is served.
    let every =
        TestKernel::new(&xdp_config(&format!("[xdp.limit]\npackets_per_second = 1\nburst = 8\n{}", syn_budget(2))));
    assert_eq!(verdicts(&every, &tcp4_to(v4(1), TCP_SYN, 22), 3), [XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(every.counter(Counter::DroppedSyn), 1);
}

/// With a proxy and no `ports`, the budget covers the proxy's listen port.
#[test]
fn the_syn_budget_covers_the_proxys_port_by_default() {
    let text = format!(
        "[xdp]\ninterfaces = []\n[xdp.limit]\npackets_per_second = 1\nburst = 8\n{}\
         [proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9\"\n",
        syn_budget(1)
    );
    let config = Config::parse(&text, "test.toml".as_ref()).expect("config");
    let (xdp, proxy) = (config.xdp.expect("xdp"), config.proxy.expect("proxy"));
    let mut kernel = TestKernel::new(&xdp);
    kernel.kernel.maps_mut().apply(&xdp, Some(&proxy)).expect("apply with the proxy");
    assert_eq!(verdicts(&kernel, &tcp4_to(v4(1), TCP_SYN, 443), 3), [XDP_PASS; 3], "not the proxy's port");
    assert_eq!(kernel.run(&tcp4_to(v4(2), TCP_SYN, 8080)), XDP_PASS);
    assert_eq!(kernel.run(&tcp4_to(v4(3), TCP_SYN, 8080)), XDP_DROP);
    assert_eq!(kernel.counters(), [("passed", 4), ("new_sources", 3), ("dropped_syn", 1)]);
}

/// The attack: one unverified source sends SYNs as fast as its bucket lets it. It
/// takes its share, and the rest of the budget stays for the others.
#[test]
fn one_source_takes_only_its_share_of_the_syn_budget() {
    let kernel = TestKernel::new(&xdp_config(
        "[xdp.limit]\npackets_per_second = 1\nburst = 100\n[xdp.syn]\npackets_per_second = 1\nburst = 5\n\
         per_source_packets_per_second = 1\nper_source_burst = 3\n",
    ));
    assert_eq!(verdicts(&kernel, &tcp4(v4(1), TCP_SYN), 5), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP, XDP_DROP]);
    assert_eq!(verdicts(&kernel, &tcp4(v4(2), TCP_SYN), 3), [XDP_PASS, XDP_PASS, XDP_DROP], "the budget's other 2");
    assert_eq!(kernel.counters(), [("passed", 5), ("new_sources", 2), ("dropped_syn", 1), ("dropped_syn_share", 2)]);
    let budget = kernel.kernel.maps().budget(BUDGET_SYN).expect("budget");
    assert_eq!((budget.packets, budget.dropped), (6, 1), "SYNs beyond the share never asked the budget");

    // By default a source's share is a tenth of the budget: 2 of 20.
    let default = TestKernel::new(&xdp_config(
        "[xdp.limit]\npackets_per_second = 1\nburst = 100\n[xdp.syn]\npackets_per_second = 1\nburst = 20\n",
    ));
    assert_eq!(verdicts(&default, &tcp4(v4(1), TCP_SYN), 3), [XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(default.counter(Counter::DroppedSynShare), 1);
}

/// The attack: a SYN split so that its first fragment holds only the ports and the
/// sequence number (8 bytes), padded to Ethernet's minimum with zeros, which read
/// as "no flags". Reassembled, it opens a handshake, so it is charged as a SYN to a
/// served port; a whole segment that short opens nothing and is not.
#[test]
fn a_first_fragment_too_short_for_the_tcp_flags_is_charged_as_a_syn() {
    let config = format!("[xdp.limit]\npackets_per_second = 1\nburst = 100\n{}ports = [{SERVED}]\n", syn_budget(1));
    let kernel = TestKernel::new(&xdp_config(&config));
    let mut head = tcp_header(TCP_SYN);
    head[2..4].copy_from_slice(&22u16.to_be_bytes());
    let mut tiny = ethernet(ETH_P_IPV4, &ipv4_carrying(v4(1), &head[..8], 0x2000));
    tiny.resize(60, 0);
    let short_whole = {
        let mut frame = ethernet(ETH_P_IPV4, &ipv4_carrying(v4(2), &head[..8], 0));
        frame.resize(60, 0);
        frame
    };
    assert_eq!(verdicts(&kernel, &short_whole, 2), [XDP_PASS; 2], "no fragment: the stack refuses it whole");
    assert_eq!(kernel.kernel.maps().budget(BUDGET_SYN).expect("budget").packets, 0);
    assert_eq!(verdicts(&kernel, &tiny, 2), [XDP_PASS, XDP_DROP], "the budget of 1, whatever port it hides");
    // The same behind an IPv6 fragment header (M set, offset 0).
    let source: Ipv6Addr = "2001:db8::7".parse().expect("addr");
    let mut payload = vec![6, 0, 0, 1, 0, 0, 0, 1];
    payload.extend_from_slice(&head[..8]);
    assert_eq!(kernel.run(&ethernet(ETH_P_IPV6, &ipv6(source, 44, 64, &payload))), XDP_DROP, "the budget is spent");
    assert_eq!(kernel.counters(), [("passed", 3), ("new_sources", 3), ("dropped_syn", 2)]);
}

/// The attack: IPv6 packets from `::ffff:10.0.0.1`. Taken for the IPv4 source, they
/// matched an IPv4 allow rule (and would have used an IPv4 client's bucket, block or
/// verification); no IPv6 host sends them and the stack refuses them, so they are
/// dropped before any rule.
#[test]
fn ipv6_packets_from_ipv4_mapped_addresses_never_match_ipv4_rules() {
    let mut kernel = TestKernel::new(&xdp_config(&format!(
        "{SLOW}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n{}",
        syn_budget(1)
    )));
    let mapped: Ipv6Addr = Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped();
    let udp = ethernet(ETH_P_IPV6, &ipv6(mapped, IPPROTO_UDP, 64, &[0; 8]));
    assert_eq!(verdicts(&kernel, &udp, 2), [XDP_DROP; 2]);
    kernel.kernel.maps_mut().verify("192.0.2.1/32".parse().expect("cidr"), Duration::from_secs(60)).expect("verify");
    let syn = ethernet(ETH_P_IPV6, &ipv6(v4(1).to_ipv6_mapped(), 6, 64, &tcp_header(TCP_SYN)));
    assert_eq!(verdicts(&kernel, &syn, 2), [XDP_DROP; 2], "not the verified IPv4 source either");
    assert_eq!(kernel.run(&udp4(Ipv4Addr::new(10, 0, 0, 1))), XDP_PASS, "the IPv4 source keeps its rule");
    assert_eq!(kernel.counters(), [("allowed", 1), ("dropped_v4_mapped", 4)]);
    assert_eq!(kernel.kernel.maps().sources().count(), 0);
}

/// The proxy's verifier holds at most `max_per_48` sources of one IPv6 /48 (each
/// /64 its own source) and `max_per_24` of one IPv4 /24 verified; other prefixes
/// are not held back, and a source it holds is refreshed, not refused.
#[test]
fn the_verifier_holds_at_most_its_cap_per_48_and_per_24() {
    let xdp = xdp_config(&format!("{SLOW}[xdp.verified]\nmax_per_48 = 4\nmax_per_24 = 2\n"));
    let kernel = TestKernel::new(&xdp);
    let verifier = Verifier::open(&kernel.pin_dir, &xdp).expect("verifier");
    let in_48 = |i: u16| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 7, i, 0, 0, 0, 1));
    let verified: Vec<bool> = (0..6).map(|i| verifier.verify(in_48(i)).expect("verify")).collect();
    assert_eq!(verified, [true, true, true, true, false, false]);
    assert!(verifier.verify(in_48(2)).expect("again"), "a source held is still verified");
    let other_48 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 8, 0, 0, 0, 0, 1));
    assert!(verifier.verify(other_48).expect("other /48"));
    let in_24: Vec<bool> = (1..=3).map(|i| verifier.verify(IpAddr::V4(v4(i))).expect("verify")).collect();
    assert_eq!(in_24, [true, true, false]);
    let maps = kernel.kernel.maps();
    assert_eq!((0..6).filter(|i| maps.is_verified(&key(in_48(*i)))).count(), 4);
    assert!(maps.is_verified(&key(other_48)) && !maps.is_verified(&key(v4(3))));
    // A new verifier (an agent restarted) counts what the map holds.
    let reopened = Verifier::open(&kernel.pin_dir, &xdp).expect("verifier");
    assert!(!reopened.verify(in_48(5)).expect("verify"), "the /48 is still full");
    assert!(!reopened.verify(IpAddr::V4(v4(4))).expect("verify"), "the /24 is still full");
}
