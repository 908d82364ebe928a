//! The setup every command runs first, and `cargo xtask setup` alone: each command
//! names what it needs ([`Needs`]); setup checks each part, installs what is missing
//! and prints one `setup: <step>: ok|installed|FAILED` line a step. Checks only probe,
//! so a machine that has everything passes in well under a second.
//!
//! The Debian packages and the `cargo install` tools install in the background while
//! the toolchain steps and the command's own build run; the command waits for them
//! ([`Pending::finish`]) before it calls any of them.

mod background;
mod cargo_tools;
mod debian;
mod toolchain;

use std::fmt;

use anyhow::{Result, bail};
pub use cargo_tools::{CARGO_DEB, CARGO_FUZZ, CargoTool, OHA};
pub use debian::*;
pub use toolchain::Step;

use self::background::Job;

#[derive(Debug)]
pub enum Outcome {
    Ok,
    Installed,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Installed => "installed",
        })
    }
}

/// What one command needs before it runs.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    pub steps: &'static [Step],
    pub debian: &'static [Debian],
    pub cargo: &'static [CargoTool],
}

/// What building the agent needs: its build.rs compiles the eBPF program with nightly
/// and bpf-linker.
pub const BUILD_STEPS: &[Step] = &[Step::Nightly, Step::RustSrc, Step::BpfLinker];
/// Root and the build, for the commands that load XDP programs or write system paths.
pub const ROOT_AND_BUILD: &[Step] = &[Step::Root, Step::Nightly, Step::RustSrc, Step::BpfLinker];
pub const BUILD: Needs = Needs { steps: BUILD_STEPS, debian: &[], cargo: &[] };

/// Runs the foreground steps of all of `needs` and starts the background installs.
pub fn start(needs: &[Needs]) -> Result<Pending> {
    let mut steps: Vec<Step> = needs.iter().flat_map(|n| n.steps).copied().collect();
    steps.sort();
    steps.dedup();
    let (root, toolchain): (Vec<Step>, Vec<Step>) = steps.into_iter().partition(|s| *s == Step::Root);
    root.into_iter().try_for_each(report)?;

    let mut pending = Pending { jobs: Vec::new() };
    let debian = unique(needs.iter().flat_map(|n| n.debian));
    if !debian.is_empty() {
        let missing = debian::missing(&debian);
        if missing.is_empty() {
            println!("setup: packages: {}", Outcome::Ok);
        } else {
            pending.jobs.push(debian::install(missing)?);
        }
    }
    for tool in unique(needs.iter().flat_map(|n| n.cargo)) {
        if tool.present() {
            println!("setup: {}: {}", tool.name(), Outcome::Ok);
        } else {
            pending.jobs.push(tool.install()?);
        }
    }
    // On an error here `pending` is dropped, which waits for the background installs.
    toolchain.into_iter().try_for_each(report)?;
    Ok(pending)
}

/// Each item once, in the order first seen.
fn unique<'a, T: PartialEq + Copy + 'a>(items: impl Iterator<Item = &'a T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(item) {
            seen.push(*item);
        }
    }
    seen
}

fn report(step: Step) -> Result<()> {
    match step.run() {
        Ok(outcome) => {
            println!("setup: {}: {outcome}", step.name());
            Ok(())
        }
        Err(e) => {
            println!("setup: {}: FAILED", step.name());
            eprintln!("{e:#}");
            // Later steps depend on earlier ones (root for apt, nightly for bpf-linker).
            bail!("setup failed at step `{}`", step.name())
        }
    }
}

/// The installs still running in the background.
#[derive(Debug)]
#[must_use = "finish() reports whether the background installs succeeded"]
pub struct Pending {
    jobs: Vec<Job>,
}

impl Pending {
    /// Waits for every background install; the error names the first that failed.
    pub fn finish(mut self) -> Result<()> {
        // Every job is waited for and reported, whichever fails.
        let results: Vec<Result<()>> = std::mem::take(&mut self.jobs).into_iter().map(Job::join).collect();
        results.into_iter().collect()
    }
}

impl Drop for Pending {
    /// A command that fails before it needs the installs still lets them end: an
    /// apt-get stopped halfway leaves dpkg to repair, and a later run would find its lock.
    fn drop(&mut self) {
        if !self.jobs.is_empty() {
            println!("setup: waiting for the background installs to end");
            for job in std::mem::take(&mut self.jobs) {
                let _ = job.join();
            }
        }
    }
}
