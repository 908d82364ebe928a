//! The two waits for a request on a connection: for its first byte (`idle_timeout`,
//! after accept or between keep-alive requests) and for the rest of its head
//! (`header_timeout`). hyper has one timer for both, started as soon as it waits, so
//! the connection's reads are watched here instead.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

/// Which wait ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// No further request began within `idle_timeout`: closed without a word.
    Idle,
    /// The head of a request (the first one: counted from accept) did not end within
    /// `header_timeout`: 408 if it had begun, else closed without a word.
    Header,
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

    fn begun(&self) -> usize {
        self.begun.load(Ordering::Relaxed)
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

/// A connection whose reads fail with [`io::ErrorKind::TimedOut`] when the client
/// takes too long to start a request, or to finish its head.
#[derive(Debug)]
pub(super) struct Watched<T> {
    io: T,
    in_flight: Arc<InFlight>,
    idle_timeout: Duration,
    header_timeout: Duration,
    /// The wait in progress and when it runs out; `None` while a request is in flight.
    deadline: Option<(Wait, Pin<Box<Sleep>>)>,
    /// [`InFlight::begun`] when `deadline` was set.
    begun: usize,
}

impl<T> Watched<T> {
    pub(super) fn new(io: T, in_flight: Arc<InFlight>, idle_timeout: Duration, header_timeout: Duration) -> Self {
        Self { io, in_flight, idle_timeout, header_timeout, deadline: None, begun: 0 }
    }

    fn start(&mut self, wait: Wait) {
        let timeout = match wait {
            Wait::Idle => self.idle_timeout,
            Wait::Header => self.header_timeout,
        };
        self.deadline = Some((wait, Box::pin(tokio::time::sleep(timeout))));
        self.begun = self.in_flight.begun();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.in_flight.any() || self.begun != self.in_flight.begun() {
            self.deadline = None;
        }
        if self.in_flight.any() {
            self.in_flight.park(cx.waker());
            // The last request may have ended since `any`; then the wake is ours.
            if !self.in_flight.any() {
                cx.waker().wake_by_ref();
            }
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        if let Poll::Ready(result) = Pin::new(&mut self.io).poll_read(cx, buf) {
            // The first bytes of a request: from now on its head has header_timeout.
            if buf.filled().len() > before && !matches!(self.deadline, Some((Wait::Header, _))) {
                self.start(Wait::Header);
            }
            return Poll::Ready(result);
        }
        if self.deadline.is_none() {
            // A new connection owes its first request at once: header_timeout from accept.
            let wait = if self.in_flight.begun() == 0 { Wait::Header } else { Wait::Idle };
            self.start(wait);
        }
        let Some((wait, sleep)) = &mut self.deadline else { return Poll::Pending };
        let wait = *wait;
        ready!(sleep.as_mut().poll(cx));
        let _ = self.in_flight.expired.set(wait);
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
