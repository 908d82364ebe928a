//! The same bounded flood against no filter, an nftables per-source meter and
//! limiter, on a veth pair between two namespaces this program creates (and removes).
//!
//! - Flood: `trafgen` (netsniff-ng) in `lbench-tx`, pinned to CPU 0, sending COUNT
//!   UDP frames from SOURCES spoofed addresses (10.202.0.0/16, random within the
//!   set; SOURCES = 0: a random address per frame, as `hping3 --rand-source` does;
//!   `lbench-rx` has no route out, so nothing answers them) at a fixed offered rate (200 000 per second, or `LBENCH_FLOOD_PPS`),
//!   through `tx0` to `rx0` in `lbench-rx`. The packet count is `tx0`'s counter.
//! - Well-behaved flow: one UDP socket at 10.201.0.2 sending GOOD_PPS datagrams per
//!   second to a receiver at 10.201.0.1 for as long as the flood lasts.
//! - Filters on `rx0`, each with RATE packets per second per source, burst RATE:
//!   none; `xdp_drop`, an XDP program that drops every frame (the floor of any XDP
//!   filter here); nftables `meter` per source in a netdev ingress chain (the
//!   earliest hook nftables has); limiter's XDP program attached in native mode, then
//!   in generic mode; and limiter with a new-source budget (`[xdp.new_sources]`) of
//!   NEW_SOURCE_BUDGET per second, burst the same.
//! - Receiving side's cost: the softirq time in /proc/stat over the flood (on veth the
//!   receive path runs in softirq on the sending CPU), minus the idle softirq rate
//!   measured just before, per million flood packets.
//!
//! Usage: bench_flood [COUNT] [SOURCES] [RATE] [GOOD_PPS]   (needs root, trafgen, nft)
//! `admitted_share` is the part of the flood that got through the filter.
//! Prints one JSON object.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    num::NonZeroU32,
    path::PathBuf,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use aya::programs::{Xdp, XdpMode};
use limiter::{
    config::xdp::{AttachMode, Ipv6Prefix, MalformedAction, PacketLimit, SourceLimit, XdpConfig},
    xdp::{Floor, Kernel, LoadOptions, attach},
};
use limiter_lab::{
    netns::spawn_in_namespace,
    report::{Flood, FloodRow},
};

const RX_NS: &str = "lbench-rx";
const TX_NS: &str = "lbench-tx";
const RX_MAC: &str = "02:00:00:00:01:01";
const TX_MAC: &str = "02:00:00:00:01:02";
const GOOD_PORT: u16 = 9999;
/// The row of the XDP program that drops every frame.
const XDP_DROP: &str = "xdp_drop";
/// The row of limiter attached in generic (skb) mode.
const LIMITER_GENERIC: &str = "limiter (generic)";
/// The new-source budget of the `limiter+budget` row, per second and burst.
const NEW_SOURCE_BUDGET: u32 = 1_000;

fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

struct Lab;

impl Lab {
    fn new() -> anyhow::Result<Self> {
        Self::remove();
        let lab = Lab;
        run("ip", &["netns", "add", RX_NS])?;
        run("ip", &["netns", "add", TX_NS])?;
        run(
            "ip",
            &[
                "-n", TX_NS, "link", "add", "tx0", "address", TX_MAC, "type", "veth", "peer", "name", "rx0", "address",
                RX_MAC, "netns", RX_NS,
            ],
        )?;
        run("ip", &["-n", RX_NS, "addr", "add", "10.201.0.1/24", "dev", "rx0"])?;
        run("ip", &["-n", TX_NS, "addr", "add", "10.201.0.2/24", "dev", "tx0"])?;
        for ns in [RX_NS, TX_NS] {
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        run("ip", &["-n", RX_NS, "link", "set", "rx0", "up"])?;
        run("ip", &["-n", TX_NS, "link", "set", "tx0", "up"])?;
        // The well-behaved flow must not wait for ARP in the middle of a flood.
        run(
            "ip",
            &["-n", TX_NS, "neigh", "replace", "10.201.0.1", "lladdr", RX_MAC, "dev", "tx0", "nud", "permanent"],
        )?;
        run(
            "ip",
            &["-n", RX_NS, "neigh", "replace", "10.201.0.2", "lladdr", TX_MAC, "dev", "rx0", "nud", "permanent"],
        )?;
        Ok(lab)
    }

    fn remove() {
        for ns in [RX_NS, TX_NS] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        Self::remove();
    }
}

/// (softirq, system) time of CPU `cpu` in seconds.
fn cpu_times(cpu: usize) -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().find(|l| l.starts_with(&format!("cpu{cpu} "))).context("no cpu line")?;
    let fields: Vec<f64> = line.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0.0)).collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((fields.get(6).copied().unwrap_or(0.0) / hz, fields.get(2).copied().unwrap_or(0.0) / hz))
}

