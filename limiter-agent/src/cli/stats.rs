//! `limiter stats`: kernel counters straight from the pinned maps (so they read the
//! same whether or not the agent runs), plus the proxy's when the agent answers.

use std::{path::Path, process::ExitCode, time::Duration};

use serde_json::{Value, json};

use crate::{
    agent::{Request, Response, admin},
    config::Config,
    xdp::KernelMaps,
};

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds, with rates per second.
    #[arg(long, value_name = "SECS")]
    pub watch: Option<u64>,
}

/// What `limiter stats --json` prints.
pub fn collect(config: &Config) -> anyhow::Result<Value> {
    let xdp = match KernelMaps::open_pinned(&config.agent.pin_dir) {
        Ok(mut maps) => Some(maps.stats(crate::xdp::attached(&config.agent.pin_dir)?)?),
        Err(crate::xdp::XdpError::MissingMap(..)) => None,
        Err(error) => return Err(error.into()),
    };
    let agent = match admin::ask_blocking(&config.agent.admin_socket, &Request::Stats, Duration::from_secs(2)) {
        Ok(Response::Stats { stats }) => Some(stats),
        _ => None,
    };
    let proxy = agent.as_ref().map_or(Value::Null, |a| a["proxy"].clone());
    let mut stats = json!({ "xdp": xdp, "proxy": proxy });
    if let Some(agent) = agent {
        stats["agent"] = json!({ "running": true, "reloads": agent["reloads"] });
    } else {
        stats["agent"] = json!({ "running": false });
    }
    Ok(stats)
}

pub fn run(path: &Path, args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let config = super::load(path)?;
    let Some(secs) = args.watch else {
        let stats = collect(&config)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&stats)?);
        } else {
            print!("{}", render(&stats, None, 0.0));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let interval = Duration::from_secs(secs.max(1));
    let mut previous: Option<Value> = None;
    loop {
        let stats = collect(&config)?;
        if args.json {
            println!("{}", serde_json::to_string(&stats)?);
        } else {
            // Home the cursor and clear: the table refreshes in place.
            print!("\x1b[H\x1b[2J{}", render(&stats, previous.as_ref(), interval.as_secs_f64()));
        }
        previous = Some(stats);
        std::thread::sleep(interval);
    }
}

/// The human table; with `previous`, a rate column per second.
fn render(stats: &Value, previous: Option<&Value>, secs: f64) -> String {
    let mut out = String::new();
    match serde_json::from_value::<XdpStatsView>(stats["xdp"].clone()) {
        Ok(xdp) => {
            let attached: Vec<String> = xdp.attached.iter().map(|a| format!("{} ({})", a.interface, a.mode)).collect();
            out += &format!(
                "xdp: {} · {} · sources {}/{}\n",
                if attached.is_empty() { "not attached".to_owned() } else { attached.join(", ") },
                if xdp.enforce { "enforcing" } else { "dry run" },
                xdp.sources.tracked,
                xdp.sources.capacity
            );
            let before = previous.and_then(|p| serde_json::from_value::<XdpStatsView>(p["xdp"].clone()).ok());
            for (name, value) in &xdp.packets {
                let rate = before.as_ref().and_then(|b| b.packets.get(name)).map(|b| (value.saturating_sub(*b)) as f64 / secs);
                match rate {
                    Some(rate) => out += &format!("  {name:<20} {value:>14} {rate:>12.1}/s\n"),
                    None => out += &format!("  {name:<20} {value:>14}\n"),
                }
            }
            for block in &xdp.blocks {
                match block.expires_in_secs {
                    Some(secs) => out += &format!("  blocked {} ({secs} s left)\n", block.cidr),
                    None => out += &format!("  blocked {} (until unblocked)\n", block.cidr),
                }
            }
        }
        Err(_) => out += "xdp: no pinned maps (agent never started with [xdp]?)\n",
    }
    match &stats["proxy"] {
        Value::Object(proxy) => {
            out += "proxy:\n";
            for (name, value) in proxy {
                if value.is_number() {
                    out += &format!("  {name:<20} {value:>14}\n");
                }
            }
        }
        _ => out += "proxy: agent not reachable\n",
    }
    out
}

/// The parts of `XdpStats` the table shows, read back from JSON.
#[derive(serde::Deserialize)]
struct XdpStatsView {
    attached: Vec<AttachedView>,
    enforce: bool,
    packets: std::collections::BTreeMap<String, u64>,
    sources: SourcesView,
    #[serde(default)]
    blocks: Vec<BlockView>,
}

#[derive(serde::Deserialize)]
struct AttachedView {
    interface: String,
    mode: String,
}

#[derive(serde::Deserialize)]
struct SourcesView {
    tracked: u64,
    capacity: u64,
}

#[derive(serde::Deserialize)]
struct BlockView {
    cidr: String,
    expires_in_secs: Option<u64>,
}
