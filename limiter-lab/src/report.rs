//! The benchmark report: each bench example prints one of these groups as a JSON
//! line, `cargo xtask bench` reads them back, adds the HTTP groups it measures itself,
//! and writes the whole [`Report`] to `target/bench/report.json`. One set of types on
//! both sides, so a renamed or missing field is a compile error, not an empty cell.

use serde::{Deserialize, Serialize};

/// A whole run of `cargo xtask bench`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// `full`, `quick` or `smoke`.
    pub run: String,
    pub environment: Environment,
    pub seconds: f64,
    pub xdp_cost: Outcome<XdpCost>,
    pub flood: Outcome<Flood>,
    /// The same flood from a random address per frame, as `hping3 --rand-source` sends.
    pub random_flood: Outcome<Flood>,
    pub http: Outcome<Http>,
    /// Absent from reports written before the group existed.
    #[serde(default = "not_run")]
    pub http2: Outcome<Http2>,
    pub algorithms: Outcome<Algorithms>,
    pub hmac: Outcome<Hmac>,
    pub memory: Outcome<Memory>,
    /// Absent from reports written before the group existed.
    #[serde(default = "not_run")]
    pub store: Outcome<Store>,
    pub targets: Vec<Target>,
    /// Every command the run started, in order, to reproduce it by hand.
    pub commands: Vec<String>,
    pub errors: Vec<String>,
}

fn not_run<T>() -> Outcome<T> {
    Outcome::Failed { error: "not run".to_owned() }
}

/// A group's figures, or why it has none: one failed group does not stop the others.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Outcome<T> {
    Measured(T),
    Failed { error: String },
}

impl<T> Outcome<T> {
    pub fn measured(&self) -> Option<&T> {
        match self {
            Self::Measured(value) => Some(value),
            Self::Failed { .. } => None,
        }
    }
}

/// The machine and tool versions, because absolute figures mean little without them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Environment {
    pub kernel: String,
    pub cpu: String,
    pub cores: usize,
    pub memory: Option<String>,
    pub loadavg_at_start: String,
    pub rustc: String,
    pub nginx: String,
    pub wrk: String,
    pub oha: String,
    /// Absent from reports written before the HTTP/2 group existed.
    #[serde(default)]
    pub h2load: String,
    pub nft: String,
    pub trafgen: String,
}

/// One target of issue 7: what it says, the figure measured, and whether it holds
/// (`None`: not measured in this run).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Target {
    pub target: String,
    pub goal: String,
    pub measured: String,
    pub met: Option<bool>,
}

/// `xdp_cost`: nanoseconds per packet from `BPF_PROG_TEST_RUN`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct XdpCost {
    pub repeat: u32,
    pub map_capacity: u32,
    pub xdp_pass_floor_ns: f64,
    pub known_source_ns: f64,
    pub new_source_full_map_ns: f64,
    pub known_source_10k_cidrs_ns: f64,
    pub known_source_vs_floor: f64,
    pub new_source_single_run_ns: f64,
    pub single_run_overhead_ns: f64,
    pub new_sources_measured: u32,
    /// An unknown source refused by an empty `[xdp.new_sources]` budget: a spoofed
    /// flood's path (it never touches the sources map).
    pub unknown_refused_by_budget_ns: f64,
    pub unknown_refused_vs_known: f64,
    pub known_source_with_budget_ns: f64,
    /// A known source also charged to its /24's aggregate.
    pub known_source_with_aggregate_ns: f64,
    /// A known source's packet to a port `[xdp.services]` does not serve: a DNS
    /// reflection's (UDP from port 53 to an ephemeral port) with all 16
    /// `udp_replies_from` networks checked; absent from reports written before.
    #[serde(default)]
    pub not_served_port_ns: Option<f64>,
    /// A known source whose burst is below the coarse clock's bound, so that its
    /// bucket reads the precise clock; absent from reports written before.
    #[serde(default)]
    pub known_source_precise_clock_ns: Option<f64>,
    /// A known source with a byte budget (`bytes_per_second`) beside its packet
    /// bucket; absent from reports written before.
    #[serde(default)]
    pub known_source_with_byte_budget_ns: Option<f64>,
    /// The program's own time per run as bpf_stats counts it (which the flood's
    /// column reports), absent from reports written before it was measured.
    #[serde(default)]
    pub bpf_stats: Option<XdpStatsCost>,
}

/// bpf_stats' ns per run in `BPF_PROG_TEST_RUN`: hot (one frame repeated in the
/// kernel) and cold (one run per call, cycling through sources, so a syscall's
/// worth of other work evicts the caches between runs, as the stack does on veth).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct XdpStatsCost {
    pub sources: u32,
    pub floor_hot_ns: f64,
    pub floor_cold_ns: f64,
    pub known_source_hot_ns: f64,
    pub known_source_cold_ns: f64,
}

