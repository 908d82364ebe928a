//! `cargo xtask bench [--quick]`: limiter side by side with what users would pick
//! instead, measured in one run on one machine (issue 7).
//!
//! The measurements are example programs of limiter-agent that print one JSON object
//! each (`xdp_cost`, `bench_flood`, `bench_algorithms`, `bench_hmac`, `bench_memory`);
//! the HTTP group is driven from here with nginx, wrk and oha. Everything lands in
//! `target/bench/`: `report.json`, `report.md`, and one SVG bar chart per group. Every
//! figure is reported with its anchor from the same run (the XDP_PASS floor, nftables,
//! nginx, governor), because absolute times on shared machines drift between runs.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::util::{cmd, find_program, run as run_cmd, show, target_dir};

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// A run of about two minutes: fewer repetitions, shorter loads.
    #[arg(long)]
    pub quick: bool,
}

/// How much of everything a run does.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub name: &'static str,
    pub xdp_repeat: u32,
    pub xdp_capacity: u32,
    pub flood_packets: u64,
    pub flood_sources: u32,
    pub algorithm_decisions: u64,
    pub algorithm_keys: u64,
    pub hmac_bytes: u64,
    pub memory_keys: u64,
    pub memory_sources: u32,
    pub http_seconds: u32,
    pub http_connections: u32,
    /// Signed requests pre-made for the signed route (each is used once).
    pub signed_requests: u32,
}

impl Sizes {
    pub const FULL: Sizes = Sizes {
        name: "full",
        xdp_repeat: 1_000_000,
        xdp_capacity: 65_536,
        flood_packets: 2_000_000,
        flood_sources: 256,
        algorithm_decisions: 2_000_000,
        algorithm_keys: 10_000,
        hmac_bytes: 256 << 20,
        memory_keys: 100_000,
        memory_sources: 1_000_000,
        http_seconds: 10,
        http_connections: 32,
        signed_requests: 400_000,
    };
    pub const QUICK: Sizes = Sizes {
        name: "quick",
        xdp_repeat: 200_000,
        xdp_capacity: 16_384,
        flood_packets: 400_000,
        flood_sources: 256,
        algorithm_decisions: 400_000,
        algorithm_keys: 10_000,
        hmac_bytes: 32 << 20,
        memory_keys: 20_000,
        memory_sources: 100_000,
        http_seconds: 3,
        http_connections: 32,
        signed_requests: 150_000,
    };
    /// For the smoke test: every code path, tiny counts.
    #[cfg_attr(not(test), expect(dead_code, reason = "used by the smoke test"))]
    pub const SMOKE: Sizes = Sizes {
        name: "smoke",
        xdp_repeat: 1_000,
        xdp_capacity: 256,
        flood_packets: 2_000,
        flood_sources: 16,
        algorithm_decisions: 2_000,
        algorithm_keys: 100,
        hmac_bytes: 1 << 20,
        memory_keys: 100,
        memory_sources: 1_024,
        http_seconds: 1,
        http_connections: 4,
        signed_requests: 2_000,
    };
}

pub fn run(opts: &Opts) -> Result<()> {
    let mut build = cmd("cargo");
    build.args(["build", "--release", "-p", "limiter-agent", "--bins", "--examples"]);
    run_cmd(&mut build)?;
    if find_program("oha").is_none() {
        // The fixed-rate load tool (it corrects for coordinated omission); without it
        // the fixed-rate columns stay empty rather than the bench failing.
        let mut install = cmd("cargo");
        install.args(["install", "oha", "--locked"]);
        if let Err(e) = run_cmd(&mut install) {
            eprintln!("warning: {e:#}; fixed-rate latencies will be missing");
        }
    }
    let sizes = if opts.quick { Sizes::QUICK } else { Sizes::FULL };
    let report = Bench::new(sizes, target_dir().join("release"), target_dir().join("bench")).run()?;
    println!("{}", summary_table(&report));
    println!("report: {}", target_dir().join("bench/report.md").display());
    Ok(())
}

/// One run of the harness: where the binaries are, where the report goes, and the
/// commands it ran.
pub struct Bench {
    sizes: Sizes,
    bin_dir: PathBuf,
    out: PathBuf,
    commands: Vec<String>,
    errors: Vec<String>,
}

impl Bench {
    pub fn new(sizes: Sizes, bin_dir: PathBuf, out: PathBuf) -> Self {
        Self { sizes, bin_dir, out, commands: Vec::new(), errors: Vec::new() }
    }

