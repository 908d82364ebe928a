//! A rule's `concurrency`: each key's requests in flight bounded, the ones beyond
//! waiting in a bounded queue for as long as `queue_timeout`, refused (429) past it;
//! a client gone while queued never reaching the upstream; a reload that shrinks a
//! queue refusing its overflow and keeping what is in flight; shadow mode counting
//! and queueing nothing.

use std::time::Duration;

use http::StatusCode;
use limiter::{proxy::ProxyStats, signature::KeySecrets};
use limiter_lab::support::proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream, proxy_config};
use tokio::{io::AsyncWriteExt as _, sync::mpsc};

/// Rule `reports` on `/api/reports` by bearer key (`k-a`, `k-b` on plan `p`), with
/// `concurrency` keys as given; `extra` goes into `[proxy]`.
fn config(concurrency: &str, extra: &str) -> String {
    format!(
        "{PROXY_HEAD}{extra}\n[proxy.plans.p]\nlimit = 100000\nwindow = \"1m\"\n\
         [[proxy.keys]]\nid = \"k-a\"\nplan = \"p\"\nauth = \"bearer\"\n\
         [[proxy.keys]]\nid = \"k-b\"\nplan = \"p\"\nauth = \"bearer\"\n\
         [[proxy.rules]]\nname = \"reports\"\npath = \"/api/reports\"\nkey = \"api_key\"\n{concurrency}"
    )
}

/// Sends `n` GETs to `path` at once with `X-API-Key: key`, each on a connection of its
/// own; each reply goes to the channel as it comes.
fn send_at_once(proxy: &RunningProxy, path: &str, key: &'static str, n: usize) -> mpsc::UnboundedReceiver<Reply> {
    let (replies, received) = mpsc::unbounded_channel();
    for _ in 0..n {
        let url = proxy.url(path);
        let replies = replies.clone();
        tokio::spawn(async move {
            let _ = replies.send(TestClient::default().get(&url, &[("x-api-key", key)]).await);
        });
    }
    received
}

async fn take(received: &mut mpsc::UnboundedReceiver<Reply>, n: usize) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(received.recv().await.expect("a reply"));
    }
    replies
}

fn statuses(replies: &[Reply]) -> Vec<StatusCode> {
    let mut statuses: Vec<StatusCode> = replies.iter().map(|reply| reply.status).collect();
    statuses.sort();
    statuses
}

/// `reports`' requests in flight and queued.
fn gate(stats: &ProxyStats) -> (u64, u64) {
    stats.policies.iter().find(|policy| policy.name == "reports").map_or((0, 0), |p| (p.inflight, p.queued))
}

