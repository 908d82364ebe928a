//! `limiter explain` at the engine: which rules and plan would count a request, under
//! which key, and what each one's quota is now. It looks at the buckets through the
//! store's check-only step, so explaining never spends a request's quota.

use std::time::Duration;

use limiter_core::{Algorithm, Clock, limits::Charge};
use serde::{Deserialize, Serialize};

use super::engine::{Counting, Engine, PolicyKind, RequestInfo, Verdict, VerdictKind, decision, units_of};

/// One request, explained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// What the request would get now; `None` when the quotas were not looked up.
    pub verdict: Option<VerdictKind>,
    /// The wait a `delay` would impose, or a `reject`'s `Retry-After`, in ms.
    pub wait_ms: Option<u64>,
    /// The rule whose key is missing (`missing_key = "reject"`).
    pub missing_key: Option<String>,
    /// Some matching rule has `require_signature = true`.
    pub require_signature: bool,
    /// Every rule that matches, then the key's plan, in the order they are checked.
    pub policies: Vec<ExplainedPolicy>,
    /// The `concurrency` of each matching rule that has one, under the request's key.
    #[serde(default)]
    pub gates: Vec<ExplainedGate>,
}

/// A rule's `concurrency` the request would pass before it is forwarded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainedGate {
    pub rule: String,
    /// The key whose requests in flight it bounds, as [`ExplainedPolicy::key`].
    pub key: String,
    pub concurrency: u32,
    pub queue: u32,
    pub queue_timeout_ms: u64,
    /// That key's requests in flight and queued now, on this agent; `None` when
    /// not looked up (no agent running).
    pub inflight: Option<u64>,
    pub queued: Option<u64>,
}

/// One rule or plan that would count the request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainedPolicy {
    pub kind: PolicyKind,
    pub name: String,
    /// The bucket the request would be counted in (`ip=…`, `api_key=…`, `header=…`,
    /// `<missing>`).
    pub key: String,
    #[serde(with = "algorithm_name")]
    pub algorithm: Algorithm,
    pub limit: u32,
    pub window_secs: f64,
    /// A rule's `count_when.status`, as written: the answers that keep the unit.
    #[serde(default)]
    pub count_when: Option<Vec<String>>,
    /// What `limit` and `remaining` count: `requests`, or the units of the policy's
    /// `cost` (as `limiter suggest` says them).
    #[serde(default = "super::engine::requests")]
    pub units: String,
    /// Requests this bucket would let through back to back now; `None` when the
    /// quotas were not looked up.
    pub remaining: Option<u64>,
    /// Until the bucket is full again, in ms.
    pub reset_after_ms: Option<u64>,
    /// Whether this bucket would let the request through.
    pub admits: Option<bool>,
}

impl<C: Clock> Engine<C> {
    /// Explains `request` without charging anything; with `live`, looks up each
    /// bucket's quota in the store (the agent's), otherwise only matches (a config).
    pub async fn explain(&self, request: &RequestInfo<'_>, live: bool) -> Explanation {
        let policies = self.snapshot();
        let (counted, require_signature) = policies.count(request);
        let counted = match counted {
            Ok(counted) => counted,
            Err(verdict) => return Explanation::stopped(verdict, require_signature),
        };
        let gates = match policies.gates(request, &counted) {
            Ok(gates) => gates,
            Err(verdict) => return Explanation::stopped(verdict, require_signature),
        };
        let gates = gates
            .into_iter()
            .map(|gated| ExplainedGate {
                rule: gated.rule,
                key: gated.key,
                concurrency: gated.concurrency.limit.get(),
                queue: gated.concurrency.queue,
                queue_timeout_ms: millis(gated.concurrency.queue_timeout.0),
                inflight: None,
                queued: None,
            })
            .collect();
        let outcomes = if live { self.apply(&counted, Charge::Nothing).await.map(|a| a.outcomes) } else { None };
        let verdict = match &outcomes {
            Some(outcomes) => Some(decision(&counted, outcomes, require_signature).verdict),
            None if live => Some(policies.store_failed(require_signature).verdict),
            None => None,
        };
        let (verdict, wait, missing_key) = match verdict.map(describe) {
            Some((kind, wait, missing_key)) => (Some(kind), wait, missing_key),
            None => (None, None, None),
        };
        let explained = counted.iter().enumerate().map(|(i, Counting { policy, key, .. })| {
            let outcome = outcomes.as_ref().and_then(|o| o.get(i));
            ExplainedPolicy {
                kind: policy.kind,
                name: policy.name.clone(),
                key: key.clone(),
                algorithm: policy.spec.algorithm,
                limit: policy.spec.limit.get(),
                window_secs: policy.spec.window.as_secs_f64(),
                count_when: policy.count_when.as_ref().map(|c| c.status.iter().map(ToString::to_string).collect()),
                units: units_of(&policy.spec.cost),
                remaining: outcome.map(|o| o.before.remaining),
                reset_after_ms: outcome.map(|o| millis(o.before.reset_after)),
                admits: outcome.map(|o| o.admitted),
            }
        });
        Explanation {
            verdict,
            wait_ms: wait.map(millis),
            missing_key,
            require_signature,
            policies: explained.collect(),
            gates,
        }
    }
}

impl Explanation {
    /// A request `verdict` stops before any bucket is counted.
    fn stopped(verdict: Verdict, require_signature: bool) -> Self {
        let (kind, wait, missing_key) = describe(verdict);
        Self {
            verdict: Some(kind),
            wait_ms: wait.map(millis),
            missing_key,
            require_signature,
            policies: Vec::new(),
            gates: Vec::new(),
        }
    }
}

/// A verdict's kind, its wait, and the rule of a missing key.
fn describe(verdict: Verdict) -> (VerdictKind, Option<Duration>, Option<String>) {
    let (kind, wait) = (verdict.kind(), verdict.wait());
    let missing_key = match verdict {
        Verdict::MissingKey { rule } => Some(rule),
        _ => None,
    };
    (kind, wait, missing_key)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An [`Algorithm`] by the name the config gives it (`limiter-core` has no serde).
mod algorithm_name {
    use limiter_core::Algorithm;
    use serde::{Deserialize, Deserializer, Serializer, de};

    pub(super) fn serialize<S: Serializer>(algorithm: &Algorithm, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(algorithm.name())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Algorithm, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(de::Error::custom)
    }
}
