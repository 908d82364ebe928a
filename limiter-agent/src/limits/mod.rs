//! Per-key request limits for the proxy: the engine that turns rules and plans into
//! one decision, over the algorithms of `limiter_core` and the buckets of
//! [`crate::backend::Limits`] (memory or the fleet's Redis).
//!
//! Deviations from the interface below, kept minimal:
//! - `plan_of` returns `Option<String>`: the config sits behind a lock that a reload
//!   swaps, so a borrow of it cannot outlive the call.
//! - Additions: `Engine` is `Debug`; `MISSING_KEY`, `MAX_KEY_VALUE`; the algorithm
//!   modules with `Outcome`/`Quota` and `MemoryStore` (in `limiter_core::limits`);
//!   `explain`, `policy_counts`.
//!
//! Meanings the interface leaves open (details in `engine.rs` and each algorithm):
//! - On `Reject`, `policies` carry each quota as it stands (nothing was charged); on
//!   `MissingKey`, `policies` and `violated` are empty (nothing was counted).
//! - `remaining` is always the number of requests that would pass back to back now
//!   (for a leaky-bucket shaper: places left in its queue); `reset_after` is the time
//!   until the bucket is back in full, which for the sliding window counter can reach
//!   two windows.
//! - `penalize` takes one unit from each matching IP-keyed bucket that has one.
//!
//! - `decide` and `penalize` are async (the store may be Redis); `Verdict` has
//!   `StoreUnavailable` for `store_failure = "deny"` during an outage.
//!
//! INTERFACE (shared by `limits/` and `proxy/`):
//!
//! ```text
//! pub trait Clock: Send + Sync + 'static { fn now(&self) -> Duration /* since UNIX epoch */ }
//! pub struct SystemClock;  pub struct FakeClock (advance(), set())
//!
//! pub struct RequestInfo<'a> {
//!     pub method: &'a http::Method,
//!     pub path: &'a str,                 // path only, no query
//!     pub client: std::net::IpAddr,      // already resolved through trusted proxies
//!     pub api_key: Option<&'a str>,      // raw X-API-Key header value
//!     pub headers: &'a http::HeaderMap,
//! }
//!
//! pub struct Engine<C: Clock> { .. }
//! impl<C: Clock> Engine<C> {
//!     pub fn new(config: &ProxyConfig, clock: C, stores: Arc<Stores>) -> Self;
//!     /// Swap rules/plans; state of rules and plans whose identity (name + key spec
//!     /// + algorithm + window) is unchanged is kept (a changed `limit` keeps counts).
//!     pub fn reconfigure(&self, config: &ProxyConfig);
//!     /// Check every matching rule and the key's plan; if none rejects, charge all of
//!     /// them, atomically with respect to concurrent calls. A rejected request is
//!     /// charged to nothing.
//!     pub async fn decide(&self, request: &RequestInfo<'_>) -> Decision;
//!     /// Charge the IP-keyed rules matching this request whatever their verdict
//!     /// (used for failed signatures, so guessing is rate limited).
//!     pub async fn penalize(&self, request: &RequestInfo<'_>);
//!     /// The key's plan name if the API key is known.
//!     pub fn plan_of(&self, api_key: &str) -> Option<String>;
//!     pub fn tracked_keys(&self) -> usize;
//!     pub fn evictions(&self) -> u64;
//! }
//!
//! pub struct Decision {
//!     pub verdict: Verdict,
//!     /// One entry per rule/plan that counted the request, for the response headers.
//!     pub policies: Vec<PolicyStatus>,
//!     /// Names of the policies that rejected (problem+json body).
//!     pub violated: Vec<String>,
//!     /// Some matching rule has require_signature = true.
//!     pub require_signature: bool,
//! }
//! pub enum Verdict {
//!     Forward,
//!     Delay(Duration),                 // throttle band or leaky-bucket queue
//!     Reject { retry_after: Duration },// 429
//!     MissingKey { rule: String },     // missing_key = "reject": 401 (api_key) / 400 (header)
//!     StoreUnavailable,                // store_failure = "deny" while Redis is down: 503
//! }
//! pub struct PolicyStatus {
//!     pub name: String,        // rule name, or plan name for a plan
//!     pub limit: u32,          // quota q
//!     pub window: Duration,    // w
//!     pub remaining: u64,      // r, after this request
//!     pub reset_after: Duration, // t: real time until capacity returns
//! }
//! ```

pub mod engine;
pub mod explain;
pub mod observe;

#[cfg(test)]
mod engine_tests;

pub use self::{
    engine::{Decision, Engine, PolicyCounts, PolicyStatus, RequestInfo, Screened, Suggestion, Verdict},
    explain::{ExplainedPolicy, Explanation},
};
