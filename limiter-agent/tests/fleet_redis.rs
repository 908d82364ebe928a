//! Limits shared through Redis (`store = "redis"`): several proxies on one server,
//! the Redis scripts against the in-memory algorithms, and Redis going away.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use http::{Method, StatusCode};
use limiter::{
    fleet::Fleet,
    limits::{RedisStore, TimeSource},
};
use limiter_core::{
    Algorithm, Clock as _, LimitSpec, SystemClock,
    limits::{Bucket, Charge, MemoryStore, Outcome, Store as _},
    signature::{Canonical, sha256, sign_hex},
};
use limiter_lab::support::{
    proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream, signed_route_config},
    redis::{TestRedis, redis_keys, unique_prefix},
};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Redis measures with its own clock, which no test can hold still: a sliding log has
/// no window edge for a test to straddle, so the counts are exact whenever it runs.
const FREE: &str = r#"
[proxy.plans.free]
algorithm = "sliding_window_log"
limit = 100
window = "1m"
[[proxy.keys]]
id = "k-free"
plan = "free"
"#;

#[tokio::test]
async fn two_proxies_sharing_redis_forward_exactly_the_plan_and_count_down_together() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("two-proxies"), "allow");
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{keys}{FREE}");
    let proxies =
        [RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await];
    let client = TestClient::default();

    let mut remaining = Vec::new();
    let mut rejected = 0;
    for i in 0..150 {
        let reply = client.get(&proxies[i % 2].url("/api"), &[("x-api-key", "k-free")]).await;
        match reply.status {
            StatusCode::OK => remaining.push(reply.header("x-ratelimit-remaining").parse::<u64>().expect("remaining")),
            StatusCode::TOO_MANY_REQUESTS => rejected += 1,
            other => panic!("request {i}: {other}"),
        }
    }
    assert_eq!((remaining.len(), rejected), (100, 50));
    assert_eq!(upstream.count(), 100);
    assert_eq!(remaining, (0..100).rev().collect::<Vec<u64>>(), "Remaining counts down across both proxies");
    for proxy in &proxies {
        assert_eq!(proxy.proxy.stats().store_failures, 0);
    }
}

fn spec(algorithm: Algorithm, limit: u32, window_ms: u64, burst: Option<u32>, queue: Option<u32>) -> LimitSpec {
    LimitSpec {
        algorithm,
        limit: NonZeroU32::new(limit).expect("limit"),
        window: Duration::from_millis(window_ms),
        burst: burst.and_then(NonZeroU32::new),
        throttle: None,
        queue: queue.and_then(NonZeroU32::new),
    }
}

/// Runs one schedule through both stores, step by step, and demands the same
/// outcomes (admission, quotas, retry, wait) from each.
async fn same_outcomes(redis: &RedisStore, name: &str, specs: &[LimitSpec], charge: Charge, seed: u64) {
    let memory = MemoryStore::new(1000.try_into().expect("nonzero"));
    let mut rng = StdRng::seed_from_u64(seed);
    let policies: Vec<Arc<str>> = (0..specs.len()).map(|i| Arc::from(format!("{name}-{i}"))).collect();
    let shortest = specs.iter().map(|s| s.window / s.limit.get()).min().expect("a spec");
    // Microseconds, as the server's clock counts; started now so that keys live long
    // enough in real time.
    let mut now = Duration::from_secs(SystemClock.now().as_secs());
    let mut admitted = 0;
    for step in 0..300 {
        let gap_us = rng.random_range(0..=u64::try_from(shortest.as_micros()).expect("gap") * 3 / 2);
        // Now and then a pause past every window, and a burst with no gap at all.
        now += match step % 50 {
            49 => Duration::from_millis(3000),
            0..10 => Duration::ZERO,
            _ => Duration::from_micros(gap_us),
        };
        let buckets: Vec<Bucket<'_>> =
            specs.iter().zip(&policies).map(|(spec, policy)| Bucket { policy, key: "client", spec }).collect();
        let expected = memory.apply(&buckets, now, charge);
        let actual: Vec<Outcome> = redis.apply(&buckets, now, charge).await.expect("redis");
        assert_eq!(actual, expected, "{name}: step {step} at {now:?}");
        admitted += usize::from(expected.iter().all(|o| o.admitted));
    }
    assert!((10..290).contains(&admitted), "{name}: the schedule should both admit and reject ({admitted} admitted)");
}

