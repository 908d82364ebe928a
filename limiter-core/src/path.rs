//! The one canonical form of a request path, used for rule matching, for `+route`
//! keys and for what is forwarded upstream, so that the path a rule matched is the
//! path the upstream serves. Envoy's `normalize_path` + `merge_slashes` +
//! `path_with_escaped_slashes_action` is the model.
//!
//! From the path as received (without the query):
//!
//! 1. Percent-escapes of unreserved characters (RFC 3986 §2.3) are decoded
//!    (`%6c` → `l`, `%2E` → `.`); every other escape is kept, its hex in upper case.
//!    An escaped `/`, `\` or NUL (`%2F`, `%5C`, `%00`) and a raw `\` or NUL are refused, or
//!    with [`EscapedSlashes::Keep`] kept encoded (a raw `\` becomes `%5C`): a
//!    separator that some upstreams decode must never hide a path from the rules.
//!    A `%` not followed by two hex digits is refused. Characters that may not appear
//!    raw in a path (`"`, `{`, non-ASCII, …) are encoded, so both spellings agree.
//! 2. The path is split on `/`. Empty segments (`//`) are dropped; `.` and `..`
//!    segments are removed as in RFC 3986 §5.2.4 (`..` never climbs above the root),
//!    including escaped dots, once decoded, and dot segments with parameters
//!    (`..;x`), which Tomcat-style servers treat as `..`.
//! 3. Two forms come out. [`CanonicalPath::forward`] is what the upstream receives:
//!    the remaining segments with their `;parameters`, and a trailing `/` if the path
//!    had one. [`CanonicalPath::route`] is what rules and `+route` keys see: the same
//!    segments without `;parameters`, without a trailing `/`, and, when paths are
//!    case-insensitive (the default), lowercased. So `/login;x`, `/login/` and
//!    `/login` are one route, as servers that strip parameters or ignore a trailing
//!    slash see them, and so are `/LOGIN` and `/%4Cogin`.
//!
//! Folding case is the safe side whatever the upstream does: a deny, limit or
//! signature rule that matches more spellings than the upstream serves as one
//! resource over-matches, while one that matches fewer can be dodged. Besides ASCII,
//! the folded route turns the non-ASCII letters whose Unicode case mapping is an
//! ASCII letter (`ſ` → `s`, `ı` and `İ` → `i`, the Kelvin sign `K` → `k`) into that
//! letter, since upstreams that fold case with Unicode rules (.NET's
//! `OrdinalIgnoreCase`, `/iu` patterns) serve `/tranſfer` as `/transfer`.

use std::{fmt, str::FromStr};

/// What to do with an escaped `/`, `\` or NUL, or a raw `\` or NUL, in a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EscapedSlashes {
    /// Refuse the request: the safe choice whatever the upstream decodes.
    #[default]
    Reject,
    /// Keep it encoded, never decoded into a separator, for upstreams that do not
    /// decode them either.
    Keep,
}

impl EscapedSlashes {
    const ALL: [Self; 2] = [Self::Reject, Self::Keep];

    /// The config spelling.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Keep => "keep",
        }
    }
}

impl fmt::Display for EscapedSlashes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EscapedSlashes {
    type Err = PathError;

    fn from_str(name: &str) -> Result<Self, PathError> {
        Self::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| PathError::UnknownAction(name.to_owned()))
    }
}

/// How paths are canonicalised: the proxy's `escaped_slashes` and
/// `case_insensitive_paths`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathOptions {
    pub escaped_slashes: EscapedSlashes,
    /// Fold the route to lower case, so that rules also hold for upstreams that
    /// fold case themselves.
    pub case_insensitive: bool,
}

impl Default for PathOptions {
    fn default() -> Self {
        Self { escaped_slashes: EscapedSlashes::default(), case_insensitive: true }
    }
}

/// Why a path has no canonical form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path does not start with /")]
    NotAbsolute,
    #[error("`%` at byte {0} is not followed by two hex digits")]
    BadEscape(usize),
    #[error("an escaped slash, backslash or NUL, or a raw backslash or NUL, at byte {0}")]
    EscapedSeparator(usize),
    #[error("`{0}` is not an escaped_slashes action: use reject or keep")]
    UnknownAction(String),
}

/// A path in canonical form: what is forwarded, and what rules match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalPath {
    forward: String,
    route: String,
}

/// One segment of the decoded path: its name and its `;parameters` (with the `;`).
#[derive(Clone, Copy)]
struct Segment<'a> {
    name: &'a str,
    params: &'a str,
}

