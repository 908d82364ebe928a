//! `limiter top --watch` on a real terminal: tmux runs it, types into it and reads its
//! screen. Without an agent or pinned maps, the screen says so and still answers keys.

use std::process::Command;

use limiter_lab::support::{agent::limiter_bin, unique, wait::until};

fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux").args(args).output().expect("tmux (cargo xtask setup installs it)")
}

/// Ends the tmux session however the test ends.
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.0]);
    }
}

/// What the terminal shows.
fn capture(session: &str) -> String {
    String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", session]).stdout).into_owned()
}

/// The screen once `want` is on it.
fn screen_with(session: &str, want: &str) -> String {
    until(&format!("{want:?} on the screen"), || capture(session), |screen| screen.contains(want))
}

#[test]
fn the_screen_sorts_on_s_and_quits_on_q() {
    let name = unique("top");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("limiter.toml");
    let text =
        format!("[agent]\npin_dir = \"{0}/pins\"\nadmin_socket = \"{0}/admin.sock\"\nmetrics = \"\"\n", dir.display());
    std::fs::write(&config, text).expect("config");
    let command = format!("{} top --watch 1 -c {}", limiter_bin().display(), config.display());
    let started = tmux(&["new-session", "-d", "-s", &name, "-x", "90", "-y", "20", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let _session = Session(name.clone());

    let screen = screen_with(&name, "sorted by rate");
    assert!(screen.contains("limiter top · every 1 s · sorted by rate · s: sort · q: quit"), "{screen}");
    assert!(
        screen.contains("kernel layer: no pinned maps") && screen.contains("proxy: agent not reachable"),
        "{screen}"
    );
    tmux(&["send-keys", "-t", &name, "s"]);
    let screen = screen_with(&name, "sorted by drops");
    assert!(screen.contains("sorted by drops"), "{screen}");
    tmux(&["send-keys", "-t", &name, "q"]);
    let running = || tmux(&["has-session", "-t", &name]).status.success().then(|| capture(&name));
    until("q to quit the screen", running, Option::is_none);
    let _ = std::fs::remove_dir_all(&dir);
}
