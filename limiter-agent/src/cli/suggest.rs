//! `limiter suggest`: limits from real traffic. For each rule and plan, what the
//! running agent has seen of its keys' peaks (in shadow or enforcing mode) and a
//! limit `--headroom` above their 99th percentile; for the kernel layer, the rate of
//! every source over `--interval` seconds, read twice from the pinned maps.

use std::{collections::HashMap, path::Path, process::ExitCode, time::Duration};

use serde::Serialize;

use super::CliError;
use crate::{
    agent::{Request, Response, admin},
    config::Config,
    limits::Suggestion,
    xdp::{KernelMaps, SourceRow, XdpError},
};

#[derive(Debug, clap::Args)]
pub struct SuggestArgs {
    /// Suggested limits are the 99th percentile times this.
    #[arg(long, default_value_t = 1.5)]
    pub headroom: f64,
    /// Seconds between the two looks at the kernel layer's sources (0: skip them).
    #[arg(long, default_value_t = 5)]
    pub interval: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `limiter suggest --json` prints.
#[derive(Debug, Serialize)]
pub struct Suggestions {
    pub headroom: f64,
    /// `None`: no agent answered, or it runs without `[proxy]` (`proxy_note` says).
    pub proxy: Option<Vec<Suggestion>>,
    pub proxy_note: Option<String>,
    /// `None`: no pinned maps, or `--interval 0`.
    pub kernel: Option<KernelSuggestion>,
}

/// Packets per second of each source over the interval.
#[derive(Debug, PartialEq, Serialize)]
pub struct KernelSuggestion {
    pub interval_secs: f64,
    /// Sources that sent anything in the interval.
    pub sources: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    /// Sources that had a packet dropped by their bucket in the interval.
    pub hit_the_bucket: u64,
    /// `hit_the_bucket` out of `sources`.
    pub hit_share: f64,
    /// `xdp.limit.packets_per_second` now.
    pub limit: u32,
    pub suggested_packets_per_second: Option<u64>,
}

pub fn run(path: &Path, args: &SuggestArgs) -> Result<ExitCode, CliError> {
    if !(args.headroom >= 1.0 && args.headroom.is_finite()) {
        return Err(CliError::Usage(format!("--headroom {} must be at least 1", args.headroom)));
    }
    let config = Config::load(path)?;
    let (proxy, proxy_note) = match admin::ask_blocking(
        &config.agent.admin_socket,
        &Request::Suggest { headroom: args.headroom },
        Duration::from_secs(2),
    ) {
        Ok(Response::Suggested { suggestions: Some(suggestions) }) => (Some(suggestions), None),
        Ok(Response::Suggested { suggestions: None }) => (None, Some("not configured".to_owned())),
        Ok(other) => return Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
        Err(_) => (None, Some("agent not reachable".to_owned())),
    };
    let kernel = match (&config.xdp, args.interval) {
        (Some(xdp), secs) if secs > 0 => match KernelMaps::open_pinned(&config.agent.pin_dir) {
            Ok(maps) => {
                let before = maps.source_rows()?;
                std::thread::sleep(Duration::from_secs(secs));
                let after = maps.source_rows()?;
                let limit = xdp.limit.packets.packets_per_second.get();
                Some(kernel_suggestion(&before, &after, secs as f64, limit, args.headroom))
            }
            Err(XdpError::MissingMap(..)) => None,
            Err(error) => return Err(error.into()),
        },
        _ => None,
    };
    let suggestions = Suggestions { headroom: args.headroom, proxy, proxy_note, kernel };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&suggestions)?);
    } else {
        print!("{}", render(&suggestions));
    }
    Ok(ExitCode::SUCCESS)
}

/// The rates of every source between two looks `secs` apart.
#[must_use]
pub fn kernel_suggestion(
    before: &[SourceRow],
    after: &[SourceRow],
    secs: f64,
    limit: u32,
    headroom: f64,
) -> KernelSuggestion {
    let earlier: HashMap<&str, &SourceRow> = before.iter().map(|row| (row.source.as_str(), row)).collect();
    let mut rates = Vec::new();
    let mut hit = 0;
    for row in after {
        let (packets, dropped) = earlier.get(row.source.as_str()).map_or((0, 0), |r| (r.packets, r.dropped));
        let sent = row.packets.saturating_sub(packets);
        if sent > 0 {
            rates.push(sent as f64 / secs);
            hit += u64::from(row.dropped > dropped);
        }
    }
    rates.sort_by(f64::total_cmp);
    let p99 = nearest_rank(&rates, 0.99);
    KernelSuggestion {
        interval_secs: secs,
        sources: rates.len() as u64,
        p50: nearest_rank(&rates, 0.50),
        p95: nearest_rank(&rates, 0.95),
        p99,
        max: rates.last().copied().unwrap_or(0.0),
        hit_the_bucket: hit,
        hit_share: if rates.is_empty() { 0.0 } else { hit as f64 / rates.len() as f64 },
        limit,
        suggested_packets_per_second: (!rates.is_empty()).then(|| (p99 * headroom).ceil().max(1.0) as u64),
    }
}

/// The smallest value that at least `p` of `sorted` are at or under.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied().unwrap_or(0.0)
}

