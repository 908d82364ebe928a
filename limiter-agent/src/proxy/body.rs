//! Request bodies within `max_body_bytes`, refused before they reach the upstream.

use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use super::{ProxyBody, full_body, problem::Refusal};

/// Refuses a body whose `Content-Length` is over the limit, before reading any of it.
pub(super) fn check_announced(body: &Incoming, max_bytes: u64) -> Result<(), Refusal> {
    if body.size_hint().lower() > max_bytes {
        return Err(Refusal::BodyTooLarge { limit: max_bytes });
    }
    Ok(())
}

/// The body to forward. One of known length (already checked) streams through; a
/// chunked one is read in full first, so that one found too large halfway is refused
/// before the upstream has seen any part of the request.
pub(super) async fn forwardable(body: Incoming, max_bytes: u64) -> Result<ProxyBody, Refusal> {
    let known_length = body.size_hint().exact().is_some();
    let limited = Limited::new(body, usize::try_from(max_bytes).unwrap_or(usize::MAX));
    if known_length {
        return Ok(limited.boxed());
    }
    let collected = limited.collect().await.map_err(|error| {
        if error.is::<LengthLimitError>() {
            Refusal::BodyTooLarge { limit: max_bytes }
        } else {
            Refusal::BodyUnreadable
        }
    })?;
    Ok(full_body(collected.to_bytes()))
}
