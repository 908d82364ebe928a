//! One request from arrival to answer: body bound, client address, signature and
//! idempotency where a rule requires them or the request is signed, the limits
//! decision, then forwarding.
//!
//! # Which key a request spends
//!
//! A key's plan and `api_key` rules are charged only for a request that proves the
//! key: a valid signature (on any route: a request carrying `X-Signature` is verified
//! wherever it goes, and a failure is the same 401 as on a signed route), or, for a
//! key with `auth = "bearer"`, its id in `X-API-Key`. Any other request is keyless
//! whatever `X-API-Key` says: its `api_key` rules follow `missing_key` and its IP
//! rules count it, so a client that only knows a key id cannot spend that key.
//!
//! A signature is recorded as used once its MAC verified, before the idempotency
//! key and the limits are asked (so that concurrent copies are replays), and stays
//! used whatever they answer: a request refused with 429, or 409/422/503 for its
//! idempotency key, cannot be sent again byte for byte once the plan refills. The
//! idempotency key is signed, so it cannot be stripped or changed on the way either.
//! Without the shared store neither can be recorded, so both fail closed (503),
//! whatever `store_failure` says of the limits.

use std::{
    net::IpAddr,
    num::NonZeroUsize,
    sync::{Arc, OnceLock, PoisonError, RwLock},
    time::{Duration, Instant},
};

use http::{Request, Response, request, uri::PathAndQuery};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::Semaphore;

use super::{
    ServedHook,
    adaptive::Adaptive,
    blame::{self, Blame, Initiator},
    body::{self, BodyRefused, Guarded, ProxyBody, TimedBody, full_body},
    buffered::{self, Caps, ConnectionBuffered, Metered, Reservation},
    connections::{Admitted, Bounds, Connections, Level, PrefixBounds, Refused, Slot},
    decision_log::{DecisionLog, Entry},
    error::ProxyError,
    exchange::{Exchange, Proof},
    forward::{Origin, Upstream, UpstreamUpgrade},
    gates::{Class, Gate, GateBounds, GateKind, Gates, Held, NO_SHARES, ShareTable, Shed},
    headers::{self, ConcurrencyStatus, Spread},
    heavy::{Client, ClientRow, HeavyClients},
    idempotent,
    idle::Timeouts,
    keys,
    post_paid::{Metering, Settled},
    problem::Refusal,
    proxy_protocol::Accepted,
    shares::{Share, Shares},
    snapshot::Snapshot,
    stats::{Counters, Event, Forbidden, ProxyStats},
};
use limiter_core::{
    Clock,
    ja4::Ja4,
    jwt::{Claims, JwtFailure},
    signature::{
        Authenticated, Begin, Failure, SignedRequest,
        idempotency::{self, IDEMPOTENCY_KEY_HEADER, MAX_IDEMPOTENCY_KEY_BYTES},
        verify::{API_KEY_HEADER, SIGNATURE_HEADER},
    },
};

use crate::{
    backend::{Claim, Stores},
    config::{
        ProxyConfig,
        count_when::Answer,
        proxy::{
            DEFAULT_QUEUE_TIMEOUT, Disclose, Http2Config, KEYLESS_PRIORITY, KEYLESS_SHARE, KeyAuth, ProxyProtocol,
        },
    },
    escalation::Escalator,
    fleet::FleetError,
    limits::{
        Decision, Engine, Holder, Owed, PolicyStatus, Refundable, RequestInfo, Screened, Verdict, VerdictKind,
        engine::{Gated, PolicyKind},
    },
    security_log::{SecurityEvent, SecurityLog, shown_key_id},
    signature::{BodyError, KeySecrets, read_body_hashed},
    tls::ServerTls,
};

/// The request after the checks that come before the limits.
enum Admission {
    /// Answered already (an idempotent replay).
    Answered(Response<ProxyBody>),
    /// To be decided on, with its body.
    Forward(ProxyBody),
}

/// What a request's gates let it hold.
#[derive(Default)]
struct Passage {
    held: Held,
    /// Its wait in their queues.
    queued: Duration,
}

impl Passage {
    /// The requests in flight through the upstream's gate when it was let in, itself
    /// included; `None`: no such gate.
    fn upstream_depth(&self) -> Option<usize> {
        self.held.iter().find(|unit| *unit.key() == Gate::Upstream).map(|unit| unit.depth())
    }
}

/// A request a gate refused.
struct Stopped {
    /// The rule whose `concurrency` refused it; `None`: `[proxy.upstream_capacity]`.
    rule: Option<String>,
    shed: Shed,
    /// The rule's key is the client's own ([`Holder::Client`]).
    own_bucket: bool,
    queued: Duration,
}

/// What a request's idempotency key gave it.
enum Taken {
    /// Its hold on the key.
    Claim(Claim),
    /// The response stored for an earlier identical request.
    Replay(Response<ProxyBody>),
}

/// How one connection is served, taken from the config when it is accepted.
#[derive(Debug)]
pub(super) struct ConnectionSettings {
    pub timeouts: Timeouts,
    /// How long an HTTP/2 stream may go without progress: `send_timeout`, or
    /// `upstream_timeout` if longer, so that a wait for the upstream's head is never
    /// cut before its own bound.
    pub stream_stall: Duration,
    pub tunnel_idle_timeout: Duration,
    pub tls: Option<ServerTls>,
    pub http2: Http2Config,
    /// The PROXY header versions a trusted peer sends; `None`: off.
    pub proxy_protocol: Option<Accepted>,
    /// The TCP peer is in `trusted_proxies`.
    pub peer_trusted: bool,
    /// `[proxy.tls] fingerprint`: the ClientHello is read first, for its JA4.
    pub fingerprint: bool,
}

/// Everything requests share, across connections and reloads.
#[derive(Debug)]
pub(super) struct Pipeline<C: Clock + Clone> {
    snapshot: RwLock<Arc<Snapshot>>,
    /// The limits, over `stores.limits`.
    engine: Arc<Engine<C>>,
    /// Outlive reloads (see [`Stores`]).
    stores: Arc<Stores>,
    /// What signatures, idempotency and headers are measured with; the engine
    /// measures with a clone.
    clock: C,
    /// Set by the agent when it runs the kernel layer too.
    escalator: OnceLock<Arc<Escalator<C>>>,
    /// Set by the agent when it runs the kernel layer too.
    served: OnceLock<Arc<dyn ServedHook>>,
    /// `[agent.security_log]`, set by the agent.
    security: OnceLock<Arc<SecurityLog>>,
    max_stored_body: usize,
    counters: Counters,
    connections: Arc<Connections>,
    /// The request bytes held in memory, by client.
    buffers: Arc<Shares>,
    /// Every client's requests in flight.
    in_flight: Arc<Shares>,
    /// Each rule's keys' requests in flight and queued (`concurrency`), and the
    /// upstream's (`[proxy.upstream_capacity]`).
    gates: Arc<Gates<Gate>>,
    /// `[proxy.adaptive]`: the upstream gate's limit, moved by its latency.
    adaptive: Adaptive,
    /// One for each upstream connection `max_upstream_connections` allows, shared by
    /// every worker's pool.
    upstream_permits: Arc<Semaphore>,
    /// `proxy.decision_log`, opened at start.
    decision_log: Option<DecisionLog>,
    heavy: HeavyClients,
    /// `proxy.retry_after_jitter`'s draws.
    spread: Spread,
}

