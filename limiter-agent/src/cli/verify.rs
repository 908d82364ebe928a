//! `limiter verify` / `limiter unverify`: vouch for sources in the pinned maps, so
//! that they skip the new-source budget, the prefix aggregates and the SYN budget.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{
    config::{
        Config,
        units::HumanDuration,
        xdp::{VerifiedConfig, parse_cidr},
    },
    xdp::KernelMaps,
};

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Address or CIDR to verify, e.g. 198.51.100.0/24 (at most 65,536 sources).
    #[arg(value_parser = parse_cidr)]
    pub cidr: ipnet::IpNet,
    /// How long the sources stay verified; default `xdp.verified.ttl`.
    #[arg(long, value_parser = HumanDuration::parse)]
    pub ttl: Option<HumanDuration>,
}

#[derive(Debug, clap::Args)]
pub struct UnverifyArgs {
    #[arg(value_parser = parse_cidr)]
    pub cidr: ipnet::IpNet,
}

pub fn verify(path: &Path, args: &VerifyArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let ttl = args.ttl.unwrap_or_else(|| config.xdp.as_ref().map_or(VerifiedConfig::default(), |x| x.verified).ttl);
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    let sources = maps.verify(args.cidr, ttl.0)?;
    println!("verified {} ({sources} sources) for {ttl}", args.cidr);
    Ok(ExitCode::SUCCESS)
}

pub fn unverify(path: &Path, args: &UnverifyArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let mut maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    match maps.unverify(args.cidr)? {
        0 => {
            eprintln!("no verified source in {}", args.cidr);
            Ok(ExitCode::FAILURE)
        }
        removed => {
            println!("unverified {} ({removed} sources)", args.cidr);
            Ok(ExitCode::SUCCESS)
        }
    }
}
