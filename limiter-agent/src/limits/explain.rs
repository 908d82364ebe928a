//! `limiter explain` at the engine: which rules and plan would count a request, under
//! which key, and what each one's quota is now. It looks at the buckets through the
//! store's check-only step, so explaining never spends a request's quota.

use std::time::Duration;

use limiter_core::{Clock, limits::Charge};
use serde::Serialize;

use super::engine::{Engine, RequestInfo, Verdict, decision};

/// One request, explained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    /// What the request would get now: `forward`, `delay`, `reject`, `missing_key` or
    /// `store_unavailable`; `None` when the quotas were not looked up.
    pub verdict: Option<&'static str>,
    /// The wait a `delay` would impose, or a `reject`'s `Retry-After`, in ms.
    pub wait_ms: Option<u64>,
    /// The rule whose key is missing (`missing_key = "reject"`).
    pub missing_key: Option<String>,
    /// Some matching rule has `require_signature = true`.
    pub require_signature: bool,
    /// Every rule that matches, then the key's plan, in the order they are checked.
    pub policies: Vec<ExplainedPolicy>,
}

/// One rule or plan that would count the request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExplainedPolicy {
    /// `rule` or `plan`.
    pub kind: &'static str,
    pub name: String,
    /// The bucket the request would be counted in (`ip=…`, `api_key=…`, `header=…`,
    /// `<missing>`).
    pub key: String,
    pub algorithm: &'static str,
    pub limit: u32,
    pub window_secs: f64,
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
            Err(verdict) => {
                let (name, wait, missing_key) = describe(verdict);
                return Explanation {
                    verdict: Some(name),
                    wait_ms: wait.map(millis),
                    missing_key,
                    require_signature,
                    policies: Vec::new(),
                };
            }
        };
        let outcomes = if live { self.apply(&counted, Charge::Nothing).await } else { None };
        let verdict = match &outcomes {
            Some(outcomes) => Some(decision(&counted, outcomes, require_signature).verdict),
            None if live => Some(policies.store_failed(require_signature).verdict),
            None => None,
        };
        let (verdict, wait, missing_key) = match verdict.map(describe) {
            Some((name, wait, missing_key)) => (Some(name), wait, missing_key),
            None => (None, None, None),
        };
        let explained = counted.iter().enumerate().map(|(i, (policy, key))| {
            let outcome = outcomes.as_ref().and_then(|o| o.get(i));
            ExplainedPolicy {
                kind: policy.kind,
                name: policy.name.clone(),
                key: key.clone(),
                algorithm: policy.spec.algorithm.name(),
                limit: policy.spec.limit.get(),
                window_secs: policy.spec.window.as_secs_f64(),
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
        }
    }
}

/// A verdict's name, its wait, and the rule of a missing key.
fn describe(verdict: Verdict) -> (&'static str, Option<Duration>, Option<String>) {
    match verdict {
        Verdict::Forward => ("forward", None, None),
        Verdict::Delay(delay) => ("delay", Some(delay), None),
        Verdict::Reject { retry_after } => ("reject", Some(retry_after), None),
        Verdict::MissingKey { rule } => ("missing_key", None, Some(rule)),
        Verdict::StoreUnavailable => ("store_unavailable", None, None),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
