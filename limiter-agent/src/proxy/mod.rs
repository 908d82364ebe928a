//! The rate-limiting HTTP reverse proxy.
//!
//! A request goes: [`server`] (accept, header timeout, malformed requests refused by
//! hyper) → [`pipeline`] (body bound, client address from [`keys`], signature and
//! idempotency when a rule requires it, then the [`crate::limits`] decision) →
//! [`forward`] (upstream, hop-by-hop headers) → [`headers`] on the way back. Every
//! answer the proxy gives itself is a [`problem`] response.
//!
//! The agent binds a [`Proxy`], runs it until shutdown (in-flight requests drain),
//! swaps its config on reload and reads its [`ProxyStats`].

mod adaptive;
mod blame;
mod body;
mod bounded;
mod buffered;
mod connections;
mod decision_log;
mod error;
mod exchange;
pub(crate) mod explain;
mod forward;
mod gates;
mod headers;
mod heavy;
mod idempotent;
mod idle;
mod keys;
mod pipeline;
mod post_paid;
mod prefixed;
mod problem;
mod proxy_protocol;
mod resets;
mod server;
mod shares;
mod snapshot;
mod stalled;
mod stats;
mod tunnel;

use std::{
    net::{IpAddr, SocketAddr},
    num::NonZeroUsize,
    panic::AssertUnwindSafe,
    sync::{Arc, mpsc::SyncSender},
    time::{Duration, Instant},
};

use tokio::{net::TcpListener, runtime::Runtime, sync::watch};

use limiter_core::{Clock, SystemClock};

pub(crate) use self::heavy::ClientRow;
pub use self::{
    error::ProxyError,
    gates::{GateKind, Shed},
    stats::{AdaptiveStats, DECISION_BUCKETS, DecisionHistogram, ProxyStats, QUEUE_WAIT_BUCKETS, ShedCount},
};
use self::{pipeline::Pipeline, stats::Event};
use crate::{config::ProxyConfig, signature::KeySecrets};

/// The shortest time between two replacements of one worker: one that dies again at
/// once (a panic every connection brings about) is replaced once a second, not in a
/// loop.
const REPLACE_INTERVAL: Duration = Duration::from_secs(1);

/// Told the TCP peer of every request the proxy forwarded and the upstream answered.
/// Such a peer completed a handshake, so it owns its address, and sent a request the
/// limits let through: the kernel layer's verified sources. A bare handshake vouches
/// for nothing, or a host could verify every address of its prefix by connecting.
pub trait ServedHook: Send + Sync + std::fmt::Debug {
    fn served(&self, peer: IpAddr);
}

/// A bound proxy. `run` serves until shutdown; `reconfigure` and `stats` may be
/// called meanwhile from elsewhere (share the proxy in an `Arc`).
///
/// It serves on `proxy.workers` threads, each with a single-threaded runtime and its
/// own upstream pool: a connection stays on the thread that accepted it, with the
/// upstream connections it uses, so no request pays for a wake-up across threads.
/// The workers accept from one listening socket (each its own descriptor of it)
/// rather than one `SO_REUSEPORT` socket each, so that the port stays ours alone: a
/// second agent started on it fails to bind instead of silently taking a share of
/// the connections.
#[derive(Debug)]
pub struct Proxy<C: Clock + Clone = SystemClock> {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    workers: NonZeroUsize,
    pipeline: Arc<Pipeline<C>>,
}

impl<C: Clock + Clone> Proxy<C> {
    /// Binds `config.listen`, verifying signatures with `secrets`; limits, signature
    /// timestamps and idempotency are measured with `clock`.
    pub async fn bind(config: Arc<ProxyConfig>, secrets: KeySecrets, clock: C) -> Result<Self, ProxyError> {
        Self::bind_or_take(config, secrets, clock, None).await
    }

    /// As [`Proxy::bind`], but on `inherited` when given: a listening socket handed
    /// over by the agent this one replaces, or by systemd. Connections wait in its
    /// queue meanwhile, so none is refused.
    pub async fn bind_or_take(
        config: Arc<ProxyConfig>,
        secrets: KeySecrets,
        clock: C,
        inherited: Option<std::net::TcpListener>,
    ) -> Result<Self, ProxyError> {
        let pipeline = Pipeline::new(config.clone(), secrets, clock)?;
        let bind_error = |source| ProxyError::Bind { addr: config.listen, source };
        let listener = match inherited {
            Some(listener) => listener,
            // Each worker registers the socket with its own runtime.
            None => TcpListener::bind(config.listen).await.and_then(TcpListener::into_std).map_err(bind_error)?,
        };
        let local_addr = listener.local_addr().map_err(bind_error)?;
        Ok(Self { listener, local_addr, workers: config.workers(), pipeline: Arc::new(pipeline) })
    }

