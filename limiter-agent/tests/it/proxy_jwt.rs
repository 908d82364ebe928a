//! `jwt:CLAIM` keys through real sockets: tokens of one subject share its bucket from
//! any address, forged ones (a bad signature, `alg: none`, expired, an HMAC token
//! keyed with the issuer's RSA public key) never count under the subject they name,
//! and a reload takes an issuer's rotated JWKS.

use std::{path::Path, time::Duration};

use http::StatusCode;
use limiter::signature::KeySecrets;
use limiter_core::{
    Clock as _,
    jwt::testing::{RSA_PUBLIC_PEM, SigningKey, jwks, sign},
};
use limiter_lab::support::proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, proxy_config, secret_file};
use serde_json::{Value, json};

limiter_lab::over_http1_and_http2!(
    tokens_of_one_subject_share_its_bucket_and_forged_ones_never_count_under_it,
    a_reload_takes_the_rotated_jwks,
);

const SECRET: &[u8] = b"the proxy's hs256 secret, 32 B..";
const ISSUER: &str = "https://login.example.org";

/// One rule, 3 a minute per `sub`, over shared-secret tokens and one issuer's JWKS.
fn config(secret: &Path, jwks_file: &Path, missing_key: &str) -> String {
    format!(
        r#"{PROXY_HEAD}trusted_proxies = ["127.0.0.1/32"]
missing_key = "{missing_key}"
[proxy.jwt]
hs256_secrets = ["file:{}"]
issuers = [{{ iss = "{ISSUER}", audiences = ["api"], jwks_file = "{}" }}]
[[proxy.rules]]
name = "per-user"
path = "/api"
key = "jwt:sub"
algorithm = "sliding_window_log"
limit = 3
window = "1m"
"#,
        secret.display(),
        jwks_file.display()
    )
}

/// Claims of `sub` valid for ten minutes from the proxy's `now`.
fn claims(sub: &str, now: Duration, extra: Value) -> Value {
    let mut claims = json!({"sub": sub, "iss": ISSUER, "aud": "api", "iat": now.as_secs(), "exp": now.as_secs() + 600});
    if let (Some(claims), Value::Object(extra)) = (claims.as_object_mut(), extra) {
        claims.extend(extra);
    }
    claims
}

async fn get(client: &TestClient, proxy: &RunningProxy, from: &str, token: &str) -> StatusCode {
    let bearer = format!("Bearer {token}");
    client.get(&proxy.url("/api/items"), &[("x-forwarded-for", from), ("authorization", &bearer)]).await.status
}

async fn tokens_of_one_subject_share_its_bucket_and_forged_ones_never_count_under_it(client: TestClient) {
    let upstream = Upstream::start().await;
    let rsa = SigningKey::rsa();
    let jwks_file = secret_file(jwks(&[("rsa", &rsa)]).as_bytes());
    let proxy = RunningProxy::start(&config(&secret_file(SECRET), &jwks_file, "shared"), upstream.addr).await;
    let now = proxy.clock.now();
    let hmac = SigningKey::Hmac(SECRET.to_vec());

    // Tokens naming alice that prove nothing, each from an address of its own: they
    // lack the key, and share the one missing-key bucket.
    let forged = [
        sign("HS256", None, &claims("alice", now, json!({})), &SigningKey::Hmac(b"a guess at the secret".to_vec())),
        sign("none", None, &claims("alice", now, json!({})), &SigningKey::Unsigned),
        sign("HS256", None, &claims("alice", now, json!({"exp": now.as_secs() - 60})), &hmac),
        sign(
            "HS256",
            Some("rsa"),
            &claims("alice", now, json!({})),
            &SigningKey::Hmac(RSA_PUBLIC_PEM.as_bytes().to_vec()),
        ),
    ];
    let mut statuses = Vec::new();
    for (n, token) in forged.iter().enumerate() {
        statuses.push(get(&client, &proxy, &format!("203.0.113.{}", n + 1), token).await);
    }
    let ok = StatusCode::OK;
    assert_eq!(statuses, [ok, ok, ok, StatusCode::TOO_MANY_REQUESTS], "the missing-key bucket, 3 a minute");
    let stats = proxy.stats_until("four tokens not taken", |stats| stats.jwt_failures == 4).await;
    let reasons = |stats: &limiter::proxy::ProxyStats| {
        ["signature", "algorithm", "expired"].map(|reason| stats.jwt_failure_reasons.get(reason).copied())
    };
    // The confusion token is checked against the shared secrets, never the RSA key.
    assert_eq!(reasons(&stats), [Some(2), Some(1), Some(1)], "{:?}", stats.jwt_failure_reasons);

    // Alice's own tokens, from three addresses and both kinds of key: her bucket is whole.
    let alice = sign("HS256", None, &claims("alice", now, json!({})), &hmac);
    for n in 1..=3 {
        assert_eq!(get(&client, &proxy, &format!("192.0.2.{n}"), &alice).await, ok, "alice from 192.0.2.{n}");
    }
    assert_eq!(get(&client, &proxy, "198.51.100.7", &alice).await, StatusCode::TOO_MANY_REQUESTS, "a new address");
    let bob = sign("HS384", None, &claims("bob", now, json!({})), &hmac);
    assert_eq!(get(&client, &proxy, "192.0.2.1", &bob).await, ok, "bob has his own");
    // The issuer's alice is another principal than the shared secrets' one.
    let issuers_alice = sign("RS256", Some("rsa"), &claims("alice", now, json!({})), &rsa);
    assert_eq!(get(&client, &proxy, "192.0.2.1", &issuers_alice).await, ok, "the issuer's alice");
    assert_eq!(upstream.count(), 3 + 3 + 2);
    assert_eq!(proxy.stats_until("every request counted", |stats| stats.requests == 10).await.jwt_failures, 4);
}

