//! Accepting connections within their bounds and serving them: the PROXY protocol
//! header from a trusted load balancer, TLS (its ClientHello read first for its JA4
//! fingerprint, with `[proxy.tls] fingerprint`), then HTTP/1.1 or HTTP/2 (by ALPN, or by
//! the preface with `h2c`), the idle and header timeouts, upgraded connections, and
//! graceful drain on shutdown. hyper refuses malformed and ambiguous requests (400)
//! before the pipeline sees them.

use std::{
    convert::Infallible,
    future::poll_fn,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::{
    body::Incoming,
    server::conn::{http1, http2},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};

use super::{
    body::{Guarded, ProxyBody},
    buffered::ConnectionBuffered,
    connections::{Refused, Slot},
    forward::{Upstream, UpstreamUpgrade},
    idle::{InFlight, Wait, Watched},
    pipeline::{ConnectionSettings, Pipeline},
    prefixed::{self, Prefixed},
    problem::request_timeout_bytes,
    proxy_protocol::{self, Header},
    resets::Resets,
    stalled::StallCut,
    stats::Event,
    tunnel,
};
use limiter_core::{
    Clock,
    ja4::{self, Ja4},
};

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

/// What a connection's stream is once its preamble is read: the bytes read ahead,
/// then the socket, under the idle and header timeouts.
type Plain = Prefixed<Watched<TcpStream>>;

/// One worker's accept loop: every connection it accepts is served on this thread,
/// and forwarded through this worker's own upstream pool, so that a request never
/// waits for another thread to wake. From `shutdown` on it accepts no more and its
/// connections drain (see [`super::Serving::stop`]); at `cut` those still open are
/// closed and counted.
pub(super) async fn serve<C: Clock + Clone>(
    listener: &TcpListener,
    pipeline: &Arc<Pipeline<C>>,
    shutdown: impl Future<Output = ()>,
    cut: impl Future<Output = ()>,
) {
    let upstream = Arc::new(Upstream::new(pipeline.upstream_permits()));
    let (stop, stopped) = watch::channel(());
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Over a connection bound, dropping the stream closes it.
                    if let Some(slot) = pipeline.admit(peer.ip()) {
                        let upstream = Arc::clone(&upstream);
                        connections.spawn(connection(stream, peer, pipeline.clone(), upstream, stopped.clone(), slot));
                    }
                }
                Err(error) => crate::accept::backoff("proxy", &error).await,
            },
            // Reap finished connections so the set does not grow with every one served.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    stop.send_replace(());
    let mut cut = std::pin::pin!(cut);
    loop {
        tokio::select! {
            joined = connections.join_next() => if joined.is_none() { return },
            () = &mut cut => break,
        }
    }
    let left = connections.len();
    for _ in 0..left {
        pipeline.count(Event::DrainCut);
    }
    tracing::warn!(connections = left, "drain_timeout passed: connections still open cut");
    // Dropping a connection's task closes its socket, and a tunnel's upstream too.
    connections.shutdown().await;
}

/// What one connection shares with the requests on it.
struct Connection<C: Clock + Clone> {
    pipeline: Arc<Pipeline<C>>,
    /// The pool of the worker serving this connection.
    upstream: Arc<Upstream>,
    /// The client: the TCP peer, or whom a trusted peer's PROXY header names.
    client: SocketAddr,
    /// The JA4 fingerprint of its TLS handshake.
    ja4: Option<Ja4>,
    in_flight: Arc<InFlight>,
    /// What its requests hold in memory of their bodies.
    buffered: ConnectionBuffered,
    settings: ConnectionSettings,
    stop: watch::Receiver<()>,
}

