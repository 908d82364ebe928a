//! The `limiter` command line: one file per command, each a thin layer over the
//! library. Every command takes `-c PATH`; the pin directory and the admin socket
//! come from that config.

mod block;
mod check;
mod completions;
mod detach;
mod explain;
mod man;
mod reload;
mod run;
mod sign;
mod stats;
mod suggest;
mod top;
mod upgrade;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::{
    agent::{AgentError, admin::AdminError},
    config::{ConfigError, DEFAULT_PATH},
    xdp::XdpError,
};

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
    /// Start the binary on disk on the running agent's sockets; the old agent drains and exits.
    Upgrade,
    /// Kernel-layer counters (from the pinned maps) and proxy counters.
    Stats(stats::StatsArgs),
    /// Heaviest sources: packets, drops, current tokens.
    Top(top::TopArgs),
    /// Which rules, plan and kernel buckets a request or source meets, and their quotas now.
    Explain(explain::ExplainArgs),
    /// Limits from real traffic: each rule's and plan's per-key peaks, the sources' rates.
    Suggest(suggest::SuggestArgs),
    /// Block a CIDR in the kernel layer.
    Block(block::BlockArgs),
    /// Remove a runtime block (and, unless --keep-history, the source's offences).
    Unblock(block::UnblockArgs),
    /// Limit a CIDR's sources at a slower kernel bucket.
    Demote(block::DemoteArgs),
    /// Remove a demotion.
    Undemote(block::UndemoteArgs),
    /// Mark sources verified: they skip the new-source budget, aggregates and SYN budget.
    Verify(verify::VerifyArgs),
    /// Remove verified sources.
    Unverify(verify::UnverifyArgs),
    /// Remove the XDP program, its links and its pins.
    Detach,
    /// Produce the signature headers for a request.
    Sign(sign::SignArgs),
    /// Print the shell completion script for SHELL.
    Completions(completions::CompletionsArgs),
    /// Print the manual page (or write every page into a directory).
    Man(man::ManArgs),
}

/// Why a command could not do its work. Refusals a command reports itself (an invalid
/// config for `check`, a rejected reload) are exit codes, not errors. The messages
/// are the underlying errors' own, so that the binary prints what it always printed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Xdp(#[from] XdpError),
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Sign(#[from] sign::SignError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    #[error("{0}")]
    Usage(String),
    #[error("unexpected answer from the agent: {0}")]
    UnexpectedAnswer(String),
}

/// The `limiter` command: parses the command line and runs it; the process's exit code.
pub fn main() -> std::process::ExitCode {
    match dispatch(Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            // anyhow's alternate form prints the whole chain of causes on one line.
            eprintln!("limiter: {:#}", anyhow::Error::from(error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the parsed command line; the process exit code.
fn dispatch(cli: Cli) -> Result<std::process::ExitCode, CliError> {
    match cli.command {
        Command::Run => run::run(&cli.config),
        Command::Check => check::run(&cli.config),
        Command::Reload => reload::run(&cli.config),
        Command::Upgrade => upgrade::run(&cli.config),
        Command::Stats(args) => stats::run(&cli.config, &args),
        Command::Top(args) => top::run(&cli.config, &args),
        Command::Suggest(args) => suggest::run(&cli.config, &args),
        Command::Explain(args) => explain::run(&cli.config, &args),
        Command::Block(args) => block::block(&cli.config, &args),
        Command::Unblock(args) => block::unblock(&cli.config, &args),
        Command::Demote(args) => block::demote(&cli.config, &args),
        Command::Undemote(args) => block::undemote(&cli.config, &args),
        Command::Verify(args) => verify::verify(&cli.config, &args),
        Command::Unverify(args) => verify::unverify(&cli.config, &args),
        Command::Detach => detach::run(&cli.config),
        Command::Sign(args) => Ok(sign::run(args).map(|()| std::process::ExitCode::SUCCESS)?),
        Command::Completions(args) => Ok(completions::run(&args).map(|()| std::process::ExitCode::SUCCESS)?),
        Command::Man(args) => Ok(man::run(&args).map(|()| std::process::ExitCode::SUCCESS)?),
    }
}

/// How long a CLI command waits for the agent.
const AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