    /// Runs every group, writes the report files and returns the report.
    pub fn run(mut self) -> Result<Value> {
        fs::create_dir_all(&self.out).with_context(|| format!("cannot create {}", self.out.display()))?;
        let s = self.sizes;
        let started = Instant::now();
        let xdp = self.example("xdp_cost", &[s.xdp_repeat.to_string(), s.xdp_capacity.to_string()]);
        let flood = self.example(
            "bench_flood",
            &[s.flood_packets.to_string(), s.flood_sources.to_string(), "100".into(), "50".into()],
        );
        let http = self.group("http", Self::http);
        let algorithms =
            self.example("bench_algorithms", &[s.algorithm_decisions.to_string(), s.algorithm_keys.to_string()]);
        let hmac = self.example("bench_hmac", &[s.hmac_bytes.to_string()]);
        let memory = self.example("bench_memory", &[s.memory_keys.to_string(), s.memory_sources.to_string()]);
        let mut report = json!({
            "run": self.sizes.name,
            "environment": environment(),
            "seconds": started.elapsed().as_secs_f64(),
            "xdp_cost": xdp,
            "flood": flood,
            "http": http,
            "algorithms": algorithms,
            "hmac": hmac,
            "memory": memory,
        });
        report["targets"] = targets(&report);
        report["commands"] = json!(self.commands);
        report["errors"] = json!(self.errors);
        fs::write(self.out.join("report.json"), serde_json::to_string_pretty(&report)?)?;
        for (name, svg) in charts(&report) {
            fs::write(self.out.join(format!("{name}.svg")), svg)?;
        }
        fs::write(self.out.join("report.md"), markdown(&report))?;
        Ok(report)
    }

    fn record(&mut self, c: &Command) {
        let line = show(c);
        println!("{line}");
        self.commands.push(line.trim_start_matches("$ ").to_owned());
    }

    /// A group that failed is reported as `{"error": ...}`; the others still run.
    fn group(&mut self, name: &str, f: fn(&mut Self) -> Result<Value>) -> Value {
        match f(self) {
            Ok(value) => value,
            Err(e) => {
                let message = format!("{name}: {e:#}");
                eprintln!("bench group failed: {message}");
                self.errors.push(message.clone());
                json!({ "error": message })
            }
        }
    }

