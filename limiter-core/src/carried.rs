//! The values a rule's key reads from what a request carries: a member of a JSON
//! body by RFC 6901 pointer, a field of a form body, a query parameter, a cookie.
//!
//! Each answers the value's bytes or `None`, and `None` is a missing key: the
//! limits then count the request in the rule's shared missing-key bucket, so that
//! nothing a client sends (a malformed body, a duplicate member) makes it unlimited.
//! Where frameworks disagree on which of two copies of a name they take, a body
//! with two is missing too: a JSON member or a form field named twice could key
//! the bucket by one copy while the upstream acts on the other.

use std::{borrow::Cow, fmt, str::FromStr};

use percent_encoding::percent_decode;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// An RFC 6901 JSON pointer: `/user/email`, `/items/0`, `/a~1b` (the member `a/b`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

/// Why a pointer is not RFC 6901.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error("a JSON pointer is empty or starts with /")]
    NoLeadingSlash,
    #[error("`~` in a JSON pointer is followed by 0 or 1 (`~0` is `~`, `~1` is `/`)")]
    BadEscape,
}

impl FromStr for JsonPointer {
    type Err = PointerError;

    fn from_str(text: &str) -> Result<Self, PointerError> {
        let tokens = match text.strip_prefix('/') {
            None if text.is_empty() => Vec::new(),
            None => return Err(PointerError::NoLeadingSlash),
            Some(rest) => rest.split('/').map(unescape).collect::<Result<_, _>>()?,
        };
        Ok(Self { text: text.to_owned(), tokens })
    }
}

fn unescape(token: &str) -> Result<String, PointerError> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            _ => return Err(PointerError::BadEscape),
        }
    }
    Ok(out)
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The value `pointer` names in the JSON text `body`: a string's (unescaped), a
/// number's or a boolean's canonical text (`1`, `1.0` and `1e0` are all `1`).
/// `None` when the body is not JSON, the pointer names nothing, an object, an
/// array or `null`, or a member on its way is named twice.
#[must_use]
pub fn json_value(body: &[u8], pointer: &JsonPointer) -> Option<String> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let found = Follow { tokens: &pointer.tokens }.deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    match found {
        Found::Value(value) => Some(value),
        Found::Missing => None,
    }
}

enum Found {
    Value(String),
    Missing,
}

/// Walks a JSON document down the pointer's tokens, skipping the rest without
/// building it: the memory a body costs is its largest string.
struct Follow<'p> {
    tokens: &'p [String],
}

impl Follow<'_> {
    fn scalar(&self, text: String) -> Found {
        if self.tokens.is_empty() { Found::Value(text) } else { Found::Missing }
    }
}

impl<'de> DeserializeSeed<'de> for Follow<'_> {
    type Value = Found;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Found, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Follow<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Found, E> {
        Ok(self.scalar(value.to_string()))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Found, E> {
        Ok(self.scalar(value.to_string()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Found, E> {
        Ok(self.scalar(value.to_string()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Found, E> {
        Ok(self.scalar(value.to_string()))
    }

    fn visit_str<E>(self, value: &str) -> Result<Found, E> {
        Ok(self.scalar(value.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::Missing)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let Some((token, rest)) = self.tokens.split_first() else {
            while map.next_entry_seed(Skip, Skip)?.is_some() {}
            return Ok(Found::Missing);
        };
        let mut found = None;
        while let Some(name) = map.next_key::<Cow<'_, str>>()? {
            if name == token.as_str() {
                let value = map.next_value_seed(Follow { tokens: rest })?;
                found = match found {
                    None => Some(value),
                    Some(_) => Some(Found::Missing),
                };
            } else {
                map.next_value_seed(Skip)?;
            }
        }
        Ok(found.unwrap_or(Found::Missing))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let wanted = self.tokens.split_first().and_then(|(token, rest)| Some((array_index(token)?, rest)));
        let mut found = Found::Missing;
        let mut index = 0;
        loop {
            match wanted {
                Some((wanted, rest)) if wanted == index => match seq.next_element_seed(Follow { tokens: rest })? {
                    Some(value) => found = value,
                    None => break,
                },
                _ => {
                    if seq.next_element_seed(Skip)?.is_none() {
                        break;
                    }
                }
            }
            index += 1;
        }
        Ok(found)
    }
}

/// Whatever is off the pointer's way, read and dropped. Not serde's `IgnoredAny`:
/// serde_json skips that without checking its strings (their UTF-8, their escapes),
/// and a body the upstream cannot parse must not key by a member it never reads.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry_seed(Skip, Skip)?.is_some() {}
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }
}

/// RFC 6901's array index: `0`, or digits without a leading zero (`-`, the end of
/// the array, names nothing that exists).
fn array_index(token: &str) -> Option<usize> {
    let digits = token.bytes().all(|b| b.is_ascii_digit()) && !token.is_empty();
    (digits && (token == "0" || !token.starts_with('0'))).then(|| token.parse().ok()).flatten()
}

/// The field `name` of an `application/x-www-form-urlencoded` body, decoded (`+` is
/// a space, then percent escapes); `None` when there is none or more than one.
#[must_use]
pub fn form_field<'b>(body: &'b [u8], name: &str) -> Option<Cow<'b, [u8]>> {
    let mut fields = urlencoded_pairs(body).filter(|(field, _)| field.as_ref() == name.as_bytes());
    let (_, value) = fields.next()?;
    fields.next().is_none().then_some(value)
}

/// The first parameter `name` of a query (without `?`), decoded as a form field is.
#[must_use]
pub fn query_value<'q>(query: &'q str, name: &str) -> Option<Cow<'q, [u8]>> {
    urlencoded_pairs(query.as_bytes()).find(|(field, _)| field.as_ref() == name.as_bytes()).map(|(_, value)| value)
}

