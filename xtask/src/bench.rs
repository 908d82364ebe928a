//! `cargo xtask bench`: the benchmarks (to be written).

pub fn run() -> anyhow::Result<()> {
    eprintln!("bench: not yet implemented");
    std::process::exit(2)
}
