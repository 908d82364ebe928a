//! What counts towards escalation, through real sockets: only refusals the client
//! caused itself. Unsigned requests a page makes its readers' browsers send to a
//! signed route, shared buckets another client emptied, header buckets and requests
//! a browser sent for another site are refused as before and never escalate; wrong
//! signatures, a proven key outside its scopes and a client's own per-IP bucket
//! still do.
//!
//! The escalator counts a refusal before the proxy answers it (the memory store's
//! count is synchronous), so once a client has its answer, whether it was escalated
//! is in the channel already. The refusals spared are counted in
//! `refusals_not_escalated`.

use std::future::Future;

use http::{Method, StatusCode};
use limiter::escalation::Escalation;
use limiter_core::{Clock as _, SystemClock};
use limiter_lab::support::{
    proxy::{
        PROXY_HEAD, RunningProxy, TestClient, Upstream, assert_not_escalated, exchange_from, secret_file,
        signed_route_config,
    },
    wait::PATIENCE,
};
use tokio::sync::mpsc::Receiver;

/// Refusals tolerated before a client is escalated.
const THRESHOLD: u32 = 3;

/// A flood of refusals, each far past [`THRESHOLD`].
const FLOOD: usize = 60;

const CROSS_SITE: (&str, &str) = ("sec-fetch-site", "cross-site");

/// Proves that no refusal before counted: `THRESHOLD` refusals `refuse` makes leave the
/// client unescalated, and one more escalates 127.0.0.1 (that of [`TestClient`]).
async fn escalated_by_exactly<F: Future<Output = StatusCode>>(
    escalated: &mut Receiver<Escalation>,
    refused: StatusCode,
    mut refuse: impl FnMut() -> F,
) {
    for _ in 0..THRESHOLD {
        assert_eq!(refuse().await, refused);
    }
    assert_not_escalated(escalated, "refusals up to the threshold");
    assert_eq!(refuse().await, refused);
    let escalation =
        tokio::time::timeout(PATIENCE, escalated.recv()).await.expect("escalated in time").expect("an escalation");
    assert_eq!(escalation.cidr.to_string(), "127.0.0.1/32");
}

/// The headers of a request signed by `k-pay` with a signature no secret makes.
fn wrong_signature(timestamp: &str) -> [(&'static str, &str); 3] {
    const NO_SECRETS: &str = "00000000000000000000000000000000000000000000000000000000000000ff";
    [("x-api-key", "k-pay"), ("x-timestamp", timestamp), ("x-signature", NO_SECRETS)]
}

#[tokio::test]
async fn unsigned_requests_to_a_signed_route_never_escalate_and_wrong_signatures_do() {
    let upstream = Upstream::start().await;
    let config = signed_route_config("", &secret_file(b"k-pay-secret"));
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, THRESHOLD);
    let client = TestClient::default();
    // What 60 `<img src=".../api/transfer?i">` on another site's page make a reader send.
    for i in 0..FLOOD {
        let reply = client.get(&proxy.url(&format!("/api/transfer?{i}")), &[]).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    }
    assert_not_escalated(&mut escalated, "unsigned requests");
    proxy.stats_until("the 401s counted as not escalated", |stats| stats.refusals_not_escalated == 60).await;
    let timestamp = SystemClock.now().as_secs().to_string();
    let headers = wrong_signature(&timestamp);
    escalated_by_exactly(&mut escalated, StatusCode::UNAUTHORIZED, || async {
        client.request(Method::POST, &proxy.url("/api/transfer"), &headers, b"{}").await.status
    })
    .await;
    assert_eq!(upstream.count(), 0, "nothing reached the upstream");
}

/// Limits that are no one client's own (`per-key` for keyless requests, `per-user`
/// by a header) and one that is (`per-ip`), each 2 an hour; the clock stands still.
const LIMITS: &str = r#"
[[proxy.rules]]
name = "per-key"
path = "/keyed"
key = "api_key"
limit = 2
window = "1h"

[[proxy.rules]]
name = "per-user"
path = "/user"
key = "header:x-user"
limit = 2
window = "1h"

[[proxy.rules]]
name = "per-ip"
path = "/ip"
key = "ip"
limit = 2
window = "1h"
"#;

#[tokio::test]
async fn shared_buckets_another_client_emptied_never_escalate_and_an_own_bucket_does() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{LIMITS}");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, THRESHOLD);
    let client = TestClient::default();
    // The shared missing-key bucket, and the bucket of the header value a victim sends.
    for (path, headers) in [("/keyed", &[][..]), ("/user", &[("x-user", "victim")][..])] {
        let named: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{named}Connection: close\r\n\r\n");
        for _ in 0..2 {
            let answer = exchange_from([127, 0, 0, 2], proxy.addr, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "another client spends {path}: {answer}");
        }
        for _ in 0..FLOOD {
            assert_eq!(client.get(&proxy.url(path), headers).await.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
        }
        assert_not_escalated(&mut escalated, path);
    }
    proxy.stats_until("the 429s counted as not escalated", |stats| stats.refusals_not_escalated == 120).await;
    for _ in 0..2 {
        assert_eq!(client.get(&proxy.url("/ip"), &[]).await.status, StatusCode::OK);
    }
    escalated_by_exactly(&mut escalated, StatusCode::TOO_MANY_REQUESTS, || async {
        client.get(&proxy.url("/ip"), &[]).await.status
    })
    .await;
}

