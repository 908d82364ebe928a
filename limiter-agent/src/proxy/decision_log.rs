//! `proxy.decision_log`: one JSON line for a sample of the limits' decisions, for
//! finding out afterwards who was refused by what. Lines go through a bounded queue
//! to a task of their own, so a slow disk never holds a request: a line that finds the
//! queue full is dropped and counted.
//!
//! A disk that refuses a write (full, or failing) costs only the lines: they are
//! counted as dropped, the warning is logged at most once per [`WARN_INTERVAL`] with
//! the lines dropped since, and the file never keeps part of a line, so that every
//! line a reader finds parses.
//!
//! A line names the client address, the method, the canonical path, the verdict, the
//! rules and plan that counted the request and what each rule keys by (`json:/username`),
//! never a key's value or any other header: a bearer key's id is its secret, a username
//! is personal data.

use std::{
    collections::BTreeMap,
    fs::File,
    io::Write as _,
    net::IpAddr,
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::sync::mpsc;

use crate::limits::{RequestInfo, VerdictKind};

/// Lines waiting for the disk; past this they are dropped.
const QUEUE: usize = 4096;

/// The most the writer gathers from the queue into one write.
const BATCH_BYTES: usize = 64 * 1024;

/// The shortest time between two warnings that the disk refused lines.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// The writer's handle; dropping it ends the writer thread once the queue is written.
#[derive(Debug)]
pub(super) struct DecisionLog {
    lines: mpsc::Sender<String>,
    /// Decisions offered for sampling since the start.
    offered: AtomicU64,
    counts: Arc<LogCounts>,
}

/// Lines written and dropped since the start.
#[derive(Debug, Default)]
pub(super) struct LogCounts {
    pub(super) written: AtomicU64,
    pub(super) dropped: AtomicU64,
}

/// One decision as logged.
#[derive(Debug, Serialize)]
pub(super) struct Entry<'a> {
    /// Unix time, in seconds with milliseconds.
    pub(super) time: f64,
    pub(super) client: IpAddr,
    pub(super) method: &'a str,
    /// The canonical path, without the query.
    pub(super) path: &'a str,
    pub(super) verdict: VerdictKind,
    /// For `delay`, and for `reject` (its `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) wait_ms: Option<u64>,
    /// For a request a rule's `concurrency` applies to: how long it waited in the
    /// queue, let in or refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) queued_ms: Option<u64>,
    /// The rules and the plan that counted the request.
    pub(super) policies: Vec<&'a str>,
    /// What each rule that counted or refused the request keys by, as configured:
    /// the kind of key, never its value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) keys: BTreeMap<&'a str, String>,
    /// The plan of the key the request proved.
    pub(super) plan: Option<&'a str>,
    /// The policies that refused it.
    pub(super) violated: &'a [String],
    /// The `tag` rules that applied.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) tagged: &'a [String],
    /// `false` in shadow mode: the verdict was counted, not carried out.
    pub(super) enforced: bool,
}

impl<'a> Entry<'a> {
    /// `request` at `now`, forwarded, with nothing counted yet.
    pub(super) fn new(now: Duration, request: &RequestInfo<'a>, enforced: bool) -> Self {
        Self {
            time: (now.as_millis() as f64) / 1000.0,
            client: request.client,
            method: request.method.as_str(),
            path: request.path,
            verdict: VerdictKind::Forward,
            wait_ms: None,
            queued_ms: None,
            policies: Vec::new(),
            keys: BTreeMap::new(),
            plan: None,
            violated: &[],
            tagged: &[],
            enforced,
        }
    }
}

impl DecisionLog {
    /// Opens `path` for appending (created 0640) and starts the writer, a thread of
    /// its own: its writes block on the disk, never on a worker's runtime.
    pub(super) fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o640).open(path)?;
        let (lines, queue) = mpsc::channel(QUEUE);
        let counts = Arc::<LogCounts>::default();
        let writer_counts = Arc::clone(&counts);
        std::thread::Builder::new()
            .name("decision-log".into())
            .spawn(move || write_lines(file, queue, &writer_counts))?;
        Ok(Self { lines, offered: AtomicU64::new(0), counts })
    }

    /// Whether this decision is in the sample: exactly one in every `1 / share`,
    /// spread evenly, so that a test (and an operator) can count on the share.
    pub(super) fn sampled(&self, share: f64) -> bool {
        let n = self.offered.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * share).floor() > (n * share).floor()
    }

    pub(super) fn write(&self, entry: &Entry<'_>) {
        let Ok(mut line) = serde_json::to_string(entry) else { return };
        line.push('\n');
        if self.lines.try_send(line).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn counts(&self) -> (u64, u64) {
        (self.counts.written.load(Ordering::Relaxed), self.counts.dropped.load(Ordering::Relaxed))
    }
}

