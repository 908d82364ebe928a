//! At most one event a [`INTERVAL`] per client and reason: a flood of bad MACs from
//! one address is one line a second, and a summary line of how many were left out,
//! so that it can fill neither the disk nor the SIEM.

use std::{collections::HashMap, time::Duration};

use ipnet::IpNet;

use super::event::EventKind;

/// The shortest time between two events of one subject.
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

/// Subjects followed at most; past it, a new client's events share one subject per
/// kind and reason (client `None`), so that spoofed sources cannot grow the table.
const MAX_SUBJECTS: usize = 4096;

/// Whose events, and which: what one line a second is allowed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Subject {
    /// `None`: the clients past [`MAX_SUBJECTS`].
    pub client: Option<IpNet>,
    pub kind: EventKind,
    pub reason: Option<&'static str>,
}

/// The events of a subject suppressed since its last one written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Summary {
    pub subject: Subject,
    pub suppressed: u64,
    /// When the event written before them was (the clock's time).
    pub since: Duration,
}

#[derive(Debug)]
struct Window {
    /// The last event written.
    since: Duration,
    suppressed: u64,
}

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// Written, after the summary of those suppressed before it, if any.
    Write(Option<Summary>),
    Suppress,
}

/// Each subject's last event written; swept once an interval.
#[derive(Debug, Default)]
pub(super) struct Suppression {
    windows: HashMap<Subject, Window>,
}

impl Suppression {
    /// Whether an event of `subject` at `now` is written.
    pub(super) fn admit(&mut self, mut subject: Subject, now: Duration) -> Admit {
        if self.windows.len() >= MAX_SUBJECTS && !self.windows.contains_key(&subject) {
            subject.client = None;
        }
        let Some(window) = self.windows.get_mut(&subject) else {
            self.windows.insert(subject, Window { since: now, suppressed: 0 });
            return Admit::Write(None);
        };
        if now.saturating_sub(window.since) < INTERVAL {
            window.suppressed += 1;
            return Admit::Suppress;
        }
        let summary = summary(subject, window);
        *window = Window { since: now, suppressed: 0 };
        Admit::Write(summary)
    }

    /// The summaries of the subjects whose interval has passed at `now`; those with
    /// nothing to summarise are forgotten.
    pub(super) fn sweep(&mut self, now: Duration) -> Vec<Summary> {
        let mut summaries = Vec::new();
        self.windows.retain(|subject, window| {
            if now.saturating_sub(window.since) < INTERVAL {
                return true;
            }
            match summary(*subject, window) {
                Some(summary) => {
                    summaries.push(summary);
                    // Kept: the next event of a flood still waits out this interval.
                    *window = Window { since: now, suppressed: 0 };
                    true
                }
                None => false,
            }
        });
        summaries
    }
}

fn summary(subject: Subject, window: &Window) -> Option<Summary> {
    (window.suppressed > 0).then_some(Summary { subject, suppressed: window.suppressed, since: window.since })
}

#[cfg(test)]
mod tests {
    use limiter_core::{Clock as _, FakeClock};

    use super::*;

    fn subject(client: &str) -> Subject {
        Subject {
            client: Some(client.parse().expect("a CIDR")),
            kind: EventKind::SignatureFailure,
            reason: Some("bad_mac"),
        }
    }

    #[test]
    fn one_event_an_interval_per_subject_then_a_summary() {
        let clock = FakeClock::new(Duration::from_secs(1_000));
        let mut suppression = Suppression::default();
        let start = clock.now();
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), clock.now()), Admit::Write(None));
        for _ in 0..99 {
            assert_eq!(suppression.admit(subject("192.0.2.1/32"), clock.now()), Admit::Suppress);
        }
        // Another client, or another reason, has its own interval.
        assert_eq!(suppression.admit(subject("192.0.2.2/32"), clock.now()), Admit::Write(None));
        let replay = Subject { reason: Some("replay"), kind: EventKind::Replay, ..subject("192.0.2.1/32") };
        assert_eq!(suppression.admit(replay, clock.now()), Admit::Write(None));
        clock.advance(INTERVAL - Duration::from_millis(1));
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), clock.now()), Admit::Suppress);
        clock.advance(Duration::from_millis(1));
        let summary = Summary { subject: subject("192.0.2.1/32"), suppressed: 100, since: start };
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), clock.now()), Admit::Write(Some(summary)));
    }

    #[test]
    fn a_flood_that_stops_is_summarised_by_the_sweep_and_then_forgotten() {
        let clock = FakeClock::new(Duration::from_secs(1_000));
        let mut suppression = Suppression::default();
        let start = clock.now();
        suppression.admit(subject("192.0.2.1/32"), clock.now());
        suppression.admit(subject("192.0.2.1/32"), clock.now());
        suppression.admit(subject("192.0.2.9/32"), clock.now());
        assert_eq!(suppression.sweep(clock.now()), Vec::new());
        clock.advance(INTERVAL);
        let summary = Summary { subject: subject("192.0.2.1/32"), suppressed: 1, since: start };
        assert_eq!(suppression.sweep(clock.now()), vec![summary]);
        // The quiet subject is gone; the summarised one waits out its interval once more.
        assert_eq!(suppression.windows.len(), 1);
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), clock.now()), Admit::Suppress);
        clock.advance(INTERVAL);
        assert_eq!(suppression.sweep(clock.now()).len(), 1);
        clock.advance(INTERVAL);
        assert_eq!(suppression.sweep(clock.now()), Vec::new());
        assert!(suppression.windows.is_empty());
    }

    #[test]
    fn past_the_bound_new_clients_share_one_subject() {
        let now = Duration::from_secs(1_000);
        let mut suppression = Suppression::default();
        for i in 0..MAX_SUBJECTS {
            let client = IpNet::from(std::net::IpAddr::from(std::net::Ipv6Addr::from(i as u128)));
            suppression.admit(Subject { client: Some(client), ..subject("192.0.2.1/32") }, now);
        }
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), now), Admit::Write(None));
        assert_eq!(suppression.admit(subject("192.0.2.2/32"), now), Admit::Suppress);
        assert_eq!(suppression.windows.len(), MAX_SUBJECTS + 1);
    }
}
