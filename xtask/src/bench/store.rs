//! The store group: the `bench_store` example's decisions per second in memory,
//! through one Redis and through a Redis Cluster.

use std::fmt::Write as _;

use limiter_lab::report::{Outcome, Store};

use super::{Bench, format::num};

pub const TITLE: &str = "7. Limits stores";

pub fn run(bench: &mut Bench) -> Outcome<Store> {
    let s = bench.sizes;
    bench.example("bench_store", &[s.store_decisions.to_string(), "32".to_owned()])
}

pub fn markdown(m: &mut String, store: &Store) {
    let _ = writeln!(
        m,
        "## {TITLE}\n\nOne bucket per key over 1,000 keys, every decision charging.\n\n\
         | store | in flight | decisions/s | p99 µs |\n|---|---|---|---|"
    );
    for r in &store.rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} |",
            r.store,
            r.concurrency,
            num(Some(r.decisions_per_second), 0),
            num(Some(r.p99_us), 1)
        );
    }
}
