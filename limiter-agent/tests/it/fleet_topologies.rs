//! Fleets beyond one Redis, against real servers the tests start: a Redis Cluster of
//! three masters and three replicas, and a master with a replica behind a Sentinel.
//! Each shares exact limits between agents and follows a failover of the master
//! without restarting them.

use std::time::{Duration, Instant};

use http::StatusCode;
use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream},
    redis::{FREE_PLAN as FREE, TestCluster, TestSentinel, TestTlsRedis, redis_keys_at, unique_prefix},
    wait::PATIENCE,
};

fn fleet_config(url: &str, prefix: &str) -> String {
    format!("{PROXY_HEAD}{}{FREE}", redis_keys_at(url, prefix, "deny"))
}

/// Sends `count` requests with the key, alternating between `proxies`; the statuses.
async fn spend(proxies: &[&RunningProxy], count: usize) -> Vec<StatusCode> {
    let client = TestClient::default();
    let mut statuses = Vec::with_capacity(count);
    for i in 0..count {
        statuses.push(client.get(&proxies[i % proxies.len()].url("/api"), &[("x-api-key", "k-free")]).await.status);
    }
    statuses
}

fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

/// Sends requests until one is decided in Redis again (not 503 by `store_failure =
/// "deny"`), a bounded while; the statuses of the ones that were.
async fn until_redis_decides(proxy: &RunningProxy) -> Vec<StatusCode> {
    let deadline = Instant::now() + PATIENCE * 6;
    loop {
        let status = spend(&[proxy], 1).await[0];
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return vec![status];
        }
        assert!(Instant::now() < deadline, "the proxy never reached the new master");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_share_exact_limits_across_a_cluster_and_follow_a_master_failover() {
    let mut cluster = TestCluster::start();
    let prefix = unique_prefix("cluster");
    let upstream = Upstream::start().await;
    let config = fleet_config(&cluster.url(), &prefix);
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);

    let statuses = spend(&[&a, &b], 150).await;
    assert_eq!(
        (count(&statuses, StatusCode::OK), count(&statuses, StatusCode::TOO_MANY_REQUESTS)),
        (100, 50),
        "exactly the plan, across both agents"
    );
    assert_eq!(upstream.count(), 100);

    // Every key of the fleet is in the slot of its hash tag: kill that slot's master.
    cluster.kill_master_of(&format!("{{{prefix}}}"));
    let after = until_redis_decides(&a).await;
    // The replica had the buckets: the key is still spent.
    assert_eq!(after, [StatusCode::TOO_MANY_REQUESTS]);
    let statuses = spend(&[&a, &b], 10).await;
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 10, "{statuses:?}");
    assert_eq!(upstream.count(), 100, "nothing past the plan after the failover");
}

/// The fleet's slot moves to another master while both agents decide: the client
/// follows MOVED and ASK, and each decision stays one script on one node, so the plan
/// holds exactly across the move.
#[tokio::test(flavor = "multi_thread")]
async fn a_resharding_under_load_keeps_every_decision_atomic() {
    let cluster = TestCluster::start();
    let prefix = unique_prefix("reshard");
    let tag = format!("{{{prefix}}}");
    let upstream = Upstream::start().await;
    let config = fleet_config(&cluster.url(), &prefix);
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    let mut statuses = spend(&[&a, &b], 40).await;
    let source = cluster.master_of(&tag);
    let moving = tokio::task::spawn_blocking(move || {
        let target = cluster.migrate_slot_of(&tag);
        (cluster, tag, target)
    });
    statuses.extend(spend(&[&a, &b], 110).await);
    let (cluster, tag, target) = moving.await.expect("the migration");
    assert_ne!(source, target);
    assert_eq!(cluster.master_of(&tag), target, "the slot moved");
    statuses.extend(spend(&[&a, &b], 10).await);
    let unavailable = count(&statuses, StatusCode::SERVICE_UNAVAILABLE);
    eprintln!("resharding: {unavailable} of {} requests found the store unavailable", statuses.len());
    assert_eq!(count(&statuses, StatusCode::OK), 100, "{statuses:?}");
    assert_eq!(upstream.count(), 100);
}

#[tokio::test(flavor = "multi_thread")]
async fn behind_a_sentinel_limits_resume_on_the_promoted_replica() {
    let mut sentinel = TestSentinel::start();
    let upstream = Upstream::start().await;
    let config = fleet_config(&sentinel.url(), &unique_prefix("sentinel"));
    let (a, b) = (RunningProxy::start(&config, upstream.addr).await, RunningProxy::start(&config, upstream.addr).await);
    let before = spend(&[&a, &b], 60).await;
    assert_eq!(count(&before, StatusCode::OK), 60);
    sentinel.wait_replicated();

    sentinel.kill_master_and_fail_over();
    let first = until_redis_decides(&a).await;
    let statuses = [first, until_redis_decides(&b).await, spend(&[&a, &b], 58).await].concat();
    let admitted = count(&statuses, StatusCode::OK);
    // 40 left of the plan, on the replica that had the 60.
    assert_eq!(admitted, 40, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 20, "{statuses:?}");
    assert_eq!(upstream.count(), 100);
}

/// TLS to the fleet's Redis, one server and a cluster speaking only TLS, trusting
/// the CA `redis_tls_ca` names; without it the system's roots do not know the
/// certificate and the store is unreachable (503 under `store_failure = "deny"`).
#[tokio::test(flavor = "multi_thread")]
async fn tls_to_one_server_and_to_a_cluster_verifies_the_servers_certificates() {
    let single = TestTlsRedis::start();
    let cluster = TestCluster::start_tls();
    let upstream = Upstream::start().await;
    for (url, ca) in
        [(single.url(), single.tls.ca.clone()), (cluster.url(), cluster.ca().expect("a TLS cluster").to_owned())]
    {
        let config = fleet_config(&url, &unique_prefix("tls"));
        let trusting = config.replace("store_failure", &format!("redis_tls_ca = \"{}\"\nstore_failure", ca.display()));
        let (a, b) =
            (RunningProxy::start(&trusting, upstream.addr).await, RunningProxy::start(&trusting, upstream.addr).await);
        let statuses = spend(&[&a, &b], 150).await;
        assert_eq!(
            (count(&statuses, StatusCode::OK), count(&statuses, StatusCode::TOO_MANY_REQUESTS)),
            (100, 50),
            "{url}: exactly the plan over TLS"
        );
        let unverified = RunningProxy::start(&config, upstream.addr).await;
        assert_eq!(
            spend(&[&unverified], 1).await,
            [StatusCode::SERVICE_UNAVAILABLE],
            "{url}: an unknown CA is refused"
        );
    }
    assert_eq!(upstream.count(), 200);
}
