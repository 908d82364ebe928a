//! Costs through real sockets: a rule's `cost = N` taken at once, a post-paid
//! `cost_from` charged from the upstream's `X-Request-Cost` header (which the client
//! never sees) or from the milliseconds the upstream took. The upstream answers
//! `?cost=N` with that header and `?delay_ms=N` that much later.

use http::StatusCode;
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream};

limiter_lab::over_http1_and_http2!(
    a_cost_of_five_leaves_fifteen_ten_five_nothing_then_refuses,
    a_response_header_cost_is_charged_into_debt_and_never_reaches_the_client,
);

const SEARCH: &str = r#"
[[proxy.rules]]
name = "search"
path = "/search"
key = "ip"
limit = 20
window = "1m"
cost = 5
"#;

async fn a_cost_of_five_leaves_fifteen_ten_five_nothing_then_refuses(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{SEARCH}"), upstream.addr).await;
    for left in ["15", "10", "5", "0"] {
        let reply = client.get(&proxy.url("/search"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{left} left");
        assert_eq!(reply.header("x-ratelimit-limit"), "20");
        assert_eq!(reply.header("x-ratelimit-remaining"), left);
    }
    let refused = client.get(&proxy.url("/search"), &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-ratelimit-remaining"), "0");
    assert_eq!(upstream.count(), 4);
}

const METERED: &str = r#"
[[proxy.rules]]
name = "metered"
path = "/llm"
key = "ip"
limit = 20
window = "1m"
cost_from = { response_header = "x-request-cost", max = 1000 }

[[proxy.rules]]
name = "shown"
path = "/shown"
key = "ip"
limit = 20
window = "1m"
cost_from = { response_header = "x-request-cost", max = 1000, strip = false }
"#;

/// `x-request-cost: 7` against 20 units: 20 → 13 → 6 → −1, so the fourth is refused;
/// each answer's headers show the balance once charged (0 for the debt).
async fn a_response_header_cost_is_charged_into_debt_and_never_reaches_the_client(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{METERED}"), upstream.addr).await;
    for (i, left) in ["13", "6", "0"].into_iter().enumerate() {
        let reply = client.get(&proxy.url("/llm?cost=7"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {}", i + 1);
        assert_eq!(reply.header("x-ratelimit-remaining"), left, "request {}", i + 1);
        assert_eq!(reply.header("x-request-cost"), "<absent>", "stripped");
    }
    let refused = client.get(&proxy.url("/llm?cost=7"), &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "in debt by one unit");
    assert_eq!(refused.header("x-ratelimit-remaining"), "0");
    assert_eq!(upstream.count(), 3);
    // `strip = false` leaves it to the client; a value past `max`, or one that is no
    // number, costs `max`.
    let shown = client.get(&proxy.url("/shown?cost=5000"), &[]).await;
    assert_eq!((shown.status, shown.header("x-request-cost")), (StatusCode::OK, "5000"));
    proxy
        .stats_until("4 post-paid charges and the refusal", |stats| stats.post_paid_charges == 4 && stats.rejected == 1)
        .await;
    assert_eq!(client.get(&proxy.url("/shown"), &[]).await.status, StatusCode::TOO_MANY_REQUESTS, "1000 > 20");
}

const UPSTREAM_MS: &str = r#"
[[proxy.rules]]
name = "compute"
path = "/slow"
key = "ip"
limit = 1000
window = "1m"
cost_from = { upstream_ms = true, max = 100 }
"#;

/// A 100 ms upstream and 1 000 ms a minute: each request is charged at least 100 (its
/// upstream's milliseconds, clamped here to `max = 100` so that the count is exact
/// whatever the machine's load), once its response has ended; after ten the balance
/// is spent and the eleventh is refused.
#[tokio::test]
async fn the_upstreams_milliseconds_are_charged_when_the_response_ends() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{UPSTREAM_MS}"), upstream.addr).await;
    let client = TestClient::default();
    for i in 0..10 {
        let reply = client.get(&proxy.url("/slow?delay_ms=100"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {}", i + 1);
        assert_eq!(reply.header("x-ratelimit-remaining"), (1000 - 100 * i).to_string(), "request {}", i + 1);
        // Charged after the body ended, which the client may see first.
        proxy.stats_until("the charge", |stats| stats.post_paid_charges == i + 1).await;
    }
    let refused = client.get(&proxy.url("/slow?delay_ms=100"), &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "the eleventh");
    assert_eq!(upstream.count(), 10);
}

/// A client that cancels its request before the head (an HTTP/2 reset) cannot leave
/// the upstream's work unpaid: its request is charged `max` (15 here).
#[tokio::test]
async fn a_request_cancelled_before_its_head_is_charged_the_most() {
    let upstream = Upstream::start().await;
    let proxy =
        RunningProxy::start(&format!("{PROXY_HEAD}{}", METERED.replace("max = 1000 }", "max = 15 }")), upstream.addr)
            .await;
    let url = proxy.url("/llm?delay_ms=5000&cost=1");
    let client = TestClient::h2c();
    let cancelled = tokio::spawn(async move { client.get(&url, &[]).await });
    upstream.arrived(1).await;
    cancelled.abort();
    proxy.stats_until("the cancelled request's charge", |stats| stats.post_paid_charges == 1).await;
    let reply = TestClient::default().get(&proxy.url("/llm?cost=1"), &[]).await;
    assert_eq!((reply.status, reply.header("x-ratelimit-remaining")), (StatusCode::OK, "4"), "20 − 15 − its own 1");
}
