//! The Redis server that the agents of a fleet share (`proxy.store = "redis"`): one
//! multiplexed connection per agent, a short timeout per call, and the health of the
//! link, so that an outage is logged once and not per request.
//!
//! Three topologies, by `redis_url`:
//! - `redis://host:port/` — one server;
//! - `redis+sentinel://s1:port,s2:port/MASTER` — the master the Sentinels name, asked
//!   again after every outage, so that a failover is followed without a restart;
//! - `redis+cluster://n1:port,n2:port/` — a Redis Cluster, its MOVED and ASK
//!   redirections followed by the client. Every key of a fleet carries the prefix as
//!   a hash tag (`{limiter:}…`), so that all the buckets one decision touches live in
//!   one slot and each decision stays one atomic script call; fleets with other
//!   prefixes spread over the other masters.
//!
//! After [`FAILURES_TO_OPEN`] calls in a row found the server unreachable (the breaker
//! opens), calls fail at once instead of each waiting for the timeout: one call per
//! backoff interval (doubling from [`MIN_BACKOFF`] to [`MAX_BACKOFF`]) is let through
//! to probe it, and the first that succeeds ends the outage. One slow answer (a
//! script held up, a lost packet) fails its own call only: were it to open the
//! breaker, one client able to slow the server once would switch the whole fleet to
//! `store_failure`. Every decision taken without the store is counted
//! ([`Fleet::failures`]).

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::proxy::RedisUrl;

