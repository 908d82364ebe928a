//! JA4, the TLS client fingerprint of FoxIO's specification (BSD 3-Clause; only
//! JA4 itself, not the other JA4+ methods): what a client's TLS stack offers in its
//! ClientHello (version, cipher suites, extensions, signature algorithms, the first
//! ALPN), as `t13d1516h2_8daaf6152771_e5627efa2ab1`. Clients sharing one stack share
//! it, whatever addresses they come from; a client choosing what it sends can
//! present any fingerprint it likes.
//!
//! The input is the first bytes of a connection, as read off the socket: TLS records
//! that may split the ClientHello between them. [`progress`] says, from the record
//! headers alone, whether more bytes could complete it; [`fingerprint`] then reads
//! it. Both are bounded by [`MAX_CAPTURE_BYTES`] and answer every input, however
//! malformed, without panicking: what is not a whole ClientHello has no fingerprint.

use std::{borrow::Cow, fmt, fmt::Write as _, str::FromStr};

use sha2::{Digest as _, Sha256};

/// The most a capture reads: one record of the largest plaintext TLS allows
/// (2^14 bytes) with its header. A ClientHello spread over records of more than that
/// in all gets no fingerprint.
pub const MAX_CAPTURE_BYTES: usize = (1 << 14) + RECORD_HEADER;

const RECORD_HEADER: usize = 5;
const HANDSHAKE_HEADER: usize = 4;
const CONTENT_HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
/// Characters of a fingerprint: `a` (10), `_`, `b` (12), `_`, `c` (12).
const LENGTH: usize = 36;
const HASH_CHARS: usize = 12;
const EMPTY_HASH: &[u8; HASH_CHARS] = b"000000000000";

const EXT_SERVER_NAME: u16 = 0x0000;
const EXT_SIGNATURE_ALGORITHMS: u16 = 0x000d;
const EXT_ALPN: u16 = 0x0010;
const EXT_SUPPORTED_VERSIONS: u16 = 0x002b;

/// The two characters of each TLS version JA4 names; any other is `00`.
const VERSIONS: [(u16, &[u8; 2]); 9] = [
    (0x0304, b"13"),
    (0x0303, b"12"),
    (0x0302, b"11"),
    (0x0301, b"10"),
    (0x0300, b"s3"),
    (0x0002, b"s2"),
    (0xfeff, b"d1"),
    (0xfefd, b"d2"),
    (0xfefc, b"d3"),
];

/// A JA4 fingerprint, always well formed (made by [`fingerprint`] or checked by
/// [`FromStr`]): 36 ASCII characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ja4([u8; LENGTH]);

impl Ja4 {
    #[must_use]
    pub fn as_str(&self) -> &str {
        // Only ever built from ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Ja4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Ja4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ja4({self})")
    }
}

impl serde::Serialize for Ja4 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Ja4 {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Text that is not a JA4 fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a JA4 fingerprint (e.g. t13d1516h2_8daaf6152771_e5627efa2ab1)")]
pub struct NotJa4(pub String);

impl FromStr for Ja4 {
    type Err = NotJa4;

    fn from_str(text: &str) -> Result<Self, NotJa4> {
        let bytes: [u8; LENGTH] = text.as_bytes().try_into().map_err(|_| NotJa4(text.to_owned()))?;
        let hex = |part: &[u8]| part.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let well_formed = matches!(bytes[0], b't' | b'q' | b'd')
            && (VERSIONS.iter().any(|(_, chars)| bytes[1..3] == chars[..]) || bytes[1..3] == *b"00")
            && matches!(bytes[3], b'd' | b'i')
            && bytes[4..8].iter().all(u8::is_ascii_digit)
            && bytes[8..10].iter().all(u8::is_ascii_alphanumeric)
            && bytes[10] == b'_'
            && hex(&bytes[11..23])
            && bytes[23] == b'_'
            && hex(&bytes[24..]);
        if well_formed { Ok(Self(bytes)) } else { Err(NotJa4(text.to_owned())) }
    }
}

/// How far the first bytes of a connection are from a whole ClientHello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// At least this many more bytes could complete it.
    More(usize),
    /// Settled: the ClientHello is whole, or these bytes will never be one (not a TLS
    /// handshake, another message first, over [`MAX_CAPTURE_BYTES`]).
    Settled,
}