    fn example(&mut self, name: &str, args: &[String]) -> Value {
        let path = self.bin_dir.join("examples").join(name);
        let mut c = cmd(&path);
        c.args(args).env("RUST_BACKTRACE", "0").stderr(Stdio::inherit());
        self.record(&c);
        let result = (|| -> Result<Value> {
            let out = c.output().with_context(|| format!("cannot run {}", path.display()))?;
            if !out.status.success() {
                bail!("{name} exited with {}", out.status);
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().rev().find(|l| l.starts_with('{')).context("no JSON on stdout")?;
            Ok(serde_json::from_str(line)?)
        })();
        match result {
            Ok(value) => value,
            Err(e) => {
                let message = format!("{name}: {e:#}");
                eprintln!("bench group failed: {message}");
                self.errors.push(message.clone());
                json!({ "error": message })
            }
        }
    }

    fn http(&mut self) -> Result<Value> {
        let dir = self.out.join("http");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let nginx = find_program("nginx").context("nginx not found (cargo xtask setup)")?;
        let wrk = find_program("wrk").context("wrk not found (cargo xtask setup)")?;
        let oha = find_program("oha");
        let limiter = self.bin_dir.join("limiter");

        let upstream_port = free_port()?;
        let mut servers = Vec::new();
        servers.push(Server::nginx(self, &nginx, &dir, "upstream", &upstream_conf(upstream_port), upstream_port)?);
        let secret = dir.join("bench-key.secret");
        fs::write(&secret, SECRET)?;
        let mut scenarios: Vec<(&str, u16, &str)> = vec![("upstream direct", upstream_port, "/")];
        let mut start_limiter = |bench: &mut Self, name: &'static str, proxy: &str, path: &'static str| -> Result<()> {
            let port = free_port()?;
            let conf = limiter_conf(&dir, name, port, upstream_port, proxy, &secret);
            servers.push(Server::limiter(bench, &limiter, &dir, name, &conf, port)?);
            scenarios.push((name, port, path));
            Ok(())
        };
        start_limiter(self, "limiter, no rules", "", "/")?;
        start_limiter(self, "limiter, per-IP + per-key + plan", LIMITER_RULES, "/")?;
        start_limiter(self, "limiter, signed route", LIMITER_SIGNED, "/signed")?;
        let nginx_port = free_port()?;
        servers.push(Server::nginx(
            self,
            &nginx,
            &dir,
            "nginx-limit-req",
            &nginx_limit_req_conf(nginx_port, upstream_port),
            nginx_port,
        )?);
        scenarios.push(("nginx limit_req", nginx_port, "/"));

        let latency_lua = dir.join("latency.lua");
        fs::write(&latency_lua, WRK_DONE)?;
        let signed_lua = dir.join("signed.lua");
        let mut c = cmd(self.bin_dir.join("examples/bench_hmac"));
        c.arg("--wrk-script")
            .arg(self.sizes.signed_requests.to_string())
            .args([KEY_ID, SECRET, "/signed"])
            .arg(&signed_lua);
        self.record(&c);
        let status = c.status()?;
        if !status.success() {
            bail!("bench_hmac --wrk-script failed: {status}");
        }
        let mut script = fs::read_to_string(&signed_lua)?;
        script += WRK_DONE;
        fs::write(&signed_lua, script)?;

        let seconds = self.sizes.http_seconds.to_string();
        let connections = self.sizes.http_connections.to_string();
        let mut rows = Vec::new();
        for &(name, port, path) in &scenarios {
            let url = format!("http://127.0.0.1:{port}{path}");
            let script = if path == "/signed" { &signed_lua } else { &latency_lua };
            let mut c = cmd(&wrk);
            c.args(["-t1", "-c", &connections, "-d", &format!("{seconds}s"), "-s"]).arg(script).args([
                "-H",
                &format!("X-API-Key: {KEY_ID}"),
                &url,
            ]);
            self.record(&c);
            let out = c.output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with("{\"rps\""))
                .with_context(|| format!("wrk gave no summary for {name}: {text}"))?;
            let closed: Value = serde_json::from_str(line)?;
            rows.push(json!({"scenario": name, "url": url, "closed_loop": closed}));
        }
        // One fixed rate for every scenario: half the slowest closed-loop maximum, so
        // every server is below saturation and latencies compare like with like.
        let slowest = rows.iter().filter_map(|r| r["closed_loop"]["rps"].as_f64()).fold(f64::INFINITY, f64::min);
        let rate = ((slowest * 0.5 / 100.0).floor() * 100.0).max(100.0) as u64;
        if let Some(oha) = oha {
            for (row, &(name, _port, path)) in rows.iter_mut().zip(&scenarios) {
                if path == "/signed" {
                    // oha cannot sign each request; the signed route is closed-loop only.
                    continue;
                }
                let url = row["url"].as_str().unwrap_or_default().to_owned();
                let mut c = cmd(&oha);
                c.args([
                    "-z",
                    &format!("{seconds}s"),
                    "-q",
                    &rate.to_string(),
                    "-c",
                    &connections,
                    "--latency-correction",
                    "--no-tui",
                    "--output-format",
                    "json",
                ])
                .args(["-H", &format!("X-API-Key: {KEY_ID}"), &url]);
                self.record(&c);
                let out = c.output()?;
                let parsed: Value =
                    serde_json::from_slice(&out.stdout).with_context(|| format!("oha output for {name}"))?;
                let p = &parsed["latencyPercentiles"];
                let ms = |v: &Value| v.as_f64().map(|s| s * 1e3);
                let codes = &parsed["statusCodeDistribution"];
                row["fixed_rate"] = json!({
                    "rate": rate,
                    "rps": parsed["summary"]["requestsPerSec"],
                    "p50_ms": ms(&p["p50"]),
                    "p99_ms": ms(&p["p99"]),
                    "p999_ms": ms(&p["p99.9"]),
                    "status_200": codes["200"],
                    "success_rate": parsed["summary"]["successRate"],
                });
            }
        }
        drop(servers);
        Ok(json!({
            "load_tools": {
                "closed_loop": "wrk -t1 (a done() hook prints p50/p99/p99.9; the signed route uses a request() hook cycling pre-signed requests)",
                "fixed_rate": if find_program("oha").is_some() { "oha -q RATE --latency-correction (corrects coordinated omission)" } else { "oha missing: not measured" },
            },
            "connections": self.sizes.http_connections,
            "seconds": self.sizes.http_seconds,
            "fixed_rate": rate,
            "rows": rows,
        }))
    }
}

const KEY_ID: &str = "bench-key";
const SECRET: &str = "bench-secret-0123456789abcdef";

/// Limits far above the load, so that every request is decided and forwarded: the
/// bench measures what deciding costs, not how cheap a 429 is.
const LIMITER_RULES: &str = r#"
[proxy.plans.bench]
limit = 1000000000
window = "1s"

[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "sliding_window_counter"
limit = 1000000000
window = "1s"

[[proxy.rules]]
name = "per-key"
key = "api_key"
algorithm = "token_bucket"
limit = 1000000000
window = "1s"
"#;

const LIMITER_SIGNED: &str = r#"
[proxy.plans.bench]
limit = 1000000000
window = "1s"

[[proxy.rules]]
name = "signed"
path = "/signed"
require_signature = true
key = "api_key"
algorithm = "token_bucket"
limit = 1000000000
window = "1s"
"#;

const WRK_DONE: &str = r#"
function done(summary, latency, requests)
  local s = summary.duration / 1e6
  local bad = summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format('{"rps": %.1f, "requests": %d, "errors": %d, "p50_ms": %.3f, "p99_ms": %.3f, "p999_ms": %.3f}\n',
    summary.requests / s, summary.requests, bad, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency:percentile(99.9) / 1e3))
