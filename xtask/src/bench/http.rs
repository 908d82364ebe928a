//! The HTTP group, driven from here: an upstream nginx, limiter with each rule set
//! and nginx `limit_req` in front of it, loaded closed-loop by wrk and at one fixed
//! rate by oha.

use std::{
    fmt::Write as _,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use limiter_lab::report::{ClosedLoop, FixedRate, Http, HttpRow, LoadTools, UpgradeRun};
use serde_json::Value;

use super::{
    Bench,
    configs::{
        KEY_ID, LIMITER_BODY_KEY, LIMITER_RULES, LIMITER_RULES_CONCURRENCY, LIMITER_RULES_THREE_QUOTAS, LIMITER_SIGNED,
        LOGIN_BODY, Listener, SECRET, WRK_DONE, limiter_conf, nginx_limit_req_conf, slug, upstream_conf,
    },
    format::num,
    process::{Server, answers_http1, free_port},
    svg::bar_chart,
};
use crate::util::{cmd, find_program};

pub const TITLE: &str = "3. HTTP";

/// The path the body-key scenario posts its logins to.
const LOGIN: &str = "/login";

/// What both HTTP groups start from: a fresh output directory, one upstream nginx
/// (the first of `servers`), and the bench key's secret file.
pub struct Stage {
    pub dir: PathBuf,
    pub nginx: PathBuf,
    pub upstream_port: u16,
    pub secret: PathBuf,
    /// Stopped when dropped.
    pub servers: Vec<Server>,
}

impl Stage {
    pub fn new(bench: &mut Bench, group: &str) -> Result<Self> {
        let dir = bench.out.join(group);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let nginx = find_program("nginx").context("nginx not found (cargo xtask setup)")?;
        let upstream_port = free_port()?;
        let upstream = Server::nginx(
            bench,
            &nginx,
            &dir,
            "upstream",
            &upstream_conf(upstream_port),
            answers_http1(upstream_port),
        )?;
        let secret = dir.join("bench-key.secret");
        fs::write(&secret, SECRET)?;
        // As an operator's would be: limiter warns about a secret others can read.
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600))?;
        Ok(Self { dir, nginx, upstream_port, secret, servers: vec![upstream] })
    }
}

