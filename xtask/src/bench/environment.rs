//! The machine and tool versions a run reports next to its figures.

use std::{fs, process::Command, thread};

use limiter_lab::report::Environment;

use crate::util::cmd;

/// Through [`cmd`]'s PATH, which has cargo's bin directory, where oha is.
fn first_line(program: &str, args: &[&str]) -> String {
    cmd(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().trim().to_owned())
        .unwrap_or_default()
}

pub fn environment() -> Environment {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu =
        cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or("?").trim();
    let nginx = Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
        .unwrap_or_default();
    Environment {
        kernel: first_line("uname", &["-r"]),
        cpu: cpu.to_owned(),
        cores: thread::available_parallelism().map_or(1, usize::from),
        memory: fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .nth(1)
            .map(|kb| format!("{} MiB", kb.parse::<u64>().unwrap_or(0) / 1024)),
        loadavg_at_start: fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_owned(),
        rustc: first_line("rustc", &["--version"]),
        nginx,
        wrk: first_line("wrk", &["-v"]),
        oha: first_line("oha", &["--version"]),
        h2load: first_line("h2load", &["--version"]),
        nft: first_line("nft", &["--version"]),
        trafgen: first_line("trafgen", &["-v"]),
    }
}