async fn a_reload_takes_the_rotated_jwks(client: TestClient) {
    let upstream = Upstream::start().await;
    let (old, new) = (SigningKey::ec_p256(), SigningKey::ed25519());
    let jwks_file = secret_file(jwks(&[("2024", &old)]).as_bytes());
    let text = config(&secret_file(SECRET), &jwks_file, "reject");
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    let now = proxy.clock.now();
    let by_old = sign("ES256", Some("2024"), &claims("carol", now, json!({})), &old);
    let by_new = sign("EdDSA", Some("2025"), &claims("carol", now, json!({})), &new);
    assert_eq!(get(&client, &proxy, "192.0.2.1", &by_old).await, StatusCode::OK);
    let bearer = format!("Bearer {by_new}");
    let unpublished =
        client.get(&proxy.url("/api/items"), &[("x-forwarded-for", "192.0.2.1"), ("authorization", &bearer)]).await;
    assert_eq!(
        (unpublished.status, unpublished.header("www-authenticate")),
        (StatusCode::UNAUTHORIZED, "Bearer realm=\"limiter\""),
        "not yet published: missing_key = \"reject\" asks for a token"
    );

    // The issuer rotates: the file now holds the new key alone, under the same path.
    std::fs::write(&jwks_file, jwks(&[("2025", &new)])).expect("rotate the JWKS");
    let config = proxy_config(&text, upstream.addr);
    proxy.proxy.reconfigure(config.clone(), KeySecrets::load(&config).expect("the new JWKS")).expect("reload");
    assert_eq!(get(&client, &proxy, "192.0.2.1", &by_new).await, StatusCode::OK, "the new key verifies");
    assert_eq!(get(&client, &proxy, "192.0.2.1", &by_old).await, StatusCode::UNAUTHORIZED, "the old key is gone");
    let stats = proxy.stats_until("two tokens not taken", |stats| stats.jwt_failures == 2).await;
    assert_eq!(stats.jwt_failure_reasons.get("unknown_key"), Some(&2), "{:?}", stats.jwt_failure_reasons);
    // Carol's bucket outlived the reload: the rule is unchanged.
    assert_eq!(get(&client, &proxy, "192.0.2.2", &by_new).await, StatusCode::OK);
    assert_eq!(get(&client, &proxy, "192.0.2.3", &by_new).await, StatusCode::TOO_MANY_REQUESTS);

    // A broken JWKS is a refused reload, and the keys in force stay.
    std::fs::write(&jwks_file, "{\"keys\": [{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}]}").expect("break the JWKS");
    let error = KeySecrets::load(&config).expect_err("a shared secret in a JWKS");
    assert_eq!(error.key, "proxy.jwt.issuers[0].jwks_file", "{error}");
    assert_eq!(upstream.count(), 3);
}
