//! The `limiter` command line: one file per command, each a thin layer over the
//! library. Every command takes `-c PATH`; the pin directory and the admin socket
//! come from that config.

pub mod block;
pub mod check;
pub mod detach;
pub mod reload;
pub mod run;
pub mod sign;
pub mod stats;
pub mod top;
pub mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{Config, DEFAULT_PATH};

/// limiter: per-source XDP rate limiting and a rate-limiting HTTP proxy.
#[derive(Debug, Parser)]
#[command(name = "limiter", version)]
pub struct Cli {
    /// Config file.
    #[arg(short, long, global = true, default_value = DEFAULT_PATH)]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent in the foreground: load and attach XDP, serve the proxy.
    Run,
    /// Validate the config; errors name the key and line.
    Check,
    /// Ask the running agent to reload its config and print what changed.
    Reload,
    /// Kernel-layer counters (from the pinned maps) and proxy counters.
    Stats(stats::StatsArgs),
    /// Heaviest sources: packets, drops, current tokens.
    Top(top::TopArgs),
    /// Block a CIDR in the kernel layer.
    Block(block::BlockArgs),
    /// Remove a runtime block.
    Unblock(block::UnblockArgs),
    /// Mark sources verified: they skip the new-source budget, aggregates and SYN budget.
    Verify(verify::VerifyArgs),
    /// Remove verified sources.
    Unverify(verify::UnverifyArgs),
    /// Remove the XDP program, its links and its pins.
    Detach,
    /// Produce the signature headers for a request.
    Sign(sign::SignArgs),
}

/// Runs the parsed command line; the process exit code.
pub fn dispatch(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    match cli.command {
        Command::Run => run::run(&cli.config),
        Command::Check => check::run(&cli.config),
        Command::Reload => reload::run(&cli.config),
        Command::Stats(args) => stats::run(&cli.config, &args),
        Command::Top(args) => top::run(&cli.config, &args),
        Command::Block(args) => block::block(&cli.config, &args),
        Command::Unblock(args) => block::unblock(&cli.config, &args),
        Command::Verify(args) => verify::verify(&cli.config, &args),
        Command::Unverify(args) => verify::unverify(&cli.config, &args),
        Command::Detach => detach::run(&cli.config),
        Command::Sign(args) => sign::run(args).map(|()| std::process::ExitCode::SUCCESS),
    }
}

/// Loads the config every command starts from.
fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

/// How long a CLI command waits for the agent.
const AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
