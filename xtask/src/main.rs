//! `cargo xtask`: project automation. Every subcommand first sets up what it needs
//! (see [`Cmd::needs`]) so a fresh machine needs no manual preparation.

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
use setup::{Needs, ROOT_AND_BUILD};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Project automation for limiter")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Check and install what every other command needs (root, nightly, bpf-linker,
    /// cargo-fuzz, oha, the Debian packages).
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

/// Root and the build's steps: `run` starts the agent, which loads XDP programs.
const RUN: Needs = Needs { steps: ROOT_AND_BUILD, debian: &[], cargo: &[] };

/// What `cargo xtask setup` alone provides: what any command needs.
const EVERY_COMMAND: &[Needs] =
    &[setup::BUILD, RUN, test::NEEDS, fuzz::NEEDS, install::NEEDS, package::NEEDS, demo::NEEDS, bench::NEEDS];

impl Cmd {
    /// What setup provides before the command runs.
    fn needs(&self) -> &'static [Needs] {
        match self {
            Cmd::Setup => EVERY_COMMAND,
            Cmd::Build { .. } => &[setup::BUILD],
            // Only the whole run fuzzes; xtask's tests make a package.
            Cmd::Test { packages, test_args } if packages.is_empty() && test_args.is_empty() => {
                &[test::NEEDS, fuzz::NEEDS, package::NEEDS]
            }
            Cmd::Test { packages, .. } if packages.iter().any(|p| p == "xtask") => &[test::NEEDS, package::NEEDS],
            Cmd::Test { .. } => &[test::NEEDS],
            Cmd::Run { .. } => &[RUN],
            Cmd::Fuzz(_) => &[fuzz::NEEDS],
            // A dry run must not change the machine, and setup may install packages.
            Cmd::Install(o) if o.dry_run => &[],
            Cmd::Install(_) => &[install::NEEDS],
            Cmd::Package(_) => &[package::NEEDS],
            Cmd::Demo => &[demo::NEEDS],
            Cmd::Bench(_) => &[bench::NEEDS],
        }
    }
}

fn dispatch(command: Cmd) -> Result<()> {
    // The background installs run while the commands build; each waits for them
    // before it calls what they install.
    let setup = setup::start(command.needs())?;
    match command {
        Cmd::Setup => setup.finish(),
        Cmd::Build { release } => {
            setup.finish()?;
            util::cargo_build(release)
        }
        Cmd::Test { packages, test_args } => test::run(&packages, &test_args, setup),
        Cmd::Run { args } => {
            setup.finish()?;
            util::cargo_build(false)?;
            util::exec(&util::target_dir().join("debug/limiter"), &args)
        }
        Cmd::Fuzz(opts) => {
            setup.finish()?;
            fuzz::run(&opts)
        }
        Cmd::Install(opts) => {
            setup.finish()?;
            install::run(&opts)
        }
        Cmd::Package(opts) => {
            setup.finish()?;
            package::run(&opts)
        }
        Cmd::Demo => demo::run(setup),
        Cmd::Bench(opts) => bench::run(&opts, setup),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

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

    /// `cargo xtask setup` alone must leave a machine ready for every command: a
    /// command added with needs of its own but left out of [`EVERY_COMMAND`] fails here.
    #[test]
    fn setup_alone_provides_what_every_command_needs() {
        let provided = |needs: &Needs| {
            needs.steps.iter().all(|s| EVERY_COMMAND.iter().any(|e| e.steps.contains(s)))
                && needs.debian.iter().all(|d| EVERY_COMMAND.iter().any(|e| e.debian.contains(d)))
                && needs.cargo.iter().all(|c| EVERY_COMMAND.iter().any(|e| e.cargo.contains(c)))
        };
        let subcommands: Vec<String> = Cli::command().get_subcommands().map(|c| c.get_name().to_owned()).collect();
        assert!(subcommands.iter().any(|c| c == "demo"), "{subcommands:?}");
        for name in subcommands {
            let command = Cli::try_parse_from(["xtask", &name]).expect("every subcommand parses bare").command;
            for needs in command.needs() {
                assert!(provided(needs), "`cargo xtask setup` does not provide all of {needs:?}, which `{name}` needs");
            }
        }
    }
}
