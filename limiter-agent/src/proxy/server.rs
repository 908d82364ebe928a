//! Accepting connections and serving HTTP/1.1 on them: the header timeout, graceful
//! drain on shutdown. hyper refuses malformed and ambiguous requests (400) before the
//! pipeline sees them.

use std::{
    convert::Infallible,
    future::poll_fn,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, OnceLock},
    time::Duration,
};

use http::{Request, Response};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};

use limiter_core::Clock;

use super::{AcceptHook, ProxyBody, pipeline::Pipeline, problem::request_timeout_bytes, stats::Event};

/// After a failed accept (out of file descriptors, say) the listener would fail again
/// at once; a short pause keeps the loop from spinning while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

pub(super) async fn serve<C: Clock + Clone>(
    listener: &TcpListener,
    pipeline: &Arc<Pipeline<C>>,
    on_accept: &OnceLock<Arc<dyn AcceptHook>>,
    shutdown: impl Future<Output = ()>,
) {
    let (stop, stopped) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Some(hook) = on_accept.get() {
                        hook.accepted(peer.ip());
                    }
                    connections.spawn(connection(stream, peer, pipeline.clone(), stopped.clone()));
                }
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished connections so the set does not grow with every one served.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    stop.send_replace(());
    while connections.join_next().await.is_some() {}
}

async fn connection<C: Clock + Clone>(
    stream: TcpStream,
    peer: SocketAddr,
    pipeline: Arc<Pipeline<C>>,
    mut stop: watch::Receiver<()>,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY");
    }
    let header_timeout = pipeline.header_timeout();
    let service_pipeline = pipeline.clone();
    let service = service_fn(move |request: Request<Incoming>| {
        let pipeline = service_pipeline.clone();
        // Boxed so the future is Unpin, which `poll_without_shutdown` needs.
        Box::pin(async move { Ok(pipeline.handle(request, peer.ip()).await) }) as ResponseFuture
    });
    // The header timeout also runs while a keep-alive connection waits for its next
    // request, so it doubles as the idle timeout.
    let mut conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut draining = false;
    // Without shutdown, so that the socket is still ours to answer a header timeout on.
    let result = loop {
        tokio::select! {
            result = poll_fn(|cx| conn.poll_without_shutdown(cx)) => break result,
            _ = stop.changed(), if !draining => {
                draining = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
        }
    };
    let timed_out = matches!(&result, Err(error) if error.is_timeout());
    if let Err(error) = &result
        && !timed_out
    {
        tracing::debug!(%error, %peer, "connection ended");
    }
    let parts = conn.into_parts();
    let mut stream = parts.io.into_inner();
    // hyper just drops a connection whose headers are late. Tell a client that had
    // started a request why; an idle keep-alive connection is closed silently.
    if timed_out && !parts.read_buf.is_empty() {
        pipeline.count(Event::HeaderTimeout);
        if let Err(error) = stream.write_all(&request_timeout_bytes()).await {
            tracing::debug!(%error, %peer, "writing 408");
        }
    }
    if let Err(error) = stream.shutdown().await {
        tracing::debug!(%error, %peer, "closing connection");
    }
}
