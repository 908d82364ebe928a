//! `[agent.security_log]`: one line per security event (a signature refused or
//! replayed, a request outside its key's scopes, a `deny` rule, an escalation, a
//! demotion, a fleet block refused, a kernel block or unblock), as JSON or CEF, to a
//! file and/or a syslog socket, for a SIEM.
//!
//! Events are written at most one an [`INTERVAL`](suppress::INTERVAL) per client and
//! reason, with a `suppressed` line counting those left out (`suppress.rs`), through
//! the bounded queue and thread of [`crate::appender`] (as the decision log is): a
//! flood costs a line a second, a slow disk never holds a request, a full one costs
//! whole lines only. A reload that changes the section opens the new destinations
//! before anything else is applied (so a path that cannot be opened refuses the
//! reload), and puts them in place once the rest is.

mod event;
mod format;
mod suppress;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, PoisonError, RwLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
};

use limiter_core::{Clock as _, SystemClock};
use serde::{Deserialize, Serialize};

pub use self::event::{EventKind, SecurityEvent, shown_key_id};
use self::suppress::{Admit, Subject, Suppression};
use crate::{
    appender::{self, Appender, Batch, Destination as _, LineCounts, Syslog},
    config::agent::SecurityLogConfig,
};

/// The running security log; off (every event ignored) until a config names a
/// destination.
#[derive(Debug, Default)]
pub struct SecurityLog {
    output: RwLock<Option<Arc<Output>>>,
    suppression: Mutex<Suppression>,
    /// Over every destination and reload.
    lines: Arc<LineCounts>,
    suppressed: AtomicU64,
}

/// The destinations of one config.
#[derive(Debug)]
pub struct Output {
    config: SecurityLogConfig,
    appenders: Vec<Appender>,
}

/// What a reload changes of the log, opened before it is put in place.
#[derive(Debug)]
pub enum Prepared {
    Unchanged,
    /// The new destinations, `None`: off.
    Replace(Option<Arc<Output>>),
}

/// One count of the security log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogCount {
    /// Lines written, events and summaries, over its destinations.
    Written,
    /// Lines dropped: the queue was full, or a destination refused them.
    Dropped,
    /// Events left out for their client and reason's interval, and counted in a
    /// summary line instead.
    Suppressed,
}

impl LogCount {
    pub const ALL: [Self; 3] = [Self::Written, Self::Dropped, Self::Suppressed];

    /// The name in `limiter stats --json` and the metrics' `result` label.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Dropped => "dropped",
            Self::Suppressed => "suppressed",
        }
    }
}

/// The counts by [`LogCount::name`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SecurityLogStats(pub BTreeMap<String, u64>);

impl SecurityLogStats {
    #[must_use]
    pub fn get(&self, count: LogCount) -> u64 {
        self.0.get(count.name()).copied().unwrap_or(0)
    }
}

impl SecurityLog {
    /// The log `config` names (`None`: off until a reload names one), with a thread
    /// that writes the summaries of floods that stopped, as long as the log lives.
    pub fn start(config: Option<&SecurityLogConfig>) -> std::io::Result<Arc<Self>> {
        let log = Arc::new(Self::default());
        if let Prepared::Replace(output) = log.prepare(config)? {
            log.install(Prepared::Replace(output));
        }
        let weak = Arc::downgrade(&log);
        std::thread::Builder::new().name("security-log-sweep".into()).spawn(move || sweep_while_alive(&weak))?;
        Ok(log)
    }

    /// Opens the destinations `config` names, unless they are open already.
    pub fn prepare(&self, config: Option<&SecurityLogConfig>) -> std::io::Result<Prepared> {
        let current = self.output.read().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().map(|output| &output.config) == config {
            return Ok(Prepared::Unchanged);
        }
        let Some(config) = config else { return Ok(Prepared::Replace(None)) };
        let mut appenders = Vec::new();
        if let Some(path) = &config.path {
            let file = appender::open(path).map_err(naming(path))?;
            appenders.push(Appender::spawn("security-log", file, Arc::clone(&self.lines))?);
        }
        if let Some(socket) = &config.syslog {
            let syslog = Syslog::new(socket).map_err(naming(socket))?;
            appenders.push(Appender::spawn("security-syslog", syslog, Arc::clone(&self.lines))?);
        }
        Ok(Prepared::Replace(Some(Arc::new(Output { config: config.clone(), appenders }))))
    }

    /// Puts `prepared` in force; the destinations it replaces finish their queues.
    pub fn install(&self, prepared: Prepared) {
        if let Prepared::Replace(output) = prepared {
            *self.output.write().unwrap_or_else(PoisonError::into_inner) = output;
        }
    }

    /// Writes `event`, unless its client and reason had one written within the
    /// interval (then it is counted, and summarised later).
    pub fn record(&self, event: &SecurityEvent) {
        let Some(output) = self.output() else { return };
        let now = SystemClock.now();
        let subject = Subject { client: Some(event.client), kind: event.kind, reason: event.reason };
        let admitted = self.suppression.lock().unwrap_or_else(PoisonError::into_inner).admit(subject, now);
        let format = output.config.format;
        match admitted {
            Admit::Suppress => {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
            }
            Admit::Write(summary) => {
                if let Some(summary) = summary {
                    output.send(&format::summary(format, &summary, now));
                }
                output.send(&format::event(format, event, now));
            }
        }
    }

    /// The counts since the start.
    #[must_use]
    pub fn stats(&self) -> SecurityLogStats {
        let count = |count: LogCount| match count {
            LogCount::Written => self.lines.written.load(Ordering::Relaxed),
            LogCount::Dropped => self.lines.dropped.load(Ordering::Relaxed),
            LogCount::Suppressed => self.suppressed.load(Ordering::Relaxed),
        };
        SecurityLogStats(LogCount::ALL.iter().map(|&c| (c.name().to_owned(), count(c))).collect())
    }

    fn output(&self) -> Option<Arc<Output>> {
        self.output.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Writes the summaries of the subjects whose interval has passed.
    fn sweep(&self) {
        let now = SystemClock.now();
        let summaries = self.suppression.lock().unwrap_or_else(PoisonError::into_inner).sweep(now);
        let Some(output) = self.output() else { return };
        for summary in &summaries {
            output.send(&format::summary(output.config.format, summary, now));
        }
    }
}

impl Output {
    fn send(&self, line: &str) {
        for appender in &self.appenders {
            appender.send(line.to_owned());
        }
    }
}

/// The error of opening `path`, naming it, for the refusal of a reload or a start.
fn naming(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> std::io::Error + '_ {
    move |error| std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// Sweeps once an interval until the log is gone.
fn sweep_while_alive(log: &Weak<SecurityLog>) {
    loop {
        std::thread::sleep(suppress::INTERVAL);
        let Some(log) = log.upgrade() else { return };
        log.sweep();
    }
}

/// Writes `event` to `config`'s destinations at once, for a command that runs
/// without the agent (`limiter block`): no queue, no interval.
pub fn write_once(config: &SecurityLogConfig, event: &SecurityEvent) -> std::io::Result<()> {
    let batch = Batch::of(&format::event(config.format, event, SystemClock.now()));
    if let Some(path) = &config.path {
        appender::open(path)?.append(&batch).1?;
    }
    if let Some(socket) = &config.syslog {
        Syslog::new(socket)?.append(&batch).1?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
