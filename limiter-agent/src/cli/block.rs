//! `limiter block` / `limiter unblock`: runtime deny entries in the pinned maps;
//! `limiter demote` / `limiter undemote`: runtime slow buckets beside them.

use std::{num::NonZeroU32, path::Path, process::ExitCode, time::Duration};

use super::CliError;
use crate::{
    agent::{
        Request, Response,
        admin::{AdminError, ask_blocking},
    },
    config::{
        Config,
        units::HumanDuration,
        xdp::{PacketLimit, parse_cidr},
    },
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
    /// Keep the source's offences: its next one climbs the penalty ladder from where
    /// it was.
    #[arg(long)]
    pub keep_history: bool,
}

#[derive(Debug, clap::Args)]
pub struct DemoteArgs {
    /// Address or CIDR whose sources to slow down, e.g. 203.0.113.7.
    #[arg(value_parser = parse_cidr)]
    pub cidr: ipnet::IpNet,
    /// The demoted bucket's rate; escalation.demote_first's without it.
    #[arg(long)]
    pub packets_per_second: Option<NonZeroU32>,
    /// The demoted bucket's burst; escalation.demote_first's without it.
    #[arg(long)]
    pub burst: Option<NonZeroU32>,
    /// Lift the demotion after this long (e.g. 10m); without it, demote_first's
    /// ttl, or until undemoted.
    #[arg(long, value_parser = HumanDuration::parse)]
    pub ttl: Option<HumanDuration>,
}

#[derive(Debug, clap::Args)]
pub struct UndemoteArgs {
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
    let unblocked = maps.unblock(args.cidr)?;
    if unblocked {
        record(&config, &SecurityEvent::kernel_unblock(args.cidr, "cli"));
        println!("unblocked {}", args.cidr);
    } else {
        eprintln!("{} was not blocked", args.cidr);
    }
    // The history is the running agent's (in its memory or the fleet's Redis):
    // forgotten whether or not a block was in force, so that a lapsed one's source
    // starts the ladder again too.
    let request = Request::Unblocked { cidr: args.cidr, keep_history: args.keep_history };
    match ask_blocking(&config.agent.admin_socket, &request, Duration::from_secs(5)) {
        Ok(Response::Forgotten { history_cleared: true }) => println!("offence history of {} cleared", args.cidr),
        Ok(Response::Forgotten { history_cleared: false }) => {}
        Ok(Response::Rejected { error }) => eprintln!("warning: {error}"),
        Ok(other) => return Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
        // No agent: no escalation remembers anything but the fleet's Redis, which
        // the next agent reads as it was.
        Err(AdminError::Unreachable { .. }) => {}
        Err(error) => eprintln!("warning: the offence history is kept: {error}"),
    }
    Ok(if unblocked { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub fn demote(path: &Path, args: &DemoteArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let first = config.escalation.as_ref().and_then(|e| e.demote_first);
    let (Some(packets_per_second), Some(burst)) = (
        args.packets_per_second.or(first.map(|d| d.limit.packets_per_second)),
        args.burst.or(first.map(|d| d.limit.burst)),
    ) else {
        return Err(CliError::Usage(
            "give --packets-per-second and --burst, or set [escalation] demote_first".to_owned(),
        ));
    };
    let limit = PacketLimit::new(packets_per_second, burst).map_err(CliError::Usage)?;
    let ttl = args.ttl.map(|t| t.0).or(first.map(|d| d.ttl));
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    maps.demote(args.cidr, limit.rate(), ttl)?;
    record(&config, &SecurityEvent::kernel_demote(args.cidr, limit, ttl, "cli"));
    match ttl {
        Some(ttl) => println!("demoted {} to {limit} for {}", args.cidr, HumanDuration(ttl)),
        None => println!("demoted {} to {limit} until undemoted", args.cidr),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn undemote(path: &Path, args: &UndemoteArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    if maps.undemote(args.cidr)? {
        record(&config, &SecurityEvent::kernel_undemote(args.cidr, "cli"));
        println!("undemoted {}", args.cidr);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{} was not demoted", args.cidr);
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
