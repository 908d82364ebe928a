//! One canonical path for rules, `+route` keys and forwarding: every spelling an
//! upstream would serve as `/login` or `/api/transfer` is matched as that path, and
//! the upstream receives the path that was matched.

use http::{Method, StatusCode};
use limiter_lab::support::proxy::{
    PROXY_HEAD, RunningProxy, TestClient, Upstream, raw_exchange, secret_file, signed_route_config,
};

const LOGIN: &str = r#"
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#;

/// The signed route `/api/transfer` of key `k-pay`, with `extra` in `[proxy]`. The
/// tests send no valid signature: any spelling of the route must be refused unsigned.
fn transfer(extra: &str) -> String {
    signed_route_config(extra, &secret_file(b"k-pay-paths-secret"))
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

#[tokio::test]
async fn no_spelling_of_the_login_path_dodges_the_login_rule() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{LOGIN}"), upstream.addr).await;
    let client = TestClient::default();
    for _ in 0..5 {
        assert_eq!(client.request(Method::POST, &proxy.url("/login"), &[], b"").await.status, StatusCode::OK);
    }
    for variant in [
        "/%6cogin",
        "/login;x",
        "/login/",
        "/login/..;/login",
        "//login",
        "/./login",
        "/x/..;/login",
        "/%2e/login",
        "/login;jsessionid=1/",
    ] {
        let reply = client.request(Method::POST, &proxy.url(variant), &[], b"").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{variant}");
        assert_eq!(reply.json()["violated_policies"], serde_json::json!(["login"]), "{variant}");
    }
    assert_eq!(upstream.count(), 5);
}

#[tokio::test]
async fn no_spelling_of_a_path_gets_a_route_bucket_of_its_own() {
    let upstream = Upstream::start().await;
    let rule = "[[proxy.rules]]\nname = \"per-endpoint\"\npath = \"/api\"\nkey = \"ip+route\"\nalgorithm = \"sliding_window_log\"\nlimit = 2\nwindow = \"1m\"\n";
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{rule}"), upstream.addr).await;
    let client = TestClient::default();
    for _ in 0..2 {
        assert_eq!(client.get(&proxy.url("/api/items"), &[]).await.status, StatusCode::OK);
    }
    for variant in ["/api/items/", "/api//items", "/api/%69tems", "/api/items;v=2", "/api/./items", "/api/x/../items"] {
        assert_eq!(client.get(&proxy.url(variant), &[]).await.status, StatusCode::TOO_MANY_REQUESTS, "{variant}");
    }
    // Another endpoint has a bucket of its own.
    assert_eq!(client.get(&proxy.url("/api/other"), &[]).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test]
async fn no_spelling_of_a_signed_route_reaches_the_upstream_unsigned() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&transfer(""), upstream.addr).await;
    let client = TestClient::default();
    for variant in [
        "/api/%74ransfer",
        "//api/transfer",
        "/api/./transfer",
        "/api/transfer/",
        "/api/transfer;x",
        "/api/x/..;/transfer",
        "/api/%2E%2e/api/transfer",
        "/api/transfer?x=1",
    ] {
        let reply = client.request(Method::POST, &proxy.url(variant), &[("x-api-key", "k-pay")], b"pay").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{variant}");
    }
    assert_eq!(upstream.count(), 0);
    proxy.stats_until("every spelling counted as a failed signature", |stats| stats.signature_failures == 8).await;
}

#[tokio::test]
async fn case_insensitive_paths_fold_case_for_upstreams_that_do() {
    let upstream = Upstream::start().await;
    let sensitive = RunningProxy::start(&transfer("case_insensitive_paths = false"), upstream.addr).await;
    let insensitive = RunningProxy::start(&transfer("case_insensitive_paths = true"), upstream.addr).await;
    let client = TestClient::default();
    // Asked to, another case is another path: the upstream must not fold it.
    let reply = client.request(Method::POST, &sensitive.url("/API/Transfer"), &[], b"").await;
    assert_eq!(reply.status, StatusCode::OK);
    for variant in ["/API/Transfer", "/api/%54RANSFER"] {
        let reply = client.request(Method::POST, &insensitive.url(variant), &[], b"").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{variant}");
    }
    assert_eq!(upstream.count(), 1);
}

