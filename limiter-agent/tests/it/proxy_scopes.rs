//! `[[proxy.scopes]]` and the 401s and 403s of RFC 9110, through real sockets: a key
//! calls the routes of the scopes it holds and routes in no scope's area; a route in
//! the area of a scope it does not hold gets 403, is never forwarded and is charged to
//! no quota; a keyless request there, a failed signature and a missing key get 401
//! with a `WWW-Authenticate` that never tells a known key id from an unknown one; a
//! reload that takes a scope from a key refuses its next request, and `limiter
//! explain`, `limiter stats` and the metrics say so.

use std::path::Path;

use http::{Method, StatusCode};
use limiter_lab::support::{
    agent::{AgentProcess, agent_section},
    free_port,
    proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream, raw_exchange, secret_file, signed_route_config},
    unique,
};

limiter_lab::over_http1_and_http2!(
    a_key_calls_its_scopes_and_gets_403_unforwarded_and_uncharged_in_another_ones_area,
    every_401_says_how_to_authenticate_and_a_known_key_fails_as_an_unknown_one,
);

const SECRET: &[u8] = b"k-pay-1-secret";
const PAY: (&str, &[u8]) = ("k-pay-1", SECRET);

/// `k-pay-1` signs, on plan `basic` (3 an hour, told minimally) with `scopes =
/// {pay_scopes}`; `k-report` (bearer) holds `reports:read`; `k-admin` (bearer) lists
/// no scopes, so holds both.
fn config(secret: &Path, pay_scopes: &str) -> String {
    format!(
        r#"{PROXY_HEAD}
[proxy.plans.basic]
limit = 3
window = "1h"
disclose = "minimal"
[proxy.plans.pro]
limit = 100
window = "1h"
[[proxy.scopes]]
name = "payments:write"
paths = ["/api/transfer"]
methods = ["POST"]
[[proxy.scopes]]
name = "reports:read"
paths = ["/api/reports"]
methods = ["GET"]
[[proxy.keys]]
id = "k-pay-1"
plan = "basic"
secrets = ["file:{}"]
scopes = {pay_scopes}
[[proxy.keys]]
id = "k-report"
plan = "pro"
auth = "bearer"
scopes = ["reports:read"]
[[proxy.keys]]
id = "k-admin"
plan = "pro"
auth = "bearer"
"#,
        secret.display()
    )
}

fn assert_problem(reply: &Reply, status: StatusCode, kind: &str, detail: &str) {
    assert_eq!(reply.status, status, "{:?}", reply.body);
    let problem = reply.json();
    assert_eq!(problem["type"], format!("https://limiter.dev/problems#{kind}"));
    assert_eq!(problem["detail"], detail);
}

