//! Hand-built Ethernet frames for `BPF_PROG_TEST_RUN`.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// Ethernet header (no VLAN) followed by `payload`.
pub fn ethernet(ether_type: u16, payload: &[u8]) -> Vec<u8> {
    tagged(&[], ether_type, payload)
}

/// Ethernet with the given VLAN tags (`(tpid, vlan id)`, outermost first).
pub fn tagged(tags: &[(u16, u16)], ether_type: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    for (tpid, vid) in tags {
        frame.extend_from_slice(&tpid.to_be_bytes());
        frame.extend_from_slice(&vid.to_be_bytes());
    }
    frame.extend_from_slice(&ether_type.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An IPv4 packet from `source` with `options` bytes of options (multiple of 4)
/// and an 8-byte UDP payload; total length and IHL consistent.
pub fn ipv4(source: Ipv4Addr, options: usize) -> Vec<u8> {
    let header_len = 20 + options;
    let mut packet = vec![0u8; header_len + 8];
    packet[0] = 0x40 | u8::try_from(header_len / 4).expect("IHL");
    let total = u16::try_from(packet.len()).expect("length");
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet[8] = 64;
    packet[9] = IPPROTO_UDP;
    packet[12..16].copy_from_slice(&source.octets());
    packet[16..20].copy_from_slice(&[192, 0, 2, 1]);
    packet
}

/// A UDP-over-IPv4 frame from `source`.
pub fn udp4(source: Ipv4Addr) -> Vec<u8> {
    ethernet(ETH_P_IPV4, &ipv4(source, 0))
}

/// An IPv6 packet from `source` with `next` header and `payload` after the fixed
/// header; payload length consistent.
pub fn ipv6(source: Ipv6Addr, next: u8, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let mut packet = vec![0u8; 40];
    packet[0] = 0x60;
    packet[4..6].copy_from_slice(&u16::try_from(payload.len()).expect("length").to_be_bytes());
    packet[6] = next;
    packet[7] = hop_limit;
    packet[8..24].copy_from_slice(&source.octets());
    packet[24..40].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
    packet.extend_from_slice(payload);
    packet
}

/// A UDP-over-IPv6 frame from `source`.
pub fn udp6(source: Ipv6Addr) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &ipv6(source, IPPROTO_UDP, 64, &[0; 8]))
}

/// An IPv6 extension header of 8 bytes announcing `next`.
pub fn extension(next: u8) -> [u8; 8] {
    [next, 0, 0, 0, 0, 0, 0, 0]
}

/// An IPv4 packet from `source` with protocol `protocol` and `payload`; total length
/// consistent.
pub fn ipv4_carrying(source: Ipv4Addr, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let mut packet = ipv4(source, 0);
    packet.truncate(20);
    packet[9] = protocol;
    packet.extend_from_slice(payload);
    let total = u16::try_from(packet.len()).expect("length");
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet
}

/// A TCP header from port 40 000 to `port` with `flags`, no options.
pub fn tcp_header(flags: u8, port: u16) -> [u8; 20] {
    let mut header = [0u8; 20];
    header[..2].copy_from_slice(&40_000u16.to_be_bytes());
    header[2..4].copy_from_slice(&port.to_be_bytes());
    header[12] = 5 << 4;
    header[13] = flags;
    header
}

/// A UDP header with 8 bytes of payload, from `source_port` to `port`.
pub fn udp_header(source_port: u16, port: u16) -> [u8; 16] {
    let mut header = [0u8; 16];
    header[..2].copy_from_slice(&source_port.to_be_bytes());
    header[2..4].copy_from_slice(&port.to_be_bytes());
    header[4..6].copy_from_slice(&16u16.to_be_bytes());
    header
}

/// A TCP-over-IPv4 frame from `source` with `flags`, to `port`.
pub fn tcp4(source: Ipv4Addr, flags: u8, port: u16) -> Vec<u8> {
    ethernet(ETH_P_IPV4, &ipv4_carrying(source, IPPROTO_TCP, &tcp_header(flags, port)))
}

/// A TCP-over-IPv6 frame from `source` with `flags`, to `port`.
pub fn tcp6(source: Ipv6Addr, flags: u8, port: u16) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &ipv6(source, IPPROTO_TCP, 64, &tcp_header(flags, port)))
}

/// A UDP-over-IPv4 frame from `source`, `source_port` to `port`.
pub fn udp4_to(source: Ipv4Addr, source_port: u16, port: u16) -> Vec<u8> {
    ethernet(ETH_P_IPV4, &ipv4_carrying(source, IPPROTO_UDP, &udp_header(source_port, port)))
}

/// A UDP-over-IPv6 frame from `source`, `source_port` to `port`.
pub fn udp6_to(source: Ipv6Addr, source_port: u16, port: u16) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &ipv6(source, IPPROTO_UDP, 64, &udp_header(source_port, port)))
}

/// An ICMP echo request from `source`.
pub fn icmp4(source: Ipv4Addr) -> Vec<u8> {
    ethernet(ETH_P_IPV4, &ipv4_carrying(source, IPPROTO_ICMP, &[8, 0, 0, 0, 0, 0, 0, 0]))
}

/// An ICMPv6 message of `icmp_type` from `source` with `hop_limit`.
pub fn icmp6(source: Ipv6Addr, icmp_type: u8, hop_limit: u8) -> Vec<u8> {
    ethernet(ETH_P_IPV6, &ipv6(source, IPPROTO_ICMPV6, hop_limit, &[icmp_type, 0, 0, 0, 0, 0, 0, 0]))
}

/// A UDP-over-IPv4 frame from `source`, `length` bytes from its Ethernet header to
/// its last byte (at least 42), its IP total length consistent.
pub fn udp4_of_length(source: Ipv4Addr, length: usize) -> Vec<u8> {
    udp4_sized(source, 0, length)
}

/// [`udp4_of_length`] to destination port `port`.
pub fn udp4_sized(source: Ipv4Addr, port: u16, length: usize) -> Vec<u8> {
    let mut packet = ipv4(source, 0);
    packet.resize(length - 14, 0);
    let total = u16::try_from(packet.len()).expect("length");
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet[22..24].copy_from_slice(&port.to_be_bytes());
    ethernet(ETH_P_IPV4, &packet)
}

/// A UDP-over-IPv6 frame from `source`, `length` bytes in all (at least 62).
pub fn udp6_of_length(source: Ipv6Addr, length: usize) -> Vec<u8> {
    udp6_sized(source, 0, length)
}

/// [`udp6_of_length`] to destination port `port`.
pub fn udp6_sized(source: Ipv6Addr, port: u16, length: usize) -> Vec<u8> {
    let mut payload = vec![0; length - 14 - 40];
    payload[2..4].copy_from_slice(&port.to_be_bytes());
    ethernet(ETH_P_IPV6, &ipv6(source, IPPROTO_UDP, 64, &payload))
}
