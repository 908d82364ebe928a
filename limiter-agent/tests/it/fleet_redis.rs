//! Limits shared through Redis (`store = "redis"`): several proxies on one server,
//! the Redis scripts against the in-memory algorithms, and Redis going away.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use http::{Method, StatusCode};
use limiter::{
    backend::{RedisStore, TimeSource},
    fleet::{Fleet, FleetError},
};
use limiter_core::{
    Algorithm, Clock as _, Cost, CostFrom, CostSource, LimitSpec, SystemClock,
    calendar::{Calendar, Period, Zone},
    limits::{Bucket, Charge, Debit, MemoryStore, Outcomes, Refund},
    signature::{Canonical, sha256, sign_hex},
};
use limiter_lab::support::{
    proxy::{PROXY_HEAD, Reply, RunningProxy, TestClient, Upstream, posted_at_once, secret_file, signed_route_config},
    redis::{FREE_PLAN as FREE, REDIS_TIMEOUT, TestRedis, redis_cli, redis_keys, unique_prefix},
    wait::PATIENCE,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

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

/// 20 units an hour, charged what the upstream's `X-Request-Cost` says (a token
/// bucket: the server's clock returns a unit every 3 minutes, and no window turns).
const METERED: &str = r#"
[[proxy.rules]]
name = "metered"
path = "/llm"
key = "ip"
algorithm = "token_bucket"
limit = 20
window = "1h"
cost_from = { response_header = "x-request-cost", max = 1000 }
"#;

/// Two agents on one Redis charge one client's `x-request-cost: 7` answers to one
/// balance: 20 → 13 → 6 → −1 over both, so the fourth, on either, is refused.
#[tokio::test]
async fn two_proxies_on_one_redis_charge_post_paid_costs_to_one_balance() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("post-paid"), "deny");
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{keys}{METERED}");
    let proxies =
        [RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await];
    let client = TestClient::default();
    for (i, left) in ["13", "6", "0"].into_iter().enumerate() {
        let reply = client.get(&proxies[i % 2].url("/llm?cost=7"), &[]).await;
        assert_eq!((reply.status, reply.header("x-ratelimit-remaining")), (StatusCode::OK, left), "request {i}");
        assert_eq!(reply.header("x-request-cost"), "<absent>");
    }
    for proxy in &proxies {
        let refused = client.get(&proxy.url("/llm?cost=7"), &[]).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "in debt on both agents");
    }
    assert_eq!(upstream.count(), 3);
    for proxy in &proxies {
        assert_eq!(proxy.proxy.stats().store_failures, 0);
    }
}

/// 5 failed logins an hour per user, counted on Redis (a sliding log: no window edge a
/// test could straddle on the server's clock).
const FAILED_LOGINS: &str = r#"
[[proxy.rules]]
name = "failed-logins-per-user"
path = "/login"
methods = ["POST"]
key = "header:x-user"
algorithm = "sliding_window_log"
limit = 5
window = "1h"
count_when = { status = ["401", "403"] }
"#;

/// Two agents on one Redis count one user's failed logins together, successes on
/// either cost nothing, and failures in flight on both at once never pass the limit.
#[tokio::test]
async fn two_proxies_on_one_redis_share_the_failed_logins_and_count_no_success() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("count-when"), "deny");
    let upstream = Upstream::start().await;
    let config = format!("{PROXY_HEAD}{keys}{FAILED_LOGINS}");
    let proxies =
        [RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await];
    let client = TestClient::default();
    let login = |i: usize, user: &'static str, query: &str| {
        let (client, url) = (client.clone(), proxies[i % 2].url(&format!("/login{query}")));
        async move { client.request(Method::POST, &url, &[("x-user", user)], b"").await.status }
    };
    for i in 0..10 {
        assert_eq!(login(i, "alice", "").await, StatusCode::OK, "success {i}");
    }
    for i in 0..5 {
        assert_eq!(login(i, "alice", "?status=401").await, StatusCode::UNAUTHORIZED, "failure {i}");
    }
    for i in 0..2 {
        assert_eq!(login(i, "alice", "").await, StatusCode::TOO_MANY_REQUESTS, "after five failures, on either");
    }
    assert_eq!(upstream.count(), 15);
    for proxy in &proxies {
        proxy.stats_until("five refunds each", |stats| stats.refunded == 5).await;
    }
    let urls = (0..10).map(|i| proxies[i % 2].url("/login?status=401&delay_ms=300"));
    let statuses = posted_at_once(urls, &[("x-user", "bob")]).await;
    let count = |status: StatusCode| statuses.iter().filter(|s| **s == status).count();
    assert_eq!((count(StatusCode::UNAUTHORIZED), count(StatusCode::TOO_MANY_REQUESTS)), (5, 5), "{statuses:?}");
    assert_eq!(upstream.count(), 20, "five of bob's ten reached the upstream");
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
        calendar: None,
        cost: limiter_core::Cost::default(),
    }
}

/// `spec` with a cost of `units` a request.
fn costing(units: u32, spec: LimitSpec) -> LimitSpec {
    LimitSpec { cost: Cost::Units(NonZeroU32::new(units).expect("units")), ..spec }
}

/// `spec` post-paid, at most `max` units a request.
fn post_paid(max: u32, spec: LimitSpec) -> LimitSpec {
    let from = CostFrom { source: CostSource::UpstreamMs, max: NonZeroU32::new(max).expect("max") };
    LimitSpec { cost: Cost::From(from), ..spec }
}

