//! The completion scripts and manual pages the binary generates, read by the real
//! shell and the real formatter.

use std::process::{Command, Output};

use limiter_lab::support::{agent::limiter_bin, unique};

const COMMANDS: [&str; 18] = [
    "explain",
    "run",
    "check",
    "reload",
    "stats",
    "top",
    "block",
    "unblock",
    "demote",
    "undemote",
    "verify",
    "unverify",
    "detach",
    "sign",
    "completions",
    "man",
    "help",
    "--config",
];

fn ok(output: Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8")
}

/// What bash's completion function offers for `words`, the last one being completed.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = format!(
        "source <('{bin}' completions bash)\nCOMP_WORDS=({words})\nCOMP_CWORD={cword}\n\
         _limiter limiter '{current}' '{previous}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bin = limiter_bin().display(),
        words = words.join(" "),
        cword = words.len() - 1,
        current = words[words.len() - 1],
        previous = words[words.len() - 2],
    );
    let out = ok(Command::new("bash").args(["--norc", "-c", &script]).output().expect("bash"));
    out.lines().map(str::to_owned).collect()
}

#[test]
fn bash_completes_every_command_and_a_commands_flags() {
    let mut offered = bash_completes(&["limiter", ""]);
    offered.sort();
    for command in COMMANDS {
        assert!(offered.iter().any(|o| o == command), "{command} not offered: {offered:?}");
    }
    assert_eq!(bash_completes(&["limiter", "st"]), ["stats"]);
    let flags = bash_completes(&["limiter", "stats", "--"]);
    for flag in ["--json", "--watch", "--config"] {
        assert!(flags.iter().any(|f| f == flag), "{flag} not offered after stats: {flags:?}");
    }
}

#[test]
fn every_shell_gets_a_script_naming_the_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = ok(Command::new(limiter_bin()).args(["completions", shell]).output().expect("limiter"));
        for command in ["stats", "sign", "unverify"] {
            assert!(script.contains(command), "{shell} script lacks {command}");
        }
    }
    let refused = Command::new(limiter_bin()).args(["completions", "tcsh"]).output().expect("limiter");
    assert_eq!(refused.status.code(), Some(2), "an unknown shell is a usage error");
}

#[test]
fn the_manual_pages_format_without_warnings_and_cover_every_command() {
    let dir = std::env::temp_dir().join(unique("limiter-man"));
    ok(Command::new(limiter_bin()).args(["man", "--dir"]).arg(&dir).output().expect("limiter"));
    for command in COMMANDS.iter().filter(|c| !matches!(**c, "help" | "--config")) {
        let page = dir.join(format!("limiter-{command}.1"));
        // -ww: every warning; -z: format, print nothing. A warning means a broken page.
        let formatted = Command::new("groff").args(["-man", "-Tutf8", "-ww", "-z"]).arg(&page).output().expect("groff");
        assert!(
            formatted.status.success() && formatted.stderr.is_empty(),
            "{}: {}",
            page.display(),
            String::from_utf8_lossy(&formatted.stderr)
        );
    }
    let page = ok(Command::new(limiter_bin()).arg("man").output().expect("limiter"));
    let text = ok(Command::new("groff")
        .args(["-man", "-Tutf8", "-P", "-cbou"])
        .stdin(std::fs::File::open(dir.join("limiter.1")).expect("limiter.1"))
        .output()
        .expect("groff"));
    assert_eq!(page, std::fs::read_to_string(dir.join("limiter.1")).expect("limiter.1"), "stdout and --dir agree");
    for command in COMMANDS.iter().filter(|c| !matches!(**c, "help" | "--config")) {
        assert!(text.contains(&format!("limiter-{command}(1)")), "limiter(1) does not list {command}:\n{text}");
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