    /// The listening socket, to hand to the agent replacing this one.
    #[must_use]
    pub fn listener(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.listener)
    }

    /// The address actually bound (`listen` may ask for port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts serving on `proxy.workers` threads, until [`Serving::stop`]. Fails if a
    /// worker cannot start (those started are stopped again).
    pub fn serve(&self) -> Result<Serving, ProxyError> {
        let (stop, stopped) = watch::channel(Phase::Serving);
        let mut serving = Serving {
            stop,
            finished: Vec::with_capacity(self.workers.get()),
            #[cfg(feature = "test-hooks")]
            kills: Vec::new(),
        };
        for worker in 0..self.workers.get() {
            // Dropping `serving` on error stops the workers already started.
            self.start_worker(worker, &mut serving, stopped.clone())?;
        }
        Ok(serving)
    }

    /// Starts worker `worker` on a thread of its own, serving until `stopped` leaves
    /// [`Phase::Serving`] (draining until [`Phase::Cut`]), and returns once it listens; `serving` gets a receiver that is closed
    /// once it has drained.
    ///
    /// A worker that dies (a panic, which only a bug brings about) is counted, logged
    /// and replaced on the same thread, listening on the same socket: the connections
    /// it served are cut, no other is refused, and the limits keep their state. Were
    /// the agent to exit instead, every connection would be refused until it was
    /// restarted, and every in-memory limit would start over.
    fn start_worker(
        &self,
        worker: usize,
        serving: &mut Serving,
        stopped: watch::Receiver<Phase>,
    ) -> Result<(), ProxyError> {
        let failed = |source| ProxyError::Worker { worker, source };
        let listener = self.listener.try_clone().map_err(failed)?;
        let mut runtime = worker_runtime().map_err(failed)?;
        let pipeline = Arc::clone(&self.pipeline);
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let (listening, listens) = std::sync::mpsc::sync_channel(1);
        #[cfg(feature = "test-hooks")]
        let kill = Arc::<tokio::sync::Notify>::default();
        #[cfg(feature = "test-hooks")]
        serving.kills.push(Arc::clone(&kill));
        std::thread::Builder::new()
            .name(format!("proxy-{worker}"))
            .spawn(move || {
                let mut listening = Some(listening);
                let mut died_at: Option<Instant> = None;
                loop {
                    let life = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        let shutdown = Phase::reached(stopped.clone(), Phase::Draining);
                        let cut = Phase::reached(stopped.clone(), Phase::Cut);
                        #[cfg(feature = "test-hooks")]
                        let shutdown = async {
                            tokio::select! {
                                () = shutdown => {}
                                () = kill.notified() => panic!("proxy worker killed by a test"),
                            }
                        };
                        live(&runtime, &listener, &pipeline, shutdown, cut, listening.take());
                    }));
                    let Err(panic) = life else { break };
                    if *stopped.borrow() != Phase::Serving {
                        break;
                    }
                    // The dead one's runtime may hold tasks left mid-poll: the next
                    // life gets a new one, and dropping the old one closes the
                    // connections it served before the death is counted.
                    let replaced = worker_runtime().map(|new| runtime = new);
                    let message = panic
                        .downcast_ref::<&str>()
                        .copied()
                        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                        .unwrap_or("(no message)");
                    if let Err(error) = replaced {
                        tracing::error!(worker, panic = message, %error, "proxy worker died and cannot be replaced");
                        break;
                    }
                    pipeline.count(Event::WorkerReplaced);
                    tracing::error!(worker, panic = message, "proxy worker died, its connections cut; replacing it");
                    if died_at.is_some_and(|at| at.elapsed() < REPLACE_INTERVAL) {
                        let stopping = Phase::reached(stopped.clone(), Phase::Draining);
                        runtime.block_on(async {
                            let _ = tokio::time::timeout(REPLACE_INTERVAL, stopping).await;
                        });
                    }
                    died_at = Some(Instant::now());
                }
                // Before the drain is reported: while this descriptor stays open the
                // kernel still completes handshakes on the socket.
                drop(listener);
                drop(done);
            })
            .map_err(failed)?;
        // A moment's wait at start, so that a worker that cannot listen is an error
        // of the start rather than a thread gone quietly.
        match listens.recv() {
            Ok(Ok(())) => {
                serving.finished.push(finished);
                Ok(())
            }
            Ok(Err(error)) => Err(failed(error)),
            Err(_) => Err(failed(std::io::Error::other("the worker ended before it listened"))),
        }
    }

    /// Applies a new config to new requests; limiter state of unchanged rules and
    /// plans is kept. Refused whole if `listen` moved.
    pub fn reconfigure(&self, config: Arc<ProxyConfig>, secrets: KeySecrets) -> Result<(), ProxyError> {
        self.pipeline.reconfigure(config, secrets)
    }

    /// What the proxy would do with `request` now, charging nothing.
    pub(crate) async fn explain(
        &self,
        request: &explain::ExplainRequest,
    ) -> Result<explain::ProxyExplanation, explain::ExplainError> {
        self.pipeline.explain(request).await
    }

    /// Counts the refusals this proxy's clients caused (see `blame`) towards
    /// escalation to the kernel layer.
    pub fn escalate_to(&self, escalator: Arc<crate::escalation::Escalator<C>>) {
        self.pipeline.escalate_to(escalator);
    }

    /// Writes this proxy's security events (signatures refused, scopes, `deny`
    /// rules) to `log`; only the first call counts.
    pub fn log_security_to(&self, log: Arc<crate::security_log::SecurityLog>) {
        self.pipeline.log_security_to(log);
    }

    /// Tells `hook` the peer of every request served from now on; only the first
    /// call counts.
    pub(crate) fn on_served(&self, hook: Arc<dyn ServedHook>) {
        self.pipeline.on_served(hook);
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> ProxyStats {
        self.pipeline.stats()
    }

    /// What the kernel's new-source budget is to be scaled by now: the upstream has
    /// been shedding long enough (10 s, restored after 10 s without a refusal); `None`: as configured.
    #[must_use]
    pub fn kernel_tightening(&self) -> Option<f64> {
        self.pipeline.kernel_tightening()
    }

    /// What each limit's keys have peaked at, and a limit `headroom` above (see
    /// [`crate::limits::Engine::suggest`]).
    #[must_use]
    pub fn suggest(&self, headroom: f64) -> Vec<crate::limits::Suggestion> {
        self.pipeline.suggest(headroom)
    }

    /// The `n` clients with the most requests lately (see [`ClientRow`]).
    #[must_use]
    pub(crate) fn top_clients(&self, n: usize) -> Vec<ClientRow> {
        self.pipeline.top_clients(n)
    }

    /// The connection to the fleet's Redis its stores share; `None` in memory.
    #[must_use]
    pub fn fleet(&self) -> Option<&crate::fleet::Fleet> {
        self.pipeline.fleet()
    }
}