/// Runs one schedule through both stores, step by step, and demands the same
/// outcomes (admission, quotas, retry, wait, the time charged) from each, for
/// `charge` and for checks that charge nothing, with now and then the charges of a
/// recent step given back (a `count_when` rule's, at once or later), and each
/// admitted request's post-paid charges (up to twice their `max`, clamped as the
/// proxy does) taken from both.
async fn same_outcomes(redis: &RedisStore, name: &str, specs: &[LimitSpec], charge: Charge, seed: u64) {
    let memory = MemoryStore::new(1000.try_into().expect("nonzero"));
    let mut rng = StdRng::seed_from_u64(seed);
    let policies: Vec<Arc<str>> = (0..specs.len()).map(|i| Arc::from(format!("{name}-{i}"))).collect();
    let shortest = specs.iter().map(|s| s.window / s.limit.get()).min().expect("a spec");
    // Microseconds, as the server's clock counts; started now so that keys live long
    // enough in real time.
    let mut now = Duration::from_secs(SystemClock.now().as_secs());
    let (mut admitted, mut refunds) = (0, 0);
    let mut recent: Vec<Outcomes> = Vec::new();
    for step in 0..300 {
        let gap_us = rng.random_range(0..=u64::try_from(shortest.as_micros()).expect("gap") * 3 / 2);
        // Now and then a pause past every window, a burst with no gap at all, and the
        // clock stepping back (a VM restored, NTP correcting a fast clock).
        now = match step % 50 {
            49 => now + Duration::from_millis(3000),
            25 => now - Duration::from_millis(700),
            0..10 => now,
            _ => now + Duration::from_micros(gap_us),
        };
        let buckets: Vec<Bucket<'_>> =
            specs.iter().zip(&policies).map(|(spec, policy)| Bucket { policy, key: "client", spec }).collect();
        // Now and then a look that charges nothing (`limiter explain`'s): the same
        // answer from both, and the next charged step shows it changed no bucket.
        if step % 4 == 3 {
            let expected = memory.apply(&buckets, now, Charge::Nothing);
            let actual = redis.apply(&buckets, now, Charge::Nothing).await.expect("redis");
            assert_eq!(actual, expected, "{name}: check at step {step}");
        }
        let expected = memory.apply(&buckets, now, charge);
        let actual: Outcomes = redis.apply(&buckets, now, charge).await.expect("redis");
        assert_eq!(actual, expected, "{name}: step {step} at {now:?}");
        admitted += usize::from(expected.iter().all(|o| o.admitted));
        let debits: Vec<Debit<'_>> = buckets
            .iter()
            .zip(&expected)
            .filter(|(_, o)| o.charged_at.is_some())
            .filter_map(|(bucket, _)| {
                let from = bucket.spec.cost.post_paid()?;
                Some(Debit {
                    bucket: *bucket,
                    units: from.units(Some(rng.random_range(0..=2 * u64::from(from.max.get())))),
                })
            })
            .collect();
        if !debits.is_empty() {
            memory.debit(&debits, now);
            redis.debit(&debits, now).await.expect("redis");
        }
        if expected.iter().any(|o| o.charged_at.is_some()) {
            recent.push(expected);
            if recent.len() > 3 {
                recent.remove(0);
            }
        }
        if !recent.is_empty() && rng.random_range(0..8) == 0 {
            let given = recent.remove(rng.random_range(0..recent.len()));
            let back: Vec<Refund<'_>> = buckets
                .iter()
                .zip(&given)
                .filter_map(|(bucket, o)| Some(Refund { bucket: *bucket, charged_at: o.charged_at? }))
                .collect();
            memory.refund(&back, now);
            redis.refund(&back, now).await.expect("redis");
            refunds += 1;
        }
    }
    assert!((10..290).contains(&admitted), "{name}: the schedule should both admit and reject ({admitted} admitted)");
    assert!(refunds > 20, "{name}: the schedule should give back ({refunds} refunds)");
}

#[tokio::test]
async fn every_algorithm_decides_and_gives_back_on_redis_exactly_as_in_memory() {
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
        ("sliding_window_log_large", vec![spec(Algorithm::SlidingWindowLog, 40, 1500, None, None)]),
        ("sliding_window_counter", vec![spec(Algorithm::SlidingWindowCounter, 6, 1000, None, None)]),
        ("token_bucket_cost", vec![costing(3, spec(Algorithm::TokenBucket, 5, 1000, Some(8), None))]),
        ("leaky_bucket_shaper_cost", vec![costing(2, spec(Algorithm::LeakyBucket, 4, 1000, None, Some(3)))]),
        ("fixed_window_cost", vec![costing(4, spec(Algorithm::FixedWindow, 9, 1000, None, None))]),
        ("sliding_window_counter_cost", vec![costing(3, spec(Algorithm::SlidingWindowCounter, 10, 1000, None, None))]),
        ("token_bucket_post_paid", vec![post_paid(4, spec(Algorithm::TokenBucket, 6, 1000, None, None))]),
        ("leaky_bucket_post_paid", vec![post_paid(3, spec(Algorithm::LeakyBucket, 5, 1500, None, None))]),
        ("fixed_window_post_paid", vec![post_paid(5, spec(Algorithm::FixedWindow, 8, 1000, None, None))]),
        (
            "sliding_window_counter_post_paid",
            vec![post_paid(4, spec(Algorithm::SlidingWindowCounter, 9, 1000, None, None))],
        ),
        (
            "costs_together",
            vec![
                costing(2, spec(Algorithm::TokenBucket, 6, 1000, Some(8), None)),
                post_paid(3, spec(Algorithm::SlidingWindowCounter, 9, 1500, None, None)),
                spec(Algorithm::FixedWindow, 7, 1000, None, None),
            ],
        ),
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

/// Calendar windows on Redis: the boundaries the agent works out around its clock, the
/// window the script picks among them, and refunds, as in memory; in Berlin, whose
/// months begin at 23:00 or 22:00 UTC with the season, and in UTC weeks.
#[tokio::test]
async fn calendar_windows_decide_and_give_back_on_redis_exactly_as_in_memory() {
    let redis = TestRedis::shared();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("calendar"), Duration::from_secs(2)).expect("fleet");
    let store = RedisStore::new(fleet, TimeSource::Caller);
    let on = |period: Period, zone: &str| LimitSpec {
        window: period.nominal(),
        calendar: Some(Calendar { period, zone: Zone::named(zone).expect("zone") }),
        ..spec(Algorithm::FixedWindow, 5, 1000, None, None)
    };
    let cases = [
        ("day_berlin", on(Period::Day, "Europe/Berlin")),
        ("week_utc", on(Period::Week, "UTC")),
        ("month_berlin", on(Period::Month, "Europe/Berlin")),
    ];
    for (seed, (name, spec)) in cases.into_iter().enumerate() {
        same_outcomes(&store, name, &[spec], Charge::AllOrNothing, 200 + seed as u64).await;
    }
}

/// On the server's clock a calendar window is the one Redis' `TIME` is in, among the
/// boundaries the agent sends around its own clock: agents a day ahead and a day
/// behind count in the server's one day, and its refusal points at the server's
/// midnight.
#[tokio::test]
async fn on_the_servers_clock_a_calendar_window_is_the_servers_among_the_agents_boundaries() {
    let redis = TestRedis::shared();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("calendar-skew"), Duration::from_secs(2)).expect("fleet");
    let store = RedisStore::new(fleet, TimeSource::Server);
    let calendar = Calendar { period: Period::Day, zone: Zone::utc() };
    let until_midnight = |now: Duration| calendar.bounds(now).1 - now;
    let daily = LimitSpec {
        window: Period::Day.nominal(),
        calendar: Some(calendar.clone()),
        ..spec(Algorithm::FixedWindow, 2, 1000, None, None)
    };
    // Away from midnight, so that the server's day does not turn during the test.
    if until_midnight(SystemClock.now()) < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_secs(11)).await;
    }
    let policy: Arc<str> = Arc::from("skewed");
    let bucket = [Bucket { policy: &policy, key: "k", spec: &daily }];
    let day = Duration::from_secs(86_400);
    let ahead = store.apply(&bucket, SystemClock.now() + day, Charge::AllOrNothing).await.expect("redis");
    let behind = store.apply(&bucket, SystemClock.now() - day, Charge::AllOrNothing).await.expect("redis");
    assert!(ahead[0].admitted && behind[0].admitted);
    assert_eq!((ahead[0].after.remaining, behind[0].after.remaining), (1, 0), "one day, counted twice");
    let refused = store.apply(&bucket, SystemClock.now() + day, Charge::AllOrNothing).await.expect("redis");
    assert!(!refused[0].admitted);
    let expected = until_midnight(SystemClock.now());
    assert!(
        refused[0].retry_after.abs_diff(expected) < Duration::from_secs(2),
        "retry after {:?}, the server's midnight in {expected:?}",
        refused[0].retry_after
    );
}

