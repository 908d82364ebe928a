//! `cargo xtask fuzz [TARGET] [--seconds N]`: the cargo-fuzz targets of `fuzz/`, each
//! for a bounded time. `cargo xtask test` runs each briefly too, so that they keep
//! building and a regression in what they check fails the run.

use std::{fs::File, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    setup::{CARGO_FUZZ, Needs, Step},
    util::{cmd, probe, run as run_cmd, target_dir, workspace_root},
};

/// The targets build with nightly (for libFuzzer's flags) and link neither the agent
/// nor the eBPF program: no bpf-linker.
pub const NEEDS: Needs = Needs { steps: &[Step::Nightly], debian: &[], cargo: &[CARGO_FUZZ] };

/// Every target in `fuzz/fuzz_targets`, by name.
pub const TARGETS: [&str; 9] =
    ["config", "signature", "path", "packet", "proxy_header", "body_keys", "jwt", "inherited", "ja4"];

/// Per target in `cargo xtask test`, all at once: long enough to pass the easy
/// inputs, short enough that they add a quarter of a minute.
pub const TEST_SECONDS: u32 = 15;

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// One target (config, signature, path, packet, proxy_header, body_keys, jwt, inherited, ja4); all when absent.
    target: Option<String>,
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    seconds: u32,
}

pub fn run(opts: &Opts) -> Result<()> {
    let targets: Vec<&str> = match &opts.target {
        Some(name) => match TARGETS.iter().find(|t| *t == name) {
            Some(target) => vec![target],
            None => bail!("no fuzz target `{name}`: the targets are {}", TARGETS.join(", ")),
        },
        None => TARGETS.to_vec(),
    };
    run_targets(&targets, opts.seconds)
}

/// Builds once, then runs each target for `seconds`; the first that fails stops the run
/// and names the input that made it fail.
pub fn run_targets(targets: &[&str], seconds: u32) -> Result<()> {
    run_cmd(&mut build()).context("the fuzz targets do not build")?;
    for target in targets {
        run_cmd(&mut target_run(target, seconds)?).with_context(|| failed(target))?;
        println!("fuzz: {target}: ok ({seconds} s)");
    }
    Ok(())
}

/// `cargo +nightly fuzz build`, without a sanitizer: what the targets check are
/// assertions and panics, and the build is several times quicker.
pub fn build() -> Command {
    let mut c = cargo_fuzz("build");
    c.arg("--sanitizer=none");
    c
}

/// Every target at once (they are built), for `seconds` each, each writing to a log
/// of its own; the ones that failed are named with their log's end.
pub fn run_together(targets: &[&str], seconds: u32) -> Result<()> {
    let logs = target_dir().join("fuzz/logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let mut running = Vec::new();
    for target in targets {
        let log = logs.join(format!("{target}.log"));
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut c = target_run(target, seconds)?;
        c.stdout(out.try_clone().context("cannot share the log file")?).stderr(out);
        let child = c.spawn().with_context(|| format!("cannot start fuzz target `{target}`"))?;
        running.push((*target, child, log));
    }
    let mut failures = Vec::new();
    for (target, mut child, log) in running {
        let status = child.wait().with_context(|| format!("cannot wait for fuzz target `{target}`"))?;
        if status.success() {
            println!("fuzz: {target}: ok ({seconds} s)");
        } else {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            eprintln!("fuzz: {target}: FAILED ({status}); the end of {}:", log.display());
            for line in tail.into_iter().rev() {
                eprintln!("  {line}");
            }
            failures.push(failed(target));
        }
    }
    if failures.is_empty() { Ok(()) } else { bail!("{}", failures.join("\n")) }
}

/// A built target's own binary over its corpus and seeds, for `seconds`.
fn target_run(target: &str, seconds: u32) -> Result<Command> {
    let corpus = target_dir().join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
    let artifacts = artifacts(target);
    std::fs::create_dir_all(&artifacts).with_context(|| format!("cannot create {}", artifacts.display()))?;
    // cargo-fuzz always builds for the host's triple, and names it in the path.
    let host = probe("rustc", &["+nightly", "-vV"])
        .and_then(|info| info.lines().find_map(|line| line.strip_prefix("host: ").map(str::to_owned)))
        .context("`rustc +nightly -vV` names no host")?;
    let mut c = cmd(target_dir().join("fuzz").join(host).join("release").join(target));
    // New inputs go to the first directory; the seeds are only read.
    c.arg(&corpus)
        .args(Some(seeds(target)).filter(|dir| dir.is_dir()))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        // Inputs larger than a request line or a config file test nothing more.
        .arg("-max_len=4096")
        .arg("-print_final_stats=1");
    Ok(c)
}

/// Where a target's failing inputs are written.
fn artifacts(target: &str) -> PathBuf {
    target_dir().join("fuzz/artifacts").join(target)
}

/// What to do when `target` fails.
fn failed(target: &str) -> String {
    format!(
        "fuzz target `{target}` failed: the input is in {}; reproduce it from {} with \
         `cargo +nightly fuzz run --sanitizer=none --target-dir {} {target} FILE`, and make it a regression test",
        artifacts(target).display(),
        workspace_root().join("fuzz").display(),
        target_dir().join("fuzz").display()
    )
}

/// Inputs each target starts from: the example configs, hand-written bypass attempts.
fn seeds(target: &str) -> PathBuf {
    match target {
        "config" => workspace_root().join("config"),
        other => workspace_root().join("fuzz/seeds").join(other),
    }
}

/// `cargo +nightly fuzz SUBCOMMAND` in `fuzz/`, building under the workspace's target
/// directory (one place to clean, no second tree in the sources).
fn cargo_fuzz(subcommand: &str) -> std::process::Command {
    let mut c = cmd("cargo");
    c.current_dir(workspace_root().join("fuzz"))
        .args(["+nightly", "fuzz", subcommand, "--target-dir"])
        .arg(target_dir().join("fuzz"));
    c
}
