//! A rule's request conditions beyond its path and methods: headers present, absent
//! or matching a pattern, query parameters, the announced body size, the client, its
//! TLS fingerprint.
//!
//! Patterns are the `regex` crate's, over bytes: matching takes time linear in the
//! input whatever the pattern (no backtracking, so no input an attacker chooses can
//! make it slow), a header that is not UTF-8 is matched as it is rather than skipped,
//! and each pattern is compiled once, at load, within a bound on its size.

use std::{collections::BTreeMap, net::IpAddr};

use http::{
    HeaderMap, HeaderName,
    header::{CONTENT_LENGTH, TRANSFER_ENCODING},
};
use ipnet::IpNet;
use limiter_core::ja4::{Ja4, NotJa4};
use regex::bytes::{Regex, RegexBuilder};

use crate::changes::shown;

/// Longest pattern text accepted.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// Bound on a compiled pattern (and on its lazy DFA), so that a pattern such as
/// `\w{1000}{1000}` is refused at load instead of taking the agent's memory.
const COMPILED_BYTES: usize = 1 << 20;

/// A compiled pattern, compared by its text.
#[derive(Clone, Debug)]
pub struct Pattern(Regex);

shown!(Pattern => |pattern| pattern.as_str().to_owned());

impl Pattern {
    pub fn new(text: &str) -> Result<Self, String> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(format!("a pattern is at most {MAX_PATTERN_BYTES} bytes long"));
        }
        RegexBuilder::new(text)
            .size_limit(COMPILED_BYTES)
            .dfa_size_limit(COMPILED_BYTES)
            .build()
            .map(Self)
            .map_err(|error| format!("pattern `{text}`: {error}"))
    }

    #[must_use]
    pub fn is_match(&self, bytes: &[u8]) -> bool {
        self.0.is_match(bytes)
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Pattern {}

/// What a rule's conditions look at in a request.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    pub method: &'a http::Method,
    /// The canonical route.
    pub path: &'a str,
    /// The query as sent, without `?`.
    pub query: Option<&'a str>,
    pub client: IpAddr,
    pub headers: &'a HeaderMap,
    /// The body's length as known before it is read: its `Content-Length`, 0 when the
    /// head ended the request; `None` when only reading it tells (chunked, or HTTP/2
    /// DATA frames without `content-length`).
    pub body_length: Option<u64>,
    /// The JA4 fingerprint of the client's TLS handshake, if it has one.
    pub ja4: Option<Ja4>,
}

/// Every condition must hold for the rule to apply; none set: any request.
#[derive(Clone, Debug, Default, PartialEq, Eq, crate::changes::Changes)]
pub struct Conditions {
    /// The canonical path matches.
    pub path_matches: Option<Pattern>,
    /// The query as sent matches.
    pub query_matches: Option<Pattern>,
    /// Each of these query parameters is present (by name, percent-decoded).
    pub query_params: Vec<String>,
    pub headers_present: Vec<HeaderName>,
    pub headers_absent: Vec<HeaderName>,
    /// Some value of each header matches its pattern.
    pub header_matches: Vec<(HeaderName, Pattern)>,
    /// The announced body is larger; a body of unknown length (chunked, or HTTP/2
    /// without `content-length`) counts as larger, since its size is not known
    /// before it is read.
    pub body_larger_than: Option<u64>,
    /// The client is in one of these.
    pub clients: Vec<IpNet>,
    /// The client's TLS fingerprint is one of these; a request without one is in none.
    pub ja4: Vec<Ja4>,
    /// The client's TLS fingerprint matches; a request without one does not.
    pub ja4_matches: Option<Pattern>,
}

/// A rule's `when` table as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConditions {
    path_matches: Option<String>,
    query_matches: Option<String>,
    query_params: Vec<String>,
    headers_present: Vec<String>,
    headers_absent: Vec<String>,
    header_matches: BTreeMap<String, String>,
    body_larger_than: Option<u64>,
    clients: Vec<String>,
    ja4: Vec<String>,
    ja4_matches: Option<String>,
}

impl TryFrom<RawConditions> for Conditions {
    type Error = String;

