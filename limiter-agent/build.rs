//! Compiles the XDP program (`limiter-ebpf`) for the BPF target with nightly and
//! bpf-linker; the agent embeds the object with `include_bytes_aligned!`.
//!
//! The nested build is aya-build's `build_ebpf` (0.2.0), written out for two reasons:
//! it forwards every line of the nested cargo as `cargo:warning=`, which buried real
//! warnings under hundreds of `Compiling …` lines, and it leaves the BPF CPU to the
//! target's default (rustc hands bpf-linker `--cpu generic`). Here the output is kept
//! unless the build fails (then all of it is printed) or the eBPF crate has warnings
//! (then those are), and the CPU is explicit.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

const PACKAGE: &str = "limiter-ebpf";
/// The binary target of [`PACKAGE`], copied to `$OUT_DIR/limiter`.
const BINARY: &str = "limiter";
/// The BPF instruction set, as `-C target-cpu` (rustc passes it on to bpf-linker as
/// `--cpu`): v1, what the target's default `generic` means on LLVM 22, named so that
/// a toolchain update cannot change what the verifier sees. The 64-bit BPF_CMPXCHG
/// that updates a source's bucket (`limiter-ebpf/src/atomic.rs`) does not depend on
/// it: LLVM emits it at every version, and it needs kernel 5.12. v3 (32-bit
/// sub-registers and jumps) was measured: 3459 instructions instead of 3487, no
/// per-packet difference in `xdp_cost` beyond noise, and about 0.2 s more verifier
/// time on every load, which the kernel tests pay some thirty times.
const BPF_CPU: &str = "v1";
/// Where the nested build goes, if not beside the agent's own build.
const EBPF_TARGET_DIR: &str = "LIMITER_EBPF_TARGET_DIR";

fn main() {
    // Printed by hand: returning the error would add a backtrace whenever
    // RUST_BACKTRACE is set (as `cargo xtask test` does), burying the compiler's output.
    if let Err(error) = build() {
        eprintln!("{error:#}");
        std::process::exit(1);
    }
}

fn build() -> anyhow::Result<()> {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../limiter-ebpf");
    // The build-dependency on the eBPF crate only covers its library side; this
    // covers its binary.
    println!("cargo:rerun-if-changed={}", root_dir.display());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let endian = if env::var("CARGO_CFG_TARGET_ENDIAN")? == "big" { "bpfeb" } else { "bpfel" };
    let target = format!("{endian}-unknown-none");
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    // One nested target directory for every build of the agent with this profile (they
    // differ in OUT_DIR whenever features unify differently, and each would otherwise
    // compile core and the program from scratch). Not the outer target directory
    // itself: cargo holds its lock (rust-lang/cargo#6412).
    // `cargo xtask test` checks the docs in a target directory of its own, alongside
    // the tests' build: it names this one, so that the program is built once.
    println!("cargo:rerun-if-env-changed={EBPF_TARGET_DIR}");
    let target_dir = env::var_os(EBPF_TARGET_DIR).map_or_else(|| out_dir.join("../../ebpf"), PathBuf::from);

    let rustflags = [
        format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2".to_owned(),
        "-Clink-arg=--btf".to_owned(),
        format!("-Ctarget-cpu={BPF_CPU}"),
    ]
    .join("\x1f");
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", "nightly", "cargo", "build", "--package", PACKAGE, "--bins", "--release", "--target", &target])
        .args(["-Z", "build-std=core", "--message-format=short", "--target-dir"])
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // The outer build's compiler is stable; the nested one must be nightly's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = cargo.output().with_context(|| format!("cannot run {cargo:?}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprintln!("{stderr}");
        bail!("{cargo:?} failed: {}", output.status);
    }
    for line in stderr.lines().filter(|l| l.starts_with("warning") || l.contains(": warning:")) {
        println!("cargo:warning={line}");
    }
    let binary = target_dir.join(&target).join("release").join(BINARY);
    fs::copy(&binary, out_dir.join(BINARY))
        .with_context(|| format!("cannot copy {} to {}", binary.display(), out_dir.display()))?;
    Ok(())
}