async fn connection<C: Clock + Clone>(
    stream: TcpStream,
    peer: SocketAddr,
    pipeline: Arc<Pipeline<C>>,
    upstream: Arc<Upstream>,
    stop: watch::Receiver<()>,
    slot: Slot,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY");
    }
    let settings = pipeline.connection_settings(peer.ip());
    let in_flight = Arc::new(InFlight::default());
    // The preamble (PROXY header, TLS handshake) is read under header_timeout too;
    // the socket holds the connection's place until it (and any tunnel it became)
    // closes.
    let mut watched = Watched::new(stream, Arc::clone(&in_flight), settings.timeouts, slot);
    let mut buffered = Vec::new();
    let Some(client) = preamble(&pipeline, &settings, &mut watched, &mut buffered, peer).await else {
        return;
    };
    let ja4 = if settings.fingerprint { client_hello(&mut watched, &mut buffered).await } else { None };
    if let Some(ja4) = ja4 {
        pipeline.presented(ja4, client.ip());
    }
    let connection = Connection {
        pipeline,
        upstream,
        client,
        ja4,
        in_flight,
        buffered: ConnectionBuffered::default(),
        settings,
        stop,
    };
    match connection.settings.tls.clone() {
        Some(tls) => match tls.acceptor().accept(Prefixed::new(buffered, watched)).await {
            Ok(stream) => {
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                if h2 { connection.http2(stream).await } else { connection.http1(stream).await }
            }
            Err(error) => {
                connection.pipeline.count(Event::TlsHandshakeFailed);
                if connection.in_flight.expired() == Some(Wait::Silent) {
                    connection.pipeline.unserved(connection.client.ip(), false);
                }
                tracing::debug!(%error, %peer, "TLS handshake failed");
            }
        },
        None => {
            // Cleartext HTTP/2 is told from HTTP/1.1 by its preface.
            let h2 = connection.settings.http2.h2c
                && prefixed::read_until(&mut watched, &mut buffered, prefixed::preface_decided).await.is_ok()
                && buffered.starts_with(prefixed::H2_PREFACE);
            let stream: Plain = Prefixed::new(buffered, watched);
            if h2 { connection.http2(stream).await } else { connection.http1(stream).await }
        }
    }
}

