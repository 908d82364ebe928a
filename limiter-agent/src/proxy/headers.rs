//! The rate-limit headers of every counted response:
//! `X-RateLimit-*` from the most restrictive policy, and `RateLimit-Policy` /
//! `RateLimit` per draft-ietf-httpapi-ratelimit-headers-11, as much as `disclose`
//! allows: every policy by name (`full`), the most restrictive one under the neutral
//! name [`NEUTRAL_NAME`] (`minimal`), or nothing (`none`).

use std::{
    cmp::Reverse,
    fmt::Write as _,
    hash::{BuildHasher as _, RandomState},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::{config::proxy::Disclose, limits::PolicyStatus};

/// The one policy `disclose = "minimal"` lists, whatever it is called.
pub(super) const NEUTRAL_NAME: &str = "limit";

static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up: a client that waits this long finds capacity back.
pub(super) fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// `proxy.retry_after_jitter`'s random draws: splitmix64 over a counter, seeded once,
/// so that workers share it without a lock (a retry's second is no secret).
#[derive(Debug)]
pub(super) struct Spread(AtomicU64);

/// splitmix64's step.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Spread {
    /// Draws that follow from `seed`, for the tests.
    pub(super) fn seeded(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    /// Seeded from the process's random hash keys.
    pub(super) fn random() -> Self {
        Self::seeded(RandomState::new().hash_one(0u8))
    }

    /// A draw in `[0, 1)`.
    fn unit(&self) -> f64 {
        let mut z = self.0.fetch_add(GOLDEN, Ordering::Relaxed).wrapping_add(GOLDEN);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits, exactly representable.
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `retry_after` moved at random by up to `share` of itself either way, never
    /// below a second; `share = 0`: as it is. Only `Retry-After` is spread: the reset
    /// headers say when a window turns, which is a fact, not advice.
    pub(super) fn retry_after(&self, retry_after: Duration, share: f64) -> Duration {
        if share == 0.0 {
            return retry_after;
        }
        let factor = 1.0 + share * (2.0 * self.unit() - 1.0);
        retry_after.mul_f64(factor).max(Duration::from_secs(1))
    }
}

/// Adds the headers for the policies that counted a request; none if none did.
/// `now` is the limiter's clock, time since the UNIX epoch.
pub(super) fn add_rate_limit_headers(
    headers: &mut HeaderMap,
    policies: &[PolicyStatus],
    now: Duration,
    disclose: Disclose,
) {
    // Lowest remaining is what the client runs into first; on a tie, the one that
    // takes longer to recover.
    let Some(tightest) = policies.iter().min_by_key(|p| (p.remaining, Reverse(p.reset_after))) else {
        return;
    };
    let neutral;
    let listed = match disclose {
        Disclose::None => return,
        Disclose::Minimal => {
            neutral = [PolicyStatus { name: NEUTRAL_NAME.to_owned(), ..tightest.clone() }];
            &neutral[..]
        }
        Disclose::Full => policies,
    };
    let now_secs = now.as_secs();
    headers.insert(X_LIMIT.clone(), HeaderValue::from(tightest.limit));
    headers.insert(X_REMAINING.clone(), HeaderValue::from(tightest.remaining));
    headers.insert(X_RESET.clone(), HeaderValue::from(now_secs.saturating_add(ceil_secs(tightest.reset_after))));

    let mut policy = String::new();
    let mut state = String::new();
    for (i, status) in listed.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        let name = sf_string(&status.name);
        // Writing to a String cannot fail.
        let _ = write!(policy, "{separator}{name};q={};w={}", status.limit, ceil_secs(status.window));
        let _ = write!(state, "{separator}{name};r={};t={}", status.remaining, ceil_secs(status.reset_after));
    }
    for (name, value) in [(&POLICY, policy), (&RATELIMIT, state)] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name.clone(), value);
        }
    }
}

/// A rule's `concurrency` for the request's key, for the headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ConcurrencyStatus {
    pub name: String,
    /// `q`: the key's requests in flight at most.
    pub limit: u32,
    /// `r`: places left now.
    pub remaining: u64,
}

/// Adds each rule's `concurrency` to `RateLimit-Policy` and `RateLimit` in the draft's
/// concurrency form (`"reports";q=4;qu="concurrent-requests"`, `"reports";r=1`), after
/// the rate policies: only with `disclose = "full"`, since `minimal` names one policy,
/// the tightest rate, and a concurrency is no rate.
pub(super) fn add_concurrency_policies(headers: &mut HeaderMap, concurrent: &[ConcurrencyStatus], disclose: Disclose) {
    if disclose != Disclose::Full || concurrent.is_empty() {
        return;
    }
    let policy = concurrent
        .iter()
        .map(|status| format!("{};q={};qu=\"concurrent-requests\"", sf_string(&status.name), status.limit));
    let state = concurrent.iter().map(|status| format!("{};r={}", sf_string(&status.name), status.remaining));
    append_items(headers, &POLICY, policy);
    append_items(headers, &RATELIMIT, state);
}

/// Appends `items` to the list `name` holds (if any), comma separated.
fn append_items(headers: &mut HeaderMap, name: &HeaderName, items: impl Iterator<Item = String>) {
    let mut list: Vec<String> =
        headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned).into_iter().collect();
    list.extend(items);
    if let Ok(value) = HeaderValue::try_from(list.join(", ")) {
        headers.insert(name.clone(), value);
    }
}

