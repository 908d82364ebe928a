//! The engine: from a request to the buckets it is counted in, and from their
//! outcomes to one decision.
//!
//! A request is counted by every rule that matches it (path prefix and method; a rule
//! with `plans`, only for a request proving a key on one of them), each under the key
//! its `key` names, and, if it proved a known API key, by every limit of that key's
//! plan. Keys:
//!
//! - `ip`: the client address; IPv6 per /64 (as in the kernel layer), IPv4-mapped
//!   IPv6 as IPv4.
//! - `api_key`: the key id the request proved (a valid signature, or a bearer key's
//!   id: see `proxy::pipeline`), if it is a configured key. An unproven or unknown key
//!   is treated as missing, so neither made-up keys nor someone else's key id spend
//!   anything but the missing-key bucket.
//! - `header:NAME`: the header's value (all its lines, joined).
//! - `query:NAME`, `cookie:NAME`: the first such query parameter (percent-decoded)
//!   or cookie.
//! - `json:/POINTER`, `form:NAME`: a member of a JSON body or a field of a form
//!   body, read by [`limiter_core::carried`] when the body was read for it
//!   ([`RequestInfo::body`]) and its `Content-Type` says that format.
//! - `jwt:CLAIM`: that claim of the request's JWT, only if the token verified
//!   ([`RequestInfo::jwt`]); a string by value, a number or boolean by its JSON text
//!   (after its issuer's `iss` for a JWKS issuer's token, so that two issuers'
//!   subjects never share a bucket); absent, empty or structured is missing. Never
//!   folded: the client proved it.
//! - a composite (`["ip", "header:x-tenant"]`): every part, each present.
//! - `+route`: the rule's path prefix is part of the key.
//!
//! The values a client chooses (every kind but `ip`, `api_key` and `jwt:`) are folded as
//! `key_fold` says; an empty one is missing; one longer than [`MAX_KEY_VALUE`] bytes
//! or not UTF-8 is keyed by its SHA-256, so that key memory stays bounded.
//!
//! A missing key follows `missing_key`: `shared` counts all such requests of a rule
//! in one bucket, [`MISSING_KEY`]; `reject` answers [`Verdict::MissingKey`] and
//! charges nothing.
//!
//! A bucket is the client's own when its key has the client's address, the key it
//! proved or a claim of the token it proved as a part (its plan too); the missing-key bucket and the values a client
//! chooses are anyone's who sends the same ([`Holder`]): a username's bucket is
//! filled by whoever tries that username. [`Decision::own_bucket_refused`] says
//! whether a refusal is the client's doing, which is what escalation counts. A `ja4`
//! bucket is its TLS fingerprint's ([`Holder::Fingerprint`]): shared by every client
//! presenting it, and what `[escalation.fingerprint]` counts besides. A request
//! without a fingerprint lacks a `ja4` key, as one without a header lacks that.
//!
//! The strictest verdict wins: a rejection by any bucket rejects (with the longest
//! `retry_after` of the rejecting ones) and charges no bucket; otherwise the request
//! is delayed by the longest delay (throttle band or shaper), or forwarded.
//!
//! A request takes its buckets' `cost` in units (one by default). A bucket with
//! `cost_from` admits while a unit is left and takes nothing then: the decision
//! carries what the request owes ([`Decision::owed`]), which [`Engine::charge_owed`]
//! charges once the answer says how much, into debt if need be.
//!
//! `decide` and `penalize` are async because the state may live in Redis; with the
//! memory store they never wait, and cost what a plain call would.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use sha2::{Digest, Sha256};

use limiter_core::{
    Clock, CostFrom, LimitSpec,
    carried::{self, BodyFormat},
    ja4::Ja4,
    jwt::Claims,
    limits::{Bucket, Charge, Debit, MemoryStore, Outcome, Outcomes, Quota, Refund},
};

use super::observe::{Observation, Peaks, Usage};
use crate::{
    backend::Stores,
    config::{
        conditions::Seen,
        count_when::{Answer, CountWhen},
        proxy::{Concurrency, KeyFold, KeyKind, KeySpec, MissingKey, ProxyConfig, Rule, RuleAction, StoreFailure},
    },
};

/// The key of a rule's shared bucket for requests without its key.
pub const MISSING_KEY: &str = "<missing>";

/// Longest header value kept as is in a key; longer ones are hashed.
pub const MAX_KEY_VALUE: usize = 128;

/// What the engine needs to know about a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    pub method: &'a http::Method,
    /// The canonical route of the path ([`limiter_core::path::CanonicalPath::route`]),
    /// without the query: what rules and `+route` keys see.
    pub path: &'a str,
    /// The client, already resolved through trusted proxies.
    pub client: IpAddr,
    /// The key id the request proved; `None` for a keyless request, whatever its
    /// `X-API-Key` says.
    pub api_key: Option<&'a str>,
    /// The claims of the request's JWT if it verified; `None` for none, one that
    /// failed, or one no rule that applies needed.
    pub jwt: Option<&'a Claims>,
    pub headers: &'a http::HeaderMap,
    /// The query as sent, without `?`.
    pub query: Option<&'a str>,
    /// See [`Seen::body_length`].
    pub body_length: Option<u64>,
    /// The body, when a rule keyed on it matched and it was read whole within
    /// `[proxy.body_keys] max_bytes`.
    pub body: Option<&'a [u8]>,
    /// The JA4 fingerprint of the client's TLS handshake, if it has one.
    pub ja4: Option<Ja4>,
}

impl RequestInfo<'_> {
    /// The body, if it was read and its head says it is in `format`, unencoded: a
    /// compressed body, or one with two `Content-Type`s, is read for no key.
    fn body_as(&self, format: BodyFormat) -> Option<&[u8]> {
        let mut types = self.headers.get_all(http::header::CONTENT_TYPE).into_iter();
        let named = types.next().and_then(|value| BodyFormat::of_content_type(value.as_bytes()));
        let encoded = self
            .headers
            .get_all(http::header::CONTENT_ENCODING)
            .into_iter()
            .any(|value| !value.as_bytes().eq_ignore_ascii_case(b"identity"));
        (named == Some(format) && types.next().is_none() && !encoded).then_some(self.body?)
    }

    /// What rule conditions look at.
    #[must_use]
    pub fn seen(&self) -> Seen<'_> {
        Seen {
            method: self.method,
            path: self.path,
            query: self.query,
            client: self.client,
            headers: self.headers,
            body_length: self.body_length,
            ja4: self.ja4,
        }
    }
}

/// What `limiter suggest` says of one policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Suggestion {
    pub kind: PolicyKind,
    pub name: String,
    /// The limit now, per `window_secs`.
    pub limit: u32,
    pub window_secs: f64,
    #[serde(flatten)]
    pub peaks: Peaks,
    /// The 99th percentile of the peaks times the headroom; `None` before any request.
    pub suggested_limit: Option<u32>,
    /// What the limit and the peaks count: `requests`, or the units of its `cost`
    /// (`units (5 a request)`, `units (x-request-cost, at most 1000)`, `upstream ms
    /// (at most 30000)`).
    #[serde(default = "requests")]
    pub units: String,
}

pub(super) fn requests() -> String {
    "requests".to_owned()
}