fn render(suggestions: &Suggestions) -> String {
    let mut out = String::new();
    match (&suggestions.proxy, &suggestions.proxy_note) {
        (Some(policies), _) => {
            let observed = policies.iter().map(|p| p.peaks.observed_secs).max().unwrap_or(0);
            out += &format!(
                "proxy: the most requests (or units) one key sent in one window, over {observed} s; suggested = p99 × {}\n",
                suggestions.headroom
            );
            out += &format!(
                "{:<24} {:>12} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}\n",
                "policy", "limit", "keys", "p50", "p95", "p99", "max", "over", "suggested"
            );
            for policy in policies {
                let peaks = &policy.peaks;
                let suggested = policy.suggested_limit.map_or_else(|| "-".to_owned(), |n| n.to_string());
                out += &format!(
                    "{:<24} {:>12} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}\n",
                    format!("{} {}", policy.kind, policy.name),
                    format!("{}/{}s", policy.limit, policy.window_secs),
                    peaks.keys,
                    peaks.p50,
                    peaks.p95,
                    peaks.p99,
                    peaks.max,
                    peaks.keys_over,
                    suggested
                );
                if policy.units != "requests" {
                    out += &format!("  (limit and peaks in {})\n", policy.units);
                }
                if peaks.untracked_requests > 0 {
                    out += &format!("  ({} requests of keys out of the sample)\n", peaks.untracked_requests);
                }
            }
        }
        (None, note) => out += &format!("proxy: {}\n", note.as_deref().unwrap_or("no answer")),
    }
    match &suggestions.kernel {
        Some(kernel) => {
            out += &format!("kernel layer: packets/s of each source over {} s\n", kernel.interval_secs);
            out += &format!(
                "{:>8} {:>9} {:>9} {:>9} {:>9} {:>15} {:>10} {:>10}\n",
                "sources", "p50", "p95", "p99", "max", "hit the bucket", "limit", "suggested"
            );
            let suggested = kernel.suggested_packets_per_second.map_or_else(|| "-".to_owned(), |n| n.to_string());
            let hit = format!("{} ({:.0} %)", kernel.hit_the_bucket, kernel.hit_share * 100.0);
            out += &format!(
                "{:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>15} {:>10} {:>10}\n",
                kernel.sources, kernel.p50, kernel.p95, kernel.p99, kernel.max, hit, kernel.limit, suggested
            );
        }
        None => out += "kernel layer: not sampled (no pinned maps, or --interval 0)\n",
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Suggestions, kernel_suggestion, render};
    use crate::{
        limits::{Suggestion, observe::Peaks},
        xdp::SourceRow,
    };

    fn row(source: &str, packets: u64, dropped: u64) -> SourceRow {
        SourceRow { source: source.to_owned(), packets, dropped, tokens: 0, note: None }
    }

    #[test]
    fn kernel_rates_come_from_two_looks_and_count_sources_that_hit_their_bucket() {
        let before: Vec<SourceRow> = (0..98).map(|i| row(&format!("10.0.0.{i}"), 100, 0)).collect();
        let mut after: Vec<SourceRow> = (0..98).map(|i| row(&format!("10.0.0.{i}"), 100 + 50, 0)).collect();
        after.push(row("192.0.2.1", 5_000, 4_000));
        after.push(row("192.0.2.2", 500, 0));
        after.push(row("10.9.9.9", 7, 0)); // idle in the interval: not counted
        let before = [before, vec![row("10.9.9.9", 7, 0)]].concat();
        let kernel = kernel_suggestion(&before, &after, 5.0, 1_000, 2.0);
        assert_eq!((kernel.sources, kernel.hit_the_bucket, kernel.hit_share, kernel.limit), (100, 1, 0.01, 1_000));
        assert_eq!((kernel.p50, kernel.p95, kernel.p99, kernel.max), (10.0, 10.0, 100.0, 1_000.0));
        assert_eq!(kernel.suggested_packets_per_second, Some(200));
    }

    #[test]
    fn the_table_shows_each_policy_and_the_kernel_layer() {
        let suggestion = Suggestion {
            kind: crate::limits::engine::PolicyKind::Rule,
            name: "per-ip".to_owned(),
            limit: 10,
            window_secs: 60.0,
            peaks: Peaks {
                observed_secs: 180,
                keys: 100,
                untracked_requests: 0,
                p50: 2,
                p95: 8,
                p99: 8,
                max: 30,
                keys_over: 1,
            },
            suggested_limit: Some(12),
            units: "requests".to_owned(),
        };
        let searches =
            Suggestion { name: "search".to_owned(), units: "units (5 a request)".to_owned(), ..suggestion.clone() };
        let table = render(&Suggestions {
            headroom: 1.5,
            proxy: Some(vec![suggestion, searches]),
            proxy_note: None,
            kernel: None,
        });
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "proxy: the most requests (or units) one key sent in one window, over 180 s; suggested = p99 × 1.5"
        );
        assert_eq!(
            lines[2],
            format!(
                "{:<24} {:>12} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>10}",
                "rule per-ip", "10/60s", 100, 2, 8, 8, 30, 1, 12
            )
        );
        assert_eq!(lines[4], "  (limit and peaks in units (5 a request))");
        assert_eq!(lines[5], "kernel layer: not sampled (no pinned maps, or --interval 0)");
    }
}