impl<C: Clock + Clone> Pipeline<C> {
    pub(super) fn new(config: Arc<ProxyConfig>, secrets: KeySecrets, clock: C) -> Result<Self, ProxyError> {
        let stores = Arc::new(Stores::new(&config)?);
        stores.start_heartbeat();
        let decision_log = match &config.decision_log {
            Some(log) => Some(
                DecisionLog::open(&log.path)
                    .map_err(|source| ProxyError::DecisionLog { path: log.path.clone(), source })?,
            ),
            None => None,
        };
        Ok(Self {
            decision_log,
            heavy: HeavyClients::default(),
            spread: Spread::random(),
            engine: Arc::new(Engine::new(&config, clock.clone(), Arc::clone(&stores))),
            stores,
            clock,
            escalator: OnceLock::new(),
            served: OnceLock::new(),
            security: OnceLock::new(),
            max_stored_body: config.signature.idempotency_max_body_bytes,
            upstream_permits: Arc::new(Semaphore::new(config.max_upstream_connections.get())),
            adaptive: Adaptive::new(config.adaptive.as_ref()),
            snapshot: RwLock::new(Arc::new(Snapshot::new(config, secrets))),
            counters: Counters::default(),
            connections: Arc::default(),
            buffers: Arc::default(),
            in_flight: Arc::default(),
            gates: Arc::default(),
        })
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        // The lock only guards an Arc swap, which cannot leave it inconsistent.
        self.snapshot.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(super) fn reconfigure(&self, config: Arc<ProxyConfig>, secrets: KeySecrets) -> Result<(), ProxyError> {
        let mut current = self.snapshot.write().unwrap_or_else(PoisonError::into_inner);
        if config.listen != current.config.listen {
            return Err(ProxyError::ListenChanged { running: current.config.listen, requested: config.listen });
        }
        let next = Snapshot::new(config, secrets);
        // Under the lock, so that concurrent reloads reach the engine and the snapshot
        // in the same order.
        self.engine.reconfigure(&next.config);
        self.stores.set_keys(&next.config);
        let config = &next.config;
        self.adaptive.reconfigure(config.adaptive.as_ref());
        self.gates.rebound(|gate| match gate {
            Gate::Rule { rule, .. } => {
                let concurrency = config.rules.iter().find(|r| r.name == *rule)?.concurrency.as_ref();
                concurrency.map(|concurrency| (GateBounds::of(concurrency), Arc::clone(&NO_SHARES)))
            }
            Gate::Upstream => self.upstream_bounds(config),
        });
        *current = Arc::new(next);
        Ok(())
    }

    pub(super) fn stats(&self) -> ProxyStats {
        let (decision_log_written, decision_log_dropped) =
            self.decision_log.as_ref().map_or((0, 0), DecisionLog::counts);
        let (policies, (upstream_inflight, upstream_queued)) = self.gate_counts();
        ProxyStats {
            store: self.stores.kind().to_owned(),
            fleet_agents: u64::from(self.stores.live_agents()),
            store_reachable: self.stores.reachable(),
            local_decisions: self.stores.local_decisions(),
            refused_locally: self.stores.refused_locally(),
            untracked_keys: self.stores.untracked_keys(),
            post_paid_charges: self.engine.post_paid_charges(),
            buffered_bytes: self.buffers.total(),
            policies,
            upstream_inflight,
            upstream_queued,
            adaptive: self.adaptive.stats(),
            decision_log_written,
            decision_log_dropped,
            ..self.counters.snapshot(self.engine.tracked_keys(), self.engine.evictions(), self.stores.failures())
        }
    }

    pub(super) fn kernel_tightening(&self) -> Option<f64> {
        self.adaptive.tightening()
    }

    /// The upstream gate's bounds and shares: the adaptive limit, or
    /// `[proxy.upstream_capacity] concurrency`, and its queue; `None`: no gate.
    fn upstream_bounds(&self, config: &ProxyConfig) -> Option<(GateBounds, ShareTable)> {
        let capacity = config.upstream_capacity.as_ref();
        // The adaptive state is asked (a lock every worker shares) only where the
        // config has it: a request with no upstream gate pays nothing for it.
        let (limit, shares) = match config.adaptive.is_some().then(|| self.adaptive.bounds()).flatten() {
            Some(adaptive) => adaptive,
            None => (usize::try_from(capacity?.concurrency?.get()).unwrap_or(usize::MAX), Arc::clone(&NO_SHARES)),
        };
        let bounds = GateBounds {
            limit,
            queue: capacity.map_or(0, |capacity| usize::try_from(capacity.queue).unwrap_or(usize::MAX)),
            timeout: capacity.map_or(DEFAULT_QUEUE_TIMEOUT, |capacity| capacity.queue_timeout.0),
        };
        Some((bounds, shares))
    }

    /// The engine's counts of each policy, with its keys' requests in flight and
    /// queued; and the upstream's.
    fn gate_counts(&self) -> (Vec<crate::limits::PolicyCounts>, (u64, u64)) {
        let totals = self.gates.totals(|gate| match gate {
            Gate::Rule { rule, .. } => Some(rule.clone()),
            Gate::Upstream => None,
        });
        let mut policies = self.engine.policy_counts();
        for policy in policies.iter_mut().filter(|policy| policy.kind == PolicyKind::Rule) {
            if let Some(&(inflight, queued)) = totals.get(&Some(policy.name.clone())) {
                policy.inflight = inflight;
                policy.queued = queued;
            }
        }
        (policies, totals.get(&None).copied().unwrap_or_default())
    }

    pub(super) fn suggest(&self, headroom: f64) -> Vec<crate::limits::Suggestion> {
        self.engine.suggest(headroom)
    }

    pub(super) fn top_clients(&self, n: usize) -> Vec<ClientRow> {
        self.heavy.top(n)
    }

    pub(super) fn fleet(&self) -> Option<&crate::fleet::Fleet> {
        self.stores.fleet()
    }

    pub(super) async fn explain(
        &self,
        request: &super::explain::ExplainRequest,
    ) -> Result<super::explain::ProxyExplanation, super::explain::ExplainError> {
        let snapshot = self.snapshot();
        let verify = |headers: &http::HeaderMap| self.jwt_of(&snapshot, headers)?.ok();
        let mut explained =
            super::explain::explain(&snapshot.config, &self.engine, request, true, Some(&verify)).await?;
        for gate in &mut explained.limits.gates {
            let (inflight, queued) = self.gates.of(&Gate::Rule { rule: gate.rule.clone(), key: gate.key.clone() });
            (gate.inflight, gate.queued) = (Some(inflight), Some(queued));
        }
        if let Some(adaptive) = self.adaptive.stats() {
            let (inflight, queued) = self.gates.of(&Gate::Upstream);
            explained.adaptive = Some(super::explain::AdaptiveNow { limit: adaptive.limit, inflight, queued });
        }
        Ok(explained)
    }

    /// Sends this proxy's rejections to `escalator`; only the first call counts.
    pub(super) fn escalate_to(&self, escalator: Arc<Escalator<C>>) {
        let _ = self.escalator.set(escalator);
    }

    /// Writes security events to `log`; only the first call counts.
    pub(super) fn log_security_to(&self, log: Arc<SecurityLog>) {
        let _ = self.security.set(log);
    }

    /// Writes `event` to the security log, if the agent gave one.
    fn security_event(&self, event: impl FnOnce() -> SecurityEvent) {
        if let Some(log) = self.security.get() {
            log.record(&event());
        }
    }

    /// Tells `hook` the peer of every request served; only the first call counts.
    pub(super) fn on_served(&self, hook: Arc<dyn ServedHook>) {
        let _ = self.served.set(hook);
    }

    /// How a new connection from `peer` is served, under the config of now.
    pub(super) fn connection_settings(&self, peer: IpAddr) -> ConnectionSettings {
        let snapshot = self.snapshot();
        let config = &snapshot.config;
        let proxy_protocol = match config.proxy_protocol {
            ProxyProtocol::Off => None,
            ProxyProtocol::V1 => Some(Accepted::V1),
            ProxyProtocol::V2 => Some(Accepted::V2),
            ProxyProtocol::Any => Some(Accepted::Any),
        };
        ConnectionSettings {
            timeouts: Timeouts {
                idle: config.idle_timeout.0,
                header: config.header_timeout.0,
                send: config.send_timeout.0,
            },
            stream_stall: config.send_timeout.0.max(config.upstream_timeout.0),
            tunnel_idle_timeout: config.tunnel_idle_timeout.0,
            tls: snapshot.tls.clone(),
            http2: config.http2.clone(),
            proxy_protocol,
            peer_trusted: keys::is_trusted(peer.to_canonical(), &config.trusted_proxies),
            fingerprint: config.tls.as_ref().is_some_and(|tls| tls.fingerprint.is_some()),
        }
    }

    /// Notes, for `[escalation.fingerprint]`, that `client` (the TCP peer, or whom its
    /// PROXY header named) presented `ja4` in its handshake; a trusted proxy's own
    /// handshake is never held against it.
    pub(super) fn presented(&self, ja4: Ja4, client: IpAddr) {
        let Some(escalator) = self.escalator.get().filter(|escalator| escalator.counts_fingerprints()) else {
            return;
        };
        let client = client.to_canonical();
        if !keys::is_trusted(client, &self.snapshot().config.trusted_proxies) {
            escalator.presented(ja4, client);
        }
    }

    /// Counts a connection closed for what it sent before its first request.
    pub(super) fn refuse_connection(&self, reason: Refused) {
        self.counters.add_connection_refused(reason);
    }

    /// The permits of the upstream connections, for a worker's pool.
    pub(super) fn upstream_permits(&self) -> Arc<Semaphore> {
        Arc::clone(&self.upstream_permits)
    }

    /// A place for a new connection from `peer` (the TCP peer, or the client a PROXY
    /// header names) under `max_connections` and (unless the peer is a trusted proxy)
    /// the per-prefix bounds; `None`: close it. A peer refused for its own
    /// connections (`max_connections_per_ip`) counts towards its escalation; one
    /// refused at a wider prefix does not, since a neighbour may have filled it. An
    /// escalated client is refused here, which is what blocks it behind a balancer.
    pub(super) fn admit(&self, peer: IpAddr) -> Option<Slot> {
        let config = &self.snapshot().config;
        let peer = peer.to_canonical();
        let trusted = keys::is_trusted(peer, &config.trusted_proxies);
        let prefixes = (!trusted).then(|| PrefixBounds {
            ip: config.max_connections_per_ip.get(),
            ipv6_56: config.max_connections_per_ipv6_56.get(),
            ipv6_48: config.max_connections_per_ipv6_48.get(),
            ipv4_24: config.max_connections_per_ipv4_24.map(NonZeroUsize::get),
        });
        let escalator = self.escalator.get();
        let refused = if escalator.is_some_and(|escalator| escalator.blocked(peer)) {
            Refused::Blocked
        } else {
            match self.connections.admit(peer, Bounds { total: config.max_connections.get(), prefixes }) {
                Ok(Admitted { slot, reclaimed }) => {
                    if reclaimed {
                        self.counters.add(Event::Reclaimed);
                    }
                    return Some(slot);
                }
                Err(refused) => refused,
            }
        };
        self.counters.add_connection_refused(refused);
        if refused == Refused::Prefix(Level::Ip)
            && let Some(escalator) = escalator
        {
            escalator.record(peer);
        }
        tracing::debug!(%peer, reason = refused.as_str(), "refused at accept");
        None
    }

    /// Counts a connection from `client` that `header_timeout` closed before its first
    /// request towards the client's escalation: one that began a head always (no
    /// browser sends half of one), one that sent nothing only while its address holds
    /// more than half of `max_connections_per_ip`. A browser opens a few such
    /// connections (preconnects), and a page of another site can make it; a client
    /// holding places with them needs many.
    pub(super) fn unserved(&self, client: IpAddr, began_head: bool) {
        if !began_head {
            self.counters.add(Event::Silent);
        }
        let config = &self.snapshot().config;
        let client = client.to_canonical();
        let Some(escalator) = self.escalator.get() else { return };
        if keys::is_trusted(client, &config.trusted_proxies) {
            return;
        }
        if began_head || self.connections.open_from(client) > config.max_connections_per_ip.get() / 2 {
            escalator.record(client);
        }
    }

    pub(super) fn count(&self, event: Event) {
        self.counters.add(event);
    }

    /// Answers `request` from `peer`, whose handshake presented `handshake`,
    /// forwarding it (if it passes) through `upstream`, the pool of the worker serving
    /// the connection; `buffered` is what the connection's requests hold in memory.
    pub(super) async fn handle(
        &self,
        request: Request<Incoming>,
        (peer, handshake): (IpAddr, Option<Ja4>),
        upstream: &Upstream,
        buffered: &ConnectionBuffered,
    ) -> Response<ProxyBody> {
        self.counters.add(Event::Request);
        let snapshot = self.snapshot();
        let origin = Origin::of(peer, &snapshot.config.trusted_proxies, handshake);
        let initiator = Initiator::of(request.headers());
        match self.process(&snapshot, request, origin, initiator, upstream, buffered).await {
            Ok(response) => response,
            Err(refusal) => self.refuse(origin, initiator, refusal),
        }
    }

    /// Answers a refusal; one the directly connected client caused (see
    /// [`Refusal::blame`]) counts towards its escalation, one it may not have is
    /// counted as such.
    fn refuse(&self, origin: Origin, initiator: Initiator, refusal: Refusal) -> Response<ProxyBody> {
        self.hold_against(origin, (refusal.blame(initiator), refusal.fingerprint_blame(initiator)));
        let event = match &refusal {
            Refusal::QuotaExceeded { .. }
            | Refusal::ConcurrencyExceeded { .. }
            | Refusal::MissingKey { .. }
            | Refusal::KeyRequired { .. }
            | Refusal::StoreUnavailable => Some(Event::Rejected),
            Refusal::InsufficientScope { .. } => Some(Event::Forbidden(Forbidden::Scope)),
            Refusal::BodyTooLarge { .. } => Some(Event::BodyTooLarge),
            Refusal::BuffersFull => Some(Event::BuffersFull),
            Refusal::BodyTimeout => Some(Event::BodyTimeout),
            Refusal::BadPath(_) => Some(Event::PathRefused),
            Refusal::Upstream(_) | Refusal::UpstreamTimeout => Some(Event::UpstreamError),
            Refusal::UpstreamBusy => Some(Event::UpstreamBusy),
            Refusal::TooManyInFlight => Some(Event::InFlightRefused),
            _ => None,
        };
        if let Some(event) = event {
            self.counters.add(event);
        }
        tracing::debug!(%refusal, "refused");
        refusal.into_response()
    }

    /// Counts what the client is to blame for towards its escalation, if it is
    /// connected directly; what it may not be is counted as such. What its TLS
    /// fingerprint is to blame for counts towards the fingerprint's.
    fn hold_against(&self, origin: Origin, (blame, fingerprint_blame): (Blame, Blame)) {
        if let Some(escalator) = self.escalator.get()
            && !origin.peer_trusted
        {
            match blame {
                Blame::Client => escalator.record(origin.peer),
                Blame::Doubtful => self.counters.add(Event::NotEscalated),
                Blame::Nobody => {}
            }
            if let (Some(ja4), Blame::Client) = (origin.handshake, fingerprint_blame) {
                escalator.record_fingerprint(ja4);
            }
        }
    }

    async fn process(
        &self,
        snapshot: &Snapshot,
        request: Request<Incoming>,
        origin: Origin,
        initiator: Initiator,
        upstream: &Upstream,
        buffered: &ConnectionBuffered,
    ) -> Result<Response<ProxyBody>, Refusal> {
        let (parts, body) = request.into_parts();
        let config = &snapshot.config;
        body::check_announced(&body, config.max_body_bytes)?;
        let mut exchange = Exchange::arrive(snapshot, upstream, origin, parts, &body)?;
        let held = self.hold(&exchange)?;
        let body = TimedBody::new(body, config.body_timeout.0);
        // Before anything costly (reading the body, checking a MAC): a scanner's
        // request is refused on its face.
        let screened = self.screen(&exchange)?;
        // Before the early refusal, which counts `jwt:` keys too: a token needs no body.
        // Without `[proxy.jwt]` no rule has a `jwt:` key (`limiter check` refuses one).
        if config.jwt.is_some() && needs_jwt(config, &exchange.info()) {
            exchange.jwt = match self.jwt_of(snapshot, &exchange.parts.headers) {
                Some(Ok(claims)) => Some(claims),
                // Its request lacks every `jwt:` key.
                Some(Err(failure)) => {
                    self.counters.add_jwt_failure(failure);
                    tracing::debug!(%failure, "JWT not taken");
                    None
                }
                None => None,
            };
        }
        let signed =
            exchange.parts.headers.contains_key(SIGNATURE_HEADER) || requires_signature(config, &exchange.info());
        let for_keys = (snapshot.body_keyed && self.engine.needs_body(&exchange.info()))
            .then_some(config.body_keys.max_bytes)
            .filter(|&most| exchange.body_length.is_none_or(|length| length <= most));
        // A body read whole before the limits are asked is asked about first, so that a
        // client over its own limit costs no read (and gets no `100 Continue`). In
        // shadow mode the decision after the read counts it.
        let read_first = signed || exchange.body_length.is_none() || for_keys.is_some();
        if read_first
            && config.enforce
            && let Some((refusal, policies)) = self.refuse_early(&exchange, &screened.tagged).await
        {
            return Ok(self.answer(Err(refusal), origin, initiator, (&policies, &[]), snapshot.disclose(None)));
        }
        let caps = Caps {
            per_connection: config.buffered_bytes_per_connection(),
            per_client: config.buffered_bytes_per_client(),
        };
        let reservation = buffered::reserve(&self.buffers, exchange.client, buffered, caps);
        let body = match self.prove(&mut exchange, body, signed, reservation, for_keys).await? {
            Admission::Answered(response) => return Ok(response),
            Admission::Forward(body) => body,
        };
        let decision = self.decide(&exchange).await;
        let disclose = snapshot.disclose(exchange.proof.key_id());
        let acted = self.act(snapshot, &decision, (disclose, exchange.plan())).await;
        // After the limits and their delay: a request they refuse never queues.
        let gated = match &acted {
            Ok(()) => self.pass_gates(&exchange, &decision).await,
            Err(_) => Ok(Passage::default()),
        };
        self.account(&exchange, &decision, &screened.tagged, &gated);
        let outcome = match (acted, gated) {
            (Ok(()), Ok(passage)) => self
                .forward(exchange, body, (initiator, passage.upstream_depth()), (&decision.refundable, &decision.owed))
                .await
                .map(|response| hold_in_flight(response, passage.held)),
            (Ok(()), Err(stopped)) => {
                let named = disclose == Disclose::Full;
                let refusal = match stopped.rule {
                    Some(rule) => Refusal::ConcurrencyExceeded {
                        violated: if named { vec![rule] } else { Vec::new() },
                        shed: stopped.shed,
                        own_bucket: stopped.own_bucket,
                    },
                    None => Refusal::ReducedCapacity(stopped.shed),
                };
                // It never reached the upstream: `count_when` rules give back what
                // they do not count of that.
                let unsent = Err(refusal);
                self.answered(&unsent, &decision.refundable, origin, initiator).await;
                unsent
            }
            (Err(refusal), _) => Err(refusal),
        };
        let concurrent = self.concurrency_statuses(&decision, disclose);
        let response = self.answer(outcome, origin, initiator, (&decision.policies, &concurrent), disclose);
        Ok(response.map(|body| Guarded::new(body, held).boxed()))
    }

    /// Takes a place in flight in each of the request's gates (a rule's `concurrency`
    /// for its key, in the rules' order, then `[proxy.upstream_capacity]`), waiting in
    /// their queues as long as they allow, served by its plan's priority. In shadow
    /// mode it waits for none, and counts what would be refused.
    async fn pass_gates(&self, exchange: &Exchange<'_>, decision: &Decision) -> Result<Passage, Stopped> {
        let config = exchange.config();
        let rules = decision.gates.iter().map(|gated| {
            let gate = Gate::Rule { rule: gated.rule.clone(), key: gated.key.clone() };
            (gate, (GateBounds::of(&gated.concurrency), Arc::clone(&NO_SHARES)), Some(gated))
        });
        let upstream = self.upstream_bounds(config).map(|bounds| (Gate::Upstream, bounds, None));
        // Collected: an iterator of closures held across the waits would not be `Send`.
        let gates: Vec<(Gate, (GateBounds, ShareTable), Option<&Gated>)> = rules.chain(upstream).collect();
        let mut passage = Passage::default();
        if gates.is_empty() {
            return Ok(passage);
        }
        let plan = exchange.plan();
        let priority = plan.and_then(|plan| config.plans.get(plan)).map_or(KEYLESS_PRIORITY, |plan| plan.priority);
        let class = Class::from(plan.unwrap_or(KEYLESS_SHARE));
        let waiting = tokio::time::Instant::now();
        for (gate, (bounds, shares), gated) in gates {
            let shed = if config.enforce {
                match self.gates.enter(gate, (bounds, &shares), priority, &class).await {
                    Ok(unit) => {
                        passage.held.push(unit);
                        continue;
                    }
                    Err(shed) => shed,
                }
            } else {
                let (unit, would) = self.gates.enter_unbounded(gate, (bounds, &shares), &class);
                passage.held.push(unit);
                let Some(shed) = would else { continue };
                shed
            };
            let kind = if gated.is_some() { GateKind::Rule } else { GateKind::Upstream };
            // Shadow mode sheds nothing, so it never tightens the kernel either.
            if kind == GateKind::Upstream && config.enforce {
                self.adaptive.refused();
            }
            self.counters.add_shed(kind, shed, plan.unwrap_or(KEYLESS_SHARE));
            if let Some(gated) = gated {
                self.engine.shed(&gated.rule, &decision.recorded);
                if !config.enforce {
                    self.counters.add(Event::Rejected);
                }
            }
            if config.enforce {
                let queued = waiting.elapsed();
                self.counters.observe_queue_wait(queued);
                let own_bucket = gated.is_some_and(|gated| gated.holder == Holder::Client);
                return Err(Stopped { rule: gated.map(|gated| gated.rule.clone()), shed, own_bucket, queued });
            }
        }
        passage.queued = waiting.elapsed();
        self.counters.observe_queue_wait(passage.queued);
        Ok(passage)
    }

    /// The response to a request the limits decided on, with the headers of its
    /// policies: its rates' and its rules' concurrency.
    fn answer(
        &self,
        outcome: Result<Response<ProxyBody>, Refusal>,
        origin: Origin,
        initiator: Initiator,
        (policies, concurrent): (&[PolicyStatus], &[ConcurrencyStatus]),
        disclose: Disclose,
    ) -> Response<ProxyBody> {
        let mut response = outcome.unwrap_or_else(|refusal| self.refuse(origin, initiator, refusal));
        let settled = response.extensions_mut().remove::<Settled>().map(|settled| settled.over(policies));
        let policies = settled.as_deref().unwrap_or(policies);
        headers::add_rate_limit_headers(response.headers_mut(), policies, self.clock.now(), disclose);
        headers::add_concurrency_policies(response.headers_mut(), concurrent, disclose);
        response
    }

    /// Each of the request's rules' `concurrency` for its key, with the places left
    /// now, where `disclose` lets the headers show them.
    fn concurrency_statuses(&self, decision: &Decision, disclose: Disclose) -> Vec<ConcurrencyStatus> {
        if disclose != Disclose::Full {
            return Vec::new();
        }
        let status = |gated: &Gated| {
            let (inflight, _) = self.gates.of(&Gate::Rule { rule: gated.rule.clone(), key: gated.key.clone() });
            let limit = gated.concurrency.limit.get();
            ConcurrencyStatus { name: gated.rule.clone(), limit, remaining: u64::from(limit).saturating_sub(inflight) }
        };
        decision.gates.iter().map(status).collect()
    }

    /// The request's place among its client's in flight (`None`: a trusted proxy's
    /// own), held until its response is sent.
    fn hold(&self, exchange: &Exchange<'_>) -> Result<Option<Share>, Refusal> {
        let config = exchange.config();
        if keys::is_trusted(exchange.client, &config.trusted_proxies) {
            return Ok(None);
        }
        let max = config.max_requests_in_flight_per_client.get();
        let mut held = self.in_flight.share(exchange.client);
        if held.grow(1, u64::try_from(max).unwrap_or(u64::MAX)) {
            Ok(Some(held))
        } else {
            Err(Refusal::TooManyInFlight)
        }
    }

    /// Reads the body as far as proving a key needs: whole for a signed request (then
    /// verified, and its idempotency key applied), else streamed on; and, for a rule
    /// keyed on it, whole if it is at most `for_keys` bytes. What is read whole grows
    /// `reservation`, and holds it until forwarded.
    async fn prove(
        &self,
        exchange: &mut Exchange<'_>,
        body: TimedBody,
        signed: bool,
        reservation: Reservation,
        for_keys: Option<u64>,
    ) -> Result<Admission, Refusal> {
        let config = exchange.config();
        if signed {
            return self.admit_signed(exchange, Metered::new(body, reservation), for_keys).await;
        }
        if let Some(id) = exchange.snapshot.bearer_key(&exchange.parts.headers) {
            exchange.proof = Proof::Bearer(id);
        }
        self.check_scopes(exchange).await?;
        let (body, read) = buffered::forwardable(body, config.max_body_bytes, reservation, for_keys).await?;
        exchange.body = read;
        Ok(Admission::Forward(body))
    }

    /// Refuses a request in the area of a scope its proof does not hold: 401 with no
    /// key proven, 403 for a key without the scope. Scopes say who may call a route,
    /// as signatures say who sent it, so shadow mode does not lift them. The request
    /// is charged to its IP limits, as a failed signature is (a client sweeping
    /// bearer key ids or routes is rate limited), and to no key's quota.
    async fn check_scopes(&self, exchange: &Exchange<'_>) -> Result<(), Refusal> {
        let snapshot = exchange.snapshot;
        if snapshot.config.scopes.is_empty() {
            return Ok(());
        }
        let info = exchange.info();
        let key_id = exchange.proof.key_id();
        let key = key_id.and_then(|id| snapshot.key(id));
        let Some(scope) = snapshot.config.scope_missing(&info.seen(), key) else { return Ok(()) };
        self.engine.penalize(&info).await;
        self.heavy.record(exchange.proof.client(exchange.client), exchange.ja4, Some(&scope.name));
        self.security_event(|| {
            let key_id = key.map(|key| shown_key_id(&key.id, key.auth == KeyAuth::Signature));
            SecurityEvent::scope_refused(exchange.client, &scope.name, key_id)
        });
        let scope = (snapshot.disclose(key_id) == Disclose::Full).then(|| scope.name.clone());
        tracing::debug!(key = key_id, ?scope, "outside the key's scopes");
        Err(match key_id {
            Some(_) => Refusal::InsufficientScope { scope },
            None => Refusal::KeyRequired {
                scope,
                carried_credentials: blame::carries_credentials(&exchange.parts.headers),
                challenge: snapshot.key_challenge.clone(),
            },
        })
    }

    /// One decision over every matching rule and the key's plan, timed (logged and
    /// recorded for `limiter top` once its gates have answered: [`Self::account`]).
    async fn decide(&self, exchange: &Exchange<'_>) -> Decision {
        let info = exchange.info();
        let deciding = Instant::now();
        let decision = self.engine.decide(&info).await;
        self.counters.observe_decision(deciding.elapsed());
        decision
    }

    /// The refusal of a request whose keyless rules refuse it already (see
    /// [`Engine::refuse_early`]), with their status; counted, logged and recorded as
    /// [`Self::decide`] does. Only under `enforce`: else `act` refuses nothing.
    async fn refuse_early(&self, exchange: &Exchange<'_>, tagged: &[String]) -> Option<(Refusal, Vec<PolicyStatus>)> {
        let info = exchange.info();
        let deciding = Instant::now();
        let decision = self.engine.refuse_early(&info).await?;
        self.counters.observe_decision(deciding.elapsed());
        self.account(exchange, &decision, tagged, &Ok(Passage::default()));
        let disclose = exchange.snapshot.disclose(None);
        let refusal = self.act(exchange.snapshot, &decision, (disclose, None)).await.err()?;
        Some((refusal, decision.policies))
    }

    /// Logs a decision, with what its gates did, and records it for `limiter top`.
    fn account(
        &self,
        exchange: &Exchange<'_>,
        decision: &Decision,
        tagged: &[String],
        gated: &Result<Passage, Stopped>,
    ) {
        let config = exchange.config();
        let info = exchange.info();
        let stopped = gated.as_ref().err();
        let shed_by = stopped.map(|stopped| stopped.rule.clone().map(|rule| [rule]));
        self.log_decision(config, || {
            let entry = self.limits_entry(config, &info, decision, tagged);
            let queued = gated.as_ref().map_or_else(|stopped| stopped.queued, |passage| passage.queued);
            let gated = !decision.gates.is_empty() || config.upstream_capacity.is_some() || config.adaptive.is_some();
            let queued_ms = gated.then(|| u64::try_from(queued.as_millis()).unwrap_or(u64::MAX));
            match &shed_by {
                Some(Some(rule)) => Entry { verdict: VerdictKind::Reject, violated: rule, queued_ms, ..entry },
                Some(None) => Entry { verdict: VerdictKind::ReducedCapacity, queued_ms, ..entry },
                None => Entry { queued_ms, ..entry },
            }
        });
        let refused_by = match &decision.verdict {
            _ if stopped.is_some() => stopped.and_then(|stopped| stopped.rule.as_deref()),
            Verdict::Reject { .. } => decision.violated.first().map(String::as_str),
            Verdict::MissingKey { rule } => Some(rule.as_str()),
            Verdict::Forward | Verdict::Delay(_) | Verdict::StoreUnavailable => None,
        };
        self.heavy.record(exchange.proof.client(info.client), info.ja4, refused_by);
    }

    /// Applies the `deny` and `tag` rules to a request: a denial is counted, logged and
    /// (unless in shadow mode) the answer.
    fn screen(&self, exchange: &Exchange<'_>) -> Result<Screened, Refusal> {
        let config = exchange.config();
        let request = &exchange.info();
        let screened = self.engine.screen(request);
        if let Some(rule) = &screened.denied_by {
            self.counters.add(Event::Denied);
            self.log_decision(config, || Entry {
                verdict: VerdictKind::Deny,
                violated: std::slice::from_ref(rule),
                tagged: &screened.tagged,
                ..Entry::new(self.clock.now(), request, config.enforce)
            });
            self.heavy.record(Client::Address(request.client), request.ja4, Some(rule));
            if config.enforce {
                self.security_event(|| SecurityEvent::deny_rule(request.client, rule));
                let named = exchange.snapshot.disclose(None) == Disclose::Full;
                return Err(Refusal::Denied { rule: named.then(|| rule.clone()), escalates: screened.deny_escalates });
            }
        }
        Ok(screened)
    }

    /// Writes the entry `entry` makes to `proxy.decision_log`, if this decision is in
    /// the sample (the entry is only made then).
    fn log_decision<'e>(&self, config: &ProxyConfig, entry: impl FnOnce() -> Entry<'e>) {
        let (Some(log), Some(log_config)) = (&self.decision_log, &config.decision_log) else { return };
        if log.sampled(log_config.sample) {
            log.write(&entry());
        }
    }

