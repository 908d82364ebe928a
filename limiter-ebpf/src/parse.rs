//! From raw frame to source: Ethernet, up to two VLAN tags, IPv4 (with options) or
//! IPv6 (with a bounded walk of extension headers), the upper layer's protocol, and
//! the TCP flags and the TCP or UDP destination port of a first fragment. Every read
//! is checked against `data_end` first.

use aya_ebpf::{helpers::bpf_xdp_get_buff_len, programs::XdpContext};
use limiter_common::{
    addr::{as_v4, mask_v6, v4_mapped},
    maps::{IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP},
};

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const MAX_VLAN_TAGS: usize = 2;
const IPV4_MIN_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
/// Extension headers walked before giving up on finding the upper layer.
pub const MAX_IPV6_EXT_HEADERS: usize = 8;
/// Keeps every computed offset provably inside a frame for the verifier.
const OFFSET_MASK: usize = 0x3fff;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
const IPPROTO_MOBILITY: u8 = 135;
const ICMPV6_ROUTER_SOLICIT: u8 = 133;
const ICMPV6_REDIRECT: u8 = 137;
/// RFC 4861: neighbour discovery is only valid with hop limit 255, which no routed
/// packet can carry, so the exemption cannot be used from off-link.
const ND_HOP_LIMIT: u8 = 255;
/// Offset of the destination port in a TCP or UDP header.
const DEST_PORT: usize = 2;
/// Offset of the data-offset byte in a TCP header; the flags byte follows it.
const TCP_DATA_OFFSET: usize = 12;
/// A TCP header up to its flags.
const TCP_HEAD: usize = TCP_DATA_OFFSET + 2;
/// A UDP header up to its destination port.
/// IPv4 "more fragments" flag, in the high byte of the fragment field.
const IPV4_MORE_FRAGMENTS: u8 = 0x20;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_RST: u8 = 0x04;

/// What kind of frame it is; for [`Frame::Ip`], [`parse`] wrote the [`Packet`].
///
/// The packet is written into the caller's, zeroed beforehand, rather than carried
/// in the variant: LLVM leaves a payload undefined on the paths of the other
/// variants, and the verifier refuses the program that copies those registers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Frame {
    /// ARP, LLDP and anything else that is not IP.
    NonIp,
    /// The headers were cut short or contradict themselves before the source
    /// address could be read.
    Malformed,
    /// An IP packet.
    Ip,
    /// An IPv6 packet from an IPv4-mapped address (`::ffff:0:0/96`): no IPv6 host
    /// sends one and the stack refuses it, so it is neither an IPv6 source nor the
    /// IPv4 one it names (which would let it spoof into IPv4 rules and buckets).
    V4Mapped,
}

/// What a packet says of opening a TCP handshake; its port is beside it in
/// [`Packet`], for the reason [`Frame`] carries no packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Syn {
    No,
    /// A SYN without ACK, to [`Packet::port`].
    Open,
    /// The first of the fragments of a TCP segment, too short to show its flags:
    /// reassembled, it may be a SYN to any port.
    Hidden,
}

pub struct Packet {
    /// 16-byte source key (`limiter_common::addr`).
    pub source: [u8; 16],
    /// Whether the source is IPv4 (see [`Self::v4`]).
    pub ipv4: bool,
    /// The unmasked source, for CIDR lookups: IPv6, or IPv4 mapped.
    pub v6: [u8; 16],
    /// A header after the source address was cut short or inconsistent.
    pub malformed: bool,
    /// ICMPv6 neighbour or router discovery from the local link.
    pub link_control: bool,
    /// Whether it opens a TCP handshake.
    pub syn: Syn,
    /// The TCP or UDP destination port where the header shows one (else 0).
    pub port: u16,
    /// The upper layer's IP protocol (after IPv6's extension headers; where the walk
    /// gave up, the header it stopped at).
    pub protocol: u8,
    /// A fragment after the first: its upper-layer header is in another packet.
    pub later_fragment: bool,
    /// TCP with ACK or RST: what answers a connection rather than opens one.
    pub reply: bool,
}

impl Packet {
    /// The IPv4 address when the source is IPv4. Kept as a flag beside `v6` (which
    /// holds it mapped) rather than as an `Option` field: LLVM leaves a `None`'s
    /// payload undefined, and the verifier refuses the program once the packet is
    /// copied with it.
    #[inline(always)]
    pub fn v4(&self) -> Option<[u8; 4]> {
        let [.., a, b, c, d] = self.v6;
        self.ipv4.then_some([a, b, c, d])
    }