/// Wrong signatures, an own bucket's 429s and a deny rule with `escalate = true`, each
/// sent by a browser for another site: refused, never escalated.
#[tokio::test]
async fn what_a_browser_sent_for_another_site_is_refused_and_never_escalates() {
    let upstream = Upstream::start().await;
    let deny = "[[proxy.rules]]\nname = \"scanner\"\naction = \"deny\"\nescalate = true\n\
                [proxy.rules.when]\nheader_matches = { \"user-agent\" = \"sqlmap\" }\n";
    let config = signed_route_config(&format!("{LIMITS}{deny}"), &secret_file(b"k-pay-secret"));
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, THRESHOLD);
    let client = TestClient::default();
    let timestamp = SystemClock.now().as_secs().to_string();
    let mut signed = wrong_signature(&timestamp).to_vec();
    signed.push(CROSS_SITE);
    for _ in 0..FLOOD {
        let reply = client.request(Method::POST, &proxy.url("/api/transfer"), &signed, b"{}").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        let scanner = client.get(&proxy.url("/"), &[("user-agent", "sqlmap/1.7"), CROSS_SITE]).await;
        assert_eq!(scanner.status, StatusCode::FORBIDDEN);
    }
    for i in 0..FLOOD {
        let expected = if i < 2 { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
        assert_eq!(client.get(&proxy.url("/ip"), &[CROSS_SITE]).await.status, expected, "request {i}");
    }
    assert_not_escalated(&mut escalated, "refusals of cross-site requests");
    // 60 of each refusal but the first two requests to `/ip`, which passed.
    proxy.stats_until("the refusals counted as not escalated", |stats| stats.refusals_not_escalated == 178).await;
    escalated_by_exactly(&mut escalated, StatusCode::FORBIDDEN, || async {
        client.get(&proxy.url("/"), &[("user-agent", "sqlmap/1.7")]).await.status
    })
    .await;
}

/// A proven key outside its scopes is its holder's own doing: its 403s escalate, and
/// each is charged to the client's per-IP bucket as a failed signature is.
#[tokio::test]
async fn a_proven_key_outside_its_scopes_escalates_and_is_charged_to_its_ip_limits() {
    let upstream = Upstream::start().await;
    let config = format!(
        "{PROXY_HEAD}[proxy.plans.p]\nlimit = 100\nwindow = \"1h\"\n\
         [[proxy.scopes]]\nname = \"admin\"\npaths = [\"/admin\"]\n\
         [[proxy.keys]]\nid = \"k-reader\"\nplan = \"p\"\nauth = \"bearer\"\nscopes = []\n\
         [[proxy.rules]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 4\nwindow = \"1h\"\n"
    );
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let mut escalated = proxy.escalate(&config, upstream.addr, THRESHOLD);
    let client = TestClient::default();
    let reader = [("x-api-key", "k-reader")];
    escalated_by_exactly(&mut escalated, StatusCode::FORBIDDEN, || async {
        client.get(&proxy.url("/admin/users"), &reader).await.status
    })
    .await;
    // The four 403s took the bucket's four requests.
    let reply = client.get(&proxy.url("/public"), &reader).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.json()["violated_policies"], serde_json::json!(["per-ip"]));
    assert_eq!(upstream.count(), 0, "nothing reached the upstream");
}

/// `upstream_statuses = [401]`: the upstream's own 401s (a login failing) count for a
/// client connected directly, as the proxy's refusals do; never for a trusted proxy,
/// which speaks for many clients, nor for a browser another site made post the form.
#[tokio::test]
async fn the_upstreams_own_401s_escalate_a_direct_client_and_never_a_trusted_proxy() {
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}trusted_proxies = [\"127.0.0.2/32\"]\n");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let escalation = format!("threshold = {THRESHOLD}\nupstream_statuses = [401]\n");
    let mut escalated = proxy.escalate_with(&config, upstream.addr, &escalation);
    let failed_login = "POST /login?status=401 HTTP/1.1\r\nHost: test\r\nX-Forwarded-For: 203.0.113.7\r\n\
                        Content-Length: 0\r\nConnection: close\r\n\r\n";
    for _ in 0..FLOOD {
        let answer = exchange_from([127, 0, 0, 2], proxy.addr, failed_login.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "the upstream's answer, passed on: {answer}");
    }
    assert_not_escalated(&mut escalated, "a trusted proxy's 401s");
    let client = TestClient::default();
    let url = proxy.url("/login?status=401");
    for _ in 0..FLOOD {
        let reply = client.request(Method::POST, &url, &[CROSS_SITE], b"").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        let forbidden = client.request(Method::POST, &proxy.url("/login?status=403"), &[], b"").await;
        assert_eq!(forbidden.status, StatusCode::FORBIDDEN, "not a status escalation counts");
    }
    assert_not_escalated(&mut escalated, "401s of cross-site posts and 403s");
    proxy.stats_until("the cross-site 401s counted as not escalated", |stats| stats.refusals_not_escalated == 60).await;
    escalated_by_exactly(&mut escalated, StatusCode::UNAUTHORIZED, || async {
        client.request(Method::POST, &url, &[], b"").await.status
    })
    .await;
    assert_eq!(upstream.count(), 3 * FLOOD + THRESHOLD as usize + 1, "every request was the upstream's to answer");
}
