//! The XDP group: the `xdp_cost` example's cost per packet from `BPF_PROG_TEST_RUN`,
//! each case against the do-nothing XDP_PASS floor.

use std::fmt::Write as _;

use limiter_lab::report::{Outcome, XdpCost};

use super::{Bench, format::num, svg::bar_chart};

pub const TITLE: &str = "1. XDP cost per packet";

pub fn run(bench: &mut Bench) -> Outcome<XdpCost> {
    let s = bench.sizes;
    bench.example("xdp_cost", &[s.xdp_repeat.to_string(), s.xdp_capacity.to_string()])
}

/// The cases in report order, with their labels; those a report written before them
/// lacks are left out.
fn cases(x: &XdpCost) -> Vec<(&'static str, &'static str, f64)> {
    [
        ("XDP_PASS only (floor)", "XDP_PASS floor", Some(x.xdp_pass_floor_ns)),
        ("limiter, known source", "known source", Some(x.known_source_ns)),
        (
            "limiter, a packet to a port not served (`[xdp.services]`: UDP from port 53 to an ephemeral port, 16 `udp_replies_from` checked)",
            "port not served",
            x.not_served_port_ns,
        ),
        ("limiter, new source, full map", "new source, full map", Some(x.new_source_full_map_ns)),
        ("limiter, known source, 10 000 CIDRs", "known source, 10k CIDRs", Some(x.known_source_10k_cidrs_ns)),
        (
            "limiter, unknown source refused by the new-source budget",
            "unknown, budget empty",
            Some(x.unknown_refused_by_budget_ns),
        ),
        (
            "limiter, known source with a /24 aggregate",
            "known source + aggregate",
            Some(x.known_source_with_aggregate_ns),
        ),
    ]
    .into_iter()
    .filter_map(|(label, short, ns)| Some((label, short, ns?)))
    .collect()
}

pub fn markdown(m: &mut String, x: &XdpCost) {
    let _ = writeln!(m, "## {TITLE} (BPF_PROG_TEST_RUN, repeat {})\n", x.repeat);
    let _ = writeln!(m, "| case | ns | × floor |\n|---|---|---|");
    for (label, _, ns) in cases(x) {
        let _ = writeln!(m, "| {label} | {} | {:.2} |", num(Some(ns), 1), ns / x.xdp_pass_floor_ns);
    }
    let optional = [
        (
            "limiter, known source, burst below the coarse clock's bound (precise clock)",
            x.known_source_precise_clock_ns,
        ),
        ("limiter, known source with a byte budget", x.known_source_with_byte_budget_ns),
    ];
    for (label, ns) in optional {
        if let Some(ns) = ns {
            let _ = writeln!(m, "| {label} | {} | {:.2} |", num(Some(ns), 1), ns / x.xdp_pass_floor_ns);
        }
    }
    let _ = writeln!(
        m,
        "\nNew sources cannot repeat inside one test run (the first run inserts them), so that case runs once per source; \
         the fixed cost of a one-run call, measured with the floor program the same way ({} ns), is taken out.\n\n![xdp](xdp_cost.svg)\n",
        num(Some(x.single_run_overhead_ns), 0)
    );
    if let Some(stats) = &x.bpf_stats {
        let _ = writeln!(
            m,
            "As bpf_stats counts a run (what the flood's column reports; its two clock reads per run included): \
             hot = one frame repeated in the kernel, cold = one run per call cycling through {} known sources, \
             the syscall between runs evicting the caches as the stack does on veth.\n\n\
             | program | hot ns | cold ns |\n|---|---|---|\n| XDP_PASS floor | {} | {} |\n| limiter, known source | {} | {} |\n",
            stats.sources,
            num(Some(stats.floor_hot_ns), 1),
            num(Some(stats.floor_cold_ns), 1),
            num(Some(stats.known_source_hot_ns), 1),
            num(Some(stats.known_source_cold_ns), 1),
        );
    }
}

pub fn charts(x: &XdpCost) -> Vec<(&'static str, String)> {
    let bars: Vec<(String, f64)> = cases(x).iter().map(|(_, label, ns)| ((*label).to_owned(), *ns)).collect();
    vec![("xdp_cost", bar_chart("XDP cost per packet (lower is better)", "ns", &bars))]
}