/// A reload keeps a bucket's state under a changed limit: the token bucket's level,
/// and the sliding log's entries, more of them than a lowered limit (whose refusals
/// then wait for the right one to leave, found by its rank in Redis' sorted set).
#[tokio::test]
async fn a_reloaded_limit_keeps_the_state_on_redis_as_in_memory() {
    let redis = TestRedis::shared();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("rescale"), Duration::from_secs(2)).expect("fleet");
    let store = RedisStore::new(fleet, TimeSource::Caller);
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindowLog] {
        let memory = MemoryStore::new(100.try_into().expect("nonzero"));
        let policy: Arc<str> = Arc::from(format!("rescaled-{}", algorithm.name()));
        let mut now = Duration::from_secs(SystemClock.now().as_secs());
        for (limit, steps) in [(5, 20), (7, 20), (3, 20), (9, 10), (2, 20)] {
            let spec = spec(algorithm, limit, 1000, None, None);
            for step in 0..steps {
                now += Duration::from_micros(if step % 3 == 0 { 0 } else { 97_531 });
                let bucket = [Bucket { policy: &policy, key: "k", spec: &spec }];
                let expected = memory.apply(&bucket, now, Charge::AllOrNothing);
                assert_eq!(
                    store.apply(&bucket, now, Charge::AllOrNothing).await.expect("redis"),
                    expected,
                    "{algorithm:?}: limit {limit} step {step}"
                );
            }
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
    // Until its retry_after the refused bucket is the agent's own to answer (the
    // first tier), Redis or not: past it, the outage decides.
    proxy.clock.advance(Duration::from_secs(61));

    redis.stop();
    for i in 0..10 {
        let reply = get().await;
        assert_eq!(reply.status, during, "{store_failure}: request {i} during the outage");
        // Refused at once by a dead server: it must not wait out the timeout.
        assert!(reply.elapsed < REDIS_TIMEOUT / 2, "{store_failure}: request {i} took {:?}", reply.elapsed);
        assert!(!decided_in_redis(&reply), "{store_failure}: request {i} names a policy during the outage");
    }
    proxy.stats_until("every decision without Redis counted", |stats| stats.store_failures == 10).await;

    // The server comes back empty (no persistence): the limit starts over, and is
    // enforced again as soon as the proxy's probe reaches it.
    redis.start();
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut replies = Vec::new();
    loop {
        let reply: Reply = get().await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        replies.push(reply);
        let statuses: Vec<StatusCode> = replies.iter().map(|r| r.status).collect();
        assert!(std::time::Instant::now() < deadline, "{store_failure}: limits did not resume: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (in_redis, without): (Vec<&Reply>, Vec<&Reply>) = replies.iter().partition(|reply| decided_in_redis(reply));
    let statuses: Vec<(StatusCode, bool)> = replies.iter().map(|r| (r.status, decided_in_redis(r))).collect();
    assert_eq!(in_redis.len(), 3, "{store_failure}: after recovery, the limit holds exactly: {statuses:?}");
    assert!(without.iter().all(|reply| reply.status == during), "{statuses:?}");
    let failures = 10 + u64::try_from(without.len()).expect("count");
    proxy.stats_until("every decision without Redis counted", |stats| stats.store_failures == failures).await;
    assert_eq!(get().await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(proxy.proxy.stats().store_failures, failures, "no failures once Redis is back");
}

/// Whether the store decided `reply`: a decision taken without it names no policy
/// (and [`PROXY_HEAD`] discloses the policies of every other).
fn decided_in_redis(reply: &Reply) -> bool {
    reply.headers.contains_key("ratelimit-policy")
}

#[tokio::test]
async fn redis_down_allows_while_it_is_away_and_limits_resume() {
    outage("allow", StatusCode::OK).await;
}

#[tokio::test]
async fn redis_down_denies_while_it_is_away_and_limits_resume() {
    outage("deny", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// `agents` proxies of `config` on one Redis, once each one's heartbeats count them all.
async fn fleet_of(agents: usize, config: &str, upstream: &Upstream) -> Vec<RunningProxy> {
    let mut proxies = Vec::new();
    for _ in 0..agents {
        proxies.push(RunningProxy::start(config, upstream.addr).await);
    }
    for proxy in &proxies {
        proxy.stats_until("the heartbeats count the fleet", |stats| stats.fleet_agents as usize == agents).await;
    }
    proxies
}

/// Sends `requests` of the free key, one proxy after the other; how many each
/// admitted, every answer being 200 or 429.
async fn admitted_in_turn(proxies: &[RunningProxy], client: &TestClient, requests: usize) -> Vec<u32> {
    let mut admitted = vec![0; proxies.len()];
    for i in 0..requests {
        let reply = client.get(&proxies[i % proxies.len()].url("/api"), &[("x-api-key", "k-free")]).await;
        match reply.status {
            StatusCode::OK => admitted[i % proxies.len()] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("request {i}: {other}"),
        }
    }
    admitted
}

/// `store_failure = "local"`: two proxies learn from their heartbeats that the fleet
/// is two; with Redis gone each enforces half of the 100/min plan, so that the two
/// together admit exactly 100 of 150, not all of them and not none.
#[tokio::test]
async fn redis_down_with_local_fallback_each_agent_enforces_its_share() {
    let mut redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("local"), "local");
    let upstream = Upstream::start().await;
    let proxies = fleet_of(2, &format!("{PROXY_HEAD}{keys}{FREE}"), &upstream).await;

    redis.stop();
    let admitted = admitted_in_turn(&proxies, &TestClient::default(), 150).await;
    assert_eq!(admitted, [50, 50], "each agent its share: 100 / 2");
    for proxy in &proxies {
        proxy
            .stats_until("every decision counted as local", |stats| {
                (stats.local_decisions, stats.store_failures) == (75, 75)
            })
            .await;
    }
}

/// `store_failure = "local"` when Redis goes away mid-window: the two proxies had
/// spent 60 of the 100/min plan in Redis, so each starts its share (50) from what
/// Redis last told it was left (41 after A's last request, 40 after B's), halved:
/// together they admit 21 + 20, the 40 left and the one of rounding up, where shares
/// started full admitted 100 more.
#[tokio::test]
async fn local_fallback_mid_window_starts_each_share_from_what_the_fleet_had_left() {
    let mut redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("mid-window"), "local");
    let upstream = Upstream::start().await;
    let proxies = fleet_of(2, &format!("{PROXY_HEAD}{keys}{FREE}"), &upstream).await;
    let client = TestClient::default();
    assert_eq!(admitted_in_turn(&proxies, &client, 60).await, [30, 30], "in Redis");

    redis.stop();
    let admitted = admitted_in_turn(&proxies, &client, 100).await;
    assert_eq!(admitted, [21, 20], "each share from what was left: 41 / 2 and 40 / 2, rounded up");
    for proxy in &proxies {
        proxy.stats_until("every decision counted as local", |stats| stats.local_decisions == 50).await;
    }
}

/// The local shares follow the agents still heartbeating: Redis refuses the limits'
/// keys to the fleet's user (as a server can fail one kind of call and not another)
/// while the heartbeats still count the fleet. Three agents each take a third of the
/// 100/min plan (34); one stops, the two left count two within the heartbeats' 3 s,
/// and each takes half (50: 16 more each).
#[tokio::test]
async fn local_shares_follow_the_agents_still_heartbeating() {
    let redis = TestRedis::private();
    let prefix = unique_prefix("shares");
    assert_eq!(redis_cli(redis.port, &["acl", "setuser", "fleet", "on", ">pw", "+@all", "~*"]).trim(), "OK");
    let url = format!("redis://fleet:pw@127.0.0.1:{}/", redis.port);
    let keys = redis_keys(&redis, &prefix, "local").replace(redis.url(), &url);
    let upstream = Upstream::start().await;
    let mut proxies = fleet_of(3, &format!("{PROXY_HEAD}{keys}{FREE}"), &upstream).await;
    let heartbeats = format!("~{prefix}agents");
    let only_heartbeats = ["acl", "setuser", "fleet", "resetkeys", heartbeats.as_str()];
    assert_eq!(redis_cli(redis.port, &only_heartbeats).trim(), "OK");

    let client = TestClient::default();
    assert_eq!(admitted_in_turn(&proxies, &client, 120).await, [34, 34, 34], "a third each, rounded up");
    proxies.pop().expect("the third").shutdown().await;
    for proxy in &proxies {
        proxy.stats_until("the heartbeats count the two left", |stats| stats.fleet_agents == 2).await;
    }
    assert_eq!(admitted_in_turn(&proxies, &client, 60).await, [16, 16], "half each now: 50, 34 of it spent");
    for proxy in &proxies {
        proxy.stats_until("every decision counted as local", |stats| stats.local_decisions == 70).await;
    }
}

/// How long the proxies of [`hang`] wait for Redis: short, as a hang is waited out.
const HANG_TIMEOUT: Duration = Duration::from_millis(500);

/// A 1000-a-minute rule per address: never refused here, so that `local` forwards
/// every request it decides.
const ROOMY: &str = "[[proxy.rules]]\nname = \"roomy\"\nkey = \"ip\"\nlimit = 1000\nwindow = \"1m\"\n";

/// A Redis that hangs (SIGSTOP: it keeps its connections and accepts new ones but
/// answers nothing) rather than dies: each decision waits at most `redis_timeout`,
/// the breaker opens after three failures and then answers at once, `store_failure`
/// decides meanwhile, and limits resume by themselves once it answers again.
async fn hang(store_failure: &str, during: StatusCode) {
    let redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("hang"), store_failure)
        .replace(&format!("{}ms", REDIS_TIMEOUT.as_millis()), &format!("{}ms", HANG_TIMEOUT.as_millis()));
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{keys}{ROOMY}"), upstream.addr).await;
    let client = TestClient::default();
    let url = proxy.url("/");
    let first = client.get(&url, &[]).await;
    assert!(first.status == StatusCode::OK && decided_in_redis(&first), "{store_failure}: decided in Redis");

    redis.pause();
    let mut replies = Vec::new();
    // Three decisions in a row that find no answer open the breaker, whatever the
    // heartbeat's own calls add to them.
    for _ in 0..3 {
        replies.push(client.get(&url, &[]).await);
    }
    proxy.stats_until("the breaker open", |stats| !stats.store_reachable).await;
    assert!(
        replies[0].elapsed >= HANG_TIMEOUT * 9 / 10,
        "{store_failure}: the first decision waits for Redis, took {:?}",
        replies[0].elapsed
    );
    // Open, it lets one call in each backoff through to probe the server (which waits
    // the timeout too), and answers every other at once.
    let answered_at_once = |reply: &Reply| reply.elapsed < HANG_TIMEOUT / 2;
    while !replies[3..].iter().any(answered_at_once) {
        assert!(replies.len() < 20, "{store_failure}: the open breaker still waits for Redis");
        replies.push(client.get(&url, &[]).await);
    }
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status, during, "{store_failure}: request {i} while Redis hangs");
        // Local limits name their policies as Redis' do; the counts tell them apart.
        let named = decided_in_redis(reply);
        assert!(store_failure == "local" || !named, "{store_failure}: request {i} names a policy while Redis hangs");
        let most = HANG_TIMEOUT + Duration::from_secs(1);
        assert!(reply.elapsed < most, "{store_failure}: request {i} took {:?}", reply.elapsed);
    }
    let hung = u64::try_from(replies.len()).expect("count");
    let local = if store_failure == "local" { hung } else { 0 };
    proxy
        .stats_until("every decision without Redis counted", |stats| {
            (stats.store_failures, stats.local_decisions) == (hung, local)
        })
        .await;

    // The heartbeat's probe finds it answering again, with no request to notice.
    redis.resume();
    proxy.stats_until("the outage ends without requests", |stats| stats.store_reachable).await;
    let reply = client.get(&url, &[]).await;
    assert!(reply.status == StatusCode::OK && decided_in_redis(&reply), "{store_failure}: decided in Redis again");
    assert!(reply.elapsed < HANG_TIMEOUT, "{store_failure}: answered without waiting, took {:?}", reply.elapsed);
    // Forwarded after its decision: once it is counted, so is any failure it met.
    let stats = proxy.stats_until("the request after the outage forwarded", |stats| stats.forwarded == local + 2).await;
    assert_eq!(stats.store_failures, hung, "{store_failure}: no failure once Redis answers");
}

#[tokio::test]
async fn a_hanging_redis_is_waited_out_and_each_agent_decides_locally_until_it_answers() {
    hang("local", StatusCode::OK).await;
}

#[tokio::test]
async fn a_hanging_redis_is_waited_out_and_decisions_are_denied_until_it_answers() {
    hang("deny", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// Rejections are counted fleet-wide: a client refused twice by each of two agents
/// crosses a threshold of 3 that neither agent alone would see it cross.
#[tokio::test]
async fn rejections_spread_over_two_agents_escalate_as_if_on_one() {
    use limiter::{config::Config, escalation::Escalator};
    let redis = TestRedis::shared();
    let upstream = Upstream::start().await;
    let deny = "[[proxy.rules]]\nname = \"probe\"\naction = \"deny\"\npath = \"/wp-login.php\"\nescalate = true\n";
    let config = format!("{PROXY_HEAD}{deny}");
    let whole = Config::parse(
        &format!("[xdp]\ninterfaces = [\"lo\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 20\n{config}[escalation]\nthreshold = 3\n")
            .replace("{upstream}", &upstream.addr.to_string()),
        std::path::Path::new("test.toml"),
    )
    .expect("escalation config");
    let client = TestClient::default();
    for shared in [false, true] {
        let fleet = Fleet::connect(redis.url(), &unique_prefix("escalation"), Duration::from_secs(2)).expect("fleet");
        let mut escalated = Vec::new();
        let mut proxies = Vec::new();
        for _ in 0..2 {
            let proxy = RunningProxy::start(&config, upstream.addr).await;
            let (sender, receiver) = tokio::sync::mpsc::channel(8);
            let escalator = Escalator::new(&whole, sender, proxy.clock.clone(), shared.then(|| fleet.clone()));
            proxy.proxy.escalate_to(Arc::new(escalator));
            proxies.push(proxy);
            escalated.push(receiver);
        }
        for i in 0..4 {
            let reply = client.get(&proxies[i % 2].url("/wp-login.php"), &[]).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN);
        }
        if shared {
            let [first, second] = &mut escalated[..] else { unreachable!("two agents") };
            let escalation = tokio::time::timeout(PATIENCE, async {
                tokio::select! {
                    escalation = first.recv() => escalation,
                    escalation = second.recv() => escalation,
                }
            })
            .await
            .expect("escalated in time")
            .expect("an escalation");
            assert_eq!(escalation.cidr.to_string(), "127.0.0.1/32");
        } else {
            // Counted on each agent alone, 2 of 3 each: synchronous, so settled now.
            assert!(escalated.iter_mut().all(|receiver| receiver.try_recv().is_err()), "escalated per agent");
        }
    }
}

/// The penalty ladder's offences are the fleet's: an offence on one agent and one on
/// another give the second agent's block the second rung, and `limiter unblock` on
/// one forgets the offences seen by all.
#[tokio::test]
async fn offences_on_two_agents_climb_one_ladder() {
    use limiter::{
        config::Config,
        escalation::{Escalation, Escalator, Penalty},
    };
    let redis = TestRedis::shared();
    let prefix = unique_prefix("ladder");
    let config = Config::parse(
        &format!(
            "[xdp]\ninterfaces = [\"lo\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 20\n\
             {}[escalation]\nthreshold = 3\nwindow = \"200ms\"\nblock_ttl = \"10m\"\nblock_ttl_factor = 2\n",
            PROXY_HEAD.replace("{upstream}", "127.0.0.1:1")
        ),
        std::path::Path::new("test.toml"),
    )
    .expect("ladder config");
    let agent = || {
        let fleet = Fleet::connect(redis.url(), &prefix, Duration::from_secs(2)).expect("fleet");
        let (sender, receiver) = tokio::sync::mpsc::channel(8);
        (Escalator::new(&config, sender, SystemClock, Some(fleet)), receiver)
    };
    let ((a, mut from_a), (b, mut from_b)) = (agent(), agent());
    let source: std::net::IpAddr = "203.0.113.9".parse().expect("address");
    async fn next(receiver: &mut tokio::sync::mpsc::Receiver<Escalation>) -> (Penalty, Duration) {
        let escalation = tokio::time::timeout(PATIENCE, receiver.recv()).await.expect("in time").expect("sent");
        (escalation.penalty, escalation.ttl)
    }
    let minutes = |m: u64| (Penalty::Block, Duration::from_secs(60 * m));
    a.offend(source);
    assert_eq!(next(&mut from_a).await, minutes(10));
    // Past the window, so that it is an offence of its own (the server's clock).
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.offend(source);
    assert_eq!(next(&mut from_b).await, minutes(20), "A's offence counted on B");
    let key = format!("{prefix}offences:203.0.113.9/32");
    let query = |command: &mut redis::Cmd| -> i64 {
        let mut connection = redis::Client::open(redis.url()).and_then(|c| c.get_connection()).expect("redis");
        command.query(&mut connection).expect("redis answer")
    };
    assert_eq!(query(redis::cmd("ZCARD").arg(&key)), 2);
    let ttl = query(redis::cmd("PTTL").arg(&key));
    assert!(ttl > 0 && ttl <= 7 * 86_400_000, "kept for offence_memory: {ttl}");

    b.unblocked("203.0.113.9/32".parse().expect("cidr"), false).await.expect("forgotten in Redis");
    assert_eq!(query(redis::cmd("EXISTS").arg(&key)), 0);
    // B's unblock lifted its own block (A's lasts): B's next offence is a first one,
    // A's offence forgotten with B's.
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.offend(source);
    assert_eq!(next(&mut from_b).await, minutes(10), "the ladder starts again");
}

/// The heartbeat is the breaker's probe: Redis coming back ends the outage with no
/// request to notice it, so the first request after it is decided in Redis again.
/// `tracked_keys` and `evictions` are the server's figures.
#[tokio::test]
async fn an_outage_ends_when_redis_is_back_whether_requests_come_or_not() {
    let mut redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("probe"), "allow");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{keys}{PER_IP}"), upstream.addr).await;
    let client = TestClient::default();
    let url = proxy.url("/");
    assert_eq!(client.get(&url, &[]).await.status, StatusCode::OK);
    // The rule's bucket, the fleet's heartbeat set, at least.
    let stats = proxy.stats_until("the server's keys", |stats| stats.tracked_keys >= 2).await;
    assert_eq!(stats.evictions, 0);

    redis.stop();
    assert_eq!(client.get(&url, &[]).await.status, StatusCode::OK);
    // A heartbeat answered just before the kill may report the store up after the
    // request found it down; the next heartbeat finds it down again.
    proxy.stats_until("the outage noticed", |stats| !stats.store_reachable).await;
    let failures =
        proxy.stats_until("the request decided without Redis", |stats| stats.store_failures == 1).await.store_failures;
    redis.start();
    proxy.stats_until("the outage ends without requests", |stats| stats.store_reachable).await;
    let reply = client.get(&url, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(decided_in_redis(&reply), "decided in Redis again at once");
    assert_eq!(proxy.proxy.stats().store_failures, failures, "decided in Redis again at once");
}

const SECRET: &[u8] = b"k-pay-fleet-secret";

fn signed_config(keys: &str) -> String {
    signed_route_config(keys, &secret_file(SECRET))
}

async fn send_signed(
    client: &TestClient,
    proxy: &RunningProxy,
    body: &[u8],
    nonce: &str,
    idempotency_key: Option<&str>,
) -> Reply {
    Signed { key: ("k-pay", SECRET), target: "/api/transfer", body, nonce, idempotency_key }
        .send(client, &proxy.url(""))
        .await
}

/// The timestamp every signed request of this run carries: a replay must carry the very
/// same signature, whenever the wall clock turns a second between two sends. The run
/// lasts far less than `max_skew`.
fn run_timestamp() -> u64 {
    static STAMP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STAMP.get_or_init(|| SystemClock.now().as_secs())
}

/// A signed POST.
struct Signed<'a> {
    /// Key id and secret.
    key: (&'a str, &'a [u8]),
    target: &'a str,
    body: &'a [u8],
    nonce: &'a str,
    idempotency_key: Option<&'a str>,
}

impl Signed<'_> {
    /// Sends to the proxy at `base` (`http://host:port`).
    async fn send(&self, client: &TestClient, base: &str) -> Reply {
        self.send_at(client, base, run_timestamp()).await
    }

    /// [`Self::send`], signed at `timestamp` (unix seconds).
    async fn send_at(&self, client: &TestClient, base: &str, timestamp: u64) -> Reply {
        let timestamp = timestamp.to_string();
        let canonical = Canonical {
            method: "POST",
            target: self.target,
            timestamp: &timestamp,
            body_sha256: &sha256(self.body),
            nonce: Some(self.nonce),
            idempotency_key: self.idempotency_key,
            host: None,
        };
        let signature = sign_hex(self.key.1, &canonical.string_to_sign());
        let mut headers = vec![
            ("x-api-key", self.key.0),
            ("x-timestamp", timestamp.as_str()),
            ("x-signature", signature.as_str()),
            ("x-nonce", self.nonce),
        ];
        headers.extend(self.idempotency_key.map(|key| ("idempotency-key", key)));
        client.request(Method::POST, &format!("{base}{}", self.target), &headers, self.body).await
    }
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
    b.stats_until("the replay counted", |stats| stats.replays == 1).await;

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

const OTHER: &[u8] = b"k-other-fleet-secret";

/// `signed_config` with a second key, `k-other`, and `extra` in `[proxy]`.
fn two_keys_config(keys: &str, extra: &str) -> String {
    let path = secret_file(OTHER);
    let other =
        format!("[[proxy.keys]]\nid = \"k-other\"\nplan = \"basic\"\nsecrets = [\"file:{}\"]\n", path.display());
    format!("{}{other}", signed_config(&format!("{keys}{extra}")))
}

/// One key filling the fleet's replay cache used to be impossible to bound (Redis
/// held every signature); each key now holds its share of `replay_cache_size`. A
/// signature refused by a limit used to be forgotten (issue 25 item 10): it is burnt
/// fleet-wide, so its bytes sent again to another agent are a replay.
#[tokio::test]
async fn on_redis_each_key_has_its_share_of_the_replay_cache_and_a_429_burns_the_signature() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("replay-share"), "deny");
    let per_key = "[[proxy.rules]]\nname = \"per-key\"\npath = \"/api/once\"\nkey = \"api_key\"\nalgorithm = \"sliding_window_log\"\nlimit = 1\nwindow = \"1h\"\n";
    let config = format!("{}{per_key}", two_keys_config(&keys, "[proxy.signature]\nreplay_cache_size = 6\n"));
    let upstream = Upstream::start().await;
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    let client = TestClient::default();
    let pay =
        |nonce| Signed { key: ("k-pay", SECRET), target: "/api/transfer", body: b"x", nonce, idempotency_key: None };
    let mut flood = Vec::new();
    for (proxy, nonce) in [(&a, "1"), (&b, "2"), (&a, "3"), (&b, "4")] {
        flood.push(pay(nonce).send(&client, &proxy.url("")).await.status);
    }
    assert_eq!(flood, [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::UNAUTHORIZED]);
    let other = |target, nonce| Signed { key: ("k-other", OTHER), target, body: b"x", nonce, idempotency_key: None };
    assert_eq!(other("/api/transfer", "1").send(&client, &b.url("")).await.status, StatusCode::OK);
    // k-other's second request on /api/once is over its limit: 429, and the same
    // signed request sent again, to the other proxy, is a replay.
    assert_eq!(other("/api/once", "2").send(&client, &a.url("")).await.status, StatusCode::OK);
    let refused = other("/api/once", "3");
    assert_eq!(refused.send(&client, &a.url("")).await.status, StatusCode::TOO_MANY_REQUESTS);
    let again = refused.send(&client, &b.url("")).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "a replay, not another 429: {:?}", again.body);
    b.stats_until("the resend counted as a replay", |stats| stats.replays == 1).await;
    assert_eq!(upstream.count(), 5);
}

