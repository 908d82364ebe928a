//! The body type every message the proxy sends carries, and request bodies within
//! `max_body_bytes` and `body_timeout`, refused before they reach the upstream.

use std::{
    error::Error,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, LengthLimitError, combinators::BoxBody};
use hyper::body::Incoming;
use tokio::time::Sleep;

pub(super) type BoxError = Box<dyn Error + Send + Sync>;

/// Every body the proxy sends, in either direction.
pub(super) type ProxyBody = BoxBody<Bytes, BoxError>;

pub(super) fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Why a request body is not forwarded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BodyRefused {
    TooLarge {
        limit: u64,
    },
    TimedOut,
    Unreadable,
    /// Its bytes would take the connection or the client past its share of memory.
    BuffersFull,
}

impl BodyRefused {
    /// The refusal of a body that failed while read with `Limited` to `limit` bytes.
    pub(super) fn of_read(error: &(dyn Error + 'static), limit: u64) -> Self {
        if error.is::<LengthLimitError>() {
            Self::TooLarge { limit }
        } else if timed_out(error) {
            Self::TimedOut
        } else if stems_from::<BuffersFull>(error) {
            Self::BuffersFull
        } else {
            Self::Unreadable
        }
    }
}

/// Refuses a body whose `Content-Length` is over the limit, before reading any of it.
pub(super) fn check_announced(body: &Incoming, max_bytes: u64) -> Result<(), BodyRefused> {
    if body.size_hint().lower() > max_bytes {
        return Err(BodyRefused::TooLarge { limit: max_bytes });
    }
    Ok(())
}

/// The error of a body that did not finish within `body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(super) struct BodyTimedOut;

/// A request body that fails with [`BodyTimedOut`] once its time is up, whoever reads
/// it: the signature check, the chunked collection, or the upstream client streaming
/// it on. A client that stalls its body holds a connection only that long. The time
/// runs from the first read, so that a throttle delay before forwarding (and the
/// `100 Continue` that waits for it) does not eat into it.
#[derive(Debug)]
pub(super) struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl TimedBody {
    /// `body`, due within `timeout` of its first read.
    pub(super) fn new(body: Incoming, timeout: Duration) -> Self {
        Self { inner: body, timeout, deadline: None }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(this.timeout)));
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error`, or an error it stems from, is a [`BodyTimedOut`]: the upstream
/// client fails a request whose streamed body timed out with its own error.
pub(super) fn timed_out(error: &(dyn Error + 'static)) -> bool {
    stems_from::<BodyTimedOut>(error)
}

/// The error of a body read into memory whose next bytes would pass its connection's
/// or its client's share ([`super::buffered`]).
#[derive(Debug, thiserror::Error)]
#[error("the client's buffered request bytes are at their cap")]
pub(super) struct BuffersFull;

/// Whether `error`, or an error it stems from, is an `E`: the upstream client wraps
/// a body's or a connector's error in its own.
pub(super) fn stems_from<E: Error + 'static>(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<E>() {
            return true;
        }
        next = error.source();
    }
    false
}

/// A body that holds a guard until it has been sent whole (or dropped): a response
/// its request's [`Guard`](super::idle::Guard), since a slow download is not a wait for a request, and its
/// client's place in flight ([`super::shares`]); a request body read into memory the
/// bytes it holds of its client's share.
#[derive(Debug)]
pub(super) struct Guarded<B, G> {
    body: B,
    _guard: G,
}

impl<B, G> Guarded<B, G> {
    pub(super) fn new(body: B, guard: G) -> Self {
        Self { body, _guard: guard }
    }
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin, G: Unpin> Body for Guarded<B, G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
