//! Responses kept for idempotent replay: captured on the way back from the upstream,
//! and given again with `Idempotency-Replayed: true`.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::body::{BoxError, ProxyBody, full_body};
use limiter_core::signature::{StoredResponse, idempotency::IDEMPOTENCY_REPLAYED_HEADER};

/// A stored response, marked as a replay.
pub(super) fn replay(stored: StoredResponse) -> Response<ProxyBody> {
    let mut response = Response::new(full_body(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response.headers_mut().insert(IDEMPOTENCY_REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// Reads the upstream response for the store, up to just over `max_bytes` of body,
/// and returns it for the client unchanged. A larger body is not buffered beyond that:
/// the part read goes first, the rest streams; the store sees a response over its
/// bound and records only that the request completed.
pub(super) async fn capture(
    response: Response<ProxyBody>,
    max_bytes: usize,
) -> Result<(Response<ProxyBody>, StoredResponse), BoxError> {
    let (parts, mut body) = response.into_parts();
    let mut read = BytesMut::new();
    let mut complete = true;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            read.extend_from_slice(&data);
        }
        if read.len() > max_bytes {
            complete = false;
            break;
        }
    }
    let read = read.freeze();
    let stored = StoredResponse { status: parts.status, headers: parts.headers.clone(), body: read.clone() };
    let body = if complete { full_body(read) } else { Prefixed { prefix: Some(read), rest: body }.boxed() };
    Ok((Response::from_parts(parts, body), stored))
}

/// Bytes already read, then the rest of the body they came from.
struct Prefixed {
    prefix: Option<Bytes>,
    rest: ProxyBody,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.prefix.take() {
            Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
            None => Pin::new(&mut self.rest).poll_frame(cx),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        // Raise the upper bound first: SizeHint refuses a lower bound above it.
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(prefix));
        }
        hint.set_lower(hint.lower().saturating_add(prefix));
        hint
    }
}