async fn a_key_calls_its_scopes_and_gets_403_unforwarded_and_uncharged_in_another_ones_area(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(&secret_file(SECRET), r#"["payments:write"]"#), upstream.addr).await;
    let url = |path| proxy.url(path);

    let inside = client.signed(Method::POST, &url("/api/transfer"), PAY, "1", &[], b"{}").await;
    assert_eq!(inside.status, StatusCode::OK);
    // Its plan names no policy (`disclose = "minimal"`), nor the scope.
    let hidden = "The key does not hold a scope this route needs.";
    let outside = client.signed(Method::GET, &url("/api/reports"), PAY, "2", &[], b"").await;
    assert_problem(&outside, StatusCode::FORBIDDEN, "insufficient-scope", hidden);
    assert_eq!(outside.header("www-authenticate"), "<absent>", "the key is proven: no use authenticating again");
    // Served as GET by a framework that reads the override: in `reports:read`'s area.
    let overridden = [("x-http-method-override", "GET")];
    let dodge = client.signed(Method::POST, &url("/api/reports"), PAY, "3", &overridden, b"{}").await;
    assert_problem(&dodge, StatusCode::FORBIDDEN, "insufficient-scope", hidden);
    assert_eq!(upstream.count(), 1, "no 403 reached the upstream");

    // In no scope's area: any proven key.
    assert_eq!(client.signed(Method::GET, &url("/public"), PAY, "4", &[], b"").await.status, StatusCode::OK);
    // The plan's third request: the 403s took nothing from it.
    assert_eq!(client.signed(Method::POST, &url("/api/transfer"), PAY, "5", &[], b"{}").await.status, StatusCode::OK);
    let fourth = client.signed(Method::POST, &url("/api/transfer"), PAY, "6", &[], b"{}").await;
    assert_eq!(fourth.status, StatusCode::TOO_MANY_REQUESTS);

    let report = [("x-api-key", "k-report")];
    assert_eq!(client.get(&url("/api/reports"), &report).await.status, StatusCode::OK);
    let named = client.request(Method::POST, &url("/api/transfer"), &report, b"{}").await;
    let detail = "The key does not hold scope `payments:write`, which this route needs.";
    assert_problem(&named, StatusCode::FORBIDDEN, "insufficient-scope", detail);
    let admin = [("x-api-key", "k-admin")];
    assert_eq!(client.request(Method::POST, &url("/api/transfer"), &admin, b"{}").await.status, StatusCode::OK);

    // A keyless request in an area needs a key; an unknown id and an unsigned signing
    // key's id are keyless alike.
    let keyless = client.get(&url("/api/reports"), &[]).await;
    let detail = "Scope `reports:read` covers this route: it needs a proven key that holds it.";
    assert_problem(&keyless, StatusCode::UNAUTHORIZED, "missing-key", detail);
    let challenge = r#"Limiter-HMAC realm="limiter", Bearer realm="limiter""#;
    assert_eq!(keyless.header("www-authenticate"), challenge);
    for id in ["k-nobody", "k-pay-1"] {
        let named = client.get(&url("/api/reports"), &[("x-api-key", id)]).await;
        assert_eq!((named.status, &named.body), (keyless.status, &keyless.body), "{id}");
        assert_eq!(named.header("www-authenticate"), challenge, "{id}");
    }
    assert_eq!(client.get(&url("/public"), &[]).await.status, StatusCode::OK);

    let paths: Vec<String> = upstream.seen().iter().map(|seen| format!("{} {}", seen.method, seen.uri)).collect();
    assert_eq!(
        paths,
        [
            "POST /api/transfer",
            "GET /public",
            "POST /api/transfer",
            "GET /api/reports",
            "POST /api/transfer",
            "GET /public"
        ]
    );
    // The 429 and the three keyless 401s are `rejected`.
    proxy
        .stats_until("the three 403s counted as forbidden by scope", |stats| {
            (stats.forbidden, stats.forbidden_reasons.get("scope"), stats.rejected) == (3, Some(&3), 4)
        })
        .await;
}

async fn every_401_says_how_to_authenticate_and_a_known_key_fails_as_an_unknown_one(client: TestClient) {
    let upstream = Upstream::start().await;
    let head = "realm = \"payments\"\nmissing_key = \"reject\"\n";
    let keyed = "[[proxy.keys]]\nid = \"k-bearer\"\nplan = \"basic\"\nauth = \"bearer\"\n\
                 [[proxy.rules]]\nname = \"per-key\"\npath = \"/keyed\"\nkey = \"api_key\"\nlimit = 100\nwindow = \"1m\"\n";
    let text = format!("{}{keyed}", signed_route_config(head, &secret_file(b"k-pay-secret")));
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    let transfer = proxy.url("/api/transfer");

    let wrong_mac = client.signed(Method::POST, &transfer, ("k-pay", b"not the secret"), "1", &[], b"{}").await;
    let unknown_key = client.signed(Method::POST, &transfer, ("k-nobody", b"k-pay-secret"), "2", &[], b"{}").await;
    let no_proof = client.request(Method::POST, &transfer, &[], b"{}").await;
    for reply in [&wrong_mac, &unknown_key, &no_proof] {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.body, wrong_mac.body, "one body whatever failed");
        assert_eq!(reply.header("www-authenticate"), r#"Limiter-HMAC realm="payments""#);
    }
    assert_eq!(wrong_mac.json()["type"], "https://limiter.dev/problems#invalid-signature");

    // A rule counting by key, with `missing_key = "reject"`: every way a key proves
    // itself here, whatever id the request names.
    let challenge = r#"Limiter-HMAC realm="payments", Bearer realm="payments""#;
    let missing = client.get(&proxy.url("/keyed"), &[]).await;
    assert_problem(
        &missing,
        StatusCode::UNAUTHORIZED,
        "missing-key",
        "Rule `per-key` requires a key this request does not carry.",
    );
    for id in [None, Some("k-nobody"), Some("k-pay")] {
        let reply =
            client.get(&proxy.url("/keyed"), &id.map(|id| ("x-api-key", id)).into_iter().collect::<Vec<_>>()).await;
        assert_eq!((reply.status, &reply.body), (missing.status, &missing.body), "{id:?}");
        assert_eq!(reply.header("www-authenticate"), challenge, "{id:?}");
    }
    assert_eq!(client.get(&proxy.url("/keyed"), &[("x-api-key", "k-bearer")]).await.status, StatusCode::OK);
    assert_eq!(upstream.count(), 1);

    // Bearer keys alone, under the default realm.
    let bearer_only = format!(
        "{PROXY_HEAD}missing_key = \"reject\"\n[proxy.plans.p]\nlimit = 10\nwindow = \"1m\"\n\
         [[proxy.keys]]\nid = \"k-bearer\"\nplan = \"p\"\nauth = \"bearer\"\n\
         [[proxy.rules]]\nname = \"per-key\"\nkey = \"api_key\"\nlimit = 10\nwindow = \"1m\"\n"
    );
    let proxy = RunningProxy::start(&bearer_only, upstream.addr).await;
    let reply = client.get(&proxy.url("/"), &[("x-api-key", "k-nobody")]).await;
    assert_eq!(
        (reply.status, reply.header("www-authenticate")),
        (StatusCode::UNAUTHORIZED, r#"Bearer realm="limiter""#)
    );
}

/// The config of a proxy-only agent listening on `listen`, its metrics on `metrics`.
fn agent_config(name: &str, listen: u16, metrics: u16, upstream: &Upstream, secret: &Path, pay_scopes: &str) -> String {
    let proxy = config(secret, pay_scopes)
        .replace("127.0.0.1:0", &format!("127.0.0.1:{listen}"))
        .replace("{upstream}", &upstream.addr.to_string());
    format!("{}{proxy}", agent_section(name, &format!("metrics = \"127.0.0.1:{metrics}\"")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_taking_a_scope_from_a_key_refuses_its_next_request_and_explain_stats_and_metrics_say_so() {
    let upstream = Upstream::start().await;
    let (name, listen, metrics, secret) = (unique("lscope"), free_port(), free_port(), secret_file(SECRET));
    let text = |pay_scopes| agent_config(&name, listen, metrics, &upstream, &secret, pay_scopes);
    let mut agent = AgentProcess::start(&name, &text(r#"["payments:write"]"#));
    let client = TestClient::default();
    let transfer = format!("http://127.0.0.1:{listen}/api/transfer");
    let explain = |agent: &AgentProcess| {
        let args = ["explain", "--method", "POST", "--path", "/api/transfer", "-H", "X-API-Key: k-pay-1", "--json"];
        let explained = agent.cli_json(&args);
        assert_eq!(explained["proxy"]["source"], "agent", "{explained}");
        explained["proxy"]["scopes"].clone()
    };

    assert_eq!(client.signed(Method::POST, &transfer, PAY, "1", &[], b"{}").await.status, StatusCode::OK);
    let held = serde_json::json!({"covering": ["payments:write"], "missing": null, "status": null});
    assert_eq!(explain(&agent), held);

    let reload = agent.reload_with(&text("[]"));
    assert!(reload.status.success(), "{}", String::from_utf8_lossy(&reload.stderr));
    let report = String::from_utf8_lossy(&reload.stdout);
    assert!(report.contains("proxy.keys[k-pay-1].scopes: [payments:write] -> []"), "{report}");
    let refused = client.signed(Method::POST, &transfer, PAY, "2", &[], b"{}").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "the next request after the reload");
    assert_eq!(upstream.count(), 1);
    let missing = serde_json::json!({"covering": ["payments:write"], "missing": "payments:write", "status": 403});
    assert_eq!(explain(&agent), missing);
    let human = agent.cli(&["explain", "--method", "POST", "--path", "/api/transfer", "-H", "X-API-Key: k-pay-1"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("refused (403) before the limits: key k-pay-1 does not hold scope payments:write"),
        "{human}"
    );

    agent.stats_until("the 403 in limiter stats", |stats| {
        stats["proxy"]["forbidden"] == 1 && stats["proxy"]["forbidden_reasons"]["scope"] == 1
    });
    let scrape =
        raw_exchange(format!("127.0.0.1:{metrics}").parse().expect("address"), b"GET /metrics HTTP/1.0\r\n\r\n").await;
    assert!(scrape.contains("\nlimiter_proxy_forbidden_total{reason=\"scope\"} 1\n"), "{scrape}");

    // A scope no [[proxy.scopes]] defines: refused, naming the key and its line; the
    // running config stays (the CLI would read the refused file from here on).
    let unknown = text(r#"["payments:read"]"#);
    let line = unknown.lines().position(|l| l == r#"scopes = ["payments:read"]"#).expect("the line") + 1;
    let reload = agent.reload_with(&unknown);
    let stderr = String::from_utf8_lossy(&reload.stderr);
    assert_eq!(reload.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(":{line}: proxy.keys[0].scopes: key `k-pay-1` holds scope `payments:read`")),
        "{stderr}"
    );
    let still = client.signed(Method::POST, &transfer, PAY, "3", &[], b"{}").await;
    assert_eq!(still.status, StatusCode::FORBIDDEN);
    assert_eq!(upstream.count(), 1);
}
