//! What the proxy did, counted: read by `limiter stats` and the metrics.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};

use limiter_core::{jwt::JwtFailure, signature::FailureReason};

use super::{
    connections::Refused,
    gates::{GateKind, Shed},
};
use crate::limits::PolicyCounts;

/// One event the proxy counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Event {
    /// A request reached the handler (hyper refuses malformed ones before that).
    Request,
    /// Sent to the upstream, delayed or not.
    Forwarded,
    /// Inside a throttle band or a queue: delayed (in shadow mode: would have been).
    Throttled,
    /// Over a limit or missing its key: refused (in shadow mode: would have been); or
    /// in a scope's area without a proven key.
    Rejected,
    /// A `deny` rule applies: refused with 403 (in shadow mode: would have been).
    Denied,
    /// Answered from the idempotency store without reaching the upstream.
    IdempotentReplay,
    BodyTooLarge,
    /// A body read into memory would have passed its connection's or client's share
    /// (429).
    BuffersFull,
    /// A path without a canonical form, or with an escaped separator (400).
    PathRefused,
    /// Headers not complete within `header_timeout` (answered 408).
    HeaderTimeout,
    /// Body not complete within `body_timeout` (answered 408).
    BodyTimeout,
    /// The upstream could not be reached or failed mid-response (502).
    UpstreamError,
    /// A TLS handshake failed or did not finish within `header_timeout`.
    TlsHandshakeFailed,
    /// An HTTP/2 connection cut as a flood: too many requests cancelled (rapid
    /// reset), or h2's `ENHANCE_YOUR_CALM` (streams reset faster than taken, a head
    /// in endless CONTINUATION frames).
    ResetFlood,
    /// A connection upgraded (a WebSocket) and relayed to the upstream.
    Upgraded,
    /// With escalation on, a 429, 401 or 403 to a directly connected client that did
    /// not count towards its escalation: someone else could have caused it.
    NotEscalated,
    /// An idle keep-alive connection closed to make room at `max_connections`.
    Reclaimed,
    /// A connection closed by `header_timeout` without a byte of a request.
    Silent,
    /// A connection cut for a write to the client stalled past `send_timeout`, or an
    /// HTTP/2 stream ended for making no progress that long.
    SendTimeout,
    /// A request refused (429) past `max_requests_in_flight_per_client`.
    InFlightRefused,
    /// A request refused (503): `max_upstream_connections` were open.
    UpstreamBusy,
    /// The upstream's answer was one a `count_when` rule does not count: the request's
    /// units were given back.
    Refunded,
    /// A request with a valid proof refused (403).
    Forbidden(Forbidden),
    /// A worker died (a panic) and was replaced.
    WorkerReplaced,
    /// A connection (a request still in flight, a tunnel) cut when a stop's or an
    /// upgrade's `drain_timeout` passed.
    DrainCut,
}

/// Why a request that proved its key was refused with 403: the label values of
/// `limiter_proxy_forbidden_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Forbidden {
    /// The key does not hold a scope whose area the route is in.
    Scope,
}

impl Forbidden {
    const ALL: [Self; 1] = [Self::Scope];

    fn as_str(self) -> &'static str {
        match self {
            Self::Scope => "scope",
        }
    }
}

/// The live counters. Relaxed atomics: each counter is independent, and a reader
/// only needs every increment to show up eventually.
#[derive(Debug, Default)]
pub(super) struct Counters {
    requests: AtomicU64,
    forwarded: AtomicU64,
    throttled: AtomicU64,
    rejected: AtomicU64,
    denied: AtomicU64,
    idempotent_replays: AtomicU64,
    body_too_large: AtomicU64,
    buffers_full: AtomicU64,
    paths_refused: AtomicU64,
    timeouts: AtomicU64,
    upstream_errors: AtomicU64,
    signature_failures: [AtomicU64; FailureReason::ALL.len()],
    decision_seconds: [AtomicU64; DECISION_BUCKETS.len() + 1],
    decision_nanos_sum: AtomicU64,
    body_timeouts: AtomicU64,
    /// By [`Refused::ALL`].
    connections_refused: [AtomicU64; Refused::ALL.len()],
    tls_handshake_failures: AtomicU64,
    http2_reset_floods: AtomicU64,
    upgrades: AtomicU64,
    not_escalated: AtomicU64,
    reclaimed: AtomicU64,
    silent: AtomicU64,
    send_timeouts: AtomicU64,
    in_flight_refused: AtomicU64,
    upstream_busy: AtomicU64,
    refunded: AtomicU64,
    workers_replaced: AtomicU64,
    drain_cut: AtomicU64,
    /// By [`Forbidden::ALL`].
    forbidden: [AtomicU64; Forbidden::ALL.len()],
    jwt_failures: [AtomicU64; JwtFailure::ALL.len()],
    queue_wait_seconds: [AtomicU64; QUEUE_WAIT_BUCKETS.len() + 1],
    queue_wait_nanos_sum: AtomicU64,
    /// By reason and plan (`keyless` for a request without one): the plans are the
    /// config's, so the map stays small.
    shed: Mutex<BTreeMap<(GateKind, Shed, String), u64>>,
}