end
"#;

fn upstream_conf(port: u16) -> String {
    format!(
        "worker_processes 1;\ndaemon off;\npid PREFIX/upstream.pid;\nerror_log stderr warn;\nevents {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path PREFIX/tmp;\n  proxy_temp_path PREFIX/tmp;\n  \
         fastcgi_temp_path PREFIX/tmp;\n  uwsgi_temp_path PREFIX/tmp;\n  scgi_temp_path PREFIX/tmp;\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n"
    )
}

/// nginx as a reverse proxy with `limit_req` zones equivalent to limiter's rules:
/// per IP, per API key, and a "plan" zone for the keys of the bench plan.
fn nginx_limit_req_conf(port: u16, upstream: u16) -> String {
    format!(
        "worker_processes 2;\ndaemon off;\npid PREFIX/nginx-limit-req.pid;\nerror_log stderr warn;\nevents {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path PREFIX/tmp;\n  proxy_temp_path PREFIX/tmp;\n  \
         fastcgi_temp_path PREFIX/tmp;\n  uwsgi_temp_path PREFIX/tmp;\n  scgi_temp_path PREFIX/tmp;\n  \
         limit_req_zone $binary_remote_addr zone=per_ip:10m rate=1000000r/s;\n  \
         limit_req_zone $http_x_api_key zone=per_key:10m rate=1000000r/s;\n  \
         map $http_x_api_key $plan_bench {{ \"{KEY_ID}\" $http_x_api_key; default \"\"; }}\n  \
         limit_req_zone $plan_bench zone=plan_bench:10m rate=1000000r/s;\n  \
         upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      limit_req zone=per_ip burst=1000000 nodelay;\n      \
         limit_req zone=per_key burst=1000000 nodelay;\n      limit_req zone=plan_bench burst=1000000 nodelay;\n      \
         limit_req_status 429;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
         proxy_set_header X-Forwarded-For $remote_addr;\n      proxy_pass http://up;\n    }}\n  }}\n}}\n"
    )
}

fn limiter_conf(dir: &Path, name: &str, port: u16, upstream: u16, extra: &str, secret: &Path) -> String {
    let slug: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let keys = if extra.contains("plans.bench") {
        format!("[[proxy.keys]]\nid = \"{KEY_ID}\"\nplan = \"bench\"\nsecrets = [\"file:{}\"]\n", secret.display())
    } else {
        String::new()
    };
    format!(
        "[agent]\npin_dir = \"/sys/fs/bpf/limiter-bench-{slug}-{pid}\"\nadmin_socket = \"{dir}/{slug}.sock\"\nmetrics = \"\"\n\n\
         [proxy]\nlisten = \"127.0.0.1:{port}\"\nupstream = \"http://127.0.0.1:{upstream}\"\nmax_tracked_keys = 1000000\n{extra}\n{keys}",
        pid = std::process::id(),
        dir = dir.display(),
    )
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_port(port: u16, child: &mut Child, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited at start: {status}");
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            // A complete answer, not just a listening socket.
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut buf = [0u8; 12];
            if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1") {
                return Ok(());
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("{name} did not answer on 127.0.0.1:{port} within 15 s")
}

/// A server child, stopped with SIGTERM (nginx's master then stops its workers) and
/// reaped when dropped.
struct Server {
    child: Child,
}

impl Server {
    fn nginx(bench: &mut Bench, nginx: &Path, dir: &Path, name: &str, conf: &str, port: u16) -> Result<Self> {
        fs::create_dir_all(dir.join("tmp"))?;
        let conf_path = dir.join(format!("{name}.conf"));
        fs::write(&conf_path, conf.replace("PREFIX", &dir.display().to_string()))?;
        let mut c = cmd(nginx);
        c.arg("-p").arg(dir).arg("-e").arg("stderr").arg("-c").arg(&conf_path).stdout(Stdio::null());
        bench.record(&c);
        let child = c.spawn().with_context(|| format!("cannot start nginx ({name})"))?;
        let mut server = Self { child };
        wait_port(port, &mut server.child, name)?;
        Ok(server)
    }

    fn limiter(bench: &mut Bench, limiter: &Path, dir: &Path, name: &str, conf: &str, port: u16) -> Result<Self> {
        let slug: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let conf_path = dir.join(format!("{slug}.toml"));
        fs::write(&conf_path, conf)?;
        let mut c = cmd(limiter);
        c.args(["run", "-c"]).arg(&conf_path).env("LIMITER_LOG", "warn").stdout(Stdio::null());
        bench.record(&c);
        let child = c.spawn().with_context(|| format!("cannot start {}", limiter.display()))?;
        let mut server = Self { child };
        wait_port(port, &mut server.child, name)?;
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().trim().to_owned())
        .unwrap_or_default()
}

fn environment() -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu =
        cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("?").trim();
    let nginx = Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
        .unwrap_or_default();
    json!({
        "kernel": first_line("uname", &["-r"]),
        "cpu": cpu,
        "cores": thread::available_parallelism().map_or(1, usize::from),
        "memory": fs::read_to_string("/proc/meminfo").unwrap_or_default().lines().next().unwrap_or_default().split_whitespace().nth(1).map(|kb| format!("{} MiB", kb.parse::<u64>().unwrap_or(0) / 1024)),
        "loadavg_at_start": fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "rustc": first_line("rustc", &["--version"]),
        "nginx": nginx,
        "wrk": first_line("wrk", &["-v"]),
        "oha": first_line("oha", &["--version"]),
        "nft": first_line("nft", &["--version"]),
        "trafgen": first_line("trafgen", &["-v"]),
    })
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn rows(v: &Value) -> impl Iterator<Item = &Value> {
    v["rows"].as_array().into_iter().flatten()
}

fn find<'a>(v: &'a Value, key: &str, value: &str) -> Option<&'a Value> {
    rows(v).find(|r| r[key] == value)
}

