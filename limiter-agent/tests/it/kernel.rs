//! The XDP program through `BPF_PROG_TEST_RUN`: hand-built frames in, verdict and
//! counters out. Needs root (loads a real program into this kernel).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use limiter::xdp::{coarse_tick_ns, monotonic_now_ns};
use limiter_common::{
    addr::v4_mapped,
    bucket::NANOS_PER_SEC,
    maps::{FEATURE_COARSE_CLOCK, SourceKey},
};
use limiter_lab::support::{
    frames::{
        ETH_P_8021AD, ETH_P_8021Q, ETH_P_ARP, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_ICMPV6, IPPROTO_UDP, ethernet, extension,
        ipv4, ipv6, tagged, udp4, udp6,
    },
    kernel::{TestKernel, xdp_config},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// 1 packet per second: nothing refills while a test runs, so counts are exact.
const SLOW: &str = "[xdp.limit]\npackets_per_second = 1\nburst = 3\n";

fn slow_kernel() -> TestKernel {
    TestKernel::new(&xdp_config(SLOW))
}

fn verdicts(kernel: &TestKernel, frame: &[u8], times: usize) -> Vec<u32> {
    (0..times).map(|_| kernel.run(frame)).collect()
}

const A: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const B: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 8);

#[test]
fn burst_then_drop_for_one_source() {
    let kernel = slow_kernel();
    assert_eq!(verdicts(&kernel, &udp4(A), 5), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP, XDP_DROP]);
    assert_eq!(kernel.counters(), [("passed", 3), ("dropped_rate_limit", 2), ("new_sources", 1)]);
    let state = kernel.kernel.maps().source(&SourceKey { addr: v4_mapped(A.octets()) }).expect("tracked");
    assert_eq!((state.packets, state.dropped), (5, 2));
}

#[test]
fn two_sources_are_independent() {
    let kernel = slow_kernel();
    assert_eq!(verdicts(&kernel, &udp4(A), 4).last(), Some(&XDP_DROP));
    assert_eq!(verdicts(&kernel, &udp4(B), 3), [XDP_PASS; 3]);
    assert_eq!(kernel.counter(limiter_common::counters::Counter::NewSources), 2);
}

#[test]
fn ipv6_sources_share_a_bucket_per_64() {
    let kernel = slow_kernel();
    let one: Ipv6Addr = "2001:db8:1:2::1".parse().expect("addr");
    let same_64: Ipv6Addr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().expect("addr");
    let other_64: Ipv6Addr = "2001:db8:1:3::1".parse().expect("addr");
    assert_eq!(verdicts(&kernel, &udp6(one), 2), [XDP_PASS; 2]);
    assert_eq!(verdicts(&kernel, &udp6(same_64), 2), [XDP_PASS, XDP_DROP]);
    assert_eq!(verdicts(&kernel, &udp6(other_64), 3), [XDP_PASS; 3]);
    assert_eq!(kernel.counters(), [("passed", 6), ("dropped_rate_limit", 1), ("new_sources", 2)]);
}

#[test]
fn ipv6_prefix_is_configurable() {
    let kernel = TestKernel::new(&xdp_config(&format!("ipv6_prefix = 128\n{SLOW}")));
    for host in 1..=4u16 {
        let source = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, host);
        assert_eq!(kernel.run(&udp6(source)), XDP_PASS);
    }
    assert_eq!(kernel.counter(limiter_common::counters::Counter::NewSources), 4);
}

/// An IPv6 packet from `::ffff:a.b.c.d` is no IPv4 packet: it is dropped before any
/// rule, and neither spends nor matches what the IPv4 source has (its bucket, a deny
/// rule's range; see `spoofing.rs` for allow rules and verified sources).
#[test]
fn ipv4_mapped_ipv6_is_dropped_and_never_taken_for_the_ipv4_source() {
    let kernel =
        TestKernel::new(&xdp_config(&format!("{SLOW}[[xdp.cidr]]\ncidr = \"198.51.100.0/24\"\naction = \"deny\"\n")));
    let mapped = A.to_ipv6_mapped();
    assert_eq!(kernel.run(&udp4(A)), XDP_PASS);
    assert_eq!(verdicts(&kernel, &udp6(mapped), 2), [XDP_DROP; 2]);
    assert_eq!(verdicts(&kernel, &udp4(A), 2), [XDP_PASS; 2], "the IPv4 source's bucket of 3 was not charged");
    let denied = Ipv4Addr::new(198, 51, 100, 9).to_ipv6_mapped();
    assert_eq!(kernel.run(&udp6(denied)), XDP_DROP);
    assert_eq!(kernel.counters(), [("passed", 3), ("new_sources", 1), ("dropped_v4_mapped", 3)]);
}

