//! `limiter top`: the heaviest sources in the kernel layer; with `--watch`, a live
//! view of both layers (sources with packets/s, drops/s and tokens; the proxy's
//! clients with requests/s, refusals/s and the rule refusing them).

mod screen;
pub mod view;

use std::{
    io::{IsTerminal as _, Write as _},
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use self::view::{Snapshot, Sort, View};
use super::CliError;
use crate::{
    agent::{Request, Response, admin},
    config::Config,
    xdp::{KernelMaps, XdpError},
};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// How many sources (and, with --watch, clients).
    #[arg(short, default_value_t = 10)]
    pub n: usize,
    /// Print JSON.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Refresh every SECS seconds (default 1) with rates: a live screen on a
    /// terminal, plain repeated tables otherwise.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<u64>,
    /// The order of the live view (`s` on the screen changes it).
    #[arg(long, value_enum, default_value_t = Sort::Rate)]
    pub sort: Sort,
}

pub fn run(path: &Path, args: &TopArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    if let Some(secs) = args.watch {
        watch(&config, args, Duration::from_secs(secs.max(1)))?;
        return Ok(ExitCode::SUCCESS);
    }
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

/// Looks at both layers every `interval` until told to stop (`q`, or a signal).
fn watch(config: &Config, args: &TopArgs, interval: Duration) -> Result<(), CliError> {
    let mut before = (Instant::now(), snapshot(config)?);
    let mut next_view = |sort: Sort| -> Result<View, CliError> {
        std::thread::sleep(interval.saturating_sub(before.0.elapsed()));
        let now = (Instant::now(), snapshot(config)?);
        let secs = now.0.duration_since(before.0).as_secs_f64();
        let view = View::between(&before.1, &now.1, secs, sort, args.n);
        before = now;
        Ok(view)
    };
    if std::io::stdout().is_terminal() {
        let mut failure = None;
        screen::run(interval, args.sort, |sort| {
            next_view(sort).unwrap_or_else(|error| {
                failure.get_or_insert(error.to_string());
                let error = failure.clone().unwrap_or_default();
                View { interval_secs: 0.0, sort, n: 0, sources: None, clients: Err(error.to_string()) }
            })
        })?;
        return match failure {
            Some(error) => Err(CliError::Usage(error)),
            None => Ok(()),
        };
    }
    loop {
        println!("{}", next_view(args.sort)?.plain());
        std::io::stdout().flush()?;
    }
}

/// Both layers now: every tracked source from the pinned maps, and the proxy's
/// heaviest clients from the agent.
fn snapshot(config: &Config) -> Result<Snapshot, CliError> {
    let sources = match KernelMaps::open_pinned(&config.agent.pin_dir) {
        Ok(maps) => Some(maps.source_rows()?),
        Err(XdpError::MissingMap(..)) => None,
        Err(error) => return Err(error.into()),
    };
    let clients = match admin::ask_blocking(&config.agent.admin_socket, &Request::Top { n: usize::MAX }, TIMEOUT) {
        Ok(Response::Top { clients: Some(clients) }) => Ok(clients),
        Ok(Response::Top { clients: None }) => Err("not configured".to_owned()),
        Ok(other) => return Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
        Err(_) => Err("agent not reachable".to_owned()),
    };
    Ok(Snapshot { sources, clients })
}

const TIMEOUT: Duration = Duration::from_secs(2);
