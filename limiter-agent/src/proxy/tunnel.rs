//! An upgraded connection (a WebSocket, say): once the upstream has answered 101, the
//! bytes are relayed both ways until either side closes, the tunnel has been silent
//! for `tunnel_idle_timeout`, or a stop's `drain_timeout` cuts it (a drain leaves
//! tunnels open until then).

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf},
    time::Instant,
};

/// Why a tunnel ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Both sides closed, or one failed.
    Closed,
    /// Nothing went either way for the idle timeout.
    Idle,
}

/// Relays between `client` and `upstream`; `early` is what the client sent after its
/// upgrade request, before the tunnel opened, and goes to the upstream first.
pub(super) async fn relay<C, U>(mut client: C, early: &[u8], mut upstream: U, idle_timeout: Duration) -> Ended
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    if upstream.write_all(early).await.is_err() {
        return Ended::Closed;
    }
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut client = Active { io: &mut client, started, last: Arc::clone(&last) };
    let mut upstream = Active { io: &mut upstream, started, last: Arc::clone(&last) };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    let mut copy = std::pin::pin!(copy);
    let mut deadline = started + idle_timeout;
    loop {
        tokio::select! {
            result = &mut copy => {
                if let Err(error) = result {
                    tracing::debug!(%error, "tunnel ended");
                }
                return Ended::Closed;
            }
            () = tokio::time::sleep_until(deadline) => {
                let active = started + Duration::from_millis(last.load(Ordering::Relaxed));
                if active + idle_timeout <= Instant::now() {
                    return Ended::Idle;
                }
                deadline = active + idle_timeout;
            }
        }
    }
}

/// One side of a tunnel, noting when bytes last moved (in milliseconds since the
/// tunnel opened) so that the idle timer need not be reset on every read.
struct Active<T> {
    io: T,
    started: Instant,
    last: Arc<AtomicU64>,
}

impl<T> Active<T> {
    fn touch(&self) {
        let since = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(since, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, duplex};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bytes_go_both_ways_and_silence_ends_the_tunnel() -> io::Result<()> {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let tunnel = tokio::spawn(async move { relay(client, b"early", upstream, Duration::from_secs(60)).await });
        let mut got = [0; 5];
        upstream_peer.read_exact(&mut got).await?;
        assert_eq!(&got, b"early");
        client_peer.write_all(b"ping").await?;
        let mut got = [0; 4];
        upstream_peer.read_exact(&mut got).await?;
        assert_eq!(&got, b"ping");
        tokio::time::sleep(Duration::from_secs(50)).await;
        upstream_peer.write_all(b"pong").await?;
        client_peer.read_exact(&mut got).await?;
        assert_eq!(&got, b"pong");
        let last_traffic = Instant::now();
        let ended = tunnel.await.map_err(io::Error::other)?;
        assert_eq!(ended, Ended::Idle);
        // The pong moved the deadline: the tunnel lasted 60 s past it, not past its start.
        let silent = last_traffic.elapsed();
        assert!(
            silent >= Duration::from_secs(59) && silent <= Duration::from_secs(61),
            "closed after {silent:?} of silence"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_side_closing_ends_the_tunnel() {
        let (client, client_peer) = duplex(1024);
        let (upstream, upstream_peer) = duplex(1024);
        drop((client_peer, upstream_peer));
        assert_eq!(relay(client, b"", upstream, Duration::from_secs(60)).await, Ended::Closed);
    }
}
