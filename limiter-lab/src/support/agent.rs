//! The `limiter` binary run as the agent, with a private config, pins and socket.

use std::{
    fmt::Debug,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::{Duration, Instant},
};

use limiter::xdp::KernelMaps;
use limiter_common::counters::Counter;

use super::wait::{PATIENCE, poll, timed_out};

/// A running `limiter run`, stopped and cleaned up on drop.
#[derive(Debug)]
pub struct AgentProcess {
    pub child: Option<Child>,
    /// The agent `limiter upgrade` started, which serves once `child` has handed
    /// over (not our child: it is stopped by pid).
    pub upgraded: Option<u32>,
    /// The binary `spawn` starts.
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub pin_dir: PathBuf,
    pub socket: PathBuf,
}

/// The `limiter` binary of the test being run. Cargo sets the variable for the
/// integration tests of limiter-agent, at run time too, which is when this crate (a
/// dependency, built before the binary) can read it.
pub fn limiter_bin() -> PathBuf {
    std::env::var_os("CARGO_BIN_EXE_limiter")
        .map(PathBuf::from)
        .expect("CARGO_BIN_EXE_limiter is not set: run through cargo test -p limiter-agent")
}

/// `[agent]` for a test: private pins and socket, no metrics unless asked.
pub fn agent_section(name: &str, extra: &str) -> String {
    let metrics = if extra.contains("metrics =") { "" } else { "metrics = \"\"\n" };
    format!("[agent]\npin_dir = \"/sys/fs/bpf/{name}\"\nadmin_socket = \"/tmp/{name}/admin.sock\"\n{metrics}{extra}\n")
}

impl AgentProcess {
    /// Writes `config` (which must use [`agent_section`] with `name`) and starts the
    /// agent; returns once it answers on its admin socket.
    pub fn start(name: &str, config: &str) -> Self {
        Self::start_with(name, config, limiter_bin(), |_| {})
    }

    /// As [`AgentProcess::start`], with the binary `bin` (in [`Self::dir_of`]
    /// `name`, say, to be replaced there) and `prepare` applied to its command
    /// first (descriptors to pass, say).
    pub fn start_with(name: &str, config: &str, bin: PathBuf, prepare: impl FnOnce(&mut Command)) -> Self {
        let dir = Self::dir_of(name);
        std::fs::create_dir_all(&dir).expect("test dir");
        let config_path = dir.join("limiter.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut agent = Self {
            child: None,
            upgraded: None,
            bin,
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/{name}")),
            socket: dir.join("admin.sock"),
            config_path,
            dir,
        };
        agent.spawn_with(prepare);
        agent
    }

    /// The directory of the agent named `name`: its config, socket and log, removed on drop.
    #[must_use]
    pub fn dir_of(name: &str) -> PathBuf {
        PathBuf::from(format!("/tmp/{name}"))
    }

    /// Starts (again) the agent process on the same config and pins.
    pub fn spawn(&mut self) {
        self.spawn_with(|_| {});
    }

    fn spawn_with(&mut self, prepare: impl FnOnce(&mut Command)) {
        let log = std::fs::File::create(self.dir.join("agent.log")).expect("log file");
        let mut command = Command::new(&self.bin);
        command.args(["run", "-c"]).arg(&self.config_path).env("LIMITER_LOG", "info").stdout(Stdio::null()).stderr(log);
        prepare(&mut command);
        self.child = Some(command.spawn().expect("start limiter run"));
        self.wait_ready();
    }

    /// `limiter upgrade`. Once it succeeds the new agent's pid is kept (it is
    /// stopped on drop) and the old process's exit awaited: its status comes back
    /// with the command's output, `None` if the upgrade failed.
    pub fn upgrade(&mut self) -> (Output, Option<ExitStatus>) {
        let output = self.cli(&["upgrade"]);
        if !output.status.success() {
            return (output, None);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let pid = stdout
            .split_whitespace()
            .skip_while(|word| *word != "pid")
            .nth(1)
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no pid in `{stdout}`"));
        self.upgraded = Some(pid);
        let old = self.child.take().expect("the old agent").wait().expect("wait for the old agent");
        (output, Some(old))
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("agent exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "agent did not come up: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// Runs a `limiter` CLI command against this agent's config.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(limiter_bin()).args(args).arg("-c").arg(&self.config_path).output().expect("run limiter")
    }

    /// `limiter <args> --json`, parsed.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let output = self.cli(args);
        assert!(output.status.success(), "limiter {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).expect("JSON output")
    }

    /// What `look` sees once `done` holds of it (see [`super::wait::until`]), failing
    /// with the agent's log too: the agent may act on what it was told (a watcher's
    /// reload, a fleet's block) or count a packet after the command or the client
    /// that caused it is done.
    pub fn until<T: Debug>(&self, what: &str, look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> T {
        poll(look, done)
            .unwrap_or_else(|last| timed_out(&format!("{what} (agent log:\n{})", self.log()), PATIENCE, &last))
    }

    /// `limiter <args> --json` once `done` holds of it.
    pub fn json_until(
        &self,
        args: &[&str],
        what: &str,
        done: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.until(what, || self.cli_json(args), done)
    }

    /// `limiter stats --json` once `done` holds of it.
    pub fn stats_until(&self, what: &str, done: impl FnMut(&serde_json::Value) -> bool) -> serde_json::Value {
        self.json_until(&["stats", "--json"], what, done)
    }

    /// The kernel layer's `counter`, read from the pins.
    pub fn counter(&self, counter: Counter) -> u64 {
        KernelMaps::open_pinned(&self.pin_dir).expect("pinned maps").counter_snapshot().expect("counters").get(counter)
    }

    /// Writes `config` to a new file and runs `limiter reload -c` on it. The agent
    /// adopts that file, and its watcher (which would reload an edited file by
    /// itself, racing the command) sees no edit: the printed changes are this
    /// command's.
    pub fn reload_with(&mut self, config: &str) -> Output {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.config_path = self.dir.join(format!("reload-{n}.toml"));
        self.write_config(config);
        self.cli(&["reload"])
    }

    /// Replaces the config file's text.
    pub fn write_config(&self, config: &str) {
        let mut file = std::fs::File::create(&self.config_path).expect("config");
        file.write_all(config.as_bytes()).expect("write config");
    }

    /// Sends `signal` and waits for the process to exit.
    pub fn stop_with(&mut self, signal: i32) -> ExitStatus {
        let mut child = self.child.take().expect("agent running");
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(pid, signal) };
        child.wait().expect("wait for agent")
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = self.upgraded.take().and_then(|pid| i32::try_from(pid).ok()) {
            // SAFETY: plain kill(2) on the agent our child started; it is not ours
            // to wait for, so wait for it to be gone before its pins are removed.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = poll(|| alive(pid), |alive| !alive);
        }
        let _ = limiter::xdp::detach_all(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` runs: a zombie, waiting for whoever adopted it to reap it,
/// does not.
#[must_use]
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("State:") && !line.contains("Z (zombie)")))
}