impl CanonicalPath {
    /// The canonical form of `raw`, a path as received (no query).
    pub fn parse(raw: &str, options: PathOptions) -> Result<Self, PathError> {
        if !raw.starts_with('/') {
            return Err(PathError::NotAbsolute);
        }
        let decoded = decode(raw, options.escaped_slashes)?;
        let mut kept: Vec<Segment<'_>> = Vec::new();
        let mut trailing_slash = false;
        for part in decoded.split('/').skip(1) {
            let (name, params) = part.find(';').map_or((part, ""), |at| part.split_at(at));
            // A trailing `/`, `/.` or `/..` leaves the path ending in a directory.
            trailing_slash = matches!(name, "." | "..") || part.is_empty();
            match name {
                "." => {}
                ".." => {
                    kept.pop();
                }
                "" if params.is_empty() => {}
                _ => kept.push(Segment { name, params }),
            }
        }
        let mut forward = String::with_capacity(decoded.len());
        let mut route = String::with_capacity(decoded.len());
        for segment in &kept {
            forward.push('/');
            forward.push_str(segment.name);
            forward.push_str(segment.params);
            if !segment.name.is_empty() {
                route.push('/');
                route.push_str(segment.name);
            }
        }
        if forward.is_empty() || trailing_slash {
            forward.push('/');
        }
        if route.is_empty() {
            route.push('/');
        }
        if options.case_insensitive {
            route = fold_case(&route);
        }
        Ok(Self { forward, route })
    }

    /// The path to send upstream.
    #[must_use]
    pub fn forward(&self) -> &str {
        &self.forward
    }

    /// The path rules and `+route` keys see.
    #[must_use]
    pub fn route(&self) -> &str {
        &self.route
    }
}

/// `unreserved` of RFC 3986 §2.3: the characters whose escaped and raw forms are the
/// same resource.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// What may stay raw in a path: `pchar` (RFC 3986 §3.3) apart from `%`, and `/`.
fn is_raw_path_char(byte: u8) -> bool {
    is_unreserved(byte)
        || matches!(
            byte,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@' | b'/'
        )
}

/// Decoded into what a separator-aware server would see, except that escaped
/// separators stay escaped (or are refused).
fn decode(raw: &str, escaped_slashes: EscapedSlashes) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        let (value, escaped) = if byte == b'%' {
            let hex = bytes.get(at + 1..at + 3).and_then(|pair| std::str::from_utf8(pair).ok());
            let value = hex
                .filter(|pair| pair.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(PathError::BadEscape(at))?;
            (value, true)
        } else {
            (byte, false)
        };
        // A raw `/` is the separator itself; `\` and NUL are treated as one however sent.
        let separator = matches!(value, b'\\' | 0) || (escaped && value == b'/');
        if separator && escaped_slashes == EscapedSlashes::Reject {
            return Err(PathError::EscapedSeparator(at));
        }
        if separator || (escaped && !is_unreserved(value)) || (!escaped && !is_raw_path_char(value)) {
            push_escape(&mut out, value);
        } else {
            out.push(char::from(value));
        }
        at += if escaped { 3 } else { 1 };
    }
    Ok(out)
}

fn push_escape(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0xF)]));
}

/// Non-ASCII letters whose Unicode case mapping is an ASCII letter, as the route
/// holds them (UTF-8, escaped in upper-case hex), and that letter.
const FOLDS_TO_ASCII: [(&str, char); 4] = [("%C5%BF", 's'), ("%C4%B1", 'i'), ("%C4%B0", 'i'), ("%E2%84%AA", 'k')];

/// Lower case outside escapes, whose hex stays upper case; the escaped letters of
/// [`FOLDS_TO_ASCII`] become their ASCII letter.
fn fold_case(route: &str) -> String {
    let mut out = String::with_capacity(route.len());
    let mut rest = route;
    while let Some(c) = rest.chars().next() {
        let taken = if let Some(&(escape, letter)) = FOLDS_TO_ASCII.iter().find(|(escape, _)| rest.starts_with(escape))
        {
            out.push(letter);
            escape.len()
        } else if c == '%' {
            let escape = rest.get(..3).unwrap_or(rest);
            out.push_str(escape);
            escape.len()
        } else {
            out.push(c.to_ascii_lowercase());
            c.len_utf8()
        };
        rest = &rest[taken..];
    }
    out
}

#[cfg(test)]
mod tests;
