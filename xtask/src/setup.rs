//! `cargo xtask setup`: checks each prerequisite and installs what can be installed
//! here. Checks only probe, so a machine that has everything passes in well under a
//! second; each step prints one `setup: <step>: ok|installed|FAILED` line.

use std::{
    fmt, fs,
    os::unix::fs::{MetadataExt, symlink},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::util::{cmd, find_program, home, probe, run as run_cmd};

#[derive(Debug)]
enum Outcome {
    Ok,
    Installed,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Installed => "installed",
        })
    }
}

type Step = fn() -> Result<Outcome>;

pub fn run() -> Result<()> {
    run_steps(&[
        ("root", root),
        ("nightly", nightly),
        ("rust-src", rust_src),
        ("bpf-linker", bpf_linker),
        ("cargo-fuzz", cargo_fuzz),
        ("packages", packages),
    ])
}

/// What making the Debian package needs besides [`run`]'s steps: only `package`,
/// `setup` and the tests that include xtask's make one.
pub fn run_packaging() -> Result<()> {
    run_steps(&[("cargo-deb", cargo_deb)])
}

fn run_steps(steps: &[(&str, Step)]) -> Result<()> {
    for &(name, step) in steps {
        match step() {
            Ok(outcome) => println!("setup: {name}: {outcome}"),
            Err(e) => {
                println!("setup: {name}: FAILED");
                eprintln!("{e:#}");
                // Later steps depend on earlier ones (root for apt, nightly for bpf-linker).
                bail!("setup failed at step `{name}`");
            }
        }
    }
    Ok(())
}

fn root() -> Result<Outcome> {
    // /proc/self belongs to the effective uid; avoids a libc dependency for geteuid().
    if fs::metadata("/proc/self").context("cannot stat /proc/self")?.uid() == 0 {
        return Ok(Outcome::Ok);
    }
    bail!(
        "must run as root: the tests and the demo load XDP programs and create network namespaces.\n\
         Run: sudo -E env \"PATH=$PATH\" cargo xtask <command>"
    )
}

fn nightly() -> Result<Outcome> {
    let list = probe("rustup", &["toolchain", "list"]).unwrap_or_default();
    // limiter-agent's build.rs compiles with `rustup run nightly`, so only an undated
    // nightly counts.
    let found = list.lines().filter_map(|l| l.split_whitespace().next()).any(|name| {
        name == "nightly"
            || name.strip_prefix("nightly-").is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
    });
    if found {
        return Ok(Outcome::Ok);
    }
    bail!(
        "no `nightly` toolchain (needed to compile the eBPF program); it cannot be downloaded from here.\n\
         Install it by hand: rustup toolchain install nightly-2026-05-19 --component rust-src\n\
         and make it the one `+nightly` selects: rustup toolchain link nightly \"$(rustc +nightly-2026-05-19 --print sysroot)\""
    )
}

