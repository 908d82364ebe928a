//! Prometheus text exposition at `agent.metrics` (`GET /metrics`).
//!
//! Kernel counters are read from the pinned maps on each scrape, so the figures are
//! the same ones `limiter stats` shows; agent and proxy figures come from the live
//! agent.

use std::{
    collections::VecDeque,
    fmt::Write as _,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use limiter_common::{
    bucket,
    counters::Counter,
    maps::{BUDGET_NEW_SOURCES, BUDGET_SYN, FEATURE_NEW_SOURCES, FEATURE_SYN},
};
use tokio::sync::oneshot;

use crate::{
    limits::PolicyCounts,
    proxy::{DECISION_BUCKETS, DecisionHistogram, Proxy, ProxyStats, QUEUE_WAIT_BUCKETS},
    security_log::{LogCount, SecurityLog},
    xdp::{Attachment, KernelMaps, monotonic_now_ns},
};

/// Agent-level figures, updated by the agent loop.
#[derive(Debug, Default)]
pub struct AgentGauges {
    pub reloads_ok: AtomicU64,
    pub reloads_rejected: AtomicU64,
    pub last_reload_unix: AtomicU64,
    /// Escalated blocks (local or from the fleet) refused as malformed, too wide or
    /// protected.
    pub blocks_refused: Arc<AtomicU64>,
    /// Escalated blocks the kernel layer could not take (a runtime-block trie full of
    /// blocks in force).
    pub block_failures: AtomicU64,
    /// Escalated demotions put in place (local or from the fleet).
    pub demotions: AtomicU64,
    pub attached: Mutex<Vec<Attachment>>,
}

/// Everything a scrape reads.
#[derive(Debug, Clone)]
pub struct MetricsSources {
    pub pin_dir: PathBuf,
    pub agent: Arc<AgentGauges>,
    pub proxy: Option<Arc<Proxy>>,
    pub security_log: Arc<SecurityLog>,
}

/// The whole exposition.
#[must_use]
pub(crate) fn render(sources: &MetricsSources) -> String {
    let mut out = String::new();
    if let Ok(mut maps) = KernelMaps::open_pinned(&sources.pin_dir) {
        render_xdp(&mut out, &mut maps);
    }
    let agent = &sources.agent;
    family(
        &mut out,
        "limiter_xdp_attached",
        "gauge",
        "XDP attachments by interface and mode; fallback=\"true\": generic because the driver refused native.",
    );
    for attachment in agent.attached.lock().map(|a| a.clone()).unwrap_or_default() {
        let _ = writeln!(
            out,
            "limiter_xdp_attached{{interface=\"{}\",mode=\"{}\",fallback=\"{}\"}} 1",
            escape(&attachment.interface),
            attachment.mode,
            attachment.fallback
        );
    }
    family(&mut out, "limiter_config_reloads_total", "counter", "Config reloads by result.");
    let _ = writeln!(out, "limiter_config_reloads_total{{result=\"ok\"}} {}", agent.reloads_ok.load(Ordering::Relaxed));
    let _ = writeln!(
        out,
        "limiter_config_reloads_total{{result=\"rejected\"}} {}",
        agent.reloads_rejected.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "limiter_config_last_reload_timestamp_seconds",
        "gauge",
        "Unix time of the last reload attempt (0: none).",
    );
    let _ = writeln!(
        out,
        "limiter_config_last_reload_timestamp_seconds {}",
        agent.last_reload_unix.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "limiter_escalation_blocks_refused_total",
        "counter",
        "Escalated blocks refused: wider than one source, or covering an allow CIDR or trusted proxy.",
    );
    let _ = writeln!(out, "limiter_escalation_blocks_refused_total {}", agent.blocks_refused.load(Ordering::Relaxed));
    family(
        &mut out,
        "limiter_escalation_block_failures_total",
        "counter",
        "Escalated blocks the kernel layer could not put in place: its block trie full of blocks in force.",
    );
    let _ = writeln!(out, "limiter_escalation_block_failures_total {}", agent.block_failures.load(Ordering::Relaxed));
    family(
        &mut out,
        "limiter_escalation_demotions_total",
        "counter",
        "Escalated demotions put in place: first offences under [escalation] demote_first, here or in the fleet.",
    );
    let _ = writeln!(out, "limiter_escalation_demotions_total {}", agent.demotions.load(Ordering::Relaxed));
    family(
        &mut out,
        "limiter_security_log_total",
        "counter",
        "agent.security_log: lines written or dropped, and events suppressed (counted in a summary line instead).",
    );
    let security = sources.security_log.stats();
    for count in LogCount::ALL {
        let _ = writeln!(out, "limiter_security_log_total{{result=\"{}\"}} {}", count.name(), security.get(count));
    }
    if let Some(proxy) = &sources.proxy {
        render_proxy(&mut out, proxy);
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn render_xdp(out: &mut String, maps: &mut KernelMaps) {
    if let Ok(counters) = maps.counter_snapshot() {
        family(out, "limiter_xdp_packets_total", "counter", "Packets seen by the XDP program, by outcome.");
        for counter in Counter::ALL {
            let _ =
                writeln!(out, "limiter_xdp_packets_total{{action=\"{}\"}} {}", counter.name(), counters.get(counter));
        }
    }
    family(out, "limiter_xdp_sources_tracked", "gauge", "Sources with a bucket in the kernel map.");
    let _ = writeln!(out, "limiter_xdp_sources_tracked {}", maps.sources_tracked());
    family(out, "limiter_xdp_sources_capacity", "gauge", "Bound on tracked sources (xdp.max_sources).");
    let _ = writeln!(out, "limiter_xdp_sources_capacity {}", maps.sources_capacity());
    if let Ok(blocks) = maps.blocks() {
        family(out, "limiter_xdp_blocks_active", "gauge", "Runtime blocks in force.");
        let _ = writeln!(out, "limiter_xdp_blocks_active {}", blocks.len());
    }
    if let Ok(demoted) = maps.demotions() {
        family(out, "limiter_xdp_demotions_active", "gauge", "Demotions in force (sources limited at a demoted rate).");
        let _ = writeln!(out, "limiter_xdp_demotions_active {}", demoted.len());
    }
    family(out, "limiter_xdp_prefixes_tracked", "gauge", "Prefixes with an aggregate bucket in the kernel map.");
    let _ = writeln!(out, "limiter_xdp_prefixes_tracked {}", maps.aggregates().count());
    if let Ok(verified) = maps.verified_count() {
        family(out, "limiter_xdp_verified_sources", "gauge", "Sources verified now (handshake or limiter verify).");
        let _ = writeln!(out, "limiter_xdp_verified_sources {verified}");
    }
    if let Ok(settings) = maps.settings() {
        family(out, "limiter_xdp_budget_tokens", "gauge", "Tokens left in a global budget (new_sources, syn).");
        for (name, feature, slot, rate) in [
            ("new_sources", FEATURE_NEW_SOURCES, BUDGET_NEW_SOURCES, settings.new_source_rate),
            ("syn", FEATURE_SYN, BUDGET_SYN, settings.syn_rate),
        ] {
            if settings.has(feature)
                && let Ok(state) = maps.budget(slot)
            {
                let tokens = bucket::tokens(state.tat_ns, monotonic_now_ns(), rate);
                let _ = writeln!(out, "limiter_xdp_budget_tokens{{budget=\"{name}\"}} {tokens}");
            }
        }
    }
}

fn render_proxy(out: &mut String, proxy: &Proxy) {
    let stats = proxy.stats();
    family(
        out,
        "limiter_proxy_requests_total",
        "counter",
        "Proxy requests by decision (shadow mode counts would-be decisions).",
    );
    for (decision, value) in [
        ("forwarded", stats.forwarded),
        ("throttled", stats.throttled),
        ("rejected", stats.rejected),
        ("denied", stats.denied),
    ] {
        let _ = writeln!(out, "limiter_proxy_requests_total{{decision=\"{decision}\"}} {value}");
    }
    family(
        out,
        "limiter_proxy_policy_decisions_total",
        "counter",
        "Requests each rule or plan let through, delayed or refused (a request refused by another counts for none).",
    );
    for policy in &stats.policies {
        let (kind, name) = (policy.kind, escape(&policy.name));
        for (decision, value) in [
            ("forwarded", policy.forwarded),
            ("throttled", policy.throttled),
            ("rejected", policy.rejected),
            ("denied", policy.denied),
            ("tagged", policy.tagged),
        ] {
            let _ = writeln!(
                out,
                "limiter_proxy_policy_decisions_total{{kind=\"{kind}\",name=\"{name}\",decision=\"{decision}\"}} {value}"
            );
        }
    }
    family(
        out,
        "limiter_proxy_decision_log_lines_total",
        "counter",
        "Sampled decisions written to proxy.decision_log, or dropped.",
    );
    let _ =
        writeln!(out, "limiter_proxy_decision_log_lines_total{{result=\"written\"}} {}", stats.decision_log_written);
    let _ =
        writeln!(out, "limiter_proxy_decision_log_lines_total{{result=\"dropped\"}} {}", stats.decision_log_dropped);
    family(out, "limiter_proxy_received_total", "counter", "Requests that reached the proxy's handler.");
    let _ = writeln!(out, "limiter_proxy_received_total {}", stats.requests);
    let by_reason = [
        ("limiter_signature_failures_total", "Signed requests refused, by reason.", &stats.signature_failure_reasons),
        (
            "limiter_proxy_connections_refused_total",
            "Connections closed before their first request, by bound or for their PROXY header.",
            &stats.connections_refused_reasons,
        ),
        (
            "limiter_proxy_jwt_failures_total",
            "JWTs not taken, by reason: their requests lack every jwt: key.",
            &stats.jwt_failure_reasons,
        ),
        (
            "limiter_proxy_forbidden_total",
            "Requests that proved their key refused with 403, by reason (scope: outside the key's scopes).",
            &stats.forbidden_reasons,
        ),
    ];
    for (name, help, reasons) in by_reason {
        family(out, name, "counter", help);
        for (reason, value) in reasons {
            let _ = writeln!(out, "{name}{{reason=\"{}\"}} {value}", escape(reason));
        }
    }
    for (name, help, value) in [
        (
            "limiter_proxy_idempotent_replays_total",
            "Requests answered from the idempotency store.",
            stats.idempotent_replays,
        ),
        ("limiter_proxy_body_too_large_total", "Requests refused with 413.", stats.body_too_large),
        (
            "limiter_proxy_buffers_full_total",
            "Requests refused with 429 while their body was read: the connection's or client's buffered bytes were at their cap.",
            stats.buffers_full,
        ),
        (
            "limiter_proxy_paths_refused_total",
            "Requests refused with 400 for a malformed path or an escaped separator.",
            stats.paths_refused,
        ),
        ("limiter_proxy_header_timeouts_total", "Connections answered 408.", stats.timeouts),
        ("limiter_proxy_body_timeouts_total", "Requests whose body was late, answered 408.", stats.body_timeouts),
        ("limiter_proxy_upstream_errors_total", "Upstream failures answered 502.", stats.upstream_errors),
        (
            "limiter_proxy_tls_handshake_failures_total",
            "TLS handshakes that failed or did not finish within header_timeout.",
            stats.tls_handshake_failures,
        ),
        (
            "limiter_proxy_http2_reset_floods_total",
            "HTTP/2 connections cut as floods: requests cancelled past http2.max_resets_per_minute, or CONTINUATION frames without end.",
            stats.http2_reset_floods,
        ),
        ("limiter_proxy_upgrades_total", "Connections upgraded (WebSockets) and relayed.", stats.upgrades),
        (
            "limiter_proxy_refusals_not_escalated_total",
            "429, 401 and 403 answers to direct clients that escalation did not count: another could have caused them.",
            stats.refusals_not_escalated,
        ),
        (
            "limiter_proxy_connections_reclaimed_total",
            "Idle keep-alive connections closed to make room at max_connections.",
            stats.connections_reclaimed,
        ),
        (
            "limiter_proxy_silent_connections_total",
            "Connections header_timeout closed before a byte of a request.",
            stats.silent_connections,
        ),
        (
            "limiter_proxy_send_timeouts_total",
            "Connections cut for a write to the client, and HTTP/2 streams ended, making no progress within send_timeout.",
            stats.send_timeouts,
        ),
        (
            "limiter_proxy_in_flight_refused_total",
            "Requests refused with 429 past max_requests_in_flight_per_client.",
            stats.in_flight_refused,
        ),
        (
            "limiter_proxy_upstream_busy_total",
            "Requests refused with 503: max_upstream_connections were open.",
            stats.upstream_busy,
        ),
        (
            "limiter_proxy_refunded_total",
            "Requests whose units count_when rules gave back: the upstream's answer was not one they count.",
            stats.refunded,
        ),
        (
            "limiter_proxy_post_paid_charges_total",
            "Requests charged their cost_from (a response header, the upstream's milliseconds) once their answer said how much.",
            stats.post_paid_charges,
        ),
        (
            "limiter_proxy_workers_replaced_total",
            "Proxy workers that died (a panic) and were replaced; the connections each served were cut.",
            stats.workers_replaced,
        ),
        (
            "limiter_proxy_drain_cut_total",
            "Connections cut at drain_timeout by a stop or an upgrade (requests in flight, tunnels).",
            stats.drain_cut,
        ),
        (
            "limiter_proxy_key_evictions_total",
            "Per-key states evicted to stay within max_tracked_keys.",
            stats.evictions,
        ),
        (
            "limiter_proxy_untracked_keys_total",
            "New keys refused: max_tracked_keys was full of exhausted buckets, which are never evicted.",
            stats.untracked_keys,
        ),
        (
            "limiter_proxy_store_failures_total",
            "Decisions taken by store_failure while Redis was unreachable.",
            stats.store_failures,
        ),
        (
            "limiter_proxy_local_decisions_total",
            "Decisions taken on this agent's share of each limit while Redis was unreachable (store_failure = local).",
            stats.local_decisions,
        ),
        (
            "limiter_proxy_refused_locally_total",
            "Requests refused by this agent's first tier, their bucket one Redis refused and not yet due, without asking Redis.",
            stats.refused_locally,
        ),
    ] {
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {value}");
    }
    family(out, "limiter_fleet_agents", "gauge", "Agents of the fleet the last heartbeat counted (with Redis).");
    let _ = writeln!(out, "limiter_fleet_agents {}", stats.fleet_agents);
    family(out, "limiter_proxy_store_up", "gauge", "1 while the store answers (always in memory).");
    let _ = writeln!(out, "limiter_proxy_store_up {}", u8::from(stats.store_reachable));
    family(out, "limiter_proxy_tracked_keys", "gauge", "Per-key limiter states held.");
    let _ = writeln!(out, "limiter_proxy_tracked_keys {}", stats.tracked_keys);
    family(out, "limiter_proxy_buffered_bytes", "gauge", "Request body bytes held in memory before forwarding.");
    let _ = writeln!(out, "limiter_proxy_buffered_bytes {}", stats.buffered_bytes);
    family(
        out,
        "limiter_proxy_decision_seconds",
        "histogram",
        "Time to decide a request against its rules and plan, by store.",
    );
    let store = format!("store=\"{}\"", escape(&stats.store));
    histogram(out, "limiter_proxy_decision_seconds", &store, &DECISION_BUCKETS, &stats.decision_seconds);
    render_gates(out, &stats);
}

/// The samples of histogram `name` over `bounds`, each with `labels` (none if empty).
fn histogram(out: &mut String, name: &str, labels: &str, bounds: &[f64], histogram: &DecisionHistogram) {
    let separator = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0u64;
    for (i, count) in histogram.counts.iter().enumerate() {
        cumulative += count;
        let bound = bounds.get(i).map_or("+Inf".to_owned(), |b| format!("{b}"));
        let _ = writeln!(out, "{name}_bucket{{{labels}{separator}le=\"{bound}\"}} {cumulative}");
    }
    let labels = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(out, "{name}_sum{labels} {}", histogram.sum_seconds);
    let _ = writeln!(out, "{name}_count{labels} {cumulative}");
}

/// The rules' `concurrency`: their keys' requests in flight and queued, the waits, and
/// the requests refused.
fn render_gates(out: &mut String, stats: &ProxyStats) {
    let gated: Vec<&PolicyCounts> = stats.policies.iter().filter(|policy| policy.concurrency.is_some()).collect();
    let mut gauge = |name: &str, what: &str, value: fn(&PolicyCounts) -> u64| {
        family(out, name, "gauge", &format!("Requests {what} under each rule's concurrency, over its keys."));
        for policy in &gated {
            let _ = writeln!(out, "{name}{{policy=\"{}\"}} {}", escape(&policy.name), value(policy));
        }
    };
    gauge("limiter_proxy_inflight", "in flight", |policy| policy.inflight);
    gauge("limiter_proxy_queue_depth", "waiting for a place in flight", |policy| policy.queued);
    family(
        out,
        "limiter_proxy_queue_wait_seconds",
        "histogram",
        "Time requests waited for a place in flight (a rule's concurrency), those let in at once as 0.",
    );
    histogram(out, "limiter_proxy_queue_wait_seconds", "", &QUEUE_WAIT_BUCKETS, &stats.queue_wait_seconds);
    family(
        out,
        "limiter_proxy_shed_total",
        "counter",
        "Requests a rule's concurrency (429) or the upstream's capacity (503) refused, by reason and plan (keyless: none).",
    );
    for shed in &stats.shed {
        let (gate, reason, plan) = (shed.gate.as_str(), shed.reason.as_str(), escape(&shed.plan));
        let _ = writeln!(
            out,
            "limiter_proxy_shed_total{{gate=\"{gate}\",reason=\"{reason}\",plan=\"{plan}\"}} {}",
            shed.count
        );
    }
    family(out, "limiter_proxy_upstream_inflight", "gauge", "Requests in flight under [proxy.upstream_capacity].");
    let _ = writeln!(out, "limiter_proxy_upstream_inflight {}", stats.upstream_inflight);
    family(out, "limiter_proxy_upstream_queue_depth", "gauge", "Requests waiting under [proxy.upstream_capacity].");
    let _ = writeln!(out, "limiter_proxy_upstream_queue_depth {}", stats.upstream_queued);
    if let Some(adaptive) = &stats.adaptive {
        family(out, "limiter_proxy_adaptive_limit", "gauge", "The upstream's limit in flight under [proxy.adaptive].");
        let _ = writeln!(out, "limiter_proxy_adaptive_limit {}", adaptive.limit);
    }
}

/// Scrapers connected at once; Prometheus keeps one. A new one takes the place of
/// the oldest idle one ([`Places`]).
const MAX_CONNECTIONS: usize = 8;

/// Time for a scraper's request headers, and for the whole connection: one that
/// stalls must not hold its place.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The open connections, oldest first. When all places are taken a new connection
/// closes the oldest one not answering a request, so that connections held open
/// and silent (a local loop opening them as fast as they are closed) never keep a
/// scraper out; with every place answering, the new one is closed.
#[derive(Debug, Default)]
struct Places {
    open: Mutex<VecDeque<Place>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Place {
    id: u64,
    busy: Arc<AtomicBool>,
    close: oneshot::Sender<()>,
}

/// A connection's hold on its place, given back when dropped.
struct Held {
    id: u64,
    places: Arc<Places>,
    busy: Arc<AtomicBool>,
    closed: oneshot::Receiver<()>,
}

impl Places {
    fn take(self: &Arc<Self>) -> Option<Held> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= MAX_CONNECTIONS {
            let idle = open.iter().position(|place| !place.busy.load(Ordering::Acquire))?;
            if let Some(oldest) = open.remove(idle) {
                let _ = oldest.close.send(());
            }
        }
        let (close, closed) = oneshot::channel();
        let (id, busy) = (self.next_id.fetch_add(1, Ordering::Relaxed), Arc::new(AtomicBool::new(false)));
        open.push_back(Place { id, busy: Arc::clone(&busy), close });
        Some(Held { id, places: Arc::clone(self), busy, closed })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.places.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|place| place.id != self.id);
    }
}

/// Serves `/metrics` on `addr` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, sources: MetricsSources) {
    let sources = Arc::new(sources);
    let places = Arc::new(Places::default());
    // One exposition at a time: concurrent scrapes would each walk the kernel maps.
    let rendering = Arc::new(tokio::sync::Mutex::new(()));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                crate::accept::backoff("metrics", &error).await;
                continue;
            }
        };
        // Dropping the stream closes it.
        let Some(mut held) = places.take() else { continue };
        let sources = sources.clone();
        let rendering = rendering.clone();
        tokio::spawn(async move {
            let busy = Arc::clone(&held.busy);
            let service = service_fn(move |request: Request<Incoming>| {
                let sources = sources.clone();
                let rendering = rendering.clone();
                let busy = Arc::clone(&busy);
                async move {
                    busy.store(true, Ordering::Release);
                    let response = if request.uri().path() == "/metrics" {
                        let _turn = rendering.lock().await;
                        let body = tokio::task::spawn_blocking(move || render(&sources)).await.unwrap_or_default();
                        Response::builder()
                            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                            .body(Full::new(Bytes::from(body)))
                    } else {
                        Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Full::new(Bytes::from_static(b"see /metrics\n")))
                    };
                    busy.store(false, Ordering::Release);
                    response.map_err(std::io::Error::other)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection) => {}
                _ = &mut held.closed => {}
            }
            drop(held);
        });
    }
}

/// Binds the metrics address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::AdaptiveStats;

    #[test]
    fn the_adaptive_limit_is_a_gauge_only_with_its_section() {
        let mut without = String::new();
        render_gates(&mut without, &ProxyStats::default());
        assert!(!without.contains("limiter_proxy_adaptive_limit"), "{without}");
        let adaptive = Some(AdaptiveStats { limit: 17, ..AdaptiveStats::default() });
        let mut with = String::new();
        render_gates(&mut with, &ProxyStats { adaptive, ..ProxyStats::default() });
        assert!(
            with.contains("# TYPE limiter_proxy_adaptive_limit gauge\nlimiter_proxy_adaptive_limit 17\n"),
            "{with}"
        );
    }
}
