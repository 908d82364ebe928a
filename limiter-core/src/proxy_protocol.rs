//! The HAProxy PROXY protocol header (v1 text, v2 binary) that a load balancer in front
//! of the proxy sends first on each connection: behind one, the TCP peer is the balancer,
//! and only this header says who the client is.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    str::FromStr,
};

/// Which versions the listener accepts (config `proxy.proxy_protocol`, minus "off").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    V1,
    V2,
    Any,
}

impl Accepted {
    fn v1(self) -> bool {
        matches!(self, Self::V1 | Self::Any)
    }

    fn v2(self) -> bool {
        matches!(self, Self::V2 | Self::Any)
    }

    /// By this many bytes [`parse`] has its verdict: a reader never needs to hold more.
    #[must_use]
    pub fn longest_header(self) -> usize {
        if self.v2() { MAX_V2_BYTES } else { V1_MAX_BYTES }
    }
}

impl fmt::Display for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
            Self::Any => "v1 or v2",
        })
    }
}

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// The connection is proxied for this client (source address and port).
    Proxied(SocketAddr),
    /// v2 LOCAL (the proxy's own health check), v1 UNKNOWN, or a v2 family other than
    /// TCP/UDP over IPv4/IPv6 (e.g. AF_UNIX): the TCP peer stands for itself.
    Local,
}

/// Why the start of a connection is not a PROXY header the listener takes: the spec
/// has the connection aborted, so none of these is recoverable.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("not a PROXY {0} header")]
    NotHeader(Accepted),
    /// Names the part, not its bytes: they are the peer's and may be anything.
    #[error("a malformed PROXY v1 line: {0}")]
    V1Malformed(&'static str),
    #[error("a PROXY v1 line longer than {V1_MAX_BYTES} bytes")]
    V1TooLong,
    #[error("a PROXY v2 header of version {0}, not 2")]
    V2Version(u8),
    #[error("a PROXY v2 header with command {0:#x}, neither LOCAL nor PROXY")]
    V2Command(u8),
    #[error("a PROXY v2 header with unknown family and protocol {0:#04x}")]
    V2Family(u8),
    #[error("a PROXY v2 address block of {len} bytes, shorter than the {needs} of family {family:#04x}")]
    V2Length { family: u8, len: usize, needs: usize },
    #[error("a PROXY v2 header of {0} bytes, longer than {MAX_V2_BYTES}")]
    V2TooLong(usize),
}

/// Longest v2 header accepted (16-byte fixed part plus addresses and TLVs): HAProxy's
/// TLVs fit well within it; a longer one is refused rather than buffered. Every TLV
/// HAProxy sends, each at its largest (255-byte ALPN, authority and netns names, a
/// 128-byte unique id, the SSL block), comes to about 1.3 KiB even after a UNIX address
/// block; 2 KiB leaves room for a few custom TLVs besides.
pub const MAX_V2_BYTES: usize = 2048;

/// The spec's worst case, `PROXY UNKNOWN` with two full IPv6 addresses and ports.
const V1_MAX_BYTES: usize = 107;

const V1_SIGNATURE: &[u8] = b"PROXY ";
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
/// Signature, version and command, family, address length.
const V2_FIXED_BYTES: usize = 16;

/// From this many bytes on, [`starts_like_header`] has its final answer: the longer
/// signature's length.
pub const SIGNATURE_BYTES: usize = V2_SIGNATURE.len();

/// Whether `bytes` (the start of a connection) could still be, or is, a PROXY header
/// of an accepted version: used to refuse a header from a peer that may not send one.
pub fn starts_like_header(bytes: &[u8], accepted: Accepted) -> bool {
    (accepted.v1() && could_be(bytes, V1_SIGNATURE)) || (accepted.v2() && could_be(bytes, V2_SIGNATURE))
}

fn could_be(bytes: &[u8], signature: &[u8]) -> bool {
    signature.starts_with(bytes) || bytes.starts_with(signature)
}

/// Parses a PROXY header at the start of `bytes`: `Ok(None)` while they are a valid
/// but unfinished start of one, else the header and how many bytes it took.
pub fn parse(bytes: &[u8], accepted: Accepted) -> Result<Option<(Header, usize)>, ParseError> {
    if accepted.v2() && could_be(bytes, V2_SIGNATURE) {
        parse_v2(bytes)
    } else if accepted.v1() && could_be(bytes, V1_SIGNATURE) {
        parse_v1(bytes)
    } else {
        Err(ParseError::NotHeader(accepted))
    }
}