/// What the `deny` and `tag` rules made of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Screened {
    /// The first `deny` rule that applies.
    pub denied_by: Option<String>,
    /// That rule has `escalate = true`.
    pub deny_escalates: bool,
    /// The `tag` rules that apply.
    pub tagged: Vec<String>,
}

/// The engine's answer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// One entry per rule or plan that counted the request, for the response headers:
    /// the quota after this request if it is let through, as it stands if rejected.
    pub policies: Vec<PolicyStatus>,
    /// Names of the policies that rejected (for the problem+json body).
    pub violated: Vec<String>,
    /// Some matching rule has `require_signature = true`.
    pub require_signature: bool,
    /// A bucket of the client's own ([`Holder::Client`]) refused the request.
    pub own_bucket_refused: bool,
    /// A bucket of the client's TLS fingerprint ([`Holder::Fingerprint`]) refused it.
    pub fingerprint_bucket_refused: bool,
    /// The charges of the `count_when` rules, to give back ([`Engine::refund`]) once
    /// the upstream's answer is known.
    pub refundable: Vec<Refundable>,
    /// The post-paid charges (`cost_from`) of a request let through, to take
    /// ([`Engine::charge_owed`]) once its answer says how much.
    pub owed: Vec<Owed>,
    /// The `concurrency` of each matching rule that has one, for a request let
    /// through: it is forwarded once it holds a place in flight in each.
    pub gates: Vec<Gated>,
    /// What the policies counted of a request with `gates`, taken back if a gate
    /// refuses it ([`Engine::shed`]).
    pub recorded: Recorded,
}

/// A rule's `concurrency` a request must pass, under the key the rule counts it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gated {
    pub rule: String,
    pub key: String,
    pub holder: Holder,
    pub concurrency: Concurrency,
}

/// What each policy counted of one decision.
#[derive(Clone, Debug, Default)]
pub struct Recorded(Vec<(Arc<PolicyDecisions>, Decided)>);

impl PartialEq for Recorded {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|((a, x), (b, y))| Arc::ptr_eq(a, b) && x == y)
    }
}

impl Eq for Recorded {}

/// A charge a request's answer may give back: a `count_when` rule's bucket, as it was
/// charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refundable {
    identity: Arc<str>,
    key: String,
    /// The spec charged: the rule's, or its share in the local fallback.
    spec: LimitSpec,
    charged_at: Duration,
    /// The rule's as it was then: a reload meanwhile does not change what the charge was
    /// for.
    count_when: Arc<CountWhen>,
    /// Charged in the local fallback (`store_failure = "local"`) instead of the store.
    local: bool,
}

/// What a request let through owes a bucket with `cost_from`, once its answer says
/// how much: the bucket as it was admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    /// The policy's name, for the headers of what it is charged.
    name: String,
    identity: Arc<str>,
    key: String,
    /// The spec admitted with: the policy's, or its share in the local fallback.
    spec: LimitSpec,
    /// The policy's `cost_from`.
    from: CostFrom,
    /// Admitted in the local fallback (`store_failure = "local"`) instead of the store.
    local: bool,
    /// Whose request it was, for `limiter suggest`.
    client: IpAddr,
}

impl Owed {
    /// Where the units come from, and the most charged.
    #[must_use]
    pub const fn cost_from(&self) -> &CostFrom {
        &self.from
    }
}

impl Refundable {
    fn refund(&self) -> Refund<'_> {
        Refund {
            bucket: Bucket { policy: &self.identity, key: &self.key, spec: &self.spec },
            charged_at: self.charged_at,
        }
    }
}

impl Decision {
    /// A verdict no bucket was counted for.
    fn uncounted(verdict: Verdict, require_signature: bool) -> Self {
        Self {
            verdict,
            policies: Vec::new(),
            violated: Vec::new(),
            require_signature,
            own_bucket_refused: false,
            fingerprint_bucket_refused: false,
            refundable: Vec::new(),
            owed: Vec::new(),
            gates: Vec::new(),
            recorded: Recorded::default(),
        }
    }
}

/// Whose a bucket is, which says whether its refusals are the client's own doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The client alone: keyed by its address, by the key it proved, or by a claim of
    /// the token it proved.
    Client,
    /// Anyone who sends the same: the missing-key bucket, or a header's value (which
    /// any client may send, or a third party make a browser send).
    Anyone,
    /// Every client presenting one TLS fingerprint (`ja4`, with no part of the
    /// client's own): its refusals count towards `[escalation.fingerprint]`.
    Fingerprint,
}

/// One bucket a request is counted in.
#[derive(Debug)]
pub(super) struct Counting<'p> {
    pub(super) policy: &'p Policy,
    pub(super) key: String,
    pub(super) holder: Holder,
}

impl Counting<'_> {
    fn bucket(&self) -> Bucket<'_> {
        Bucket { policy: &self.policy.identity, key: &self.key, spec: &self.policy.spec }
    }
}

/// What to do with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// Forward after this long: a throttle band or a leaky-bucket queue.
    Delay(Duration),
    /// 429.
    Reject {
        retry_after: Duration,
    },
    /// `missing_key = "reject"` and the request lacks this rule's key: 401 for an API
    /// key, 400 for a header.
    MissingKey {
        rule: String,
    },
    /// The shared store is unreachable and `store_failure = "deny"`: 503. Not a 429,
    /// which would count towards escalation and block every client of an outage.
    StoreUnavailable,
}

/// A verdict's name, as the decision log and `limiter explain` give it; `deny` is a
/// `deny` rule's, which refuses before the limits decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Forward,
    Delay,
    Reject,
    MissingKey,
    StoreUnavailable,
    Deny,
    /// Let through by the limits, refused by `[proxy.upstream_capacity]` (503).
    ReducedCapacity,
}

impl VerdictKind {
    #[cfg(test)]
    pub const ALL: [Self; 7] = [
        Self::Forward,
        Self::Delay,
        Self::Reject,
        Self::MissingKey,
        Self::StoreUnavailable,
        Self::Deny,
        Self::ReducedCapacity,
    ];
}

impl std::fmt::Display for VerdictKind {
    /// As the JSON names it (a test holds the two together).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Forward => "forward",
            Self::Delay => "delay",
            Self::Reject => "reject",
            Self::MissingKey => "missing_key",
            Self::StoreUnavailable => "store_unavailable",
            Self::Deny => "deny",
            Self::ReducedCapacity => "reduced_capacity",
        })
    }
}

impl Verdict {
    #[must_use]
    pub fn kind(&self) -> VerdictKind {
        match self {
            Self::Forward => VerdictKind::Forward,
            Self::Delay(_) => VerdictKind::Delay,
            Self::Reject { .. } => VerdictKind::Reject,
            Self::MissingKey { .. } => VerdictKind::MissingKey,
            Self::StoreUnavailable => VerdictKind::StoreUnavailable,
        }
    }

    /// How long a delay holds the request, or when a refused one may come back.
    #[must_use]
    pub fn wait(&self) -> Option<Duration> {
        match self {
            Self::Delay(wait) | Self::Reject { retry_after: wait } => Some(*wait),
            Self::Forward | Self::MissingKey { .. } | Self::StoreUnavailable => None,
        }
    }
}