/// `bench_flood`: one bounded flood per filter on a veth pair.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Flood {
    pub flood_packets: u64,
    pub spoofed_sources: u32,
    pub rate_per_source: u32,
    pub burst_per_source: u32,
    pub good_pps: u64,
    /// `[xdp.new_sources]` of the `limiter+budget` row, per second and burst.
    pub new_source_budget: u32,
    pub idle_softirq_seconds_per_second: f64,
    pub rows: Vec<FloodRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FloodRow {
    /// `none`, `xdp_drop` (drops every frame), `nftables`, `limiter`, `limiter
    /// (generic)` or `limiter+budget` (with `[xdp.new_sources]`).
    pub filter: String,
    pub flood_packets: u64,
    pub flood_seconds: f64,
    pub flood_packets_per_second: f64,
    pub receiver_softirq_seconds: f64,
    pub cpu0_system_seconds: f64,
    pub softirq_ms_per_million_packets: f64,
    pub dropped: u64,
    /// From bpf_stats; only with an XDP program attached.
    pub xdp_program_ns_per_packet: Option<f64>,
    pub good_sent: u64,
    pub good_received: u64,
    pub good_delivery: f64,
    /// The part of the flood that got through the filter.
    pub admitted_share: f64,
}

/// The HTTP group, which xtask measures itself with nginx, wrk and oha.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Http {
    pub load_tools: LoadTools,
    pub connections: u32,
    pub seconds: u32,
    /// Requests per second of every fixed-rate run.
    pub fixed_rate: u64,
    pub rows: Vec<HttpRow>,
    /// `limiter upgrade` under load; missing from reports made before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeRun>,
}

/// `limiter upgrade` while wrk loads the proxy with a new connection per request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UpgradeRun {
    /// From the command's start to the old agent's exit: the new one's start, the
    /// hand-over and the old one's drain.
    pub handover_ms: f64,
    /// From the command's start to its answer: the new agent serves.
    pub ready_ms: f64,
    /// What wrk sent over the whole run, and what failed (refused, reset, not 200).
    pub requests: u64,
    pub dropped: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadTools {
    pub closed_loop: String,
    pub fixed_rate: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HttpRow {
    pub scenario: String,
    pub url: String,
    pub closed_loop: ClosedLoop,
    /// Missing without oha, and for the signed route (oha cannot sign each request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_rate: Option<FixedRate>,
}

/// What the wrk `done()` hook prints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClosedLoop {
    pub rps: f64,
    pub requests: u64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

/// Taken from oha's JSON, whose fields may be missing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FixedRate {
    pub rate: u64,
    pub rps: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub status_200: Option<u64>,
    pub success_rate: Option<f64>,
}

/// The HTTP/2 group, which xtask measures itself with nginx and h2load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Http2 {
    pub load_tool: String,
    pub requests: u32,
    pub connections: u32,
    /// Streams each connection keeps open at once (`h2load -m`).
    pub streams: u32,
    pub rows: Vec<Http2Row>,
}

/// One h2load run, from its text summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Http2Row {
    pub scenario: String,
    pub url: String,
    /// As h2load negotiated it: `h2` (by ALPN) or `h2c`.
    pub protocol: String,
    /// The TLS version; `None` in the clear.
    pub tls: Option<String>,
    pub rps: f64,
    pub succeeded: u64,
    /// Requests without a 2xx or 3xx answer: 4xx, 5xx, and those that got none.
    pub failed: u64,
    pub status_2xx: u64,
    pub status_4xx: u64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

/// `bench_algorithms`: decisions per second of each algorithm and of governor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Algorithms {
    pub keys: usize,
    pub decisions_per_thread: usize,
    pub limit_per_second: u32,
    pub cores: usize,
    pub rows: Vec<AlgorithmRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AlgorithmRow {
    pub limiter: String,
    /// The algorithm's config name, or `governor` for the anchor.
    pub algorithm: String,
    pub threads: usize,
    pub decisions_per_second: f64,
    pub admitted_fraction: f64,
    /// Check and charge alone, single-threaded; not for governor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_decisions_per_second: Option<f64>,
}

/// `bench_hmac`: signed-request verification by body size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hmac {
    pub rows: Vec<HmacRow>,
    pub sha_ni: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HmacRow {
    pub body_bytes: usize,
    pub requests: usize,
    pub ns_per_request: f64,
    pub requests_per_second: f64,
    pub bytes_per_second: f64,
}

/// `bench_memory`: bytes per tracked key in the proxy and per source in the kernel.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Memory {
    pub proxy: Vec<ProxyMemory>,
    pub kernel: KernelMemory,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProxyMemory {
    pub algorithm: String,
    pub keys: usize,
    pub bytes_per_key: f64,
}

/// The sources map as bpftool shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelMemory {
    pub capacity: u32,
    pub map_type: String,
    pub key_bytes: u64,
    pub value_bytes: u64,
    pub bytes_memlock: f64,
    pub bytes_per_source: f64,
}

/// `bench_store`: decisions per second of the limits' stores, each through its own
/// client: memory in-process, one Redis, a Redis Cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Store {
    pub rows: Vec<StoreRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreRow {
    /// `memory`, `redis` or `redis cluster`.
    pub store: String,
    pub decisions: u64,
    /// Decisions in flight at once.
    pub concurrency: usize,
    pub decisions_per_second: f64,
    /// 99th percentile of one decision's time, in microseconds.
    pub p99_us: f64,
}
