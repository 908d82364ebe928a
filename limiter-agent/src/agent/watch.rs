//! The config file watcher: an edit is applied only once the file has held the same
//! text for [`SETTLE`], so that a file caught mid-write (by an editor or `cp`),
//! which may well parse while lacking its last rules, is never applied.

use std::time::{Duration, Instant};

/// How often the config file is read.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// How long an edit must stay unchanged before it is applied.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The text last seen differing from the applied one, and since when.
#[derive(Debug, Default)]
pub struct Settle {
    seen: Option<(String, Instant)>,
}

impl Settle {
    /// Takes the file's text read at `now`; the text to apply once it has settled.
    pub fn observe(&mut self, current: Option<String>, applied: Option<&str>, now: Instant) -> Option<String> {
        let Some(current) = current.filter(|text| Some(text.as_str()) != applied) else {
            self.seen = None;
            return None;
        };
        match &self.seen {
            Some((text, since)) if *text == current => {
                if now.duration_since(*since) < SETTLE {
                    return None;
                }
                self.seen = None;
                Some(current)
            }
            _ => {
                self.seen = Some((current, now));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_is_applied_only_after_it_held_still_for_the_settle_interval() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut settle = Settle::default();
        let applied = Some("old");
        assert_eq!(settle.observe(Some("old".into()), applied, at(0)), None);
        assert_eq!(settle.observe(Some("half".into()), applied, at(500)), None);
        assert_eq!(settle.observe(Some("half".into()), applied, at(2_000)), None, "still within the interval");
        // The writer goes on: the clock starts again.
        assert_eq!(settle.observe(Some("half, then the rest".into()), applied, at(2_400)), None);
        assert_eq!(settle.observe(Some("half, then the rest".into()), applied, at(4_399)), None);
        assert_eq!(
            settle.observe(Some("half, then the rest".into()), applied, at(4_400)),
            Some("half, then the rest".into())
        );
        // Back to the applied text (or unreadable): nothing pending.
        assert_eq!(settle.observe(Some("new".into()), applied, at(5_000)), None);
        assert_eq!(settle.observe(Some("old".into()), applied, at(5_500)), None);
        assert_eq!(settle.observe(Some("new".into()), applied, at(8_000)), None, "seen anew");
        assert_eq!(settle.observe(None, applied, at(8_500)), None);
        assert_eq!(settle.observe(Some("new".into()), applied, at(11_000)), None, "seen anew");
    }
}