fn rust_src() -> Result<Outcome> {
    let has = |out: Option<String>| out.is_some_and(|o| o.lines().any(|l| l.starts_with("rust-src")));
    if has(probe("rustup", &["component", "list", "--toolchain", "nightly", "--installed"])) {
        return Ok(Outcome::Ok);
    }
    run_cmd(cmd("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("install it by hand: rustup component add rust-src --toolchain nightly")?;
    Ok(Outcome::Installed)
}

/// bpf-linker must use the very LLVM that nightly rustc emits bitcode for; nightly ships
/// it as `libLLVM.so.22.1-rust-<ver>-nightly`, which bpf-linker's build links against.
fn bpf_linker() -> Result<Outcome> {
    let sysroot =
        probe("rustc", &["+nightly", "--print", "sysroot"]).context("`rustc +nightly --print sysroot` failed")?;
    let libdir = Path::new(sysroot.trim()).join("lib");
    let llvm = fs::read_dir(&libdir)
        .with_context(|| format!("cannot read {}", libdir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.22.1-rust-") && n.ends_with("-nightly"))
        })
        .ok_or_else(|| {
            anyhow!("no libLLVM.so.22.1-rust-*-nightly in {}: nightly is not on LLVM 22", libdir.display())
        })?;
    let llvm_name = llvm.file_name().and_then(|n| n.to_str()).context("non-UTF-8 libLLVM name")?.to_owned();
    if linker_ok(&llvm_name) {
        return Ok(Outcome::Ok);
    }
    let prefix = home()?.join(format!(".cache/limiter/llvm-{llvm_name}"));
    let hint = format!(
        "build it by hand:\n  mkdir -p {p}/lib && ln -sf {l} {p}/lib/libLLVM.so && ln -sf {l} {p}/lib/{llvm_name}\n  \
         LLVM_PREFIX={p} cargo install bpf-linker --version =0.13.0 --no-default-features --features llvm-22 --force",
        p = prefix.display(),
        l = llvm.display()
    );
    link_llvm(&prefix.join("lib"), &llvm, &llvm_name).context(hint.clone())?;
    run_cmd(cmd("cargo").env("LLVM_PREFIX", &prefix).args([
        "install",
        "bpf-linker",
        "--version",
        "=0.13.0",
        "--no-default-features",
        "--features",
        "llvm-22",
        "--force",
    ]))
    .context(hint.clone())?;
    if !linker_ok(&llvm_name) {
        bail!("bpf-linker was installed but does not resolve {llvm_name}; {hint}");
    }
    Ok(Outcome::Installed)
}

fn link_llvm(dir: &Path, target: &Path, name: &str) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for link in [dir.join("libLLVM.so"), dir.join(name)] {
        let _ = fs::remove_file(&link);
        symlink(target, &link).with_context(|| format!("cannot link {}", link.display()))?;
    }
    Ok(())
}

/// True when bpf-linker runs and its libLLVM resolves to a file of nightly's LLVM name,
/// so one built against an older nightly (another LLVM) is rebuilt.
fn linker_ok(llvm_name: &str) -> bool {
    let Some(linker) = find_program("bpf-linker") else {
        return false;
    };
    let Some(ldd) = linker.to_str().and_then(|l| probe("ldd", &[l])) else {
        return false;
    };
    let resolved = ldd
        .lines()
        .find(|l| l.contains("libLLVM"))
        .and_then(|l| l.split("=>").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(PathBuf::from);
    resolved.is_some_and(|r| r.is_file() && r.file_name().is_some_and(|n| n == llvm_name))
        && linker.to_str().and_then(|l| probe(l, &["--version"])).is_some()
}

/// `cargo xtask fuzz` and the fuzz part of `cargo xtask test` run the `fuzz/` targets
/// with it (on nightly, which has the sanitizer and coverage flags libFuzzer needs).
fn cargo_fuzz() -> Result<Outcome> {
    if find_program("cargo-fuzz").is_some() {
        return Ok(Outcome::Ok);
    }
    run_cmd(cmd("cargo").args(["install", "cargo-fuzz", "--locked"]))
        .context("install it by hand: cargo install cargo-fuzz --locked")?;
    Ok(Outcome::Installed)
}

/// The cargo-deb `cargo xtask package` runs: pinned, as its options and the
/// maintainer scripts it generates change between releases.
const CARGO_DEB_VERSION: &str = "3.8.0";

/// Installed from source (about 5 minutes here, once), like cargo-fuzz.
fn cargo_deb() -> Result<Outcome> {
    let pinned = format!("cargo-deb {CARGO_DEB_VERSION}");
    if probe("cargo-deb", &["--version"]).is_some_and(|v| v.trim() == pinned) {
        return Ok(Outcome::Ok);
    }
    let version = format!("={CARGO_DEB_VERSION}");
    run_cmd(cmd("cargo").args(["install", "cargo-deb", "--version", &version, "--locked", "--force"]))
        .with_context(|| format!("install it by hand: cargo install cargo-deb --version {version} --locked"))?;
    Ok(Outcome::Installed)
}

/// Commands the tests, demo and bench call, and the Debian package providing each.
const PACKAGES: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("redis-server", "redis-server"),
    // The fleet tests' Sentinel (redis-cli, for the cluster, comes with redis-server).
    ("redis-sentinel", "redis-sentinel"),
    ("bpftool", "bpftool"),
    ("nft", "nftables"),
    ("hping3", "hping3"),
    ("wrk", "wrk"),
    ("trafgen", "netsniff-ng"),
    ("taskset", "util-linux"),
    ("nginx", "nginx"),
    ("promtool", "prometheus"),
    ("openssl", "openssl"),
    ("curl", "curl"),
    ("python3", "python3"),
    // Drives `limiter top --watch`'s screen in the tests, as a terminal would.
    ("tmux", "tmux"),
    // The edge-protocol tests' real peers: a load balancer sending PROXY protocol
    // v2, and an HTTP/2 load generator (also the bench's).
    ("haproxy", "haproxy"),
    ("h2load", "nghttp2-client"),
    // cargo-deb finds the package's Depends with it.
    ("dpkg-shlibdeps", "dpkg-dev"),
];

/// Python modules the tests import, from Debian's packages (see [`debian_python`]).
const PYTHON_MODULES: &[(&str, &str)] = &[("scapy", "python3-scapy"), ("websockets", "python3-websockets")];

/// The first python3 that imports every module of [`PYTHON_MODULES`]: the one on
/// PATH may be a pyenv build that cannot see Debian's packages, while
/// /usr/bin/python3 can.
pub fn debian_python() -> Option<PathBuf> {
    let imports = format!("import {}", PYTHON_MODULES.iter().map(|(module, _)| *module).collect::<Vec<_>>().join(", "));
    [find_program("python3"), Some(PathBuf::from("/usr/bin/python3"))]
        .into_iter()
        .flatten()
        .find(|p| p.to_str().is_some_and(|p| probe(p, &["-c", &imports]).is_some()))
}

fn packages() -> Result<Outcome> {
    let mut missing: Vec<&str> = PACKAGES.iter().filter(|(c, _)| find_program(c).is_none()).map(|(_, p)| *p).collect();
    if debian_python().is_none() {
        missing.extend(PYTHON_MODULES.iter().map(|(_, package)| *package));
    }
    if missing.is_empty() {
        return Ok(Outcome::Ok);
    }
    let hint = format!(
        "install them by hand: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    run_cmd(cmd("apt-get").arg("update")).context(hint.clone())?;
    run_cmd(
        cmd("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing),
    )
    .context(hint.clone())?;
    for service in ["nginx", "redis-server", "redis-sentinel"].into_iter().filter(|s| missing.contains(s)) {
        stop_service(service);
    }
    if let Some((c, _)) = PACKAGES.iter().find(|(c, _)| find_program(c).is_none()) {
        bail!("`{c}` is still missing after apt-get install; {hint}");
    }
    if debian_python().is_none() {
        bail!("python3 cannot import {PYTHON_MODULES:?} after apt-get install; {hint}");
    }
    Ok(Outcome::Installed)
}

/// The packages start their system services, which would hold ports 80 and 6379;
/// tests start private instances. Best effort: any of these may be absent here.
fn stop_service(name: &str) {
    if Path::new("/run/systemd/system").is_dir() {
        let _ = run_cmd(cmd("systemctl").args(["disable", "--now", name]));
    } else {
        let _ = run_cmd(cmd("service").args([name, "stop"]));
        let _ = run_cmd(cmd("update-rc.d").args([name, "disable"]));
    }
    let pidfile = match name {
        "nginx" => "/run/nginx.pid".to_owned(),
        redis => format!("/run/redis/{redis}.pid"),
    };
    if let Ok(pid) = fs::read_to_string(pidfile) {
        let _ = run_cmd(cmd("kill").arg(pid.trim()));
    }
}