fn trafgen_config(sources: u32) -> String {
    // Sources 10.202.H.L: L random, H counts through sources/256 blocks; or all
    // four bytes random.
    let blocks = sources.div_ceil(256).max(1) - 1;
    let source = if sources == 0 { "drnd(4)".to_owned() } else { format!("10, 202, dinc(0, {blocks}), drnd()") };
    let mac = |m: &str| m.split(':').map(|b| format!("0x{b}")).collect::<Vec<_>>().join(", ");
    format!(
        "{{\n  {dst}, {src}, c16(0x0800),\n  0x45, 0x00, c16(46), drnd(2), c16(0), 64, 17, csumip(14, 33),\n  \
         {source},\n  10, 201, 0, 1,\n  c16(40000), c16(9), c16(26), c16(0),\n  \
         fill(0x41, 18)\n}}\n",
        dst = mac(RX_MAC),
        src = mac(TX_MAC),
    )
}

/// Frames `tx0` has sent: what reached `rx0`, retries included.
fn tx_packets() -> anyhow::Result<u64> {
    let out = run("ip", &["-n", TX_NS, "-s", "-j", "link", "show", "tx0"])?;
    let value: serde_json::Value = serde_json::from_str(&out)?;
    value[0]["stats64"]["tx"]["packets"].as_u64().context("no tx counter on tx0")
}

struct Outcome {
    packets: u64,
    flood_seconds: f64,
    softirq_seconds: f64,
    system_seconds: f64,
    good_sent: u64,
    good_received: u64,
}

fn flood(count: u64, sources: u32, good_pps: u64, idle_softirq_per_second: f64) -> anyhow::Result<Outcome> {
    let config = std::env::temp_dir().join(format!("lbench-trafgen-{}.cfg", std::process::id()));
    std::fs::write(&config, trafgen_config(sources))?;
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let receiver = spawn_in_namespace(RX_NS, {
        let (received, stop, ready) = (received.clone(), stop.clone(), ready.clone());
        move || -> anyhow::Result<()> {
            let socket = UdpSocket::bind((Ipv4Addr::new(10, 201, 0, 1), GOOD_PORT))?;
            socket.set_read_timeout(Some(Duration::from_millis(50)))?;
            ready.store(true, Ordering::SeqCst);
            let mut buffer = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from(&mut buffer)
                    && from.ip() == Ipv4Addr::new(10, 201, 0, 2)
                {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }
    });
    while !ready.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let flooding = Arc::new(AtomicBool::new(true));
    let sender = spawn_in_namespace(TX_NS, {
        let flooding = flooding.clone();
        move || -> anyhow::Result<u64> {
            let socket = UdpSocket::bind((Ipv4Addr::new(10, 201, 0, 2), 0))?;
            let to = SocketAddr::from((Ipv4Addr::new(10, 201, 0, 1), GOOD_PORT));
            let started = Instant::now();
            let mut sent = 0u64;
            while flooding.load(Ordering::Relaxed) {
                let due = started + Duration::from_secs_f64(sent as f64 / good_pps as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                socket.send_to(&sent.to_be_bytes(), to)?;
                sent += 1;
            }
            Ok(sent)
        }
    });
    let (softirq0, system0) = cpu_times(0)?;
    let sent0 = tx_packets()?;
    let started = Instant::now();
    let count_arg = count.to_string();
    let rate_arg = format!("{}pps", std::env::var("LBENCH_FLOOD_PPS").unwrap_or_else(|_| "200000".into()));
    let config_arg = config.display().to_string();
    // trafgen gives up when veth pushes back (EAGAIN on the ring flush); a failed
    // attempt is retried from the start, up to three times, and its time counted.
    let mut status = None;
    for _ in 0..3 {
        let attempt = Command::new("timeout")
            .args(["120", "ip", "netns", "exec", TX_NS, "taskset", "-c", "0", "trafgen", "--dev", "tx0", "--conf"])
            .arg(&config_arg)
            .args([
                "--num",
                &count_arg,
                "--cpus",
                "1",
                "--notouch-irq",
                "--no-cpu-stats",
                "--qdisc-path",
                "--rate",
                &rate_arg,
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .context("cannot run trafgen (apt-get install netsniff-ng)")?;
        status = Some(attempt);
        if attempt.success() {
            break;
        }
    }
    let status = status.context("trafgen did not run")?;
    let flood_seconds = started.elapsed().as_secs_f64();
    let (softirq1, system1) = cpu_times(0)?;
    let packets = tx_packets()? - sent0;
    flooding.store(false, Ordering::Relaxed);
    let good_sent = sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))???;
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))???;
    let _ = std::fs::remove_file(&config);
    ensure!(status.success(), "trafgen failed: {status}");
    Ok(Outcome {
        packets,
        flood_seconds,
        softirq_seconds: (softirq1 - softirq0 - idle_softirq_per_second * flood_seconds).max(0.0),
        system_seconds: system1 - system0,
        good_sent,
        good_received: received.load(Ordering::Relaxed),
    })
}