    /// The decision log's entry for a request the limits decided.
    fn limits_entry<'e>(
        &self,
        config: &'e ProxyConfig,
        info: &RequestInfo<'e>,
        decision: &'e Decision,
        tagged: &'e [String],
    ) -> Entry<'e> {
        let plan = info.api_key.and_then(|key| config.keys.iter().find(|k| k.id == key)).map(|key| key.plan.as_str());
        let wait = decision.verdict.wait();
        let violated = match &decision.verdict {
            Verdict::MissingKey { rule } => std::slice::from_ref(rule),
            _ => &decision.violated,
        };
        let policies: Vec<&str> = decision.policies.iter().map(|policy| policy.name.as_str()).collect();
        let keys = policies
            .iter()
            .copied()
            .chain(violated.iter().map(String::as_str))
            .filter_map(|name| config.rules.iter().find(|rule| rule.name == name))
            .map(|rule| (rule.name.as_str(), rule.key.to_string()))
            .collect();
        Entry {
            verdict: decision.verdict.kind(),
            wait_ms: wait.map(|wait| u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            policies,
            keys,
            plan,
            violated,
            tagged,
            ..Entry::new(self.clock.now(), info, config.enforce)
        }
    }

    /// Carries out a decision up to forwarding: waits out a delay, or refuses, naming
    /// the policies only if `disclose` is `full`, with the `refusal` of the refusing
    /// policy (`plan`: the proven key's). In shadow mode only counts what it would
    /// have done.
    async fn act(
        &self,
        snapshot: &Snapshot,
        decision: &Decision,
        (disclose, plan): (Disclose, Option<&str>),
    ) -> Result<(), Refusal> {
        let config = &snapshot.config;
        let named = disclose == Disclose::Full;
        match &decision.verdict {
            Verdict::Forward => Ok(()),
            Verdict::Delay(delay) => {
                self.counters.add(Event::Throttled);
                if config.enforce {
                    tokio::time::sleep(*delay).await;
                }
                Ok(())
            }
            Verdict::Reject { retry_after } if config.enforce => {
                let violated = if named { decision.violated.clone() } else { Vec::new() };
                Err(Refusal::QuotaExceeded {
                    violated,
                    retry_after: self.spread.retry_after(*retry_after, config.retry_after_jitter),
                    own_bucket: decision.own_bucket_refused,
                    fingerprint_bucket: decision.fingerprint_bucket_refused,
                    advice: config.refusal_advice(&decision.violated, plan).cloned(),
                })
            }
            Verdict::MissingKey { rule } if config.enforce => {
                let challenge = match config.rules.iter().find(|r| r.name == *rule) {
                    Some(rule) if rule.key.needs_proof() => Some(snapshot.key_challenge.clone()),
                    Some(rule) if rule.key.needs_token() => Some(snapshot.jwt_challenge.clone()),
                    _ => None,
                };
                Err(Refusal::MissingKey { rule: named.then(|| rule.clone()), challenge })
            }
            Verdict::StoreUnavailable if config.enforce => Err(Refusal::StoreUnavailable),
            Verdict::Reject { .. } | Verdict::MissingKey { .. } | Verdict::StoreUnavailable => {
                self.counters.add(Event::Rejected);
                Ok(())
            }
        }
    }

    /// Sends the request upstream and, with an idempotency key, stores the answer; the
    /// head (or its absence) settles the request's `refundable` charges first, and
    /// the post-paid charges it `owed` that it says (the rest when the response ends).
    async fn forward(
        &self,
        exchange: Exchange<'_>,
        body: ProxyBody,
        (initiator, upstream_depth): (Initiator, Option<usize>),
        (refundable, owed): (&[Refundable], &[Owed]),
    ) -> Result<Response<ProxyBody>, Refusal> {
        let config = exchange.config();
        let Exchange { upstream, origin, parts, path, mut claim, ja4, .. } = exchange;
        self.counters.add(Event::Forwarded);
        // From here on, whatever happens (timeout, the client leaving and dropping this
        // future, a broken response), dropping the claim records an unknown outcome
        // instead of freeing the key: the upstream may have acted on the request.
        if let Some(claim) = &mut claim {
            claim.sent(self.clock.now()).await;
        }
        let sent = tokio::time::Instant::now();
        let mut metering = Metering::new(&self.engine, owed, sent);
        // Bounds the wait for the response head; a streaming body may take longer.
        let from = (origin, ja4);
        let head =
            tokio::time::timeout(config.upstream_timeout.0, upstream.send(config, path.forward(), parts, body, from))
                .await
                .map_err(|_| Refusal::UpstreamTimeout)
                .and_then(|sent| {
                    sent.map_err(|error| {
                        if error.never_sent()
                            && let Some(claim) = &mut claim
                        {
                            claim.not_sent();
                        }
                        if error.all_in_use() {
                            Refusal::UpstreamBusy
                        } else if body::timed_out(&error) {
                            Refusal::BodyTimeout
                        } else {
                            Refusal::Upstream(error.into())
                        }
                    })
                });
        if let Some(depth) = upstream_depth
            && let Some(limit) = self.adaptive.record(depth, sent.elapsed(), answer_of(&head))
        {
            self.gates.relimit(&Gate::Upstream, limit);
        }
        self.answered(&head, refundable, origin, initiator).await;
        let mut response = match head {
            Ok(response) => response,
            Err(refusal) => {
                if let Some(metering) = &mut metering {
                    // The proxy's own answer shows the balance as admitted.
                    let _quotas = self.engine.charge_owed(&metering.unanswered()).await;
                }
                return Err(refusal);
            }
        };
        if let Some(metering) = &mut metering {
            let settled = self.engine.charge_owed(&metering.at_head(response.headers_mut())).await;
            if !settled.is_empty() {
                response.extensions_mut().insert(Settled(settled));
            }
        }
        if let Some(hook) = self.served.get() {
            hook.served(origin.peer);
        }
        let response = if let Some(claim) = claim {
            let (response, stored) =
                idempotent::capture(response, self.max_stored_body).await.map_err(Refusal::Upstream)?;
            claim.complete(stored, self.clock.now()).await;
            response
        } else {
            response
        };
        Ok(match metering.filter(Metering::owes) {
            Some(metering) => response.map(|body| Guarded::new(body, metering).boxed()),
            None => response,
        })
    }

    /// What the upstream's head, or its absence, settles before the answer goes on:
    /// the `count_when` rules that do not count it give their units back, and a status
    /// `[escalation] upstream_statuses` names counts towards the client's escalation.
    /// A client gone before this (its request's future dropped) keeps its units spent:
    /// its request may have reached the upstream, and what the answer was is unknown.
    async fn answered(
        &self,
        head: &Result<Response<ProxyBody>, Refusal>,
        refundable: &[Refundable],
        origin: Origin,
        initiator: Initiator,
    ) {
        let answer = answer_of(head);
        if !refundable.is_empty() && self.engine.refund(refundable, answer).await {
            self.counters.add(Event::Refunded);
        }
        if let Ok(response) = head
            && self.escalator.get().is_some_and(|escalator| escalator.counts_upstream(response.status()))
        {
            let blame = blame::upstream_answer(initiator);
            self.hold_against(origin, (blame, blame));
        }
    }

    /// Reads and verifies a signed request, then applies its idempotency key.
    async fn admit_signed(
        &self,
        exchange: &mut Exchange<'_>,
        mut body: Metered<TimedBody>,
        for_keys: Option<u64>,
    ) -> Result<Admission, Refusal> {
        let snapshot = exchange.snapshot;
        let config = exchange.config();
        let limit = config.max_body_bytes;
        let read = read_body_hashed(&mut body, usize::try_from(limit).unwrap_or(usize::MAX)).await;
        let (bytes, body_sha256) = read.map_err(|error| match error {
            BodyError::TooLarge { .. } => BodyRefused::TooLarge { limit },
            BodyError::Read(error) => BodyRefused::of_read(&*error, limit),
        })?;
        let parts = &exchange.parts;
        // Checked before the signature is recorded, so a malformed key burns nothing.
        let idempotency_key = idempotency_key(parts)?;
        let target = parts.uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let signed =
            SignedRequest { method: &parts.method, target, headers: &parts.headers, body_sha256: &body_sha256 };
        let authenticated = match self.verify(snapshot, &signed).await? {
            Ok(authenticated) => authenticated,
            Err(failure) => {
                self.counters.add_signature_failure(failure.reason());
                self.security_event(|| {
                    let key_id = parts.headers.get(API_KEY_HEADER).and_then(|id| id.to_str().ok()).map(|id| {
                        let signing = snapshot.key(id).is_some_and(|key| key.auth == KeyAuth::Signature);
                        shown_key_id(id, signing)
                    });
                    SecurityEvent::signature_failure(exchange.client, failure.reason(), key_id)
                });
                // Failures count against the client's IP limits, so guessing is rate limited.
                self.engine.penalize(&exchange.info()).await;
                tracing::debug!(%failure, "signature refused");
                return Err(Refusal::Unauthorized {
                    carried_credentials: blame::carries_credentials(&parts.headers),
                    challenge: snapshot.signature_challenge.clone(),
                });
            }
        };
        exchange.proof = Proof::Signed(authenticated);
        // Before the idempotency key: a key outside its scopes has no stored answer replayed.
        self.check_scopes(exchange).await?;
        if let (Some(key), Some(key_id)) = (idempotency_key, exchange.proof.key_id()) {
            let fingerprint = idempotency::fingerprint(&parts.method, target, &body_sha256);
            exchange.claim = match self.claim(key_id, key, fingerprint).await {
                Ok(Taken::Claim(claim)) => Some(claim),
                Ok(Taken::Replay(response)) => return Ok(Admission::Answered(response)),
                Err(refusal) => return Err(refusal),
            };
        }
        if for_keys.is_some_and(|most| u64::try_from(bytes.len()).is_ok_and(|length| length <= most)) {
            exchange.body = Some(bytes.clone());
        }
        Ok(Admission::Forward(Guarded::new(full_body(bytes), body.into_reservation()).boxed()))
    }

    /// Takes the idempotency key of an authenticated request.
    async fn claim(&self, key_id: &str, key: &str, fingerprint: [u8; 32]) -> Result<Taken, Refusal> {
        match self.stores.idempotency.begin(key_id, key, fingerprint, self.clock.now()).await {
            Ok(Begin::Proceed(claim)) => Ok(Taken::Claim(claim)),
            Ok(Begin::Replay(stored)) => {
                self.counters.add(Event::IdempotentReplay);
                Ok(Taken::Replay(idempotent::replay(stored)))
            }
            Ok(Begin::Conflict) => Err(Refusal::IdempotencyKeyReused),
            Ok(Begin::InFlight | Begin::NotReplayable) => Err(Refusal::IdempotencyConflict),
            Ok(Begin::OutcomeUnknown) => Err(Refusal::IdempotencyOutcomeUnknown),
            Ok(Begin::Full) => Err(Refusal::IdempotencyStoreFull),
            Err(error) => Err(self.store_unreachable(&error)),
        }
    }

    /// Verifies a signed request and records its signature as used.
    /// The outer error is the shared store's absence (replay protection fails closed).
    async fn verify(
        &self,
        snapshot: &Snapshot,
        signed: &SignedRequest<'_>,
    ) -> Result<Result<Authenticated, Failure>, Refusal> {
        let max_skew = snapshot.config.signature.max_skew.0;
        let now = self.clock.now().as_secs();
        let authenticated = match snapshot.verifier.authenticate(signed, now, max_skew) {
            Ok(authenticated) => authenticated,
            Err(failure) => return Ok(Err(failure)),
        };
        match self.stores.replay.check_and_insert(&authenticated, max_skew, now).await {
            Ok(Ok(())) => {}
            Ok(Err(replay)) => return Ok(Err(Failure::from(replay))),
            Err(error) => return Err(self.store_unreachable(&error)),
        }
        Ok(Ok(authenticated))
    }

    /// The JWT `headers` carry, verified now; `None` without one (or without
    /// `[proxy.jwt]`).
    fn jwt_of(&self, snapshot: &Snapshot, headers: &http::HeaderMap) -> Option<Result<Claims, JwtFailure>> {
        let (Some(verifier), Some(config)) = (&snapshot.jwt, &snapshot.config.jwt) else { return None };
        let mut values = headers.get_all(&config.header).iter();
        let value = values.next()?;
        // Two tokens would leave the upstream to pick one, perhaps not the verified one.
        Some(match values.next() {
            Some(_) => Err(JwtFailure::Malformed),
            None => verifier.verify(value.as_bytes(), self.clock.now()),
        })
    }

    /// Counts a request refused for want of the shared store. Replay protection and
    /// idempotency fail closed whatever `store_failure` says: unrecorded, a signature
    /// could be replayed and an idempotent request run twice, and an attacker able to
    /// slow the shared Redis would get both for as long as it stays slow.
    fn store_unreachable(&self, error: &FleetError) -> Refusal {
        self.stores.count_failure();
        tracing::debug!(%error, "shared store unreachable: refused");
        Refusal::StoreUnavailable
    }
}

