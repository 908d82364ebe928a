//! Calendar windows: a day, a week (Monday to Monday) or a month, turning at
//! midnight in a time zone rather than on multiples of a length since the epoch, so
//! that a monthly quota is full again on the first of the month whatever the month's
//! length, and a Berlin day across the change to summer time is 23 hours.
//!
//! Zones are [jiff]'s, from the tz database it bundles: the agent needs no system
//! tzdata, and every agent of a fleet turns its windows at the same instants whatever
//! its host has installed.

use std::{fmt, str::FromStr, time::Duration};

use jiff::{
    Timestamp, ToSpan,
    civil::Date,
    tz::{self, TimeZone},
};

/// The length of a calendar window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    /// ISO weeks: from Monday's midnight.
    Week,
    Month,
}

impl Period {
    /// The name a limit's `window` is written with.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    /// The usual length, for what speaks in lengths (the headers' `w`, `limiter
    /// suggest`): 1, 7 and 30 days.
    #[must_use]
    pub const fn nominal(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Self::Day => DAY,
            Self::Week => 7 * DAY,
            Self::Month => 30 * DAY,
        })
    }
}

impl FromStr for Period {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        [Self::Day, Self::Week, Self::Month].into_iter().find(|period| period.name() == text).ok_or(())
    }
}

/// A zone named by `calendar_tz`: `UTC` or an IANA name.
#[derive(Clone)]
pub struct Zone {
    name: String,
    zone: TimeZone,
}

/// Why a `calendar_tz` names no zone.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a time zone: UTC or an IANA name such as Europe/Berlin")]
pub struct UnknownZone(pub String);

impl Zone {
    /// The zone `name` names in the bundled tz database.
    pub fn named(name: &str) -> Result<Self, UnknownZone> {
        let zone = tz::db().get(name).map_err(|_| UnknownZone(name.to_owned()))?;
        Ok(Self { name: name.to_owned(), zone })
    }

    /// UTC, the default.
    #[must_use]
    pub fn utc() -> Self {
        Self { name: "UTC".to_owned(), zone: TimeZone::UTC }
    }

    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Default for Zone {
    fn default() -> Self {
        Self::utc()
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Zones are told apart by name: the database is the same for every one.
impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

/// A calendar window: its period, turning at midnight in its zone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub period: Period,
    pub zone: Zone,
}

impl Calendar {
    /// The window containing `now` (time since the UNIX epoch): its start and end.
    #[must_use]
    pub fn bounds(&self, now: Duration) -> (Duration, Duration) {
        let now = i128::try_from(now.as_nanos()).unwrap_or(i128::MAX);
        let zone = &self.zone.zone;
        let today = Timestamp::from_nanosecond(now).unwrap_or(Timestamp::MAX).to_zoned_datetime(zone.clone()).date();
        let first = match self.period {
            Period::Day => Some(today),
            Period::Week => today.checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days()).ok(),
            Period::Month => Some(today.first_of_month()),
        };
        let next = first.and_then(|first| {
            match self.period {
                Period::Day => first.tomorrow(),
                Period::Week => first.checked_add(7.days()),
                Period::Month => first.checked_add(1.month()),
            }
            .ok()
        });
        let midnight = |date: Option<Date>| {
            let instant = date.and_then(|date| date.to_zoned_datetime(zone.clone()).ok()).map(|z| z.timestamp());
            // Past the years jiff reaches (9999): a window that never turns.
            instant.map_or(Duration::MAX, |t| Duration::from_nanos(u64::try_from(t.as_nanosecond()).unwrap_or(0)))
        };
        (midnight(first), midnight(next))
    }

    /// The boundaries around `now`: the start of the window before the one containing
    /// it, that window's start and end, and the end of the one after. A store that
    /// measures time by another clock (Redis's) finds its window among them while the
    /// clocks are less than a window apart.
    #[must_use]
    pub fn around(&self, now: Duration) -> [Duration; 4] {
        let (start, end) = self.bounds(now);
        let previous = self.bounds(start.saturating_sub(Duration::from_nanos(1))).0;
        [previous, start, end, self.bounds(end).1]
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {}", self.period.name(), self.zone.name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Calendar, Period, Zone};

    fn calendar(period: Period, zone: &str) -> Calendar {
        Calendar { period, zone: Zone::named(zone).expect("zone") }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// 2027-01-31T23:59:50Z: the month ends at 2027-02-01T00:00:00Z, 1801440000.
    #[test]
    fn a_month_ends_on_the_first_of_the_next() {
        let (start, end) = calendar(Period::Month, "UTC").bounds(secs(1_801_439_990));
        assert_eq!((start, end), (secs(1_798_761_600), secs(1_801_440_000)));
        let (start, end) = calendar(Period::Month, "UTC").bounds(secs(1_801_440_000));
        assert_eq!(start, secs(1_801_440_000), "the boundary belongs to the new month");
        assert_eq!(end - start, secs(28 * 86_400), "February 2027");
    }

    /// Summer time begins in Berlin on 2027-03-28 at 02:00 (01:00Z): that day has 23 hours,
    /// the one in October 25.
    #[test]
    fn a_berlin_day_across_the_dst_change_is_23_hours() {
        let berlin = calendar(Period::Day, "Europe/Berlin");
        // 2027-03-28T12:00:00Z.
        let (start, end) = berlin.bounds(secs(1_806_235_200));
        assert_eq!(end - start, secs(23 * 3600));
        assert_eq!(start, secs(1_806_188_400), "2027-03-27T23:00:00Z, midnight in Berlin");
        // 2027-10-31T12:00:00Z.
        let (start, end) = berlin.bounds(secs(1_824_984_000));
        assert_eq!(end - start, secs(25 * 3600));
    }

    /// 2027-01-06 is a Wednesday: its week began on Monday the 4th.
    #[test]
    fn a_week_begins_on_monday() {
        let (start, end) = calendar(Period::Week, "UTC").bounds(secs(1_799_236_800));
        assert_eq!((start, end), (secs(1_799_020_800), secs(1_799_625_600)));
    }

    #[test]
    fn unknown_zones_are_refused() {
        assert!(Zone::named("Mars/Olympus").is_err());
        assert!(Zone::named("Europe/Berlin").is_ok());
    }
}
