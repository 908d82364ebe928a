//! `limiter block` / `limiter unblock`: runtime deny entries in the pinned maps.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{
    config::{Config, units::HumanDuration, xdp::parse_cidr},
    security_log::{self, SecurityEvent},
    xdp::KernelMaps,
};

#[derive(Debug, clap::Args)]
pub struct BlockArgs {
    /// Address or CIDR to drop, e.g. 203.0.113.7 or 2001:db8::/48.
    #[arg(value_parser = parse_cidr)]
    pub cidr: ipnet::IpNet,
    /// Lift the block after this long (e.g. 10m); without it, until unblocked.
    #[arg(long, value_parser = HumanDuration::parse)]
    pub ttl: Option<HumanDuration>,
}

#[derive(Debug, clap::Args)]
pub struct UnblockArgs {
    #[arg(value_parser = parse_cidr)]
    pub cidr: ipnet::IpNet,
}

pub fn block(path: &Path, args: &BlockArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    maps.block(args.cidr, args.ttl.map(|t| t.0))?;
    record(&config, &SecurityEvent::kernel_block(args.cidr, args.ttl.map(|t| t.0), "cli"));
    match args.ttl {
        Some(ttl) => println!("blocked {} for {ttl}", args.cidr),
        None => println!("blocked {} until unblocked", args.cidr),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn unblock(path: &Path, args: &UnblockArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    if maps.unblock(args.cidr)? {
        record(&config, &SecurityEvent::kernel_unblock(args.cidr, "cli"));
        println!("unblocked {}", args.cidr);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{} was not blocked", args.cidr);
        Ok(ExitCode::FAILURE)
    }
}

/// Writes `event` to the config's security log, if it has one: the block is in place
/// whether or not the log takes it, so a failure is only told.
fn record(config: &Config, event: &SecurityEvent) {
    if let Some(log) = &config.agent.security_log
        && let Err(error) = security_log::write_once(log, event)
    {
        eprintln!("warning: agent.security_log: {error}");
    }
}
