//! Suspicious-pattern rules through real sockets: the shipped `config/patterns.toml`
//! against scanner and probe requests and against ordinary ones, `tag` rules, a
//! pathological input for a pattern, which denials escalate, and a reload of the set.

use std::time::Instant;

use http::{Method, StatusCode};
use limiter::proxy::ProxyStats;
use limiter::signature::KeySecrets;
use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, proxy_config},
    wait::PATIENCE,
};

const PATTERNS: &str = include_str!("../../../config/patterns.toml");
const BROWSER: &str = "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0";

async fn status(client: &TestClient, proxy: &RunningProxy, path: &str, user_agent: Option<&str>) -> StatusCode {
    let headers: Vec<(&str, &str)> = user_agent.map(|ua| ("user-agent", ua)).into_iter().collect();
    client.request(Method::GET, &proxy.url(path), &headers, b"").await.status
}

#[tokio::test]
async fn the_shipped_patterns_deny_scanners_and_probes_and_pass_ordinary_requests() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{PATTERNS}"), upstream.addr).await;
    let client = TestClient::default();
    let denied = [
        ("/api/items", None, "no-user-agent"),
        ("/api/items", Some("   "), "empty-user-agent"),
        ("/api/items", Some("sqlmap/1.7.2#stable (https://sqlmap.org)"), "scanner-user-agents"),
        ("/", Some("Mozilla/5.00 (Nikto/2.5.0) (Evasions:None)"), "scanner-user-agents"),
        (
            "/api/items",
            Some("Nuclei - Open-source project (github.com/projectdiscovery/nuclei)"),
            "scanner-user-agents",
        ),
        ("/.env", Some(BROWSER), "dotenv-probe"),
        ("/%2eenv", Some(BROWSER), "dotenv-probe"),
        ("/static/../.env", Some(BROWSER), "dotenv-probe"),
        ("/.git/config", Some(BROWSER), "dotfile-probe"),
        ("/wp-login.php", Some(BROWSER), "wordpress-probe"),
        ("/WP-ADMIN/install.php", Some(BROWSER), "wordpress-probe"),
        ("/index.php", Some(BROWSER), "php-probe"),
        ("/download?file=../../etc/passwd", Some(BROWSER), "traversal-probe"),
        ("/download?file=%2E%2E%2F%2E%2E%2Fwin.ini", Some(BROWSER), "traversal-probe"),
        ("/a/b/../../etc/passwd", Some(BROWSER), "passwd-probe"),
    ];
    for (path, user_agent, rule) in denied {
        let headers: Vec<(&str, &str)> = user_agent.map(|ua| ("user-agent", ua)).into_iter().collect();
        let reply = client.request(Method::GET, &proxy.url(path), &headers, b"").await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path} {user_agent:?}");
        assert_eq!(reply.json()["type"], "https://limiter.dev/problems#denied", "{path}");
        assert_eq!(reply.json()["detail"], format!("The request is refused by rule `{rule}`."), "{path}");
    }
    let passed = [
        ("/api/items", BROWSER),
        ("/api/items?sort=name&page=2", "curl/8.5.0"),
        ("/envelope", BROWSER),
        ("/api/environment", "python-requests/2.31"),
        ("/docs/php-vs-rust.html", BROWSER),
        ("/download?file=report..2024.pdf", BROWSER),
        ("/api/items", "Go-http-client/1.1"),
    ];
    for (path, user_agent) in passed {
        assert_eq!(status(&client, &proxy, path, Some(user_agent)).await, StatusCode::OK, "{path} {user_agent}");
    }
    assert_eq!(upstream.count(), passed.len());
    proxy
        .stats_until("every denial counted, by rule", |stats| {
            let by = |name| denied_by(stats, name);
            stats.denied == denied.len() as u64
                && (by("scanner-user-agents"), by("dotenv-probe"), by("traversal-probe")) == (Some(3), Some(3), Some(2))
        })
        .await;
}

/// What the rule `name` denied.
fn denied_by(stats: &ProxyStats, name: &str) -> Option<u64> {
    stats.policies.iter().find(|p| p.name == name).map(|p| p.denied)
}