/// A structured-field string (RFC 8941 §3.3.3): quoted, `"` and `\` escaped. Policy
/// names come from the config; characters a string cannot hold become `?`.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, limit: u32, remaining: u64, reset_ms: u64) -> PolicyStatus {
        PolicyStatus {
            name: name.to_owned(),
            limit,
            window: Duration::from_secs(60),
            remaining,
            reset_after: Duration::from_millis(reset_ms),
        }
    }

    fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
        headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("<absent>")
    }

    #[test]
    fn retry_after_jitter_stays_within_its_share_and_above_a_second() {
        let spread = Spread::seeded(7);
        let draws: Vec<Duration> = (0..1000).map(|_| spread.retry_after(Duration::from_secs(60), 0.1)).collect();
        assert!(draws.iter().all(|d| (54.0..=66.0).contains(&d.as_secs_f64())), "{draws:?}");
        let seconds: std::collections::BTreeSet<u64> = draws.iter().map(|d| ceil_secs(*d)).collect();
        assert!(seconds.len() >= 10, "spread over the whole band: {seconds:?}");
        assert!(seconds.first().is_some_and(|&s| s <= 55) && seconds.last().is_some_and(|&s| s >= 65), "{seconds:?}");
        // The same seed draws the same.
        let again = Spread::seeded(7);
        assert_eq!(again.retry_after(Duration::from_secs(60), 0.1), draws[0]);
        // Never below a second; no jitter, no change.
        assert!((0..100).all(|_| spread.retry_after(Duration::from_millis(1050), 0.5) >= Duration::from_secs(1)));
        assert_eq!(spread.retry_after(Duration::from_millis(300), 0.0), Duration::from_millis(300));
    }

    #[test]
    fn lists_every_policy_and_takes_x_headers_from_the_tightest() {
        let mut headers = HeaderMap::new();
        let now = Duration::from_secs(1_700_000_000);
        let policies = [policy("free", 100, 17, 41_200), policy("per-ip", 10, 3, 5_000)];
        add_rate_limit_headers(&mut headers, &policies, now, Disclose::Full);
        assert_eq!(header(&headers, "ratelimit-policy"), r#""free";q=100;w=60, "per-ip";q=10;w=60"#);
        assert_eq!(header(&headers, "ratelimit"), r#""free";r=17;t=42, "per-ip";r=3;t=5"#);
        assert_eq!(header(&headers, "x-ratelimit-limit"), "10");
        assert_eq!(header(&headers, "x-ratelimit-remaining"), "3");
        assert_eq!(header(&headers, "x-ratelimit-reset"), "1700000005");
    }

    #[test]
    fn no_policies_no_headers() {
        let mut headers = HeaderMap::new();
        add_rate_limit_headers(&mut headers, &[], Duration::from_secs(1_700_000_000), Disclose::Full);
        assert!(headers.is_empty());
    }

    /// `minimal`: the tightest policy alone, its name replaced; `none`: nothing.
    #[test]
    fn minimal_shows_the_tightest_policy_unnamed_and_none_shows_nothing() {
        let now = Duration::from_secs(1_700_000_000);
        let policies = [policy("free", 100, 17, 41_200), policy("per-ip", 10, 3, 5_000)];
        let mut headers = HeaderMap::new();
        add_rate_limit_headers(&mut headers, &policies, now, Disclose::Minimal);
        assert_eq!(header(&headers, "ratelimit-policy"), r#""limit";q=10;w=60"#);
        assert_eq!(header(&headers, "ratelimit"), r#""limit";r=3;t=5"#);
        assert_eq!(header(&headers, "x-ratelimit-limit"), "10");
        assert_eq!(header(&headers, "x-ratelimit-remaining"), "3");
        assert_eq!(header(&headers, "x-ratelimit-reset"), "1700000005");
        assert_eq!(headers.len(), 5);
        let mut headers = HeaderMap::new();
        add_rate_limit_headers(&mut headers, &policies, now, Disclose::None);
        assert!(headers.is_empty());
    }

    #[test]
    fn a_concurrency_is_listed_in_the_drafts_form_after_the_rates_and_only_in_full() {
        let now = Duration::from_secs(1_700_000_000);
        let reports = [ConcurrencyStatus { name: "reports".to_owned(), limit: 4, remaining: 1 }];
        let mut headers = HeaderMap::new();
        add_rate_limit_headers(&mut headers, &[policy("free", 100, 17, 41_200)], now, Disclose::Full);
        add_concurrency_policies(&mut headers, &reports, Disclose::Full);
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            r#""free";q=100;w=60, "reports";q=4;qu="concurrent-requests""#
        );
        assert_eq!(header(&headers, "ratelimit"), r#""free";r=17;t=42, "reports";r=1"#);
        let mut alone = HeaderMap::new();
        add_concurrency_policies(&mut alone, &reports, Disclose::Full);
        assert_eq!(header(&alone, "ratelimit-policy"), r#""reports";q=4;qu="concurrent-requests""#);
        assert_eq!(alone.len(), 2, "no X-RateLimit-* without a rate");
        for disclose in [Disclose::Minimal, Disclose::None] {
            let mut headers = HeaderMap::new();
            add_concurrency_policies(&mut headers, &reports, disclose);
            assert!(headers.is_empty(), "{disclose:?}");
        }
    }

    #[test]
    fn names_are_quoted_and_escaped() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("café\n"), r#""caf??""#);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
    }
}
