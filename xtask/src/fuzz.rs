//! `cargo xtask fuzz [TARGET] [--seconds N]`: the cargo-fuzz targets of `fuzz/`, each
//! for a bounded time. `cargo xtask test` runs each briefly too, so that they keep
//! building and a regression in what they check fails the run.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::{
    setup::{BUILD_STEPS, CARGO_FUZZ, Needs},
    util::{cmd, run as run_cmd, target_dir, workspace_root},
};

/// The targets link the agent, whose build.rs needs the build's steps.
pub const NEEDS: Needs = Needs { steps: BUILD_STEPS, debian: &[], cargo: &[CARGO_FUZZ] };

/// Every target in `fuzz/fuzz_targets`, by name.
pub const TARGETS: [&str; 5] = ["config", "signature", "path", "packet", "proxy_header"];

/// Per target in `cargo xtask test`: long enough to pass the easy inputs, short
/// enough that the five add about a minute and a quarter.
pub const TEST_SECONDS: u32 = 15;

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// One target (config, signature, path, packet, proxy_header); all when absent.
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
    run_cmd(cargo_fuzz("build").arg("--sanitizer=none")).context("the fuzz targets do not build")?;
    for target in targets {
        let corpus = target_dir().join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
        let artifacts = target_dir().join("fuzz/artifacts").join(target);
        std::fs::create_dir_all(&artifacts).with_context(|| format!("cannot create {}", artifacts.display()))?;
        let mut c = cargo_fuzz("run");
        // New inputs go to the first directory; the seeds are only read.
        c.args(["--sanitizer=none", target])
            .arg(&corpus)
            .args(Some(seeds(target)).filter(|dir| dir.is_dir()))
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            // Inputs larger than a request line or a config file test nothing more.
            .arg("-max_len=4096")
            .arg("-print_final_stats=1");
        run_cmd(&mut c).with_context(|| {
            format!(
                "fuzz target `{target}` failed: the input is in {}; reproduce it from {} with \
                 `cargo +nightly fuzz run --sanitizer=none --target-dir {} {target} FILE`, and make it a regression test",
                artifacts.display(),
                workspace_root().join("fuzz").display(),
                target_dir().join("fuzz").display()
            )
        })?;
        println!("fuzz: {target}: ok ({seconds} s)");
    }
    Ok(())
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
