//! `limiter stats`: kernel counters straight from the pinned maps (so they read the
//! same whether or not the agent runs), plus the proxy's when the agent answers.

use std::{path::Path, process::ExitCode, time::Duration};

use serde_json::{Value, json};

use super::CliError;
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
pub fn collect(config: &Config) -> Result<Value, CliError> {
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
        stats["agent"] = json!({ "running": true, "reloads": agent["reloads"], "escalation": agent["escalation"] });
    } else {
        stats["agent"] = json!({ "running": false });
    }
    Ok(stats)
}

pub fn run(path: &Path, args: &StatsArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
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
    let xdp = &stats["xdp"];
    if xdp.is_object() {
        let attached: Vec<String> = xdp["attached"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let fallback = if a["fallback"].as_bool() == Some(true) { ", native refused" } else { "" };
                format!("{} ({}{fallback})", a["interface"].as_str().unwrap_or("?"), a["mode"].as_str().unwrap_or("?"))
            })
            .collect();
        out += &format!(
            "xdp: {} · {} · {} clock · sources {}/{}\n",
            if attached.is_empty() { "not attached".to_owned() } else { attached.join(", ") },
            if xdp["enforce"].as_bool() == Some(true) { "enforcing" } else { "dry run" },
            if xdp["coarse_clock"].as_bool() == Some(true) { "coarse" } else { "precise" },
            xdp["sources"]["tracked"],
            xdp["sources"]["capacity"]
        );
        for (name, value) in xdp["packets"].as_object().into_iter().flatten() {
            let value = value.as_u64().unwrap_or(0);
            let before = previous.and_then(|p| p["xdp"]["packets"][name].as_u64());
            match before {
                Some(before) => {
                    let rate = value.saturating_sub(before) as f64 / secs;
                    out += &format!("  {name:<22} {value:>12} {rate:>12.1}/s\n");
                }
                None => out += &format!("  {name:<22} {value:>12}\n"),
            }
        }
        for name in ["new_sources", "syn"] {
            let budget = &xdp[name];
            if budget.is_object() {
                out += &format!(
                    "  budget {name}: {} pps, burst {}, {} tokens left, {} of {} refused\n",
                    budget["packets_per_second"],
                    budget["burst"],
                    budget["tokens"],
                    budget["dropped"],
                    budget["packets"]
                );
            }
        }
        out += &format!(
            "  prefixes {}/{} · verified {}/{}\n",
            xdp["aggregates"]["tracked"],
            xdp["aggregates"]["capacity"],
            xdp["verified"]["tracked"],
            xdp["verified"]["capacity"]
        );
        for block in xdp["blocks"].as_array().into_iter().flatten() {
            let cidr = block["cidr"].as_str().unwrap_or("?");
            match block["expires_in_secs"].as_u64() {
                Some(secs) => out += &format!("  blocked {cidr} ({secs} s left)\n"),
                None => out += &format!("  blocked {cidr} (until unblocked)\n"),
            }
        }
    } else {
        out += "xdp: no pinned maps (agent never started with [xdp]?)\n";
    }
    match &stats["proxy"] {
        Value::Object(proxy) => {
            out += "proxy:\n";
            for (name, value) in proxy.iter().filter(|(_, v)| v.is_number()) {
                // A JSON value ignores the width; its text does not.
                out += &format!("  {name:<22} {:>12}\n", value.to_string());
            }
            let policies = proxy.get("policies").and_then(Value::as_array).into_iter().flatten();
            for policy in policies {
                let name =
                    format!("{} {}", policy["kind"].as_str().unwrap_or("?"), policy["name"].as_str().unwrap_or("?"));
                let count = |field: &str| policy[field].as_u64().unwrap_or(0);
                let mut counts = format!(
                    "forwarded {} · throttled {} · rejected {}",
                    count("forwarded"),
                    count("throttled"),
                    count("rejected")
                );
                // Only deny and tag rules have these.
                for field in ["denied", "tagged"] {
                    if count(field) > 0 {
                        counts += &format!(" · {field} {}", count(field));
                    }
                }
                out += &format!("  {name:<28} {counts}\n");
            }
        }
        // An agent that answers without proxy counters runs without `[proxy]`.
        _ if stats["agent"]["running"].as_bool() == Some(true) => out += "proxy: not configured\n",
        _ => out += "proxy: agent not reachable\n",
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::render;

    #[test]
    fn table_shows_attachments_rates_blocks_and_proxy() {
        let stats = |dropped: u64| {
            json!({
                "xdp": {
                    "attached": [{"interface": "eth0", "mode": "native"}, {"interface": "eth1", "mode": "generic", "fallback": true}],
                    "enforce": true,
                    "coarse_clock": true,
                    "packets": {"dropped_rate_limit": dropped, "passed": 10},
                    "sources": {"tracked": 2, "capacity": 100},
                    "new_sources": {"packets_per_second": 100, "burst": 200, "tokens": 5, "packets": 900, "dropped": 700},
                    "syn": null,
                    "aggregates": {"tracked": 3, "capacity": 65536},
                    "verified": {"tracked": 1, "capacity": 65536},
                    "blocks": [{"cidr": "192.0.2.7/32", "expires_in_secs": 30}, {"cidr": "2001:db8::/48", "expires_in_secs": null}]
                },
                "proxy": null,
                "agent": {"running": false}
            })
        };
        let table = render(&stats(3_000), Some(&stats(1_000)), 2.0);
        assert!(
            table.starts_with(
                "xdp: eth0 (native), eth1 (generic, native refused) · enforcing · coarse clock · sources 2/100\n"
            ),
            "{table}"
        );
        assert!(
            table.contains("  budget new_sources: 100 pps, burst 200, 5 tokens left, 700 of 900 refused\n"),
            "{table}"
        );
        assert!(!table.contains("budget syn"), "{table}");
        assert!(table.contains("  prefixes 3/65536 · verified 1/65536\n"), "{table}");
        assert!(table.contains("dropped_rate_limit             3000       1000.0/s"), "{table}");
        assert!(table.contains("passed                           10          0.0/s"), "{table}");
        assert!(table.contains("blocked 192.0.2.7/32 (30 s left)"), "{table}");
        assert!(table.contains("blocked 2001:db8::/48 (until unblocked)"), "{table}");
        assert!(table.ends_with("proxy: agent not reachable\n"), "{table}");
        let once = render(&stats(5), None, 0.0);
        assert!(once.contains("dropped_rate_limit                5\n"), "{once}");
        let mut with_proxy = stats(5);
        with_proxy["proxy"] = json!({"requests": 12, "store": "memory", "policies": [
            {"kind": "rule", "name": "login", "forwarded": 5, "throttled": 0, "rejected": 7},
            {"kind": "rule", "name": "scanners", "forwarded": 0, "throttled": 0, "rejected": 0, "denied": 3, "tagged": 0},
        ]});
        let table = render(&with_proxy, None, 0.0);
        assert!(table.contains("  requests                         12\n"), "{table}");
        assert!(table.contains("  rule login                   forwarded 5 · throttled 0 · rejected 7\n"), "{table}");
        assert!(
            table.ends_with("  rule scanners                forwarded 0 · throttled 0 · rejected 0 · denied 3\n"),
            "{table}"
        );
        let mut without_proxy = stats(5);
        without_proxy["agent"] = json!({"running": true, "reloads": {"ok": 0, "rejected": 0}});
        let table = render(&without_proxy, None, 0.0);
        assert!(table.ends_with("proxy: not configured\n"), "{table}");
    }
}
