//! `[xdp.services]` through `BPF_PROG_TEST_RUN`: the ports the host serves, replies
//! to its own traffic, ICMP and other protocols, in IPv4 and IPv6. Needs root.

use std::net::{Ipv4Addr, Ipv6Addr};

use limiter::xdp::ephemeral_ports;
use limiter_lab::support::{
    frames::{
        ETH_P_ARP, ETH_P_IPV4, ETH_P_IPV6, IPPROTO_UDP, TCP_ACK, TCP_RST, TCP_SYN, ethernet, icmp4, icmp6,
        ipv4_carrying, ipv6, tcp_header, tcp4, tcp6, udp_header, udp4_to, udp6_to,
    },
    kernel::{TestKernel, xdp_config},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// 1 packet per second, burst 3: nothing refills while a test runs, so counts are exact.
const SLOW: &str = "[xdp.limit]\npackets_per_second = 1\nburst = 3\n";

/// The host of these tests: SSH and HTTPS over TCP, QUIC over UDP, one resolver
/// network of each family.
const SERVICES: &str = "[xdp.services]\ntcp = [22, 443]\nudp = [443]\n\
                        udp_replies_from = [\"192.0.2.53/32\", \"2001:db8:53::/48\"]\n";

const RESOLVER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);
const GRE: u8 = 47;

fn v4(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, last)
}

fn v6(site: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, site, 0, 0, 0, 0, 1)
}

fn kernel(extra: &str) -> TestKernel {
    TestKernel::new(&xdp_config(&format!("{SLOW}{extra}")))
}

fn verdicts(kernel: &TestKernel, frame: &[u8], times: usize) -> Vec<u32> {
    (0..times).map(|_| kernel.run(frame)).collect()
}

/// A port in this host's ephemeral range, and one neither in it nor served.
fn ports() -> (u16, u16) {
    let [first, last] = ephemeral_ports();
    let closed = if first > 8080 { 8080 } else { last.checked_add(1).expect("a port above the range") };
    (first, closed)
}

#[test]
fn tcp_to_a_served_port_or_replying_to_an_ephemeral_one_passes_and_the_rest_is_dropped() {
    let kernel = kernel(SERVICES);
    let (ephemeral, closed) = ports();
    for (frame, verdict, what) in [
        (tcp4(v4(1), TCP_SYN, 443), XDP_PASS, "SYN to a served port"),
        (tcp4(v4(2), TCP_SYN, 22), XDP_PASS, "SYN to the other served port"),
        (tcp4(v4(3), TCP_SYN, closed), XDP_DROP, "SYN to a port not served"),
        (tcp4(v4(4), TCP_ACK, closed), XDP_DROP, "ACK to a port neither served nor ephemeral"),
        (tcp4(v4(5), TCP_SYN | TCP_ACK, ephemeral), XDP_PASS, "SYN-ACK to the host's connection"),
        (tcp4(v4(6), TCP_ACK, ephemeral), XDP_PASS, "ACK to an ephemeral port"),
        (tcp4(v4(7), TCP_RST, ephemeral), XDP_PASS, "a reset of the host's connection"),
        (tcp4(v4(8), TCP_SYN, ephemeral), XDP_DROP, "SYN to an ephemeral port opens nothing"),
        (tcp6(v6(1), TCP_SYN, 443), XDP_PASS, "IPv6 SYN to a served port"),
        (tcp6(v6(2), TCP_SYN, closed), XDP_DROP, "IPv6 SYN to a port not served"),
        (tcp6(v6(3), TCP_ACK, ephemeral), XDP_PASS, "IPv6 ACK to an ephemeral port"),
        (tcp6(v6(4), TCP_SYN, ephemeral), XDP_DROP, "IPv6 SYN to an ephemeral port"),
    ] {
        assert_eq!(kernel.run(&frame), verdict, "{what}");
    }
    // Dropped before the buckets: no source of a dropped packet got one.
    assert_eq!(kernel.counters(), [("passed", 7), ("new_sources", 7), ("dropped_service", 5)]);
}

