//! Running external commands the same way everywhere: echoed first, from the
//! workspace root, with cargo's bin directory on PATH.

use std::{
    env,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

pub fn workspace_root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

pub fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

pub fn home() -> Result<PathBuf> {
    env::var_os("HOME").map(PathBuf::from).context("HOME is not set")
}

pub fn cargo_bin_dir() -> Result<PathBuf> {
    let home = match env::var_os("CARGO_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => home()?.join(".cargo"),
    };
    Ok(home.join("bin"))
}

/// PATH plus the places a root shell (sudo's secure_path) may leave out: cargo install
/// puts bpf-linker in ~/.cargo/bin, and rustc must find it there to link the eBPF object.
fn search_path() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::split_paths(&env::var_os("PATH").unwrap_or_default()).collect();
    let extra = cargo_bin_dir().into_iter().chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from));
    for dir in extra {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

pub fn find_program(name: &str) -> Option<PathBuf> {
    search_path().into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

pub fn cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.current_dir(workspace_root());
    if let Ok(path) = env::join_paths(search_path()) {
        c.env("PATH", path);
    }
    c
}

pub fn show(c: &Command) -> String {
    let mut s = String::from("$");
    for (k, v) in c.get_envs() {
        if k != "PATH" {
            s += &format!(" {}={}", k.to_string_lossy(), v.map(|v| v.to_string_lossy()).unwrap_or_default());
        }
    }
    s += &format!(" {}", c.get_program().to_string_lossy());
    for a in c.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(' ') { s += &format!(" '{a}'") } else { s += &format!(" {a}") }
    }
    s
}

/// Echoes and runs a command; a non-zero exit is an error.
pub fn run(c: &mut Command) -> Result<()> {
    let line = show(c);
    println!("{line}");
    let status = c.status().with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{}` failed: {status}", line.trim_start_matches("$ "));
    }
    Ok(())
}

/// Output of a probe; None when it cannot start or exits non-zero.
pub fn probe(program: &str, args: &[&str]) -> Option<String> {
    let out = cmd(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Always `-p limiter-agent`: building other package sets unifies features differently
/// and would rebuild the agent each time `build`, `run` and `install` alternate.
pub fn cargo_build(release: bool) -> Result<()> {
    let mut c = cmd("cargo");
    c.args(["build", "-p", "limiter-agent"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)
}

pub fn exec(program: &Path, args: &[String]) -> Result<()> {
    let mut c = cmd(program);
    c.args(args);
    println!("{}", show(&c));
    let err = c.exec();
    Err(err).with_context(|| format!("cannot exec {}", program.display()))
}

/// Held by the tests that drive the namespace lab and time what they see (the demo,
/// the bench smoke run), so that they do not skew each other's figures, and by the
/// package test, whose cargo-deb and man-db runs would take the CPU from under them.
#[cfg(test)]
pub static LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());