/// Twenty identical idempotent requests at once over two proxies: one reaches the
/// upstream, the others get 409; once it timed out (504), a repeat gets "outcome
/// unknown" and never reaches the upstream (it used to run again).
#[tokio::test]
async fn on_redis_an_idempotent_request_runs_once_whatever_happens() {
    let redis = TestRedis::shared();
    let prefix = unique_prefix("idem-once");
    let keys = redis_keys(&redis, &prefix, "deny");
    let config = signed_config(&format!("{keys}upstream_timeout = \"500ms\"\n"));
    let upstream = Upstream::start().await;
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    let (done, mut replies) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..20 {
        let base = if n % 2 == 0 { a.url("") } else { b.url("") };
        let done = done.clone();
        tokio::spawn(async move {
            let nonce = n.to_string();
            let _ = done.send(held(&nonce).send(&TestClient::default(), &base).await.status);
        });
    }
    let mut statuses = Vec::new();
    for _ in 0..19 {
        let status = tokio::time::timeout(PATIENCE, replies.recv()).await.expect("19 answered at once");
        statuses.push(status.expect("a sender"));
    }
    // The one sent upstream is held for the TTL (24 h), not just the in-flight lease:
    // were its agent to die now, no repeat could run it again.
    upstream.arrived(1).await;
    let mut connection =
        redis::Client::open(redis.url()).expect("client").get_multiplexed_async_connection().await.expect("connect");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{prefix}idem:5:k-pay:idem-20"))
        .query_async(&mut connection)
        .await
        .expect("PTTL");
    assert!(ttl > 3_600_000, "the claim lives {ttl} ms");
    let status = tokio::time::timeout(PATIENCE, replies.recv()).await.expect("the held one answered");
    statuses.push(status.expect("a sender"));
    statuses.sort();
    // The one that reached the upstream is held there until it times out.
    let mut expected = vec![StatusCode::CONFLICT; 19];
    expected.push(StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(statuses, expected);
    assert_eq!(upstream.count(), 1);
    upstream.release(2);
    // The claim is settled in Redis by a task of its own: until it lands a repeat is
    // in flight (409 too). Either way it must not reach the upstream.
    let unknown = "https://limiter.dev/problems#idempotency-outcome-unknown";
    let client = TestClient::default();
    let repeats = async {
        for n in 0.. {
            let nonce = format!("retry-{n}");
            let reply = held(&nonce).send(&client, &b.url("")).await;
            if reply.status != StatusCode::CONFLICT || reply.json()["type"] == unknown {
                return reply;
            }
            tokio::task::yield_now().await;
        }
        unreachable!("the nonces ran out")
    };
    let repeat = tokio::time::timeout(PATIENCE, repeats).await.expect("the repeat was answered");
    assert_eq!((repeat.status, repeat.json()["type"].as_str()), (StatusCode::CONFLICT, Some(unknown)));
    assert_eq!(upstream.count(), 1);
}

/// The held, idempotent request of `on_redis_an_idempotent_request_runs_once_whatever_happens`.
fn held(nonce: &str) -> Signed<'_> {
    Signed {
        key: ("k-pay", SECRET),
        target: "/api/transfer/hold",
        body: b"pay",
        nonce,
        idempotency_key: Some("idem-20"),
    }
}

