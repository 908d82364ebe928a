//! The targets of issue 7, checked against a run's figures.

use limiter_lab::report::{HttpRow, Report, Target};

use super::algorithms::{self, GOVERNOR};

/// One target: what it says, the figure measured, and whether it holds (None: not
/// measured in this run).
fn target(name: &str, goal: &str, measured: String, met: Option<bool>) -> Target {
    Target { target: name.to_owned(), goal: goal.to_owned(), measured, met }
}

pub fn targets(report: &Report) -> Vec<Target> {
    let mut list = Vec::new();
    let xdp = report.xdp_cost.measured();
    let ratio = xdp.map(|x| x.known_source_vs_floor);
    list.push(target(
        "XDP known source",
        "≤ 2.5 × XDP_PASS floor",
        xdp.map_or("—".into(), |x| {
            format!("{:.2} × ({:.0} ns vs {:.0} ns)", x.known_source_vs_floor, x.known_source_ns, x.xdp_pass_floor_ns)
        }),
        ratio.map(|r| r <= 2.5),
    ));
    let fresh = xdp.map(|x| x.new_source_full_map_ns);
    list.push(target(
        "XDP new source, full map",
        "< 400 ns",
        fresh.map_or("—".into(), |n| format!("{n:.0} ns")),
        fresh.map(|n| n < 400.0),
    ));

    let refused = xdp.map(|x| x.unknown_refused_vs_known);
    list.push(target(
        "XDP unknown source refused by the new-source budget",
        "≤ 2 × known source",
        xdp.map_or("—".into(), |x| {
            format!(
                "{:.2} × ({:.0} ns vs {:.0} ns)",
                x.unknown_refused_vs_known, x.unknown_refused_by_budget_ns, x.known_source_ns
            )
        }),
        refused.map(|r| r <= 2.0),
    ));
    let budgeted = report
        .random_flood
        .measured()
        .and_then(|f| f.rows.iter().find(|r| r.filter == "limiter+budget").map(|r| (f, r)));
    // The budget's burst, plus its rate over the flood, plus one second of slack.
    let allowed = budgeted.map(|(f, r)| f64::from(f.new_source_budget) * (r.flood_seconds + 2.0));
    let admitted = budgeted.map(|(_, r)| r.flood_packets.saturating_sub(r.dropped) as f64);
    list.push(target(
        "Random-source flood with the new-source budget",
        "admitted within the budget, well-behaved flow ≥ 99 % delivered",
        budgeted.map_or("—".into(), |(_, r)| {
            format!(
                "{:.0} admitted ({:.2} %, budget allows {:.0}), delivery {:.1} %",
                admitted.unwrap_or(0.0),
                r.admitted_share * 100.0,
                allowed.unwrap_or(0.0),
                r.good_delivery * 100.0
            )
        }),
        budgeted.map(|(_, r)| admitted <= allowed && r.good_delivery >= 0.99),
    ));

    let flood = |name: &str| report.flood.measured().and_then(|f| f.rows.iter().find(|r| r.filter == name));
    let per_m = |name| flood(name).map(|r| r.softirq_ms_per_million_packets);
    // Zero means the flood was too short for the tick-based accounting to see it.
    let (nft, lim) = (per_m("nftables").filter(|v| *v > 0.0), per_m("limiter").filter(|v| *v > 0.0));
    let delivery = flood("limiter").map(|r| r.good_delivery);
    let ratio = nft.zip(lim).map(|(n, l)| n / l.max(1e-9));
    list.push(target(
        "Flood: CPU per packet, nftables / limiter",
        "≥ 3 ×, well-behaved flow ≥ 99 % delivered",
        match (ratio, delivery) {
            (Some(r), Some(d)) => format!(
                "{r:.2} × ({:.0} vs {:.0} ms per M packets), delivery {:.1} %",
                nft.unwrap_or(0.0),
                lim.unwrap_or(0.0),
                d * 100.0
            ),
            _ => "—".into(),
        },
        ratio.zip(delivery).map(|(r, d)| r >= 3.0 && d >= 0.99),
    ));

    let http = |name: &str| report.http.measured().and_then(|h| h.rows.iter().find(|r| r.scenario == name));
    let limiter = http("limiter, per-IP + per-key + plan");
    let nginx = http("nginx limit_req");
    let rps = |r: Option<&HttpRow>| r.map(|r| r.closed_loop.rps);
    let p99 = |r: Option<&HttpRow>| r.and_then(|r| r.fixed_rate.as_ref()?.p99_ms);
    list.push(target(
        "Proxy, all rules: requests per second",
        "≥ nginx limit_req",
        rps(limiter).zip(rps(nginx)).map_or("—".into(), |(l, n)| format!("{l:.0} vs {n:.0} ({:.2} ×)", l / n)),
        rps(limiter).zip(rps(nginx)).map(|(l, n)| l >= n),
    ));
    list.push(target(
        "Proxy, all rules: p99 at a fixed rate",
        "≤ nginx limit_req",
        p99(limiter).zip(p99(nginx)).map_or("—".into(), |(l, n)| format!("{l:.2} ms vs {n:.2} ms")),
        p99(limiter).zip(p99(nginx)).map(|(l, n)| l <= n),
    ));

    let mut worst: Option<(f64, String)> = None;
    if let Some(a) = report.algorithms.measured() {
        for threads in [1, 2] {
            let Some(governor) = algorithms::row(a, GOVERNOR, threads) else { continue };
            for r in a.rows.iter().filter(|r| r.algorithm != GOVERNOR && r.threads == threads) {
                let ratio = r.decisions_per_second / governor.decisions_per_second;
                if worst.as_ref().is_none_or(|(w, _)| ratio < *w) {
                    worst = Some((ratio, format!("{} at {threads} thread(s)", r.algorithm)));
                }
            }
        }
    }
    list.push(target(
        "Each algorithm vs governor (keyed, 10 000 keys)",
        "≥ 1 × governor's decisions/s",
        worst.as_ref().map_or("—".into(), |(r, w)| format!("slowest: {w}, {r:.2} ×")),
        worst.map(|(r, _)| r >= 1.0),
    ));
    let hmac = report
        .hmac
        .measured()
        .and_then(|h| h.rows.iter().find(|r| r.body_bytes == 1_048_576))
        .map(|r| r.bytes_per_second);
    list.push(target(
        "HMAC verification, 1 MiB bodies",
        "> 1 GB/s",
        hmac.map_or("—".into(), |b| format!("{:.2} GB/s", b / 1e9)),
        hmac.map(|b| b > 1e9),
    ));
    list
}
