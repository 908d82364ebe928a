//! Human units in the config: durations like `"200ms"`, `"10s"`, `"1m"`, `"24h"`.

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, de};

use crate::changes::shown;

/// A duration written with a unit: `ms`, `s`, `m`, `h` or `d` (`"1m"`, `"250ms"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// Parses `"<integer><unit>"`.
    ///
    /// ```
    /// use limiter_config::units::HumanDuration;
    /// assert_eq!(HumanDuration::parse("1m").unwrap().0.as_secs(), 60);
    /// assert!(HumanDuration::parse("1 minute").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, String> {
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a duration: write a whole number and a unit, like \"10s\""))?;
        let millis_per_unit = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("`{text}` has unit `{unit}`; use ms, s, m, h or d")),
        };
        number
            .checked_mul(millis_per_unit)
            .map(|millis| Self(Duration::from_millis(millis)))
            .ok_or_else(|| format!("`{text}` is too long a duration"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
            if millis != 0 && millis.is_multiple_of(size) {
                return write!(f, "{}{unit}", millis / size);
            }
        }
        write!(f, "{millis}ms")
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::HumanDuration;

    #[test]
    fn parses_every_unit() {
        for (text, millis) in
            [("250ms", 250), ("10s", 10_000), ("1m", 60_000), ("24h", 86_400_000), ("2d", 172_800_000)]
        {
            assert_eq!(HumanDuration::parse(text), Ok(HumanDuration(Duration::from_millis(millis))), "{text}");
            let shown = HumanDuration::parse(text).map(|d| d.to_string()).expect("valid");
            assert_eq!(HumanDuration::parse(&shown), HumanDuration::parse(text), "{text} shown as {shown}");
        }
    }

    #[test]
    fn rejects_bad_text() {
        for text in ["", "10", "s", "1.5s", "-1s", "10 s", "10sec", "99999999999999999999d"] {
            assert!(HumanDuration::parse(text).is_err(), "{text}");
        }
    }
}

shown!(
    HumanDuration => ToString::to_string,
    Duration => |duration| HumanDuration(*duration).to_string(),
);
