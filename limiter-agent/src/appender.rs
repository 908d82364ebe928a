//! Lines written by a thread of their own through a bounded queue: the writer of
//! `proxy.decision_log` and of `[agent.security_log]`. A slow disk never holds whoever
//! logs: a line that finds the queue full is dropped and counted.
//!
//! A destination that refuses a write (a full or failing disk, a syslog daemon gone)
//! costs only the lines: they are counted as dropped, the warning is logged at most
//! once per [`WARN_INTERVAL`] with the lines dropped since, and a file never keeps
//! part of a line, so that every line a reader finds parses.

use std::{
    fs::File,
    io::Write as _,
    os::unix::{fs::OpenOptionsExt as _, net::UnixDatagram},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

/// Lines waiting for the destination; past this they are dropped.
const QUEUE: usize = 4096;

/// The most the writer gathers from the queue into one write.
const BATCH_BYTES: usize = 64 * 1024;

/// The shortest time between two warnings that the destination refused lines.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Lines written and dropped since the start.
#[derive(Debug, Default)]
pub(crate) struct LineCounts {
    pub(crate) written: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

/// Where a writer's lines go.
pub(crate) trait Destination: Send + 'static {
    /// Writes the batch's lines, as many as it takes whole: the lines written, and why
    /// the rest were not.
    fn append(&mut self, batch: &Batch) -> (u64, std::io::Result<()>);
}

/// The writer's handle; dropping it ends the writer thread once the queue is written.
#[derive(Debug)]
pub(crate) struct Appender {
    lines: mpsc::Sender<String>,
    counts: Arc<LineCounts>,
}

impl Appender {
    /// Starts the thread `name` writing to `destination`, counting in `counts`: its
    /// writes block on the destination, never on a worker's runtime.
    pub(crate) fn spawn(
        name: &'static str,
        destination: impl Destination,
        counts: Arc<LineCounts>,
    ) -> std::io::Result<Self> {
        let (lines, queue) = mpsc::channel(QUEUE);
        let writer_counts = Arc::clone(&counts);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || write_lines(name, destination, queue, &writer_counts))?;
        Ok(Self { lines, counts })
    }

    /// Queues `line` (ending in `\n`), or counts it dropped if the queue is full.
    pub(crate) fn send(&self, line: String) {
        if self.lines.try_send(line).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines written and dropped since the start.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.counts.written.load(Ordering::Relaxed), self.counts.dropped.load(Ordering::Relaxed))
    }
}

/// Opens `path` for appending, created 0640.
pub(crate) fn open(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// Writes the lines as they come, each batch the queue holds in one append, until
/// every sender is gone.
fn write_lines(name: &str, mut destination: impl Destination, mut queue: mpsc::Receiver<String>, counts: &LineCounts) {
    let mut batch = Batch::default();
    let mut refusals = Refusals::default();
    while let Some(line) = queue.blocking_recv() {
        batch.clear();
        batch.push(&line);
        while batch.text.len() < BATCH_BYTES {
            let Ok(line) = queue.try_recv() else { break };
            batch.push(&line);
        }
        let (written, refused) = destination.append(&batch);
        counts.written.fetch_add(written, Ordering::Relaxed);
        if let Err(error) = refused {
            let dropped = batch.ends.len() as u64 - written;
            counts.dropped.fetch_add(dropped, Ordering::Relaxed);
            if let Some(dropped) = refusals.refused(dropped, Instant::now()) {
                tracing::warn!(%error, dropped, "{name}: cannot write, lines dropped since the last warning");
            }
        }
    }
}

/// Whole lines, and where each ends.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    text: String,
    ends: Vec<usize>,
}

impl Batch {
    /// One line (ending in `\n`).
    pub(crate) fn of(line: &str) -> Self {
        let mut batch = Self::default();
        batch.push(line);
        batch
    }

    fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.ends.push(self.text.len());
    }

    /// Each line, without its `\n`.
    fn lines(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| self.text[start..end].trim_end_matches('\n'))
    }
}

