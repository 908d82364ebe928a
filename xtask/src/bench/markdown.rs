//! `report.md`: the run's environment, the targets, then one section per group.

use std::fmt::Write as _;

use limiter_lab::report::{Outcome, Report};

use super::{algorithms, flood, hmac, http, http2, memory, store, xdp};

fn met_label(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured",
    }
}

pub fn summary_table(report: &Report) -> String {
    let mut s = String::from("| target | goal | measured | |\n|---|---|---|---|\n");
    for t in &report.targets {
        let _ = writeln!(s, "| {} | {} | {} | {} |", t.target, t.goal, t.measured, met_label(t.met));
    }
    s
}

/// A group's section, or a line saying why it has none.
fn section<T>(m: &mut String, title: &str, outcome: &Outcome<T>, write: fn(&mut String, &T)) {
    match outcome {
        Outcome::Measured(value) => write(m, value),
        Outcome::Failed { error } => {
            let _ = writeln!(m, "## {title}\n\nNot measured: {error}\n");
        }
    }
}

pub fn markdown(report: &Report) -> String {
    let env = &report.environment;
    let tool =
        |version: &str, name: &str| if version.is_empty() { format!("{name} missing") } else { version.to_owned() };
    let mut m = String::new();
    let _ = writeln!(m, "# limiter benchmark report ({} run)\n", report.run);
    let _ = writeln!(
        m,
        "Kernel {}, CPU {}, {} cores, {}; load average at start {}. {}; {}; {}; {}; {}; {}.\n",
        env.kernel,
        env.cpu,
        env.cores,
        env.memory.as_deref().unwrap_or("?"),
        env.loadavg_at_start,
        env.rustc,
        env.nginx,
        env.wrk,
        tool(&env.oha, "oha"),
        tool(&env.h2load, "h2load"),
        env.nft,
    );
    let _ = writeln!(
        m,
        "Reproduce: `cargo xtask bench{}` (as root).\n",
        if report.run == "quick" { " --quick" } else { "" }
    );
    let _ = writeln!(m, "## Targets\n\n{}", summary_table(report));
    section(&mut m, xdp::TITLE, &report.xdp_cost, xdp::markdown);
    section(&mut m, flood::TITLE, &report.flood, flood::markdown);
    section(&mut m, flood::RANDOM_TITLE, &report.random_flood, flood::markdown);
    section(&mut m, http::TITLE, &report.http, http::markdown);
    section(&mut m, http2::TITLE, &report.http2, http2::markdown);
    section(&mut m, algorithms::TITLE, &report.algorithms, algorithms::markdown);
    section(&mut m, hmac::TITLE, &report.hmac, hmac::markdown);
    section(&mut m, memory::TITLE, &report.memory, memory::markdown);
    section(&mut m, store::TITLE, &report.store, store::markdown);

    let _ = writeln!(m, "\n## Commands\n\n```");
    for c in &report.commands {
        let _ = writeln!(m, "{c}");
    }
    let _ = writeln!(m, "```");
    if !report.errors.is_empty() {
        let _ = writeln!(m, "\n## Errors\n");
        for e in &report.errors {
            let _ = writeln!(m, "- {e}");
        }
    }
    m
}
