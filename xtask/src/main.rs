//! `cargo xtask`: project automation. Every subcommand runs `setup` first so a fresh
//! machine needs no manual preparation.

mod bench;
mod demo;
mod fuzz;
mod install;
mod package;
mod setup;
mod test;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Project automation for limiter")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Check and install what building and testing need (root, nightly, bpf-linker, packages).
    Setup,
    /// Build the agent (its build.rs compiles the eBPF program).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Run every test against a private redis-server: `test [-p PKG]... [-- TEST ARGS]`;
    /// the whole run (no package, no test args) also runs each fuzz target briefly.
    Test {
        /// Only these packages instead of the whole workspace.
        #[arg(short, long = "package", value_name = "PKG")]
        packages: Vec<String>,
        /// Passed to the test binaries (filters, --test-threads, --nocapture).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Run the cargo-fuzz targets of `fuzz/` (config, signature, path, packet), each for a bounded time.
    Fuzz(fuzz::Opts),
    /// Build and run `target/debug/limiter` with the given arguments.
    Run {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Install the release binary, the config and the systemd unit.
    Install(install::Opts),
    /// Build the Debian package of the release binary (`--debug`: of the debug one) in target/debian/.
    Package(package::Opts),
    /// Run the namespace lab demo.
    Demo,
    /// Run the benchmarks (`--quick`: about two minutes); report in target/bench/.
    Bench(bench::Opts),
}

fn main() {
    // Printed by hand: anyhow's Debug output adds a backtrace whenever RUST_BACKTRACE is
    // set, which buries the one line that says what to do.
    if let Err(e) = dispatch(Cli::parse().command) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(command: Cmd) -> Result<()> {
    // A dry run must not change the machine, and setup may install packages.
    if !matches!(&command, Cmd::Install(o) if o.dry_run) {
        setup::run()?;
    }
    if makes_a_package(&command) {
        setup::run_packaging()?;
    }
    match command {
        Cmd::Setup => Ok(()),
        Cmd::Build { release } => util::cargo_build(release),
        Cmd::Test { packages, test_args } => test::run(&packages, &test_args),
        Cmd::Run { args } => {
            util::cargo_build(false)?;
            util::exec(&util::target_dir().join("debug/limiter"), &args)
        }
        Cmd::Fuzz(opts) => fuzz::run(&opts),
        Cmd::Install(opts) => install::run(&opts),
        Cmd::Package(opts) => package::run(&opts),
        Cmd::Demo => {
            util::cargo_build(false)?;
            demo::run()
        }
        Cmd::Bench(opts) => bench::run(&opts),
    }
}

/// `package`, and the tests that include xtask's (its package test); `setup`
/// prepares for them too.
fn makes_a_package(command: &Cmd) -> bool {
    match command {
        Cmd::Setup | Cmd::Package(_) => true,
        Cmd::Test { packages, .. } => packages.is_empty() || packages.iter().any(|p| p == "xtask"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_args_after_double_dash_go_to_the_harness() {
        let argv = ["xtask", "test", "-p", "limiter-common", "--", "--test-threads=2", "config"];
        let Cmd::Test { packages, test_args } = Cli::try_parse_from(argv).expect("parse").command else {
            panic!("not test")
        };
        assert_eq!(packages, ["limiter-common"]);
        assert_eq!(test_args, ["--test-threads=2", "config"]);
    }
}