fn urlencoded_pairs(text: &[u8]) -> impl Iterator<Item = (Cow<'_, [u8]>, Cow<'_, [u8]>)> {
    text.split(|&b| b == b'&').filter(|pair| !pair.is_empty()).map(|pair| {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        (form_decode(name), form_decode(value))
    })
}

fn form_decode(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.contains(&b'+') {
        return percent_decode(text).into();
    }
    let spaced: Vec<u8> = text.iter().map(|&b| if b == b'+' { b' ' } else { b }).collect();
    Cow::Owned(percent_decode(&spaced).collect())
}

/// The first cookie `name` in the `Cookie` header lines (HTTP/2 sends one per
/// cookie), its value as sent.
pub fn cookie_value<'h>(lines: impl IntoIterator<Item = &'h [u8]>, name: &str) -> Option<&'h [u8]> {
    lines.into_iter().flat_map(|line| line.split(|&b| b == b';')).find_map(|pair| {
        let pair = pair.trim_ascii();
        let at = pair.iter().position(|&b| b == b'=')?;
        (pair[..at].trim_ascii() == name.as_bytes()).then(|| pair[at + 1..].trim_ascii())
    })
}

/// The kinds of body a key can be read from, by the `Content-Type` it comes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`, or any `+json` type (`application/merge-patch+json`).
    Json,
    /// `application/x-www-form-urlencoded`.
    Form,
}

