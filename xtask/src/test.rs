//! `cargo xtask test`: every test of the workspace against a private redis-server, so
//! the Redis store tests never touch (or depend on) a system instance; then, on a
//! whole run, each fuzz target for a few seconds.

use std::{
    fs::File,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    fuzz,
    setup::{
        BPFTOOL, CURL, GROFF, H2LOAD, HAPROXY, HPING3, IP, NFT, NGINX, Needs, OPENSSL, PROMTOOL, PYTHON_WEBSOCKETS,
        Pending, REDIS_SENTINEL, REDIS_SERVER, ROOT_AND_BUILD, TASKSET, TMUX, TRAFGEN, WRK, debian_python,
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
        GROFF,
        PYTHON_WEBSOCKETS,
    ],
    cargo: &[],
};

pub fn run(packages: &[String], test_args: &[String], setup: Pending) -> Result<()> {
    // Built first, while the background installs run; the tests need them.
    run_cmd(cargo_test(packages).arg("--no-run"))?;
    setup.finish()?;
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
    // Only the whole run: a targeted run is for a quick answer on a few tests.
    let fuzzed = if packages.is_empty() && test_args.is_empty() {
        fuzz::run_targets(&fuzz::TARGETS, fuzz::TEST_SECONDS)
    } else {
        Ok(())
    };
    // Both run whatever the other did; either failing fails the run.
    result.and(fuzzed)
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
