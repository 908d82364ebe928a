//! Decisions per second of the five proxy algorithms, keyed (the proxy's
//! `MemoryStore`, one bucket per decision) and bare (`check` + `charge` on a state
//! per key), against `governor`'s keyed limiter on the same key stream: 10 000 keys,
//! 1 and 2 threads, `limit` 1000 per second for every limiter. Prints one JSON object;
//! `cargo xtask bench` runs it.
//!
//! Usage: bench_algorithms [DECISIONS_PER_THREAD] [KEYS]

use std::{
    hint::black_box,
    num::{NonZeroU32, NonZeroUsize},
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use governor::{Quota, RateLimiter};
use limiter_core::{
    Algorithm, Clock as _, LimitSpec, SystemClock,
    limits::{
        Bucket, Charge, MemoryStore, fixed_window, leaky_bucket, sliding_window_counter, sliding_window_log,
        token_bucket,
    },
};
use limiter_lab::report::{AlgorithmRow, Algorithms};

const LIMIT: u32 = 1000;

/// A reproducible stream of key indices (xorshift), the same for every limiter.
fn key_stream(len: usize, keys: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % keys as u64) as u32
        })
        .collect()
}

/// Runs `f(thread, stream)` on `threads` threads at once; returns decisions per
/// second over all threads and the fraction admitted.
fn measure<F>(threads: usize, streams: &[Vec<u32>], f: F) -> (f64, f64)
where
    F: Fn(&[u32]) -> u64 + Sync,
{
    let barrier = Barrier::new(threads);
    let results: Vec<(Duration, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams[..threads]
            .iter()
            .map(|stream| {
                let (barrier, f) = (&barrier, &f);
                scope.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    let admitted = f(stream);
                    (started.elapsed(), admitted)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    let decisions: usize = streams[..threads].iter().map(Vec::len).sum();
    let slowest = results.iter().map(|r| r.0).max().unwrap_or_default();
    let admitted: u64 = results.iter().map(|r| r.1).sum();
    (decisions as f64 / slowest.as_secs_f64(), admitted as f64 / decisions as f64)
}

fn spec(algorithm: Algorithm) -> LimitSpec {
    LimitSpec {
        algorithm,
        limit: NonZeroU32::new(LIMIT).unwrap_or(NonZeroU32::MIN),
        window: Duration::from_secs(1),
        burst: None,
        throttle: None,
        queue: None,
        cost: limiter_core::Cost::default(),
        calendar: None,
    }
}

fn name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "token_bucket",
        Algorithm::LeakyBucket => "leaky_bucket",
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindowLog => "sliding_window_log",
        Algorithm::SlidingWindowCounter => "sliding_window_counter",
    }
}

/// Single-thread cost of the algorithm alone: check then charge on a per-key state
/// in a flat vector (no hashing, no locking).
fn bare(algorithm: Algorithm, stream: &[u32], keys: usize) -> f64 {
    let spec = spec(algorithm);
    let clock = SystemClock;
    macro_rules! run {
        ($module:ident) => {{
            let mut states: Vec<$module::State> = (0..keys).map(|_| Default::default()).collect();
            let started = Instant::now();
            let mut admitted = 0u64;
            for &k in stream {
                let now = clock.now();
                let state = &mut states[k as usize];
                if $module::check(&spec, state, now).admitted {
                    $module::charge(&spec, state, now);
                    admitted += 1;
                }
            }
            black_box(admitted);
            started.elapsed()
        }};
    }
    let elapsed = match algorithm {
        Algorithm::TokenBucket => run!(token_bucket),
        Algorithm::LeakyBucket => run!(leaky_bucket),
        Algorithm::FixedWindow => run!(fixed_window),
        Algorithm::SlidingWindowLog => run!(sliding_window_log),
        Algorithm::SlidingWindowCounter => run!(sliding_window_counter),
    };
    stream.len() as f64 / elapsed.as_secs_f64()
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let per_thread: usize = args.next().map_or(Ok(2_000_000), |a| a.parse())?;
    let keys: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let names: Vec<String> =
        (0..keys).map(|i| format!("10.{}.{}.{}", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff)).collect();
    let streams: Vec<Vec<u32>> = (0..2).map(|t| key_stream(per_thread, keys, 0x9e37_79b9_7f4a_7c15 + t)).collect();
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
    ];
    let mut rows = Vec::new();
    for threads in [1usize, 2] {
        // governor: a fresh keyed limiter with the same quota and the same keys.
        let quota = Quota::per_second(NonZeroU32::new(LIMIT).unwrap_or(NonZeroU32::MIN));
        let governor = RateLimiter::keyed(quota);
        let (rate, admitted) = measure(threads, &streams, |stream| {
            let mut admitted = 0;
            for &k in stream {
                if governor.check_key(&names[k as usize]).is_ok() {
                    admitted += 1;
                }
            }
            admitted
        });
        rows.push(AlgorithmRow {
            limiter: "governor (keyed, DashMap)".to_owned(),
            algorithm: "governor".to_owned(),
            threads,
            decisions_per_second: rate,
            admitted_fraction: admitted,
            bare_decisions_per_second: None,
        });
        for algorithm in algorithms {
            let spec = spec(algorithm);
            let store = MemoryStore::new(NonZeroUsize::new(1_000_000).unwrap_or(NonZeroUsize::MIN));
            let policy: Arc<str> = Arc::from(format!("rule:{}", name(algorithm)));
            let clock = SystemClock;
            let (rate, admitted) = measure(threads, &streams, |stream| {
                let mut admitted = 0;
                for &k in stream {
                    let bucket = Bucket { policy: &policy, key: &names[k as usize], spec: &spec };
                    let outcome = store.apply(&[bucket], clock.now(), Charge::AllOrNothing);
                    if outcome.first().is_some_and(|o| o.admitted) {
                        admitted += 1;
                    }
                }
                admitted
            });
            rows.push(AlgorithmRow {
                limiter: "limiter MemoryStore".to_owned(),
                algorithm: name(algorithm).to_owned(),
                threads,
                decisions_per_second: rate,
                admitted_fraction: admitted,
                bare_decisions_per_second: (threads == 1).then(|| bare(algorithm, &streams[0], keys)),
            });
        }
    }
    let report = Algorithms {
        keys,
        decisions_per_thread: per_thread,
        limit_per_second: LIMIT,
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        rows,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