/// The fleet's idempotency store was bounded by nothing but Redis' memory; each key
/// now holds its share of `idempotency_max_entries` (and `_bytes`), and evicts only
/// its own entries.
#[tokio::test]
async fn on_redis_a_key_evicts_only_its_own_idempotent_responses() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("idem-share"), "deny");
    let config = two_keys_config(&keys, "[proxy.signature]\nidempotency_max_entries = 4\n");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let base = proxy.url("");
    let request = |key, nonce, idempotency_key| Signed {
        key,
        target: "/api/transfer",
        body: b"pay",
        nonce,
        idempotency_key: Some(idempotency_key),
    };
    let other = ("k-other", OTHER);
    let pay = ("k-pay", SECRET);
    assert_eq!(request(other, "o-1", "kept").send(&client, &base).await.status, StatusCode::OK);
    for (nonce, key) in [("1", "a"), ("2", "b"), ("3", "c"), ("4", "d")] {
        assert_eq!(request(pay, nonce, key).send(&client, &base).await.status, StatusCode::OK);
    }
    assert_eq!(upstream.count(), 5);
    let kept = request(other, "o-2", "kept").send(&client, &base).await;
    assert_eq!((kept.status, kept.header("idempotency-replayed")), (StatusCode::OK, "true"));
    let latest = request(pay, "5", "d").send(&client, &base).await;
    assert_eq!(latest.header("idempotency-replayed"), "true");
    // k-pay's share is 2: its oldest response went to make room for its newest.
    let evicted = request(pay, "6", "a").send(&client, &base).await;
    assert_eq!((evicted.status, evicted.headers.get("idempotency-replayed")), (StatusCode::OK, None));
    assert_eq!(upstream.count(), 6);
}

