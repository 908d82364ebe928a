//! The idempotency store in the fleet's Redis, so that a repeat of an idempotent
//! request lands on the first one's response wherever it arrives: the answers of
//! `limiter_core`'s `IdempotencyStore`, with entries that expire by themselves.
//!
//! Keys are `{prefix}idem:{len(key id)}:{key id}:{Idempotency-Key}`, a hash driven
//! by `idempotency.lua`, with the key id's `idem-index:` and `idem-sizes:` keeping
//! it within its share of `idempotency_max_entries` and `idempotency_max_bytes`. An
//! in-flight claim is a lease of at most [`IN_FLIGHT_LEASE`]: an agent that dies
//! before sending cannot block the key for the whole TTL. A claim dropped once its
//! request was sent records the outcome as unknown for the TTL instead of freeing
//! the key; and once sent, the claim is held for the TTL ([`RedisClaim::hold`]), so
//! an agent that dies after sending leaves the key in flight rather than free.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use redis::Script;

use limiter_core::signature::{Begin, IdempotencyConfig, StoredResponse, idempotency::ENTRY_OVERHEAD, share};

use crate::fleet::{Fleet, FleetError};

/// Longest an in-flight claim holds its key without completing.
const IN_FLIGHT_LEASE: Duration = Duration::from_secs(300);

/// Idempotent responses, in Redis.
#[derive(Clone)]
pub(crate) struct RedisIdempotency {
    fleet: Fleet,
    config: IdempotencyConfig,
    script: Arc<Script>,
    /// Key ids the bounds are shared among.
    keys: Arc<AtomicUsize>,
}

impl fmt::Debug for RedisIdempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisIdempotency").field("config", &self.config).finish_non_exhaustive()
    }
}

impl RedisIdempotency {
    /// The bounds of `config` are shared among the key ids (see [`Self::set_keys`]).
    #[must_use]
    pub fn new(fleet: Fleet, config: IdempotencyConfig) -> Self {
        let script = Arc::new(Script::new(include_str!("idempotency.lua")));
        Self { fleet, config, script, keys: Arc::new(AtomicUsize::new(1)) }
    }

    /// As [`IdempotencyStore::set_keys`](limiter_core::signature::IdempotencyStore::set_keys).
    pub(crate) fn set_keys(&self, keys: usize) {
        self.keys.store(keys, Ordering::Relaxed);
    }

    /// The most bytes one key id holds.
    fn byte_share(&self) -> usize {
        share(self.config.max_bytes, self.keys.load(Ordering::Relaxed))
    }

    /// As [`IdempotencyStore::begin`](limiter_core::signature::IdempotencyStore::begin); the error is an
    /// unreachable store.
    pub(crate) async fn begin(
        &self,
        key_id: &str,
        idem_key: &str,
        fingerprint: [u8; 32],
    ) -> Result<Begin<RedisClaim>, FleetError> {
        let key = self.fleet.key(&format!("idem:{}:{key_id}:{idem_key}", key_id.len()));
        let tenant = Tenant {
            index: self.fleet.key(&format!("idem-index:{}:{key_id}", key_id.len())),
            sizes: self.fleet.key(&format!("idem-sizes:{}:{key_id}", key_id.len())),
        };
        let fingerprint = hex::encode(fingerprint);
        let owner = owner_token();
        let lease = self.config.ttl.min(IN_FLIGHT_LEASE);
        let bytes = ENTRY_OVERHEAD + key_id.len() + idem_key.len();
        let entry_share = share(self.config.max_entries, self.keys.load(Ordering::Relaxed));
        let reply: Vec<Vec<u8>> = self
            .fleet
            .call(|mut connection| {
                let mut invocation = self.script.key(&key);
                invocation.key(&tenant.index).key(&tenant.sizes);
                invocation.arg("begin").arg(&fingerprint).arg(&owner).arg(millis(lease));
                invocation.arg(bytes).arg(entry_share).arg(self.byte_share());
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await?;
        let field = |i: usize| reply.get(i).map_or(&[][..], Vec::as_slice);
        Ok(match field(0) {
            b"proceed" => Begin::Proceed(RedisClaim {
                store: self.clone(),
                entry: Some(Entry { key, tenant, fingerprint, owner }),
                sent: false,
            }),
            b"full" => Begin::Full,
            b"conflict" => Begin::Conflict,
            b"in_flight" => Begin::InFlight,
            b"not_replayable" => Begin::NotReplayable,
            b"unknown" => Begin::OutcomeUnknown,
            b"replay" => Begin::Replay(decode(field(1), field(2), field(3))?),
            other => return Err(FleetError::Reply(String::from_utf8_lossy(other).into_owned())),
        })
    }
}

/// The Redis keys of one key id's accounting.
#[derive(Debug)]
struct Tenant {
    index: String,
    sizes: String,
}

/// One held entry.
#[derive(Debug)]
struct Entry {
    key: String,
    tenant: Tenant,
    fingerprint: String,
    owner: String,
}

impl Entry {
    /// A call of the script on this entry: `op` and the entry's identity.
    fn invocation<'s>(&self, script: &'s Script, op: &str) -> redis::ScriptInvocation<'s> {
        let mut invocation = script.key(&self.key);
        invocation.key(&self.tenant.index).key(&self.tenant.sizes);
        invocation.arg(op).arg(&self.fingerprint).arg(&self.owner);
        invocation
    }
}

