//! Compiles the XDP program (`limiter-ebpf`) for the BPF target with nightly and
//! bpf-linker; the agent embeds the object with `include_bytes_aligned!`.

fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../limiter-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package { name: "limiter-ebpf", root_dir, ..Default::default() }],
        aya_build::Toolchain::default(),
    )
}
