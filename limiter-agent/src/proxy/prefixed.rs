//! A connection whose first bytes were read ahead (the tail of a PROXY header, the
//! look for the HTTP/2 preface) and are served again before the rest of it.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

/// The first bytes of HTTP/2 with prior knowledge (RFC 9113 §3.4).
pub(super) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads from `io` into `buffered` until `decided` says it has seen enough, or the
/// peer stops sending. `decided` must hold by some bounded length: that bounds what
/// is buffered.
pub(super) async fn read_until<R: AsyncRead + Unpin>(
    io: &mut R,
    buffered: &mut Vec<u8>,
    decided: impl Fn(&[u8]) -> bool,
) -> io::Result<()> {
    let mut chunk = [0; 64];
    while !decided(buffered) {
        let n = io.read(&mut chunk).await?;
        let Some(read) = chunk.get(..n).filter(|read| !read.is_empty()) else { break };
        buffered.extend_from_slice(read);
    }
    Ok(())
}

/// Whether `start` settles if a connection speaks HTTP/2 with prior knowledge.
pub(super) fn preface_decided(start: &[u8]) -> bool {
    start.len() >= H2_PREFACE.len() || !H2_PREFACE.starts_with(start)
}

/// `io`, with `prefix` read first.
#[derive(Debug)]
pub(super) struct Prefixed<T> {
    prefix: Vec<u8>,
    /// How much of `prefix` has been read again.
    served: usize,
    io: T,
}

impl<T> Prefixed<T> {
    pub(super) fn new(prefix: Vec<u8>, io: T) -> Self {
        Self { prefix, served: 0, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(rest) = this.prefix.get(this.served..).filter(|rest| !rest.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(rest.get(..n).unwrap_or_default());
            this.served += n;
            if this.served == this.prefix.len() {
                this.prefix = Vec::new();
                this.served = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;

    use super::*;

    #[tokio::test]
    async fn the_prefix_is_read_before_the_rest() -> io::Result<()> {
        let mut io = Prefixed::new(b"PRI ".to_vec(), &b"* HTTP/2.0"[..]);
        let mut first = [0; 2];
        io.read_exact(&mut first).await?;
        assert_eq!(&first, b"PR");
        let mut rest = String::new();
        io.read_to_string(&mut rest).await?;
        assert_eq!(rest, "I * HTTP/2.0");
        Ok(())
    }

    #[tokio::test]
    async fn read_until_stops_once_decided_or_at_the_end() -> io::Result<()> {
        let mut buffered = Vec::new();
        read_until(&mut &b"GET / HTTP/1.1\r\n"[..], &mut buffered, preface_decided).await?;
        assert!(!buffered.starts_with(H2_PREFACE) && preface_decided(&buffered));
        let mut buffered = Vec::new();
        read_until(&mut &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nframes"[..], &mut buffered, preface_decided).await?;
        assert!(buffered.starts_with(H2_PREFACE));
        let mut buffered = Vec::new();
        read_until(&mut &b"PRI *"[..], &mut buffered, preface_decided).await?;
        assert_eq!(buffered, b"PRI *");
        Ok(())
    }
}
