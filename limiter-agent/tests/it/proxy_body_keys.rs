//! Limits keyed on what a request carries (a JSON member, a form field, a query
//! parameter, a cookie, several parts at once) through real sockets: an attacker who
//! rotates addresses (a botnet, a residential proxy pool) still meets the limit of
//! the one account it tries, and the upstream receives the body byte for byte.

use http::{Method, StatusCode};
use limiter_lab::{
    over_http1_and_http2,
    support::{
        proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, raw_exchange},
        unique,
    },
};
use sha2::{Digest as _, Sha256};

/// Ten login attempts per username per hour, a sliding log: the articles' first
/// example. Behind a balancer on 127.0.0.1, whose `X-Forwarded-For` names the client.
fn per_username(key: &str, extra: &str) -> String {
    format!(
        "{PROXY_HEAD}trusted_proxies = [\"127.0.0.1/32\"]\n{extra}[[proxy.rules]]\nname = \"logins-per-user\"\n\
         path = \"/login\"\nmethods = [\"POST\"]\nkey = \"{key}\"\nkey_fold = \"lower\"\nlimit = 10\nwindow = \"1h\"\n\
         algorithm = \"sliding_window_log\"\n"
    )
}

fn address(n: usize) -> String {
    format!("198.51.100.{n}")
}

async fn login(client: &TestClient, proxy: &RunningProxy, from: &str, content_type: &str, body: &str) -> StatusCode {
    let headers = [("content-type", content_type), ("x-forwarded-for", from)];
    client.request(Method::POST, &proxy.url("/login"), &headers, body.as_bytes()).await.status
}

