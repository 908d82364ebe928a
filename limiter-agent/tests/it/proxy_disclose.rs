//! `proxy.disclose`: what the rate-limit headers and refusals tell a client about the
//! policies, at each level and per plan, through real sockets.

use http::{Method, StatusCode};
use limiter_lab::support::proxy::{Reply, RunningProxy, TestClient, Upstream};

/// One request a minute per IP under `/api`, a plan for every key, and a `paid` plan
/// that sets its own level.
fn config(disclose: &str) -> String {
    format!(
        r#"[proxy]
listen = "127.0.0.1:0"
upstream = "http://{{upstream}}"
disclose = "{disclose}"
[proxy.plans.basic]
algorithm = "fixed_window"
limit = 100
window = "1m"
[proxy.plans.paid]
limit = 1000
window = "1m"
disclose = "full"
[[proxy.keys]]
id = "k-basic"
plan = "basic"
auth = "bearer"
[[proxy.keys]]
id = "k-paid"
plan = "paid"
auth = "bearer"
[[proxy.rules]]
name = "per-ip"
path = "/api"
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1m"
"#
    )
}

const RATE_LIMIT_HEADERS: [&str; 6] =
    ["ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"];

/// The rate-limit headers of a reply that are present, by name.
fn shown(reply: &Reply) -> Vec<&'static str> {
    RATE_LIMIT_HEADERS.into_iter().filter(|name| reply.headers.contains_key(*name)).collect()
}

/// The first request (admitted) and the second (refused) from one client with `key`,
/// at the start of a minute (fixed windows are aligned to the epoch).
async fn twice(proxy: &RunningProxy, key: &str) -> (Reply, Reply) {
    proxy.clock.set(std::time::Duration::from_secs(1_800_000_000));
    let client = TestClient::default();
    let headers = [("x-api-key", key)];
    let first = client.request(Method::GET, &proxy.url("/api/items"), &headers, b"").await;
    let second = client.request(Method::GET, &proxy.url("/api/items"), &headers, b"").await;
    assert_eq!((first.status, second.status), (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS));
    (first, second)
}

#[tokio::test]
async fn full_names_every_policy_and_the_one_that_refused() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("full"), upstream.addr).await;
    let (admitted, refused) = twice(&proxy, "k-basic").await;
    assert_eq!(admitted.header("ratelimit-policy"), r#""per-ip";q=1;w=60, "basic";q=100;w=60"#);
    assert_eq!(admitted.header("ratelimit"), r#""per-ip";r=0;t=60, "basic";r=99;t=60"#);
    assert_eq!(shown(&admitted), &RATE_LIMIT_HEADERS[..5]);
    assert_eq!(shown(&refused), RATE_LIMIT_HEADERS);
    assert_eq!(refused.json()["violated_policies"], serde_json::json!(["per-ip"]));
}

/// The default: a client learns its tightest quota, and nothing it could map the
/// operator's policies with.
#[tokio::test]
async fn minimal_shows_only_the_tightest_policy_under_a_neutral_name() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("minimal").replace("disclose = \"minimal\"\n", ""), upstream.addr).await;
    let (admitted, refused) = twice(&proxy, "k-basic").await;
    assert_eq!(admitted.header("ratelimit-policy"), r#""limit";q=1;w=60"#);
    assert_eq!(admitted.header("ratelimit"), r#""limit";r=0;t=60"#);
    assert_eq!((admitted.header("x-ratelimit-limit"), admitted.header("x-ratelimit-remaining")), ("1", "0"));
    assert_eq!(shown(&admitted), &RATE_LIMIT_HEADERS[..5]);
    assert_eq!(shown(&refused), RATE_LIMIT_HEADERS);
    assert_eq!(refused.header("ratelimit-policy"), r#""limit";q=1;w=60"#);
    let body = refused.json();
    assert!(body.get("violated_policies").is_none(), "{body}");
    let text = String::from_utf8_lossy(&refused.body);
    assert!(!text.contains("per-ip") && !text.contains("basic"), "{text}");
}

#[tokio::test]
async fn none_sends_retry_after_on_a_429_and_nothing_else() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("none"), upstream.addr).await;
    let (admitted, refused) = twice(&proxy, "k-basic").await;
    assert!(shown(&admitted).is_empty(), "{:?}", admitted.headers);
    assert_eq!(shown(&refused), ["retry-after"]);
    assert_eq!(refused.header("retry-after"), "60");
    assert!(refused.json().get("violated_policies").is_none());
}

/// A plan may tell its own clients more (or less) than the proxy's level.
#[tokio::test]
async fn a_plan_sets_its_own_level_for_its_keys() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("none"), upstream.addr).await;
    let (admitted, refused) = twice(&proxy, "k-paid").await;
    assert_eq!(admitted.header("ratelimit-policy"), r#""per-ip";q=1;w=60, "paid";q=1000;w=60"#);
    assert_eq!(refused.json()["violated_policies"], serde_json::json!(["per-ip"]));
}