/// First wait between probes of an unreachable server.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between probes: how late limits resume after the server is back.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Calls in a row that must find the server unreachable before the breaker opens.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;
/// Least time given to making a connection (see [`Fleet::call`]).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a call to the shared store did not complete.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("redis_url `{url}`: {source}")]
    Url {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis_tls_ca {}: {source}", path.display())]
    Ca {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The server is known to be down and this call was not the probe.
    #[error("redis unreachable")]
    Down,
    #[error("redis answered an unexpected reply: {0}")]
    Reply(String),
}

/// A handle on the shared Redis; clones share the connection and its health.
#[derive(Clone)]
pub struct Fleet {
    topology: Arc<Topology>,
    prefix: Arc<str>,
    timeout: Duration,
    health: Arc<Health>,
}

/// Where the fleet's Redis is.
enum Topology {
    Single {
        client: redis::Client,
        connection: ConnectionManager,
    },
    Sentinel {
        sentinel: tokio::sync::Mutex<redis::sentinel::Sentinel>,
        master: String,
        /// The master's client and connection, until an outage drops them.
        current: Mutex<Option<(redis::Client, ConnectionManager)>>,
        config: ConnectionManagerConfig,
    },
    Cluster {
        client: redis::cluster::ClusterClient,
        /// Made on first use, and again after an outage: a connection whose master
        /// died keeps its slot map until a node tells it otherwise, which the dead
        /// node never does.
        connection: Mutex<Option<redis::cluster_async::ClusterConnection>>,
        /// Any node serves a subscription: a cluster relays every publication.
        seeds: Vec<redis::Client>,
    },
}

/// One call's connection, whatever the topology.
#[derive(Clone)]
#[expect(missing_debug_implementations, reason = "the cluster connection has no Debug")]
pub enum Link {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Health {
    /// `Some` during an outage (the breaker open).
    down: Mutex<Option<Outage>>,
    /// Calls in a row that found the server unreachable, while the breaker is closed.
    consecutive: AtomicU32,
    failures: AtomicU64,
}

#[derive(Debug)]
struct Outage {
    next_probe: Instant,
    backoff: Duration,
}

impl Fleet {
    /// A handle on the server at `url`; connects on first use (an agent starts, and
    /// follows `store_failure`, while Redis is down). Every key it names starts with
    /// `prefix`. Must be called within a tokio runtime.
    pub fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Self, FleetError> {
        Self::connect_tls(url, prefix, timeout, None)
    }

    /// [`Self::connect`], trusting the CA `tls_ca` (PEM) for `rediss://` servers
    /// instead of the system's roots.
    pub(crate) fn connect_tls(
        url: &str,
        prefix: &str,
        timeout: Duration,
        tls_ca: Option<&[u8]>,
    ) -> Result<Self, FleetError> {
        // redis' rustls comes without a crypto provider; the first call picks ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url_error = |source| FleetError::Url { url: url.to_owned(), source };
        let certs = || redis::TlsCertificates { client_tls: None, root_cert: tls_ca.map(<[u8]>::to_vec) };
        let open = |node: &str| match tls_ca {
            Some(_) => redis::Client::build_with_tls(node, certs()),
            None => redis::Client::open(node),
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Retries would hold a decision past its timeout; the probes retry instead.
            .set_number_of_retries(0);
        let (topology, prefix) = match RedisUrl::parse(url) {
            RedisUrl::Single => {
                let client = open(url).map_err(url_error)?;
                let connection = ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(url_error)?;
                (Topology::Single { client, connection }, prefix.to_owned())
            }
            RedisUrl::Sentinel { nodes, master } => {
                let sentinel = redis::sentinel::Sentinel::build(nodes).map_err(url_error)?;
                let current = Mutex::new(None);
                (Topology::Sentinel { sentinel: sentinel.into(), master, current, config }, prefix.to_owned())
            }
            RedisUrl::Cluster { nodes } => {
                let mut builder = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                if tls_ca.is_some() {
                    builder = builder.certs(certs());
                }
                let client = builder.build().map_err(url_error)?;
                let seeds = nodes.iter().map(|node| open(node)).collect::<Result<_, _>>();
                let topology =
                    Topology::Cluster { client, connection: Default::default(), seeds: seeds.map_err(url_error)? };
                (topology, format!("{{{prefix}}}"))
            }
        };
        Ok(Self { topology: Arc::new(topology), prefix: prefix.into(), timeout, health: Arc::default() })
    }

    /// `prefix` then `name`: the name of a key in the shared server (in a cluster the
    /// prefix is a hash tag, see the module's docs).
    #[must_use]
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The connection for one call: a clone of the shared one, made on first use
    /// (and, behind Sentinels, again after an outage).
    async fn link(&self) -> redis::RedisResult<Link> {
        match &*self.topology {
            Topology::Single { connection, .. } => Ok(Link::Single(connection.clone())),
            Topology::Cluster { client, connection, .. } => {
                if let Some(known) = connection.lock().unwrap_or_else(PoisonError::into_inner).clone() {
                    return Ok(Link::Cluster(known));
                }
                let made = client.get_async_connection().await?;
                *connection.lock().unwrap_or_else(PoisonError::into_inner) = Some(made.clone());
                Ok(Link::Cluster(made))
            }
            Topology::Sentinel { sentinel, master, current, config } => {
                Ok(Link::Single(master_of(sentinel, master, current, config).await?.1))
            }
        }
    }

    /// After an outage the connection is made anew: behind Sentinels from the master
    /// they name then, in a cluster from the slots its nodes serve then.
    fn forget_connection(&self) {
        match &*self.topology {
            Topology::Sentinel { current, .. } => *current.lock().unwrap_or_else(PoisonError::into_inner) = None,
            Topology::Cluster { connection, .. } => *connection.lock().unwrap_or_else(PoisonError::into_inner) = None,
            Topology::Single { .. } => {}
        }
    }

    /// Runs one call on the connection within the timeout, keeping track of health.
    pub async fn call<T, F>(&self, call: impl FnOnce(Link) -> F) -> Result<T, FleetError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        self.health.admit()?;
        // Making a cluster's connection or asking the Sentinels takes a few round
        // trips: it gets a budget of its own, so that it can finish over a link slower
        // than one decision's timeout (which a call that connects may then add to).
        let connect = self.timeout.max(CONNECT_TIMEOUT);
        let attempt = async {
            let link = match tokio::time::timeout(connect, self.link()).await {
                Ok(link) => link.map_err(FleetError::Redis)?,
                Err(_) => return Err(FleetError::Timeout(connect)),
            };
            match tokio::time::timeout(self.timeout, call(link)).await {
                Ok(result) => result.map_err(FleetError::Redis),
                Err(_) => Err(FleetError::Timeout(self.timeout)),
            }
        };
        let result = attempt.await;
        match &result {
            Ok(_) => self.health.up(),
            Err(error) if is_outage(error) => {
                if self.health.down(error) {
                    self.forget_connection();
                }
            }
            Err(_) => {}
        }
        result
    }

    /// Whether the breaker is closed (false during an outage).
    #[must_use]
    pub fn is_up(&self) -> bool {
        self.health.lock().is_none()
    }

    /// Keys the server has evicted for memory since it started (in a cluster, all
    /// its masters together: the client asks each and answers with a map).
    pub async fn evictions(&self) -> Result<u64, FleetError> {
        let info: redis::Value = self
            .call(|mut connection| async move { redis::cmd("INFO").arg("stats").query_async(&mut connection).await })
            .await?;
        let texts: Vec<String> = match info {
            redis::Value::Map(nodes) => {
                nodes.into_iter().filter_map(|(_, text)| redis::from_redis_value(text).ok()).collect()
            }
            single => vec![redis::from_redis_value(single).map_err(|e| FleetError::Reply(e.to_string()))?],
        };
        let evicted = |text: &String| -> Option<u64> {
            text.lines().find_map(|line| line.strip_prefix("evicted_keys:")).and_then(|n| n.trim().parse().ok())
        };
        texts
            .iter()
            .map(evicted)
            .sum::<Option<u64>>()
            .ok_or_else(|| FleetError::Reply("INFO stats without evicted_keys".to_owned()))
    }

    /// Counts one decision taken without the store (by `store_failure`).
    pub(crate) fn count_failure(&self) {
        self.health.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Decisions taken without the store since the start.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.health.failures.load(Ordering::Relaxed)
    }

    /// Says this agent (`id`) is alive, and returns how many agents of the fleet did
    /// within `live_for` (one sorted set scored by the server's clock, so that the
    /// agents' own clocks need not agree), and the keys of the server holding the
    /// fleet's keys (in a cluster, the master of its slot).
    pub async fn heartbeat(&self, id: &str, live_for: Duration) -> Result<(u32, u64), FleetError> {
        let script = redis::Script::new(HEARTBEAT);
        let key = self.key("agents");
        let live_ms = u64::try_from(live_for.as_millis()).unwrap_or(u64::MAX);
        self.call(|mut connection| {
            let mut invocation = script.key(&key);
            invocation.arg(id).arg(live_ms);
            async move { invocation.invoke_async(&mut connection).await }
        })
        .await
    }

    /// A dedicated connection for subscriptions (a subscribed connection can do
    /// nothing else).
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, FleetError> {
        let subscribe = async {
            match &*self.topology {
                Topology::Single { client, .. } => client.get_async_pubsub().await,
                Topology::Sentinel { sentinel, master, current, config } => {
                    master_of(sentinel, master, current, config).await?.0.get_async_pubsub().await
                }
                Topology::Cluster { seeds, .. } => {
                    let mut last = None;
                    for seed in seeds {
                        match seed.get_async_pubsub().await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(error) => last = Some(error),
                        }
                    }
                    Err(last.unwrap_or_else(|| (redis::ErrorKind::InvalidClientConfig, "no seed node").into()))
                }
            }
        };
        match tokio::time::timeout(self.timeout, subscribe).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(FleetError::Timeout(self.timeout)),
        }
    }
}