/// One policy's quota, for the response headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyStatus {
    /// The rule name, or the plan name for a plan.
    pub name: String,
    /// Quota `q`.
    pub limit: u32,
    /// Window `w`.
    pub window: Duration,
    /// `r`, after this request.
    pub remaining: u64,
    /// `t`: the real time until capacity is back in full.
    pub reset_after: Duration,
}

/// Rules and plans, turned into policies with their request keys.
#[derive(Debug)]
pub struct Engine<C: Clock> {
    clock: C,
    policies: RwLock<Arc<Policies>>,
    /// The buckets are `stores.limits`.
    stores: Arc<Stores>,
    /// Requests charged their `cost_from`, since the start.
    post_paid: AtomicU64,
}

/// Where a policy comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// A `[[proxy.rules]]` entry.
    Rule,
    /// A `[proxy.plans.NAME]`, for the keys on it.
    Plan,
}

impl PolicyKind {
    pub const ALL: [Self; 2] = [Self::Rule, Self::Plan];
}

impl std::fmt::Display for PolicyKind {
    /// As the JSON, the metrics' `kind` label and `limiter stats` name it (a test
    /// holds them together).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rule => "rule",
            Self::Plan => "plan",
        })
    }
}

/// A limit with a name and the identity its state is stored under.
#[derive(Debug)]
pub(super) struct Policy {
    pub(super) kind: PolicyKind,
    pub(super) name: String,
    /// Name, key spec, algorithm and window: what must stay the same for the state
    /// to carry over a reload (a changed `limit` keeps the counts).
    identity: Arc<str>,
    pub(super) spec: LimitSpec,
    /// What this policy decided, kept across reloads while its kind and name stay.
    decisions: Arc<PolicyDecisions>,
    /// What it has seen of its keys, kept across reloads while its identity stays.
    observation: Arc<Observation>,
    /// A rule's `count_when`.
    pub(super) count_when: Option<Arc<CountWhen>>,
}

/// Requests one policy let through at once, delayed, refused, denied and tagged.
#[derive(Debug, Default)]
pub struct PolicyDecisions([AtomicU64; 5]);

/// What one rule or plan decided since the start, for `limiter stats` and the metrics.
/// A request another policy refused counts for none of the others.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyCounts {
    pub kind: PolicyKind,
    pub name: String,
    /// Requests it let through without delaying them.
    pub forwarded: u64,
    /// Requests it delayed (its throttle band or queue).
    pub throttled: u64,
    /// Requests it refused: over its limit, or (a rule with `missing_key = "reject"`)
    /// without the key it counts by.
    pub rejected: u64,
    /// Requests a `deny` rule refused (403).
    #[serde(default)]
    pub denied: u64,
    /// Requests a `tag` rule marked.
    #[serde(default)]
    pub tagged: u64,
    /// A rule's `concurrency`: its keys' requests in flight at most, each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Its keys' requests in flight now (a rule with `concurrency`).
    #[serde(default)]
    pub inflight: u64,
    /// Its keys' requests waiting for a place in flight now.
    #[serde(default)]
    pub queued: u64,
}

/// Which of [`PolicyDecisions`]' counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decided {
    Forwarded,
    Throttled,
    Rejected,
    Denied,
    Tagged,
}