    /// What [`parse`] writes into.
    pub const EMPTY: Self = Self {
        source: [0; 16],
        ipv4: false,
        v6: [0; 16],
        malformed: false,
        link_control: false,
        syn: Syn::No,
        port: 0,
        protocol: 0,
        later_fragment: false,
        reply: false,
    };
}

#[inline(always)]
fn load<const N: usize>(ctx: &XdpContext, offset: usize) -> Option<[u8; N]> {
    if offset > OFFSET_MASK {
        return None;
    }
    let start = ctx.data() + (offset & OFFSET_MASK);
    if start + N > ctx.data_end() {
        return None;
    }
    // SAFETY: the N bytes at `start` lie inside the frame, checked just above.
    Some(unsafe { core::ptr::read_unaligned(start as *const [u8; N]) })
}

/// Whether a packet ending `end` bytes into the frame fits in it. The linear part is
/// checked first (the common case costs no helper call); a multi-buffer frame (a
/// jumbo frame under `xdp.frags`) has the rest of its bytes in fragments.
#[inline(always)]
fn fits(ctx: &XdpContext, end: usize) -> bool {
    end <= ctx.data_end() - ctx.data() || {
        // SAFETY: the helper only reads the context the kernel handed us.
        let total = unsafe { bpf_xdp_get_buff_len(ctx.ctx) };
        end as u64 <= total
    }
}

/// What the TCP header at `offset` of a packet ending `end` bytes into the frame
/// says of a handshake, its destination port (0 where it does not show it) and
/// whether it is a reply (ACK or RST); `fragmented`: the packet is the first
/// fragment of more.
#[inline(always)]
fn tcp_syn(ctx: &XdpContext, offset: usize, end: usize, fragmented: bool) -> (Syn, u16, bool) {
    // Against the packet's own length too: bytes past it (Ethernet padding) are no
    // flags, and would show a tiny fragment's zero padding as "no SYN". One load
    // for port and flags: a second one's check, which LLVM folds into the first,
    // would be missing for the verifier.
    let head = if offset + TCP_HEAD <= end { load::<TCP_HEAD>(ctx, offset) } else { None };
    let Some(head) = head else {
        // Reassembly may complete a SYN the first fragment hides. A whole segment
        // too short for its flags is the stack's to refuse: it cannot open a
        // connection, so it is no SYN and nothing malformed here.
        return (if fragmented { Syn::Hidden } else { Syn::No }, 0, false);
    };
    let port = u16::from_be_bytes([head[DEST_PORT], head[DEST_PORT + 1]]);
    let flags = head[TCP_DATA_OFFSET + 1];
    let syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    (if syn { Syn::Open } else { Syn::No }, port, flags & (TCP_ACK | TCP_RST) != 0)
}

/// The destination port of the UDP header at `offset` of a packet ending `end`
/// bytes into the frame; 0 where the packet is too short to show it.
#[inline(always)]
fn udp_port(ctx: &XdpContext, offset: usize, end: usize) -> u16 {
    let head = if offset + DEST_PORT + 2 <= end { load::<{ DEST_PORT + 2 }>(ctx, offset) } else { None };
    head.map_or(0, |head| u16::from_be_bytes([head[DEST_PORT], head[DEST_PORT + 1]]))
}

#[inline(always)]
pub fn parse(ctx: &XdpContext, ipv6_prefix: u8, packet: &mut Packet) -> Frame {
    let Some(eth) = load::<ETH_HLEN>(ctx, 0) else {
        return Frame::Malformed;
    };
    let mut ether_type = u16::from_be_bytes([eth[12], eth[13]]);
    let mut offset = ETH_HLEN;
    for _ in 0..MAX_VLAN_TAGS {
        if ether_type != ETH_P_8021Q && ether_type != ETH_P_8021AD {
            break;
        }
        let Some(tag) = load::<VLAN_HLEN>(ctx, offset) else {
            return Frame::Malformed;
        };
        ether_type = u16::from_be_bytes([tag[2], tag[3]]);
        offset += VLAN_HLEN;
    }
    match ether_type {
        ETH_P_IPV4 => parse_v4(ctx, offset, packet),
        ETH_P_IPV6 => parse_v6(ctx, offset, ipv6_prefix, packet),
        // A third tag is more than any host link carries: refuse to guess.
        ETH_P_8021Q | ETH_P_8021AD => Frame::Malformed,
        _ => Frame::NonIp,
    }
}