/// The in-flight claim on a key in Redis. Complete it with the response; dropping it
/// instead frees the key so that a retry can proceed, unless the request was
/// [`RedisClaim::sent`]: then the outcome is recorded as unknown for the TTL.
pub(crate) struct RedisClaim {
    store: RedisIdempotency,
    /// `None` once completed.
    entry: Option<Entry>,
    sent: bool,
}

impl fmt::Debug for RedisClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClaim").field("entry", &self.entry).finish_non_exhaustive()
    }
}

impl RedisClaim {
    /// Whether the request has been sent upstream (see [`Guard::sent`](limiter_core::signature::Guard::sent)).
    pub fn sent(&mut self, sent: bool) {
        self.sent = sent;
    }

    /// Marks the request as sent and makes the claim outlast the lease: held for the
    /// TTL, so that even if this agent dies before settling it, no repeat runs the
    /// request again. If Redis cannot be reached the lease still holds the key.
    pub async fn hold(&mut self) {
        self.sent = true;
        let Some(entry) = &self.entry else { return };
        let store = &self.store;
        let result: Result<i64, FleetError> = store
            .fleet
            .call(|mut connection| {
                let mut invocation = entry.invocation(&store.script, "hold");
                invocation.arg(millis(store.config.ttl));
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await;
        if let Err(error) = result {
            tracing::debug!(%error, "idempotency claim not extended");
        }
    }

    /// Stores `response` for the TTL (or only the fact of completion, if it is larger
    /// than `max_response_bytes`). If Redis cannot be reached the claim lapses with
    /// its lease, and a retry runs again.
    pub async fn complete(mut self, response: StoredResponse) {
        let Some(entry) = self.entry.take() else { return };
        let store = &self.store;
        let stored = (response.stored_size() <= store.config.max_response_bytes).then_some(response);
        let (status, headers, body) = match &stored {
            Some(response) => {
                (response.status.as_str().to_owned(), encode_headers(&response.headers), response.body.clone())
            }
            None => (String::new(), Vec::new(), Bytes::new()),
        };
        let result: Result<i64, FleetError> = store
            .fleet
            .call(|mut connection| {
                let mut invocation = entry.invocation(&store.script, "complete");
                invocation.arg(millis(store.config.ttl)).arg(status).arg(headers).arg(body.as_ref());
                invocation.arg(store.byte_share());
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await;
        if let Err(error) = result {
            tracing::debug!(%error, "idempotent response not stored");
        }
    }
}

impl Drop for RedisClaim {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else { return };
        // Drop cannot wait: the release runs on its own, and if it never reaches
        // Redis the lease frees the key.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let store = self.store.clone();
        let sent = self.sent;
        runtime.spawn(async move {
            let _: Result<i64, FleetError> = store
                .fleet
                .call(|mut connection| {
                    let invocation = if sent {
                        let mut invocation = entry.invocation(&store.script, "abandon");
                        invocation.arg(millis(store.config.ttl));
                        invocation
                    } else {
                        entry.invocation(&store.script, "release")
                    };
                    async move { invocation.invoke_async(&mut connection).await }
                })
                .await;
        });
    }
}

/// A token naming one claim, unique across the fleet's agents in practice: process,
/// a counter and the time.
fn owner_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// `name: value` lines: names cannot hold `:` nor values a newline.
fn encode_headers(headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

fn decode(status: &[u8], headers: &[u8], body: &[u8]) -> Result<StoredResponse, FleetError> {
    let bad = || FleetError::Reply("a stored idempotent response is malformed".to_owned());
    let status = StatusCode::from_bytes(status).map_err(|_| bad())?;
    let mut map = HeaderMap::new();
    for line in headers.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
        let at = line.windows(2).position(|w| w == b": ").ok_or_else(bad)?;
        let name = HeaderName::from_bytes(&line[..at]).map_err(|_| bad())?;
        let value = HeaderValue::from_bytes(&line[at + 2..]).map_err(|_| bad())?;
        map.append(name, value);
    }
    Ok(StoredResponse { status, headers: map, body: Bytes::copy_from_slice(body) })
}