/// The `plan` label of a request without a key's plan.
/// What became of a forwarded request, as `count_when` and `losses` see it.
fn answer_of(head: &Result<Response<ProxyBody>, Refusal>) -> Answer {
    match head {
        Ok(response) => Answer::Status(response.status()),
        Err(Refusal::UpstreamTimeout | Refusal::Upstream(_)) => Answer::Timeout,
        Err(_) => Answer::Unsent,
    }
}

/// `response` holding `held` until its body is done, or, if it opens a tunnel, until
/// the tunnel closes.
fn hold_in_flight(mut response: Response<ProxyBody>, held: Held) -> Response<ProxyBody> {
    if held.is_empty() {
        return response;
    }
    match response.extensions_mut().get_mut::<UpstreamUpgrade>() {
        Some(upgrade) => {
            upgrade.held = Arc::new(held);
            response
        }
        None => response.map(|body| Guarded::new(body, held).boxed()),
    }
}

fn requires_signature(config: &ProxyConfig, request: &RequestInfo<'_>) -> bool {
    let seen = request.seen();
    config.rules.iter().any(|rule| rule.require_signature && rule.applies(&seen))
}

/// Whether a rule that applies to `request` counts by a JWT claim: only then is a
/// token verified, which costs a signature check (an RSA one some tens of
/// microseconds).
fn needs_jwt(config: &ProxyConfig, request: &RequestInfo<'_>) -> bool {
    let seen = request.seen();
    config.rules.iter().any(|rule| rule.key.needs_token() && rule.applies(&seen))
}

/// The `Idempotency-Key` of a state-changing request. Only signed requests get here:
/// the key id they are stored under must be authenticated, or anyone could fill in
/// another key's stored responses.
fn idempotency_key(parts: &request::Parts) -> Result<Option<&str>, Refusal> {
    if !idempotency::applies_to(&parts.method) {
        return Ok(None);
    }
    let Some(value) = parts.headers.get(IDEMPOTENCY_KEY_HEADER) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if key.len() <= MAX_IDEMPOTENCY_KEY_BYTES => Ok(Some(key)),
        _ => Err(Refusal::IdempotencyKeyMalformed),
    }
}
