//! `count_when` of a limit rule: which of the upstream's answers count. A request
//! the rule matches still needs a unit of its bucket, taken before it is forwarded
//! (so that requests in flight together never pass the limit), and gets it back once
//! the upstream's answer turns out to be one the rule does not count.

use std::fmt;

use http::StatusCode;
use serde::{Deserialize, Deserializer, de};

use super::changes::{Changes, shown};

/// `count_when = { status = [...] }`.
#[derive(Clone, Debug, PartialEq, Eq, Changes)]
pub struct CountWhen {
    /// The answers that keep the unit; any other gives it back.
    pub status: Vec<StatusMatch>,
}

/// One entry of `count_when.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusMatch {
    /// One status of the upstream's answer: `"401"`.
    Code(StatusCode),
    /// Every status of a class: `"4xx"` (the hundreds digit).
    Class(u16),
    /// No answer: the upstream did not send its head within `upstream_timeout`, or
    /// could not be reached or broke the connection (the proxy answers 504 or 502).
    Timeout,
}

/// What became of a forwarded request, as `count_when` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The upstream's response head had this status.
    Status(StatusCode),
    /// See [`StatusMatch::Timeout`].
    Timeout,
    /// The request never went whole: its body came too slowly, or no upstream
    /// connection was free. No entry matches it.
    Unsent,
}

impl CountWhen {
    /// Whether `answer` keeps the request's unit.
    #[must_use]
    pub fn counts(&self, answer: Answer) -> bool {
        self.status.iter().any(|entry| entry.matches(answer))
    }
}

impl StatusMatch {
    /// Whether `answer` is one this entry names.
    #[must_use]
    pub fn matches(self, answer: Answer) -> bool {
        match (self, answer) {
            (Self::Code(code), Answer::Status(status)) => code == status,
            (Self::Class(class), Answer::Status(status)) => status.as_u16() / 100 == class,
            (Self::Timeout, Answer::Timeout) => true,
            _ => false,
        }
    }

    /// An entry as written: `"401"` (or 401), `"4xx"`, `"timeout"`.
    fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        match bytes {
            [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => text.parse().ok().and_then(Self::code),
            [class @ b'1'..=b'5', x, y] if x.eq_ignore_ascii_case(&b'x') && y.eq_ignore_ascii_case(&b'x') => {
                Some(Self::Class(u16::from(class - b'0')))
            }
            _ if text == "timeout" => Some(Self::Timeout),
            _ => None,
        }
    }

    fn code(code: i64) -> Option<Self> {
        let code = u16::try_from(code).ok().filter(|code| (100..=599).contains(code))?;
        StatusCode::from_u16(code).ok().map(Self::Code)
    }
}

impl fmt::Display for StatusMatch {
    /// As written in the config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(code) => write!(f, "{}", code.as_u16()),
            Self::Class(class) => write!(f, "{class}xx"),
            Self::Timeout => f.write_str("timeout"),
        }
    }
}

shown!(StatusMatch => ToString::to_string);

/// `count_when` as written; [`CountWhen::try_from`] checks it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCountWhen {
    status: Vec<RawStatus>,
}

/// An entry of `status` (or of `[proxy.adaptive] losses`), a string or a number,
/// checked with the rule.
#[derive(Debug)]
pub(super) enum RawStatus {
    Text(String),
    Number(i64),
}

impl<'de> Deserialize<'de> for RawStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;

        impl de::Visitor<'_> for Entry {
            type Value = RawStatus;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status (\"401\"), a class (\"4xx\") or \"timeout\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawStatus, E> {
                Ok(RawStatus::Text(text.to_owned()))
            }

            fn visit_i64<E: de::Error>(self, number: i64) -> Result<RawStatus, E> {
                Ok(RawStatus::Number(number))
            }
        }

        deserializer.deserialize_any(Entry)
    }
}

impl TryFrom<RawCountWhen> for CountWhen {
    type Error = String;

    fn try_from(raw: RawCountWhen) -> Result<Self, String> {
        if raw.status.is_empty() {
            return Err("count_when.status needs an entry: with none, every request would get its unit back".to_owned());
        }
        let status = statuses(&raw.status).map_err(|error| format!("count_when.status: {error}"))?;
        Ok(Self { status })
    }
}

/// Entries as written, checked.
pub(super) fn statuses(raw: &[RawStatus]) -> Result<Vec<StatusMatch>, String> {
    raw.iter()
        .map(|entry| {
            let (parsed, written) = match entry {
                RawStatus::Text(text) => (StatusMatch::parse(text), format!("\"{text}\"")),
                RawStatus::Number(number) => (StatusMatch::code(*number), number.to_string()),
            };
            parsed.ok_or_else(|| {
                format!("{written} is not a status (100 to 599), a class (\"1xx\" to \"5xx\") or \"timeout\"")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::{Answer, StatusMatch};

    fn status(code: u16) -> Answer {
        Answer::Status(StatusCode::from_u16(code).expect("a status"))
    }

    #[test]
    fn codes_classes_and_timeout_match_what_they_say_and_nothing_else() {
        let parsed = |text: &str| StatusMatch::parse(text).unwrap_or_else(|| panic!("{text}"));
        assert!(parsed("401").matches(status(401)) && !parsed("401").matches(status(403)));
        assert!(parsed("4xx").matches(status(499)) && parsed("4XX").matches(status(400)));
        assert!(!parsed("4xx").matches(status(500)) && !parsed("5xx").matches(Answer::Timeout));
        assert!(parsed("timeout").matches(Answer::Timeout) && !parsed("timeout").matches(status(504)));
        for entry in ["401", "4xx", "timeout", "5xx"] {
            assert!(!parsed(entry).matches(Answer::Unsent), "{entry}");
            assert_eq!(parsed(entry).to_string(), entry, "shown as written");
        }
        for bad in ["", "4", "40", "4011", "099", "600", "999", "6xx", "0xx", "x01", "4x1", "Timeout", " 401", "+40"] {
            assert_eq!(StatusMatch::parse(bad), None, "{bad:?}");
        }
        assert_eq!(StatusMatch::code(599), StatusMatch::parse("599"));
        assert_eq!((StatusMatch::code(99), StatusMatch::code(600), StatusMatch::code(-401)), (None, None, None));
    }
}
