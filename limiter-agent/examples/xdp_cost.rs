//! Cost per packet of the XDP program, from BPF_PROG_TEST_RUN: the do-nothing floor,
//! a known source, a new source with the sources map full, an unknown source refused
//! by an empty new-source budget (`[xdp.new_sources]`), a known source charged to its
//! /24's aggregate too, a known source's packet to a port `[xdp.services]` does not
//! serve, and a known source with 10 000 CIDR rules; and the floor and
//! a known source as bpf_stats counts them, hot and cold. Prints one JSON object;
//! `cargo xtask bench` runs it.
//!
//! Usage: xdp_cost [REPEAT] [NEW_SOURCES]   (needs root)

use std::{
    net::Ipv4Addr,
    num::{NonZeroU32, NonZeroU64},
    path::PathBuf,
};

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use limiter::{
    config::xdp::{
        AttachMode, ByteLimit, CidrAction, CidrRule, Ipv6Prefix, MalformedAction, PacketLimit, Port, ReplySource,
        ServicesConfig, SourceLimit, Verdict, XdpConfig,
    },
    xdp::{Floor, Kernel, LoadOptions, ephemeral_ports},
};
use limiter_common::bucket::MAX_BYTES_PER_SECOND;
use limiter_lab::{
    report::{XdpCost, XdpStatsCost},
    support::frames::{udp4 as frame, udp4_to},
};

/// Sources the cold bpf_stats case cycles through, as many as the flood bench's.
const COLD_SOURCES: u32 = 256;

/// bpf_stats' mean nanoseconds per run of `program` over what `runs` does.
fn stats_cost(program: &Xdp, runs: impl FnOnce()) -> anyhow::Result<f64> {
    let before = program.info()?;
    runs();
    let after = program.info()?;
    let count = after.run_count().saturating_sub(before.run_count()).max(1);
    Ok(after.run_time().saturating_sub(before.run_time()).as_nanos() as f64 / count as f64)
}

/// The program's time per run as bpf_stats counts it, hot and cold (see
/// `XdpStatsCost`); the sources are known when it starts.
fn bpf_stats(kernel: &mut Kernel, known: &[u8], sources: &[Vec<u8>], repeat: u32) -> anyhow::Result<XdpStatsCost> {
    // Enabled while the fd lives, whatever the sysctl says.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
    let cold = |program: &Xdp| {
        for frame in sources.iter().cycle().take(sources.len() * 40) {
            cost(program, frame, 1);
        }
    };
    let floor: &Xdp = kernel.floor(Floor::Pass)?;
    let floor_hot_ns = stats_cost(floor, || {
        cost(floor, known, repeat);
    })?;
    let floor_cold_ns = stats_cost(floor, || cold(floor))?;
    let program = kernel.program()?;
    Ok(XdpStatsCost {
        sources: COLD_SOURCES,
        floor_hot_ns,
        floor_cold_ns,
        known_source_hot_ns: stats_cost(program, || {
            cost(program, known, repeat);
        })?,
        known_source_cold_ns: stats_cost(program, || cold(program))?,
    })
}

/// Mean nanoseconds per run over `repeat` in-kernel repetitions.
fn cost(program: &Xdp, data: &[u8], repeat: u32) -> f64 {
    let options = TestRunOptions { data_in: Some(data), repeat, ..TestRunOptions::default() };
    let result = program.test_run(options).expect("test run");
    result.duration.as_nanos() as f64
}

