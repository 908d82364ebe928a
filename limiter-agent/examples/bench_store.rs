//! Decisions per second of the limits' stores, one bucket per key over 1,000 keys, a
//! token bucket that never refuses (so every decision charges): the in-memory store
//! in-process, and the Redis store against one `redis-server` and a Redis Cluster of
//! three masters and three replicas, both started here on the loopback, with a number
//! of decisions in flight at once. Prints one JSON object.
//!
//! Usage: bench_store [DECISIONS] [CONCURRENCY]

use std::{
    num::NonZeroU32,
    sync::Arc,
    time::{Duration, Instant},
};

use limiter::{
    backend::{RedisStore, TimeSource},
    fleet::Fleet,
};
use limiter_core::{
    Algorithm, Clock as _, LimitSpec, SystemClock,
    limits::{Bucket, Charge, MemoryStore},
};
use limiter_lab::{
    report::{Store, StoreRow},
    support::redis::{TestCluster, TestRedis},
};

const KEYS: u64 = 1_000;

fn spec() -> LimitSpec {
    let huge = NonZeroU32::new(1_000_000_000).unwrap_or(NonZeroU32::MIN);
    LimitSpec {
        algorithm: Algorithm::TokenBucket,
        limit: huge,
        window: Duration::from_secs(1),
        burst: None,
        throttle: None,
        queue: None,
        cost: limiter_core::Cost::default(),
        calendar: None,
    }
}

fn p99(mut micros: Vec<f64>) -> f64 {
    micros.sort_by(f64::total_cmp);
    micros.get(micros.len().saturating_mul(99) / 100).copied().unwrap_or(0.0)
}

fn memory(decisions: u64) -> StoreRow {
    let store = MemoryStore::new(std::num::NonZeroUsize::new(10_000).unwrap_or(std::num::NonZeroUsize::MIN));
    let (spec, policy): (LimitSpec, Arc<str>) = (spec(), Arc::from("bench"));
    let mut times = Vec::with_capacity(usize::try_from(decisions).unwrap_or(0));
    let started = Instant::now();
    for i in 0..decisions {
        let key = (i % KEYS).to_string();
        let one = Instant::now();
        store.apply(&[Bucket { policy: &policy, key: &key, spec: &spec }], SystemClock.now(), Charge::AllOrNothing);
        times.push(one.elapsed().as_secs_f64() * 1e6);
    }
    let seconds = started.elapsed().as_secs_f64();
    StoreRow {
        store: "memory".to_owned(),
        decisions,
        concurrency: 1,
        decisions_per_second: decisions as f64 / seconds,
        p99_us: p99(times),
    }
}

async fn redis(name: &str, url: &str, decisions: u64, concurrency: usize) -> anyhow::Result<StoreRow> {
    let fleet = Fleet::connect(url, "bench:", Duration::from_secs(2))?;
    let store = Arc::new(RedisStore::new(fleet, TimeSource::Server));
    let policy: Arc<str> = Arc::from("bench");
    // Connects, loads the script, and warms the cluster's slot map.
    store
        .apply(&[Bucket { policy: &policy, key: "warm", spec: &spec() }], SystemClock.now(), Charge::AllOrNothing)
        .await?;
    let per_task = decisions / concurrency as u64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (store, policy) = (Arc::clone(&store), Arc::clone(&policy));
            tokio::spawn(async move {
                let spec = spec();
                let mut times = Vec::new();
                for i in 0..per_task {
                    let key = ((task as u64 * per_task + i) % KEYS).to_string();
                    let one = Instant::now();
                    store
                        .apply(
                            &[Bucket { policy: &policy, key: &key, spec: &spec }],
                            SystemClock.now(),
                            Charge::AllOrNothing,
                        )
                        .await?;
                    times.push(one.elapsed().as_secs_f64() * 1e6);
                }
                anyhow::Ok(times)
            })
        })
        .collect();
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let done = per_task * concurrency as u64;
    Ok(StoreRow {
        store: name.to_owned(),
        decisions: done,
        concurrency,
        decisions_per_second: done as f64 / seconds,
        p99_us: p99(times),
    })
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let decisions: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let concurrency: usize = args.next().map_or(Ok(32), |a| a.parse())?;
    let mut rows = vec![memory(decisions)];
    let single = TestRedis::private();
    rows.push(redis("redis", single.url(), decisions, concurrency).await?);
    let cluster = TestCluster::start();
    rows.push(redis("redis cluster", &cluster.url(), decisions, concurrency).await?);
    println!("{}", serde_json::to_string(&Store { rows })?);
    Ok(())
}