/// Header, query parameter, body size, method and client conditions together; a
/// `tag` rule counts and lets through; shadow mode counts a denial and forwards.
#[tokio::test]
async fn conditions_combine_and_tag_rules_only_count() {
    let upstream = Upstream::start().await;
    let rules = r#"
[[proxy.rules]]
name = "debug-from-outside"
action = "deny"
methods = ["POST"]
[proxy.rules.when]
query_params = ["debug"]
headers_present = ["x-forwarded-host"]
body_larger_than = 4
clients = ["127.0.0.0/8"]
[[proxy.rules]]
name = "curl-watch"
action = "tag"
[proxy.rules.when]
header_matches = { "user-agent" = '^curl/' }
"#;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{rules}"), upstream.addr).await;
    let client = TestClient::default();
    let post = |path: &'static str, headers: Vec<(&'static str, &'static str)>, body: &'static [u8]| {
        let (client, url) = (client.clone(), proxy.url(path));
        async move { client.request(Method::POST, &url, &headers, body).await.status }
    };
    let host = ("x-forwarded-host", "evil.example");
    assert_eq!(post("/x?debug", vec![host], b"12345").await, StatusCode::FORBIDDEN);
    assert_eq!(post("/x?a=1&%64ebug=1", vec![host], b"12345").await, StatusCode::FORBIDDEN, "encoded name");
    // Each condition missing in turn: forwarded.
    assert_eq!(post("/x", vec![host], b"12345").await, StatusCode::OK);
    assert_eq!(post("/x?debug", vec![], b"12345").await, StatusCode::OK);
    assert_eq!(post("/x?debug", vec![host], b"1234").await, StatusCode::OK);
    let get = client.request(Method::GET, &proxy.url("/x?debug"), &[host], b"").await;
    assert_eq!(get.status, StatusCode::OK);

    for _ in 0..3 {
        assert_eq!(status(&client, &proxy, "/x", Some("curl/8.5.0")).await, StatusCode::OK);
    }
    proxy
        .stats_until("the denials and tags counted", |stats| {
            let counts = |name: &str| stats.policies.iter().find(|p| p.name == name).map(|p| (p.denied, p.tagged));
            (counts("debug-from-outside"), counts("curl-watch")) == (Some((2, 0)), Some((0, 3)))
        })
        .await;

    let shadow = RunningProxy::start(&format!("{PROXY_HEAD}enforce = false\n{rules}"), upstream.addr).await;
    let reply = client.request(Method::POST, &shadow.url("/x?debug"), &[host], b"12345").await;
    assert_eq!(reply.status, StatusCode::OK, "shadow mode counts and forwards");
    shadow.stats_until("the denial counted", |stats| stats.denied == 1).await;
}

/// A pattern that a backtracking engine takes exponential time over (`(a|aa)*c` on
/// a long run of `a`s) costs the regex crate time linear in the input: the request
/// is answered at once.
#[tokio::test]
async fn a_pathological_input_does_not_slow_the_proxy() {
    let upstream = Upstream::start().await;
    let rules = "[[proxy.rules]]\nname = \"evil\"\naction = \"deny\"\n[proxy.rules.when]\n\
                 header_matches = { \"x-probe\" = '^(a|aa)*c$' }\n";
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{rules}"), upstream.addr).await;
    let client = TestClient::default();
    let long = "a".repeat(32 * 1024);
    let started = Instant::now();
    let reply = tokio::time::timeout(
        PATIENCE,
        client.request(Method::GET, &proxy.url("/"), &[("x-probe", long.as_str()), ("user-agent", BROWSER)], b""),
    )
    .await
    .expect("answered while a backtracking engine would still be matching");
    assert_eq!(reply.status, StatusCode::OK);
    let matching = format!("{long}c");
    let reply = client.request(Method::GET, &proxy.url("/"), &[("x-probe", matching.as_str())], b"").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    eprintln!("32 KiB of a against ^(a|aa)*c$: answered in {:?}", started.elapsed());
}

/// A page can make its readers' browsers ask for any path, never send a scanner's
/// User-Agent: the shipped path rules' denials do not escalate, the User-Agent
/// rules' (`escalate = true`) do. The escalator counts a denial before it is
/// answered, so the channel shows it once the client has its answer.
#[tokio::test]
async fn only_denials_by_escalating_rules_count_towards_escalation() {
    let upstream = Upstream::start().await;
    let head = format!("{PROXY_HEAD}{PATTERNS}");
    let proxy = RunningProxy::start(&head, upstream.addr).await;
    let mut escalated = proxy.escalate(&head, upstream.addr, 2);
    let client = TestClient::default();
    for path in ["/wp-login.php", "/.env", "/.git/config", "/index.php"].repeat(15) {
        assert_eq!(status(&client, &proxy, path, Some(BROWSER)).await, StatusCode::FORBIDDEN, "{path}");
    }
    assert!(escalated.try_recv().is_err(), "60 denials by path rules escalated");
    proxy.stats_until("the denials not escalated", |stats| stats.refusals_not_escalated == 60).await;
    for _ in 0..2 {
        assert_eq!(status(&client, &proxy, "/api/items", Some("sqlmap/1.7.2")).await, StatusCode::FORBIDDEN);
    }
    assert!(escalated.try_recv().is_err(), "escalated before the threshold");
    assert_eq!(status(&client, &proxy, "/api/items", None).await, StatusCode::FORBIDDEN);
    let escalation =
        tokio::time::timeout(PATIENCE, escalated.recv()).await.expect("escalated in time").expect("escalation");
    assert_eq!(escalation.cidr.to_string(), "127.0.0.1/32");
}