fn parse_v1(bytes: &[u8]) -> Result<Option<(Header, usize)>, ParseError> {
    let window = bytes.get(..V1_MAX_BYTES).unwrap_or(bytes);
    let Some(end) = window.iter().position(|&b| b == b'\r' || b == b'\n') else {
        return if bytes.len() >= V1_MAX_BYTES { Err(ParseError::V1TooLong) } else { Ok(None) };
    };
    let Some((line, ending)) = window.split_at_checked(end) else {
        return Err(ParseError::V1Malformed("no line end"));
    };
    // The spec forbids ending the line on a lone CR or LF, and one inside the line
    // could only hide where it ends.
    match ending {
        [b'\r', b'\n', ..] => {}
        [b'\r'] if bytes.len() < V1_MAX_BYTES => return Ok(None),
        [b'\r'] => return Err(ParseError::V1TooLong),
        _ => return Err(ParseError::V1Malformed("a lone CR or LF")),
    }
    let Some(rest) = line.strip_prefix(V1_SIGNATURE) else {
        return Err(ParseError::V1Malformed("no PROXY signature"));
    };
    let mut fields = rest.split(|&b| b == b' ');
    let header = match fields.next() {
        // The spec has the rest of an UNKNOWN line ignored, whatever it holds.
        Some(b"UNKNOWN") => Header::Local,
        Some(b"TCP4") => {
            let (ip, port) = v1_source::<Ipv4Addr>(fields)?;
            Header::Proxied(SocketAddr::new(IpAddr::V4(ip), port))
        }
        Some(b"TCP6") => {
            let (ip, port) = v1_source::<Ipv6Addr>(fields)?;
            Header::Proxied(SocketAddr::new(IpAddr::V6(ip), port))
        }
        _ => return Err(ParseError::V1Malformed("a protocol other than TCP4, TCP6 or UNKNOWN")),
    };
    Ok(Some((header, end.saturating_add(2))))
}

/// The source of a TCP4 or TCP6 line; its destination is checked too, as the spec has
/// any line not exactly of its form refused.
fn v1_source<'a, A: FromStr>(mut fields: impl Iterator<Item = &'a [u8]>) -> Result<(A, u16), ParseError> {
    let mut field = |what| fields.next().ok_or(ParseError::V1Malformed(what));
    let source = v1_address(field("no source address")?).ok_or(ParseError::V1Malformed("source address"))?;
    v1_address::<A>(field("no destination address")?).ok_or(ParseError::V1Malformed("destination address"))?;
    let port = v1_port(field("no source port")?).ok_or(ParseError::V1Malformed("source port"))?;
    v1_port(field("no destination port")?).ok_or(ParseError::V1Malformed("destination port"))?;
    if fields.next().is_some() {
        return Err(ParseError::V1Malformed("more fields than the destination port"));
    }
    Ok((source, port))
}

