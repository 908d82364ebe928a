//! The proxy's limits through real sockets: plans, throttle bands, sensitive routes,
//! combined rules, concurrency, trusted proxies, shadow mode and reload.

use std::time::Duration;

use http::{Method, StatusCode};
use limiter::signature::KeySecrets;
use limiter_core::Clock as _;
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, proxy_config};

limiter_lab::over_http1_and_http2!(
    free_key_is_throttled_then_rejected_and_pro_key_is_unaffected,
    sixth_login_post_from_one_ip_is_rejected_but_get_is_not,
    per_ip_and_per_key_rules_on_one_route_either_rejects,
    concurrent_requests_on_one_key_forward_exactly_the_limit,
    shadow_mode_forwards_everything_with_headers_and_counts,
    a_missing_key_is_refused_when_configured_so,
);

const FREE_AND_PRO: &str = r#"
[proxy.plans.free]
limit = 100
window = "1m"
throttle_from = 80
throttle_delay = "100ms"
[proxy.plans.pro]
limit = 1000
window = "1m"
throttle_from = 900
throttle_delay = "100ms"
[[proxy.keys]]
id = "k-free"
plan = "free"
auth = "bearer"
[[proxy.keys]]
id = "k-pro"
plan = "pro"
auth = "bearer"
"#;

