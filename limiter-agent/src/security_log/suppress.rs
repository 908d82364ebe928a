//! At most one event a [`INTERVAL`] per client and reason: a flood of bad MACs from
//! one address is one line a second, and a summary line of how many were left out,
//! so that it can fill neither the disk nor the SIEM. And at most [`MAX_LINES`] of
//! each an interval over all clients: an attacker rotating thousands of addresses
//! would otherwise get a line a second from each.

use std::{collections::HashMap, time::Duration};

use ipnet::IpNet;

use super::event::EventKind;

/// The shortest time between two events of one subject.
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

/// Subjects followed at most; past it, a new client's events share one subject per
/// kind and reason (client `None`), so that spoofed sources cannot grow the table.
const MAX_SUBJECTS: usize = 4096;

/// Events, and apart from them summaries, written at most an interval over every
/// subject; past it, the events are counted in the shared subject of their kind and
/// reason, and the summaries past it folded into one of theirs.
pub(super) const MAX_LINES: u32 = 100;

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
    /// The events written in the interval that began at `.0`: `.1`.
    written: (Duration, u32),
}

impl Suppression {
    /// Whether an event of `subject` at `now` is written.
    pub(super) fn admit(&mut self, mut subject: Subject, now: Duration) -> Admit {
        if self.windows.len() >= MAX_SUBJECTS && !self.windows.contains_key(&subject) {
            subject.client = None;
        }
        let due = self.windows.get(&subject).is_none_or(|window| now.saturating_sub(window.since) >= INTERVAL);
        if due && !self.take_line(now) {
            // Counted where the clients past the bound are, summarised by the sweep.
            let shared = Subject { client: None, ..subject };
            self.windows.entry(shared).or_insert(Window { since: now, suppressed: 0 }).suppressed += 1;
            return Admit::Suppress;
        }
        let Some(window) = self.windows.get_mut(&subject) else {
            self.windows.insert(subject, Window { since: now, suppressed: 0 });
            return Admit::Write(None);
        };
        if !due {
            window.suppressed += 1;
            return Admit::Suppress;
        }
        let summary = summary(subject, window);
        *window = Window { since: now, suppressed: 0 };
        Admit::Write(summary)
    }

    /// Whether the interval `now` is in has room for one more event.
    fn take_line(&mut self, now: Duration) -> bool {
        let (since, written) = &mut self.written;
        if now.saturating_sub(*since) >= INTERVAL {
            (*since, *written) = (now, 0);
        }
        *written += 1;
        *written <= MAX_LINES
    }

    /// The summaries of the subjects whose interval has passed at `now`; those with
    /// nothing to summarise are forgotten.
    pub(super) fn sweep(&mut self, now: Duration) -> Vec<Summary> {
        let (mut summaries, mut shared): (Vec<Summary>, Vec<Summary>) =
            self.due_summaries(now).into_iter().partition(|summary| summary.subject.client.is_some());
        for past in summaries.split_off(summaries.len().min(MAX_LINES as usize)) {
            let subject = Subject { client: None, ..past.subject };
            match shared.iter_mut().find(|summary| summary.subject == subject) {
                Some(summary) => {
                    summary.suppressed += past.suppressed;
                    summary.since = summary.since.min(past.since);
                }
                None => shared.push(Summary { subject, ..past }),
            }
        }
        summaries.extend(shared);
        summaries
    }

    fn due_summaries(&mut self, now: Duration) -> Vec<Summary> {
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

    /// An attacker rotating addresses: every event from a client of its own.
    #[test]
    fn a_thousand_clients_an_interval_are_a_hundred_lines_and_summaries_of_the_rest() {
        let clock = FakeClock::new(Duration::from_secs(1_000));
        let mut suppression = Suppression::default();
        let client = |i: u32| Subject {
            client: Some(IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))),
            ..subject("192.0.2.1/32")
        };
        for second in 0..3 {
            let written = (0..1_000)
                .filter(|i| matches!(suppression.admit(client(second * 1_000 + i), clock.now()), Admit::Write(_)))
                .count();
            assert_eq!(written, MAX_LINES as usize, "second {second}");
            clock.advance(INTERVAL);
            let summaries = suppression.sweep(clock.now());
            let shared = Subject { client: None, ..subject("192.0.2.1/32") };
            assert_eq!(summaries.len(), 1, "second {second}: {summaries:?}");
            assert_eq!((summaries[0].subject, summaries[0].suppressed), (shared, 900));
        }
        // Each of many clients flooding: the summaries past the bound fold into one.
        let mut suppression = Suppression::default();
        for round in 0..2 {
            for i in 0..1_000 {
                suppression.admit(client(i), clock.now());
                suppression.admit(client(i), clock.now());
            }
            clock.advance(INTERVAL);
            let summaries = suppression.sweep(clock.now());
            assert!(summaries.len() <= MAX_LINES as usize + 1, "round {round}: {}", summaries.len());
            let suppressed: u64 = summaries.iter().map(|summary| summary.suppressed).sum();
            let expected = if round == 0 { 1_900 } else { 2_000 - u64::from(MAX_LINES) };
            assert_eq!(suppressed, expected, "round {round}: every event left out is in a summary");
        }
    }

    #[test]
    fn past_the_bound_new_clients_share_one_subject() {
        let mut now = Duration::from_secs(1_000);
        let mut suppression = Suppression::default();
        for i in 0..MAX_SUBJECTS {
            // Within the lines an interval allows, so that each has a window.
            if i % MAX_LINES as usize == 0 {
                now += INTERVAL;
            }
            let client = IpNet::from(std::net::IpAddr::from(std::net::Ipv6Addr::from(i as u128)));
            suppression.admit(Subject { client: Some(client), ..subject("192.0.2.1/32") }, now);
        }
        assert_eq!(suppression.admit(subject("192.0.2.1/32"), now), Admit::Write(None));
        assert_eq!(suppression.admit(subject("192.0.2.2/32"), now), Admit::Suppress);
        assert_eq!(suppression.windows.len(), MAX_SUBJECTS + 1);
    }
}