/// What `start` lacks of a whole ClientHello, read from the record headers and the
/// handshake message's own length alone.
#[must_use]
pub fn progress(start: &[u8]) -> Progress {
    let mut at = 0;
    // The handshake message's bytes seen so far, and its first four (its header).
    let mut carried = 0;
    let mut header = [0u8; HANDSHAKE_HEADER];
    loop {
        let Some(record) = start.get(at..at + RECORD_HEADER) else {
            if at + RECORD_HEADER > MAX_CAPTURE_BYTES {
                return Progress::Settled;
            }
            return more(start.len(), at + RECORD_HEADER);
        };
        if record[0] != CONTENT_HANDSHAKE || record[1] != 3 {
            return Progress::Settled;
        }
        let length = usize::from(u16::from_be_bytes([record[3], record[4]]));
        let payload = start.get(at + RECORD_HEADER..).unwrap_or_default();
        for (slot, &byte) in header.iter_mut().skip(carried).zip(payload.iter().take(length)) {
            *slot = byte;
        }
        let end = at + RECORD_HEADER + length;
        if length == 0 || end > MAX_CAPTURE_BYTES {
            return Progress::Settled;
        }
        carried += payload.len().min(length);
        if carried >= HANDSHAKE_HEADER {
            if header[0] != CLIENT_HELLO {
                return Progress::Settled;
            }
            let message = HANDSHAKE_HEADER + u24(&header[1..]);
            // Within the records read so far, or the records that would hold the rest
            // (a header each at least) could not fit.
            if carried >= message || at + RECORD_HEADER + message > MAX_CAPTURE_BYTES {
                return Progress::Settled;
            }
        }
        if payload.len() < length {
            return more(start.len(), end);
        }
        at = end;
    }
}

fn more(have: usize, want: usize) -> Progress {
    Progress::More(want.saturating_sub(have).max(1))
}

/// The JA4 of the ClientHello at the start of `records` (TLS over TCP); `None` if
/// they do not begin with a whole, well-formed one within [`MAX_CAPTURE_BYTES`].
#[must_use]
pub fn fingerprint(records: &[u8]) -> Option<Ja4> {
    let message = handshake_message(records.get(..MAX_CAPTURE_BYTES).unwrap_or(records))?;
    let (&kind, rest) = message.split_first()?;
    let length = u24(rest.get(..3)?);
    if kind != CLIENT_HELLO {
        return None;
    }
    let hello = Hello::parse(rest.get(3..3 + length)?)?;
    Some(hello.ja4())
}

/// The first handshake message, joined from as many records as it spans.
fn handshake_message(records: &[u8]) -> Option<Cow<'_, [u8]>> {
    let mut joined: Option<Vec<u8>> = None;
    let mut at = 0;
    loop {
        let record = records.get(at..at + RECORD_HEADER)?;
        if record[0] != CONTENT_HANDSHAKE || record[1] != 3 {
            return None;
        }
        let length = usize::from(u16::from_be_bytes([record[3], record[4]]));
        let payload = records.get(at + RECORD_HEADER..at + RECORD_HEADER + length)?;
        at += RECORD_HEADER + length;
        let so_far: &[u8] = match &mut joined {
            None if whole(payload) => return Some(Cow::Borrowed(payload)),
            None => joined.insert(payload.to_vec()),
            Some(joined) => {
                joined.extend_from_slice(payload);
                joined
            }
        };
        if whole(so_far) {
            return joined.map(Cow::Owned);
        }
        if payload.is_empty() {
            return None;
        }
    }
}

/// Whether `message` holds a handshake message's header and all the body it announces.
fn whole(message: &[u8]) -> bool {
    message.get(1..HANDSHAKE_HEADER).is_some_and(|length| message.len() >= HANDSHAKE_HEADER + u24(length))
}

fn u24(bytes: &[u8]) -> usize {
    bytes.iter().take(3).fold(0, |n, &b| n << 8 | usize::from(b))
}

/// RFC 8701's reserved values, which clients scatter to keep servers tolerant: JA4
/// ignores them wherever they appear.
fn grease(value: u16) -> bool {
    value & 0x0f0f == 0x0a0a && value >> 8 == value & 0xff
}

/// A cursor over bytes that fails, rather than panics, past their end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one- or two-byte length.
    fn vector8(&mut self) -> Option<&'a [u8]> {
        let length = self.u8()?;
        self.take(usize::from(length))
    }

    fn vector16(&mut self) -> Option<&'a [u8]> {
        let length = self.u16()?;
        self.take(usize::from(length))
    }
}

/// The 16-bit values of `bytes`, GREASE left out (an odd byte at the end ignored).
fn values(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]])).filter(|&value| !grease(value))
}