#[test]
fn udp_to_an_ephemeral_port_passes_only_from_udp_replies_from() {
    let kernel = kernel(SERVICES);
    let (ephemeral, closed) = ports();
    for (frame, verdict, what) in [
        (udp4_to(v4(1), 40_000, 443), XDP_PASS, "QUIC to a served port"),
        (udp4_to(v4(2), 53, ephemeral), XDP_DROP, "a DNS answer nobody asked this source for"),
        (udp4_to(v4(3), 123, closed), XDP_DROP, "NTP to a port not served"),
        (udp4_to(RESOLVER, 53, ephemeral), XDP_PASS, "the resolver's answer"),
        (udp4_to(RESOLVER, 53, closed), XDP_DROP, "the resolver to a port neither served nor ephemeral"),
        (udp6_to(v6(1), 53, ephemeral), XDP_DROP, "an IPv6 source outside the list"),
        (udp6_to(Ipv6Addr::new(0x2001, 0xdb8, 0x53, 7, 0, 0, 0, 9), 53, ephemeral), XDP_PASS, "inside its /48"),
        (udp6_to(v6(2), 40_000, 443), XDP_PASS, "IPv6 QUIC"),
    ] {
        assert_eq!(kernel.run(&frame), verdict, "{what}");
    }
    assert_eq!(kernel.counters(), [("passed", 4), ("new_sources", 4), ("dropped_service", 4)]);
}

#[test]
fn arp_and_neighbour_discovery_pass_whatever_icmp_says() {
    let kernel = kernel(&format!("{SERVICES}icmp = \"drop\"\n"));
    assert_eq!(verdicts(&kernel, &ethernet(ETH_P_ARP, &[0; 28]), 5), [XDP_PASS; 5]);
    let link_local: Ipv6Addr = "fe80::1".parse().expect("addr");
    assert_eq!(verdicts(&kernel, &icmp6(link_local, 135, 255), 5), [XDP_PASS; 5], "neighbour solicitation");
    assert_eq!(kernel.run(&icmp6(link_local, 128, 64)), XDP_DROP, "an echo request is ICMP like any other");
    assert_eq!(kernel.run(&icmp6(link_local, 135, 64)), XDP_DROP, "not from the link: no neighbour discovery");
    assert_eq!(kernel.run(&icmp4(v4(1))), XDP_DROP);
    assert_eq!(kernel.counters(), [("passed", 5), ("allowed", 5), ("non_ip", 5), ("dropped_service", 3)]);
}