/// The problem type of every answer given for want of the shared store.
const STORE_UNAVAILABLE: &str = "https://limiter.dev/problems#store-unavailable";

/// Replay protection and idempotency used to follow `store_failure = "allow"`: with
/// Redis slow or gone, a signed request was forwarded unrecorded (replayable on every
/// agent) and an idempotent one run without its key (runnable twice). Both now fail
/// closed with 503 under every `store_failure`, while the limits still follow it
/// (`unsigned`: what an unsigned request gets): a hung server (SIGSTOP) and a dead one.
async fn fail_closed(store_failure: &str, unsigned: StatusCode) {
    let mut redis = TestRedis::private();
    let keys = redis_keys(&redis, &unique_prefix("fail-closed"), store_failure)
        .replace(&format!("redis_timeout = \"{}ms\"", REDIS_TIMEOUT.as_millis()), "redis_timeout = \"1s\"");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{}{PER_IP}", signed_config(&keys)), upstream.addr).await;
    let client = TestClient::default();
    assert_eq!(send_signed(&client, &proxy, b"1", "before", None).await.status, StatusCode::OK);
    assert_eq!(send_signed(&client, &proxy, b"1", "before-idem", Some("idem-before")).await.status, StatusCode::OK);
    let forwarded = upstream.count();

    let refused = |reply: &Reply, what: &str| {
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{store_failure}: {what}: {:?}", reply.body);
        assert_eq!(reply.json()["type"].as_str(), Some(STORE_UNAVAILABLE), "{store_failure}: {what}");
    };
    redis.pause();
    refused(&send_signed(&client, &proxy, b"2", "hung", None).await, "signed, Redis hung");
    refused(&send_signed(&client, &proxy, b"2", "hung-idem", Some("idem-hung")).await, "idempotent, Redis hung");
    redis.resume();
    redis.stop();
    refused(&send_signed(&client, &proxy, b"3", "dead", None).await, "signed, Redis dead");
    refused(&send_signed(&client, &proxy, b"3", "dead-idem", Some("idem-dead")).await, "idempotent, Redis dead");
    // The limits still follow store_failure: the per-ip rule (3 a minute, 2 spent)
    // has one left, in Redis as in this agent's local share.
    assert_eq!(client.get(&proxy.url("/"), &[]).await.status, unsigned, "{store_failure}: unsigned");
    let through = usize::from(unsigned == StatusCode::OK);
    assert_eq!(upstream.count(), forwarded + through, "{store_failure}: only an unsigned request went upstream");
    proxy.stats_until("every decision without Redis counted", |stats| stats.store_failures >= 4).await;
}