#[test]
fn one_and_two_vlan_tags_are_parsed() {
    let kernel = slow_kernel();
    let packet = ipv4(A, 0);
    let single = tagged(&[(ETH_P_8021Q, 10)], ETH_P_IPV4, &packet);
    let double = tagged(&[(ETH_P_8021AD, 100), (ETH_P_8021Q, 10)], ETH_P_IPV4, &packet);
    assert_eq!(kernel.run(&single), XDP_PASS);
    assert_eq!(kernel.run(&double), XDP_PASS);
    assert_eq!(kernel.run(&udp4(A)), XDP_PASS);
    assert_eq!(kernel.run(&double), XDP_DROP, "tagged and untagged frames share the source's bucket");
    let v6 =
        tagged(&[(ETH_P_8021Q, 10)], ETH_P_IPV6, &ipv6("2001:db8::1".parse().expect("addr"), IPPROTO_UDP, 64, &[0; 8]));
    assert_eq!(kernel.run(&v6), XDP_PASS);
    assert_eq!(kernel.counters(), [("passed", 4), ("dropped_rate_limit", 1), ("new_sources", 2)]);
}

#[test]
fn three_vlan_tags_are_malformed() {
    let kernel = TestKernel::new(&xdp_config(&format!("malformed = \"drop\"\n{SLOW}")));
    let frame = tagged(&[(ETH_P_8021AD, 1), (ETH_P_8021Q, 2), (ETH_P_8021Q, 3)], ETH_P_IPV4, &ipv4(A, 0));
    assert_eq!(kernel.run(&frame), XDP_DROP);
    assert_eq!(kernel.counters(), [("malformed", 1), ("dropped_malformed", 1)]);
}

