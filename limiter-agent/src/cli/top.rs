//! `limiter top`: the heaviest sources in the kernel layer.

use std::{path::Path, process::ExitCode};

use super::CliError;
use crate::{config::Config, xdp::KernelMaps};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// How many sources.
    #[arg(short, default_value_t = 10)]
    pub n: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(path: &Path, args: &TopArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let maps = KernelMaps::open_pinned(&config.agent.pin_dir)?;
    let rows = maps.top(args.n)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{:<45} {:>14} {:>14} {:>10}", "source", "packets", "dropped", "tokens");
        for row in rows {
            let source = match row.note {
                Some(note) => format!("{} ({note})", row.source),
                None => row.source,
            };
            println!("{:<45} {:>14} {:>14} {:>10}", source, row.packets, row.dropped, row.tokens);
        }
    }
    Ok(ExitCode::SUCCESS)
}