/// Adds one to the counter of `which`, `counters` being in the order of `all`.
fn add_by<T: PartialEq>(all: &[T], counters: &[AtomicU64], which: T) {
    if let Some(counter) = all.iter().position(|t| *t == which).and_then(|i| counters.get(i)) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Each of `counters` under the label of what it counts, `counters` being in the
/// order of `all`.
fn by_label<T: Copy>(all: &[T], counters: &[AtomicU64], label: fn(T) -> &'static str) -> BTreeMap<String, u64> {
    all.iter()
        .zip(counters)
        .map(|(which, counter)| (label(*which).to_owned(), counter.load(Ordering::Relaxed)))
        .collect()
}

/// Upper bounds, in seconds, of the `limiter_proxy_decision_seconds` buckets: a
/// decision is a few microseconds in memory, a round trip with Redis.
pub const DECISION_BUCKETS: [f64; 10] = [1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 5e-4, 1e-3, 1e-2];

/// Upper bounds, in seconds, of the `limiter_proxy_queue_wait_seconds` buckets: from
/// a request let in at once to one that waited a long `queue_timeout`.
pub const QUEUE_WAIT_BUCKETS: [f64; 11] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Observes `took` into a histogram over `bounds`: `counts` has a slot per bound and
/// one above them all.
fn observe(bounds: &[f64], counts: &[AtomicU64], nanos_sum: &AtomicU64, took: Duration) {
    let seconds = took.as_secs_f64();
    let bucket = bounds.iter().position(|bound| seconds <= *bound).unwrap_or(bounds.len());
    if let Some(counter) = counts.get(bucket) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    nanos_sum.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// `[proxy.adaptive]` now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveStats {
    /// Requests the upstream may have in flight.
    pub limit: u32,
    /// The mean latency of the last interval; `None` before one.
    pub latency_ms: Option<f64>,
    /// The unloaded latency learnt; `None` before one was seen.
    pub baseline_ms: Option<f64>,
    /// The upstream gate refused a request within the last second.
    pub shedding: bool,
    /// The limit is down at `min_limit` looking for an unloaded latency.
    pub probing: bool,
    /// The kernel's `[xdp.new_sources]` budget is scaled by `tighten_new_sources`
    /// now (shedding lasted 10 s).
    #[serde(default)]
    pub tightened: bool,
}

/// Requests a gate refused for one reason and plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShedCount {
    pub gate: GateKind,
    pub reason: Shed,
    /// The plan of the key the request proved; `keyless` without one.
    pub plan: String,
    pub count: u64,
}

/// The decision-time histogram: per-bucket counts (not cumulative; the last slot
/// is above every bound) and the sum of all observations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionHistogram {
    pub counts: Vec<u64>,
    pub sum_seconds: f64,
}

impl ProxyStats {
    /// Every scalar counter by its `--json` name, in name order. Read from the JSON
    /// itself, so that a counter added to this struct shows in `limiter stats`'s
    /// table without a second list.
    #[must_use]
    pub fn counters(&self) -> Vec<(String, u64)> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(fields)) => {
                fields.into_iter().filter_map(|(name, value)| Some((name, value.as_u64()?))).collect()
            }
            _ => Vec::new(),
        }
    }
}