#[tokio::test]
async fn every_algorithm_decides_on_redis_exactly_as_in_memory() {
    let redis = TestRedis::shared();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("same-outcomes"), Duration::from_secs(2)).expect("fleet");
    let store = RedisStore::new(fleet, TimeSource::Caller);
    let cases = [
        ("token_bucket", vec![spec(Algorithm::TokenBucket, 5, 1000, None, None)]),
        ("token_bucket_burst", vec![spec(Algorithm::TokenBucket, 3, 1000, Some(7), None)]),
        ("leaky_bucket_meter", vec![spec(Algorithm::LeakyBucket, 7, 1500, None, None)]),
        ("leaky_bucket_shaper", vec![spec(Algorithm::LeakyBucket, 4, 1000, None, Some(3))]),
        ("fixed_window", vec![spec(Algorithm::FixedWindow, 5, 1000, None, None)]),
        ("sliding_window_log", vec![spec(Algorithm::SlidingWindowLog, 5, 1500, None, None)]),
        ("sliding_window_counter", vec![spec(Algorithm::SlidingWindowCounter, 6, 1000, None, None)]),
        (
            "all_together",
            vec![
                spec(Algorithm::TokenBucket, 6, 1000, Some(8), None),
                spec(Algorithm::SlidingWindowCounter, 9, 1500, None, None),
                spec(Algorithm::FixedWindow, 7, 1000, None, None),
            ],
        ),
    ];
    for (seed, (name, specs)) in cases.iter().enumerate() {
        same_outcomes(&store, name, specs, Charge::AllOrNothing, seed as u64).await;
    }
    // Penalties charge each admitting bucket, as in memory.
    let penalties =
        [spec(Algorithm::SlidingWindowLog, 4, 1000, None, None), spec(Algorithm::FixedWindow, 6, 1000, None, None)];
    same_outcomes(&store, "penalties", &penalties, Charge::EachAdmitting, 99).await;
}

#[tokio::test]
async fn a_reloaded_limit_keeps_the_token_bucket_level_on_redis_as_in_memory() {
    let redis = TestRedis::shared();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("rescale"), Duration::from_secs(2)).expect("fleet");
    let store = RedisStore::new(fleet, TimeSource::Caller);
    let memory = MemoryStore::new(100.try_into().expect("nonzero"));
    let policy: Arc<str> = Arc::from("rescaled");
    let mut now = Duration::from_secs(SystemClock.now().as_secs());
    for (limit, steps) in [(5, 20), (7, 20), (3, 20)] {
        let spec = spec(Algorithm::TokenBucket, limit, 1000, None, None);
        for step in 0..steps {
            now += Duration::from_micros(97_531);
            let bucket = [Bucket { policy: &policy, key: "k", spec: &spec }];
            let expected = memory.apply(&bucket, now, Charge::AllOrNothing);
            assert_eq!(
                store.apply(&bucket, now, Charge::AllOrNothing).await.expect("redis"),
                expected,
                "limit {limit} step {step}"
            );
        }
    }
}

const PER_IP: &str = r#"
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "sliding_window_log"
limit = 3
window = "1m"
"#;