#[tokio::test]
async fn one_key_gets_four_in_flight_twenty_queued_and_the_rest_refused_at_once() {
    let upstream = Upstream::start().await;
    let proxy =
        RunningProxy::start(&config("concurrency = 4\nqueue = 20\nqueue_timeout = \"10s\"\n", ""), upstream.addr).await;
    let mut received = send_at_once(&proxy, "/api/reports/hold", "k-a", 30);
    // The upstream answers none of them yet: the six refusals come before any answer.
    let refused = take(&mut received, 6).await;
    assert_eq!(statuses(&refused), [StatusCode::TOO_MANY_REQUESTS; 6]);
    let body = refused[0].json();
    assert_eq!(body["type"], "https://limiter.dev/problems#concurrency-exceeded");
    assert_eq!(body["violated_policies"], serde_json::json!(["reports"]));
    assert_eq!(refused[0].header("retry-after"), "1");
    assert!(refused[0].header("ratelimit").ends_with(r#", "reports";r=0"#), "{}", refused[0].header("ratelimit"));
    proxy.stats_until("4 in flight, 20 queued", |stats| gate(stats) == (4, 20)).await;
    upstream.arrived(4).await;
    // Another key has places of its own.
    let mut other = send_at_once(&proxy, "/api/reports/hold", "k-b", 1);
    upstream.arrived(5).await;
    upstream.release(25);
    let served = take(&mut received, 24).await;
    assert_eq!(statuses(&served), [StatusCode::OK; 24]);
    // draft-11's concurrency form, after the plan's rate.
    let policy = served[0].header("ratelimit-policy");
    assert_eq!(policy, r#""p";q=100000;w=60, "reports";q=4;qu="concurrent-requests""#);
    assert_eq!(take(&mut other, 1).await[0].status, StatusCode::OK);
    assert_eq!((upstream.peak("k-a"), upstream.peak("k-b")), (4, 1));
    let counted = |stats: &ProxyStats| {
        let reports = stats.policies.iter().find(|policy| policy.name == "reports").expect("reports");
        let shed: Vec<_> =
            stats.shed.iter().map(|shed| (shed.reason.as_str().to_owned(), shed.plan.clone(), shed.count)).collect();
        (gate(stats), reports.forwarded, reports.rejected, reports.concurrency, shed)
    };
    let expected = ((0, 0), 25, 6, Some(4), vec![("queue_full".to_owned(), "p".to_owned(), 6)]);
    proxy.stats_until("every unit back, every request counted", |stats| counted(stats) == expected).await;
}

#[tokio::test]
async fn a_request_queued_past_queue_timeout_is_refused_with_retry_after() {
    let upstream = Upstream::start().await;
    let proxy =
        RunningProxy::start(&config("concurrency = 1\nqueue = 10\nqueue_timeout = \"900ms\"\n", ""), upstream.addr)
            .await;
    let mut received = send_at_once(&proxy, "/api/reports?delay_ms=500", "k-a", 5);
    let replies = take(&mut received, 5).await;
    // The first is answered after 500 ms and the second let in then; the others
    // would be let in after a second, past their 900 ms.
    let (served, refused): (Vec<&Reply>, Vec<&Reply>) =
        replies.iter().partition(|reply| reply.status == StatusCode::OK);
    assert_eq!((served.len(), refused.len()), (2, 3), "{:?}", statuses(&replies));
    for reply in refused {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.header("retry-after"), "1");
        assert!(
            reply.elapsed >= Duration::from_millis(900) && reply.elapsed < Duration::from_secs(5),
            "{:?}",
            reply.elapsed
        );
    }
    assert_eq!(upstream.count(), 2);
    let stats = proxy
        .stats_until("the three timeouts counted and every request's wait observed", |stats| {
            let shed: Vec<_> = stats.shed.iter().map(|shed| (shed.reason.as_str(), shed.count)).collect();
            let waits: u64 = stats.queue_wait_seconds.counts.iter().sum();
            shed == [("queue_timeout", 3)] && waits == 5
        })
        .await;
    assert!(stats.queue_wait_seconds.sum_seconds >= 3.0 * 0.9, "{:?}", stats.queue_wait_seconds);
}

#[tokio::test]
async fn a_client_gone_while_queued_leaves_the_queue_and_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy =
        RunningProxy::start(&config("concurrency = 1\nqueue = 5\nqueue_timeout = \"10s\"\n", ""), upstream.addr).await;
    let mut first = send_at_once(&proxy, "/api/reports/hold?n=1", "k-a", 1);
    upstream.arrived(1).await;
    let mut gone = tokio::net::TcpStream::connect(proxy.addr).await.expect("connect");
    let head = "GET /api/reports/hold?n=gone HTTP/1.1\r\nhost: x\r\nx-api-key: k-a\r\n\r\n";
    gone.write_all(head.as_bytes()).await.expect("send");
    proxy.stats_until("the request queued", |stats| gate(stats) == (1, 1)).await;
    drop(gone);
    proxy.stats_until("the queue empty again", |stats| gate(stats) == (1, 0)).await;
    // The one after it in line is served next: had the one gone been let in, it
    // would have reached the upstream first.
    let mut last = send_at_once(&proxy, "/api/reports/hold?n=3", "k-a", 1);
    proxy.stats_until("the next one queued", |stats| gate(stats) == (1, 1)).await;
    upstream.release(2);
    assert_eq!(take(&mut first, 1).await[0].status, StatusCode::OK);
    assert_eq!(take(&mut last, 1).await[0].status, StatusCode::OK);
    let seen: Vec<String> = upstream.seen().iter().map(|seen| seen.uri.to_string()).collect();
    assert_eq!(seen, ["/api/reports/hold?n=1", "/api/reports/hold?n=3"]);
    proxy.stats_until("every unit back", |stats| gate(stats) == (0, 0)).await;
}

#[tokio::test]
async fn a_reload_that_shrinks_the_queue_refuses_its_overflow_and_keeps_what_is_in_flight() {
    let upstream = Upstream::start().await;
    let before = config("concurrency = 1\nqueue = 3\nqueue_timeout = \"10s\"\n", "");
    let proxy = RunningProxy::start(&before, upstream.addr).await;
    let mut first = send_at_once(&proxy, "/api/reports/hold", "k-a", 1);
    upstream.arrived(1).await;
    let mut queued = send_at_once(&proxy, "/api/reports/hold", "k-a", 3);
    proxy.stats_until("three queued", |stats| gate(stats) == (1, 3)).await;
    let after = config("concurrency = 1\nqueue = 1\nqueue_timeout = \"10s\"\n", "");
    proxy.proxy.reconfigure(proxy_config(&after, upstream.addr), KeySecrets::default()).expect("reload");
    let overflow = take(&mut queued, 2).await;
    assert_eq!(statuses(&overflow), [StatusCode::TOO_MANY_REQUESTS; 2]);
    assert_eq!(overflow[0].json()["type"], "https://limiter.dev/problems#concurrency-exceeded");
    proxy.stats_until("one left queued", |stats| gate(stats) == (1, 1)).await;
    upstream.release(2);
    assert_eq!(take(&mut first, 1).await[0].status, StatusCode::OK, "the request in flight completes");
    assert_eq!(take(&mut queued, 1).await[0].status, StatusCode::OK, "the one kept in the queue is served");
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn shadow_mode_queues_nothing_and_counts_what_would_be_refused() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("concurrency = 1\nqueue = 1\n", "enforce = false\n"), upstream.addr).await;
    let mut received = send_at_once(&proxy, "/api/reports/hold", "k-a", 3);
    upstream.arrived(3).await;
    proxy
        .stats_until("all three in flight, the one past the queue counted as refused", |stats| {
            let reports = stats.policies.iter().find(|policy| policy.name == "reports").expect("reports");
            (gate(stats), reports.forwarded, reports.rejected, stats.rejected) == ((3, 0), 2, 1, 1)
        })
        .await;
    upstream.release(3);
    assert_eq!(statuses(&take(&mut received, 3).await), [StatusCode::OK; 3]);
}