#[test]
fn ipv4_with_full_options_is_limited_like_any_packet() {
    let kernel = slow_kernel();
    let frame = ethernet(ETH_P_IPV4, &ipv4(A, 40));
    assert_eq!(frame[14] & 0x0f, 15);
    assert_eq!(verdicts(&kernel, &frame, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(kernel.counters(), [("passed", 3), ("dropped_rate_limit", 1), ("new_sources", 1)]);
}

#[test]
fn ipv4_header_length_below_five_is_malformed() {
    for (setting, verdict, counters) in [
        ("pass", XDP_PASS, vec![("passed", 1), ("malformed", 1)]),
        ("drop", XDP_DROP, vec![("malformed", 1), ("dropped_malformed", 1)]),
    ] {
        let kernel = TestKernel::new(&xdp_config(&format!("malformed = \"{setting}\"\n{SLOW}")));
        let mut packet = ipv4(A, 0);
        packet[0] = 0x44;
        assert_eq!(kernel.run(&ethernet(ETH_P_IPV4, &packet)), verdict, "malformed = {setting}");
        assert_eq!(kernel.counters(), counters, "malformed = {setting}");
    }
}

#[test]
fn total_length_shorter_than_header_is_malformed_but_still_limited_when_passed() {
    let kernel = slow_kernel();
    let mut packet = ipv4(A, 0);
    packet[2..4].copy_from_slice(&19u16.to_be_bytes());
    let frame = ethernet(ETH_P_IPV4, &packet);
    assert_eq!(verdicts(&kernel, &frame, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(
        kernel.counters(),
        [("passed", 3), ("dropped_rate_limit", 1), ("malformed", 4), ("new_sources", 1)],
        "malformed = pass must not open a way around the limit"
    );
    let dropping = TestKernel::new(&xdp_config(&format!("malformed = \"drop\"\n{SLOW}")));
    assert_eq!(dropping.run(&frame), XDP_DROP);
    assert_eq!(dropping.counters(), [("malformed", 1), ("dropped_malformed", 1)]);
}

#[test]
fn frames_shorter_than_ethernet_never_reach_xdp() {
    // The kernel refuses to run XDP on less than an Ethernet header (EINVAL), as
    // no driver hands one over; the program's own bound checks are exercised by
    // the 14- and 33-byte frames below.
    let kernel = slow_kernel();
    for len in [0usize, 13] {
        assert!(kernel.try_run(&vec![0u8; len]).is_err(), "{len}-byte frame");
    }
    assert!(kernel.counters().is_empty());
}

#[test]
fn frames_cut_inside_the_ip_header_are_malformed() {
    let kernel = TestKernel::new(&xdp_config(&format!("malformed = \"drop\"\n{SLOW}")));
    let header_only = ethernet(ETH_P_IPV4, &[]);
    assert_eq!(header_only.len(), 14);
    assert_eq!(kernel.run(&header_only), XDP_DROP);
    let cut = udp4(A)[..33].to_vec();
    assert_eq!(kernel.run(&cut), XDP_DROP);
    let cut_v6 = udp6("2001:db8::1".parse().expect("addr"))[..14 + 39].to_vec();
    assert_eq!(kernel.run(&cut_v6), XDP_DROP);
    let cut_vlan = tagged(&[(ETH_P_8021Q, 1)], ETH_P_IPV4, &[])[..16].to_vec();
    assert_eq!(kernel.run(&cut_vlan), XDP_DROP);
    assert_eq!(kernel.counters(), [("malformed", 4), ("dropped_malformed", 4)]);
}

#[test]
fn non_first_fragments_are_charged_to_their_source() {
    let kernel = slow_kernel();
    let mut fragment = ipv4(A, 0);
    fragment[6..8].copy_from_slice(&0x00b9u16.to_be_bytes());
    let v4 = ethernet(ETH_P_IPV4, &fragment);
    let v6_source: Ipv6Addr = "2001:db8::7".parse().expect("addr");
    let mut frag_header = [IPPROTO_UDP, 0, 0, 0, 0, 0, 0, 1];
    frag_header[2..4].copy_from_slice(&(185u16 << 3).to_be_bytes());
    let v6 = ethernet(ETH_P_IPV6, &ipv6(v6_source, 44, 64, &frag_header));
    assert_eq!(verdicts(&kernel, &v4, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(verdicts(&kernel, &v6, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(kernel.counters(), [("passed", 6), ("dropped_rate_limit", 2), ("new_sources", 2)]);
}

#[test]
fn ipv6_extension_chain_past_the_walk_bound_is_malformed_and_still_limited() {
    let kernel = slow_kernel();
    let source: Ipv6Addr = "2001:db8::9".parse().expect("addr");
    let mut chain = Vec::new();
    for _ in 0..9 {
        chain.extend_from_slice(&extension(60));
    }
    let frame = ethernet(ETH_P_IPV6, &ipv6(source, 0, 255, &chain));
    assert_eq!(verdicts(&kernel, &frame, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(kernel.counters(), [("passed", 3), ("dropped_rate_limit", 1), ("malformed", 4), ("new_sources", 1)]);
    // Within the bound the walk finds the upper layer and nothing is malformed.
    let mut short_chain = Vec::new();
    for _ in 0..3 {
        short_chain.extend_from_slice(&extension(60));
    }
    short_chain[3 * 8 - 8] = IPPROTO_UDP;
    let ok = ethernet(ETH_P_IPV6, &ipv6("2001:db8:0:1::9".parse().expect("addr"), 0, 64, &short_chain));
    assert_eq!(kernel.run(&ok), XDP_PASS);
    assert_eq!(kernel.counter(limiter_common::counters::Counter::Malformed), 4);
}

#[test]
fn arp_and_neighbour_discovery_always_pass() {
    let kernel = TestKernel::new(&xdp_config(&format!(
        "{SLOW}[[xdp.cidr]]\ncidr = \"0.0.0.0/0\"\naction = \"deny\"\n[[xdp.cidr]]\ncidr = \"::/0\"\naction = \"deny\"\n"
    )));
    assert_eq!(verdicts(&kernel, &ethernet(ETH_P_ARP, &[0; 28]), 5), [XDP_PASS; 5]);
    let neighbour_solicitation = [135u8, 0, 0, 0, 0, 0, 0, 0];
    let link_local: Ipv6Addr = "fe80::1".parse().expect("addr");
    let nd = ethernet(ETH_P_IPV6, &ipv6(link_local, IPPROTO_ICMPV6, 255, &neighbour_solicitation));
    assert_eq!(verdicts(&kernel, &nd, 5), [XDP_PASS; 5]);
    let routed = ethernet(ETH_P_IPV6, &ipv6(link_local, IPPROTO_ICMPV6, 64, &neighbour_solicitation));
    assert_eq!(kernel.run(&routed), XDP_DROP, "hop limit below 255 cannot be neighbour discovery");
    assert_eq!(kernel.counters(), [("passed", 5), ("dropped_deny", 1), ("allowed", 5), ("non_ip", 5)]);
}

#[test]
fn nested_cidrs_longest_prefix_wins() {
    let kernel = TestKernel::new(&xdp_config(&format!(
        "{SLOW}\
         [[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n\
         [[xdp.cidr]]\ncidr = \"10.1.0.0/16\"\naction = \"deny\"\n\
         [[xdp.cidr]]\ncidr = \"10.1.2.0/24\"\naction = \"limit\"\npackets_per_second = 1\nburst = 1\n\
         [[xdp.cidr]]\ncidr = \"10.1.2.3/32\"\naction = \"allow\"\n\
         [[xdp.cidr]]\ncidr = \"2001:db8::/32\"\naction = \"deny\"\n\
         [[xdp.cidr]]\ncidr = \"2001:db8:1::/48\"\naction = \"allow\"\n"
    )));
    let v4 = |a, b, c, d| udp4(Ipv4Addr::new(a, b, c, d));
    assert_eq!(verdicts(&kernel, &v4(10, 9, 9, 9), 5), [XDP_PASS; 5], "allow /8");
    assert_eq!(kernel.run(&v4(10, 1, 9, 9)), XDP_DROP, "deny /16");
    assert_eq!(verdicts(&kernel, &v4(10, 1, 2, 4), 2), [XDP_PASS, XDP_DROP], "limit /24 with burst 1");
    assert_eq!(verdicts(&kernel, &v4(10, 1, 2, 3), 5), [XDP_PASS; 5], "allow /32");
    assert_eq!(verdicts(&kernel, &v4(11, 0, 0, 1), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP], "default");
    assert_eq!(kernel.run(&udp6("2001:db8:2::1".parse().expect("addr"))), XDP_DROP, "deny /32");
    assert_eq!(verdicts(&kernel, &udp6("2001:db8:1::1".parse().expect("addr")), 5), [XDP_PASS; 5], "allow /48");
    assert_eq!(
        kernel.counters(),
        [("passed", 4), ("dropped_rate_limit", 2), ("dropped_deny", 2), ("allowed", 15), ("new_sources", 2)]
    );
}

#[test]
fn dry_run_drops_nothing_and_counts_would_drops() {
    let kernel = TestKernel::new(&xdp_config(&format!(
        "enforce = false\n{SLOW}[[xdp.cidr]]\ncidr = \"203.0.113.0/24\"\naction = \"deny\"\n"
    )));
    assert_eq!(verdicts(&kernel, &udp4(A), 5), [XDP_PASS; 5]);
    assert_eq!(kernel.run(&udp4(Ipv4Addr::new(203, 0, 113, 1))), XDP_PASS);
    assert_eq!(kernel.counters(), [("passed", 6), ("would_drop", 3), ("new_sources", 1)]);
    let state = kernel.kernel.maps().source(&SourceKey { addr: v4_mapped(A.octets()) }).expect("tracked");
    assert_eq!((state.packets, state.dropped), (5, 2), "would-drops show in `limiter top`");
}

#[test]
fn runtime_block_drops_until_it_expires() {
    let mut kernel = TestKernel::new(&xdp_config("[xdp.limit]\npackets_per_second = 1000\nburst = 1000\n"));
    let ttl = Duration::from_millis(200);
    kernel.kernel.maps_mut().block("192.0.2.0/28".parse().expect("cidr"), Some(ttl)).expect("block");
    let expires = monotonic_now_ns() + u64::try_from(ttl.as_nanos()).expect("ns");
    assert_eq!(kernel.run(&udp4(A)), XDP_DROP);
    assert_eq!(kernel.run(&udp4(Ipv4Addr::new(192, 0, 2, 16))), XDP_PASS, "outside the block");
    let blocks = kernel.kernel.maps_mut().blocks().expect("blocks");
    assert_eq!(blocks.len(), 1);
    assert!(blocks[0].expires_in.is_some_and(|left| left <= ttl));
    // Wait for the kernel's clock to pass the expiry: time itself is the event.
    while monotonic_now_ns() <= expires {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(kernel.run(&udp4(A)), XDP_PASS);
    assert!(kernel.kernel.maps_mut().blocks().expect("blocks").is_empty(), "lapsed block is cleaned up");
    assert_eq!(kernel.counters(), [("passed", 2), ("dropped_deny", 1), ("new_sources", 2)]);
}

#[test]
fn buckets_read_the_coarse_clock_only_where_its_tick_fits_the_rate() {
    let tick = coarse_tick_ns();
    // SLOW's burst holds 3 s of refill; 1 000 pps with a burst of 10 holds 10 ms,
    // fewer than 100 ticks at any CONFIG_HZ.
    for (config, interval, coarse) in
        [(SLOW, NANOS_PER_SEC, true), ("[xdp.limit]\npackets_per_second = 1000\nburst = 10\n", 1_000_000, false)]
    {
        let kernel = TestKernel::new(&xdp_config(config));
        let settings = kernel.kernel.maps().settings().expect("settings");
        assert_eq!(settings.has(FEATURE_COARSE_CLOCK), coarse, "{config}");
        let before = monotonic_now_ns();
        assert_eq!(kernel.run(&udp4(A)), XDP_PASS);
        let after = monotonic_now_ns();
        // A new source's TAT is the clock it read plus one interval. The coarse clock
        // is the last tick's time: a tick behind at most, and one more while the host
        // holds this vCPU back.
        let read =
            kernel.kernel.maps().source(&SourceKey { addr: v4_mapped(A.octets()) }).expect("tracked").tat_ns - interval;
        let earliest = if coarse { before - 2 * tick } else { before };
        assert!((earliest..=after).contains(&read), "{config}: read {read}, ran within {before}..={after}");
    }
}

#[test]
fn two_cpus_hammering_one_source_admit_no_more_than_the_bucket() {
    // A deep bucket that barely refills: both CPUs spend the first half of their runs
    // admitting from the same bucket at once, where any lost update would admit
    // extra packets. Exact accounting admits the burst plus at most the refill.
    const RATE: u64 = 1;
    const BURST: u64 = 1_000_000;
    const REPEAT: u32 = 2_000_000;
    let kernel = TestKernel::new(&xdp_config(&format!("[xdp.limit]\npackets_per_second = {RATE}\nburst = {BURST}\n")));
    let elapsed = kernel.run_on_two_cpus(&udp4(A), REPEAT);
    let state = kernel.kernel.maps().source(&SourceKey { addr: v4_mapped(A.octets()) }).expect("tracked");
    assert_eq!(state.packets, 2 * u64::from(REPEAT));
    let admitted = state.packets - state.dropped;
    // The bucket reads the coarse clock (its burst is far above 100 ticks of refill),
    // which may show up to a tick more of elapsed time.
    let refill = elapsed + Duration::from_nanos(coarse_tick_ns());
    let allowed = BURST + (refill.as_secs_f64() * RATE as f64).ceil() as u64;
    assert!(admitted >= BURST && admitted <= allowed, "admitted {admitted}, bucket allows {allowed} over {elapsed:?}");
}

#[test]
fn pinned_maps_of_another_layout_are_refused_not_reused() {
    let mut first = slow_kernel();
    let mut settings = first.kernel.maps().settings().expect("settings");
    settings.layout_version += 1;
    first.kernel.maps_mut().write_settings(settings).expect("write");
    let options = limiter::xdp::LoadOptions::with_sources(first.pin_dir.clone(), 1_000_000);
    let error = limiter::xdp::Kernel::load(&options).expect_err("a foreign layout must be refused");
    assert!(error.to_string().contains("limiter detach"), "{error}");

    let other = slow_kernel();
    let options = limiter::xdp::LoadOptions::with_sources(other.pin_dir.clone(), 1_000);
    let error = limiter::xdp::Kernel::load(&options).expect_err("a resized sources map must be refused");
    assert!(error.to_string().contains("max_sources 1000000 pinned, 1000 configured"), "{error}");
}

#[test]
fn a_new_config_keeps_every_bucket_where_it_was() {
    let mut kernel = slow_kernel();
    assert_eq!(verdicts(&kernel, &udp4(A), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    // A larger burst and rate: an emptied bucket is not refilled by the reload.
    kernel
        .kernel
        .maps_mut()
        .apply(&xdp_config("[xdp.limit]\npackets_per_second = 2\nburst = 3\n"), None)
        .expect("apply");
    assert_eq!(kernel.run(&udp4(A)), XDP_DROP);
    assert_eq!(verdicts(&kernel, &udp4(B), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP], "new rate applies");
}

/// A demotion replaces the source's rate and keeps its bucket: a TAT half a second
/// ahead is not refilled by the switch, so a demoted bucket of 1 pps and burst 2
/// admits one packet, where a fresh one would admit two.
#[test]
fn a_demoted_source_is_limited_at_its_demoted_rate_until_undemoted_or_lapsed() {
    let mut kernel = TestKernel::new(&xdp_config(
        "[xdp.limit]\npackets_per_second = 1000\nburst = 5000\n\
         [[xdp.cidr]]\ncidr = \"192.0.2.128/25\"\naction = \"allow\"\n",
    ));
    let slow = limiter_common::bucket::Rate::new(1, 2);
    let cidr = |text: &str| text.parse::<ipnet::IpNet>().expect("cidr");
    assert_eq!(verdicts(&kernel, &udp4(A), 500), [XDP_PASS; 500], "half a second of the normal rate");
    kernel.kernel.maps_mut().demote(cidr("192.0.2.7/32"), slow, None).expect("demote");
    assert_eq!(verdicts(&kernel, &udp4(A), 3), [XDP_PASS, XDP_DROP, XDP_DROP], "its bucket kept, at 1 pps");
    assert_eq!(verdicts(&kernel, &udp4(B), 5), [XDP_PASS; 5], "its neighbour keeps the normal rate");
    let demoted = kernel.kernel.maps_mut().demotions().expect("demotions");
    assert_eq!((demoted.len(), demoted[0].rate, demoted[0].expires_in), (1, slow, None));

    assert!(kernel.kernel.maps_mut().undemote(cidr("192.0.2.7/32")).expect("undemote"));
    assert_eq!(verdicts(&kernel, &udp4(A), 100), [XDP_PASS; 100], "the normal rate again");
    assert!(!kernel.kernel.maps_mut().undemote(cidr("192.0.2.7/32")).expect("undemote"), "none left");

    // An allow rule wins over a demotion.
    let allowed = Ipv4Addr::new(192, 0, 2, 200);
    kernel.kernel.maps_mut().demote(cidr("192.0.2.200/32"), slow, None).expect("demote");
    assert_eq!(verdicts(&kernel, &udp4(allowed), 5), [XDP_PASS; 5], "allowed");

    // IPv6: the source's /64, a fresh bucket at the demoted rate.
    let v6 = |text: &str| udp6(text.parse().expect("address"));
    kernel.kernel.maps_mut().demote(cidr("2001:db8:1:2::/64"), slow, None).expect("demote");
    assert_eq!(verdicts(&kernel, &v6("2001:db8:1:2::9"), 3), [XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(verdicts(&kernel, &v6("2001:db8:1:3::9"), 3), [XDP_PASS; 3], "another /64");

    // A lapsed demotion no longer applies, and is cleaned up.
    let ttl = Duration::from_millis(200);
    let c = Ipv4Addr::new(192, 0, 2, 9);
    kernel
        .kernel
        .maps_mut()
        .demote(cidr("192.0.2.9/32"), limiter_common::bucket::Rate::new(1, 1), Some(ttl))
        .expect("demote");
    let expires = monotonic_now_ns() + u64::try_from(ttl.as_nanos()).expect("ns");
    assert_eq!(verdicts(&kernel, &udp4(c), 2), [XDP_PASS, XDP_DROP]);
    while monotonic_now_ns() <= expires {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(verdicts(&kernel, &udp4(c), 5), [XDP_PASS; 5], "lapsed");
    let left: Vec<_> = kernel.kernel.maps_mut().demotions().expect("demotions").into_iter().map(|d| d.cidr).collect();
    assert_eq!(left, [cidr("192.0.2.200/32"), cidr("2001:db8:1:2::/64")], "the lapsed one is removed");
}
