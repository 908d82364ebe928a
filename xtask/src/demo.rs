//! `cargo xtask demo`: the namespace lab of `limiter-agent/examples/demo.rs`, run on
//! `config/demo.toml` with the freshly built agent.

use crate::util;

pub fn run() -> anyhow::Result<()> {
    util::run(util::cmd("cargo").args(["build", "--quiet", "-p", "limiter-agent", "--example", "demo"]))?;
    let target = util::target_dir();
    util::run(
        util::cmd(target.join("debug/examples/demo"))
            .arg(target.join("debug/limiter"))
            .arg(util::workspace_root().join("config/demo.toml")),
    )
}
