//! `cargo xtask bench [--quick]`: limiter side by side with what users would pick
//! instead, measured in one run on one machine (issue 7).
//!
//! The measurements are example programs of limiter-agent that print one JSON object
//! each (`xdp_cost`, `bench_flood`, `bench_algorithms`, `bench_hmac`, `bench_memory`,
//! `bench_store`),
//! typed by `limiter_lab::report`;
//! the HTTP groups are driven from here with nginx, wrk, oha and h2load. Everything
//! lands in `target/bench/`: `report.json`, `report.md`, and one SVG bar chart per
//! group. Every figure is reported with its anchor from the same run (the XDP_PASS
//! floor, nftables, nginx, governor), because absolute times on shared machines drift
//! between runs.

mod algorithms;
mod configs;
mod environment;
mod flood;
mod format;
mod hmac;
mod http;
mod http2;
mod markdown;
mod memory;
mod process;
mod store;
mod svg;
mod targets;
mod xdp;

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use limiter_lab::report::{Outcome, Report};
use serde::de::DeserializeOwned;

use crate::{
    setup::{
        BPFTOOL, H2LOAD, IP, NFT, NGINX, Needs, OHA, OPENSSL, Pending, REDIS_SERVER, ROOT_AND_BUILD, TASKSET, TRAFGEN,
        WRK,
    },
    util::{cmd, run as run_cmd, show, target_dir},
};

/// Root for the kernel groups; the floods' tools (trafgen pinned with taskset, nft,
/// bpftool for the memory group), the HTTP groups' servers and load tools, and the
/// store group's redis-server.
pub const NEEDS: Needs = Needs {
    steps: ROOT_AND_BUILD,
    debian: &[IP, TRAFGEN, TASKSET, NFT, BPFTOOL, NGINX, WRK, H2LOAD, OPENSSL, REDIS_SERVER],
    cargo: &[OHA],
};

/// The example programs a run measures with.
const EXAMPLES: [&str; 6] =
    ["xdp_cost", "bench_flood", "bench_algorithms", "bench_hmac", "bench_memory", "bench_store"];

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// A run of about two minutes: fewer repetitions, shorter loads.
    #[arg(long)]
    pub quick: bool,
    /// Only these groups (comma-separated: xdp, flood, random_flood, http, http2,
    /// algorithms, hmac, memory, store); the others are reported as not run.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// The names `--only` takes, in the order a run measures them.
const GROUPS: [&str; 9] = ["xdp", "flood", "random_flood", "http", "http2", "algorithms", "hmac", "memory", "store"];

/// How much of everything a run does.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub name: &'static str,
    pub xdp_repeat: u32,
    pub xdp_capacity: u32,
    pub flood_packets: u64,
    pub flood_sources: u32,
    pub algorithm_decisions: u64,
    pub algorithm_keys: u64,
    pub hmac_bytes: u64,
    pub memory_keys: u64,
    pub memory_sources: u32,
    pub store_decisions: u64,
    pub http_seconds: u32,
    pub http_connections: u32,
    /// Signed requests pre-made for the signed route (each is used once: more than a
    /// run sends, or the rest are replays refused as errors).
    pub signed_requests: u32,
    /// Requests of each h2load run, over `http2_connections` connections with
    /// `http2_streams` streams open on each.
    pub http2_requests: u32,
    pub http2_connections: u32,
    pub http2_streams: u32,
}

impl Sizes {
    pub const FULL: Sizes = Sizes {
        name: "full",
        xdp_repeat: 1_000_000,
        xdp_capacity: 65_536,
        flood_packets: 2_000_000,
        flood_sources: 256,
        algorithm_decisions: 2_000_000,
        algorithm_keys: 10_000,
        hmac_bytes: 256 << 20,
        memory_keys: 100_000,
        memory_sources: 1_000_000,
        store_decisions: 200_000,
        http_seconds: 10,
        http_connections: 32,
        signed_requests: 800_000,
        http2_requests: 100_000,
        http2_connections: 10,
        http2_streams: 10,
    };
    pub const QUICK: Sizes = Sizes {
        name: "quick",
        xdp_repeat: 200_000,
        xdp_capacity: 16_384,
        flood_packets: 400_000,
        flood_sources: 256,
        algorithm_decisions: 400_000,
        algorithm_keys: 10_000,
        hmac_bytes: 32 << 20,
        memory_keys: 20_000,
        memory_sources: 100_000,
        store_decisions: 40_000,
        http_seconds: 3,
        http_connections: 32,
        signed_requests: 150_000,
        http2_requests: 5_000,
        http2_connections: 10,
        http2_streams: 10,
    };
    /// For the smoke test: every code path, tiny counts.
    #[cfg_attr(not(test), expect(dead_code, reason = "used by the smoke test"))]
    pub const SMOKE: Sizes = Sizes {
        name: "smoke",
        xdp_repeat: 1_000,
        xdp_capacity: 256,
        flood_packets: 2_000,
        flood_sources: 16,
        algorithm_decisions: 2_000,
        algorithm_keys: 100,
        hmac_bytes: 1 << 20,
        memory_keys: 100,
        memory_sources: 1_024,
        store_decisions: 320,
        http_seconds: 1,
        http_connections: 4,
        signed_requests: 2_000,
        http2_requests: 200,
        http2_connections: 2,
        http2_streams: 2,
    };
}

