//! The commands and Python modules the commands call, each from a Debian package, and
//! the one `apt-get install` that brings the missing ones.

use std::{fmt, fs, path::PathBuf};

use anyhow::{Context, Result, bail};

use super::background::{Job, Log};
use crate::util::{cmd, find_program, probe};

/// How to tell that a package is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    Program(&'static str),
    /// A module Debian's python3 imports (see [`debian_python`]).
    PythonModule(&'static str),
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::Program(name) => write!(f, "`{name}`"),
            Check::PythonModule(module) => write!(f, "python3's module `{module}`"),
        }
    }
}

/// Something a command calls, and the Debian package that provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Debian {
    check: Check,
    package: &'static str,
}

const fn program(name: &'static str, package: &'static str) -> Debian {
    Debian { check: Check::Program(name), package }
}

pub const IP: Debian = program("ip", "iproute2");
pub const HPING3: Debian = program("hping3", "hping3");
/// redis-cli, for the cluster, comes with it.
pub const REDIS_SERVER: Debian = program("redis-server", "redis-server");
/// The fleet tests' Sentinel.
pub const REDIS_SENTINEL: Debian = program("redis-sentinel", "redis-sentinel");
pub const BPFTOOL: Debian = program("bpftool", "bpftool");
pub const NFT: Debian = program("nft", "nftables");
pub const WRK: Debian = program("wrk", "wrk");
pub const TRAFGEN: Debian = program("trafgen", "netsniff-ng");
pub const TASKSET: Debian = program("taskset", "util-linux");
pub const NGINX: Debian = program("nginx", "nginx");
pub const PROMTOOL: Debian = program("promtool", "prometheus");
pub const OPENSSL: Debian = program("openssl", "openssl");
pub const CURL: Debian = program("curl", "curl");
/// Drives `limiter top --watch`'s screen in the tests, as a terminal would.
pub const TMUX: Debian = program("tmux", "tmux");
/// Captures the TLS handshakes whose JA4 the fingerprint tests compute apart.
pub const TCPDUMP: Debian = program("tcpdump", "tcpdump");
/// The edge-protocol tests' load balancer, sending PROXY protocol v2.
pub const HAPROXY: Debian = program("haproxy", "haproxy");
/// An HTTP/2 load generator: the edge-protocol tests' and the bench's.
pub const H2LOAD: Debian = program("h2load", "nghttp2-client");
/// cargo-deb finds the package's Depends with it.
pub const DPKG_DEV: Debian = program("dpkg-shlibdeps", "dpkg-dev");
/// Formats the manual pages in the CLI docs test.
pub const GROFF: Debian = program("groff", "groff-base");
/// Both ends of the WebSocket tests.
pub const PYTHON_WEBSOCKETS: Debian =
    Debian { check: Check::PythonModule("websockets"), package: "python3-websockets" };

/// The first python3 that imports `websockets`: the one on PATH may be a pyenv build
/// that cannot see Debian's packages, while /usr/bin/python3 can.
pub fn debian_python() -> Option<PathBuf> {
    let Check::PythonModule(module) = PYTHON_WEBSOCKETS.check else { return None };
    python_importing(module)
}

fn python_importing(module: &str) -> Option<PathBuf> {
    [find_program("python3"), Some(PathBuf::from("/usr/bin/python3"))]
        .into_iter()
        .flatten()
        .find(|p| p.to_str().is_some_and(|p| probe(p, &["-c", &format!("import {module}")]).is_some()))
}

impl Debian {
    fn present(self) -> bool {
        match self.check {
            Check::Program(name) => find_program(name).is_some(),
            Check::PythonModule(module) => python_importing(module).is_some(),
        }
    }
}

/// The packages of `wanted` that are not there, each once.
pub fn missing(wanted: &[Debian]) -> Vec<Debian> {
    let mut missing: Vec<Debian> = Vec::new();
    for tool in wanted.iter().filter(|t| !t.present()) {
        if !missing.iter().any(|m| m.package == tool.package) {
            missing.push(*tool);
        }
    }
    missing
}

/// `apt-get update` and one `apt-get install` of `missing`, in the background.
pub fn install(missing: Vec<Debian>) -> Result<Job> {
    let packages: Vec<&'static str> = missing.iter().map(|t| t.package).collect();
    Job::spawn("packages", &packages.join(" "), move |log| {
        let hint = format!(
            "install them by hand: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
            packages.join(" ")
        );
        log.run(cmd("apt-get").arg("update")).context(hint.clone())?;
        log.run(
            cmd("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "--no-install-recommends"])
                .args(&packages),
        )
        .context(hint.clone())?;
        for service in ["nginx", "redis-server", "redis-sentinel"].into_iter().filter(|s| packages.contains(s)) {
            stop_service(log, service);
        }
        if let Some(tool) = missing.iter().find(|t| !t.present()) {
            bail!("{} is still missing after apt-get install; {hint}", tool.check);
        }
        Ok(())
    })
}

/// The packages start their system services, which would hold ports 80 and 6379;
/// tests start private instances. Best effort: any of these may be absent here.
fn stop_service(log: &mut Log, name: &str) {
    if std::path::Path::new("/run/systemd/system").is_dir() {
        let _ = log.run(cmd("systemctl").args(["disable", "--now", name]));
    } else {
        let _ = log.run(cmd("service").args([name, "stop"]));
        let _ = log.run(cmd("update-rc.d").args([name, "disable"]));
    }
    let pidfile = match name {
        "nginx" => "/run/nginx.pid".to_owned(),
        redis => format!("/run/redis/{redis}.pid"),
    };
    if let Ok(pid) = fs::read_to_string(pidfile) {
        let _ = log.run(cmd("kill").arg(pid.trim()));
    }
}