pub fn run(bench: &mut Bench) -> Result<Http> {
    let Stage { dir, nginx, upstream_port, secret, mut servers } = Stage::new(bench, "http")?;
    let wrk = find_program("wrk").context("wrk not found (cargo xtask setup)")?;
    let oha = find_program("oha");
    let limiter = bench.bin_dir.join("limiter");
    let mut scenarios: Vec<(&str, u16, &str)> = vec![("upstream direct", upstream_port, "/")];
    let mut start_limiter = |bench: &mut Bench, name: &'static str, proxy: &str, path: &'static str| -> Result<()> {
        let port = free_port()?;
        let conf = limiter_conf(&dir, name, port, upstream_port, Listener::Http1, proxy, &secret);
        servers.push(Server::limiter(bench, &limiter, &dir, name, &conf, answers_http1(port))?);
        scenarios.push((name, port, path));
        Ok(())
    };
    start_limiter(bench, "limiter, no rules", "", "/")?;
    start_limiter(bench, "limiter, per-IP + per-key + plan", LIMITER_RULES, "/")?;
    start_limiter(bench, "limiter, per-IP + per-key + 3-quota plan", LIMITER_RULES_THREE_QUOTAS, "/")?;
    start_limiter(bench, "limiter, per-IP + per-key + plan + concurrency", LIMITER_RULES_CONCURRENCY, "/")?;
    start_limiter(bench, "limiter, per-IP + per-username (json:/username)", LIMITER_BODY_KEY, LOGIN)?;
    start_limiter(bench, "limiter, signed route", LIMITER_SIGNED, "/signed")?;
    let nginx_port = free_port()?;
    servers.push(Server::nginx(
        bench,
        &nginx,
        &dir,
        "nginx-limit-req",
        &nginx_limit_req_conf(nginx_port, upstream_port, Listener::Http1),
        answers_http1(nginx_port),
    )?);
    scenarios.push(("nginx limit_req", nginx_port, "/"));

    let latency_lua = dir.join("latency.lua");
    fs::write(&latency_lua, WRK_DONE)?;
    let login_lua = dir.join("login.lua");
    let login = format!(
        "wrk.method = \"POST\"\nwrk.body = '{LOGIN_BODY}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n{WRK_DONE}"
    );
    fs::write(&login_lua, login)?;
    let signed_lua = dir.join("signed.lua");
    let mut c = cmd(bench.bin_dir.join("examples/bench_hmac"));
    c.arg("--wrk-script")
        .arg(bench.sizes.signed_requests.to_string())
        .args([KEY_ID, SECRET, "/signed"])
        .arg(&signed_lua);
    bench.run_recorded(&mut c)?;
    let mut script = fs::read_to_string(&signed_lua)?;
    script += WRK_DONE;
    fs::write(&signed_lua, script)?;

    let seconds = bench.sizes.http_seconds.to_string();
    let connections = bench.sizes.http_connections.to_string();
    let mut rows = Vec::new();
    for &(name, port, path) in &scenarios {
        let url = format!("http://127.0.0.1:{port}{path}");
        let script = match path {
            "/signed" => &signed_lua,
            LOGIN => &login_lua,
            _ => &latency_lua,
        };
        let mut c = cmd(&wrk);
        c.args(["-t1", "-c", &connections, "-d", &format!("{seconds}s"), "-s"]).arg(script).args([
            "-H",
            &format!("X-API-Key: {KEY_ID}"),
            &url,
        ]);
        bench.record(&c);
        let out = c.output()?;
        let closed_loop = wrk_summary(&out.stdout, name)?;
        rows.push(HttpRow { scenario: name.to_owned(), url, closed_loop, fixed_rate: None });
    }
    // One fixed rate for every scenario: half the slowest closed-loop maximum, so
    // every server is below saturation and latencies compare like with like.
    let slowest = rows.iter().map(|r| r.closed_loop.rps).fold(f64::INFINITY, f64::min);
    let rate = ((slowest * 0.5 / 100.0).floor() * 100.0).max(100.0) as u64;
    if let Some(oha) = &oha {
        for (row, &(name, _port, path)) in rows.iter_mut().zip(&scenarios) {
            if path == "/signed" {
                // oha cannot sign each request; the signed route is closed-loop only.
                continue;
            }
            let mut c = cmd(oha);
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
            .args(["-H", &format!("X-API-Key: {KEY_ID}")]);
            if path == LOGIN {
                c.args(["-m", "POST", "-T", "application/json", "-d", LOGIN_BODY]);
            }
            c.arg(&row.url);
            bench.record(&c);
            let out = c.output()?;
            // oha's own format: read by key, and only the figures the report keeps.
            let parsed: Value =
                serde_json::from_slice(&out.stdout).with_context(|| format!("oha output for {name}"))?;
            let p = &parsed["latencyPercentiles"];
            let ms = |v: &Value| v.as_f64().map(|s| s * 1e3);
            row.fixed_rate = Some(FixedRate {
                rate,
                rps: parsed["summary"]["requestsPerSec"].as_f64(),
                p50_ms: ms(&p["p50"]),
                p99_ms: ms(&p["p99"]),
                p999_ms: ms(&p["p99.9"]),
                status_200: parsed["statusCodeDistribution"]["200"].as_u64(),
                success_rate: parsed["summary"]["successRate"].as_f64(),
            });
        }
    }
    let upgrade = upgrade_under_load(bench, &wrk, &limiter, &dir, upstream_port, &secret, &latency_lua)?;
    drop(servers);
    Ok(Http {
        load_tools: LoadTools {
            closed_loop: "wrk -t1 (a done() hook prints p50/p99/p99.9; the signed route uses a request() hook cycling pre-signed requests)".to_owned(),
            fixed_rate: if oha.is_some() {
                "oha -q RATE --latency-correction (corrects coordinated omission)"
            } else {
                "oha missing: not measured"
            }
            .to_owned(),
        },
        connections: bench.sizes.http_connections,
        seconds: bench.sizes.http_seconds,
        fixed_rate: rate,
        rows,
        upgrade: Some(upgrade),
    })
}