pub fn run(opts: &Opts, setup: Pending) -> Result<()> {
    if let Some(unknown) = opts.only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        bail!("--only: no group {unknown:?} (groups: {})", GROUPS.join(", "));
    }
    // Only the examples a run uses: each release binary is a fat-LTO link of its own.
    let mut build = cmd("cargo");
    build.args(["build", "--release", "-p", "limiter-agent", "--bins"]);
    for example in EXAMPLES {
        build.args(["--example", example]);
    }
    run_cmd(&mut build)?;
    // Nothing is measured while an install still takes CPU.
    setup.finish()?;
    let sizes = if opts.quick { Sizes::QUICK } else { Sizes::FULL };
    let mut bench = Bench::new(sizes, target_dir().join("release"), target_dir().join("bench"));
    bench.only = opts.only.clone();
    let report = bench.run()?;
    println!("{}", markdown::summary_table(&report));
    println!("report: {}", target_dir().join("bench/report.md").display());
    Ok(())
}

/// One run of the harness: where the binaries are, where the report goes, and the
/// commands it ran.
pub struct Bench {
    sizes: Sizes,
    bin_dir: PathBuf,
    out: PathBuf,
    commands: Vec<String>,
    errors: Vec<String>,
    /// The groups to run; empty: all of them.
    only: Vec<String>,
}

impl Bench {
    pub fn new(sizes: Sizes, bin_dir: PathBuf, out: PathBuf) -> Self {
        Self { sizes, bin_dir, out, commands: Vec::new(), errors: Vec::new(), only: Vec::new() }
    }

    /// Runs `group` unless `--only` leaves it out.
    fn group<T>(&mut self, name: &str, group: impl FnOnce(&mut Self) -> Outcome<T>) -> Outcome<T> {
        if self.only.is_empty() || self.only.iter().any(|g| g == name) {
            group(self)
        } else {
            Outcome::Failed { error: "not run (--only)".to_owned() }
        }
    }

