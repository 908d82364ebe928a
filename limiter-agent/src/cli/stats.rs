//! `limiter stats`: kernel counters straight from the pinned maps (so they read the
//! same whether or not the agent runs), plus the proxy's when the agent answers.

use std::{path::Path, process::ExitCode, time::Duration};

use serde::Serialize;

use super::CliError;
use crate::{
    agent::{AgentStats, EscalationStats, Reloads, Request, Response, admin},
    config::Config,
    proxy::ProxyStats,
    security_log::SecurityLogStats,
    xdp::{KernelMaps, XdpStats},
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
#[derive(Clone, Debug, Serialize)]
pub struct StatsReport {
    /// `None`: no pinned maps (the agent never ran with `[xdp]`).
    pub xdp: Option<XdpStats>,
    /// `None`: no agent answers, or it runs without `[proxy]`.
    pub proxy: Option<ProxyStats>,
    pub agent: AgentStatus,
}

/// Whether an agent answered, and what it said of itself.
#[derive(Clone, Debug, Serialize)]
pub struct AgentStatus {
    pub running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reloads: Option<Reloads>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalation: Option<EscalationStats>,
    /// `[agent.security_log]`'s counts, by [`crate::security_log::LogCount`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_log: Option<SecurityLogStats>,
}

/// What `limiter stats --json` prints.
pub fn collect(config: &Config) -> Result<StatsReport, CliError> {
    let xdp = match KernelMaps::open_pinned(&config.agent.pin_dir) {
        Ok(mut maps) => Some(maps.stats(crate::xdp::attached(&config.agent.pin_dir)?)?),
        Err(crate::xdp::XdpError::MissingMap(..)) => None,
        Err(error) => return Err(error.into()),
    };
    let agent = match admin::ask_blocking(&config.agent.admin_socket, &Request::Stats, Duration::from_secs(2)) {
        Ok(Response::Stats { stats }) => Some(*stats),
        _ => None,
    };
    Ok(match agent {
        Some(AgentStats { reloads, escalation, proxy, security_log, .. }) => StatsReport {
            xdp,
            proxy,
            agent: AgentStatus {
                running: true,
                reloads: Some(reloads),
                escalation: Some(escalation),
                security_log: Some(security_log),
            },
        },
        None => StatsReport {
            xdp,
            proxy: None,
            agent: AgentStatus { running: false, reloads: None, escalation: None, security_log: None },
        },
    })
}

/// The report as JSON text. Through a `Value`, whose maps are sorted, so that the keys
/// come out in the order `--json` has always printed them.
fn json(report: &StatsReport, pretty: bool) -> Result<String, serde_json::Error> {
    let value = serde_json::to_value(report)?;
    if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) }
}

