use which::which;

/// Rebuilds the program when bpf-linker changes. The BPF CPU version is chosen by the
/// build that compiles this crate, limiter-agent's build.rs.
fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
}
