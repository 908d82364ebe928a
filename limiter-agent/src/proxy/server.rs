//! Accepting connections within their bounds and serving HTTP/1.1 on them: the idle
//! and header timeouts, graceful drain on shutdown. hyper refuses malformed and
//! ambiguous requests (400) before the pipeline sees them.

use std::{
    convert::Infallible,
    future::poll_fn,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, OnceLock},
};

use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};

use super::{
    AcceptHook, ProxyBody,
    connections::Slot,
    idle::{Guarded, InFlight, Wait, Watched},
    pipeline::Pipeline,
    problem::request_timeout_bytes,
    stats::Event,
};
use limiter_core::Clock;

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
                // The peer completed a handshake, so it is no spoofed source, whether or
                // not a connection bound then turns it away.
                Ok((stream, peer)) => {
                    if let Some(hook) = on_accept.get() {
                        hook.accepted(peer.ip());
                    }
                    // Over a connection bound, dropping the stream closes it.
                    if let Some(slot) = pipeline.admit(peer.ip()) {
                        connections.spawn(connection(stream, peer, pipeline.clone(), stopped.clone(), slot));
                    }
                }
                Err(error) => crate::accept::backoff("proxy", &error).await,
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
    // Held until the connection closes.
    _slot: Slot,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY");
    }
    let (idle_timeout, header_timeout) = pipeline.connection_timeouts();
    let in_flight = Arc::new(InFlight::default());
    let requests = in_flight.clone();
    let service_pipeline = pipeline.clone();
    let service = service_fn(move |request: Request<Incoming>| {
        let pipeline = service_pipeline.clone();
        // From the end of the head to the end of the response the connection is busy.
        let guard = requests.enter();
        // Boxed so the future is Unpin, which `poll_without_shutdown` needs.
        Box::pin(async move {
            let response = pipeline.handle(request, peer.ip()).await;
            Ok(response.map(|body| Guarded::new(body, guard).boxed()))
        }) as ResponseFuture
    });
    // The waits for a request are watched on the socket (see `idle`), not by hyper.
    let io = Watched::new(stream, in_flight, idle_timeout, header_timeout);
    let mut conn = http1::Builder::new().header_read_timeout(None).serve_connection(TokioIo::new(io), service);
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
    let parts = conn.into_parts();
    let watched = parts.io.into_inner();
    let expired = watched.expired();
    if let Err(error) = &result
        && expired.is_none()
    {
        tracing::debug!(%error, %peer, "connection ended");
    }
    let mut stream = watched.into_inner();
    // Tell a client that had started a request why it is cut off; an idle one is
    // closed silently.
    if expired == Some(Wait::Header) && !parts.read_buf.is_empty() {
        pipeline.count(Event::HeaderTimeout);
        if let Err(error) = stream.write_all(&request_timeout_bytes()).await {
            tracing::debug!(%error, %peer, "writing 408");
        }
    }
    if let Err(error) = stream.shutdown().await {
        tracing::debug!(%error, %peer, "closing connection");
    }
}
