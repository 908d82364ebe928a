//! `limiter completions SHELL`: the shell's completion script, from the same clap
//! definitions the binary parses with, so it cannot drift from the real flags.

use std::io::{self, Write as _};

use clap::CommandFactory as _;
use clap_complete::Shell;

use super::Cli;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// Which shell the script is for.
    pub shell: Shell,
}

pub fn run(args: &CompletionsArgs) -> io::Result<()> {
    // Rendered in memory: clap_complete panics on a failed write, such as a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "limiter", &mut script);
    io::stdout().write_all(&script)
}