#[inline(always)]
fn parse_v4(ctx: &XdpContext, offset: usize, packet: &mut Packet) -> Frame {
    let Some(ip) = load::<IPV4_MIN_HLEN>(ctx, offset) else {
        return Frame::Malformed;
    };
    let header_len = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || header_len < IPV4_MIN_HLEN {
        return Frame::Malformed;
    }
    let source = [ip[12], ip[13], ip[14], ip[15]];
    let total_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let malformed = total_len < header_len || !fits(ctx, offset + total_len);
    let first_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
    let fragmented = ip[6] & IPV4_MORE_FRAGMENTS != 0;
    let protocol = ip[9];
    let (upper, end) = (offset + header_len, offset + total_len);
    let (syn, port, reply) = match protocol {
        IPPROTO_TCP if first_fragment => tcp_syn(ctx, upper, end, fragmented),
        IPPROTO_UDP if first_fragment => (Syn::No, udp_port(ctx, upper, end), false),
        _ => (Syn::No, 0, false),
    };
    *packet = Packet {
        source: v4_mapped(source),
        ipv4: true,
        v6: v4_mapped(source),
        malformed,
        link_control: false,
        syn,
        port,
        protocol,
        later_fragment: !first_fragment,
        reply,
    };
    Frame::Ip
}

#[inline(always)]
fn parse_v6(ctx: &XdpContext, offset: usize, ipv6_prefix: u8, packet: &mut Packet) -> Frame {
    let Some(ip) = load::<IPV6_HLEN>(ctx, offset) else {
        return Frame::Malformed;
    };
    if ip[0] >> 4 != 6 {
        return Frame::Malformed;
    }
    let mut v6 = [0u8; 16];
    v6.copy_from_slice(&ip[8..24]);
    if as_v4(&v6).is_some() {
        return Frame::V4Mapped;
    }
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let end = offset + IPV6_HLEN + payload_len;
    packet.source = mask_v6(v6, ipv6_prefix);
    packet.v6 = v6;
    if !fits(ctx, end) {
        packet.malformed = true;
        return Frame::Ip;
    }
    upper_layer(ctx, offset + IPV6_HLEN, ip[6], (ip[7], end), packet);
    Frame::Ip
}

/// Walks IPv6's extension headers from `next` at `offset` and writes what the upper
/// layer says into `packet`; `hop_limit` and `end` are the IPv6 header's. Written
/// in place at each end of the walk rather than returned as an enum: LLVM leaves
/// a variant's payload undefined on the paths of the others, and the verifier
/// refuses the program once such a register is copied.
#[inline(always)]
fn upper_layer(ctx: &XdpContext, mut offset: usize, mut next: u8, (hop_limit, end): (u8, usize), packet: &mut Packet) {
    let mut fragmented = false;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_ICMPV6 => {
                packet.protocol = IPPROTO_ICMPV6;
                // Type and code: a 1-byte check is folded by LLVM into a compare the
                // verifier cannot read as a bound, and no ICMPv6 message is shorter.
                match load::<2>(ctx, offset) {
                    Some([icmp_type, _code]) => {
                        packet.link_control =
                            hop_limit == ND_HOP_LIMIT && (ICMPV6_ROUTER_SOLICIT..=ICMPV6_REDIRECT).contains(&icmp_type);
                    }
                    None => packet.malformed = true,
                }
                return;
            }
            IPPROTO_TCP => {
                packet.protocol = IPPROTO_TCP;
                (packet.syn, packet.port, packet.reply) = tcp_syn(ctx, offset, end, fragmented);
                return;
            }
            IPPROTO_UDP => {
                packet.protocol = IPPROTO_UDP;
                packet.port = udp_port(ctx, offset, end);
                return;
            }
            IPPROTO_FRAGMENT => {
                let Some(frag) = load::<8>(ctx, offset) else { return broken(packet, next) };
                let field = u16::from_be_bytes([frag[2], frag[3]]);
                if field & 0xfff8 != 0 {
                    // A fragment after the first, whose upper layer is elsewhere.
                    packet.later_fragment = true;
                    return;
                }
                // The M flag.
                fragmented = field & 1 != 0;
                next = frag[0];
                offset += 8;
            }
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_MOBILITY => {
                let Some(ext) = load::<2>(ctx, offset) else { return broken(packet, next) };
                next = ext[0];
                offset += (usize::from(ext[1]) + 1) * 8;
            }
            IPPROTO_AH => {
                let Some(ext) = load::<2>(ctx, offset) else { return broken(packet, next) };
                next = ext[0];
                offset += (usize::from(ext[1]) + 2) * 4;
            }
            _ => {
                packet.protocol = next;
                return;
            }
        }
    }
    broken(packet, next);
}

/// A truncated extension header, or a chain longer than the walk bound: `protocol`
/// is the header the walk stopped at.
#[inline(always)]
fn broken(packet: &mut Packet, protocol: u8) {
    packet.protocol = protocol;
    packet.malformed = true;
}