/// The pattern set reloads live: a rule added denies at once, one removed stops, and
/// a rule that stays keeps its counts.
#[tokio::test]
async fn the_pattern_set_reloads_live() {
    let upstream = Upstream::start().await;
    let dotenv = "[[proxy.rules]]\nname = \"dotenv-probe\"\naction = \"deny\"\npath = \"/.env\"\n";
    let wordpress = "[[proxy.rules]]\nname = \"wordpress-probe\"\naction = \"deny\"\npath = \"/wp-login.php\"\n";
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{dotenv}"), upstream.addr).await;
    let client = TestClient::default();
    assert_eq!(status(&client, &proxy, "/.env", Some(BROWSER)).await, StatusCode::FORBIDDEN);
    assert_eq!(status(&client, &proxy, "/wp-login.php", Some(BROWSER)).await, StatusCode::OK);
    let reload = |text: String| proxy.proxy.reconfigure(proxy_config(&text, upstream.addr), KeySecrets::default());
    reload(format!("{PROXY_HEAD}{dotenv}{wordpress}")).expect("reload");
    assert_eq!(status(&client, &proxy, "/wp-login.php", Some(BROWSER)).await, StatusCode::FORBIDDEN);
    assert_eq!(status(&client, &proxy, "/.env", Some(BROWSER)).await, StatusCode::FORBIDDEN);
    reload(format!("{PROXY_HEAD}{wordpress}")).expect("reload");
    assert_eq!(status(&client, &proxy, "/.env", Some(BROWSER)).await, StatusCode::OK);
    let stats =
        proxy.stats_until("the kept rule's denials", |stats| denied_by(stats, "wordpress-probe") == Some(1)).await;
    assert!(stats.policies.iter().all(|p| p.name != "dotenv-probe"), "a removed rule is gone from the counts");
}

/// A rule on `DELETE` holds for a `POST` that asks, by an override header or
/// `_method`, to be run as `DELETE` (as Rails, Laravel or ASP.NET run it); one on
/// `GET` also counts `HEAD`, which servers answer with the `GET` handler.
#[tokio::test]
async fn method_scoped_rules_hold_for_head_and_for_overridden_methods() {
    let upstream = Upstream::start().await;
    let rules = r#"
[[proxy.rules]]
name = "no-deletes"
action = "deny"
path = "/users"
methods = ["DELETE"]
[[proxy.rules]]
name = "reads"
path = "/feed"
methods = ["GET"]
key = "ip"
algorithm = "sliding_window_log"
limit = 2
window = "1m"
"#;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{rules}"), upstream.addr).await;
    let client = TestClient::default();
    let post = |path: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let (client, url) = (client.clone(), proxy.url(path));
        async move { client.request(Method::POST, &url, &headers, b"").await.status }
    };
    for header in ["x-http-method-override", "x-http-method", "x-method-override"] {
        assert_eq!(post("/users/7", vec![(header, "DELETE")]).await, StatusCode::FORBIDDEN, "{header}");
    }
    assert_eq!(post("/users/7", vec![("x-http-method-override", "delete")]).await, StatusCode::FORBIDDEN);
    assert_eq!(post("/users/7?_method=DELETE", vec![]).await, StatusCode::FORBIDDEN, "_method");
    assert_eq!(post("/users/7?%5Fmethod=delete", vec![]).await, StatusCode::FORBIDDEN, "_method escaped");
    assert_eq!(post("/users/7?_method=PUT", vec![]).await, StatusCode::OK, "another method");
    assert_eq!(post("/users/7", vec![]).await, StatusCode::OK, "a plain POST");

    for method in [Method::GET, Method::HEAD] {
        assert_eq!(client.request(method, &proxy.url("/feed"), &[], b"").await.status, StatusCode::OK);
    }
    let third = client.request(Method::HEAD, &proxy.url("/feed"), &[], b"").await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS, "HEAD spends the GET rule's budget");
    assert_eq!(upstream.count(), 4);
    proxy
        .stats_until("the denials counted", |stats| {
            stats.policies.iter().find(|p| p.name == "no-deletes").map(|p| p.denied) == Some(6)
        })
        .await;
}
