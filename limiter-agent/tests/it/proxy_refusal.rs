//! What a 429 tells the client to do: a plan's or rule's `refusal` (its `detail`, its
//! `"upgrade"` link and `Link: <…>; rel="upgrade"`), and `Retry-After` spread by
//! `retry_after_jitter`.

use std::collections::BTreeSet;

use http::StatusCode;
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream};

limiter_lab::over_http1_and_http2!(
    the_refusing_policys_refusal_is_in_the_body_and_the_link_header,
    retry_after_is_spread_within_the_jitter,
);

const REFUSALS: &str = r#"
[proxy.plans.free]
limit = 2
window = "1m"
refusal = { detail = "The free plan allows 2 requests a minute.", link = "https://example.com/upgrade?from=free" }
[[proxy.keys]]
id = "k-free"
plan = "free"
auth = "bearer"
[[proxy.rules]]
name = "exports"
path = "/export"
key = "ip"
limit = 1
window = "1h"
refusal = { link = "https://example.com/exports" }
[[proxy.rules]]
name = "search"
path = "/search"
key = "ip"
limit = 100
window = "1m"
"#;

async fn the_refusing_policys_refusal_is_in_the_body_and_the_link_header(client: TestClient) {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{REFUSALS}"), upstream.addr).await;
    let key = [("x-api-key", "k-free")];
    for _ in 0..2 {
        assert_eq!(client.get(&proxy.url("/search"), &key).await.status, StatusCode::OK);
    }
    // The plan refuses: its detail and link.
    let refused = client.get(&proxy.url("/search"), &key).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let body = refused.json();
    assert_eq!(body["detail"], "The free plan allows 2 requests a minute.");
    assert_eq!(body["upgrade"], "https://example.com/upgrade?from=free");
    assert_eq!(body["violated_policies"], serde_json::json!(["free"]));
    assert_eq!(refused.header("link"), r#"<https://example.com/upgrade?from=free>; rel="upgrade""#);
    assert!(refused.header("retry-after").parse::<u64>().is_ok(), "{:?}", refused.headers);

    // A keyless export, then another: the rule refuses, with its link and the
    // generic detail it does not replace.
    assert_eq!(client.get(&proxy.url("/export"), &[]).await.status, StatusCode::OK);
    let refused = client.get(&proxy.url("/export"), &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let body = refused.json();
    assert_eq!(body["upgrade"], "https://example.com/exports");
    assert!(body["detail"].as_str().is_some_and(|detail| detail.contains("Retry-After")), "{body}");
    assert_eq!(refused.header("link"), r#"<https://example.com/exports>; rel="upgrade""#);

    // Both refuse (the rule's bucket and the plan's empty): the rule's, the first.
    let refused = client.get(&proxy.url("/export"), &key).await;
    assert_eq!(refused.json()["violated_policies"], serde_json::json!(["exports", "free"]));
    assert_eq!(refused.json()["upgrade"], "https://example.com/exports");

    // A refusal of a policy without one says nothing of upgrades.
    let text = format!("{PROXY_HEAD}[[proxy.rules]]\nname = \"tight\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1m\"\n");
    let plain = RunningProxy::start(&text, upstream.addr).await;
    assert_eq!(client.get(&plain.url("/"), &[]).await.status, StatusCode::OK);
    let refused = client.get(&plain.url("/"), &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!((refused.header("link"), &refused.json()["upgrade"]), ("<absent>", &serde_json::Value::Null));
}

async fn retry_after_is_spread_within_the_jitter(client: TestClient) {
    const REFUSED: usize = 60;
    let upstream = Upstream::start().await;
    let text = format!(
        "{PROXY_HEAD}retry_after_jitter = 0.1\n[[proxy.rules]]\nname = \"tight\"\nkey = \"ip\"\n\
         algorithm = \"token_bucket\"\nlimit = 1\nwindow = \"1m\"\n"
    );
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    assert_eq!(client.get(&proxy.url("/"), &[]).await.status, StatusCode::OK);
    let mut seconds = BTreeSet::new();
    let mut resets = BTreeSet::new();
    for _ in 0..REFUSED {
        let refused = client.get(&proxy.url("/"), &[]).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = refused.header("retry-after").parse().expect("Retry-After in seconds");
        // The proxy's clock stands still: unspread, every one would say 60 (a token
        // a minute).
        assert!((54..=66).contains(&retry), "Retry-After {retry} outside 60 s ± 10 %");
        seconds.insert(retry);
        resets.insert(refused.header("x-ratelimit-reset").to_owned());
    }
    assert!(seconds.len() >= 4, "{REFUSED} refusals, Retry-After only {seconds:?}");
    // The window's turn is a fact: not spread.
    assert_eq!(resets.len(), 1, "{resets:?}");
}