impl PolicyDecisions {
    fn record(&self, decided: Decided) {
        self.0[decided as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn unrecord(&self, decided: Decided) {
        self.0[decided as usize].fetch_sub(1, Ordering::Relaxed);
    }

    fn counts(&self, kind: PolicyKind, name: &str) -> PolicyCounts {
        let [forwarded, throttled, rejected, denied, tagged] = self.0.each_ref().map(|n| n.load(Ordering::Relaxed));
        PolicyCounts {
            kind,
            name: name.to_owned(),
            forwarded,
            throttled,
            rejected,
            denied,
            tagged,
            concurrency: None,
            inflight: 0,
            queued: 0,
        }
    }
}

impl Policy {
    fn new(kind: PolicyKind, name: &str, key: &KeySpec, spec: &LimitSpec, now: Duration) -> Self {
        let mut identity = format!("{kind} {name:?} by {} {:?} {}ns", key, spec.algorithm, spec.window.as_nanos());
        // A calendar window's state counts by its start, not by a multiple of its length.
        if let Some(calendar) = &spec.calendar {
            identity.push_str(&format!(" {calendar}"));
        }
        Self {
            kind,
            name: name.to_owned(),
            identity: identity.into(),
            spec: spec.clone(),
            decisions: Arc::default(),
            observation: Arc::new(Observation::new(spec.window, now)),
            count_when: None,
        }
    }

    fn counting_when(self, count_when: Option<&CountWhen>) -> Self {
        Self { count_when: count_when.cloned().map(Arc::new), ..self }
    }

    fn suggestion(&self, headroom: f64, now: Duration) -> Suggestion {
        let peaks = self.observation.peaks(self.spec.limit.get(), now);
        let suggested = (peaks.keys > 0).then(|| (f64::from(peaks.p99) * headroom).ceil().max(1.0) as u32);
        Suggestion {
            kind: self.kind,
            name: self.name.clone(),
            limit: self.spec.limit.get(),
            window_secs: self.spec.window.as_secs_f64(),
            peaks,
            suggested_limit: suggested,
            units: units_of(&self.spec.cost),
        }
    }

    fn record(&self, decided: Decided) {
        self.decisions.record(decided);
    }

    fn counts(&self) -> PolicyCounts {
        self.decisions.counts(self.kind, &self.name)
    }

    fn status(&self, quota: Quota) -> PolicyStatus {
        PolicyStatus {
            name: self.name.clone(),
            limit: self.spec.limit.get(),
            window: self.spec.window,
            remaining: quota.remaining,
            reset_after: quota.reset_after,
        }
    }
}

/// What a policy of `cost` counts, as `limiter suggest` says it.
pub(super) fn units_of(cost: &limiter_core::Cost) -> String {
    use limiter_core::{Cost, CostSource};
    match cost {
        Cost::Units(units) if units.get() == 1 => requests(),
        Cost::Units(units) => format!("units ({units} a request)"),
        Cost::From(CostFrom { source: CostSource::ResponseHeader { name, .. }, max }) => {
            format!("units ({name}, at most {max})")
        }
        Cost::From(CostFrom { source: CostSource::UpstreamMs, max }) => format!("upstream ms (at most {max})"),
    }
}

/// One compiled config.
#[derive(Debug)]
pub(super) struct Policies {
    /// The `limit` rules.
    rules: Vec<(Rule, Policy)>,
    /// The `deny` and `tag` rules, in the config's order.
    screens: Vec<(Rule, Arc<PolicyDecisions>)>,
    /// The rules with `concurrency` and no rate, in the config's order.
    concurrent: Vec<(Rule, Arc<PolicyDecisions>)>,
    /// Each plan's limits, all charged or none.
    plans: HashMap<String, Vec<Policy>>,
    /// API key id → plan name.
    keys: HashMap<String, String>,
    missing_key: MissingKey,
    store_failure: StoreFailure,
}

impl Policies {
    /// The policies of `config`, their observations starting at `now`.
    fn new(config: &ProxyConfig, now: Duration) -> Self {
        let api_key = KeySpec::of(KeyKind::ApiKey);
        Self {
            rules: config
                .rules
                .iter()
                .filter_map(|rule| {
                    let policy = Policy::new(PolicyKind::Rule, &rule.name, &rule.key, rule.limit()?, now);
                    Some((rule.clone(), policy.counting_when(rule.count_when.as_ref())))
                })
                .collect(),
            screens: config
                .rules
                .iter()
                .filter(|rule| matches!(rule.action, RuleAction::Deny | RuleAction::Tag))
                .map(|rule| (rule.clone(), Arc::default()))
                .collect(),
            concurrent: config
                .rules
                .iter()
                .filter(|rule| rule.action == RuleAction::Concurrent)
                .map(|rule| (rule.clone(), Arc::default()))
                .collect(),
            plans: config
                .plans
                .iter()
                .map(|(name, plan)| {
                    let limits = plan.named_limits(name);
                    let policies =
                        limits.map(|(policy, spec)| Policy::new(PolicyKind::Plan, &policy, &api_key, spec, now));
                    (name.clone(), policies.collect())
                })
                .collect(),
            keys: config.keys.iter().map(|key| (key.id.clone(), key.plan.clone())).collect(),
            missing_key: config.missing_key,
            store_failure: config.store_failure(),
        }
    }

    /// The buckets `request` is counted in (or the verdict that stops it first), and
    /// whether a matching rule requires a signature.
    pub(super) fn count(&self, request: &RequestInfo<'_>) -> (Counted<'_>, bool) {
        let seen = request.seen();
        let plan = self.plan_of(request);
        let matching: Vec<&(Rule, Policy)> =
            self.rules.iter().filter(|(rule, _)| rule.applies(&seen) && rule.counts_plan(plan)).collect();
        let require_signature = matching.iter().any(|(rule, _)| rule.require_signature);
        (count_in(self, &matching, request), require_signature)
    }

    /// The decision while the store cannot be reached: `store_failure`'s (`local`
    /// decides on the local store instead, see [`Engine::apply`], and gets here only
    /// without one).
    pub(super) fn store_failed(&self, require_signature: bool) -> Decision {
        let verdict = match self.store_failure {
            StoreFailure::Allow | StoreFailure::Local => Verdict::Forward,
            StoreFailure::Deny => Verdict::StoreUnavailable,
        };
        Decision::uncounted(verdict, require_signature)
    }

    /// The decision on a request stopped before any bucket was counted, counted
    /// against the rule that stopped it.
    fn uncounted(&self, verdict: Verdict, require_signature: bool) -> Decision {
        if let Verdict::MissingKey { rule } = &verdict
            && let Some(decisions) = self.decisions_of(rule)
        {
            decisions.record(Decided::Rejected);
        }
        Decision::uncounted(verdict, require_signature)
    }

    /// The decision counts of the limit rule `name`.
    fn decisions_of(&self, name: &str) -> Option<&Arc<PolicyDecisions>> {
        let rated = self.rules.iter().find(|(rule, _)| rule.name == name).map(|(_, policy)| &policy.decisions);
        rated.or_else(|| self.concurrent.iter().find(|(rule, _)| rule.name == name).map(|(_, decisions)| decisions))
    }

    /// The `concurrency` of each rule matching `request` that has one, under the
    /// rule's key; a missing key follows `missing_key` as it does for a rate. A rule
    /// with a rate too is among `counted` (the buckets [`Self::count`] found for the
    /// request), matched and keyed already: its key is taken from there.
    pub(super) fn gates(&self, request: &RequestInfo<'_>, counted: &[Counting<'_>]) -> Result<Vec<Gated>, Verdict> {
        let gated =
            |rule: &Rule, concurrency, (key, holder)| Gated { rule: rule.name.clone(), key, holder, concurrency };
        let rated = self.rules.iter().filter_map(|(rule, policy)| {
            let concurrency = rule.concurrency?;
            let counting = counted.iter().find(|counting| std::ptr::eq(counting.policy, policy))?;
            Some(Ok(gated(rule, concurrency, (counting.key.clone(), counting.holder))))
        });
        let (seen, plan) = (request.seen(), self.plan_of(request));
        let concurrent = self.concurrent.iter().filter_map(|(rule, _)| {
            let concurrency = rule.concurrency.filter(|_| rule.applies(&seen) && rule.counts_plan(plan))?;
            Some(match (self.key(rule, request), self.missing_key) {
                (Some(keyed), _) => Ok(gated(rule, concurrency, keyed)),
                (None, MissingKey::Shared) => Ok(gated(rule, concurrency, (MISSING_KEY.to_owned(), Holder::Anyone))),
                (None, MissingKey::Reject) => Err(Verdict::MissingKey { rule: rule.name.clone() }),
            })
        });
        rated.chain(concurrent).collect()
    }

    /// The plans, by name.
    fn plans_by_name(&self) -> Vec<&Policy> {
        let mut plans: Vec<&Policy> = self.plans.values().flatten().collect();
        plans.sort_by(|a, b| a.name.cmp(&b.name));
        plans
    }

    fn all(&self) -> impl Iterator<Item = &Policy> {
        self.rules.iter().map(|(_, policy)| policy).chain(self.plans.values().flatten())
    }

    /// Takes over `old`'s decision counts for the policies of the same kind and name,
    /// and its observations for the policies of the same identity.
    fn keep_history(&mut self, old: &Self) {
        let observations: HashMap<&str, &Arc<Observation>> =
            old.all().map(|p| (p.identity.as_ref(), &p.observation)).collect();
        for policy in self.rules.iter_mut().map(|(_, policy)| policy).chain(self.plans.values_mut().flatten()) {
            if let Some(kept) = observations.get(policy.identity.as_ref()) {
                policy.observation = Arc::clone(kept);
            }
        }
        let screens = old
            .screens
            .iter()
            .chain(&old.concurrent)
            .map(|(rule, decisions)| ((PolicyKind::Rule, rule.name.as_str()), decisions));
        let kept: HashMap<(PolicyKind, &str), &Arc<PolicyDecisions>> =
            old.all().map(|p| ((p.kind, p.name.as_str()), &p.decisions)).chain(screens).collect();
        let rules = self.rules.iter_mut().map(|(_, policy)| (policy.kind, policy.name.as_str(), &mut policy.decisions));
        let plans =
            self.plans.values_mut().flatten().map(|policy| (policy.kind, policy.name.as_str(), &mut policy.decisions));
        let screens = self
            .screens
            .iter_mut()
            .chain(&mut self.concurrent)
            .map(|(rule, decisions)| (PolicyKind::Rule, rule.name.as_str(), decisions));
        for (kind, name, decisions) in rules.chain(screens).chain(plans) {
            if let Some(kept) = kept.get(&(kind, name)) {
                *decisions = Arc::clone(kept);
            }
        }
    }

    fn identities(&self) -> HashSet<Arc<str>> {
        self.all().map(|policy| Arc::clone(&policy.identity)).collect()
    }

    fn known_key<'r>(&self, request: &RequestInfo<'r>) -> Option<&'r str> {
        request.api_key.filter(|key| self.keys.contains_key(*key))
    }

    /// The plan of the key `request` proved, if it proved a known one.
    fn plan_of(&self, request: &RequestInfo<'_>) -> Option<&str> {
        request.api_key.and_then(|key| self.keys.get(key)).map(String::as_str)
    }

    /// The bucket key of `rule` for `request` and whose it is; `None` if the request
    /// lacks it (any part of it).
    fn key(&self, rule: &Rule, request: &RequestInfo<'_>) -> Option<(String, Holder)> {
        let spec = &rule.key;
        let (mut key, holder) = match spec.parts.as_slice() {
            [only] => self.key_part(only, spec.fold, request)?,
            parts => {
                let mut key = String::new();
                let mut holder = Holder::Anyone;
                for kind in parts {
                    let (part, whose) = self.key_part(kind, spec.fold, request)?;
                    // Each part with its length, so that values a client chooses cannot
                    // shift text from one part to the next and meet another's.
                    key.push_str(&part.len().to_string());
                    key.push(':');
                    key.push_str(&part);
                    // Only this client's requests reach a bucket that its address or
                    // proven key is a part of, and only its fingerprint's one that the
                    // fingerprint is.
                    if whose == Holder::Client || (whose == Holder::Fingerprint && holder == Holder::Anyone) {
                        holder = whose;
                    }
                }
                (key, holder)
            }
        };
        // `+route` counts each path the rule covers on its own: per client per
        // endpoint. (The rule's own prefix would add nothing: every rule already has
        // state of its own.) Paths are client-chosen, so the key is bounded in length
        // like header values, and the store's bound holds the number of them.
        if spec.per_route {
            if request.path.len() <= MAX_KEY_VALUE {
                key.push_str(" route=");
                key.push_str(request.path);
            } else {
                key.push_str(" route#");
                key.push_str(&hex::encode(Sha256::digest(request.path.as_bytes())));
            }
        }
        Some((key, holder))
    }

    fn key_part(&self, kind: &KeyKind, fold: KeyFold, request: &RequestInfo<'_>) -> Option<(String, Holder)> {
        let chosen =
            |label: &dyn std::fmt::Display, value: &[u8]| Some((chosen_key(label, value, fold)?, Holder::Anyone));
        match kind {
            KeyKind::Ip => Some((ip_key(request.client), Holder::Client)),
            KeyKind::ApiKey => Some((format!("api_key={}", self.known_key(request)?), Holder::Client)),
            KeyKind::Header(name) => {
                let mut value = Vec::new();
                for line in request.headers.get_all(name) {
                    if !value.is_empty() {
                        value.extend_from_slice(b", ");
                    }
                    value.extend_from_slice(line.as_bytes());
                }
                chosen(&"header", &value)
            }
            KeyKind::Query(name) => chosen(kind, &carried::query_value(request.query?, name)?),
            KeyKind::Cookie(name) => {
                let lines = request.headers.get_all(http::header::COOKIE).into_iter().map(http::HeaderValue::as_bytes);
                chosen(kind, carried::cookie_value(lines, name)?)
            }
            KeyKind::Json(pointer) => {
                chosen(kind, carried::json_value(request.body_as(BodyFormat::Json)?, pointer)?.as_bytes())
            }
            KeyKind::Form(name) => chosen(kind, &carried::form_field(request.body_as(BodyFormat::Form)?, name)?),
            KeyKind::Jwt(claim) => {
                let value = request.jwt?.key_value(claim)?;
                Some((chosen_key(kind, value.as_bytes(), KeyFold::None)?, Holder::Client))
            }
            KeyKind::Ja4 => Some((format!("ja4={}", request.ja4?), Holder::Fingerprint)),
        }
    }
}

