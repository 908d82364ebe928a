//! Several quotas per plan, calendar windows and rules for some plans only, through
//! real sockets (issue 29, section 1).

use std::time::Duration;

use http::StatusCode;
use limiter::proxy::ProxyStats;
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream};

limiter_lab::over_http1_and_http2!(
    the_41st_request_in_a_second_on_pro_is_refused_by_burst,
    a_free_keys_6th_export_in_a_day_is_refused_and_pro_and_keyless_requests_are_not_counted,
);

/// The issue's plans: pro with three quotas, free with one, and `free-exports`.
const TIERS: &str = r#"
[proxy.plans.pro]
limits = [
  { name = "burst",   limit = 20,        window = "1s", algorithm = "token_bucket", burst = 40 },
  { name = "minute",  limit = 1_000,     window = "1m", throttle_from = 900, throttle_delay = "50ms" },
  { name = "monthly", limit = 1_000_000, window = "month", algorithm = "fixed_window" },
]
calendar_tz = "UTC"
[proxy.plans.free]
limit = 100
window = "1m"
[[proxy.keys]]
id = "k-pro"
plan = "pro"
auth = "bearer"
[[proxy.keys]]
id = "k-free"
plan = "free"
auth = "bearer"
[[proxy.rules]]
name = "free-exports"
path = "/api/export"
key = "api_key"
plans = ["free"]
limit = 5
window = "day"
"#;

/// What policy `name` forwarded and refused.
fn counts(stats: &ProxyStats, name: &str) -> Option<(u64, u64)> {
    stats.policies.iter().find(|policy| policy.name == name).map(|policy| (policy.forwarded, policy.rejected))
}

async fn the_41st_request_in_a_second_on_pro_is_refused_by_burst(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{TIERS}"), upstream.addr).await;
    // The proxy's clock stands still: all 41 are in one second.
    let mut replies = Vec::new();
    for _ in 0..41 {
        replies.push(client.get(&proxy.url("/api"), &[("x-api-key", "k-pro")]).await);
    }
    for (i, reply) in replies[..40].iter().enumerate() {
        assert_eq!(reply.status, StatusCode::OK, "request {}", i + 1);
    }
    let refused = &replies[40];
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.json()["violated_policies"], serde_json::json!(["pro.burst"]));
    assert_eq!(
        refused.header("ratelimit-policy"),
        r#""pro.burst";q=20;w=1, "pro.minute";q=1000;w=60, "pro.monthly";q=1000000;w=2592000"#
    );
    // Refused by one quota, charged to none: the other two stand at 40 taken.
    let state = refused.header("ratelimit");
    assert!(state.starts_with(r#""pro.burst";r=0;t="#), "{state}");
    assert!(state.contains(r#""pro.minute";r=960;"#) && state.contains(r#""pro.monthly";r=999960;"#), "{state}");
    assert_eq!(refused.header("x-ratelimit-remaining"), "0");
    proxy
        .stats_until("the refusal counted for burst alone, the other two at 40 forwarded", |stats| {
            counts(stats, "pro.burst") == Some((40, 1))
                && ["pro.minute", "pro.monthly"].iter().all(|name| counts(stats, name) == Some((40, 0)))
        })
        .await;
    assert_eq!(upstream.count(), 40);
    proxy.shutdown().await;
}

async fn a_free_keys_6th_export_in_a_day_is_refused_and_pro_and_keyless_requests_are_not_counted(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{TIERS}"), upstream.addr).await;
    let export = proxy.url("/api/export");
    for n in 1..=5 {
        let reply = client.get(&export, &[("x-api-key", "k-free")]).await;
        assert_eq!(reply.status, StatusCode::OK, "export {n}");
        assert!(reply.header("ratelimit-policy").contains(r#""free-exports";q=5;w=86400"#));
    }
    let sixth = client.get(&export, &[("x-api-key", "k-free")]).await;
    assert_eq!(sixth.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sixth.json()["violated_policies"], serde_json::json!(["free-exports"]));
    for _ in 0..10 {
        let pro = client.get(&export, &[("x-api-key", "k-pro")]).await;
        assert_eq!(pro.status, StatusCode::OK);
        assert!(!pro.header("ratelimit-policy").contains("free-exports"), "{}", pro.header("ratelimit-policy"));
    }
    let keyless = client.get(&export, &[]).await;
    assert_eq!(keyless.status, StatusCode::OK);
    assert_eq!(keyless.header("ratelimit-policy"), "<absent>", "nothing counted a keyless export");
    proxy
        .stats_until("the exports counted, free-exports only the free key's", |stats| {
            counts(stats, "pro.burst") == Some((10, 0))
                && counts(stats, "free") == Some((5, 0))
                && counts(stats, "free-exports") == Some((5, 1))
        })
        .await;
    assert_eq!(upstream.count(), 16);
    proxy.shutdown().await;
}

/// 2027-01-31T23:59:50Z.
const END_OF_JANUARY: Duration = Duration::from_secs(1_801_439_990);

/// The issue's test on the proxy's fake clock: a monthly quota spent ten seconds
/// before February says so in the headers, and is full again at midnight.
#[tokio::test]
async fn a_spent_monthly_quota_points_at_the_first_of_the_month_and_is_full_there() {
    let upstream = Upstream::start().await;
    let plan = r#"
[proxy.plans.metered]
limits = [{ name = "monthly", limit = 3, window = "month" }]
[[proxy.keys]]
id = "k-metered"
plan = "metered"
auth = "bearer"
"#;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{plan}"), upstream.addr).await;
    proxy.clock.set(END_OF_JANUARY);
    let client = TestClient::default();
    let key = [("x-api-key", "k-metered")];
    for n in 1..=3 {
        assert_eq!(client.get(&proxy.url("/"), &key).await.status, StatusCode::OK, "request {n}");
    }
    let refused = client.get(&proxy.url("/"), &key).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-ratelimit-reset"), "1801440000");
    assert_eq!(refused.header("retry-after"), "10");
    proxy.clock.set(END_OF_JANUARY + Duration::from_secs(10));
    let february = client.get(&proxy.url("/"), &key).await;
    assert_eq!(february.status, StatusCode::OK);
    assert_eq!(february.header("x-ratelimit-remaining"), "2");
    proxy.shutdown().await;
}