impl BodyFormat {
    /// The format a `Content-Type` value names, parameters (`; charset=utf-8`) aside.
    #[must_use]
    pub fn of_content_type(value: &[u8]) -> Option<Self> {
        let essence = value.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        let essence = std::str::from_utf8(essence).ok()?.to_ascii_lowercase();
        if essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json")) {
            Some(Self::Json)
        } else if essence == "application/x-www-form-urlencoded" {
            Some(Self::Form)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(text: &str) -> JsonPointer {
        text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn json(body: &str, at: &str) -> Option<String> {
        json_value(body.as_bytes(), &pointer(at))
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        assert_eq!(pointer("/a~1b/~0c").tokens, ["a/b", "~c"]);
        assert_eq!(pointer("").tokens, Vec::<String>::new());
        assert_eq!(pointer("/").tokens, [""]);
        assert_eq!("username".parse::<JsonPointer>(), Err(PointerError::NoLeadingSlash));
        assert_eq!("/a~2".parse::<JsonPointer>(), Err(PointerError::BadEscape));
        assert_eq!("/a~".parse::<JsonPointer>(), Err(PointerError::BadEscape));
        assert_eq!(pointer("/user/email").to_string(), "/user/email");
    }

    #[test]
    fn a_json_value_is_its_text_and_anything_else_is_missing() {
        let body = r#"{"username":"Al\u0069ce","user":{"email":"a@x","id":7,"ok":true,"n":1.0,"none":null},
                       "list":[10,[20,21]],"a/b":{"~c":"deep"},"":"empty"}"#;
        assert_eq!(json(body, "/username").as_deref(), Some("Alice"));
        assert_eq!(json(body, "/user/email").as_deref(), Some("a@x"));
        assert_eq!(json(body, "/user/id").as_deref(), Some("7"));
        assert_eq!(json(body, "/user/ok").as_deref(), Some("true"));
        assert_eq!(json(body, "/user/n").as_deref(), Some("1"), "1.0 keys as 1");
        assert_eq!(json(body, "/list/1/0").as_deref(), Some("20"));
        assert_eq!(json(body, "/a~1b/~0c").as_deref(), Some("deep"));
        assert_eq!(json(body, "/").as_deref(), Some("empty"));
        for missing in ["/user", "/list", "/user/none", "/nobody", "/username/x", "/list/2", "/list/01", "/list/-", ""]
        {
            assert_eq!(json(body, missing), None, "{missing}");
        }
        assert_eq!(json("\"alice\"", "").as_deref(), Some("alice"), "the whole document");
    }

    #[test]
    fn a_body_that_is_not_one_json_document_or_names_a_member_twice_is_missing() {
        for body in [
            r#"{"username":"alice""#,
            r#"{"username":"alice"} {"username":"bob"}"#,
            r#"{"username":"alice",}"#,
            r#"{"username":"alice","username":"bob"}"#,
            r#"{"user":{"name":"alice"},"user":{"name":"bob"}}"#,
            "",
            "username=alice",
        ] {
            assert_eq!(json(body, "/username"), None, "{body}");
        }
        // Found by the fuzz target: text the walk skips is checked as well.
        let skipped_not_utf8 = b"{\"username\":\"alice\",\"\x9f\":true}";
        assert_eq!(json_value(skipped_not_utf8, &pointer("/username")), None);
        assert_eq!(json(r#"{"other":"\ude00","username":"alice"}"#, "/username"), None, "a lone surrogate");
        assert_eq!(
            json(r#"{"user":{"name":"alice"},"other":{"name":"x","name":"y"}}"#, "/user/name").as_deref(),
            Some("alice"),
            "a duplicate off the pointer's way is harmless"
        );
        assert_eq!(
            json(&format!("{}1{}", "[".repeat(1000), "]".repeat(1000)), "/0"),
            None,
            "too deep: refused, no overflow"
        );
    }

    #[test]
    fn form_fields_and_query_parameters_decode() {
        let body = b"username=Alice+B%26C&password=x%3Dy&flag&empty=";
        assert_eq!(form_field(body, "username").as_deref(), Some(&b"Alice B&C"[..]));
        assert_eq!(form_field(body, "password").as_deref(), Some(&b"x=y"[..]));
        assert_eq!(form_field(body, "flag").as_deref(), Some(&b""[..]));
        assert_eq!(form_field(body, "nobody"), None);
        assert_eq!(form_field(b"user%6Eame=a", "username").as_deref(), Some(&b"a"[..]), "names decode too");
        assert_eq!(form_field(b"username=a&username=b", "username"), None, "named twice");
        assert_eq!(query_value("page=2&page=3&q=a%20b", "page").as_deref(), Some(&b"2"[..]), "the first");
        assert_eq!(query_value("page=2&q=a%20b+c", "q").as_deref(), Some(&b"a b c"[..]));
        assert_eq!(query_value("q=%ff", "q").as_deref(), Some(&[0xff][..]), "bytes, not necessarily text");
    }

    #[test]
    fn cookies_are_found_in_any_line() {
        let lines: [&[u8]; 2] = [b"theme=dark; session = abc ", b"session=second; tenant=acme"];
        assert_eq!(cookie_value(lines, "session"), Some(&b"abc"[..]));
        assert_eq!(cookie_value(lines, "tenant"), Some(&b"acme"[..]));
        assert_eq!(cookie_value(lines, "ession"), None);
        assert_eq!(cookie_value(lines, "none"), None);
    }

    #[test]
    fn content_types_name_their_format() {
        assert_eq!(BodyFormat::of_content_type(b"application/json"), Some(BodyFormat::Json));
        assert_eq!(BodyFormat::of_content_type(b"Application/JSON; charset=utf-8"), Some(BodyFormat::Json));
        assert_eq!(BodyFormat::of_content_type(b"application/merge-patch+json"), Some(BodyFormat::Json));
        assert_eq!(BodyFormat::of_content_type(b"application/x-www-form-urlencoded"), Some(BodyFormat::Form));
        assert_eq!(BodyFormat::of_content_type(b"text/plain"), None);
        assert_eq!(BodyFormat::of_content_type(b"text/json+x"), None);
    }
}