async fn free_key_is_throttled_then_rejected_and_pro_key_is_unaffected(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{FREE_AND_PRO}"), upstream.addr).await;
    let delay = Duration::from_millis(100);

    let mut replies = Vec::new();
    for _ in 0..105 {
        replies.push(client.get(&proxy.url("/api"), &[("x-api-key", "k-free")]).await);
    }

    for (i, reply) in replies.iter().enumerate() {
        let n = i + 1;
        let expected = if n <= 100 { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
        assert_eq!(reply.status, expected, "request {n}");
        assert_eq!(reply.header("ratelimit-policy"), r#""free";q=100;w=60"#, "request {n}");
        assert_eq!(reply.header("x-ratelimit-limit"), "100", "request {n}");
        assert_eq!(reply.header("x-ratelimit-remaining"), (100 - n.min(100)).to_string(), "request {n}");
        // That no other request was delayed, the count of throttled ones says below: a
        // request's time on a loaded machine says nothing of the sort.
        if (81..=100).contains(&n) {
            assert!(reply.elapsed >= delay, "request {n} took {:?}, inside the throttle band", reply.elapsed);
        }
    }
    for reply in &replies[100..] {
        // The proxy's clock stands still, wherever in its minute the test started: all
        // 100 are in that window, which the next still weighs until 0.6 s into it
        // (100 × 59.4/60 + 1 ≤ 100), so a start just after the minute turned waits 60.6 s.
        let retry_after: u64 = reply.header("retry-after").parse().expect("Retry-After in seconds");
        assert!((1..=61).contains(&retry_after), "Retry-After {retry_after}");
        assert_eq!(reply.header("content-type"), "application/problem+json");
        let problem = reply.json();
        assert_eq!(problem["type"], "https://limiter.dev/problems#quota-exceeded");
        assert_eq!(problem["status"], 429);
        assert_eq!(problem["violated_policies"], serde_json::json!(["free"]));
        assert!(problem["title"].is_string() && problem["detail"].is_string());
        let reset: u64 = reply.header("x-ratelimit-reset").parse().expect("reset in unix seconds");
        let now = proxy.clock.now().as_secs();
        // A sliding window counter is back in full once this window and the next
        // (which still weighs this one) have passed.
        assert!(reset > now && reset <= now + 121, "reset {reset} now {now}");
        assert!(reply.header("ratelimit").starts_with(r#""free";r=0;t="#), "{}", reply.header("ratelimit"));
    }
    assert_eq!(upstream.count(), 100);

    let pro = client.get(&proxy.url("/api"), &[("x-api-key", "k-pro")]).await;
    assert_eq!(pro.status, StatusCode::OK);
    assert_eq!(pro.header("x-ratelimit-remaining"), "999");

    // Delayed: the 20 of the throttle band, and neither a free request inside the
    // limit nor the pro key's.
    proxy
        .stats_until("every request counted", |stats| {
            (stats.requests, stats.forwarded, stats.throttled, stats.rejected) == (106, 101, 20, 5)
        })
        .await;

    // Two windows on, the free key has its whole quota back, on the proxy's clock.
    proxy.clock.advance(Duration::from_secs(120));
    let back = client.get(&proxy.url("/api"), &[("x-api-key", "k-free")]).await;
    assert_eq!(back.status, StatusCode::OK);
    assert_eq!(back.header("x-ratelimit-remaining"), "99");
}

async fn sixth_login_post_from_one_ip_is_rejected_but_get_is_not(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    for n in 1..=5 {
        let reply = client.request(Method::POST, &proxy.url("/login"), &[], b"user=a").await;
        assert_eq!(reply.status, StatusCode::OK, "POST {n}");
    }
    let sixth = client.request(Method::POST, &proxy.url("/login"), &[], b"user=a").await;
    assert_eq!(sixth.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sixth.json()["violated_policies"], serde_json::json!(["login"]));
    let get = client.get(&proxy.url("/login"), &[]).await;
    assert_eq!(get.status, StatusCode::OK);
    assert!(get.headers.get("ratelimit").is_none(), "no rule counted the GET");
    assert_eq!(upstream.count(), 6);
}

async fn per_ip_and_per_key_rules_on_one_route_either_rejects(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}
trusted_proxies = ["127.0.0.1/32"]
[proxy.plans.basic]
limit = 1000
window = "1m"
[[proxy.keys]]
id = "k1"
plan = "basic"
auth = "bearer"
[[proxy.keys]]
id = "k2"
plan = "basic"
auth = "bearer"
[[proxy.rules]]
name = "per-ip"
path = "/api"
key = "ip"
algorithm = "sliding_window_log"
limit = 3
window = "1m"
[[proxy.rules]]
name = "per-key"
path = "/api"
key = "api_key"
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let url = proxy.url("/api");

    // One key from many addresses: the key's limit trips.
    for n in 1..=5 {
        let ip = format!("192.0.2.{n}");
        let reply = client.get(&url, &[("x-api-key", "k1"), ("x-forwarded-for", &ip)]).await;
        assert_eq!(reply.status, StatusCode::OK, "k1 request {n}");
    }
    let over_key = client.get(&url, &[("x-api-key", "k1"), ("x-forwarded-for", "192.0.2.6")]).await;
    assert_eq!(over_key.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over_key.json()["violated_policies"], serde_json::json!(["per-key"]));

    // One address with a fresh key: the address's limit trips.
    for n in 1..=3 {
        let reply = client.get(&url, &[("x-api-key", "k2"), ("x-forwarded-for", "198.51.100.1")]).await;
        assert_eq!(reply.status, StatusCode::OK, "k2 request {n}");
    }
    let over_ip = client.get(&url, &[("x-api-key", "k2"), ("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(over_ip.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over_ip.json()["violated_policies"], serde_json::json!(["per-ip"]));
    assert!(over_ip.header("ratelimit-policy").contains(r#""per-ip";q=3;w=60"#));
    assert!(over_ip.header("ratelimit-policy").contains(r#""per-key";q=5;w=60"#));
    assert_eq!(upstream.count(), 8);
}

async fn concurrent_requests_on_one_key_forward_exactly_the_limit(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}
[proxy.plans.small]
limit = 50
window = "1m"
[[proxy.keys]]
id = "k-small"
plan = "small"
auth = "bearer"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let answered = two_hundred_at_once(&proxy, || client.clone(), &[("x-api-key", "k-small")]).await;
    assert_eq!(answered, (50, 150));
    assert_eq!(upstream.count(), 50);
}

/// 200 GETs of `/api` at once, each from the client `client` makes: how many got 200
/// and how many 429.
async fn two_hundred_at_once(
    proxy: &RunningProxy,
    client: impl Fn() -> TestClient,
    headers: &'static [(&'static str, &'static str)],
) -> (usize, usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (client, url) = (client(), proxy.url("/api"));
        tasks.spawn(async move { client.get(&url, headers).await.status });
    }
    let statuses = tasks.join_all().await;
    let count = |status: StatusCode| statuses.iter().filter(|s| **s == status).count();
    (count(StatusCode::OK), count(StatusCode::TOO_MANY_REQUESTS))
}

/// The workers share one store: a limit holds exactly over connections served on
/// four threads at once.
#[tokio::test]
async fn a_limit_holds_exactly_across_workers() {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}workers = 4
[[proxy.rules]]
name = "api"
path = "/api"
key = "ip"
algorithm = "fixed_window"
limit = 50
window = "1m"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // A client, so a connection, of its own for each request: the four workers take
    // their shares.
    assert_eq!(two_hundred_at_once(&proxy, TestClient::default, &[]).await, (50, 150));
    assert_eq!(upstream.count(), 50);
    proxy.shutdown().await;
}

const PER_IP_2: &str = r#"
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "sliding_window_log"
limit = 2
window = "1m"
"#;

#[tokio::test]
async fn forwarded_for_from_an_untrusted_peer_does_not_change_the_key() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{PER_IP_2}"), upstream.addr).await;
    let client = TestClient::default();
    let statuses = [
        client.get(&proxy.url("/"), &[("x-forwarded-for", "203.0.113.1")]).await.status,
        client.get(&proxy.url("/"), &[("x-forwarded-for", "203.0.113.2")]).await.status,
        client.get(&proxy.url("/"), &[("x-forwarded-for", "203.0.113.3")]).await.status,
    ];
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    // The upstream hears only what we saw, not what the client claimed.
    let forwarded: Vec<_> = upstream.seen().iter().map(|s| s.headers["x-forwarded-for"].clone()).collect();
    assert_eq!(forwarded, ["127.0.0.1", "127.0.0.1"]);
}

#[tokio::test]
async fn forwarded_for_from_a_trusted_peer_sets_the_key() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}trusted_proxies = [\"127.0.0.1/32\"]\n{PER_IP_2}");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    for n in 1..=3 {
        let ip = format!("203.0.113.{n}");
        let reply = client.get(&proxy.url("/"), &[("x-forwarded-for", &ip)]).await;
        assert_eq!(reply.status, StatusCode::OK, "client {ip}");
    }
    let same = [
        client.get(&proxy.url("/"), &[("x-forwarded-for", "198.51.100.9, 203.0.113.1")]).await.status,
        client.get(&proxy.url("/"), &[("x-forwarded-for", "203.0.113.1")]).await.status,
    ];
    assert_eq!(same, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS], "third and fourth from 203.0.113.1");
    let last = &upstream.seen()[3];
    assert_eq!(last.headers["x-forwarded-for"], "198.51.100.9, 203.0.113.1, 127.0.0.1");
}

async fn shadow_mode_forwards_everything_with_headers_and_counts(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}
enforce = false
[proxy.plans.tiny]
limit = 3
window = "1m"
throttle_from = 2
throttle_delay = "5s"
[[proxy.keys]]
id = "k-tiny"
plan = "tiny"
auth = "bearer"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut remaining = Vec::new();
    for n in 1..=5 {
        let reply = client.get(&proxy.url("/"), &[("x-api-key", "k-tiny")]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert!(reply.elapsed < Duration::from_secs(5), "request {n} was delayed");
        assert_eq!(reply.header("ratelimit-policy"), r#""tiny";q=3;w=60"#);
        remaining.push(reply.header("x-ratelimit-remaining").to_owned());
    }
    assert_eq!(remaining, ["2", "1", "0", "0", "0"]);
    assert_eq!(upstream.count(), 5);
    proxy
        .stats_until("what enforcing would have done", |stats| {
            (stats.forwarded, stats.throttled, stats.rejected) == (5, 1, 2)
        })
        .await;
}

/// The article's "100 ms more for every N excess requests": past `throttle_from`,
/// each `throttle_step` requests add `throttle_delay` again, up to
/// `throttle_max_delay`. Before, every request in the band waited 100 ms alike.
#[tokio::test]
async fn a_progressive_band_grows_its_delay_every_step_up_to_its_cap() {
    let upstream = Upstream::start().await;
    let config = format!(
        "{PROXY_HEAD}[[proxy.rules]]\nname = \"search\"\npath = \"/search\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\n\
         limit = 100\nwindow = \"1m\"\nthrottle_from = 3\nthrottle_delay = \"100ms\"\nthrottle_step = 2\n\
         throttle_max_delay = \"250ms\"\n"
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let mut elapsed = Vec::new();
    for n in 1..=11 {
        let reply = client.get(&proxy.url("/search"), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        elapsed.push(reply.elapsed);
    }
    // Requests 4–5 are 1–2 beyond the band's start, 6–7 are 3–4, and from 8 on the
    // step's 300 ms and more are capped.
    let at_least = [0, 0, 0, 100, 100, 200, 200, 250, 250, 250, 250].map(Duration::from_millis);
    for (n, (took, least)) in elapsed.iter().zip(at_least).enumerate() {
        assert!(*took >= least, "request {} took {took:?}, less than {least:?}", n + 1);
    }
    // Uncapped, the last two would wait 400 ms.
    for (n, took) in elapsed.iter().enumerate().skip(9) {
        assert!(*took < Duration::from_millis(400), "request {} took {took:?}: not capped", n + 1);
    }
    proxy
        .stats_until("the 8 requests of the band delayed", |stats| (stats.forwarded, stats.throttled) == (11, 8))
        .await;
}

#[tokio::test]
async fn reload_changes_a_limit_and_keeps_the_counts() {
    let upstream = Upstream::start().await;
    let plan = |limit: u32| {
        format!(
            "{PROXY_HEAD}[proxy.plans.free]\nlimit = {limit}\nwindow = \"1m\"\n[[proxy.keys]]\nid = \"k\"\nplan = \"free\"\nauth = \"bearer\"\n"
        )
    };
    let proxy = RunningProxy::start(&plan(5), upstream.addr).await;
    let client = TestClient::default();
    let key = [("x-api-key", "k")];
    for _ in 0..4 {
        assert_eq!(client.get(&proxy.url("/"), &key).await.status, StatusCode::OK);
    }
    proxy.proxy.reconfigure(proxy_config(&plan(6), upstream.addr), KeySecrets::default()).expect("reload");
    let fifth = client.get(&proxy.url("/"), &key).await;
    assert_eq!(fifth.status, StatusCode::OK);
    assert_eq!(fifth.header("x-ratelimit-remaining"), "1", "4 counted before the reload, 1 after, of 6");
    assert_eq!(client.get(&proxy.url("/"), &key).await.status, StatusCode::OK);
    assert_eq!(client.get(&proxy.url("/"), &key).await.status, StatusCode::TOO_MANY_REQUESTS);
}

async fn a_missing_key_is_refused_when_configured_so(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}
missing_key = "reject"
[proxy.plans.basic]
limit = 10
window = "1m"
[[proxy.keys]]
id = "k"
plan = "basic"
auth = "bearer"
[[proxy.rules]]
name = "per-key"
path = "/api"
key = "api_key"
limit = 10
window = "1m"
[[proxy.rules]]
name = "per-tenant"
path = "/tenant"
key = "header:x-tenant"
limit = 10
window = "1m"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let no_key = client.get(&proxy.url("/api"), &[]).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.json()["type"], "https://limiter.dev/problems#missing-key");
    let no_header = client.get(&proxy.url("/tenant"), &[]).await;
    assert_eq!(no_header.status, StatusCode::BAD_REQUEST);
    assert_eq!(client.get(&proxy.url("/api"), &[("x-api-key", "k")]).await.status, StatusCode::OK);
    assert_eq!(client.get(&proxy.url("/tenant"), &[("x-tenant", "t1")]).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 2);
    proxy.stats_until("both refusals counted", |stats| stats.rejected == 2).await;
}

/// Issue 25 item 8: a flood of new keys once evicted the fullest-soonest bucket, which
/// handed a brute-forcer's exhausted `login` bucket back full. One bucket per shard
/// (64 of them): the flood reaches the brute-forcer's shard for certain.
#[tokio::test]
async fn a_flood_of_new_keys_does_not_hand_back_an_exhausted_login_bucket() {
    let upstream = Upstream::start().await;
    let config = format!(
        r#"{PROXY_HEAD}max_tracked_keys = 64
[[proxy.rules]]
name = "login"
path = "/login"
key = "header:x-user"
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let login = |user: String| {
        let (client, url) = (&client, proxy.url("/login"));
        async move { client.request(Method::POST, &url, &[("x-user", &user)], b"password=guess").await.status }
    };
    for n in 1..=5 {
        assert_eq!(login("alice".into()).await, StatusCode::OK, "guess {n}");
    }
    assert_eq!(login("alice".into()).await, StatusCode::TOO_MANY_REQUESTS, "guess 6");
    proxy.clock.advance(Duration::from_secs(50));
    let mut refused = 0;
    for i in 0..2_000 {
        match login(format!("flood-{i}")).await {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("flood {i}: {other}"),
        }
    }
    // 2 000 keys over 64 shards: that none reaches alice's is a chance of 1 in 10^13.
    assert!(refused > 0, "no new key was refused: the exhausted bucket was evicted");
    assert_eq!(login("alice".into()).await, StatusCode::TOO_MANY_REQUESTS, "alice still exhausted");
    // Every other new key evicted one, but the first in each of the 63 other shards.
    let evicted = 2_000 - 63 - refused;
    proxy
        .stats_until("the refused new keys and the evictions counted", |stats| {
            (stats.untracked_keys, stats.evictions) == (refused, evicted)
        })
        .await;
    proxy.clock.advance(Duration::from_secs(10));
    assert_eq!(login("alice".into()).await, StatusCode::OK, "her window over, she may try again");
}
