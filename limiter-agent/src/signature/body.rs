//! Reading a request body once, bounded, hashing as it arrives.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// More than `limit` bytes arrived, or were announced (the proxy answers 413).
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The configured bound.
        limit: usize,
    },
    /// The body stream failed (client went away, malformed chunking, ...).
    #[error("reading body: {0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Reads all of `body`, at most `max_bytes`, and returns the bytes with their SHA-256.
///
/// The returned bytes are exactly the bytes hashed, so forwarding them forwards what
/// was verified. Reading stops at the first frame that would exceed `max_bytes`, and
/// before any frame when the body announces a larger size (`Content-Length`), so an
/// oversized body is never buffered. Trailers are not part of the signed body and are
/// dropped.
pub(crate) async fn read_body_hashed<B>(body: B, max_bytes: usize) -> Result<(Bytes, [u8; 32]), BodyError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = BodyError::TooLarge { limit: max_bytes };
    let announced = body.size_hint().lower();
    if usize::try_from(announced).map_or(true, |n| n > max_bytes) {
        return Err(too_large);
    }
    let mut body = std::pin::pin!(body);
    // The announced size is only a hint, but bounded above by max_bytes, so trusting it
    // for the allocation cannot be abused.
    let mut buf = BytesMut::with_capacity(usize::try_from(announced).unwrap_or(0));
    let mut hasher = Sha256::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.into()))?;
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        // Zero-copy for `Bytes`, the buffer type hyper uses.
        let chunk = data.copy_to_bytes(data.remaining());
        if chunk.len() > max_bytes.saturating_sub(buf.len()) {
            return Err(too_large);
        }
        hasher.update(&chunk);
        buf.extend_from_slice(&chunk);
    }
    Ok((buf.freeze(), hasher.finalize().into()))
}