/// The key text of a value the client chose, under `label` (`header`, or the kind as
/// written: `json:/username`): folded as the rule says, as is if it is short UTF-8
/// text, else by its SHA-256, so that key memory stays bounded. Empty is missing.
fn chosen_key(label: &dyn std::fmt::Display, value: &[u8], fold: KeyFold) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    let folded: std::borrow::Cow<'_, [u8]> = match (fold, std::str::from_utf8(value)) {
        (KeyFold::None, _) => value.into(),
        (KeyFold::Lower, Ok(text)) => text.to_lowercase().into_bytes().into(),
        (KeyFold::Lower, Err(_)) => value.to_ascii_lowercase().into(),
    };
    Some(match std::str::from_utf8(&folded) {
        Ok(text) if text.len() <= MAX_KEY_VALUE => format!("{label}={text}"),
        _ => format!("{label}#{}", hex::encode(Sha256::digest(&folded))),
    })
}

/// Either the counted buckets or the verdict that stops a request before counting.
pub(super) type Counted<'p> = Result<Vec<Counting<'p>>, Verdict>;

impl<C: Clock> Engine<C> {
    /// An engine keeping its buckets in `stores.limits`; while a Redis store is
    /// unreachable, decisions follow `store_failure`.
    #[must_use]
    pub fn new(config: &ProxyConfig, clock: C, stores: Arc<Stores>) -> Self {
        let policies = Policies::new(config, clock.now());
        Self { clock, policies: RwLock::new(Arc::new(policies)), stores, post_paid: AtomicU64::new(0) }
    }

    /// Swaps rules and plans. State of the rules and plans whose identity (name, key
    /// spec, algorithm and window) is unchanged is kept, so a changed `limit` keeps
    /// its counts; the state of the others is dropped.
    pub fn reconfigure(&self, config: &ProxyConfig) {
        let mut policies = Policies::new(config, self.clock.now());
        policies.keep_history(&self.snapshot());
        let policies = Arc::new(policies);
        let live = policies.identities();
        *self.policies.write().unwrap_or_else(PoisonError::into_inner) = policies;
        // A request still deciding on the old policies may recreate a dropped bucket
        // after this; it is then an orphan that fills up and is evicted first.
        self.stores.limits.reconfigure(config.max_tracked_keys, &|identity| live.contains(identity));
        if let Some(tier) = self.stores.first_tier() {
            tier.clear();
        }
    }

    /// Checks every matching rule and the key's plan; if none rejects, charges all of
    /// them, atomically with respect to concurrent calls. A rejected request is
    /// charged to nothing.
    pub async fn decide(&self, request: &RequestInfo<'_>) -> Decision {
        let policies = self.snapshot();
        let (counted, require_signature) = policies.count(request);
        let counted = match counted {
            Ok(counted) => counted,
            Err(verdict) => return policies.uncounted(verdict, require_signature),
        };
        let gates = match policies.gates(request, &counted) {
            Ok(gates) => gates,
            Err(verdict) => return policies.uncounted(verdict, require_signature),
        };
        let now = self.clock.now();
        let counted = match self.first_tier_refusal(counted, request.client, now, require_signature) {
            Ok(refused) => return refused,
            Err(counted) => counted,
        };
        let mut recorded = (!gates.is_empty()).then(Vec::new);
        let decision = match self.apply(&counted, Charge::AllOrNothing).await {
            Some(applied) => {
                let outcomes = &applied.outcomes;
                observe(&counted, Some(outcomes), request.client, now);
                record(&counted, outcomes, recorded.as_mut());
                Decision {
                    refundable: refundable(&counted, &applied),
                    owed: owed(&counted, &applied, request.client),
                    ..decision(&counted, outcomes, require_signature)
                }
            }
            None => {
                observe(&counted, None, request.client, now);
                policies.store_failed(require_signature)
            }
        };
        let let_through = matches!(decision.verdict, Verdict::Forward | Verdict::Delay(_));
        let Some(mut recorded) = recorded.filter(|_| let_through) else { return decision };
        // A rule without a rate decides only at its gate: let through so far.
        for gated in &gates {
            if let Some((_, decisions)) = policies.concurrent.iter().find(|(rule, _)| rule.name == gated.rule) {
                decisions.record(Decided::Forwarded);
                recorded.push((Arc::clone(decisions), Decided::Forwarded));
            }
        }
        Decision { gates, recorded: Recorded(recorded), ..decision }
    }