/// Express and ASP.NET Core serve `/API/TRANSFER` as `/api/transfer`: by default no
/// spelling of a letter, in any case, escaped or a non-ASCII look-alike that folds
/// to it, skips the signature requirement, and the upstream gets the path as sent.
#[tokio::test]
async fn by_default_no_case_of_a_signed_route_skips_its_signature() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&transfer(""), upstream.addr).await;
    let client = TestClient::default();
    let variants = ["/API/TRANSFER", "/Api/Transfer", "/%41PI/%54ransfer", "/api/tran%C5%BFfer", "/api/tran%c5%bffer"];
    for variant in variants {
        let reply = client.request(Method::POST, &proxy.url(variant), &[("x-api-key", "k-pay")], b"pay").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{variant}");
    }
    assert_eq!(upstream.count(), 0);
    proxy.stats_until("every case counted as a failed signature", |stats| stats.signature_failures == 5).await;
    let reply = client.get(&proxy.url("/Other/%41;P/"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.to_string()).collect();
    assert_eq!(seen, ["/Other/A;P/"], "forwarded in its case, unreserved escapes decoded as before");
}

/// The same through a limit: `/LOGIN` is the login rule's, not a fresh budget.
#[tokio::test]
async fn by_default_no_case_of_the_login_path_gets_fresh_attempts() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{LOGIN}"), upstream.addr).await;
    let client = TestClient::default();
    for _ in 0..5 {
        assert_eq!(client.request(Method::POST, &proxy.url("/login"), &[], b"").await.status, StatusCode::OK);
    }
    for variant in ["/LOGIN", "/Login", "/%4Cogin", "/log%C4%B1n", "/log%C4%B0n"] {
        let reply = client.request(Method::POST, &proxy.url(variant), &[], b"").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{variant}");
        assert_eq!(reply.json()["violated_policies"], serde_json::json!(["login"]), "{variant}");
    }
    assert_eq!(upstream.count(), 5);
}

#[tokio::test]
async fn the_upstream_receives_the_canonical_path_with_the_query_as_sent() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
    let client = TestClient::default();
    let reply = client.get(&proxy.url("/a/./b/../c//d/%7e%41%2a;p?q=%2e&r=/../x"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let reply = client.get(&proxy.url("/..;/e/"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.to_string()).collect();
    assert_eq!(seen, ["/a/c/d/~A%2A;p?q=%2e&r=/../x", "/e/"]);
}

#[tokio::test]
async fn escaped_separators_and_bad_escapes_are_refused_with_400() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&transfer(""), upstream.addr).await;
    let targets = ["/api%2Ftransfer", "/api%2ftransfer", "/api%5ctransfer", "/api\\transfer", "/a%00b", "/a%zz", "/a%"];
    for target in targets {
        let request = format!("POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let response = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert_eq!(status_line(&response), "HTTP/1.1 400 Bad Request", "{target}: {response}");
        assert!(response.contains("application/problem+json"), "{target}: {response}");
        assert!(response.contains("https://limiter.dev/problems#bad-path"), "{target}: {response}");
    }
    assert_eq!(upstream.count(), 0);
    proxy.stats_until("every refused path counted", |stats| stats.paths_refused == 7).await;
}

#[tokio::test]
async fn escaped_slashes_keep_forwards_them_encoded_and_never_as_separators() {
    let upstream = Upstream::start().await;
    let config = transfer("escaped_slashes = \"keep\"");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    for target in ["/files/a%2fb", "/files/a\\b", "/files/%2e%2e%5c..%5cx"] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let response = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert_eq!(status_line(&response), "HTTP/1.1 200 OK", "{target}: {response}");
    }
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.to_string()).collect();
    assert_eq!(seen, ["/files/a%2Fb", "/files/a%5Cb", "/files/..%5C..%5Cx"]);
    assert_eq!(proxy.proxy.stats().paths_refused, 0);
}
