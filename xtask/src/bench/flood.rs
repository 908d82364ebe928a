//! The flood groups: the `bench_flood` example's bounded UDP flood on a veth pair
//! against no filter, an XDP program that drops everything, an nftables meter per
//! source, limiter (native, then generic) and limiter with a new-source budget; once
//! from a set of spoofed sources, once from a random address per frame.

use std::fmt::Write as _;

use limiter_lab::report::{Flood, Outcome};

use super::{Bench, format::num, svg::bar_chart};

pub const TITLE: &str = "2. Flood on a veth pair";
pub const RANDOM_TITLE: &str = "2b. Random-source flood on a veth pair";

/// Packets per second per source, and the well-behaved flow's rate.
const RATE_PER_SOURCE: u32 = 100;
const GOOD_PPS: u32 = 50;

pub fn run(bench: &mut Bench) -> Outcome<Flood> {
    let s = bench.sizes;
    bench.example(
        "bench_flood",
        &[s.flood_packets.to_string(), s.flood_sources.to_string(), RATE_PER_SOURCE.to_string(), GOOD_PPS.to_string()],
    )
}

/// The same flood from a random source address per frame.
pub fn run_random(bench: &mut Bench) -> Outcome<Flood> {
    let s = bench.sizes;
    bench.example(
        "bench_flood",
        &[s.flood_packets.to_string(), "0".into(), RATE_PER_SOURCE.to_string(), GOOD_PPS.to_string()],
    )
}

/// The receiving CPU's softirq ms per million packets under `filter`, if the flood
/// was long enough to show: zero means too short for the tick-based accounting.
pub fn softirq_per_million(fl: &Flood, filter: &str) -> Option<f64> {
    fl.rows.iter().find(|r| r.filter == filter).map(|r| r.softirq_ms_per_million_packets).filter(|v| *v > 0.0)
}

pub fn markdown(m: &mut String, fl: &Flood) {
    let (title, sources) = if fl.spoofed_sources == 0 {
        (RANDOM_TITLE, "a random source address per frame".to_owned())
    } else {
        (TITLE, format!("{} spoofed sources", fl.spoofed_sources))
    };
    let _ = writeln!(
        m,
        "## {title}\n\n{} UDP frames from {sources} (trafgen, one CPU), limit {} packets/s per source (burst {}), \
         plus one well-behaved flow at {} packets/s; `xdp_drop` drops every frame (the floor of any XDP filter, the \
         well-behaved flow's frames too), `limiter (generic)` attaches in skb mode, `limiter+budget` adds \
         `[xdp.new_sources]` of {} packets/s (burst the same). Receiving side's CPU = softirq time on the flooding CPU (background rate removed).\n",
        fl.flood_packets, fl.rate_per_source, fl.burst_per_source, fl.good_pps, fl.new_source_budget
    );
    let _ = writeln!(
        m,
        "| filter | softirq ms per M packets | flood packets/s | dropped | admitted | well-behaved delivered | XDP program ns/packet (bpf_stats) |\n|---|---|---|---|---|---|---|"
    );
    for r in &fl.rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {:.2} % | {}/{} ({:.1} %) | {} |",
            r.filter,
            num(Some(r.softirq_ms_per_million_packets), 0),
            num(Some(r.flood_packets_per_second), 0),
            r.dropped,
            r.admitted_share * 100.0,
            r.good_received,
            r.good_sent,
            r.good_delivery * 100.0,
            num(r.xdp_program_ns_per_packet, 0),
        );
    }
    let per_m = |filter| softirq_per_million(fl, filter);
    if let (Some(floor), Some(nft), Some(limiter)) = (per_m("xdp_drop"), per_m("nftables"), per_m("limiter")) {
        let _ = writeln!(
            m,
            "\nCPU per packet: nftables / limiter = {:.2} ×; limiter / `xdp_drop` (the floor of an XDP filter) = {:.2} ×.",
            nft / limiter,
            limiter / floor
        );
    }
    let _ = writeln!(
        m,
        "\nOn veth every frame arrives as an skb that native XDP must first turn into an XDP buffer (a copy), so the \
         softirq figure includes a per-packet cost a hardware driver does not have; the program's own share is the bpf_stats column, \
         which counts two clock reads per run and caches the stack left cold (`xdp_drop`'s figure is that overhead alone).\n"
    );
    if fl.spoofed_sources != 0 {
        let _ = writeln!(m, "![flood](flood.svg)\n");
    }
}

pub fn charts(fl: &Flood) -> Vec<(&'static str, String)> {
    let bars: Vec<(String, f64)> =
        fl.rows.iter().map(|r| (r.filter.clone(), r.softirq_ms_per_million_packets)).collect();
    vec![("flood", bar_chart("Flood: receiving CPU per million packets (lower is better)", "ms", &bars))]
}