    /// Counts a request that `rule`'s gate refused (`recorded`: what its decision
    /// counted) as refused by that rule alone, as a refusal by a rate is.
    pub fn shed(&self, rule: &str, recorded: &Recorded) {
        for (decisions, decided) in &recorded.0 {
            decisions.unrecord(*decided);
        }
        if let Some(decisions) = self.snapshot().decisions_of(rule) {
            decisions.record(Decided::Rejected);
        }
    }

    /// Whether a rule keyed on the body (`json:`, `form:`) matches `request`, so that
    /// its body is to be read for the key.
    pub fn needs_body(&self, request: &RequestInfo<'_>) -> bool {
        let seen = request.seen();
        let policies = self.snapshot();
        let plan = policies.plan_of(request);
        policies.rules.iter().any(|(rule, _)| rule.key.needs_body() && rule.applies(&seen) && rule.counts_plan(plan))
    }

    /// What [`Self::decide`] would answer now from the request's rules not keyed by
    /// `api_key` nor on the body (which need the body read first), charging nothing:
    /// asked before a body is read, so that a client already over its own limit costs
    /// no read. `None`: they admit it (or the store is unreachable), and the request
    /// goes on to `decide`. A refusal is counted as `decide` counts one.
    pub async fn refuse_early(&self, request: &RequestInfo<'_>) -> Option<Decision> {
        let policies = self.snapshot();
        let seen = request.seen();
        let keyless: Vec<&(Rule, Policy)> = policies
            .rules
            .iter()
            // A rule for some plans only needs the key proven too.
            .filter(|(rule, _)| {
                !rule.key.needs_proof() && !rule.key.needs_body() && rule.plans.is_empty() && rule.applies(&seen)
            })
            .collect();
        if keyless.is_empty() {
            return None;
        }
        let request = RequestInfo { api_key: None, ..*request };
        let counted = match count_in(&policies, &keyless, &request) {
            Ok(counted) => counted,
            Err(verdict) => return Some(policies.uncounted(verdict, false)),
        };
        let counted = match self.first_tier_refusal(counted, request.client, self.clock.now(), false) {
            Ok(refused) => return Some(refused),
            Err(counted) => counted,
        };
        let outcomes = self.apply(&counted, Charge::Nothing).await?.outcomes;
        if outcomes.iter().all(|outcome| outcome.admitted) {
            return None;
        }
        observe(&counted, Some(&outcomes), request.client, self.clock.now());
        record(&counted, &outcomes, None);
        Some(decision(&counted, &outcomes, false))
    }

