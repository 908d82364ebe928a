//! `count_when`: a rule that counts only the upstream's failures, through real
//! sockets and a real upstream (which answers `?status=N` with that status, after
//! `?delay_ms=N`). A request takes its unit before it is forwarded and gets it back
//! when the answer is not one the rule counts: successes cost nothing, and failures
//! in flight together still never pass the limit.

use http::{Method, StatusCode};
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, posted_at_once};

/// The issue's rule: 5 failed logins an hour per client address.
const FAILED_LOGINS: &str = r#"
[[proxy.rules]]
name = "failed-logins-per-user"
path = "/login"
methods = ["POST"]
key = "ip"
limit = 5
window = "1h"
count_when = { status = ["401", "403"] }
"#;

/// A login POSTed by `client`, answered by the upstream with `query`'s status.
async fn login(client: &TestClient, proxy: &RunningProxy, query: &str) -> StatusCode {
    client.request(Method::POST, &proxy.url(&format!("/login{query}")), &[], b"user=alice").await.status
}

#[tokio::test]
async fn successful_logins_cost_nothing_and_the_sixth_attempt_after_five_failures_is_refused() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{FAILED_LOGINS}"), upstream.addr).await;
    let client = TestClient::default();
    for i in 0..30 {
        assert_eq!(login(&client, &proxy, "").await, StatusCode::OK, "success {i}");
    }
    let failures = [("?status=401", StatusCode::UNAUTHORIZED), ("?status=403", StatusCode::FORBIDDEN)];
    for i in 0..5 {
        let (query, status) = failures[i % 2];
        assert_eq!(login(&client, &proxy, query).await, status, "failure {i}: the upstream's own answer");
    }
    assert_eq!(login(&client, &proxy, "").await, StatusCode::TOO_MANY_REQUESTS, "the sixth attempt");
    assert_eq!(login(&client, &proxy, "?status=401").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(client.get(&proxy.url("/login"), &[]).await.status, StatusCode::OK, "the rule is for POSTs");
    assert_eq!(upstream.count(), 36);
    let stats = proxy.stats_until("30 refunds", |stats| stats.refunded == 30 && stats.rejected == 2).await;
    assert_eq!(stats.forwarded, 36);
}

#[tokio::test]
async fn ten_failing_logins_at_once_take_the_five_units_and_no_more_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{FAILED_LOGINS}"), upstream.addr).await;
    let statuses = posted_at_once((0..10).map(|_| proxy.url("/login?status=401&delay_ms=300")), &[]).await;
    let count = |status: StatusCode| statuses.iter().filter(|s| **s == status).count();
    assert_eq!((count(StatusCode::UNAUTHORIZED), count(StatusCode::TOO_MANY_REQUESTS)), (5, 5), "{statuses:?}");
    assert_eq!(upstream.count(), 5, "exactly the five holding a unit reached the upstream");
    let client = TestClient::default();
    assert_eq!(login(&client, &proxy, "").await, StatusCode::TOO_MANY_REQUESTS, "all five failures counted");
    assert_eq!(proxy.proxy.stats().refunded, 0);
}

/// In shadow mode every attempt is forwarded; the would-be refusals are counted from
/// the failures alone, as enforcing would.
#[tokio::test]
async fn in_shadow_mode_failures_alone_count_towards_the_would_be_refusals() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}enforce = false\n{FAILED_LOGINS}");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    for _ in 0..10 {
        assert_eq!(login(&client, &proxy, "").await, StatusCode::OK);
    }
    for _ in 0..8 {
        assert_eq!(login(&client, &proxy, "?status=401").await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(upstream.count(), 18);
    proxy.stats_until("10 refunds and 3 would-be refusals", |stats| stats.refunded == 10 && stats.rejected == 3).await;
}
