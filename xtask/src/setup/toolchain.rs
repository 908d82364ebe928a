//! The steps that come before any build: root, the nightly toolchain with rust-src,
//! and bpf-linker on nightly's own LLVM. Each only probes when its part is there.

use std::{
    fs,
    os::unix::fs::{MetadataExt, symlink},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};

use super::Outcome;
use crate::util::{cmd, find_program, home, probe, run as run_cmd};

/// A step that runs in the foreground, in this order (root first: apt needs it, and a
/// refusal should come before anything starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Root,
    Nightly,
    RustSrc,
    BpfLinker,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Root => "root",
            Step::Nightly => "nightly",
            Step::RustSrc => "rust-src",
            Step::BpfLinker => "bpf-linker",
        }
    }

    pub fn run(self) -> Result<Outcome> {
        match self {
            Step::Root => root(),
            Step::Nightly => nightly(),
            Step::RustSrc => rust_src(),
            Step::BpfLinker => bpf_linker(),
        }
    }
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
/// it as libLLVM.so.22.1-rust-<ver>-nightly, which bpf-linker's build links against.
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
         LLVM_PREFIX={p} CARGO_PROFILE_RELEASE_DEBUG=false cargo install bpf-linker --version =0.13.0 --no-default-features --features llvm-22 --force",
        p = prefix.display(),
        l = llvm.display()
    );
    link_llvm(&prefix.join("lib"), &llvm, &llvm_name).context(hint.clone())?;
    // No debug info: bpf-linker's release profile asks for full debug info, which cost
    // a fifth of its build's CPU time (measured: 194 s of user time with it, 152 s
    // without) and serves nobody here.
    run_cmd(cmd("cargo").env("LLVM_PREFIX", &prefix).env("CARGO_PROFILE_RELEASE_DEBUG", "false").args([
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
        // Replaced only when it points elsewhere: a bpf-linker running now resolves
        // its libLLVM through it.
        if fs::read_link(&link).is_ok_and(|to| to == target) {
            continue;
        }
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
