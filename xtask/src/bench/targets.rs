//! The targets the issues set, checked against a run's figures.

use limiter_lab::report::{HttpRow, Report, Target};

use super::{
    algorithms::{self, GOVERNOR},
    flood::softirq_per_million,
};

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
        "≤ 3 × XDP_PASS floor",
        xdp.map_or("—".into(), |x| {
            format!("{:.2} × ({:.0} ns vs {:.0} ns)", x.known_source_vs_floor, x.known_source_ns, x.xdp_pass_floor_ns)
        }),
        ratio.map(|r| r <= 3.0),
    ));
    let fresh = xdp.map(|x| x.new_source_full_map_ns);
    list.push(target(
        "XDP new source, full map",
        "< 400 ns",
        fresh.map_or("—".into(), |n| format!("{n:.0} ns")),
        fresh.map(|n| n < 400.0),
    ));

    // Like for like: both with bpf_stats' own accounting in, the flood's over 256
    // sources on the veth path, the test run's over the same sources one run each.
    let stats_gap = report
        .flood
        .measured()
        .and_then(|f| f.rows.iter().find(|r| r.filter == "limiter")?.xdp_program_ns_per_packet)
        .zip(xdp.and_then(|x| x.bpf_stats.as_ref()).map(|s| s.known_source_cold_ns));
    list.push(target(
        "XDP ns/packet in the veth flood (bpf_stats) vs the test run",
        "≤ 1.3 × (bpf_stats over the same 256 sources, one run each)",
        stats_gap.map_or("—".into(), |(flood, run)| format!("{:.2} × ({flood:.0} ns vs {run:.0} ns)", flood / run)),
        stats_gap.map(|(flood, run)| flood <= 1.3 * run),
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
    let per_m = |name| report.flood.measured().and_then(|f| softirq_per_million(f, name));
    let (nft, lim, drop_all) = (per_m("nftables"), per_m("limiter"), per_m("xdp_drop"));
    let delivery = flood("limiter").map(|r| r.good_delivery);
    let ratio = nft.zip(lim).map(|(n, l)| n / l);
    let over_floor = lim.zip(drop_all).map(|(l, d)| l / d);
    list.push(target(
        "Flood: CPU per packet, nftables / limiter, and limiter / an XDP program dropping everything",
        "≥ 1.5 × and ≤ 1.3 ×, well-behaved flow ≥ 99 % delivered",
        match (ratio, over_floor, delivery) {
            (Some(r), Some(f), Some(d)) => format!(
                "{r:.2} × and {f:.2} × ({:.0} / {:.0} / {:.0} ms per M packets), delivery {:.1} %",
                nft.unwrap_or(0.0),
                lim.unwrap_or(0.0),
                drop_all.unwrap_or(0.0),
                d * 100.0
            ),
            _ => "—".into(),
        },
        ratio.zip(over_floor).zip(delivery).map(|((r, f), d)| r >= 1.5 && f <= 1.3 && d >= 0.99),
    ));

    let http = |name: &str| report.http.measured().and_then(|h| h.rows.iter().find(|r| r.scenario == name));
    let limiter = http("limiter, per-IP + per-key + plan");
    let nginx = http("nginx limit_req");
    let rps = |r: Option<&HttpRow>| r.map(|r| r.closed_loop.rps);
    let tail = |r: Option<&HttpRow>| r.and_then(|r| r.fixed_rate.as_ref()).and_then(|f| f.p99_ms.zip(f.p999_ms));
    list.push(target(
        "Proxy, all rules: requests per second",
        "≥ 1.2 × nginx limit_req",
        rps(limiter).zip(rps(nginx)).map_or("—".into(), |(l, n)| format!("{l:.0} vs {n:.0} ({:.2} ×)", l / n)),
        rps(limiter).zip(rps(nginx)).map(|(l, n)| l >= 1.2 * n),
    ));
    list.push(target(
        "Proxy, all rules: p99 and p99.9 at a fixed rate",
        "≤ nginx limit_req",
        tail(limiter).zip(tail(nginx)).map_or("—".into(), |((l99, l999), (n99, n999))| {
            format!("{l99:.2} / {l999:.2} ms vs {n99:.2} / {n999:.2} ms")
        }),
        tail(limiter).zip(tail(nginx)).map(|((l99, l999), (n99, n999))| l99 <= n99 && l999 <= n999),
    ));
    let body_key = rps(http("limiter, per-IP + per-username (json:/username)"));
    list.push(target(
        "Proxy, a rule keyed on a JSON body's member: requests per second",
        "≥ 0.9 × per-IP + per-key + plan",
        body_key.zip(rps(limiter)).map_or("—".into(), |(b, l)| format!("{b:.0} vs {l:.0} ({:.2} ×)", b / l)),
        body_key.zip(rps(limiter)).map(|(b, l)| b >= 0.9 * l),
    ));
    let quotas = rps(http("limiter, per-IP + per-key + 3-quota plan"));
    list.push(target(
        "Proxy, a plan of three quotas (a burst, a minute, a calendar month): requests per second",
        "≥ 0.9 × the plan of one",
        quotas.zip(rps(limiter)).map_or("—".into(), |(q, l)| format!("{q:.0} vs {l:.0} ({:.2} ×)", q / l)),
        quotas.zip(rps(limiter)).map(|(q, l)| q >= 0.9 * l),
    ));
    let gated = rps(http("limiter, per-IP + per-key + plan + concurrency"));
    list.push(target(
        "Proxy, a concurrency rule with nothing queued: requests per second",
        "≥ 0.95 × the same rules without it",
        gated.zip(rps(limiter)).map_or("—".into(), |(g, l)| format!("{g:.0} vs {l:.0} ({:.2} ×)", g / l)),
        gated.zip(rps(limiter)).map(|(g, l)| g >= 0.95 * l),
    ));
    let bare = rps(http("limiter, no rules")).zip(rps(http("upstream direct")));
    list.push(target(
        "Proxy, no rules: requests per second",
        "≥ 0.5 × the upstream direct",
        bare.map_or("—".into(), |(l, u)| format!("{l:.0} vs {u:.0} ({:.2} ×)", l / u)),
        bare.map(|(l, u)| l >= 0.5 * u),
    ));
    let upgrade = report.http.measured().and_then(|h| h.upgrade.as_ref());
    list.push(target(
        "limiter upgrade under a new connection per request",
        "0 requests dropped",
        upgrade.map_or("—".into(), |u| {
            format!("{} of {} dropped; old agent gone {:.0} ms after the command", u.dropped, u.requests, u.handover_ms)
        }),
        upgrade.map(|u| u.dropped == 0),
    ));

    // The sliding log keeps `limit` times per key by definition: its goal is half.
    let goal = |algorithm: &str| if algorithm == "sliding_window_log" { 0.5 } else { 1.0 };
    let mut worst: Option<(f64, String)> = None;
    if let Some(a) = report.algorithms.measured() {
        for threads in [1, 2] {
            let Some(governor) = algorithms::row(a, GOVERNOR, threads) else { continue };
            for r in a.rows.iter().filter(|r| r.algorithm != GOVERNOR && r.threads == threads) {
                // Measured against the algorithm's own goal, so the worst is the furthest short.
                let ratio = r.decisions_per_second / governor.decisions_per_second / goal(&r.algorithm);
                if worst.as_ref().is_none_or(|(w, _)| ratio < *w) {
                    worst = Some((ratio, format!("{} at {threads} thread(s)", r.algorithm)));
                }
            }
        }
    }
    list.push(target(
        "Each algorithm vs governor (keyed, 10 000 keys), 1 and 2 threads",
        "≥ 1 × governor's decisions/s (sliding window log ≥ 0.5 ×)",
        worst.as_ref().map_or("—".into(), |(r, w)| format!("furthest short: {w}, {r:.2} of its goal")),
        worst.map(|(r, _)| r >= 1.0),
    ));
    let single_state = report.memory.measured().and_then(|m| {
        m.proxy.iter().filter(|p| p.algorithm != "SlidingWindowLog").map(|p| p.bytes_per_key).reduce(f64::max)
    });
    list.push(target(
        "Bytes per tracked key (proxy), single-state algorithms",
        "≤ 64",
        single_state.map_or("—".into(), |b| format!("{b:.0} at most")),
        single_state.map(|b| b <= 64.0),
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