/// Records `ARGV[1]` as alive now, forgets members older than `ARGV[2]` ms, and
/// counts the rest; and the server's keys.
const HEARTBEAT: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return { redis.call('ZCARD', KEYS[1]), redis.call('DBSIZE') }
";

/// Behind Sentinels: the master's client and connection, asked of the Sentinels when
/// none is known (at first, and after an outage).
async fn master_of(
    sentinel: &tokio::sync::Mutex<redis::sentinel::Sentinel>,
    master: &str,
    current: &Mutex<Option<(redis::Client, ConnectionManager)>>,
    config: &ConnectionManagerConfig,
) -> redis::RedisResult<(redis::Client, ConnectionManager)> {
    if let Some(known) = current.lock().unwrap_or_else(PoisonError::into_inner).clone() {
        return Ok(known);
    }
    let client = sentinel.lock().await.async_master_for(master, None).await?;
    let connection = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
    *current.lock().unwrap_or_else(PoisonError::into_inner) = Some((client.clone(), connection.clone()));
    Ok((client, connection))
}

/// Whether an error means the server is unreachable (rather than refusing one call,
/// as a script error would).
fn is_outage(error: &FleetError) -> bool {
    match error {
        FleetError::Redis(error) => {
            error.is_io_error() || error.is_connection_dropped() || error.is_timeout() || error.is_unrecoverable_error()
        }
        FleetError::Timeout(_) | FleetError::Down => true,
        FleetError::Url { .. } | FleetError::Reply(_) | FleetError::Ca { .. } => false,
    }
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        // Only plain assignments happen under the lock.
        self.down.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets a call through unless the server is down and this is not a probe's turn.
    fn admit(&self) -> Result<(), FleetError> {
        let mut down = self.lock();
        let Some(outage) = down.as_mut() else { return Ok(()) };
        let now = Instant::now();
        if now < outage.next_probe {
            return Err(FleetError::Down);
        }
        outage.backoff = (outage.backoff * 2).min(MAX_BACKOFF);
        outage.next_probe = now + outage.backoff;
        Ok(())
    }

    fn up(&self) {
        self.consecutive.store(0, Ordering::Relaxed);
        if self.lock().take().is_some() {
            tracing::info!(
                failures = self.failures.load(Ordering::Relaxed),
                "redis reachable again: shared limits resume"
            );
        }
    }

    /// Counts a call that found the server unreachable; whether the breaker is open
    /// after it.
    fn down(&self, error: &FleetError) -> bool {
        let mut down = self.lock();
        if down.is_some() {
            return true;
        }
        if self.consecutive.fetch_add(1, Ordering::Relaxed) + 1 < FAILURES_TO_OPEN {
            tracing::debug!(%error, "redis call failed; the breaker stays closed");
            return false;
        }
        self.consecutive.store(0, Ordering::Relaxed);
        tracing::error!(%error, "redis unreachable: decisions follow proxy.store_failure until it is back");
        *down = Some(Outage { next_probe: Instant::now() + MIN_BACKOFF, backoff: MIN_BACKOFF });
        true
    }
}
