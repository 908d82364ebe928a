//! Per-key request limits for the proxy: the engine that turns rules and plans into
//! one decision, over the algorithms of `limiter_core` and the buckets of
//! [`crate::backend::Limits`] (memory or the fleet's Redis).
//!
//! [`Engine::decide`] checks every rule matching a [`RequestInfo`] (a rule with `plans`
//! only for the keys on them) and every limit of the plan of the key it proved; if none
//! refuses it charges all of them, atomically with respect to
//! concurrent calls, and a refused request is charged to nothing. What the engine
//! promises beyond its types:
//! - [`RequestInfo::api_key`] is the id of the key the request *proved* (a valid
//!   signature, or a bearer key's id), never the raw `X-API-Key` value: a client that
//!   only knows a key id cannot spend that key's plan.
//! - On `Reject`, [`Decision::policies`] carry each quota as it stands (nothing was
//!   charged); on `MissingKey`, `policies` and `violated` are empty (nothing was
//!   counted).
//! - `remaining` is always the number of requests that would pass back to back now
//!   (for a leaky-bucket shaper: places left in its queue); `reset_after` is the time
//!   until the bucket is back in full, which for the sliding window counter can reach
//!   two windows.
//! - A `count_when` rule's charge is taken as any other, and [`Decision::refundable`]
//!   carries it: [`Engine::refund`] gives it back once the upstream's answer is one the
//!   rule does not count.
//! - [`Engine::penalize`] takes one request's cost from each matching IP-keyed
//!   bucket that has it left (failed signatures, so that guessing is rate limited).
//! - A request takes each bucket's `cost` in units (`remaining` counts units then); a
//!   `cost_from` bucket takes none at admission, and [`Decision::owed`] carries what
//!   [`Engine::charge_owed`] charges once the answer says, into debt if need be.
//! - The state of rules and plans whose identity (kind, name, key, algorithm and
//!   window) a reload keeps is kept; a changed `limit` keeps the counts.
//! - `decide` and `penalize` are async: the store may be Redis, and
//!   [`Verdict::StoreUnavailable`] is `store_failure = "deny"` during its outage.

pub mod engine;
pub mod explain;
pub mod observe;

#[cfg(test)]
mod engine_tests;

pub use self::{
    engine::{
        Decision, Engine, Holder, Owed, PolicyCounts, PolicyStatus, Refundable, RequestInfo, Screened, Suggestion,
        Verdict, VerdictKind,
    },
    explain::Explanation,
};