    /// Runs every group, writes the report files and returns the report.
    pub fn run(mut self) -> Result<Report> {
        fs::create_dir_all(&self.out).with_context(|| format!("cannot create {}", self.out.display()))?;
        let started = Instant::now();
        let xdp_cost = self.group("xdp", xdp::run);
        let flood = self.group("flood", flood::run);
        let random_flood = self.group("random_flood", flood::run_random);
        let http = self.group("http", |b| {
            let http = http::run(b);
            b.outcome("http", http)
        });
        let http2 = self.group("http2", |b| {
            let http2 = http2::run(b);
            b.outcome("http2", http2)
        });
        let algorithms = self.group("algorithms", algorithms::run);
        let hmac = self.group("hmac", hmac::run);
        let memory = self.group("memory", memory::run);
        let store = self.group("store", store::run);
        let mut report = Report {
            run: self.sizes.name.to_owned(),
            environment: environment::environment(),
            seconds: started.elapsed().as_secs_f64(),
            xdp_cost,
            flood,
            random_flood,
            http,
            http2,
            algorithms,
            hmac,
            memory,
            store,
            targets: Vec::new(),
            commands: self.commands,
            errors: self.errors,
        };
        report.targets = targets::targets(&report);
        fs::write(self.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
        let charts = [
            report.xdp_cost.measured().map(xdp::charts),
            report.flood.measured().map(flood::charts),
            report.http.measured().map(http::charts),
            report.http2.measured().map(http2::charts),
            report.algorithms.measured().map(algorithms::charts),
            report.hmac.measured().map(hmac::charts),
        ];
        for (name, svg) in charts.into_iter().flatten().flatten() {
            fs::write(self.out.join(format!("{name}.svg")), svg)?;
        }
        fs::write(self.out.join("report.md"), markdown::markdown(&report))?;
        Ok(report)
    }

    fn record(&mut self, c: &Command) {
        let line = show(c);
        println!("{line}");
        self.commands.push(line.trim_start_matches("$ ").to_owned());
    }

    fn run_recorded(&mut self, c: &mut Command) -> Result<()> {
        self.record(c);
        let program = c.get_program().to_string_lossy().into_owned();
        let status = c.status().with_context(|| format!("cannot run {program}"))?;
        if !status.success() {
            bail!("{program} exited with {status}");
        }
        Ok(())
    }

    /// A group that failed is reported as failed, with its error; the others still run.
    fn outcome<T>(&mut self, name: &str, result: Result<T>) -> Outcome<T> {
        match result {
            Ok(value) => Outcome::Measured(value),
            Err(e) => {
                let message = format!("{name}: {e:#}");
                eprintln!("bench group failed: {message}");
                self.errors.push(message.clone());
                Outcome::Failed { error: message }
            }
        }
    }

    /// Runs the bench example `name`, which prints its group as its last JSON line.
    fn example<T: DeserializeOwned>(&mut self, name: &str, args: &[String]) -> Outcome<T> {
        let path = self.bin_dir.join("examples").join(name);
        let mut c = cmd(&path);
        c.args(args).env("RUST_BACKTRACE", "0").stderr(Stdio::inherit());
        self.record(&c);
        let result = (|| -> Result<T> {
            let out = c.output().with_context(|| format!("cannot run {}", path.display()))?;
            if !out.status.success() {
                bail!("{name} exited with {}", out.status);
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().rev().find(|l| l.starts_with('{')).context("no JSON on stdout")?;
            Ok(serde_json::from_str(line)?)
        })();
        self.outcome(name, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole harness with tiny counts, against the debug examples that
    /// `cargo test --workspace` (and so `cargo xtask test`) has just built. Needs root
    /// for the kernel groups, like the kernel tests.
    #[test]
    fn bench_harness_smoke() {
        let _lab = crate::util::LAB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bin_dir = target_dir().join("debug");
        if let Some(missing) = EXAMPLES.iter().find(|n| !bin_dir.join("examples").join(n).is_file()) {
            panic!(
                "{missing} is not built: run through `cargo xtask test` (cargo test --workspace builds the examples)"
            );
        }
        assert!(bin_dir.join("limiter").is_file(), "target/debug/limiter is not built");
        let started = Instant::now();
        let out = target_dir().join("bench-smoke");
        let report = Bench::new(Sizes::SMOKE, bin_dir, out.clone()).run().expect("bench run");
        assert!(report.errors.is_empty(), "{:#?}", report.errors);
        for file in [
            "report.md",
            "report.json",
            "xdp_cost.svg",
            "flood.svg",
            "http.svg",
            "http2.svg",
            "algorithms.svg",
            "hmac.svg",
        ] {
            assert!(out.join(file).is_file(), "{file} missing");
        }
        let xdp = report.xdp_cost.measured().expect("xdp group");
        assert!(xdp.known_source_ns > 0.0, "{xdp:?}");
        assert!(xdp.known_source_with_byte_budget_ns.is_some_and(|ns| ns > 0.0), "{xdp:?}");
        assert_eq!(report.flood.measured().map(|f| f.rows.len()), Some(6));
        assert_eq!(report.random_flood.measured().map(|f| f.spoofed_sources), Some(0));
        let http = report.http.measured().expect("http group");
        assert_eq!(http.rows.len(), 8);
        let logins = http.rows.iter().find(|r| r.scenario.contains("json:/username")).expect("the body-key row");
        assert!(logins.closed_loop.requests > 0 && logins.closed_loop.errors == 0, "{logins:?}");
        assert_eq!(report.http2.measured().map(|h| h.rows.len()), Some(5));
        let stores: Vec<&str> =
            report.store.measured().map(|s| s.rows.iter().map(|r| r.store.as_str()).collect()).unwrap_or_default();
        assert_eq!(stores, ["memory", "redis", "redis cluster"]);
        let upgrade = http.upgrade.as_ref().expect("the upgrade row");
        assert!(upgrade.requests > 0 && upgrade.dropped == 0, "{upgrade:?}");
        assert_eq!(report.targets.len(), 16);
        // The report reads back as what was written.
        let written = fs::read_to_string(out.join("report.json")).expect("report.json");
        let read: Report = serde_json::from_str(&written).expect("report.json parses as a Report");
        assert_eq!(read.targets.len(), report.targets.len());
        eprintln!("bench smoke run took {:?}", started.elapsed());
    }
}
