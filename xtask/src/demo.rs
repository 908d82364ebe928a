//! `cargo xtask demo`: the namespace lab (to be written).

pub fn run() -> anyhow::Result<()> {
    eprintln!("demo: not yet implemented");
    std::process::exit(2)
}