fn rx_counters_drops() -> u64 {
    // Packets nftables dropped: the rule's counter.
    let Ok(out) = run("ip", &["netns", "exec", RX_NS, "nft", "-j", "list", "chain", "netdev", "lbench", "ingress"])
    else {
        return 0;
    };
    let value: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    value["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["rule"]["expr"].as_array())
        .flatten()
        .filter_map(|expr| expr["counter"]["packets"].as_u64())
        .sum()
}

/// The program a row attached: the floor's or limiter's.
fn attached_program<'k>(kernel: &'k mut Kernel, filter: &str) -> anyhow::Result<&'k Xdp> {
    Ok(if filter == XDP_DROP { kernel.floor(Floor::Drop)? } else { kernel.program()? })
}

fn nft_ruleset(rate: u32) -> String {
    format!(
        "table netdev lbench {{\n  chain ingress {{\n    type filter hook ingress device \"rx0\" priority -500; policy accept;\n    \
         meter per_source size 65535 {{ ip saddr limit rate over {rate}/second burst {rate} packets }} counter drop\n  }}\n}}\n"
    )
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().map_or(Ok(2_000_000), |a| a.parse())?;
    let sources: u32 = args.next().map_or(Ok(256), |a| a.parse())?;
    let rate: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let good_pps: u64 = args.next().map_or(Ok(50), |a| a.parse())?;
    let nonzero = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);

    // Background softirq on CPU 0 (timers, RCU, other tenants), subtracted below.
    let (s0, _) = cpu_times(0)?;
    std::thread::sleep(Duration::from_secs(1));
    let (s1, _) = cpu_times(0)?;
    let idle = s1 - s0;

    let mut rows = Vec::new();
    for filter in ["none", XDP_DROP, "nftables", "limiter", LIMITER_GENERIC, "limiter+budget"] {
        let _lab = Lab::new()?;
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/limiter-bench-flood-{}", std::process::id()));
        let mut link = None;
        let mut kernel = None;
        match filter {
            "none" => {}
            "nftables" => {
                let file = std::env::temp_dir().join(format!("lbench-{}.nft", std::process::id()));
                std::fs::write(&file, nft_ruleset(rate))?;
                run("ip", &["netns", "exec", RX_NS, "nft", "-f", &file.display().to_string()])?;
                let _ = std::fs::remove_file(file);
            }
            XDP_DROP => {
                let pin_dir = pin_dir.clone();
                let attached = spawn_in_namespace(RX_NS, move || -> anyhow::Result<_> {
                    let mut loaded = Kernel::load(&LoadOptions::with_sources(pin_dir, 65_536))?;
                    // Owned by the program: detached when `loaded` is dropped.
                    loaded.floor(Floor::Drop)?.attach("rx0", XdpMode::Driver)?;
                    Ok(loaded)
                });
                kernel = Some(attached.join().map_err(|_| anyhow::anyhow!("attach panicked"))???);
            }
            _ => {
                let budget =
                    PacketLimit { packets_per_second: nonzero(NEW_SOURCE_BUDGET), burst: nonzero(NEW_SOURCE_BUDGET) };
                let mode = if filter == LIMITER_GENERIC { AttachMode::Generic } else { AttachMode::Native };
                let config = XdpConfig {
                    interfaces: vec!["rx0".to_owned()],
                    mode,
                    enforce: true,
                    max_sources: nonzero(65_536),
                    ipv6_prefix: Ipv6Prefix(64),
                    malformed: MalformedAction::Pass,
                    limit: SourceLimit {
                        packets: PacketLimit { packets_per_second: nonzero(rate), burst: nonzero(rate) },
                        bytes: None,
                    },
                    cidr: Vec::new(),
                    port: Vec::new(),
                    new_sources: (filter == "limiter+budget").then_some(budget),
                    aggregate: Default::default(),
                    verified: Default::default(),
                    syn: None,
                    services: None,
                };
                let attached = spawn_in_namespace(RX_NS, {
                    let pin_dir = pin_dir.clone();
                    move || -> anyhow::Result<_> {
                        let mut loaded = Kernel::load(&LoadOptions::with_sources(pin_dir, 65_536))?;
                        loaded.maps_mut().apply(&config, None)?;
                        let (attachment, link) = attach(&mut loaded, "rx0", mode)?;
                        Ok((loaded, attachment, link))
                    }
                })
                .join()
                .map_err(|_| anyhow::anyhow!("attach panicked"))???;
                kernel = Some(attached.0);
                link = Some(attached.2);
            }
        }
        let outcome = flood(count, sources, good_pps, idle);
        let dropped = match filter {
            "none" => 0,
            "nftables" => rx_counters_drops(),
            // Every frame, the well-behaved flow's too.
            XDP_DROP => outcome.as_ref().map_or(0, |o| o.packets),
            _ => kernel.as_ref().and_then(|k| k.maps().counter_snapshot().ok()).map_or(0, |c| {
                use limiter_common::counters::Counter;
                c.get(Counter::DroppedRateLimit) + c.get(Counter::DroppedNewSource) + c.get(Counter::DroppedAggregate)
            }),
        };
        // The program's own share, from bpf_stats over a second, shorter flood (the
        // stats cost two clock reads per packet, so they stay off for the first).
        let mut program_ns = None;
        if let Some(loaded) = &mut kernel {
            let previous = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_else(|_| "0".into());
            std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
            let before = attached_program(loaded, filter)?.info()?;
            let second = flood((count / 4).max(1000), sources, good_pps, idle);
            let after = attached_program(loaded, filter)?.info()?;
            std::fs::write("/proc/sys/kernel/bpf_stats_enabled", previous.trim())?;
            second?;
            let runs = after.run_count().saturating_sub(before.run_count());
            let time = after.run_time().saturating_sub(before.run_time());
            program_ns = (runs > 0).then(|| time.as_nanos() as f64 / runs as f64);
        }
        let kernel_loaded = kernel.is_some();
        drop(link);
        drop(kernel);
        if kernel_loaded {
            limiter::xdp::detach_all(&pin_dir)?;
        }
        let outcome = outcome?;
        rows.push(FloodRow {
            filter: filter.to_owned(),
            flood_packets: outcome.packets,
            flood_seconds: outcome.flood_seconds,
            flood_packets_per_second: outcome.packets as f64 / outcome.flood_seconds,
            receiver_softirq_seconds: outcome.softirq_seconds,
            cpu0_system_seconds: outcome.system_seconds,
            softirq_ms_per_million_packets: outcome.softirq_seconds * 1e3 / (outcome.packets.max(1) as f64 / 1e6),
            dropped,
            admitted_share: outcome.packets.saturating_sub(dropped) as f64 / outcome.packets.max(1) as f64,
            xdp_program_ns_per_packet: program_ns,
            good_sent: outcome.good_sent,
            good_received: outcome.good_received,
            good_delivery: outcome.good_received as f64 / outcome.good_sent.max(1) as f64,
        });
    }
    let report = Flood {
        flood_packets: count,
        spoofed_sources: sources,
        rate_per_source: rate,
        burst_per_source: rate,
        good_pps,
        new_source_budget: NEW_SOURCE_BUDGET,
        idle_softirq_seconds_per_second: idle,
        rows,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