/// Writes the lines as they come, each batch the queue holds in one append, until
/// every sender is gone.
fn write_lines(mut file: File, mut queue: mpsc::Receiver<String>, counts: &LogCounts) {
    let mut batch = Batch::default();
    let mut refusals = Refusals::default();
    while let Some(line) = queue.blocking_recv() {
        batch.clear();
        batch.push(&line);
        while batch.text.len() < BATCH_BYTES {
            let Ok(line) = queue.try_recv() else { break };
            batch.push(&line);
        }
        let (written, refused) = batch.append_to(&mut file);
        counts.written.fetch_add(written, Ordering::Relaxed);
        if let Err(error) = refused {
            let dropped = batch.ends.len() as u64 - written;
            counts.dropped.fetch_add(dropped, Ordering::Relaxed);
            if let Some(dropped) = refusals.refused(dropped, Instant::now()) {
                tracing::warn!(%error, dropped, "decision log: cannot write, lines dropped since the last warning");
            }
        }
    }
}

/// Whole lines, and where each ends.
#[derive(Debug, Default)]
struct Batch {
    text: String,
    ends: Vec<usize>,
}

impl Batch {
    fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.ends.push(self.text.len());
    }

    /// Appends the lines to `file`, or as many as the disk takes whole: a write cut
    /// short (the disk full midway through a line) is cut back to the last whole line,
    /// so that no reader finds half of one. The lines written, and why the rest were
    /// not.
    fn append_to(&self, file: &mut File) -> (u64, std::io::Result<()>) {
        let start = match file.metadata() {
            Ok(metadata) => metadata.len(),
            Err(error) => return (0, Err(error)),
        };
        let bytes = self.text.as_bytes();
        let mut done = 0;
        let error = loop {
            if done == bytes.len() {
                return (self.ends.len() as u64, Ok(()));
            }
            match file.write(&bytes[done..]) {
                Ok(0) => break std::io::ErrorKind::WriteZero.into(),
                Ok(n) => done += n,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => break error,
            }
        };
        let whole = self.ends.partition_point(|&end| end <= done);
        let keep = start + whole.checked_sub(1).map_or(0, |last| self.ends[last]) as u64;
        // A device (`/dev/full`) has no length to cut back to, nor took any of it.
        if file.metadata().is_ok_and(|now| now.is_file() && now.len() > keep)
            && let Err(cut) = file.set_len(keep)
        {
            tracing::warn!(error = %cut, "decision log: cannot cut back a partly written line");
        }
        (whole as u64, Err(error))
    }
}

/// Lines the disk refused since the last warning, so that a full disk warns once per
/// [`WARN_INTERVAL`] rather than once per line.
#[derive(Debug, Default)]
struct Refusals {
    dropped: u64,
    warned: Option<Instant>,
}

impl Refusals {
    /// Counts `lines` refused at `now`; `Some` with the lines dropped since the last
    /// warning when it is time for the next one.
    fn refused(&mut self, lines: u64, now: Instant) -> Option<u64> {
        self.dropped += lines;
        if self.warned.is_some_and(|warned| now.duration_since(warned) < WARN_INTERVAL) {
            return None;
        }
        self.warned = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusing_disk_warns_once_per_interval_with_the_lines_dropped_since() {
        let start = Instant::now();
        let mut refusals = Refusals::default();
        assert_eq!(refusals.refused(1, start), Some(1));
        assert_eq!(refusals.refused(2, start + Duration::from_secs(1)), None);
        assert_eq!(refusals.refused(3, start + WARN_INTERVAL - Duration::from_millis(1)), None);
        assert_eq!(refusals.refused(1, start + WARN_INTERVAL), Some(6));
        assert_eq!(refusals.refused(1, start + WARN_INTERVAL + Duration::from_secs(1)), None);
    }

    /// A device that takes nothing (`/dev/full`) has no length to cut back to: the
    /// lines are refused whole.
    #[test]
    fn a_device_that_refuses_every_write_takes_no_line() {
        let mut full = std::fs::OpenOptions::new().append(true).open("/dev/full").expect("/dev/full");
        let mut batch = Batch::default();
        batch.push("{\"a\":1}\n");
        batch.push("{\"b\":2}\n");
        let (written, refused) = batch.append_to(&mut full);
        assert_eq!(written, 0);
        assert_eq!(refused.expect_err("a full device").raw_os_error(), Some(libc::ENOSPC));
    }
}