/// std's parsers are as strict as the spec: no octal-looking leading zeros in IPv4, no
/// zone in IPv6, and an IPv4 text is no IPv6 address.
fn v1_address<A: FromStr>(field: &[u8]) -> Option<A> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Digits only (std's parser takes a leading '+'), and no leading zeros, which the spec
/// forbids.
fn v1_port(field: &[u8]) -> Option<u16> {
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) || (field.len() > 1 && field.starts_with(b"0")) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn parse_v2(bytes: &[u8]) -> Result<Option<(Header, usize)>, ParseError> {
    // Each field is checked as soon as it arrives, so a bad header is refused without
    // waiting for the rest of it.
    let Some(&version_command) = bytes.get(V2_SIGNATURE.len()) else {
        return Ok(None);
    };
    if version_command >> 4 != 2 {
        return Err(ParseError::V2Version(version_command >> 4));
    }
    let local = match version_command & 0x0f {
        0 => true,
        1 => false,
        command => return Err(ParseError::V2Command(command)),
    };
    let Some(&family) = bytes.get(13) else {
        return Ok(None);
    };
    // LOCAL has its address block, family included, discarded by the spec.
    let needs = if local { 0 } else { v2_address_bytes(family)? };
    let Some(&[high, low]) = bytes.get(14..V2_FIXED_BYTES) else {
        return Ok(None);
    };
    let len = usize::from(u16::from_be_bytes([high, low]));
    let total = V2_FIXED_BYTES.saturating_add(len);
    if total > MAX_V2_BYTES {
        return Err(ParseError::V2TooLong(total));
    }
    if len < needs {
        return Err(ParseError::V2Length { family, len, needs });
    }
    let Some(block) = bytes.get(V2_FIXED_BYTES..total) else {
        return Ok(None);
    };
    let source = match family {
        _ if local => None,
        0x11 | 0x12 => Some(v2_source::<4>(block).map(|(ip, port)| SocketAddr::from((Ipv4Addr::from(ip), port)))),
        0x21 | 0x22 => Some(v2_source::<16>(block).map(|(ip, port)| SocketAddr::from((Ipv6Addr::from(ip), port)))),
        _ => None,
    };
    let header = match source {
        None => Header::Local,
        Some(Some(source)) => Header::Proxied(source),
        Some(None) => return Err(ParseError::V2Length { family, len, needs }),
    };
    Ok(Some((header, total)))
}

/// The least address block `family` (of a PROXY command) can come with: TLVs may follow.
fn v2_address_bytes(family: u8) -> Result<usize, ParseError> {
    match family {
        0x00 => Ok(0),
        // Two addresses, two ports.
        0x11 | 0x12 => Ok(2 * 4 + 2 * 2),
        0x21 | 0x22 => Ok(2 * 16 + 2 * 2),
        // Two `sun_path`s.
        0x31 | 0x32 => Ok(2 * 108),
        _ => Err(ParseError::V2Family(family)),
    }
}

/// Source address and port from a block laid out as source, destination (`N` bytes
/// each), source port, destination port.
fn v2_source<const N: usize>(block: &[u8]) -> Option<([u8; N], u16)> {
    let (source, rest) = block.split_first_chunk::<N>()?;
    let (_destination, rest) = rest.split_first_chunk::<N>()?;
    let (port, _) = rest.split_first_chunk::<2>()?;
    Some((*source, u16::from_be_bytes(*port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap_or_else(|_| panic!("{text} is not a socket address"))
    }

    /// A v2 header: signature, `version_command`, `family`, then `block` with its length.
    fn v2(version_command: u8, family: u8, block: &[u8]) -> Vec<u8> {
        let len = u16::try_from(block.len()).unwrap_or_else(|_| panic!("a block of {} bytes", block.len()));
        let mut header = V2_SIGNATURE.to_vec();
        header.extend([version_command, family]);
        header.extend(len.to_be_bytes());
        header.extend(block);
        header
    }

    /// `192.0.2.1:56324` → `198.51.100.2:443`.
    const BLOCK_V4: [u8; 12] = [192, 0, 2, 1, 198, 51, 100, 2, 0xdc, 0x04, 0x01, 0xbb];

    /// `[2001:db8::1]:56324` → `[2001:db8::2]:443`.
    fn block_v6() -> Vec<u8> {
        let mut block = Vec::new();
        block.extend([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        block.extend([0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        block.extend([0xdc, 0x04, 0x01, 0xbb]);
        block
    }

    /// ALPN "h2", authority "example.com" and a CRC32C, as HAProxy sends them.
    fn tlvs() -> Vec<u8> {
        let mut tlvs = vec![0x01, 0x00, 0x02];
        tlvs.extend(b"h2");
        tlvs.extend([0x02, 0x00, 0x0b]);
        tlvs.extend(b"example.com");
        tlvs.extend([0x03, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef]);
        tlvs
    }

    fn unix_block() -> Vec<u8> {
        let mut block = vec![0; 2 * 108];
        block[..14].copy_from_slice(b"/run/haproxy.s");
        block
    }

    /// Every valid header the tests use, whole, and what it says.
    fn valid_headers() -> Vec<(Vec<u8>, Header)> {
        let v6_with_tlvs = [block_v6(), tlvs()].concat();
        vec![
            (b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n".to_vec(), Header::Proxied(addr("192.0.2.1:56324"))),
            (
                b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n".to_vec(),
                Header::Proxied(addr("[2001:db8::1]:56324")),
            ),
            (b"PROXY UNKNOWN\r\n".to_vec(), Header::Local),
            (b"PROXY UNKNOWN ffff::1 ffff::2 65535 65535\r\n".to_vec(), Header::Local),
            (v2(0x21, 0x11, &BLOCK_V4), Header::Proxied(addr("192.0.2.1:56324"))),
            (v2(0x21, 0x21, &block_v6()), Header::Proxied(addr("[2001:db8::1]:56324"))),
            (v2(0x21, 0x21, &v6_with_tlvs), Header::Proxied(addr("[2001:db8::1]:56324"))),
            (v2(0x20, 0x00, &[]), Header::Local),
            (v2(0x21, 0x31, &unix_block()), Header::Local),
        ]
    }

    fn parsed(bytes: &[u8], accepted: Accepted) -> Option<(Header, usize)> {
        parse(bytes, accepted).unwrap_or_else(|e| panic!("{:?} refused: {e}", String::from_utf8_lossy(bytes)))
    }

    fn refused(bytes: &[u8], accepted: Accepted) -> ParseError {
        match parse(bytes, accepted) {
            Err(e) => e,
            Ok(found) => panic!("{:?} parsed as {found:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn v1_tcp4() {
        let line = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET / HTTP/1.1\r\n";
        assert_eq!(parsed(line, Accepted::V1), Some((Header::Proxied(addr("192.168.0.1:56324")), 47)));
        assert_eq!(parsed(line, Accepted::Any), Some((Header::Proxied(addr("192.168.0.1:56324")), 47)));
    }

    #[test]
    fn v1_tcp6() {
        let line = b"PROXY TCP6 2001:DB8::a 2001:db8::b 0 65535\r\n";
        assert_eq!(parsed(line, Accepted::V1), Some((Header::Proxied(addr("[2001:db8::a]:0")), line.len())));
    }

    #[test]
    fn v1_tcp6_keeps_ipv4_mapped_address_as_given() {
        let line = b"PROXY TCP6 ::ffff:192.0.2.1 ::ffff:192.0.2.2 1 2\r\n";
        assert_eq!(parsed(line, Accepted::V1), Some((Header::Proxied(addr("[::ffff:192.0.2.1]:1")), line.len())));
    }

    #[test]
    fn v1_unknown_is_local_whatever_follows_it() {
        assert_eq!(parsed(b"PROXY UNKNOWN\r\n", Accepted::V1), Some((Header::Local, 15)));
        assert_eq!(parsed(b"PROXY UNKNOWN anything at all\r\nrest", Accepted::V1), Some((Header::Local, 31)));
    }

    #[test]
    fn v1_longest_line_is_accepted() {
        let line = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(line.len(), 107);
        assert_eq!(parsed(line, Accepted::V1), Some((Header::Local, 107)));
    }

    #[test]
    fn v1_line_over_107_bytes_is_refused() {
        let long = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 655355\r\n";
        assert_eq!(long.len(), 108);
        assert!(matches!(refused(long, Accepted::V1), ParseError::V1TooLong));
        // Its CR is the 107th byte: the line cannot end in time.
        assert!(matches!(refused(&long[..107], Accepted::V1), ParseError::V1TooLong));
        let endless = [b"PROXY ".as_slice(), &[b'x'; 200]].concat();
        assert!(matches!(refused(&endless[..107], Accepted::V1), ParseError::V1TooLong));
        assert!(matches!(refused(&endless, Accepted::Any), ParseError::V1TooLong));
        assert_eq!(parsed(&endless[..106], Accepted::V1), None);
    }

    #[test]
    fn v1_refuses_what_is_not_exactly_the_form() {
        let bad: &[&[u8]] = &[
            b"PROXY  TCP4 192.0.2.1 192.0.2.2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1  192.0.2.2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2 \r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2 3\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2\r\n",
            b"PROXY TCP4 192.0.2.1\r\n",
            b"PROXY TCP4\r\n",
            b"PROXY \r\n",
            b"PROXY tcp4 192.0.2.1 192.0.2.2 1 2\r\n",
            b"PROXY TCP5 192.0.2.1 192.0.2.2 1 2\r\n",
            b"PROXY UNKNOWNX\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 +1 2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 +2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 01 2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 -2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 65536 2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 1000000\r\n",
            b"PROXY TCP4 192.0.2.01 192.0.2.2 1 2\r\n",
            b"PROXY TCP4 192.0.2 192.0.2.2 1 2\r\n",
            b"PROXY TCP4 2001:db8::1 2001:db8::2 1 2\r\n",
            b"PROXY TCP6 192.0.2.1 192.0.2.2 1 2\r\n",
            b"PROXY TCP6 2001:db8::1 192.0.2.2 1 2\r\n",
            b"PROXY TCP6 fe80::1%eth0 2001:db8::2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2\rx\n",
            b"PROXY TCP4 192.0.2.1 192.0.2.2 1 2\n\r\n",
            b"PROXY UNKNOWN \n\r\n",
        ];
        for line in bad {
            assert!(
                matches!(refused(line, Accepted::V1), ParseError::V1Malformed(_)),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn v2_proxy_ipv4() {
        let header = v2(0x21, 0x11, &BLOCK_V4);
        assert_eq!(parsed(&header, Accepted::V2), Some((Header::Proxied(addr("192.0.2.1:56324")), 28)));
        let udp = v2(0x21, 0x12, &BLOCK_V4);
        assert_eq!(parsed(&udp, Accepted::Any), Some((Header::Proxied(addr("192.0.2.1:56324")), 28)));
    }

    #[test]
    fn v2_proxy_ipv6() {
        let header = v2(0x21, 0x21, &block_v6());
        assert_eq!(parsed(&header, Accepted::V2), Some((Header::Proxied(addr("[2001:db8::1]:56324")), 52)));
        let udp = v2(0x21, 0x22, &block_v6());
        assert_eq!(parsed(&udp, Accepted::Any), Some((Header::Proxied(addr("[2001:db8::1]:56324")), 52)));
    }

    #[test]
    fn v2_tlvs_are_skipped() {
        let tlvs = tlvs();
        let header = v2(0x21, 0x11, &[BLOCK_V4.as_slice(), &tlvs].concat());
        let with_stream = [header.as_slice(), b"\x16\x03\x01"].concat();
        let found = parsed(&with_stream, Accepted::V2);
        assert_eq!(found, Some((Header::Proxied(addr("192.0.2.1:56324")), 16 + 12 + tlvs.len())));
    }

    #[test]
    fn v2_local_ignores_the_address_block() {
        assert_eq!(parsed(&v2(0x20, 0x00, &[]), Accepted::V2), Some((Header::Local, 16)));
        assert_eq!(parsed(&v2(0x20, 0x11, &BLOCK_V4), Accepted::V2), Some((Header::Local, 28)));
        // Too short for its family, or of no family at all: LOCAL discards both.
        assert_eq!(parsed(&v2(0x20, 0x21, &BLOCK_V4), Accepted::V2), Some((Header::Local, 28)));
        assert_eq!(parsed(&v2(0x20, 0xff, &[1, 2, 3]), Accepted::V2), Some((Header::Local, 19)));
    }

    #[test]
    fn v2_unix_and_unspec_are_local() {
        assert_eq!(parsed(&v2(0x21, 0x31, &unix_block()), Accepted::V2), Some((Header::Local, 232)));
        assert_eq!(parsed(&v2(0x21, 0x32, &unix_block()), Accepted::V2), Some((Header::Local, 232)));
        assert_eq!(parsed(&v2(0x21, 0x00, &[]), Accepted::V2), Some((Header::Local, 16)));
    }

    #[test]
    fn v2_address_block_shorter_than_its_family_is_refused() {
        let short: [(u8, &[u8]); 3] = [(0x11, &BLOCK_V4[..11]), (0x21, &BLOCK_V4), (0x31, &[0; 215])];
        for (family, block) in short {
            let header = v2(0x21, family, block);
            // Refused from the fixed part alone, without waiting for the block.
            assert!(matches!(refused(&header[..16], Accepted::V2), ParseError::V2Length { .. }));
            assert!(matches!(refused(&header, Accepted::V2), ParseError::V2Length { .. }));
        }
    }

    #[test]
    fn v2_longer_than_max_is_refused() {
        let longest = v2(0x21, 0x11, &[0; MAX_V2_BYTES - 16]);
        assert_eq!(parsed(&longest, Accepted::V2), Some((Header::Proxied(addr("0.0.0.0:0")), MAX_V2_BYTES)));
        let fixed = v2(0x21, 0x11, &[0; MAX_V2_BYTES - 15]);
        assert!(matches!(refused(&fixed[..16], Accepted::V2), ParseError::V2TooLong(n) if n == MAX_V2_BYTES + 1));
        let mut largest = v2(0x21, 0x11, &[]);
        largest[14..16].copy_from_slice(&[0xff, 0xff]);
        assert!(matches!(refused(&largest, Accepted::V2), ParseError::V2TooLong(65551)));
    }

    #[test]
    fn v2_wrong_version_nibble_is_refused() {
        for version_command in [0x01, 0x11, 0x31, 0xf1] {
            let header = v2(version_command, 0x11, &BLOCK_V4);
            assert!(
                matches!(refused(&header[..13], Accepted::V2), ParseError::V2Version(v) if v == version_command >> 4)
            );
        }
    }

    #[test]
    fn v2_unknown_command_or_family_is_refused() {
        assert!(matches!(refused(&v2(0x22, 0x11, &BLOCK_V4), Accepted::V2), ParseError::V2Command(2)));
        assert!(matches!(refused(&v2(0x2f, 0x11, &BLOCK_V4), Accepted::V2), ParseError::V2Command(0xf)));
        for family in [0x01, 0x13, 0x23, 0x30, 0x41] {
            let header = v2(0x21, family, &BLOCK_V4);
            assert!(matches!(refused(&header[..14], Accepted::V2), ParseError::V2Family(f) if f == family));
        }
    }

    #[test]
    fn every_prefix_of_a_valid_header_needs_more_bytes() {
        for (header, says) in valid_headers() {
            let accepted = if header.starts_with(b"PROXY") { Accepted::V1 } else { Accepted::V2 };
            for len in 0..header.len() {
                assert_eq!(parsed(&header[..len], accepted), None, "{len} bytes of {header:?}");
                assert_eq!(parsed(&header[..len], Accepted::Any), None, "{len} bytes of {header:?}");
            }
            assert_eq!(parsed(&header, accepted), Some((says, header.len())));
        }
    }

    #[test]
    fn a_version_not_accepted_is_not_a_header() {
        let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
        assert!(matches!(refused(v1, Accepted::V2), ParseError::NotHeader(Accepted::V2)));
        assert!(matches!(refused(b"P", Accepted::V2), ParseError::NotHeader(Accepted::V2)));
        let v2 = v2(0x21, 0x11, &BLOCK_V4);
        assert!(matches!(refused(&v2, Accepted::V1), ParseError::NotHeader(Accepted::V1)));
        assert!(matches!(refused(b"\r", Accepted::V1), ParseError::NotHeader(Accepted::V1)));
    }

    #[test]
    fn other_protocols_are_not_a_header() {
        let starts: [&[u8]; 4] =
            [b"GET / HTTP/1.1\r\n", b"\x16\x03\x01\x02\x00", b"PROXYTCP4", b"\r\n\r\n\0\r\nQUIT\r"];
        for start in starts {
            let e = refused(start, Accepted::Any);
            assert!(matches!(e, ParseError::NotHeader(Accepted::Any)), "{start:?}: {e}");
        }
        assert_eq!(refused(b"GET /", Accepted::Any).to_string(), "not a PROXY v1 or v2 header");
    }

    #[test]
    fn starts_like_header_on_prefixes_of_both_signatures() {
        let v1 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n";
        let v2 = v2(0x21, 0x11, &BLOCK_V4);
        for len in 0..=v1.len() {
            assert!(starts_like_header(&v1[..len], Accepted::V1), "{len} bytes of v1");
            assert!(starts_like_header(&v1[..len], Accepted::Any), "{len} bytes of v1");
            assert_eq!(starts_like_header(&v1[..len], Accepted::V2), len == 0, "{len} bytes of v1");
        }
        for len in 0..=v2.len() {
            assert!(starts_like_header(&v2[..len], Accepted::V2), "{len} bytes of v2");
            assert!(starts_like_header(&v2[..len], Accepted::Any), "{len} bytes of v2");
            assert_eq!(starts_like_header(&v2[..len], Accepted::V1), len == 0, "{len} bytes of v2");
        }
    }

    #[test]
    fn starts_like_header_not_on_http_or_tls() {
        for accepted in [Accepted::V1, Accepted::V2, Accepted::Any] {
            assert!(!starts_like_header(b"GET / HTTP/1.1\r\n", accepted));
            assert!(!starts_like_header(b"G", accepted));
            assert!(!starts_like_header(b"\x16\x03\x01", accepted));
            assert!(!starts_like_header(b"PROXYTCP4", accepted));
        }
    }
}
