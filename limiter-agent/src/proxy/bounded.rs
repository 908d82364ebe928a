//! The upstream connector under `max_upstream_connections`: every connection the
//! workers' pools open holds a permit until it closes, idle pooled ones included, so
//! that clients holding responses open cannot make the proxy open upstream
//! connections without end. Without a permit a request fails at once (503) rather
//! than wait for one behind whatever holds them.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector},
    rt::TokioIo,
};
use tokio::{
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore},
};

use super::body::{self, BoxError};

/// Why no upstream connection was opened.
#[derive(Debug, thiserror::Error)]
#[error("max_upstream_connections are open")]
pub(super) struct AllInUse;

/// Whether `error` (or what caused it) is [`AllInUse`].
pub(super) fn all_in_use(error: &(dyn std::error::Error + 'static)) -> bool {
    body::stems_from::<AllInUse>(error)
}

/// An [`HttpConnector`] that takes a permit of `permits` for each connection.
#[derive(Clone, Debug)]
pub(super) struct BoundedConnector {
    inner: HttpConnector,
    permits: Arc<Semaphore>,
}

impl BoundedConnector {
    pub(super) fn new(inner: HttpConnector, permits: Arc<Semaphore>) -> Self {
        Self { inner, permits }
    }
}

impl tower_service::Service<Uri> for BoundedConnector {
    type Response = Counted;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Counted, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let permit = Arc::clone(&self.permits).try_acquire_owned();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let permit = permit.map_err(|_| AllInUse)?;
            Ok(Counted { io: connecting.await?, _permit: permit })
        })
    }
}

/// An upstream connection and its permit, returned when it closes.
#[derive(Debug)]
pub(super) struct Counted {
    io: TokioIo<TcpStream>,
    _permit: OwnedSemaphorePermit,
}

impl Connection for Counted {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl Read for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