fn json_login(user: &str, attempt: usize) -> String {
    format!(r#"{{"username":"{user}","password":"guess-{attempt}"}}"#)
}

/// Before, a rule could key only by address, key id or header: a thousand addresses
/// trying one account each stayed under every per-IP limit (here: each address sends
/// one attempt, and all eleven would pass).
async fn credential_stuffing_from_many_addresses_is_stopped_per_username(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&per_username("json:/username", ""), upstream.addr).await;
    let mut sent = Vec::new();
    for n in 1..=10 {
        let body = json_login("alice", n);
        assert_eq!(login(&client, &proxy, &address(n), "application/json", &body).await, StatusCode::OK, "#{n}");
        sent.push(body);
    }
    let eleventh = client
        .request(
            Method::POST,
            &proxy.url("/login"),
            &[("content-type", "application/json; charset=utf-8"), ("x-forwarded-for", &address(11))],
            json_login("alice", 11).as_bytes(),
        )
        .await;
    assert_eq!(eleventh.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = eleventh.header("retry-after").parse().expect("Retry-After in seconds");
    assert!(retry_after > 3000, "a 10/h log empties in an hour: {retry_after}");
    assert_eq!(
        login(&client, &proxy, &address(12), "application/json", &json_login("ALICE", 12)).await,
        StatusCode::TOO_MANY_REQUESTS,
        "key_fold"
    );
    let bob = json_login("bob", 1);
    assert_eq!(login(&client, &proxy, &address(11), "application/json", &bob).await, StatusCode::OK, "another user");
    sent.push(bob);
    let received: Vec<[u8; 32]> = upstream.seen().iter().map(|seen| Sha256::digest(&seen.body).into()).collect();
    let expected: Vec<[u8; 32]> = sent.iter().map(|body| Sha256::digest(body).into()).collect();
    assert_eq!(received, expected, "the upstream got every admitted body as sent, and no refused one");
    proxy.stats_until("twelve decisions", |stats| stats.forwarded == 11 && stats.rejected == 2).await;
}

/// A body the key cannot be read from is never unlimited: whatever is malformed
/// about it, from however many addresses, it is counted in the rule's one
/// missing-key bucket, while real usernames keep their own.
async fn bodies_without_the_key_share_one_bucket_from_any_address(client: TestClient) {
    let upstream = Upstream::start().await;
    let config = per_username("json:/username", "[proxy.body_keys]\nmax_bytes = 200\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let long = format!(r#"{{"username":"alice","padding":"{}"}}"#, "x".repeat(200));
    let malformed = [
        ("application/json", "not json"),
        ("application/json", r#"{"username":"alice""#),
        ("application/json", r#"{"username":"alice","username":"bob"}"#),
        ("application/json", r#"{"username":{"first":"alice"}}"#),
        ("application/json", r#"{"username":["alice"]}"#),
        ("application/json", r#"{"username":""}"#),
        ("application/json", r#"{"user":"alice"}"#),
        ("text/plain", r#"{"username":"alice"}"#),
        ("application/x-www-form-urlencoded", "username=alice"),
        ("application/json", &long),
    ];
    for (n, (content_type, body)) in malformed.iter().enumerate() {
        assert_eq!(login(&client, &proxy, &address(n + 1), content_type, body).await, StatusCode::OK, "{body}");
    }
    for (n, (content_type, body)) in malformed.iter().enumerate() {
        let status = login(&client, &proxy, &address(n + 100), content_type, body).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "the shared bucket is spent: {body}");
    }
    assert_eq!(
        login(&client, &proxy, &address(200), "application/json", &json_login("alice", 1)).await,
        StatusCode::OK
    );
    assert_eq!(upstream.count(), 11);
}

over_http1_and_http2!(
    credential_stuffing_from_many_addresses_is_stopped_per_username,
    bodies_without_the_key_share_one_bucket_from_any_address
);

/// A form field keys as a JSON member does, and a chunked body (read whole, as every
/// chunked body is) reaches the upstream as the same bytes.
#[tokio::test]
async fn a_form_field_keys_the_bucket_and_a_chunked_body_arrives_as_sent() {
    let upstream = Upstream::start().await;
    let config = per_username("form:username", "").replace("limit = 10", "limit = 2");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let form = "application/x-www-form-urlencoded";
    assert_eq!(login(&client, &proxy, &address(1), form, "username=Alice&password=1").await, StatusCode::OK);
    let body = "password=2&username=al%69ce";
    let chunked = format!(
        "POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: {form}\r\nX-Forwarded-For: {}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        address(2),
        body.len()
    );
    let response = raw_exchange(proxy.addr, chunked.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(upstream.seen().last().map(|seen| seen.body.clone()).as_deref(), Some(body.as_bytes()));
    assert_eq!(login(&client, &proxy, &address(3), form, "username=ALICE").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        login(&client, &proxy, &address(3), form, "username=alice&username=bob").await,
        StatusCode::OK,
        "missing"
    );
    assert_eq!(login(&client, &proxy, &address(4), form, "username=bob").await, StatusCode::OK);
}

/// A composite key counts each tenant of one address apart; a request without one of
/// its parts is counted as missing, never under the address alone.
#[tokio::test]
async fn a_composite_key_keeps_tenants_apart_and_a_missing_part_is_a_missing_key() {
    let upstream = Upstream::start().await;
    let config = format!(
        "{PROXY_HEAD}[[proxy.rules]]\nname = \"per-tenant-per-ip\"\nkey = [\"ip\", \"header:x-tenant\"]\nlimit = 2\nwindow = \"1m\"\n"
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let get = |tenant: Option<&'static str>| {
        let headers: Vec<(&str, &str)> = tenant.map(|tenant| ("x-tenant", tenant)).into_iter().collect();
        let (client, url) = (&client, proxy.url("/"));
        async move { client.get(&url, &headers).await.status }
    };
    for tenant in [Some("acme"), Some("acme"), Some("globex"), None, None] {
        assert_eq!(get(tenant).await, StatusCode::OK, "{tenant:?}");
    }
    for tenant in [Some("acme"), None] {
        assert_eq!(get(tenant).await, StatusCode::TOO_MANY_REQUESTS, "{tenant:?}");
    }
    assert_eq!(get(Some("globex")).await, StatusCode::OK);
}

/// A query parameter (its first occurrence, decoded) and a cookie key a bucket each.
#[tokio::test]
async fn a_query_parameter_and_a_cookie_key_their_buckets() {
    let upstream = Upstream::start().await;
    let config = format!(
        "{PROXY_HEAD}[[proxy.rules]]\nname = \"per-user\"\npath = \"/search\"\nkey = \"query:user\"\nlimit = 1\nwindow = \"1m\"\n\
         [[proxy.rules]]\nname = \"per-session\"\npath = \"/cart\"\nkey = \"cookie:session\"\nlimit = 1\nwindow = \"1m\"\n"
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let status = |path: &str, cookie: &'static str| {
        let (client, url) = (&client, proxy.url(path));
        async move {
            let headers: Vec<(&str, &str)> = [("cookie", cookie)].into_iter().filter(|(_, v)| !v.is_empty()).collect();
            client.get(&url, &headers).await.status
        }
    };
    assert_eq!(status("/search?user=al%20ice&user=bob", "").await, StatusCode::OK);
    assert_eq!(status("/search?q=1&user=al+ice", "").await, StatusCode::TOO_MANY_REQUESTS, "the same user, decoded");
    assert_eq!(status("/search?user=bob&user=al%20ice", "").await, StatusCode::OK, "the first occurrence");
    assert_eq!(status("/cart", "theme=dark; session=s1").await, StatusCode::OK);
    assert_eq!(status("/cart", "session=s1").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/cart", "session=s2").await, StatusCode::OK);
}

/// `limiter explain` reads a body from a file and prints the key it yields beside the
/// rule, from the config alone when no agent runs.
#[test]
fn explain_shows_the_key_a_body_yields() {
    let name = unique("explain-body");
    let dir = std::path::PathBuf::from(format!("/tmp/{name}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("limiter.toml");
    let text = format!(
        "{}{}",
        limiter_lab::support::agent::agent_section(&name, ""),
        per_username("json:/user/name", "").replace("{upstream}", "127.0.0.1:9")
    );
    std::fs::write(&config, text).expect("config");
    let body = dir.join("login.json");
    std::fs::write(&body, r#"{"user":{"name":"Alice"},"password":"x"}"#).expect("body");
    let output = std::process::Command::new(limiter_lab::support::agent::limiter_bin())
        .args(["explain", "--method", "POST", "--path", "/login", "-H", "Content-Type: application/json"])
        .arg("--body-file")
        .arg(&body)
        .arg("-c")
        .arg(&config)
        .output()
        .expect("limiter explain");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let line = stdout.lines().find(|line| line.contains("logins-per-user")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("json:/user/name=alice"), "folded, beside the rule: {stdout}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
