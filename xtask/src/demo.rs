//! `cargo xtask demo`: the namespace lab of `limiter-agent/examples/demo.rs`, run on
//! `config/demo.toml` with the freshly built agent.

use crate::{
    setup::{HPING3, IP, Needs, Pending, ROOT_AND_BUILD},
    util,
};

/// Root to load XDP and create the lab's namespace; the lab calls `ip` and floods from
/// random sources with `hping3`.
pub const NEEDS: Needs = Needs { steps: ROOT_AND_BUILD, debian: &[IP, HPING3], cargo: &[] };

pub fn run(setup: Pending) -> anyhow::Result<()> {
    // One build of both: the example's dev-dependencies turn on features (tokio's
    // test-util) that a build of the binary alone leaves off, and two builds compiled
    // tokio and everything above it twice.
    util::run(util::cmd("cargo").args(["build", "-p", "limiter-agent", "--bin", "limiter", "--example", "demo"]))?;
    setup.finish()?;
    let target = util::target_dir();
    util::run(
        util::cmd(target.join("debug/examples/demo"))
            .arg(target.join("debug/limiter"))
            .arg(util::workspace_root().join("config/demo.toml")),
    )
}

#[cfg(test)]
mod tests {
    use crate::util;

    /// The demo end to end, with the debug builds `cargo xtask test` has just made:
    /// what a newcomer's first command shows must keep working. Needs root.
    #[test]
    fn demo_runs_and_shows_every_layer_working() {
        let _lab = util::LAB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let target = util::target_dir().join("debug");
        let demo = target.join("examples/demo");
        assert!(demo.is_file(), "run through `cargo xtask test` (cargo test --workspace builds the examples)");
        let output = util::cmd(&demo)
            .arg(target.join("limiter"))
            .arg(util::workspace_root().join("config/demo.toml"))
            .output()
            .expect("run the demo");
        let shown = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{shown}{}", String::from_utf8_lossy(&output.stderr));
        assert!(shown.contains("xdp.limit: 1000 pps, burst 200 -> 250 pps, burst 200"), "{shown}");
        assert_eq!(shown.matches("50/50").count(), 5, "the polite flow lost packets:\n{shown}");
        assert!(shown.contains("xdp.new_sources: off -> 100 pps, burst 100"), "{shown}");
        let budget_row = shown.lines().find(|l| l.starts_with("new-source budget 100/s")).expect("budget row");
        let admitted: u64 = budget_row.split_whitespace().nth(3).and_then(|n| n.parse().ok()).expect("admitted");
        // The burst plus 100 a second over a flood of well under 10 s.
        assert!(admitted <= 1_100, "the budget let {admitted} spoofed packets through:\n{shown}");
        let reflection = shown.lines().find(|l| l.starts_with("reflection to closed ports")).expect("reflection row");
        let cells: Vec<&str> = reflection.split_whitespace().collect();
        // Every packet of the flood dropped by the service policy, none by a bucket.
        assert_eq!(cells[4..], ["20000", "20000", "50/50"], "{reflection}");
        assert!(
            shown.contains("80 forwarded at once, 20 forwarded after the 50 ms throttle delay, 5 rejected"),
            "{shown}"
        );
        assert!(shown.contains("[200, 200, 200, 200, 200, 429, 429]"), "{shown}");
        assert!(
            shown.contains("one each (10/h per username, case folded): [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429]; bob: 200"),
            "{shown}"
        );
        assert!(
            shown.contains("valid 200, same request again (replay) 401, body changed after signing 401"),
            "{shown}"
        );
        assert!(shown.contains("GET /api/items as sqlmap: 403 (deny rule scanner-user-agents)"), "{shown}");
        assert!(
            shown.contains("while 9 free wait; the upstream saw: free pro pro pro free free free free free free free free free\n  answers: 13 of 13 with 200"),
            "{shown}"
        );
        let suggested = shown.split("$ limiter suggest").nth(1).expect("a suggest table");
        let login = suggested.lines().find(|l| l.starts_with("rule login ")).expect("the login rule's row");
        let cells: Vec<&str> = login.split_whitespace().collect();
        // One client with 7 POSTs in a minute against 5 (over, and 7 × 1.5 suggested),
        // and 11 with one each: the stuffing addresses the per-username rule admitted.
        assert_eq!(cells[2..], ["5/60s", "12", "1", "7", "7", "7", "1", "11"], "{login}");
        let explained = shown.split("$ limiter explain").nth(1).expect("the demo ends with an explain");
        assert!(explained.contains("proxy: /login from 127.0.0.1 (no key)\n  now: reject (retry after "), "{shown}");
        assert!(explained.lines().any(|l| l.contains("login") && l.ends_with("remaining 0  refuses")), "{shown}");
    }
}