/// One target: what it says, the figure measured, and whether it holds (None: not
/// measured in this run).
fn target(name: &str, goal: &str, measured: String, met: Option<bool>) -> Value {
    json!({"target": name, "goal": goal, "measured": measured, "met": met})
}

fn targets(report: &Value) -> Value {
    let mut list = Vec::new();
    let xdp = &report["xdp_cost"];
    let ratio = f(&xdp["known_source_vs_floor"]);
    list.push(target(
        "XDP known source",
        "≤ 2.5 × XDP_PASS floor",
        ratio.map_or("—".into(), |r| {
            format!(
                "{r:.2} × ({:.0} ns vs {:.0} ns)",
                f(&xdp["known_source_ns"]).unwrap_or(0.0),
                f(&xdp["xdp_pass_floor_ns"]).unwrap_or(0.0)
            )
        }),
        ratio.map(|r| r <= 2.5),
    ));
    let fresh = f(&xdp["new_source_full_map_ns"]);
    list.push(target(
        "XDP new source, full map",
        "< 400 ns",
        fresh.map_or("—".into(), |n| format!("{n:.0} ns")),
        fresh.map(|n| n < 400.0),
    ));

    let flood = &report["flood"];
    let per_m = |name| find(flood, "filter", name).and_then(|r| f(&r["softirq_ms_per_million_packets"]));
    // Zero means the flood was too short for the tick-based accounting to see it.
    let (nft, lim) = (per_m("nftables").filter(|v| *v > 0.0), per_m("limiter").filter(|v| *v > 0.0));
    let delivery = find(flood, "filter", "limiter").and_then(|r| f(&r["good_delivery"]));
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

    let http = &report["http"];
    let limiter = find(http, "scenario", "limiter, per-IP + per-key + plan");
    let nginx = find(http, "scenario", "nginx limit_req");
    let rps = |r: Option<&Value>| r.and_then(|r| f(&r["closed_loop"]["rps"]));
    let p99 = |r: Option<&Value>| r.and_then(|r| f(&r["fixed_rate"]["p99_ms"]));
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

    let algorithms = &report["algorithms"];
    let mut worst: Option<(f64, String)> = None;
    for threads in [1, 2] {
        let governor = rows(algorithms)
            .find(|r| r["algorithm"] == "governor" && r["threads"] == threads)
            .and_then(|r| f(&r["decisions_per_second"]));
        for r in rows(algorithms).filter(|r| r["algorithm"] != "governor" && r["threads"] == threads) {
            if let (Some(g), Some(d)) = (governor, f(&r["decisions_per_second"])) {
                let ratio = d / g;
                if worst.as_ref().is_none_or(|(w, _)| ratio < *w) {
                    worst = Some((ratio, format!("{} at {threads} thread(s)", r["algorithm"].as_str().unwrap_or("?"))));
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
    let hmac = rows(&report["hmac"]).find(|r| r["body_bytes"] == 1_048_576).and_then(|r| f(&r["bytes_per_second"]));
    list.push(target(
        "HMAC verification, 1 MiB bodies",
        "> 1 GB/s",
        hmac.map_or("—".into(), |b| format!("{:.2} GB/s", b / 1e9)),
        hmac.map(|b| b > 1e9),
    ));
    json!(list)
}

fn met_label(v: &Value) -> &'static str {
    match v.as_bool() {
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured",
    }
}

pub fn summary_table(report: &Value) -> String {
    let mut s = String::from("| target | goal | measured | |\n|---|---|---|---|\n");
    for t in report["targets"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t["target"].as_str().unwrap_or(""),
            t["goal"].as_str().unwrap_or(""),
            t["measured"].as_str().unwrap_or(""),
            met_label(&t["met"])
        );
    }
    s
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("—".into(), |x| format!("{x:.digits$}"))
}

fn markdown(report: &Value) -> String {
    let env = &report["environment"];
    let mut m = String::new();
    let _ = writeln!(m, "# limiter benchmark report ({} run)\n", report["run"].as_str().unwrap_or("?"));
    let _ = writeln!(
        m,
        "Kernel {}, CPU {}, {} cores, {}; load average at start {}. {}; {}; {}; {}; {}.\n",
        env["kernel"].as_str().unwrap_or("?"),
        env["cpu"].as_str().unwrap_or("?"),
        env["cores"],
        env["memory"].as_str().unwrap_or("?"),
        env["loadavg_at_start"].as_str().unwrap_or("?"),
        env["rustc"].as_str().unwrap_or("?"),
        env["nginx"].as_str().unwrap_or("?"),
        env["wrk"].as_str().unwrap_or("?"),
        env["oha"].as_str().unwrap_or("oha missing"),
        env["nft"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        m,
        "Reproduce: `cargo xtask bench{}` (as root).\n",
        if report["run"] == "quick" { " --quick" } else { "" }
    );
    let _ = writeln!(m, "## Targets\n\n{}", summary_table(report));

    let x = &report["xdp_cost"];
    let floor = f(&x["xdp_pass_floor_ns"]).unwrap_or(f64::NAN);
    let _ = writeln!(m, "## 1. XDP cost per packet (BPF_PROG_TEST_RUN, repeat {})\n", x["repeat"]);
    let _ = writeln!(m, "| case | ns | × floor |\n|---|---|---|");
    for (label, key) in [
        ("XDP_PASS only (floor)", "xdp_pass_floor_ns"),
        ("limiter, known source", "known_source_ns"),
        ("limiter, new source, full map", "new_source_full_map_ns"),
        ("limiter, known source, 10 000 CIDRs", "known_source_10k_cidrs_ns"),
    ] {
        let v = f(&x[key]);
        let _ = writeln!(
            m,
            "| {label} | {} | {} |",
            num(&x[key], 1),
            v.map_or("—".into(), |v| format!("{:.2}", v / floor))
        );
    }
    let _ = writeln!(
        m,
        "\nNew sources cannot repeat inside one test run (the first run inserts them), so that case runs once per source; \
         the fixed cost of a one-run call, measured with the floor program the same way ({} ns), is taken out.\n\n![xdp](xdp_cost.svg)\n",
        num(&x["single_run_overhead_ns"], 0)
    );

    let fl = &report["flood"];
    let _ = writeln!(
        m,
        "## 2. Flood on a veth pair\n\n{} UDP frames from {} spoofed sources (trafgen, one CPU), limit {} packets/s per source (burst {}), \
         plus one well-behaved flow at {} packets/s. Receiving side's CPU = softirq time on the flooding CPU (background rate removed).\n",
        fl["flood_packets"], fl["spoofed_sources"], fl["rate_per_source"], fl["burst_per_source"], fl["good_pps"]
    );
    let _ = writeln!(
        m,
        "| filter | softirq ms per M packets | flood packets/s | dropped | well-behaved delivered | XDP program ns/packet (bpf_stats) |\n|---|---|---|---|---|---|"
    );
    for r in rows(fl) {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {}/{} ({:.1} %) | {} |",
            r["filter"].as_str().unwrap_or(""),
            num(&r["softirq_ms_per_million_packets"], 0),
            num(&r["flood_packets_per_second"], 0),
            r["dropped"],
            r["good_received"],
            r["good_sent"],
            f(&r["good_delivery"]).unwrap_or(0.0) * 100.0,
            num(&r["xdp_program_ns_per_packet"], 0),
        );
    }
    let _ = writeln!(
        m,
        "\nOn veth every frame arrives as an skb that native XDP must first turn into an XDP buffer (a copy), so the \
         softirq figure includes a per-packet cost a hardware driver does not have; the program's own share is the bpf_stats column.\n\n![flood](flood.svg)\n"
    );

    let h = &report["http"];
    let _ = writeln!(
        m,
        "## 3. HTTP (loopback, one upstream nginx, {} connections, {} s per run)\n\nClosed loop: {}. Fixed rate {} req/s: {}.\n",
        h["connections"],
        h["seconds"],
        h["load_tools"]["closed_loop"].as_str().unwrap_or(""),
        h["fixed_rate"],
        h["load_tools"]["fixed_rate"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        m,
        "| scenario | closed-loop req/s | p50 / p99 / p99.9 ms (closed) | fixed-rate p50 / p99 / p99.9 ms | errors |\n|---|---|---|---|---|"
    );
    for r in rows(h) {
        let c = &r["closed_loop"];
        let fr = &r["fixed_rate"];
        let _ = writeln!(
            m,
            "| {} | {} | {} / {} / {} | {} / {} / {} | {} |",
            r["scenario"].as_str().unwrap_or(""),
            num(&c["rps"], 0),
            num(&c["p50_ms"], 2),
            num(&c["p99_ms"], 2),
            num(&c["p999_ms"], 2),
            num(&fr["p50_ms"], 2),
            num(&fr["p99_ms"], 2),
            num(&fr["p999_ms"], 2),
            c["errors"],
        );
    }
    let _ = writeln!(
        m,
        "\nLimits are set far above the load on both proxies, so every request is decided and forwarded.\n\n![http](http.svg)\n"
    );

    let a = &report["algorithms"];
    let _ = writeln!(
        m,
        "## 4. Decisions per second, {} keys, limit {} per second\n\n| algorithm | 1 thread | 2 threads | bare check+charge, 1 thread |\n|---|---|---|---|",
        a["keys"], a["limit_per_second"]
    );
    let names: Vec<String> =
        rows(a).filter(|r| r["threads"] == 1).map(|r| r["algorithm"].as_str().unwrap_or("").to_owned()).collect();
    for name in names {
        let get = |t: u64| {
            rows(a).find(|r| r["algorithm"] == name.as_str() && r["threads"] == t).cloned().unwrap_or_default()
        };
        let (one, two) = (get(1), get(2));
        let label = if name == "governor" {
            "governor keyed (anchor)".to_owned()
        } else {
            format!("limiter {name} (MemoryStore)")
        };
        let _ = writeln!(
            m,
            "| {label} | {} | {} | {} |",
            num(&one["decisions_per_second"], 0),
            num(&two["decisions_per_second"], 0),
            num(&one["bare_decisions_per_second"], 0)
        );
    }
    let _ = writeln!(m, "\n![algorithms](algorithms.svg)\n");

    let _ = writeln!(
        m,
        "## 5. HMAC verification (body SHA-256 + string to sign + HMAC + replay cache)\n\n| body | verifications/s | MB/s |\n|---|---|---|"
    );
    for r in rows(&report["hmac"]) {
        let _ = writeln!(
            m,
            "| {} B | {} | {:.0} |",
            r["body_bytes"],
            num(&r["requests_per_second"], 0),
            f(&r["bytes_per_second"]).unwrap_or(0.0) / 1e6
        );
    }
    let _ = writeln!(m, "\n![hmac](hmac.svg)\n");

    let mem = &report["memory"];
    let _ = writeln!(m, "## 6. Memory\n\n| where | bytes per tracked key |\n|---|---|");
    for r in mem["proxy"].as_array().into_iter().flatten() {
        let _ = writeln!(
            m,
            "| proxy, {} ({} keys, heap) | {} |",
            r["algorithm"].as_str().unwrap_or(""),
            r["keys"],
            num(&r["bytes_per_key"], 0)
        );
    }
    let k = &mem["kernel"];
    let _ = writeln!(
        m,
        "| kernel sources map ({}, {} slots, key {} B + value {} B) | {} |",
        k["map_type"].as_str().unwrap_or(""),
        k["capacity"],
        k["key_bytes"],
        k["value_bytes"],
        num(&k["bytes_per_source"], 0)
    );

    let _ = writeln!(m, "\n## Commands\n\n```");
    for c in report["commands"].as_array().into_iter().flatten() {
        let _ = writeln!(m, "{}", c.as_str().unwrap_or(""));
    }
    let _ = writeln!(m, "```");
    if let Some(errors) = report["errors"].as_array().filter(|e| !e.is_empty()) {
        let _ = writeln!(m, "\n## Errors\n");
        for e in errors {
            let _ = writeln!(m, "- {}", e.as_str().unwrap_or(""));
        }
    }
    m
}

/// A horizontal bar chart, one bar per (label, value).
fn bar_chart(title: &str, unit: &str, bars: &[(String, f64)]) -> String {
    let (width, label_w, bar_h, top) = (760.0, 300.0, 26.0, 40.0);
    let max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max).max(1e-12);
    let height = top + bars.len() as f64 * (bar_h + 8.0) + 20.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    let colors = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6"];
    for (i, (label, value)) in bars.iter().enumerate() {
        let y = top + i as f64 * (bar_h + 8.0);
        let w = (width - label_w - 120.0) * value / max;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<rect x=\"{label_w}\" y=\"{y}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{}\"/>\n\
             <text x=\"{:.1}\" y=\"{}\">{} {}</text>\n",
            label_w - 8.0,
            y + bar_h * 0.7,
            escape(label),
            colors[i % colors.len()],
            label_w + w + 6.0,
            y + bar_h * 0.7,
            pretty(*value),
            escape(unit)
        );
    }
    s + "</svg>\n"
}

fn pretty(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0} k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn charts(report: &Value) -> Vec<(&'static str, String)> {
    let x = &report["xdp_cost"];
    let xdp: Vec<(String, f64)> = [
        ("XDP_PASS floor", "xdp_pass_floor_ns"),
        ("known source", "known_source_ns"),
        ("new source, full map", "new_source_full_map_ns"),
        ("known source, 10k CIDRs", "known_source_10k_cidrs_ns"),
    ]
    .iter()
    .filter_map(|(l, k)| f(&x[*k]).map(|v| ((*l).to_owned(), v)))
    .collect();
    let flood: Vec<(String, f64)> = rows(&report["flood"])
        .filter_map(|r| Some((r["filter"].as_str()?.to_owned(), f(&r["softirq_ms_per_million_packets"])?)))
        .collect();
    let http: Vec<(String, f64)> = rows(&report["http"])
        .filter_map(|r| Some((r["scenario"].as_str()?.to_owned(), f(&r["closed_loop"]["rps"])?)))
        .collect();
    let p99: Vec<(String, f64)> = rows(&report["http"])
        .filter_map(|r| Some((r["scenario"].as_str()?.to_owned(), f(&r["fixed_rate"]["p99_ms"])?)))
        .collect();
    let algorithms: Vec<(String, f64)> = rows(&report["algorithms"])
        .filter_map(|r| {
            Some((format!("{} ({}t)", r["algorithm"].as_str()?, r["threads"]), f(&r["decisions_per_second"])?))
        })
        .collect();
    let hmac: Vec<(String, f64)> = rows(&report["hmac"])
        .filter_map(|r| Some((format!("{} B", r["body_bytes"]), f(&r["bytes_per_second"])? / 1e6)))
        .collect();
    vec![
        ("xdp_cost", bar_chart("XDP cost per packet (lower is better)", "ns", &xdp)),
        ("flood", bar_chart("Flood: receiving CPU per million packets (lower is better)", "ms", &flood)),
        ("http", bar_chart("HTTP closed-loop throughput (higher is better)", "req/s", &http)),
        ("http_p99", bar_chart("HTTP p99 at a fixed rate (lower is better)", "ms", &p99)),
        ("algorithms", bar_chart("Decisions per second, 10 000 keys (higher is better)", "/s", &algorithms)),
        ("hmac", bar_chart("HMAC verification throughput (higher is better)", "MB/s", &hmac)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole harness with tiny counts, against the debug examples that
    /// `cargo test --workspace` (and so `cargo xtask test`) has just built. Needs root
    /// for the kernel groups, like the kernel tests.
    #[test]
    fn bench_harness_smoke() {
        let _lab = crate::util::LAB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let bin_dir = target_dir().join("debug");
        let needed = ["xdp_cost", "bench_flood", "bench_algorithms", "bench_hmac", "bench_memory"];
        if let Some(missing) = needed.iter().find(|n| !bin_dir.join("examples").join(n).is_file()) {
            panic!(
                "{missing} is not built: run through `cargo xtask test` (cargo test --workspace builds the examples)"
            );
        }
        assert!(bin_dir.join("limiter").is_file(), "target/debug/limiter is not built");
        let started = Instant::now();
        let out = target_dir().join("bench-smoke");
        let report = Bench::new(Sizes::SMOKE, bin_dir, out.clone()).run().expect("bench run");
        assert_eq!(report["errors"], json!([]), "{:#}", report["errors"]);
        for file in ["report.md", "report.json", "xdp_cost.svg", "flood.svg", "http.svg", "algorithms.svg", "hmac.svg"]
        {
            assert!(out.join(file).is_file(), "{file} missing");
        }
        assert!(report["xdp_cost"]["known_source_ns"].as_f64().is_some());
        assert_eq!(report["flood"]["rows"].as_array().map(Vec::len), Some(3));
        assert_eq!(report["http"]["rows"].as_array().map(Vec::len), Some(5));
        assert_eq!(report["targets"].as_array().map(Vec::len), Some(7));
        eprintln!("bench smoke run took {:?}", started.elapsed());
    }

    #[test]
    fn bar_chart_is_svg_with_one_bar_per_value() {
        let svg = bar_chart("t <1>", "ns", &[("a".into(), 1.0), ("b".into(), 2.0)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("t &lt;1&gt;"));
    }
}