/// `icmp = "pass"` only lets ICMP past the policy: it is charged to its source's
/// bucket like any other packet.
#[test]
fn icmp_follows_icmp_and_a_passed_one_is_still_charged_to_its_source() {
    let passing = kernel(SERVICES);
    assert_eq!(verdicts(&passing, &icmp4(v4(1)), 5), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP, XDP_DROP]);
    assert_eq!(verdicts(&passing, &tcp4(v4(1), TCP_SYN, 443), 1), [XDP_DROP], "the same bucket, spent");
    assert_eq!(verdicts(&passing, &icmp6(v6(1), 128, 64), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    assert_eq!(passing.counters(), [("passed", 6), ("dropped_rate_limit", 4), ("new_sources", 2)]);
    let dropping = kernel(&format!("{SERVICES}icmp = \"drop\"\n"));
    assert_eq!(verdicts(&dropping, &icmp4(v4(1)), 2), [XDP_DROP; 2]);
    assert_eq!(verdicts(&dropping, &icmp6(v6(1), 128, 64), 2), [XDP_DROP; 2]);
    assert_eq!(verdicts(&dropping, &tcp4(v4(1), TCP_SYN, 443), 3), [XDP_PASS; 3], "the bucket was not charged");
    assert_eq!(dropping.counters(), [("passed", 3), ("new_sources", 1), ("dropped_service", 4)]);
}

#[test]
fn other_protocols_follow_other() {
    let gre4 = ethernet(ETH_P_IPV4, &ipv4_carrying(v4(1), GRE, &[0; 8]));
    let gre6 = ethernet(ETH_P_IPV6, &ipv6(v6(1), GRE, 64, &[0; 8]));
    let dropping = kernel(SERVICES);
    assert_eq!((dropping.run(&gre4), dropping.run(&gre6)), (XDP_DROP, XDP_DROP));
    assert_eq!(dropping.counters(), [("dropped_service", 2)]);
    let passing = kernel(&format!("{SERVICES}other = \"pass\"\n"));
    assert_eq!(verdicts(&passing, &gre4, 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP], "charged to its bucket");
    assert_eq!(passing.run(&gre6), XDP_PASS);
    let (_, closed) = ports();
    assert_eq!(passing.run(&udp4_to(v4(2), 53, closed)), XDP_DROP, "`other` is no UDP port's");
    assert_eq!(
        passing.counters(),
        [("passed", 4), ("dropped_rate_limit", 1), ("new_sources", 2), ("dropped_service", 1)]
    );
}

/// A fragment after the first shows no port: it follows its source's buckets, as
/// without the policy. A first fragment too short to show its port is no service's.
#[test]
fn later_fragments_follow_their_source_and_a_tiny_first_fragment_is_dropped() {
    let kernel = kernel(SERVICES);
    let (_, closed) = ports();
    let later = |source| {
        let mut packet = ipv4_carrying(source, IPPROTO_UDP, &udp_header(53, closed));
        packet[6..8].copy_from_slice(&185u16.to_be_bytes());
        ethernet(ETH_P_IPV4, &packet)
    };
    assert_eq!(verdicts(&kernel, &later(v4(1)), 4), [XDP_PASS, XDP_PASS, XDP_PASS, XDP_DROP]);
    let mut tiny = ipv4_carrying(v4(2), 6, &tcp_header(TCP_SYN, 443)[..8]);
    tiny[6] = 0x20;
    assert_eq!(kernel.run(&ethernet(ETH_P_IPV4, &tiny)), XDP_DROP, "its port is not shown");
    let mut v6_later = vec![IPPROTO_UDP, 0, 0x05, 0xc8, 0, 0, 0, 1];
    v6_later.extend_from_slice(&udp_header(53, closed));
    assert_eq!(kernel.run(&ethernet(ETH_P_IPV6, &ipv6(v6(1), 44, 64, &v6_later))), XDP_PASS);
    assert_eq!(
        kernel.counters(),
        [("passed", 4), ("dropped_rate_limit", 1), ("new_sources", 2), ("dropped_service", 1)]
    );
}

#[test]
fn dry_run_counts_would_drop() {
    let kernel = TestKernel::new(&xdp_config(&format!("enforce = false\n{SLOW}{SERVICES}")));
    let (_, closed) = ports();
    assert_eq!(kernel.run(&tcp4(v4(1), TCP_SYN, closed)), XDP_PASS);
    assert_eq!(kernel.run(&udp6_to(v6(1), 53, closed)), XDP_PASS);
    assert_eq!(kernel.counters(), [("passed", 2), ("would_drop", 2)]);
}

#[test]
fn without_the_section_every_port_goes_on_to_the_buckets() {
    let kernel = kernel("");
    let (ephemeral, closed) = ports();
    assert_eq!(kernel.run(&tcp4(v4(1), TCP_SYN, closed)), XDP_PASS);
    assert_eq!(kernel.run(&udp4_to(v4(2), 53, ephemeral)), XDP_PASS);
    assert_eq!(kernel.counters(), [("passed", 2), ("new_sources", 2)]);
}

/// A reload puts new ports in force at once and refills no bucket.
#[test]
fn a_reload_changes_the_ports_and_keeps_every_bucket() {
    let mut kernel = kernel(SERVICES);
    let (_, closed) = ports();
    assert_eq!(verdicts(&kernel, &tcp4(v4(1), TCP_SYN, 443), 2), [XDP_PASS; 2]);
    assert_eq!(kernel.run(&tcp4(v4(1), TCP_SYN, closed)), XDP_DROP);
    let opened = xdp_config(&format!("{SLOW}{}", SERVICES.replace("[22, 443]", &format!("[22, 443, {closed}]"))));
    kernel.kernel.maps_mut().apply(&opened, None).expect("reload");
    assert_eq!(verdicts(&kernel, &tcp4(v4(1), TCP_SYN, closed), 2), [XDP_PASS, XDP_DROP], "one token was left");
    kernel.kernel.maps_mut().apply(&xdp_config(SLOW), None).expect("reload without the section");
    assert_eq!(kernel.run(&udp4_to(v4(1), 53, closed)), XDP_DROP, "the bucket is still empty");
    assert_eq!(kernel.run(&udp4_to(v4(2), 53, closed)), XDP_PASS, "no policy");
    assert_eq!(
        kernel.counters(),
        [("passed", 4), ("dropped_rate_limit", 2), ("new_sources", 2), ("dropped_service", 1)]
    );
}