/// Reads the ClientHello into `buffered` (after what the preamble left there), no
/// further than it ends and at most [`ja4::MAX_CAPTURE_BYTES`], under the
/// connection's header timeout, and takes its JA4. The bytes are the handshake's
/// still: rustls reads them again. `None` for a start that is not a whole
/// ClientHello, which rustls then refuses as it always has.
async fn client_hello<R: AsyncRead + Unpin>(io: &mut R, buffered: &mut Vec<u8>) -> Option<Ja4> {
    loop {
        let ja4::Progress::More(wanted) = ja4::progress(buffered) else { return ja4::fingerprint(buffered) };
        buffered.reserve(wanted);
        match (&mut *io).take(u64::try_from(wanted).unwrap_or(u64::MAX)).read_buf(buffered).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Reads the PROXY protocol header a trusted peer sends, and refuses one from any
/// other peer. Returns whom the connection serves, moved to its own place under the
/// connection bounds; `None`: the connection is closed.
async fn preamble<C: Clock + Clone>(
    pipeline: &Pipeline<C>,
    settings: &ConnectionSettings,
    watched: &mut Watched<TcpStream>,
    buffered: &mut Vec<u8>,
    peer: SocketAddr,
) -> Option<SocketAddr> {
    let Some(accepted) = settings.proxy_protocol else { return Some(peer) };
    let refuse = |why: &dyn std::fmt::Display| {
        pipeline.refuse_connection(Refused::ProxyProtocol);
        tracing::debug!(%peer, %why, "PROXY protocol header refused");
        None
    };
    if !settings.peer_trusted {
        // Anyone may connect directly, but only a trusted peer may speak for a client.
        let decided = |start: &[u8]| {
            !proxy_protocol::starts_like_header(start, accepted) || start.len() >= proxy_protocol::SIGNATURE_BYTES
        };
        if let Err(error) = prefixed::read_until(watched, buffered, decided).await {
            tracing::debug!(%error, %peer, "connection ended before its first request");
            return None;
        }
        if proxy_protocol::starts_like_header(buffered, accepted) {
            return refuse(&"sent by a peer not in trusted_proxies");
        }
        return Some(peer);
    }
    let client = match proxy_protocol::read(watched, accepted, buffered).await {
        Ok(Header::Proxied(client)) => client,
        Ok(Header::Local) => return Some(peer),
        Err(error) => return refuse(&error),
    };
    // The client behind the load balancer has its own share of the connection bounds
    // (the balancer's place is freed first, so that it is never the one short).
    watched.release();
    let slot = pipeline.admit(client.ip())?;
    watched.proxied(slot, buffered.is_empty());
    Some(client)
}

/// A tunnel's upstream half, left by the response that opened it.
type UpgradeSlot = Arc<Mutex<Option<UpstreamUpgrade>>>;

impl<C: Clock + Clone> Connection<C> {
    /// The service for one connection's requests. `resets` watches for cancelled
    /// requests (HTTP/2); `upgrade` receives an upstream's 101 (HTTP/1.1).
    fn service(
        &self,
        resets: Option<Arc<Resets>>,
        upgrade: Option<UpgradeSlot>,
    ) -> impl Fn(Request<Incoming>) -> ResponseFuture + Clone + Send + 'static {
        let pipeline = Arc::clone(&self.pipeline);
        let upstream = Arc::clone(&self.upstream);
        let in_flight = Arc::clone(&self.in_flight);
        let buffered = Arc::clone(&self.buffered);
        let client = (self.client.ip(), self.ja4);
        move |request: Request<Incoming>| {
            let pipeline = Arc::clone(&pipeline);
            let upstream = Arc::clone(&upstream);
            let buffered = Arc::clone(&buffered);
            let upgrade = upgrade.clone();
            // From the end of the head to the end of the response the connection is busy.
            let guard = in_flight.enter();
            let cancellation = resets.as_ref().map(Resets::watch);
            // Boxed so the future is Unpin, which `poll_without_shutdown` needs.
            Box::pin(async move {
                let mut response = pipeline.handle(request, client, &upstream, &buffered).await;
                if let Some(cancellation) = cancellation {
                    cancellation.answered();
                }
                let opened = response.extensions_mut().remove::<UpstreamUpgrade>();
                if let (Some(opened), Some(upgrade)) = (opened, upgrade)
                    && response.status() == StatusCode::SWITCHING_PROTOCOLS
                {
                    *upgrade.lock().unwrap_or_else(PoisonError::into_inner) = Some(opened);
                }
                Ok(response.map(|body| Guarded::new(body, guard).boxed()))
            }) as ResponseFuture
        }
    }

    async fn http1<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, stream: S) {
        let upgrade = UpgradeSlot::default();
        let service = service_fn(self.service(None, Some(Arc::clone(&upgrade))));
        // The waits for a request are watched on the socket (see `idle`), not by hyper.
        let mut conn = http1::Builder::new().header_read_timeout(None).serve_connection(TokioIo::new(stream), service);
        let (mut draining, mut told) = (false, false);
        let in_flight = Arc::clone(&self.in_flight);
        // Without shutdown, so that the socket is still ours to answer a header timeout
        // on, or to relay once upgraded.
        let result = loop {
            tokio::select! {
                result = poll_fn(|cx| {
                    let polled = conn.poll_without_shutdown(cx);
                    // A connection accepted as the drain began is told to close only
                    // once its first request has begun: its client sent that request
                    // expecting an answer, and would not send it again as it would
                    // on a connection it had reused. One that sends nothing is closed
                    // at header_timeout, as ever.
                    if draining && !told && in_flight.begun() > 0 {
                        told = true;
                        Pin::new(&mut conn).graceful_shutdown();
                    }
                    polled
                }) => break result,
                _ = self.stop.changed(), if !draining => {
                    draining = true;
                    if in_flight.begun() > 0 {
                        told = true;
                        Pin::new(&mut conn).graceful_shutdown();
                    }
                }
            }
        };
        let parts = conn.into_parts();
        let expired = self.in_flight.expired();
        if let Err(error) = &result
            && expired.is_none()
        {
            tracing::debug!(%error, client = %self.client, "connection ended");
        }
        let mut stream = parts.io.into_inner();
        let opened = upgrade.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let (Ok(()), Some(opened)) = (&result, opened) {
            self.tunnel(stream, &parts.read_buf, opened).await;
            return;
        }
        self.ended();
        // Tell a client that had started a request why it is cut off; an idle one is
        // closed silently.
        if expired == Some(Wait::Header) && !parts.read_buf.is_empty() {
            self.pipeline.count(Event::HeaderTimeout);
            // Before the answer, so that the client's next connection meets its count.
            self.pipeline.unserved(self.client.ip(), true);
            if let Err(error) = stream.write_all(&request_timeout_bytes()).await {
                tracing::debug!(%error, client = %self.client, "writing 408");
            }
        } else {
            self.count_unserved();
        }
        if let Err(error) = stream.shutdown().await {
            tracing::debug!(%error, client = %self.client, "closing connection");
        }
    }

    /// Counts the connection towards its client's escalation if `header_timeout`
    /// closed it before any request, with nothing of one received (a half-sent head
    /// is answered 408, and counted, instead).
    fn count_unserved(&self) {
        let expired = self.in_flight.expired();
        if matches!(expired, Some(Wait::Header | Wait::Silent)) && self.in_flight.begun() == 0 {
            self.pipeline.unserved(self.client.ip(), false);
        }
    }

    /// Counts how the connection ended, where that is a count of its own.
    fn ended(&self) {
        if self.in_flight.send_timed_out() {
            self.pipeline.count(Event::SendTimeout);
        }
    }

    async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(self, stream: S, early: &[u8], opened: UpstreamUpgrade) {
        // The places in flight of the request that opened it, until it closes.
        let UpstreamUpgrade { opened, held: _held } = opened;
        let upstream = match opened.await {
            Ok(upstream) => upstream,
            Err(error) => {
                tracing::debug!(%error, client = %self.client, "the upstream's side of the upgrade failed");
                return;
            }
        };
        self.pipeline.count(Event::Upgraded);
        // Busy for as long as the tunnel is open: no wait for a request applies.
        let _busy = self.in_flight.enter();
        // A drain leaves it open: it is cut with the others at drain_timeout.
        let ended = tunnel::relay(stream, early, TokioIo::new(upstream), self.settings.tunnel_idle_timeout).await;
        tracing::debug!(?ended, client = %self.client, "tunnel closed");
    }

    async fn http2<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(mut self, stream: S) {
        let limits = &self.settings.http2;
        let resets = Resets::new(limits.max_resets_per_minute.get());
        let service = service_fn(self.service(Some(Arc::clone(&resets)), None));
        let pipeline = Arc::clone(&self.pipeline);
        let stall = StallCut::new(self.settings.stream_stall, Arc::new(move || pipeline.count(Event::SendTimeout)));
        let mut conn = http2::Builder::new(stall)
            .max_concurrent_streams(limits.max_concurrent_streams.get())
            .max_header_list_size(limits.max_header_list_bytes.get())
            .serve_connection(TokioIo::new(stream), service);
        let mut draining = false;
        let result = loop {
            tokio::select! {
                result = &mut conn => break result,
                _ = self.stop.changed(), if !draining => {
                    draining = true;
                    Pin::new(&mut conn).graceful_shutdown();
                }
                // Dropping the connection closes it, with every stream still on it.
                () = resets.exceeded() => {
                    self.pipeline.count(Event::ResetFlood);
                    tracing::debug!(client = %self.client, "HTTP/2 connection cut: too many cancelled requests");
                    return;
                }
            }
        };
        self.ended();
        self.count_unserved();
        if let Err(error) = result {
            let h2 = std::error::Error::source(&error).and_then(|source| source.downcast_ref::<h2::Error>());
            if h2.and_then(h2::Error::reason) == Some(h2::Reason::ENHANCE_YOUR_CALM) {
                self.pipeline.count(Event::ResetFlood);
            }
            tracing::debug!(%error, client = %self.client, "HTTP/2 connection ended");
        }
    }
}
