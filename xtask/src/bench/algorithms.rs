//! The algorithms group: the `bench_algorithms` example's decisions per second of
//! each proxy algorithm against governor's keyed limiter.

use std::fmt::Write as _;

use limiter_lab::report::{AlgorithmRow, Algorithms, Outcome};

use super::{Bench, format::num, svg::bar_chart};

pub const TITLE: &str = "4. Decisions per second";

/// The anchor's `algorithm` in the rows.
pub const GOVERNOR: &str = "governor";

pub fn run(bench: &mut Bench) -> Outcome<Algorithms> {
    let s = bench.sizes;
    bench.example("bench_algorithms", &[s.algorithm_decisions.to_string(), s.algorithm_keys.to_string()])
}

/// The row of `algorithm` at `threads` threads.
pub fn row<'a>(a: &'a Algorithms, algorithm: &str, threads: usize) -> Option<&'a AlgorithmRow> {
    a.rows.iter().find(|r| r.algorithm == algorithm && r.threads == threads)
}

pub fn markdown(m: &mut String, a: &Algorithms) {
    let _ = writeln!(
        m,
        "## {TITLE}, {} keys, limit {} per second\n\n| algorithm | 1 thread | 2 threads | bare check+charge, 1 thread |\n|---|---|---|---|",
        a.keys, a.limit_per_second
    );
    for one in a.rows.iter().filter(|r| r.threads == 1) {
        let two = row(a, &one.algorithm, 2);
        let label = if one.algorithm == GOVERNOR {
            "governor keyed (anchor)".to_owned()
        } else {
            format!("limiter {} (MemoryStore)", one.algorithm)
        };
        let _ = writeln!(
            m,
            "| {label} | {} | {} | {} |",
            num(Some(one.decisions_per_second), 0),
            num(two.map(|r| r.decisions_per_second), 0),
            num(one.bare_decisions_per_second, 0)
        );
    }
    let _ = writeln!(m, "\n![algorithms](algorithms.svg)\n");
}

pub fn charts(a: &Algorithms) -> Vec<(&'static str, String)> {
    let bars: Vec<(String, f64)> =
        a.rows.iter().map(|r| (format!("{} ({}t)", r.algorithm, r.threads), r.decisions_per_second)).collect();
    vec![("algorithms", bar_chart("Decisions per second, 10 000 keys (higher is better)", "/s", &bars))]
}