    fn try_from(raw: RawConditions) -> Result<Self, String> {
        let header =
            |name: &String| HeaderName::try_from(name.as_str()).map_err(|_| format!("`{name}` is not a header name"));
        let headers = |names: &[String]| names.iter().map(header).collect::<Result<Vec<_>, _>>();
        Ok(Self {
            path_matches: raw.path_matches.as_deref().map(Pattern::new).transpose()?,
            query_matches: raw.query_matches.as_deref().map(Pattern::new).transpose()?,
            query_params: raw.query_params,
            headers_present: headers(&raw.headers_present)?,
            headers_absent: headers(&raw.headers_absent)?,
            header_matches: raw
                .header_matches
                .iter()
                .map(|(name, pattern)| Ok((header(name)?, Pattern::new(pattern)?)))
                .collect::<Result<_, String>>()?,
            body_larger_than: raw.body_larger_than,
            clients: raw.clients.iter().map(|cidr| super::xdp::parse_cidr(cidr)).collect::<Result<_, _>>()?,
            ja4: raw
                .ja4
                .iter()
                .map(|text| text.parse().map_err(|error: NotJa4| error.to_string()))
                .collect::<Result<_, _>>()?,
            ja4_matches: raw.ja4_matches.as_deref().map(Pattern::new).transpose()?,
        })
    }
}

impl Conditions {
    /// Whether every condition holds for `seen`.
    #[must_use]
    pub fn hold(&self, seen: &Seen<'_>) -> bool {
        let query = seen.query.unwrap_or("");
        self.path_matches.as_ref().is_none_or(|p| p.is_match(seen.path.as_bytes()))
            && self.query_matches.as_ref().is_none_or(|p| p.is_match(query.as_bytes()))
            && self.query_params.iter().all(|name| has_param(query, name))
            && self.headers_present.iter().all(|name| seen.headers.contains_key(name))
            && self.headers_absent.iter().all(|name| !seen.headers.contains_key(name))
            && self.header_matches.iter().all(|(name, pattern)| {
                seen.headers.get_all(name).iter().any(|value| pattern.is_match(value.as_bytes()))
            })
            && self.body_larger_than.is_none_or(|bound| seen.body_length.is_none_or(|n| n > bound))
            && (self.clients.is_empty() || self.clients.iter().any(|net| net.contains(&seen.client.to_canonical())))
            && (self.ja4.is_empty() || seen.ja4.is_some_and(|ja4| self.ja4.contains(&ja4)))
            && self.ja4_matches.as_ref().is_none_or(|p| seen.ja4.is_some_and(|ja4| p.is_match(ja4.as_str().as_bytes())))
    }

    /// Whether a condition reads the client's TLS fingerprint.
    #[must_use]
    pub fn needs_fingerprint(&self) -> bool {
        !self.ja4.is_empty() || self.ja4_matches.is_some()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The length an HTTP/1.1 head announces for its body: its one `Content-Length`, 0
/// without one, `None` for a chunked body (hyper refuses a request with both, or with
/// two lengths). For a request that is not on the wire (`limiter explain`): a served
/// one takes the length hyper read from the head, whatever the protocol.
#[must_use]
pub fn http1_body_length(headers: &HeaderMap) -> Option<u64> {
    match headers.get(CONTENT_LENGTH) {
        Some(value) => value.to_str().ok()?.trim().parse().ok(),
        None if headers.contains_key(TRANSFER_ENCODING) => None,
        None => Some(0),
    }
}

/// Whether the query has a parameter called `name`, once percent-decoded.
fn has_param(query: &str, name: &str) -> bool {
    pairs(query).any(|(key, _)| key == name || percent_decoded(key).as_deref() == Some(name.as_bytes()))
}

/// The values, percent-decoded, of the query's parameters called `name` (a name
/// without `=` has the empty value; one that does not decode is skipped).
pub(crate) fn param_values<'q>(query: &'q str, name: &'q str) -> impl Iterator<Item = Vec<u8>> + 'q {
    pairs(query)
        .filter(move |(key, _)| *key == name || percent_decoded(key).as_deref() == Some(name.as_bytes()))
        .filter_map(|(_, value)| percent_decoded(value))
}

/// The query's `name=value` pairs as sent.
fn pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query.split('&').map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

fn percent_decoded(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Some(out)
}