    /// The refusal of this agent's first tier (with Redis): a bucket of `counted` that
    /// Redis refused is not yet due to admit, so the request is refused without asking
    /// Redis, and counted as `decide` counts a refusal; else `counted` back.
    fn first_tier_refusal<'p>(
        &self,
        counted: Vec<Counting<'p>>,
        client: IpAddr,
        now: Duration,
        require_signature: bool,
    ) -> Result<Decision, Vec<Counting<'p>>> {
        let Some(tier) = self.stores.first_tier() else { return Err(counted) };
        let known: Vec<Option<Outcome>> = counted.iter().map(|c| tier.refusal(&c.bucket(), now)).collect();
        if known.iter().all(Option::is_none) {
            return Err(counted);
        }
        // Refused whatever the other buckets say, and a refusal charges none of them:
        // only the refusing ones are named, as Redis is not asked.
        let (refusing, outcomes): (Vec<Counting<'_>>, Outcomes) =
            counted.into_iter().zip(known).filter_map(|(counting, known)| Some((counting, known?))).unzip();
        tier.count();
        observe(&refusing, Some(&outcomes), client, now);
        record(&refusing, &outcomes, None);
        Ok(decision(&refusing, &outcomes, require_signature))
    }

    /// Charges the IP-keyed rules matching this request whatever the verdict of the
    /// others (used for failed signatures, so that guessing is rate limited). Each
    /// such bucket takes one unit if it has one left; a full bucket stays full.
    pub async fn penalize(&self, request: &RequestInfo<'_>) {
        let policies = self.snapshot();
        let (seen, plan) = (request.seen(), policies.plan_of(request));
        let now = self.clock.now();
        let counted: Vec<Counting<'_>> = policies
            .rules
            .iter()
            .filter(|(rule, _)| rule.key.is(&KeyKind::Ip) && rule.applies(&seen) && rule.counts_plan(plan))
            .filter_map(|(rule, policy)| {
                let (key, holder) = policies.key(rule, request)?;
                Some(Counting { policy, key, holder })
            })
            // A bucket known refused would not be charged: Redis need not be asked.
            .filter(|counting| {
                self.stores.first_tier().is_none_or(|tier| tier.refusal(&counting.bucket(), now).is_none())
            })
            .collect();
        if counted.is_empty() {
            return;
        }
        // Without the store a penalty is lost: the signature was refused anyway.
        let _ = self.apply(&counted, Charge::EachAdmitting).await;
    }

    /// Gives back the charges of `refundable` whose rule does not count `answer`;
    /// whether any was. Without the store a charge stays taken: the request was let
    /// through on it, and the rule's limit is what may not be passed.
    pub async fn refund(&self, refundable: &[Refundable], answer: Answer) -> bool {
        let given: Vec<&Refundable> = refundable.iter().filter(|r| !r.count_when.counts(answer)).collect();
        if given.is_empty() {
            return false;
        }
        let now = self.clock.now();
        let refunds = |local: bool| -> Vec<Refund<'_>> {
            given.iter().filter(|r| r.local == local).map(|r| r.refund()).collect()
        };
        let (shared, local) = (refunds(false), refunds(true));
        if !shared.is_empty() {
            if let Err(error) = self.stores.limits.refund(&shared, now).await {
                tracing::debug!(%error, "limits store unreachable: a charge not given back");
                return false;
            }
            if let Some(tier) = self.stores.first_tier() {
                shared.iter().for_each(|refund| tier.forget(&refund.bucket));
            }
        }
        if let Some(store) = self.stores.local_store().filter(|_| !local.is_empty()) {
            store.refund(&local, now);
        }
        true
    }

    /// Charges what each request's answer cost the buckets it owed (`units` beside
    /// each, clamped to its `max` by the caller), into debt if need be, shows
    /// `limiter suggest` the units, and returns each charged policy's quota once
    /// charged, for the headers. Without the store a charge is lost: the request was
    /// let through, and the next ones are decided without it.
    pub async fn charge_owed(&self, charges: &[(Owed, u32)]) -> Vec<PolicyStatus> {
        if charges.is_empty() {
            return Vec::new();
        }
        self.post_paid.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let of =
            |local: bool| -> Vec<&(Owed, u32)> { charges.iter().filter(|(owed, _)| owed.local == local).collect() };
        fn debits<'o>(of: &[&'o (Owed, u32)]) -> Vec<Debit<'o>> {
            of.iter()
                .map(|(owed, units)| Debit {
                    bucket: Bucket { policy: &owed.identity, key: &owed.key, spec: &owed.spec },
                    units: *units,
                })
                .collect()
        }
        let (shared, local) = (of(false), of(true));
        let mut charged: Vec<(&Owed, Option<Quota>)> = Vec::new();
        if !shared.is_empty() {
            match self.stores.limits.debit(&debits(&shared), now).await {
                Ok(quotas) => charged.extend(shared.iter().map(|(owed, _)| owed).zip(quotas)),
                Err(error) => tracing::debug!(%error, "limits store unreachable: a post-paid charge not taken"),
            }
        }
        if let Some(store) = self.stores.local_store().filter(|_| !local.is_empty()) {
            charged.extend(local.iter().map(|(owed, _)| owed).zip(store.debit(&debits(&local), now)));
        }
        let policies = self.snapshot();
        for (owed, units) in charges {
            if let Some(policy) = policies.all().find(|policy| policy.identity == owed.identity) {
                policy.observation.observe(&owed.key, owed.client, Usage { requests: 0, units: *units }, now);
            }
        }
        charged
            .into_iter()
            .filter_map(|(owed, quota)| {
                let quota = quota?;
                Some(PolicyStatus {
                    name: owed.name.clone(),
                    limit: owed.spec.limit.get(),
                    window: owed.spec.window,
                    remaining: quota.remaining,
                    reset_after: quota.reset_after,
                })
            })
            .collect()
    }

    /// Requests whose post-paid charges [`Self::charge_owed`] took, since the start.
    #[must_use]
    pub fn post_paid_charges(&self) -> u64 {
        self.post_paid.load(Ordering::Relaxed)
    }

    /// What each configured rule and plan decided: limit rules, then rules with only a
    /// `concurrency`, then deny and tag
    /// rules, in the config's order, then plans by name.
    #[must_use]
    pub fn policy_counts(&self) -> Vec<PolicyCounts> {
        let policies = self.snapshot();
        let with_concurrency = |rule: &Rule, counts: PolicyCounts| PolicyCounts {
            concurrency: rule.concurrency.map(|concurrency| concurrency.limit.get()),
            ..counts
        };
        let rules = policies.rules.iter().map(|(rule, policy)| with_concurrency(rule, policy.counts()));
        let concurrent = policies
            .concurrent
            .iter()
            .map(|(rule, decisions)| with_concurrency(rule, decisions.counts(PolicyKind::Rule, &rule.name)));
        let screens = policies.screens.iter().map(|(rule, decisions)| decisions.counts(PolicyKind::Rule, &rule.name));
        let plans = policies.plans_by_name().into_iter().map(Policy::counts);
        rules.chain(concurrent).chain(screens).chain(plans).collect()
    }

    /// For each limit rule and plan, what its keys' peaks were and the limit
    /// `headroom` above their 99th percentile.
    #[must_use]
    pub fn suggest(&self, headroom: f64) -> Vec<Suggestion> {
        let policies = self.snapshot();
        let now = self.clock.now();
        let rules = policies.rules.iter().map(|(_, policy)| policy);
        rules.chain(policies.plans_by_name()).map(|policy| policy.suggestion(headroom, now)).collect()
    }

    /// Applies the `deny` and `tag` rules to `request`, counting what they do: every
    /// tag rule that applies, up to the first deny rule that does.
    pub fn screen(&self, request: &RequestInfo<'_>) -> Screened {
        self.screened(request, true)
    }

    /// What [`Self::screen`] would do, counting nothing (`limiter explain`).
    pub fn would_screen(&self, request: &RequestInfo<'_>) -> Screened {
        self.screened(request, false)
    }

    fn screened(&self, request: &RequestInfo<'_>, count: bool) -> Screened {
        let policies = self.snapshot();
        let seen = request.seen();
        let mut screened = Screened::default();
        for (rule, decisions) in policies.screens.iter().filter(|(rule, _)| rule.applies(&seen)) {
            let denies = rule.action == RuleAction::Deny;
            if count {
                decisions.record(if denies { Decided::Denied } else { Decided::Tagged });
            }
            if denies {
                screened.denied_by = Some(rule.name.clone());
                screened.deny_escalates = rule.escalate;
                break;
            }
            screened.tagged.push(rule.name.clone());
        }
        screened
    }

    /// Buckets holding state (see [`crate::backend::Stores::tracked_keys`]).
    #[must_use]
    pub fn tracked_keys(&self) -> usize {
        self.stores.tracked_keys()
    }

    /// Buckets evicted to stay within `max_tracked_keys`, since the start.
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.stores.evictions()
    }

    pub(super) fn snapshot(&self) -> Arc<Policies> {
        Arc::clone(&self.policies.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The outcome of each bucket; `None` if the store could not be reached (counted,
    /// and logged once per outage by the connection).
    pub(super) async fn apply(&self, counted: &[Counting<'_>], charge: Charge) -> Option<Applied> {
        let buckets: Vec<Bucket<'_>> = counted.iter().map(Counting::bucket).collect();
        let now = self.clock.now();
        match self.stores.limits.apply(&buckets, now, charge).await {
            Ok(outcomes) => {
                if let Some(tier) = self.stores.first_tier() {
                    let refundable: Vec<bool> = counted.iter().map(|c| c.policy.count_when.is_some()).collect();
                    tier.note(&buckets, &outcomes, &refundable, now);
                }
                // Only a fallback of its own reads it: no lock and no copy of each key
                // for the decisions of a fleet that denies or allows without Redis.
                if let Some(known) = self.stores.last_known()
                    && self.snapshot().store_failure == StoreFailure::Local
                {
                    known.note(&buckets, &outcomes, now);
                }
                Some(Applied { outcomes, local: None })
            }
            Err(error) => {
                self.stores.count_failure();
                tracing::debug!(%error, "limits store unreachable");
                if self.snapshot().store_failure != StoreFailure::Local {
                    return None;
                }
                // Each agent its share of every quota, so that the fleet together
                // stays near the limit.
                let local = self.stores.local_fallback(charge)?;
                let agents = self.stores.live_agents();
                let shares: Vec<LimitSpec> =
                    counted.iter().map(|counting| counting.policy.spec.share(agents)).collect();
                let buckets: Vec<Bucket<'_>> = counted
                    .iter()
                    .zip(&shares)
                    .map(|(Counting { policy, key, .. }, spec)| Bucket { policy: &policy.identity, key, spec })
                    .collect();
                let now = self.clock.now();
                if let Some(known) = self.stores.last_known() {
                    for bucket in &buckets {
                        if let Some(remaining) = known.take(bucket, now) {
                            seed(local, bucket, remaining.div_ceil(u64::from(agents)), now);
                        }
                    }
                }
                let outcomes = local.apply(&buckets, now, charge);
                Some(Applied { outcomes, local: Some(shares) })
            }
        }
    }
}

/// Charges `bucket` (an agent's share) in `local` with what the fleet had spent of
/// it, the share's capacity less `remaining` (units, as a cost counts them), in one
/// post-paid charge, and never past empty: a key spent in Redis starts its fallback
/// spent, not full (one left from an earlier outage only the emptier). Once a key an
/// outage.
fn seed(local: &MemoryStore, bucket: &Bucket<'_>, remaining: u64, now: Duration) {
    let spent = u64::from(bucket.spec.capacity().get()).saturating_sub(remaining);
    let left = local.apply(std::slice::from_ref(bucket), now, Charge::Nothing)[0].before.remaining;
    let units = u32::try_from(spent.min(left)).unwrap_or(u32::MAX);
    if units > 0 {
        let _charged = local.debit(&[Debit { bucket: *bucket, units }], now);
    }
}

/// What one store step answered.
pub(super) struct Applied {
    pub(super) outcomes: Outcomes,
    /// The specs the local fallback decided with (each rule's share), when it did.
    local: Option<Vec<LimitSpec>>,
}

/// The charges of `counted` a `count_when` rule may give back.
fn refundable(counted: &[Counting<'_>], applied: &Applied) -> Vec<Refundable> {
    let specs = counted
        .iter()
        .enumerate()
        .map(|(i, counting)| applied.local.as_ref().and_then(|shares| shares.get(i)).unwrap_or(&counting.policy.spec));
    counted
        .iter()
        .zip(&applied.outcomes)
        .zip(specs)
        .filter_map(|((counting, outcome), spec)| {
            Some(Refundable {
                count_when: Arc::clone(counting.policy.count_when.as_ref()?),
                charged_at: outcome.charged_at?,
                identity: Arc::clone(&counting.policy.identity),
                key: counting.key.clone(),
                spec: spec.clone(),
                local: applied.local.is_some(),
            })
        })
        .collect()
}

/// What each `cost_from` bucket of `counted` that admitted the request is owed.
fn owed(counted: &[Counting<'_>], applied: &Applied, client: IpAddr) -> Vec<Owed> {
    counted
        .iter()
        .enumerate()
        .zip(&applied.outcomes)
        .filter_map(|((i, counting), outcome)| {
            let spec = applied.local.as_ref().and_then(|shares| shares.get(i)).unwrap_or(&counting.policy.spec);
            outcome.charged_at?;
            Some(Owed {
                from: spec.cost.post_paid()?.clone(),
                name: counting.policy.name.clone(),
                identity: Arc::clone(&counting.policy.identity),
                key: counting.key.clone(),
                spec: spec.clone(),
                local: applied.local.is_some(),
                client,
            })
        })
        .collect()
}

/// Shows each policy its key's request for `limiter suggest`, in the units its cost
/// takes (a refused one: the units it needed; a post-paid one: none yet, then its
/// charge), unless another policy refused it (a poisoner's requests are refused
/// somewhere first); with no `outcomes` (the store failed), to every policy.
fn observe(counted: &[Counting<'_>], outcomes: Option<&[Outcome]>, client: IpAddr, now: Duration) {
    let refused = |i: usize| outcomes.and_then(|outcomes| outcomes.get(i)).is_some_and(|o| !o.admitted);
    let any_refused = (0..counted.len()).any(refused);
    for (i, Counting { policy, key, .. }) in counted.iter().enumerate() {
        let cost = &policy.spec.cost;
        let units = if refused(i) { cost.needed() } else { cost.upfront() };
        if refused(i) || !any_refused {
            policy.observation.observe(key, client, Usage { requests: 1, units }, now);
        }
    }
}

/// Counts each policy's part in a decision: a refused request only for the policies
/// that refused it. What is counted goes into `recorded` too, if given.
fn record(
    counted: &[Counting<'_>],
    outcomes: &[Outcome],
    mut recorded: Option<&mut Vec<(Arc<PolicyDecisions>, Decided)>>,
) {
    let refused = outcomes.iter().any(|outcome| !outcome.admitted);
    for (Counting { policy, .. }, outcome) in counted.iter().zip(outcomes) {
        let decided = match (outcome.admitted, refused) {
            (false, _) => Decided::Rejected,
            (true, true) => continue,
            (true, false) if outcome.delay(policy.spec.throttle).is_zero() => Decided::Forwarded,
            (true, false) => Decided::Throttled,
        };
        policy.record(decided);
        if let Some(recorded) = recorded.as_deref_mut() {
            recorded.push((Arc::clone(&policy.decisions), decided));
        }
    }
}

/// The decision from each counted bucket's outcome: the strictest verdict wins.
pub(super) fn decision(counted: &[Counting<'_>], outcomes: &[Outcome], require_signature: bool) -> Decision {
    let rejecting = || counted.iter().zip(outcomes).filter(|(_, outcome)| !outcome.admitted);
    if let Some(retry_after) = rejecting().map(|(_, outcome)| outcome.retry_after).max() {
        return Decision {
            verdict: Verdict::Reject { retry_after },
            policies: counted.iter().zip(outcomes).map(|(c, o)| c.policy.status(o.before)).collect(),
            violated: rejecting().map(|(counting, _)| counting.policy.name.clone()).collect(),
            require_signature,
            own_bucket_refused: rejecting().any(|(counting, _)| counting.holder == Holder::Client),
            fingerprint_bucket_refused: rejecting().any(|(counting, _)| counting.holder == Holder::Fingerprint),
            refundable: Vec::new(),
            owed: Vec::new(),
            gates: Vec::new(),
            recorded: Recorded::default(),
        };
    }
    let delay = counted.iter().zip(outcomes).map(|(c, o)| o.delay(c.policy.spec.throttle)).max();
    Decision {
        verdict: match delay {
            Some(delay) if !delay.is_zero() => Verdict::Delay(delay),
            _ => Verdict::Forward,
        },
        policies: counted.iter().zip(outcomes).map(|(c, o)| c.policy.status(o.after)).collect(),
        violated: Vec::new(),
        require_signature,
        own_bucket_refused: false,
        fingerprint_bucket_refused: false,
        refundable: Vec::new(),
        owed: Vec::new(),
        gates: Vec::new(),
        recorded: Recorded::default(),
    }
}

/// The buckets a request is counted in: its matching rules', then its plan's.
fn count_in<'p>(policies: &'p Policies, matching: &[&'p (Rule, Policy)], request: &RequestInfo<'_>) -> Counted<'p> {
    let mut counted = Vec::with_capacity(matching.len() + 1);
    for (rule, policy) in matching {
        let (key, holder) = match (policies.key(rule, request), policies.missing_key) {
            (Some(keyed), _) => keyed,
            (None, MissingKey::Shared) => (MISSING_KEY.to_owned(), Holder::Anyone),
            (None, MissingKey::Reject) => return Err(Verdict::MissingKey { rule: rule.name.clone() }),
        };
        counted.push(Counting { policy, key, holder });
    }
    if let Some(key) = policies.known_key(request)
        && let Some(plan) = policies.keys.get(key).and_then(|plan| policies.plans.get(plan))
    {
        let key = format!("api_key={key}");
        counted.extend(plan.iter().map(|policy| Counting { policy, key: key.clone(), holder: Holder::Client }));
    }
    Ok(counted)
}

/// An IPv4 address as is, an IPv6 address by its /64.
fn ip_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("ip={v4}"),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => format!("ip={v4}"),
            None => format!("ip={}/64", std::net::Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}