impl Counters {
    pub(super) fn add(&self, event: Event) {
        let counter = match event {
            Event::Request => &self.requests,
            Event::Forwarded => &self.forwarded,
            Event::Throttled => &self.throttled,
            Event::Rejected => &self.rejected,
            Event::Denied => &self.denied,
            Event::IdempotentReplay => &self.idempotent_replays,
            Event::BodyTooLarge => &self.body_too_large,
            Event::BuffersFull => &self.buffers_full,
            Event::PathRefused => &self.paths_refused,
            Event::HeaderTimeout => &self.timeouts,
            Event::BodyTimeout => &self.body_timeouts,
            Event::UpstreamError => &self.upstream_errors,
            Event::TlsHandshakeFailed => &self.tls_handshake_failures,
            Event::ResetFlood => &self.http2_reset_floods,
            Event::Upgraded => &self.upgrades,
            Event::NotEscalated => &self.not_escalated,
            Event::Reclaimed => &self.reclaimed,
            Event::Silent => &self.silent,
            Event::SendTimeout => &self.send_timeouts,
            Event::InFlightRefused => &self.in_flight_refused,
            Event::UpstreamBusy => &self.upstream_busy,
            Event::Refunded => &self.refunded,
            Event::WorkerReplaced => &self.workers_replaced,
            Event::DrainCut => &self.drain_cut,
            Event::Forbidden(reason) => {
                add_by(&Forbidden::ALL, &self.forbidden, reason);
                return;
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn add_connection_refused(&self, reason: Refused) {
        add_by(&Refused::ALL, &self.connections_refused, reason);
    }

    pub(super) fn observe_decision(&self, took: Duration) {
        observe(&DECISION_BUCKETS, &self.decision_seconds, &self.decision_nanos_sum, took);
    }

    /// A request's wait in a queue: let in (at once: zero) or refused.
    pub(super) fn observe_queue_wait(&self, took: Duration) {
        observe(&QUEUE_WAIT_BUCKETS, &self.queue_wait_seconds, &self.queue_wait_nanos_sum, took);
    }

    /// A request a gate refused (in shadow mode: would have), of `plan`'s key.
    pub(super) fn add_shed(&self, gate: GateKind, reason: Shed, plan: &str) {
        let mut shed = self.shed.lock().unwrap_or_else(PoisonError::into_inner);
        *shed.entry((gate, reason, plan.to_owned())).or_default() += 1;
    }

    pub(super) fn add_signature_failure(&self, reason: FailureReason) {
        add_by(&FailureReason::ALL, &self.signature_failures, reason);
    }

    pub(super) fn add_jwt_failure(&self, failure: JwtFailure) {
        add_by(&JwtFailure::ALL, &self.jwt_failures, failure);
    }

    pub(super) fn snapshot(&self, tracked_keys: usize, evictions: u64, store_failures: u64) -> ProxyStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let signatures = by_label(&FailureReason::ALL, &self.signature_failures, FailureReason::as_str);
        let refused = by_label(&Refused::ALL, &self.connections_refused, Refused::as_str);
        let forbidden = by_label(&Forbidden::ALL, &self.forbidden, Forbidden::as_str);
        let jwt_failures = by_label(&JwtFailure::ALL, &self.jwt_failures, JwtFailure::as_str);
        ProxyStats {
            requests: load(&self.requests),
            forwarded: load(&self.forwarded),
            throttled: load(&self.throttled),
            rejected: load(&self.rejected),
            denied: load(&self.denied),
            signature_failures: signatures.values().sum(),
            replays: signatures.get(FailureReason::Replay.as_str()).copied().unwrap_or(0),
            signature_failure_reasons: signatures,
            idempotent_replays: load(&self.idempotent_replays),
            body_too_large: load(&self.body_too_large),
            buffers_full: load(&self.buffers_full),
            paths_refused: load(&self.paths_refused),
            timeouts: load(&self.timeouts),
            body_timeouts: load(&self.body_timeouts),
            connections_refused: refused.values().sum(),
            connections_refused_reasons: refused,
            jwt_failures: jwt_failures.values().sum(),
            jwt_failure_reasons: jwt_failures,
            upstream_errors: load(&self.upstream_errors),
            tls_handshake_failures: load(&self.tls_handshake_failures),
            http2_reset_floods: load(&self.http2_reset_floods),
            upgrades: load(&self.upgrades),
            refusals_not_escalated: load(&self.not_escalated),
            connections_reclaimed: load(&self.reclaimed),
            silent_connections: load(&self.silent),
            send_timeouts: load(&self.send_timeouts),
            in_flight_refused: load(&self.in_flight_refused),
            upstream_busy: load(&self.upstream_busy),
            forbidden: forbidden.values().sum(),
            forbidden_reasons: forbidden,
            refunded: load(&self.refunded),
            workers_replaced: load(&self.workers_replaced),
            drain_cut: load(&self.drain_cut),
            tracked_keys: u64::try_from(tracked_keys).unwrap_or(u64::MAX),
            decision_seconds: DecisionHistogram {
                counts: self.decision_seconds.iter().map(load).collect(),
                sum_seconds: load(&self.decision_nanos_sum) as f64 / 1e9,
            },
            queue_wait_seconds: DecisionHistogram {
                counts: self.queue_wait_seconds.iter().map(load).collect(),
                sum_seconds: load(&self.queue_wait_nanos_sum) as f64 / 1e9,
            },
            shed: self
                .shed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .map(|((gate, reason, plan), count)| ShedCount {
                    gate: *gate,
                    reason: *reason,
                    plan: plan.clone(),
                    count: *count,
                })
                .collect(),
            evictions,
            untracked_keys: 0,
            post_paid_charges: 0,
            buffered_bytes: 0,
            store_failures,
            store: String::new(),
            fleet_agents: 0,
            store_reachable: true,
            local_decisions: 0,
            refused_locally: 0,
            policies: Vec::new(),
            upstream_inflight: 0,
            upstream_queued: 0,
            adaptive: None,
            decision_log_written: 0,
            decision_log_dropped: 0,
        }
    }
}

/// A point-in-time copy of the proxy's counters (the `proxy` object of
/// `limiter stats --json`).
///
/// In shadow mode `throttled` and `rejected` count what would have been delayed or
/// refused; those requests are also in `forwarded`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyStats {
    /// Requests that reached the proxy's handler.
    pub requests: u64,
    /// Requests sent to the upstream.
    pub forwarded: u64,
    /// Requests delayed by a throttle band or queue.
    pub throttled: u64,
    /// Requests refused by a limit (429), or for lacking the key a rule or a scope
    /// needs (401/400).
    pub rejected: u64,
    /// Requests a `deny` rule refused (403).
    #[serde(default)]
    pub denied: u64,
    /// Signed requests refused (401), whatever the reason; includes `replays`.
    pub signature_failures: u64,
    /// Signed requests refused because their signature was already used.
    pub replays: u64,
    /// `signature_failures` by reason (the metrics label values).
    pub signature_failure_reasons: BTreeMap<String, u64>,
    /// Requests answered from the idempotency store.
    pub idempotent_replays: u64,
    /// Requests refused with 413.
    pub body_too_large: u64,
    /// Requests refused with 429 while their body was read into memory: it would have
    /// passed `max_buffered_bytes_per_connection` or `max_buffered_bytes_per_client`.
    #[serde(default)]
    pub buffers_full: u64,
    /// Requests refused with 400 for their path (malformed, or an escaped separator).
    #[serde(default)]
    pub paths_refused: u64,
    /// Connections whose request headers did not arrive within `header_timeout` (408).
    pub timeouts: u64,
    /// Requests whose body did not arrive within `body_timeout` (408).
    #[serde(default)]
    pub body_timeouts: u64,
    /// Connections closed before their first request: over `max_connections` or a
    /// per-prefix bound, for their PROXY protocol header, or blocked (an escalated
    /// client behind a PROXY protocol balancer).
    #[serde(default)]
    pub connections_refused: u64,
    /// `connections_refused` by reason (the metrics label values).
    #[serde(default)]
    pub connections_refused_reasons: BTreeMap<String, u64>,
    /// JWTs not taken where a rule that applies counts by a claim: their requests
    /// lack every `jwt:` key.
    #[serde(default)]
    pub jwt_failures: u64,
    /// `jwt_failures` by reason (the metrics label values).
    #[serde(default)]
    pub jwt_failure_reasons: BTreeMap<String, u64>,
    /// Upstream failures answered with 502.
    pub upstream_errors: u64,
    /// TLS handshakes that failed, or did not finish within `header_timeout`.
    #[serde(default)]
    pub tls_handshake_failures: u64,
    /// HTTP/2 connections cut for cancelling requests faster than
    /// `http2.max_resets_per_minute` (the rapid-reset attack), or by h2 as a flood
    /// (streams reset faster than taken, a CONTINUATION flood).
    #[serde(default)]
    pub http2_reset_floods: u64,
    /// Connections upgraded (WebSockets) and relayed to the upstream.
    #[serde(default)]
    pub upgrades: u64,
    /// With `[escalation]`, 429, 401 and 403 answers to directly connected clients
    /// that did not count towards escalation (a shared or header bucket's, a 401
    /// without credentials, a deny rule without `escalate`, a cross-site request).
    #[serde(default)]
    pub refusals_not_escalated: u64,
    /// Idle keep-alive connections closed to make room for a new one at
    /// `max_connections`.
    #[serde(default)]
    pub connections_reclaimed: u64,
    /// Connections `header_timeout` closed before a byte of a request.
    #[serde(default)]
    pub silent_connections: u64,
    /// Connections cut because a write to the client made no progress within
    /// `send_timeout`, and HTTP/2 streams ended for making none that long.
    #[serde(default)]
    pub send_timeouts: u64,
    /// Requests refused with 429: their client had `max_requests_in_flight_per_client`
    /// in flight.
    #[serde(default)]
    pub in_flight_refused: u64,
    /// Requests refused with 503: `max_upstream_connections` were open.
    #[serde(default)]
    pub upstream_busy: u64,
    /// Requests whose units `count_when` rules gave back: the upstream's answer was
    /// one the rules do not count.
    #[serde(default)]
    pub refunded: u64,
    /// Requests charged their `cost_from` once their answer said how much.
    #[serde(default)]
    pub post_paid_charges: u64,
    /// Workers that died (a panic) and were replaced; the connections each served
    /// were cut.
    #[serde(default)]
    pub workers_replaced: u64,
    /// Connections cut at `drain_timeout` by a stop or an upgrade: requests still in
    /// flight and open tunnels.
    #[serde(default)]
    pub drain_cut: u64,
    /// Requests that proved their key (a signature, a bearer key) refused with 403;
    /// none was forwarded or charged to a quota.
    #[serde(default)]
    pub forbidden: u64,
    /// `forbidden` by reason (the metrics label values): `scope`, outside the key's
    /// scopes.
    #[serde(default)]
    pub forbidden_reasons: BTreeMap<String, u64>,
    /// Per-key limiter state currently held (with Redis: the server's keys).
    pub tracked_keys: u64,
    /// Request body bytes held in memory now: signed and chunked bodies are read
    /// whole before they are forwarded.
    #[serde(default)]
    pub buffered_bytes: u64,
    /// Per-key state evicted to stay within `max_tracked_keys` (with Redis: keys
    /// the server evicted for `maxmemory`).
    pub evictions: u64,
    /// New keys refused untracked: the memory store was full and every bucket it
    /// could have evicted was exhausted, which it never evicts.
    #[serde(default)]
    pub untracked_keys: u64,
    /// Decisions taken without the shared store (Redis unreachable), by
    /// `store_failure`.
    #[serde(default)]
    pub store_failures: u64,
    /// Time spent deciding (rules, plans, store), for the metrics.
    pub decision_seconds: DecisionHistogram,
    /// Time requests spent queued for a place in flight (a rule's `concurrency`),
    /// those let in at once as 0, for the metrics.
    #[serde(default)]
    pub queue_wait_seconds: DecisionHistogram,
    /// Requests a gate refused, by gate (`rule`: a rule's `concurrency`, 429, also in
    /// `rejected`; `upstream`: `[proxy.upstream_capacity]`, 503), reason
    /// (`queue_full`, `queue_timeout`) and plan.
    #[serde(default)]
    pub shed: Vec<ShedCount>,
    /// Requests in flight to the upstream under `[proxy.upstream_capacity]`.
    #[serde(default)]
    pub upstream_inflight: u64,
    /// Requests waiting for a place under `[proxy.upstream_capacity]`.
    #[serde(default)]
    pub upstream_queued: u64,
    /// `[proxy.adaptive]`; `None`: off.
    #[serde(default)]
    pub adaptive: Option<AdaptiveStats>,
    /// Where the decisions were taken: `memory` or `redis` (`proxy.store`).
    #[serde(default)]
    pub store: String,
    /// With Redis: the fleet's agents the last heartbeat counted (this one included).
    #[serde(default)]
    pub fleet_agents: u64,
    /// Whether the store answers now (always in memory).
    #[serde(default)]
    pub store_reachable: bool,
    /// Decisions taken on this agent's own share of each limit while Redis was away
    /// (`store_failure = "local"`); also in `store_failures`.
    #[serde(default)]
    pub local_decisions: u64,
    /// With Redis: requests refused by this agent alone, their bucket being one Redis
    /// refused and not yet due to admit again (the first tier); Redis was not asked.
    /// Also in `rejected`.
    #[serde(default)]
    pub refused_locally: u64,
    /// What each configured rule and plan decided.
    #[serde(default)]
    pub policies: Vec<PolicyCounts>,
    /// Lines written to `proxy.decision_log`.
    #[serde(default)]
    pub decision_log_written: u64,
    /// Sampled lines not written: the queue was full, or the disk refused them.
    #[serde(default)]
    pub decision_log_dropped: u64,
}