impl Destination for File {
    /// Appends the lines, or as many as the disk takes whole: a write cut short (the
    /// disk full midway through a line) is cut back to the last whole line, so that
    /// no reader finds half of one.
    fn append(&mut self, batch: &Batch) -> (u64, std::io::Result<()>) {
        let start = match self.metadata() {
            Ok(metadata) => metadata.len(),
            Err(error) => return (0, Err(error)),
        };
        let bytes = batch.text.as_bytes();
        let mut done = 0;
        let error = loop {
            if done == bytes.len() {
                return (batch.ends.len() as u64, Ok(()));
            }
            match self.write(&bytes[done..]) {
                Ok(0) => break std::io::ErrorKind::WriteZero.into(),
                Ok(n) => done += n,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => break error,
            }
        };
        let whole = batch.ends.partition_point(|&end| end <= done);
        let keep = start + whole.checked_sub(1).map_or(0, |last| batch.ends[last]) as u64;
        // A device (`/dev/full`) has no length to cut back to, nor took any of it.
        if self.metadata().is_ok_and(|now| now.is_file() && now.len() > keep)
            && let Err(cut) = self.set_len(keep)
        {
            tracing::warn!(error = %cut, "cannot cut back a partly written line");
        }
        (whole as u64, Err(error))
    }
}

/// A syslog daemon's datagram socket (`/dev/log`): each line one message, as
/// `syslog(3)` sends it (`<PRI>TAG[PID]: line`).
#[derive(Debug)]
pub(crate) struct Syslog {
    socket: UnixDatagram,
    path: PathBuf,
    /// `<PRI>limiter[PID]: `.
    header: String,
}

/// `authpriv` (10), severity `warning` (4): security messages, kept from ordinary
/// users' eyes by the usual syslog setups.
const SYSLOG_PRIORITY: u8 = 10 * 8 + 4;

impl Syslog {
    /// Sends to the socket at `path`, by name each time: a daemon that restarts and
    /// binds it again is found.
    pub(crate) fn new(path: &Path) -> std::io::Result<Self> {
        let header = format!("<{SYSLOG_PRIORITY}>limiter[{}]: ", std::process::id());
        Ok(Self { socket: UnixDatagram::unbound()?, path: path.to_owned(), header })
    }
}

impl Destination for Syslog {
    fn append(&mut self, batch: &Batch) -> (u64, std::io::Result<()>) {
        let mut written = 0;
        let mut message = String::new();
        for line in batch.lines() {
            message.clear();
            message.push_str(&self.header);
            message.push_str(line);
            if let Err(error) = self.socket.send_to(message.as_bytes(), &self.path) {
                return (written, Err(error));
            }
            written += 1;
        }
        (written, Ok(()))
    }
}

/// Lines the destination refused since the last warning, so that a full disk warns
/// once per [`WARN_INTERVAL`] rather than once per line.
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
        let (written, refused) = full.append(&batch);
        assert_eq!(written, 0);
        assert_eq!(refused.expect_err("a full device").raw_os_error(), Some(libc::ENOSPC));
    }

    #[test]
    fn each_line_is_one_syslog_message() {
        let dir = std::env::temp_dir().join(format!("limiter-appender-syslog-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let daemon = UnixDatagram::bind(&dir).expect("bind");
        let mut syslog = Syslog::new(&dir).expect("socket");
        let mut batch = Batch::default();
        batch.push("one\n");
        batch.push("two\n");
        assert_eq!(syslog.append(&batch).0, 2);
        let mut buffer = [0u8; 256];
        for expected in ["one", "two"] {
            let n = daemon.recv(&mut buffer).expect("a message");
            let message = std::str::from_utf8(&buffer[..n]).expect("text");
            assert_eq!(message, format!("<84>limiter[{}]: {expected}", std::process::id()));
        }
        let _ = std::fs::remove_file(&dir);
    }
}