/// What JA4 reads of a ClientHello, GREASE left out.
struct Hello<'a> {
    /// The highest of `supported_versions`, else the hello's own version.
    version: u16,
    ciphers: Vec<u16>,
    /// In the order sent.
    extensions: Vec<u16>,
    /// The first protocol ALPN names, if it names any.
    alpn: Option<&'a [u8]>,
    signature_algorithms: &'a [u8],
}

impl<'a> Hello<'a> {
    fn parse(body: &'a [u8]) -> Option<Self> {
        let mut reader = Reader(body);
        let legacy_version = reader.u16()?;
        reader.take(32)?;
        reader.vector8()?;
        let ciphers = values(reader.vector16()?).collect();
        reader.vector8()?;
        let mut hello =
            Hello { version: legacy_version, ciphers, extensions: Vec::new(), alpn: None, signature_algorithms: &[] };
        // A hello without extensions (TLS 1.2 and older allow it) ends here.
        if reader.0.is_empty() {
            return Some(hello);
        }
        let mut extensions = Reader(reader.vector16()?);
        let mut supported = None;
        while !extensions.0.is_empty() {
            let kind = extensions.u16()?;
            let mut data = Reader(extensions.vector16()?);
            if grease(kind) {
                continue;
            }
            hello.extensions.push(kind);
            match kind {
                EXT_ALPN => {
                    hello.alpn = data.vector16().and_then(|list| Reader(list).vector8()).filter(|p| !p.is_empty())
                }
                EXT_SIGNATURE_ALGORITHMS => hello.signature_algorithms = data.vector16().unwrap_or_default(),
                EXT_SUPPORTED_VERSIONS => supported = data.vector8().and_then(|versions| values(versions).max()),
                _ => {}
            }
        }
        hello.version = supported.unwrap_or(legacy_version);
        Some(hello)
    }

    fn ja4(&self) -> Ja4 {
        let mut text = [0u8; LENGTH];
        text[0] = b't';
        let version = VERSIONS.iter().find(|(value, _)| *value == self.version).map_or(b"00", |(_, chars)| *chars);
        text[1..3].copy_from_slice(version);
        text[3] = if self.extensions.contains(&EXT_SERVER_NAME) { b'd' } else { b'i' };
        text[4..6].copy_from_slice(&two_digits(self.ciphers.len()));
        text[6..8].copy_from_slice(&two_digits(self.extensions.len()));
        text[8..10].copy_from_slice(&alpn_chars(self.alpn));
        text[10] = b'_';
        let mut ciphers = self.ciphers.clone();
        ciphers.sort_unstable();
        text[11..23].copy_from_slice(&hash12(&hex_list(&ciphers)));
        text[23] = b'_';
        let mut extensions: Vec<u16> =
            self.extensions.iter().copied().filter(|&e| e != EXT_SERVER_NAME && e != EXT_ALPN).collect();
        extensions.sort_unstable();
        let mut listed = hex_list(&extensions);
        let signature_algorithms: Vec<u16> = values(self.signature_algorithms).collect();
        if !extensions.is_empty() && !signature_algorithms.is_empty() {
            listed.push('_');
            listed.push_str(&hex_list(&signature_algorithms));
        }
        text[24..].copy_from_slice(&hash12(&listed));
        Ja4(text)
    }
}

fn two_digits(count: usize) -> [u8; 2] {
    let count = u8::try_from(count.min(99)).unwrap_or(99);
    [b'0' + count / 10, b'0' + count % 10]
}

/// The first and last characters of the first ALPN protocol, or of its hex form if
/// either is not an ASCII letter or digit; `00` without one.
fn alpn_chars(protocol: Option<&[u8]>) -> [u8; 2] {
    let Some((&first, &last)) = protocol.and_then(|p| p.first().zip(p.last())) else { return *b"00" };
    if first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() {
        return [first, last];
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    [HEX[usize::from(first >> 4)], HEX[usize::from(last & 0x0f)]]
}

/// `0005,000a,…`: each value as four lower-case hex digits, comma separated.
fn hex_list(values: &[u16]) -> String {
    let mut list = String::with_capacity(values.len() * 5);
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{value:04x}");
    }
    list
}

/// The first 12 hex digits of the SHA-256 of `list`; twelve zeros for an empty one.
fn hash12(list: &str) -> [u8; HASH_CHARS] {
    if list.is_empty() {
        return *EMPTY_HASH;
    }
    let digest = hex::encode(&Sha256::digest(list.as_bytes())[..HASH_CHARS / 2]);
    let mut hash = *EMPTY_HASH;
    hash.copy_from_slice(digest.as_bytes());
    hash
}

#[cfg(test)]
mod tests;
