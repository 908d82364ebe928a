use which::which;

/// Rebuilds the program when bpf-linker changes, and asks it for BPF v3 code: the
/// per-source bucket is updated with a 64-bit compare-and-swap (BPF_CMPXCHG, kernel
/// 5.12+), which older instruction sets cannot express.
fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
}