/// Plans `pro` (priority 0) and `free` (the default, 10), a bearer key on each, and
/// `[proxy.upstream_capacity]` as given.
fn capacity_config(capacity: &str) -> String {
    format!(
        "{PROXY_HEAD}[proxy.upstream_capacity]\n{capacity}\
         [proxy.plans.pro]\nlimit = 100000\nwindow = \"1m\"\npriority = 0\n\
         [proxy.plans.free]\nlimit = 100000\nwindow = \"1m\"\n\
         [[proxy.keys]]\nid = \"k-pro\"\nplan = \"pro\"\nauth = \"bearer\"\n\
         [[proxy.keys]]\nid = \"k-free\"\nplan = \"free\"\nauth = \"bearer\"\n"
    )
}

fn upstream_gate(stats: &ProxyStats) -> (u64, u64) {
    (stats.upstream_inflight, stats.upstream_queued)
}

#[tokio::test]
async fn the_upstreams_queue_serves_pro_before_every_free_request_still_waiting() {
    let upstream = Upstream::start().await;
    let config = capacity_config("concurrency = 2\nqueue = 64\nqueue_timeout = \"30s\"\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut free = send_at_once(&proxy, "/hold", "k-free", 50);
    proxy.stats_until("2 free in flight, 48 queued", |stats| upstream_gate(stats) == (2, 48)).await;
    upstream.arrived(2).await;
    let mut pro = send_at_once(&proxy, "/hold", "k-pro", 5);
    proxy.stats_until("the 5 pro queued too", |stats| upstream_gate(stats) == (2, 53)).await;
    // One answer at a time, each place going to the next in line: arrival order is
    // the queue's order.
    for arrived in 3..=7 {
        upstream.release(1);
        upstream.arrived(arrived).await;
    }
    upstream.release(50);
    assert_eq!(statuses(&take(&mut pro, 5).await), [StatusCode::OK; 5]);
    assert_eq!(statuses(&take(&mut free, 50).await), [StatusCode::OK; 50]);
    let keys: Vec<String> = upstream
        .seen()
        .iter()
        .map(|seen| seen.headers.get("x-api-key").and_then(|key| key.to_str().ok()).unwrap_or_default().to_owned())
        .collect();
    let expected: Vec<&str> = [["k-free"; 2].as_slice(), &["k-pro"; 5], &["k-free"; 48]].concat();
    assert_eq!(keys, expected);
    // Never more than two at once: the two free first, then two pro.
    assert_eq!((upstream.peak("k-free"), upstream.peak("k-pro")), (2, 2));
}

#[tokio::test]
async fn the_upstreams_refusal_is_503_reduced_capacity_and_never_escalates_where_a_keys_own_429_does() {
    let upstream = Upstream::start().await;
    let rule = "[[proxy.rules]]\nname = \"reports\"\npath = \"/api/reports\"\nkey = \"api_key\"\nconcurrency = 1\n";
    let config = format!("{}{rule}", capacity_config("concurrency = 1\n"));
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, 1);
    let mut held = send_at_once(&proxy, "/hold", "k-free", 1);
    upstream.arrived(1).await;
    let client = TestClient::default();
    for _ in 0..3 {
        let refused = client.get(&proxy.url("/"), &[("x-api-key", "k-pro")]).await;
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.json()["type"], "https://limiter.dev/problems#temporary-reduced-capacity");
        assert_eq!(refused.header("retry-after"), "1");
    }
    limiter_lab::support::proxy::assert_not_escalated(&mut escalated, "the upstream's refusals");
    let shed = proxy.stats_until("three shed", |stats| !stats.shed.is_empty()).await.shed;
    let shed: Vec<_> = shed.iter().map(|s| (s.gate.as_str(), s.reason.as_str(), s.plan.as_str(), s.count)).collect();
    assert_eq!(shed, [("upstream", "queue_full", "pro", 3)]);
    upstream.release(1);
    assert_eq!(take(&mut held, 1).await[0].status, StatusCode::OK);
    proxy.stats_until("the upstream free", |stats| upstream_gate(stats) == (0, 0)).await;

    // A key's own concurrency is its own doing: refused twice past the threshold of 1.
    let mut report = send_at_once(&proxy, "/api/reports/hold", "k-free", 1);
    upstream.arrived(2).await;
    proxy.stats_until("the report in flight", |stats| gate(stats) == (1, 0)).await;
    let refused = client.get(&proxy.url("/api/reports"), &[("x-api-key", "k-free")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let again = client.get(&proxy.url("/api/reports"), &[("x-api-key", "k-free")]).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    let escalation =
        tokio::time::timeout(limiter_lab::support::wait::PATIENCE, escalated.recv()).await.expect("in time");
    assert!(escalation.is_some(), "the key's own refusals escalate");
    upstream.release(1);
    assert_eq!(take(&mut report, 1).await[0].status, StatusCode::OK);
}

/// A shed request is the rule's refusal alone, in the counts and the decision log.
#[tokio::test]
async fn a_shed_request_counts_for_its_rule_alone_and_is_logged_with_its_wait() {
    let log = std::env::temp_dir().join(format!("{}.jsonl", limiter_lab::support::unique("shed")));
    let extra = format!("decision_log = {{ path = \"{}\" }}\n", log.display());
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config("concurrency = 1\n", &extra), upstream.addr).await;
    let mut held = send_at_once(&proxy, "/api/reports/hold", "k-a", 1);
    proxy.stats_until("one in flight", |stats| gate(stats) == (1, 0)).await;
    let refused = TestClient::default().get(&proxy.url("/api/reports"), &[("x-api-key", "k-a")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let counts = |stats: &ProxyStats| -> Vec<(String, u64, u64)> {
        stats.policies.iter().map(|p| (p.name.clone(), p.forwarded, p.rejected)).collect()
    };
    let expected = [("reports".to_owned(), 1, 1), ("p".to_owned(), 1, 0)];
    proxy.stats_until("the refusal the rule's alone", |stats| counts(stats) == expected).await;
    let lines = limiter_lab::support::wait::until_async(
        "two lines in the decision log",
        || std::fs::read_to_string(&log).unwrap_or_default(),
        |text| text.lines().count() == 2 && text.ends_with('\n'),
    )
    .await;
    let lines: Vec<serde_json::Value> = lines.lines().map(|line| serde_json::from_str(line).expect("JSON")).collect();
    let seen: Vec<_> = lines.iter().map(|line| (line["verdict"].clone(), line["violated"].clone())).collect();
    let expected = [("forward", serde_json::json!([])), ("reject", serde_json::json!(["reports"]))];
    assert_eq!(seen, expected.map(|(verdict, violated)| (serde_json::json!(verdict), violated)));
    assert!(lines.iter().all(|line| line["queued_ms"] == 0), "{lines:?}");
    upstream.release(1);
    assert_eq!(take(&mut held, 1).await[0].status, StatusCode::OK);
}

#[tokio::test]
async fn the_upstreams_capacity_reloads_live() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&capacity_config("concurrency = 1\n"), upstream.addr).await;
    let mut held = send_at_once(&proxy, "/hold", "k-free", 1);
    upstream.arrived(1).await;
    let client = TestClient::default();
    assert_eq!(client.get(&proxy.url("/"), &[]).await.status, StatusCode::SERVICE_UNAVAILABLE);
    let wider = capacity_config("concurrency = 2\n");
    proxy.proxy.reconfigure(proxy_config(&wider, upstream.addr), KeySecrets::default()).expect("reload");
    assert_eq!(client.get(&proxy.url("/"), &[]).await.status, StatusCode::OK, "a second place, at once");
    proxy.proxy.reconfigure(proxy_config(PROXY_HEAD, upstream.addr), KeySecrets::default()).expect("reload");
    let mut more = send_at_once(&proxy, "/hold", "k-free", 3);
    upstream.arrived(4).await;
    // All four at the upstream, none waiting: nothing bounds it any more.
    proxy.stats_until("none queued, unbounded without the section", |stats| upstream_gate(stats).1 == 0).await;
    upstream.release(4);
    assert_eq!(take(&mut held, 1).await[0].status, StatusCode::OK);
    assert_eq!(statuses(&take(&mut more, 3).await), [StatusCode::OK; 3]);
}
