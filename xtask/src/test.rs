//! `cargo xtask test`: every test of the workspace against a private redis-server, so
//! the Redis store tests never touch (or depend on) a system instance; on a whole run
//! also the docs' links and, for a few seconds, each fuzz target.

use std::{
    fs::File,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    fuzz,
    setup::{
        BPFTOOL, CARGO_FUZZ, CURL, GROFF, H2LOAD, HAPROXY, HPING3, IP, NFT, NGINX, Needs, OPENSSL, PROMTOOL,
        PYTHON_WEBSOCKETS, Pending, REDIS_SENTINEL, REDIS_SERVER, ROOT_AND_BUILD, TASKSET, TCPDUMP, TMUX, TRAFGEN, WRK,
        debian_python,
    },
    util::{cmd, find_program, run as run_cmd, show, target_dir},
};

/// The tests' real peers and tools; the demo's and the bench's too, as the tests run
/// both (the bench with tiny counts, and without oha, whose columns it then leaves empty).
pub const NEEDS: Needs = Needs {
    steps: ROOT_AND_BUILD,
    debian: &[
        IP,
        HPING3,
        REDIS_SERVER,
        REDIS_SENTINEL,
        BPFTOOL,
        NFT,
        WRK,
        TRAFGEN,
        TASKSET,
        NGINX,
        PROMTOOL,
        OPENSSL,
        CURL,
        TMUX,
        HAPROXY,
        H2LOAD,
        TCPDUMP,
        GROFF,
        PYTHON_WEBSOCKETS,
    ],
    cargo: &[],
};

pub fn run(packages: &[String], test_args: &[String], setup: Pending) -> Result<()> {
    // Only the whole run: a targeted run is for a quick answer on a few tests.
    let whole = packages.is_empty() && test_args.is_empty();
    // On a whole run the docs and the fuzz targets build beside the tests, each in a
    // target directory of its own (no lock shared); the fuzz targets as soon as
    // cargo-fuzz is there. The tests run once all are built, on a machine no build
    // is loading.
    let mut side = Vec::new();
    if whole {
        side.push(SideBuild::start("docs", docs())?);
    }
    let fuzz_now = whole && CARGO_FUZZ.present();
    if fuzz_now {
        side.push(SideBuild::start("fuzz targets", fuzz::build())?);
    }
    // Built while the background installs run; the tests need them.
    let built = run_cmd(cargo_test(packages).arg("--no-run"));
    let installed = setup.finish();
    if whole && !fuzz_now && installed.is_ok() {
        side.push(SideBuild::start("fuzz targets", fuzz::build())?);
    }
    let side: Result<()> = side.into_iter().map(SideBuild::wait).collect::<Vec<_>>().into_iter().collect();
    built?;
    installed?;
    let server = find_program("redis-server").context("redis-server not found; run `cargo xtask setup`")?;
    let redis = Redis::start(&server)?;
    let mut c = cargo_test(packages);
    c.arg("--")
        .args(test_args)
        .env("RUST_BACKTRACE", "1")
        .env("LIMITER_TEST_REDIS_URL", format!("redis://127.0.0.1:{}/", redis.port))
        .env("LIMITER_TEST_REDIS_PORT", redis.port.to_string())
        .env("LIMITER_TEST_REDIS_SERVER", &server);
    if let Some(python) = debian_python() {
        c.env("LIMITER_TEST_PYTHON", python);
    }
    let result = run_cmd(&mut c);
    drop(redis);
    let checked = if whole { side.and_then(|()| fuzz::run_together(&fuzz::TARGETS, fuzz::TEST_SECONDS)) } else { side };
    // Each part runs whatever the others did; any failing fails the run.
    result.and(checked)
}

fn cargo_test(packages: &[String]) -> Command {
    let mut c = cmd("cargo");
    c.args(["test", "--no-fail-fast"]);
    if packages.is_empty() {
        // The eBPF crate is nightly- and BPF-only; the agent's build.rs compiles it.
        c.args(["--workspace", "--exclude", "limiter-ebpf"]);
    }
    for p in packages {
        c.args(["-p", p]);
    }
    c
}

/// The docs of every crate (private items too) with no intra-doc link to nothing.
/// In a target directory of its own, so that it builds beside the tests; the eBPF
/// program it needs is the tests' build's.
fn docs() -> Command {
    let mut c = cmd("cargo");
    c.args(["doc", "--no-deps", "--document-private-items", "--workspace", "--exclude", "limiter-ebpf"])
        .arg("--target-dir")
        .arg(target_dir().join("doc-check"))
        .env("RUSTDOCFLAGS", "-D rustdoc::broken_intra_doc_links")
        .env("LIMITER_EBPF_TARGET_DIR", target_dir().join("debug/ebpf"));
    c
}

/// A build running beside the tests', its output in a log that is shown if it fails.
struct SideBuild {
    what: &'static str,
    child: Child,
    log: PathBuf,
}

impl SideBuild {
    fn start(what: &'static str, mut c: Command) -> Result<Self> {
        let log = target_dir().join(format!("xtask-{}.log", what.replace(' ', "-")));
        std::fs::create_dir_all(target_dir()).context("cannot create the target directory")?;
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        println!("{} (in the background; log: {})", show(&c), log.display());
        c.stdin(Stdio::null()).stdout(out.try_clone().context("cannot share the log file")?).stderr(out);
        let child = c.spawn().with_context(|| format!("cannot start the {what}' build"))?;
        Ok(Self { what, child, log })
    }

    fn wait(mut self) -> Result<()> {
        let status = self.child.wait().with_context(|| format!("cannot wait for the {}' build", self.what))?;
        if status.success() {
            println!("{}: built", self.what);
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        eprintln!("{} failed ({status}); the end of {}:", self.what, self.log.display());
        for line in tail.into_iter().rev() {
            eprintln!("  {line}");
        }
        bail!("the {} do not build; see {}", self.what, self.log.display())
    }
}

/// A redis-server child that is killed when dropped, so a failing or panicking run
/// leaves no server behind.
#[derive(Debug)]
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start(server: &Path) -> Result<Self> {
        // Racy by nature (the port could be taken before redis binds it), but a clash
        // shows up as a start failure below, not as tests talking to a foreign server.
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).context("no free port")?.port();
        let log = target_dir().join("xtask-redis.log");
        std::fs::create_dir_all(target_dir()).context("cannot create the target directory")?;
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut c = cmd(server);
        c.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ])
        .stdin(Stdio::null())
        .stdout(out.try_clone().context("cannot share the log file")?)
        .stderr(out);
        println!("{} (log: {})", show(&c), log.display());
        let child = c.spawn().with_context(|| format!("cannot start {}", server.display()))?;
        let mut redis = Redis { child, port };
        redis.wait_ready(&log)?;
        println!("redis-server ready on 127.0.0.1:{port}");
        Ok(redis)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().context("cannot poll redis-server")? {
                bail!("redis-server exited at start ({status}); see {}", log.display());
            }
            if ping(self.port) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        bail!("redis-server did not answer PING within 10 s; see {}", log.display())
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut buf = [0u8; 7];
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