/// `limiter upgrade` a third of the way into a wrk run that opens a new connection
/// for every request (`Connection: close`), so that a moment without a listener
/// would show as refused connections: how long until the old agent has exited, and
/// what wrk saw fail.
fn upgrade_under_load(
    bench: &mut Bench,
    wrk: &Path,
    limiter: &Path,
    dir: &Path,
    upstream_port: u16,
    secret: &Path,
    script: &Path,
) -> Result<UpgradeRun> {
    const NAME: &str = "limiter, upgraded";
    let port = free_port()?;
    let conf = limiter_conf(dir, NAME, port, upstream_port, Listener::Http1, "", secret);
    let mut old = Server::limiter(bench, limiter, dir, NAME, &conf, answers_http1(port))?;
    let seconds = bench.sizes.http_seconds.max(1);
    let mut load = cmd(wrk);
    load.args(["-t1", "-c", &bench.sizes.http_connections.to_string(), "-d", &format!("{seconds}s"), "-s"])
        .arg(script)
        .args(["-H", "Connection: close", &format!("http://127.0.0.1:{port}/")])
        .stdout(Stdio::piped());
    bench.record(&load);
    let load = load.spawn().context("cannot start wrk")?;
    std::thread::sleep(Duration::from_millis(u64::from(seconds) * 1000 / 3));
    let mut upgrade = cmd(limiter);
    upgrade.arg("upgrade").arg("-c").arg(dir.join(format!("{}.toml", slug(NAME))));
    bench.record(&upgrade);
    let started = Instant::now();
    let answer = upgrade.output().context("cannot run limiter upgrade")?;
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let said = String::from_utf8_lossy(&answer.stdout).into_owned();
    // "upgraded: pid NEW serves; ..."
    let new_pid = said.split_whitespace().nth(2).and_then(|pid| pid.parse::<u32>().ok());
    let exited = old.exited_within(Duration::from_secs(60))?;
    let handover_ms = started.elapsed().as_secs_f64() * 1e3;
    let out = load.wait_with_output()?;
    if let Some(pid) = new_pid {
        let _ = cmd("kill").args(["-TERM", &pid.to_string()]).status();
    }
    let Some(new_pid) = new_pid.filter(|_| answer.status.success()) else {
        bail!("limiter upgrade failed: {}{}", said, String::from_utf8_lossy(&answer.stderr));
    };
    if !exited {
        bail!("the old agent had not exited 60 s after the upgrade (new pid {new_pid})");
    }
    let closed = wrk_summary(&out.stdout, NAME)?;
    Ok(UpgradeRun { handover_ms, ready_ms, requests: closed.requests, dropped: closed.errors })
}

/// What the [`WRK_DONE`] hook printed of run `name`.
fn wrk_summary(stdout: &[u8], name: &str) -> Result<ClosedLoop> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("{\"rps\""))
        .with_context(|| format!("wrk gave no summary for {name}: {text}"))?;
    Ok(serde_json::from_str(line)?)
}

pub fn markdown(m: &mut String, h: &Http) {
    let _ = writeln!(
        m,
        "## {TITLE} (loopback, one upstream nginx, {} connections, {} s per run)\n\nClosed loop: {}. Fixed rate {} req/s: {}.\n",
        h.connections, h.seconds, h.load_tools.closed_loop, h.fixed_rate, h.load_tools.fixed_rate
    );
    let _ = writeln!(
        m,
        "| scenario | closed-loop req/s | p50 / p99 / p99.9 ms (closed) | fixed-rate p50 / p99 / p99.9 ms | errors |\n|---|---|---|---|---|"
    );
    for r in &h.rows {
        let c = &r.closed_loop;
        let fr = r.fixed_rate.as_ref();
        let fixed = |v: fn(&FixedRate) -> Option<f64>| num(fr.and_then(v), 2);
        let _ = writeln!(
            m,
            "| {} | {} | {} / {} / {} | {} / {} / {} | {} |",
            r.scenario,
            num(Some(c.rps), 0),
            num(Some(c.p50_ms), 2),
            num(Some(c.p99_ms), 2),
            num(Some(c.p999_ms), 2),
            fixed(|f| f.p50_ms),
            fixed(|f| f.p99_ms),
            fixed(|f| f.p999_ms),
            c.errors,
        );
    }
    if let Some(u) = &h.upgrade {
        let _ = writeln!(
            m,
            "\n`limiter upgrade` under wrk's load of a new connection per request ({} connections): the new agent ready {} ms after the command, the old one exited {} ms after it; {} of {} requests dropped.",
            h.connections,
            num(Some(u.ready_ms), 0),
            num(Some(u.handover_ms), 0),
            u.dropped,
            u.requests
        );
    }
    let _ = writeln!(
        m,
        "\nLimits are set far above the load on both proxies, so every request is decided and forwarded.\n\n![http](http.svg)\n"
    );
}

pub fn charts(h: &Http) -> Vec<(&'static str, String)> {
    let throughput: Vec<(String, f64)> = h.rows.iter().map(|r| (r.scenario.clone(), r.closed_loop.rps)).collect();
    let p99: Vec<(String, f64)> =
        h.rows.iter().filter_map(|r| Some((r.scenario.clone(), r.fixed_rate.as_ref()?.p99_ms?))).collect();
    vec![
        ("http", bar_chart("HTTP closed-loop throughput (higher is better)", "req/s", &throughput)),
        ("http_p99", bar_chart("HTTP p99 at a fixed rate (lower is better)", "ms", &p99)),
    ]
}