/// A DNS reflection's packet from the known source under `[xdp.services]` (UDP from
/// port 53 to an ephemeral port), the costliest drop of the policy: the port is
/// looked up, then every one of the 16 `udp_replies_from` networks checked.
fn not_served_port(kernel: &mut Kernel, config: &mut XdpConfig, repeat: u32) -> anyhow::Result<f64> {
    let reply_sources = (0..16u32).map(|i| {
        let network = ipnet::IpNet::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)).into(), 24).unwrap_or_default();
        ReplySource(network)
    });
    let port = |port: u16| std::num::NonZeroU16::new(port).map(Port);
    config.services = Some(ServicesConfig {
        tcp: port(443).into_iter().collect(),
        udp: port(443).into_iter().collect(),
        icmp: Verdict::Pass,
        other: Verdict::Drop,
        udp_replies_from: reply_sources.collect(),
    });
    kernel.maps_mut().apply(config, None)?;
    let reflection = udp4_to(Ipv4Addr::new(192, 0, 2, 7), 53, ephemeral_ports()[0]);
    let ns = cost(kernel.program()?, &reflection, repeat);
    config.services = None;
    kernel.maps_mut().apply(config, None)?;
    Ok(ns)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let repeat: u32 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let capacity: u32 = args.next().map_or(Ok(65_536), |a| a.parse())?;
    let nonzero = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
    let mut config = XdpConfig {
        interfaces: Vec::new(),
        mode: AttachMode::Auto,
        enforce: true,
        max_sources: nonzero(capacity),
        ipv6_prefix: Ipv6Prefix(64),
        malformed: MalformedAction::Pass,
        limit: SourceLimit {
            packets: PacketLimit { packets_per_second: nonzero(1_000_000_000), burst: nonzero(u32::MAX) },
            bytes: None,
        },
        cidr: Vec::new(),
        port: Vec::new(),
        new_sources: None,
        aggregate: Default::default(),
        verified: Default::default(),
        syn: None,
        services: None,
    };
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/limiter-bench-{}", std::process::id()));
    let mut kernel = Kernel::load(&LoadOptions::with_sources(pin_dir.clone(), capacity))?;
    kernel.maps_mut().apply(&config, None)?;
    let known = frame(Ipv4Addr::new(192, 0, 2, 7));

    let floor = cost(kernel.floor(Floor::Pass)?, &known, repeat);
    let known_source = {
        let program = kernel.program()?;
        cost(program, &known, 1);
        cost(program, &known, repeat)
    };
    // The same source under a burst of 10 ms of refill, below the coarse clock's
    // bound (100 ticks), so its bucket reads the precise clock.
    config.limit.packets.burst = nonzero(10_000_000);
    kernel.maps_mut().apply(&config, None)?;
    let known_source_precise_clock = cost(kernel.program()?, &known, repeat);
    config.limit.packets.burst = nonzero(u32::MAX);
    // The same source with a byte budget it never exhausts: the frame's length, the
    // second bucket's compare-and-swap.
    config.limit.bytes = Some(ByteLimit {
        bytes_per_second: NonZeroU64::new(MAX_BYTES_PER_SECOND).unwrap_or(NonZeroU64::MIN),
        byte_burst: NonZeroU64::new(u64::MAX).unwrap_or(NonZeroU64::MIN),
    });
    kernel.maps_mut().apply(&config, None)?;
    let known_source_with_byte_budget = cost(kernel.program()?, &known, repeat);
    config.limit.bytes = None;
    kernel.maps_mut().apply(&config, None)?;
    let not_served_port = not_served_port(&mut kernel, &mut config, repeat)?;
    let sources: Vec<Vec<u8>> = (0..COLD_SOURCES).map(|i| frame(Ipv4Addr::from(0xc633_6400 + i))).collect();
    for source in &sources {
        cost(kernel.program()?, source, 1);
    }
    let bpf_stats = bpf_stats(&mut kernel, &known, &sources, repeat)?;

    // Fill the sources map, then measure sources it has never seen: each run
    // inserts into a full LRU, evicting the oldest.
    for i in 0..capacity {
        cost(kernel.program()?, &frame(Ipv4Addr::from(0x0a00_0000 + i)), 1);
    }
    // A one-run call carries a fixed cost that a long repeat spreads out (timer and
    // context set-up): measured the same way with the floor program, and taken out.
    let fresh = capacity.min(100_000);
    let mut total = 0.0;
    let mut floor_single = 0.0;
    for i in 0..fresh {
        total += cost(kernel.program()?, &frame(Ipv4Addr::from(0x6400_0000 + i)), 1);
        floor_single += cost(kernel.floor(Floor::Pass)?, &known, 1);
    }
    let new_source_single_run = total / f64::from(fresh);
    let single_run_overhead = floor_single / f64::from(fresh) - floor;
    let new_source_full_map = new_source_single_run - single_run_overhead;

    // A spoofed flood under the budget: an unknown source refused without touching
    // the sources map stays unknown, so one frame repeated measures that path.
    config.new_sources = Some(PacketLimit { packets_per_second: nonzero(1), burst: nonzero(1) });
    kernel.maps_mut().apply(&config, None)?;
    let unknown = frame(Ipv4Addr::new(203, 0, 113, 9));
    cost(kernel.program()?, &frame(Ipv4Addr::new(203, 0, 113, 10)), 1);
    let unknown_refused_by_budget = cost(kernel.program()?, &unknown, repeat);
    let known_source_with_budget = cost(kernel.program()?, &known, repeat);
    config.aggregate.limit = Some(config.limit.packets);
    kernel.maps_mut().apply(&config, None)?;
    let known_source_with_aggregate = cost(kernel.program()?, &known, repeat);
    config.new_sources = None;
    config.aggregate.limit = None;

    config.cidr = (0..10_000u32)
        .map(|i| CidrRule {
            cidr: ipnet::IpNet::new(Ipv4Addr::from(0xac00_0000 + (i << 8)).into(), 24).unwrap_or_default(),
            action: CidrAction::Limit(SourceLimit {
                packets: PacketLimit { packets_per_second: nonzero(1_000_000), burst: nonzero(1_000_000) },
                bytes: None,
            }),
            aggregate: None,
        })
        .collect();
    kernel.maps_mut().apply(&config, None)?;
    let with_cidrs = cost(kernel.program()?, &known, repeat);
    drop(kernel);
    limiter::xdp::detach_all(&pin_dir)?;

    let report = XdpCost {
        repeat,
        map_capacity: capacity,
        xdp_pass_floor_ns: floor,
        known_source_ns: known_source,
        new_source_full_map_ns: new_source_full_map,
        known_source_10k_cidrs_ns: with_cidrs,
        known_source_vs_floor: known_source / floor,
        new_source_single_run_ns: new_source_single_run,
        single_run_overhead_ns: single_run_overhead,
        new_sources_measured: fresh,
        unknown_refused_by_budget_ns: unknown_refused_by_budget,
        unknown_refused_vs_known: unknown_refused_by_budget / known_source,
        known_source_with_budget_ns: known_source_with_budget,
        known_source_with_aggregate_ns: known_source_with_aggregate,
        known_source_precise_clock_ns: Some(known_source_precise_clock),
        not_served_port_ns: Some(not_served_port),
        known_source_with_byte_budget_ns: Some(known_source_with_byte_budget),
        bpf_stats: Some(bpf_stats),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
