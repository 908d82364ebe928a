//! `limiter man`: the manual pages, rendered from the clap definitions: `limiter.1`
//! on standard output, or with `--dir` one page per command (`limiter-stats.1`, …).

use std::{io, path::PathBuf};

use clap::CommandFactory as _;

use super::Cli;

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write `limiter.1` and a page per command into DIR instead.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run(args: &ManArgs) -> io::Result<()> {
    let mut command = Cli::command();
    // Built as `generate_to` builds it, so that both list the same commands.
    command.build();
    match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            clap_mangen::generate_to(command, dir)
        }
        None => clap_mangen::Man::new(command).render(&mut io::stdout()),
    }
}