#[tokio::test]
async fn signed_and_idempotent_requests_fail_closed_without_redis_even_under_allow() {
    fail_closed("allow", StatusCode::OK).await;
}

#[tokio::test]
async fn signed_and_idempotent_requests_fail_closed_without_redis_under_local() {
    fail_closed("local", StatusCode::OK).await;
}

#[tokio::test]
async fn signed_and_idempotent_requests_fail_closed_without_redis_under_deny() {
    fail_closed("deny", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// The idempotency store's own call failing, the replay cache's having succeeded (one
/// slow answer no longer opens the breaker): the request used to go upstream without
/// its key, so that a repeat could run it again. The agent's Redis user may not touch
/// the `idem` keys, so that exactly that call fails.
#[tokio::test]
async fn an_idempotent_request_fails_closed_when_only_the_idempotency_call_fails() {
    let redis = TestRedis::private();
    let prefix = unique_prefix("idem-closed");
    let acl = ["acl", "setuser", "noidem", "on", ">pw", "+@all", "resetkeys"];
    let patterns: Vec<String> =
        ["replay:*", "limit:*", "log:*", "agents"].iter().map(|k| format!("~{prefix}{k}")).collect();
    let args: Vec<&str> = acl.iter().copied().chain(patterns.iter().map(String::as_str)).collect();
    assert_eq!(redis_cli(redis.port, &args).trim(), "OK");
    let url = format!("redis://noidem:pw@127.0.0.1:{}/", redis.port);
    let keys = redis_keys(&redis, &prefix, "allow").replace(redis.url(), &url);
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&signed_config(&keys), upstream.addr).await;
    let client = TestClient::default();
    assert_eq!(
        send_signed(&client, &proxy, b"1", "plain", None).await.status,
        StatusCode::OK,
        "replay cache reachable"
    );
    let reply = send_signed(&client, &proxy, b"2", "idem", Some("idem-1")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", reply.body);
    assert_eq!(reply.json()["type"].as_str(), Some(STORE_UNAVAILABLE));
    assert_eq!(upstream.count(), 1, "the idempotent request never went upstream");
}

/// One slow answer used to open the breaker, switching every decision of the agent
/// to `store_failure` until a probe got through: whoever could slow the server once
/// (one heavy script) flipped the whole fleet. Now it opens after three failures in
/// a row, and a success in between starts the count again. The server hangs
/// (SIGSTOP), so each failure is a timeout.
#[tokio::test]
async fn the_breaker_opens_after_three_failures_in_a_row_not_one() {
    let redis = TestRedis::private();
    let fleet = Fleet::connect(redis.url(), &unique_prefix("breaker"), Duration::from_millis(300)).expect("fleet");
    let call = || async { fleet.evictions().await };
    // The connection's own response timeout, or the call's.
    let timed_out = |result: Result<u64, FleetError>| match result {
        Err(FleetError::Timeout(_)) => true,
        Err(FleetError::Redis(error)) => error.is_timeout(),
        _ => false,
    };
    call().await.expect("Redis answers");
    redis.pause();
    for failure in 1..=2 {
        assert!(timed_out(call().await), "failure {failure}");
        assert!(fleet.is_up(), "the breaker stays closed after {failure} failure(s)");
    }
    redis.resume();
    call().await.expect("Redis answers again");
    redis.pause();
    for failure in 1..=2 {
        assert!(timed_out(call().await), "failure {failure} after a success");
        assert!(fleet.is_up(), "the count started over: {failure} failure(s)");
    }
    assert!(timed_out(call().await), "the third failure");
    assert!(!fleet.is_up(), "the breaker opens at the third failure in a row");
    let started = std::time::Instant::now();
    assert!(matches!(call().await, Err(FleetError::Down)), "an open breaker refuses at once");
    assert!(started.elapsed() < Duration::from_millis(300), "without waiting for the timeout");
    redis.resume();
}

/// The script calls on the `log:` keys of `prefix` the server logged (SLOWLOG, set
/// to keep every command): one per decision asked of Redis. The heartbeats' calls
/// name no such key.
fn limit_calls(redis: &TestRedis, prefix: &str) -> usize {
    let log = redis_cli(redis.port, &["slowlog", "get", "-1"]);
    let lines: Vec<&str> = log.lines().collect();
    let key = format!("{prefix}log:");
    (0..lines.len())
        .filter(|&i| lines[i].eq_ignore_ascii_case("evalsha") && lines.get(i + 3).is_some_and(|k| k.starts_with(&key)))
        .count()
}

/// A client over its limit used to cost one script call in Redis per request, however
/// many it sent after the first refusal: a volume of refused requests alone could slow
/// the fleet's server. The agent now answers a bucket Redis refused until its
/// `retry_after` without asking (`refused_locally`); the sliding log is a sorted set.
#[tokio::test]
async fn refused_requests_stop_reaching_redis_until_their_retry_after() {
    let redis = TestRedis::private();
    redis_cli(redis.port, &["config", "set", "slowlog-log-slower-than", "0"]);
    redis_cli(redis.port, &["config", "set", "slowlog-max-len", "100000"]);
    let prefix = unique_prefix("first-tier");
    let keys = redis_keys(&redis, &prefix, "local");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{PROXY_HEAD}{keys}{PER_IP}"), upstream.addr).await;
    let client = TestClient::default();
    let url = proxy.url("/");
    let statuses = |replies: &[Reply]| replies.iter().map(|r| r.status).collect::<Vec<_>>();
    let mut first = Vec::new();
    for _ in 0..4 {
        first.push(client.get(&url, &[]).await);
    }
    assert_eq!(statuses(&first), [StatusCode::OK, StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    redis_cli(redis.port, &["slowlog", "reset"]);

    const REFUSED: u64 = 50;
    for i in 0..REFUSED {
        let reply = client.get(&url, &[]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "request {i}");
        let retry_after: u64 = reply.header("retry-after").parse().expect("retry-after");
        assert!((55..=60).contains(&retry_after), "request {i}: retry after {retry_after}");
    }
    let stats = proxy.stats_until("every refusal counted", |stats| stats.rejected == 1 + REFUSED).await;
    assert_eq!(limit_calls(&redis, &prefix), 0, "none of the {REFUSED} refused requests asked Redis");
    assert_eq!(stats.refused_locally, REFUSED);
    // A request whose body is read whole (one carrying X-Signature) is asked about
    // before the read: of the first tier too.
    for i in 0..10 {
        let reply = client.get(&url, &[("x-signature", "00")]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "signed request {i}");
    }
    proxy.stats_until("the signed refusals counted", |stats| stats.refused_locally == REFUSED + 10).await;
    assert_eq!(limit_calls(&redis, &prefix), 0, "none of the refused signed requests asked Redis");

    // Past its retry_after by this agent's clock the bucket is asked of Redis again,
    // once; its own clock has not moved, so it refuses, and is remembered again.
    proxy.clock.advance(Duration::from_secs(61));
    for _ in 0..3 {
        assert_eq!(client.get(&url, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    proxy.stats_until("the first tier's refusals counted", |stats| stats.refused_locally == REFUSED + 12).await;
    assert_eq!(limit_calls(&redis, &prefix), 1, "one asked Redis, then the agent knew again");
    assert_eq!(upstream.count(), 3);
    let log_key = redis_cli(redis.port, &["--scan", "--pattern", &format!("{prefix}log:*")]);
    assert_eq!(redis_cli(redis.port, &["type", log_key.trim()]).trim(), "zset", "{log_key}");
}

/// The replay cache in Redis expired signatures by the clock of the agent asking:
/// one agent whose clock ran 30 s ahead dropped, with any signed request of its own,
/// the signatures the others still accepted, which could then be replayed there
/// (issue 25, item 14). They now expire by the server's clock.
#[tokio::test]
async fn an_agent_with_a_fast_clock_does_not_reopen_replays_on_the_others() {
    let redis = TestRedis::shared();
    let keys = redis_keys(&redis, &unique_prefix("replay-clock"), "deny");
    let upstream = Upstream::start().await;
    let config = signed_config(&keys);
    let (fast, honest) =
        (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    fast.clock.advance(Duration::from_secs(30));
    let client = TestClient::default();
    let pay =
        |nonce| Signed { key: ("k-pay", SECRET), target: "/api/transfer", body: b"x", nonce, idempotency_key: None };
    // Signed 290 s ago: within max_skew (300 s) on the honest agent for 10 s more.
    let old = honest.clock.now().as_secs() - 290;
    assert_eq!(pay("old").send_at(&client, &honest.url(""), old).await.status, StatusCode::OK);
    // A signed request on the fast agent runs the replay script in its turn.
    let fresh = pay("fresh").send_at(&client, &fast.url(""), fast.clock.now().as_secs()).await;
    assert_eq!(fresh.status, StatusCode::OK);
    let replay = pay("old").send_at(&client, &honest.url(""), old).await;
    assert_eq!(replay.status, StatusCode::UNAUTHORIZED, "the old signature replayed: {:?}", replay.body);
    honest.stats_until("the replay counted", |stats| stats.replays == 1).await;
    assert_eq!(upstream.count(), 2);
}