pub fn run(path: &Path, args: &StatsArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let Some(secs) = args.watch else {
        let stats = collect(&config)?;
        if args.json {
            println!("{}", json(&stats, true)?);
        } else {
            print!("{}", render(&stats, None, 0.0));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let interval = Duration::from_secs(secs.max(1));
    let mut previous: Option<StatsReport> = None;
    loop {
        let stats = collect(&config)?;
        if args.json {
            println!("{}", json(&stats, false)?);
        } else {
            // Home the cursor and clear: the table refreshes in place.
            print!("\x1b[H\x1b[2J{}", render(&stats, previous.as_ref(), interval.as_secs_f64()));
        }
        previous = Some(stats);
        std::thread::sleep(interval);
    }
}

/// The human table; with `previous`, a rate column per second.
fn render(stats: &StatsReport, previous: Option<&StatsReport>, secs: f64) -> String {
    let mut out = String::new();
    match &stats.xdp {
        Some(xdp) => render_xdp(&mut out, xdp, previous.and_then(|p| p.xdp.as_ref()), secs),
        None => out += "xdp: no pinned maps (agent never started with [xdp]?)\n",
    }
    match &stats.proxy {
        Some(proxy) => render_proxy(&mut out, proxy),
        // An agent that answers without proxy counters runs without `[proxy]`.
        None if stats.agent.running => out += "proxy: not configured\n",
        None => out += "proxy: agent not reachable\n",
    }
    out
}

fn render_xdp(out: &mut String, xdp: &XdpStats, previous: Option<&XdpStats>, secs: f64) {
    let attached: Vec<String> = xdp
        .attached
        .iter()
        .map(|a| {
            let fallback = if a.fallback { ", native refused" } else { "" };
            format!("{} ({}{fallback})", a.interface, a.mode)
        })
        .collect();
    *out += &format!(
        "xdp: {} · {} · {} clock · sources {}/{}\n",
        if attached.is_empty() { "not attached".to_owned() } else { attached.join(", ") },
        if xdp.enforce { "enforcing" } else { "dry run" },
        if xdp.coarse_clock { "coarse" } else { "precise" },
        xdp.sources.tracked,
        xdp.sources.capacity
    );
    for (name, value) in &xdp.packets.0 {
        match previous.and_then(|p| p.packets.0.get(name)) {
            Some(before) => {
                let rate = value.saturating_sub(*before) as f64 / secs;
                *out += &format!("  {name:<22} {value:>12} {rate:>12.1}/s\n");
            }
            None => *out += &format!("  {name:<22} {value:>12}\n"),
        }
    }
    for (name, budget) in [("new_sources", &xdp.new_sources), ("syn", &xdp.syn)] {
        if let Some(budget) = budget {
            *out += &format!(
                "  budget {name}: {} pps, burst {}, {} tokens left, {} of {} refused\n",
                budget.packets_per_second, budget.burst, budget.tokens, budget.dropped, budget.packets
            );
        }
    }
    *out += &format!(
        "  prefixes {}/{} · verified {}/{}\n",
        xdp.aggregates.tracked, xdp.aggregates.capacity, xdp.verified.tracked, xdp.verified.capacity
    );
    for block in &xdp.blocks {
        match block.expires_in_secs {
            Some(secs) => *out += &format!("  blocked {} ({secs} s left)\n", block.cidr),
            None => *out += &format!("  blocked {} (until unblocked)\n", block.cidr),
        }
    }
    for demoted in &xdp.demoted {
        let left =
            demoted.expires_in_secs.map_or_else(|| "until undemoted".to_owned(), |secs| format!("{secs} s left"));
        *out += &format!(
            "  demoted {} to {} pps, burst {} ({left})\n",
            demoted.cidr, demoted.packets_per_second, demoted.burst
        );
    }
}

fn render_proxy(out: &mut String, proxy: &ProxyStats) {
    *out += "proxy:\n";
    for (name, value) in proxy.counters() {
        *out += &format!("  {name:<22} {value:>12}\n");
    }
    for policy in &proxy.policies {
        let name = format!("{} {}", policy.kind, policy.name);
        let mut counts =
            format!("forwarded {} · throttled {} · rejected {}", policy.forwarded, policy.throttled, policy.rejected);
        // Only deny and tag rules have these.
        for (field, count) in [("denied", policy.denied), ("tagged", policy.tagged)] {
            if count > 0 {
                counts += &format!(" · {field} {count}");
            }
        }
        if let Some(concurrency) = policy.concurrency {
            counts +=
                &format!(" · in flight {} · queued {} (at most {concurrency} per key)", policy.inflight, policy.queued);
        }
        *out += &format!("  {name:<28} {counts}\n");
    }
    if let Some(adaptive) = &proxy.adaptive {
        let ms = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1} ms"));
        let state: String = [
            (adaptive.shedding, " · shedding"),
            (adaptive.probing, " · probing"),
            (adaptive.tightened, " · new sources tightened"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, shown)| *shown)
        .collect();
        *out += &format!(
            "  {:<28} limit {} · latency {} · baseline {}{state}\n",
            "adaptive",
            adaptive.limit,
            ms(adaptive.latency_ms),
            ms(adaptive.baseline_ms),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{AgentStatus, StatsReport, json, render};
    use crate::{
        agent::{EscalationStats, Reloads},
        limits::{PolicyCounts, engine::PolicyKind},
        proxy::{AdaptiveStats, ProxyStats},
        security_log::{LogCount, SecurityLogStats},
        xdp::{
            AttachedMode, Attachment, CounterSnapshot, XdpStats,
            stats::{BlockRow, BudgetRow, DemotedRow, SourceCount},
        },
    };

    fn report(dropped: u64) -> StatsReport {
        let attachment =
            |interface: &str, mode, fallback| Attachment { interface: interface.to_owned(), mode, fallback };
        StatsReport {
            xdp: Some(XdpStats {
                attached: vec![
                    attachment("eth0", AttachedMode::Native, false),
                    attachment("eth1", AttachedMode::Generic, true),
                ],
                enforce: true,
                coarse_clock: true,
                packets: CounterSnapshot(BTreeMap::from([("dropped_rate_limit", dropped), ("passed", 10)])),
                sources: SourceCount { tracked: 2, capacity: 100 },
                blocks: vec![
                    BlockRow { cidr: "192.0.2.7/32".to_owned(), expires_in_secs: Some(30) },
                    BlockRow { cidr: "2001:db8::/48".to_owned(), expires_in_secs: None },
                ],
                demoted: vec![DemotedRow {
                    cidr: "198.51.100.9/32".to_owned(),
                    packets_per_second: 20,
                    burst: 40,
                    expires_in_secs: Some(600),
                }],
                new_sources: Some(BudgetRow {
                    packets_per_second: 100,
                    burst: 200,
                    tokens: 5,
                    packets: 900,
                    dropped: 700,
                }),
                syn: None,
                aggregates: SourceCount { tracked: 3, capacity: 65_536 },
                verified: SourceCount { tracked: 1, capacity: 65_536 },
            }),
            proxy: None,
            agent: AgentStatus { running: false, reloads: None, escalation: None, security_log: None },
        }
    }

    fn policy(name: &str, forwarded: u64, rejected: u64, denied: u64) -> PolicyCounts {
        PolicyCounts {
            kind: PolicyKind::Rule,
            name: name.to_owned(),
            forwarded,
            throttled: 0,
            rejected,
            denied,
            tagged: 0,
            concurrency: None,
            inflight: 0,
            queued: 0,
        }
    }

    #[test]
    fn table_shows_attachments_rates_blocks_and_proxy() {
        let table = render(&report(3_000), Some(&report(1_000)), 2.0);
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
        assert!(table.contains("demoted 198.51.100.9/32 to 20 pps, burst 40 (600 s left)"), "{table}");
        assert!(table.ends_with("proxy: agent not reachable\n"), "{table}");
        let once = render(&report(5), None, 0.0);
        assert!(once.contains("dropped_rate_limit                5\n"), "{once}");
        let mut with_proxy = report(5);
        with_proxy.proxy = Some(ProxyStats {
            requests: 12,
            store: "memory".to_owned(),
            policies: vec![policy("login", 5, 7, 0), policy("scanners", 0, 0, 3)],
            ..ProxyStats::default()
        });
        let table = render(&with_proxy, None, 0.0);
        assert!(table.contains("  requests                         12\n"), "{table}");
        assert!(table.contains("  rule login                   forwarded 5 · throttled 0 · rejected 7\n"), "{table}");
        assert!(
            table.ends_with("  rule scanners                forwarded 0 · throttled 0 · rejected 0 · denied 3\n"),
            "{table}"
        );
        with_proxy.proxy = Some(ProxyStats {
            adaptive: Some(AdaptiveStats {
                limit: 17,
                latency_ms: Some(31.25),
                baseline_ms: Some(20.0),
                shedding: true,
                probing: false,
                tightened: true,
            }),
            ..ProxyStats::default()
        });
        let table = render(&with_proxy, None, 0.0);
        assert!(
            table
                .ends_with("  adaptive                     limit 17 · latency 31.2 ms · baseline 20.0 ms · shedding · new sources tightened\n"),
            "{table}"
        );
        let mut without_proxy = report(5);
        without_proxy.agent = AgentStatus {
            running: true,
            reloads: Some(Reloads::default()),
            escalation: Some(EscalationStats::default()),
            security_log: None,
        };
        let table = render(&without_proxy, None, 0.0);
        assert!(table.ends_with("proxy: not configured\n"), "{table}");
    }

    /// `--json` is what scripts read: its keys and their order stay as they were
    /// when the report was an untyped map.
    #[test]
    fn json_keeps_its_keys_and_their_order() {
        let mut stopped = report(5);
        if let Some(xdp) = stopped.xdp.as_mut() {
            xdp.blocks.truncate(1);
        }
        let text = json(&stopped, false).expect("json");
        assert_eq!(
            text,
            concat!(
                r#"{"agent":{"running":false},"proxy":null,"xdp":{"aggregates":{"capacity":65536,"tracked":3},"#,
                r#""attached":[{"fallback":false,"interface":"eth0","mode":"native"},"#,
                r#"{"fallback":true,"interface":"eth1","mode":"generic"}],"#,
                r#""blocks":[{"cidr":"192.0.2.7/32","expires_in_secs":30}],"coarse_clock":true,"#,
                r#""demoted":[{"burst":40,"cidr":"198.51.100.9/32","expires_in_secs":600,"packets_per_second":20}],"#,
                r#""enforce":true,"#,
                r#""new_sources":{"burst":200,"dropped":700,"packets":900,"packets_per_second":100,"tokens":5},"#,
                r#""packets":{"dropped_rate_limit":5,"passed":10},"sources":{"capacity":100,"tracked":2},"#,
                r#""syn":null,"verified":{"capacity":65536,"tracked":1}}}"#
            )
        );
        let running = StatsReport {
            xdp: None,
            proxy: None,
            agent: AgentStatus {
                running: true,
                reloads: Some(Reloads { ok: 2, rejected: 1, last_unix: 1_700_000_000 }),
                escalation: Some(EscalationStats { blocks_refused: 0, block_failures: 0, demotions: 0 }),
                security_log: Some(SecurityLogStats(
                    LogCount::ALL.iter().zip([7, 1, 40]).map(|(c, n)| (c.name().to_owned(), n)).collect(),
                )),
            },
        };
        assert_eq!(
            json(&running, false).expect("json"),
            concat!(
                r#"{"agent":{"escalation":{"block_failures":0,"blocks_refused":0,"demotions":0},"reloads":{"last_unix":1700000000,"ok":2,"rejected":1},"running":true,"#,
                r#""security_log":{"dropped":1,"suppressed":40,"written":7}},"proxy":null,"xdp":null}"#
            )
        );
    }
}
