//! The XDP program's packet parser, built for the host from its own source over an
//! arbitrary frame (and an arbitrary amount of it in fragments): never a panic or an
//! overflow, never a read past `data_end` (the frame ends at an unreadable page), and
//! a verdict that agrees with the bytes it came from: the source, no IPv4-mapped
//! IPv6 source taken for IPv4, and (IPv4) the protocol, a SYN's, a reply's and a
//! UDP datagram's port.

#![no_main]

// The parser's source names aya-ebpf; on the host that is this stand-in.
extern crate xdp_host as aya_ebpf;

#[path = "../../limiter-ebpf/src/parse.rs"]
mod parse;

use libfuzzer_sys::fuzz_target;
use limiter_common::addr::{as_v4, mask_v6, v4_mapped};
use parse::{Frame, Packet, Syn};

const ETH_HLEN: usize = 14;
const VLAN_TPIDS: [[u8; 2]; 2] = [[0x81, 0x00], [0x88, 0xa8]];

fuzz_target!(|input: (u8, u16, &[u8])| {
    let (ipv6_prefix, fragments, frame) = input;
    let mut packet = Packet::EMPTY;
    let verdict = xdp_host::with_frame(frame, u64::from(fragments), |ctx| parse::parse(ctx, ipv6_prefix, &mut packet));
    match verdict {
        Frame::Malformed => {}
        Frame::NonIp => {
            let (ether_type, _) = network_header(frame).expect("a frame too short for its tags is malformed");
            assert!(!matches!(ether_type, [0x08, 0x00] | [0x86, 0xdd]), "an IP frame read as non-IP");
        }
        Frame::V4Mapped => {
            let (ether_type, l3) = network_header(frame).expect("a mapped source without an IP header");
            assert_eq!(ether_type, [0x86, 0xdd], "an IPv4-mapped verdict for a frame that is not IPv6");
            let source: [u8; 16] = frame[l3 + 8..l3 + 24].try_into().expect("16 bytes");
            assert!(as_v4(&source).is_some(), "a source outside ::ffff:0:0/96 refused as mapped");
        }
        Frame::Ip => check_packet(frame, ipv6_prefix, &packet),
    }
});

/// The EtherType after at most two VLAN tags, and where the network header starts.
fn network_header(frame: &[u8]) -> Option<([u8; 2], usize)> {
    let mut offset = ETH_HLEN;
    let mut ether_type: [u8; 2] = frame.get(12..ETH_HLEN)?.try_into().ok()?;
    while VLAN_TPIDS.contains(&ether_type) && offset < ETH_HLEN + 8 {
        ether_type = frame.get(offset + 2..offset + 4)?.try_into().ok()?;
        offset += 4;
    }
    Some((ether_type, offset))
}

/// The source the parser reports is the one in the frame's IP header.
fn check_packet(frame: &[u8], ipv6_prefix: u8, packet: &Packet) {
    let (ether_type, l3) = network_header(frame).expect("an IP verdict on a frame without an IP header");
    let ip = &frame[l3..];
    match ether_type {
        [0x08, 0x00] => {
            assert_eq!(ip[0] >> 4, 4);
            let source: [u8; 4] = ip[12..16].try_into().expect("4 bytes");
            assert_eq!(packet.v4(), Some(source));
            assert_eq!(packet.source, v4_mapped(source));
            assert!(!packet.link_control, "neighbour discovery is IPv6 only");
            check_transport4(ip, packet);
        }
        [0x86, 0xdd] => {
            assert_eq!(ip[0] >> 4, 6);
            let source: [u8; 16] = ip[8..24].try_into().expect("16 bytes");
            assert_eq!(packet.v6, source);
            assert_eq!((packet.v4(), as_v4(&source)), (None, None), "an IPv4-mapped source passed as a packet");
            assert_eq!(packet.source, mask_v6(source, ipv6_prefix));
            assert!(!packet.link_control || ip[7] == 255, "link control from a routed packet");
        }
        other => panic!("an IP verdict for EtherType {other:02x?}"),
    }
}

/// What an IPv4 header (and the frame after it) says of its upper layer: the port of
/// a TCP segment whose flags lie inside the packet's length, whether it is a SYN or
/// a reply (ACK or RST), `Hidden` only for the first of several fragments too short
/// to show them; a UDP datagram's port where it lies inside the packet; nothing of
/// a fragment after the first.
fn check_transport4(ip: &[u8], packet: &Packet) {
    let header_len = usize::from(ip[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let first_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
    let more_fragments = ip[6] & 0x20 != 0;
    let upper = ip.get(header_len..).unwrap_or_default();
    let port = |end: usize| match upper.get(end - 1).filter(|_| header_len + end <= total_len) {
        Some(_) => u16::from_be_bytes([upper[2], upper[3]]),
        None => 0,
    };
    let expected = match ip[9] {
        _ if !first_fragment => (Syn::No, 0, false),
        6 => match upper.get(13).filter(|_| header_len + 14 <= total_len) {
            Some(flags) => {
                let syn = if flags & 0x12 == 0x02 { Syn::Open } else { Syn::No };
                (syn, port(14), flags & 0x14 != 0)
            }
            None if more_fragments => (Syn::Hidden, 0, false),
            None => (Syn::No, 0, false),
        },
        17 => (Syn::No, port(4), false),
        _ => (Syn::No, 0, false),
    };
    assert_eq!((packet.syn, packet.port, packet.reply), expected, "the verdict disagrees with the upper header");
    assert_eq!((packet.protocol, packet.later_fragment), (ip[9], !first_fragment), "the protocol or fragment");
}
