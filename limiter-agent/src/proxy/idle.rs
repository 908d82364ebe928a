//! The waits on a connection: for a request's first byte (`idle_timeout` between
//! keep-alive requests, `header_timeout` after accept), for the rest of its head
//! (`header_timeout`), and for a write to the client to make progress
//! (`send_timeout`). hyper has one timer for the first two, started as soon as it
//! waits, and none for writes, so the connection's socket is watched here instead.
//! While it waits for its next request (idle keep-alive), the connection's place
//! under `max_connections` may go to a new connection (see `connections`): it then
//! closes.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

use super::connections::Slot;

/// Which wait ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// No further request began within `idle_timeout`: closed without a word.
    Idle,
    /// The head of a request (the first one: counted from accept) did not end within
    /// `header_timeout`: 408 if it had begun, else closed without a word.
    Header,
    /// Not a byte came within `header_timeout` of accept (past a PROXY header):
    /// closed without a word.
    Silent,
    /// Its place went to a new connection at `max_connections`: closed without a word.
    Reclaimed,
}

/// Requests of one connection between their head and the end of their response:
/// while there are any, the connection is not waiting for a request.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    open: AtomicUsize,
    /// Requests ever begun: a wait armed before the latest one began is over.
    begun: AtomicUsize,
    /// The connection's reader, parked while requests were in flight: woken when the
    /// last one ends, so that the wait for the next request starts.
    reader: Mutex<Option<Waker>>,
    /// The wait that ran out, if one did: told here rather than by the reader, which
    /// TLS and hyper hold by then.
    expired: OnceLock<Wait>,
    /// A write to the client made no progress within `send_timeout`.
    send_timed_out: AtomicBool,
}

impl InFlight {
    /// Counts a request until the returned guard is dropped.
    pub(super) fn enter(self: &Arc<Self>) -> Guard {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::Relaxed);
        Guard(Arc::clone(self))
    }

    fn any(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    fn park(&self, waker: &Waker) {
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        if !reader.as_ref().is_some_and(|parked| parked.will_wake(waker)) {
            *reader = Some(waker.clone());
        }
    }

    /// Requests ever begun on the connection.
    pub(super) fn begun(&self) -> usize {
        self.begun.load(Ordering::Relaxed)
    }

    /// Whether a write to the client ran out of `send_timeout`.
    pub(super) fn send_timed_out(&self) -> bool {
        self.send_timed_out.load(Ordering::Relaxed)
    }

    /// The wait that ran out, if one did.
    pub(super) fn expired(&self) -> Option<Wait> {
        self.expired.get().copied()
    }
}

/// One request in flight.
#[derive(Debug)]
pub(super) struct Guard(Arc<InFlight>);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(reader) = self.0.reader.lock().unwrap_or_else(PoisonError::into_inner).take()
        {
            reader.wake();
        }
    }
}

/// How long a connection's waits may last.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    pub idle: Duration,
    pub header: Duration,
    pub send: Duration,
}

/// A connection whose reads fail with [`io::ErrorKind::TimedOut`] when the client
/// takes too long to start a request, or to finish its head, or when its place is
/// reclaimed while it waits; and whose writes fail so when the client does not read.
/// It holds the connection's place under the connection bounds.
#[derive(Debug)]
pub(super) struct Watched<T> {
    io: T,
    in_flight: Arc<InFlight>,
    timeouts: Timeouts,
    /// `None` only between a PROXY header and the named client's admission.
    slot: Option<Slot>,
    /// The wait in progress and when it runs out; `None` while a request is in flight.
    deadline: Option<(Wait, Pin<Box<Sleep>>)>,
    /// [`InFlight::begun`] when `deadline` was set.
    begun: usize,
    /// No byte has been read since the wait began.
    waiting: bool,
    /// When a pending write to the client runs out; `None` while writes go through.
    send_deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> Watched<T> {
    pub(super) fn new(io: T, in_flight: Arc<InFlight>, timeouts: Timeouts, slot: Slot) -> Self {
        Self {
            io,
            in_flight,
            timeouts,
            slot: Some(slot),
            deadline: None,
            begun: 0,
            waiting: false,
            send_deadline: None,
        }
    }

    /// Frees the connection's place, that of the balancer whose PROXY header was read.
    pub(super) fn release(&mut self) {
        self.slot = None;
    }

    /// Gives the connection the place of the client the PROXY header named; `waiting`:
    /// nothing but the header was read, so the client has sent no byte yet.
    pub(super) fn proxied(&mut self, slot: Slot, waiting: bool) {
        self.slot = Some(slot);
        self.waiting = waiting;
    }

    fn reclaimed(&self) -> bool {
        self.slot.as_ref().is_some_and(Slot::reclaimed)
    }

    fn set_waiting(&mut self, waiting: bool) {
        if let Some(slot) = &mut self.slot {
            slot.set_waiting(waiting);
        }
    }

    fn start(&mut self, wait: Wait) {
        let timeout = match wait {
            Wait::Idle => self.timeouts.idle,
            Wait::Header | Wait::Silent | Wait::Reclaimed => self.timeouts.header,
        };
        self.deadline = Some((wait, Box::pin(tokio::time::sleep(timeout))));
        self.begun = self.in_flight.begun();
    }

    fn expire(&self, wait: Wait) -> Poll<io::Result<()>> {
        let _ = self.in_flight.expired.set(wait);
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }

    /// A write's outcome, failed once writes have made no progress for `send_timeout`.
    fn sent<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.send_deadline = None;
            return poll;
        }
        let timeout = self.timeouts.send;
        let deadline = self.send_deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(deadline.as_mut().poll(cx));
        self.in_flight.send_timed_out.store(true, Ordering::Relaxed);
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.reclaimed() {
            return self.expire(Wait::Reclaimed);
        }
        if self.in_flight.any() || self.begun != self.in_flight.begun() {
            self.deadline = None;
        }
        if self.in_flight.any() {
            self.set_waiting(false);
            self.in_flight.park(cx.waker());
            // The last request may have ended since `any`; then the wake is ours.
            if !self.in_flight.any() {
                cx.waker().wake_by_ref();
            }
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        if let Poll::Ready(result) = Pin::new(&mut self.io).poll_read(cx, buf) {
            if buf.filled().len() > before {
                self.waiting = false;
                self.set_waiting(false);
                // The first bytes of a request: from now on its head has header_timeout.
                if !matches!(self.deadline, Some((Wait::Header, _))) {
                    self.start(Wait::Header);
                }
            }
            return Poll::Ready(result);
        }
        if self.deadline.is_none() {
            // A new connection owes its first request at once: header_timeout from accept.
            let wait = if self.in_flight.begun() == 0 { Wait::Header } else { Wait::Idle };
            self.start(wait);
            self.waiting = true;
        }
        // Only a keep-alive connection gives up its place: a new one may not have had
        // the time to send its first request yet.
        if self.waiting && matches!(self.deadline, Some((Wait::Idle, _))) {
            self.set_waiting(true);
            if self.slot.as_ref().is_some_and(|slot| slot.reclaimed_or_park(cx.waker())) {
                return self.expire(Wait::Reclaimed);
            }
        }
        let waiting = self.waiting;
        let Some((wait, sleep)) = &mut self.deadline else { return Poll::Pending };
        let wait = *wait;
        ready!(sleep.as_mut().poll(cx));
        let silent = wait == Wait::Header && waiting && self.in_flight.begun() == 0;
        self.expire(if silent { Wait::Silent } else { wait })
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.sent(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.sent(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.sent(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.sent(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