/// Kills Redis mid-run and brings it back: `store_failure` decides meanwhile, each
/// such decision is counted, and limits come back without restarting the proxy.
async fn outage(store_failure: &str, during: StatusCode) {
    let mut redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("outage"), store_failure);
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{keys}{PER_IP}"), upstream.addr).await;
    let client = TestClient::default();
    let url = proxy.url("/");
    let get = || client.get(&url, &[]);

    let before: Vec<StatusCode> =
        [get().await, get().await, get().await, get().await].iter().map(|r| r.status).collect();
    assert_eq!(before, [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);

    redis.stop();
    for i in 0..10 {
        let reply = get().await;
        assert_eq!(reply.status, during, "{store_failure}: request {i} during the outage");
        assert!(reply.elapsed < Duration::from_secs(1), "a decision waits at most the Redis timeout");
    }
    assert_eq!(proxy.proxy.stats().store_failures, 10, "every decision without Redis is counted");

    // The server comes back empty (no persistence): the limit starts over, and is
    // enforced again as soon as the proxy's probe reaches it.
    redis.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    loop {
        let reply: Reply = get().await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        statuses.push(reply.status);
        assert!(std::time::Instant::now() < deadline, "{store_failure}: limits did not resume: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failures = proxy.proxy.stats().store_failures;
    let admitted_by_redis = statuses.len() - usize::try_from(failures - 10).expect("count");
    assert_eq!(admitted_by_redis, 3, "{store_failure}: after recovery, the limit holds exactly: {statuses:?}");
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(proxy.proxy.stats().store_failures, failures, "no failures once Redis is back");
}

#[tokio::test]
async fn redis_down_allows_while_it_is_away_and_limits_resume() {
    outage("allow", StatusCode::OK).await;
}

#[tokio::test]
async fn redis_down_denies_while_it_is_away_and_limits_resume() {
    outage("deny", StatusCode::SERVICE_UNAVAILABLE).await;
}

const SECRET: &[u8] = b"k-pay-fleet-secret";

fn signed_config(keys: &str) -> String {
    let path = std::env::temp_dir().join(format!("limiter-fleet-secret-{}", std::process::id()));
    std::fs::write(&path, SECRET).expect("secret file");
    signed_route_config(keys, &path)
}

async fn send_signed(
    client: &TestClient,
    proxy: &RunningProxy,
    body: &[u8],
    nonce: &str,
    idempotency_key: Option<&str>,
) -> Reply {
    let timestamp = SystemClock.now().as_secs().to_string();
    let canonical = Canonical {
        method: "POST",
        target: "/api/transfer",
        timestamp: &timestamp,
        body_sha256: &sha256(body),
        nonce: Some(nonce),
    };
    let signature = sign_hex(SECRET, &canonical.string_to_sign());
    let mut headers = vec![
        ("x-api-key", "k-pay"),
        ("x-timestamp", timestamp.as_str()),
        ("x-signature", signature.as_str()),
        ("x-nonce", nonce),
    ];
    headers.extend(idempotency_key.map(|key| ("idempotency-key", key)));
    client.request(Method::POST, &proxy.url("/api/transfer"), &headers, body).await
}

#[tokio::test]
async fn a_replay_on_another_proxy_is_caught_and_idempotent_responses_are_shared() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("signed"), "deny");
    let upstream = Upstream::start().await;
    let config = signed_config(&keys);
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    let client = TestClient::default();

    // The same signed request, first on one proxy, then on the other.
    let body = b"{\"amount\":1}";
    assert_eq!(send_signed(&client, &a, body, "n-1", None).await.status, StatusCode::OK);
    assert_eq!(send_signed(&client, &b, body, "n-1", None).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(b.proxy.stats().replays, 1);

    // An idempotent request completed on one proxy is replayed by the other, and the
    // same key with another body is a conflict there too.
    let first = send_signed(&client, &a, body, "n-2", Some("idem-1")).await;
    assert_eq!(first.status, StatusCode::OK);
    let repeat = send_signed(&client, &b, body, "n-3", Some("idem-1")).await;
    assert_eq!((repeat.status, repeat.header("idempotency-replayed")), (StatusCode::OK, "true"));
    assert_eq!(repeat.body, first.body);
    let other = send_signed(&client, &b, b"{\"amount\":2}", "n-4", Some("idem-1")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.count(), 2, "the replays never reached the upstream");
}