/// One runtime per worker: a connection and its upstream requests stay on it.
fn worker_runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// One life of a worker: serves from its own descriptor of `listener` on `runtime`
/// until `shutdown`, then drains until `cut`; the first life tells `listening`
/// whether it listens.
fn live<C: Clock + Clone>(
    runtime: &Runtime,
    listener: &std::net::TcpListener,
    pipeline: &Arc<Pipeline<C>>,
    shutdown: impl Future<Output = ()>,
    cut: impl Future<Output = ()>,
    listening: Option<SyncSender<std::io::Result<()>>>,
) {
    runtime.block_on(async {
        // Registered with this thread's runtime, which must be running.
        let listener = match listener.try_clone().and_then(TcpListener::from_std) {
            Ok(listener) => listener,
            Err(error) => {
                match listening {
                    Some(listening) => drop(listening.send(Err(error))),
                    None => tracing::error!(%error, "a replaced proxy worker cannot listen"),
                }
                return;
            }
        };
        if let Some(listening) = listening {
            let _ = listening.send(Ok(()));
        }
        server::serve(&listener, pipeline, shutdown, cut).await;
    });
}

/// Where a proxy's workers are between start and stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    /// Accepting no more; requests in flight finish, tunnels stay open.
    Draining,
    /// The drain timed out: whatever is still open is cut.
    Cut,
}

impl Phase {
    /// Resolves once the workers are at `phase` or past it (or the proxy is gone).
    async fn reached(mut phase: watch::Receiver<Self>, wanted: Self) {
        let _ = phase.wait_for(|now| *now >= wanted).await;
    }
}

/// A proxy's running workers.
#[derive(Debug)]
pub struct Serving {
    stop: watch::Sender<Phase>,
    /// One per worker, closed once it has drained.
    finished: Vec<tokio::sync::oneshot::Receiver<()>>,
    /// One per worker: makes its life end in a panic.
    #[cfg(feature = "test-hooks")]
    kills: Vec<Arc<tokio::sync::Notify>>,
}

#[cfg(feature = "test-hooks")]
impl Serving {
    /// Kills worker `worker` as a bug would: a panic in its accept loop.
    pub fn kill_worker(&self, worker: usize) {
        self.kills[worker].notify_one();
    }
}

impl Serving {
    /// Stops accepting and lets every in-flight request finish: an idle keep-alive
    /// connection closes at once, a busy one answers `Connection: close` and closes,
    /// an HTTP/2 connection is sent GOAWAY and closes once its streams are done.
    /// Tunnels stay open. After `drain_timeout` whatever is still open is cut (counted
    /// as `drain_cut`). Returns once every worker has finished.
    pub async fn stop(mut self, drain_timeout: Duration) {
        self.stop.send_replace(Phase::Draining);
        let mut finished = std::mem::take(&mut self.finished);
        let drained = tokio::time::timeout(drain_timeout, async {
            // Closed when the worker has drained, or died; kept until then, so that
            // those left are the ones to wait for once cut.
            while let Some(worker) = finished.last_mut() {
                let _ = worker.await;
                finished.pop();
            }
        })
        .await;
        if drained.is_err() {
            self.stop.send_replace(Phase::Cut);
            for worker in finished {
                let _ = worker.await;
            }
        }
    }
}

impl Drop for Serving {
    /// A proxy no one will stop is stopped now; its workers drain on their own.
    fn drop(&mut self) {
        self.stop.send_replace(Phase::Draining);
    }
}
