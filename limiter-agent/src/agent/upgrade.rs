//! Handing the running agent's sockets to a new one, so that an upgrade refuses no
//! connection: `limiter upgrade` and SIGUSR2 start the binary on disk with the
//! listening sockets (and the agent's locks) as inherited descriptors, named the way
//! systemd's socket activation names them (`LISTEN_FDS`, `LISTEN_FDNAMES`; see
//! [`limiter_core::inherited`]), plus a pipe the new agent reports on: `ready` once
//! it serves, or why it could not start. The old agent drains only after `ready`;
//! until then, and if the new one never gets there, it serves as before.
//!
//! Both agents hold the same listening socket (one open file description) during
//! the hand-over, so a connection the old one no longer accepts waits in the
//! socket's queue for the new one instead of being refused.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
        unix::process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use limiter_core::inherited::{self, FIRST_FD, ListenEnv};

/// How long the new agent has to report `ready`: loading the XDP program and
/// connecting to Redis take seconds at most.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the new agent writes on the pipe once it serves.
const READY: &str = "ready";

/// What a descriptor passed is, by its name in `LISTEN_FDNAMES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// The proxy's listening socket (`FileDescriptorName=proxy` in a `.socket` unit).
    Proxy,
    /// The metrics endpoint's listening socket.
    Metrics,
    /// The admin socket's listening socket.
    Admin,
    /// The `flock`ed `<admin_socket>.lock`: the same lock, so that no other agent
    /// can start between the two.
    Lock,
    /// The `flock`ed pin dir.
    PinLock,
    /// Where the new agent reports (an upgrade's alone).
    Ready,
    /// The old agent's stderr, which the new one takes for its own once it serves:
    /// until then its stderr is a pipe the old one reads, so that a failed start's
    /// last lines are reported (an upgrade's alone).
    Stderr,
}

impl Passed {
    const ALL: [Self; 7] =
        [Self::Proxy, Self::Metrics, Self::Admin, Self::Lock, Self::PinLock, Self::Ready, Self::Stderr];

    const fn name(self) -> &'static str {
        match self {
            Self::Proxy => "proxy",
            Self::Metrics => "metrics",
            Self::Admin => "admin",
            Self::Lock => "lock",
            Self::PinLock => "pin_lock",
            Self::Ready => "ready",
            Self::Stderr => "stderr",
        }
    }
}

/// Why the descriptors could not be taken or handed over.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Env(#[from] inherited::InheritedError),
    #[error("LISTEN_FDNAMES: `{0}` is none of proxy, metrics, admin, lock, pin_lock, ready, stderr")]
    Unknown(String),
    #[error("LISTEN_FDS: descriptor {0} is not open")]
    Closed(RawFd),
    #[error("the inherited {name} socket: {source}")]
    Socket {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the inherited proxy socket listens on {inherited}, but proxy.listen is {configured} (a restart applies a new listen)"
    )]
    ListenMoved { inherited: std::net::SocketAddr, configured: std::net::SocketAddr },
    #[error("the binary to start: {0}")]
    Exe(#[source] std::io::Error),
    #[error("cannot start {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the new agent ({exe}, pid {pid}) failed to start: {why}; this agent serves on")]
    Failed { exe: PathBuf, pid: u32, why: String },
    #[error(
        "the new agent ({exe}, pid {pid}) was not ready within {READY_TIMEOUT:?} and was killed; this agent serves on"
    )]
    NotReady { exe: PathBuf, pid: u32 },
}

/// The descriptors this agent was started with, each taken once.
#[derive(Debug, Default)]
pub struct Inherited {
    fds: Vec<(Passed, OwnedFd)>,
}

impl Inherited {
    /// Takes the descriptors the environment names. A lone descriptor of another
    /// name is the proxy's: systemd names one after its unit unless told
    /// `FileDescriptorName=proxy`.
    ///
    /// Called once, before anything else opens a descriptor: it takes ownership of
    /// the numbers the variables name.
    pub fn from_env() -> Result<Self, UpgradeError> {
        let var = |name| std::env::var(name).ok();
        let (pid, fds, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
        let env =
            ListenEnv { listen_pid: pid.as_deref(), listen_fds: fds.as_deref(), listen_fdnames: names.as_deref() };
        let named = inherited::parse(env, std::process::id())?;
        let lone = named.len() == 1;
        let mut taken = Self::default();
        for inherited::Named { name, fd } in named {
            let passed = match Passed::ALL.into_iter().find(|p| p.name() == name) {
                Some(passed) => passed,
                None if lone => Passed::Proxy,
                None => return Err(UpgradeError::Unknown(name)),
            };
            // SAFETY: fcntl on a number only reads or sets its flags. An open
            // descriptor is ours alone from here: the variables hand it to this
            // process, and nothing else in it has taken that number.
            let owned = unsafe {
                if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == -1 {
                    return Err(UpgradeError::Closed(fd));
                }
                OwnedFd::from_raw_fd(fd)
            };
            taken.fds.push((passed, owned));
        }
        Ok(taken)
    }

    /// The descriptor named `passed`, if one was and it is not taken yet.
    pub fn take(&mut self, passed: Passed) -> Option<OwnedFd> {
        let at = self.fds.iter().position(|(p, _)| *p == passed)?;
        Some(self.fds.swap_remove(at).1)
    }

    /// The inherited proxy socket, checked to listen where `listen` says.
    pub fn proxy(&mut self, listen: std::net::SocketAddr) -> Result<Option<std::net::TcpListener>, UpgradeError> {
        let Some(listener) = self.tcp(Passed::Proxy)? else { return Ok(None) };
        let inherited = listener.local_addr().map_err(|source| UpgradeError::Socket { name: "proxy", source })?;
        let port_matches = listen.port() == 0 || listen.port() == inherited.port();
        if inherited.ip() != listen.ip() || !port_matches {
            return Err(UpgradeError::ListenMoved { inherited, configured: listen });
        }
        Ok(Some(listener))
    }

    /// The inherited metrics socket, registered with the running runtime.
    pub fn metrics(&mut self) -> Result<Option<tokio::net::TcpListener>, UpgradeError> {
        let Some(listener) = self.tcp(Passed::Metrics)? else { return Ok(None) };
        tokio::net::TcpListener::from_std(listener)
            .map(Some)
            .map_err(|source| UpgradeError::Socket { name: "metrics", source })
    }

    /// The inherited admin socket, registered with the running runtime.
    pub fn admin(&mut self) -> Result<Option<tokio::net::UnixListener>, UpgradeError> {
        let Some(fd) = self.take(Passed::Admin) else { return Ok(None) };
        let listener = std::os::unix::net::UnixListener::from(fd);
        let error = |source| UpgradeError::Socket { name: "admin", source };
        listener.set_nonblocking(true).map_err(error)?;
        tokio::net::UnixListener::from_std(listener).map(Some).map_err(error)
    }

    /// Where to report `ready`, for an upgrade.
    pub fn ready(&mut self) -> Option<Ready> {
        let pipe = File::from(self.take(Passed::Ready)?);
        Some(Ready { pipe, stderr: self.take(Passed::Stderr) })
    }

    fn tcp(&mut self, passed: Passed) -> Result<Option<std::net::TcpListener>, UpgradeError> {
        let Some(fd) = self.take(passed) else { return Ok(None) };
        let listener = std::net::TcpListener::from(fd);
        listener.set_nonblocking(true).map_err(|source| UpgradeError::Socket { name: passed.name(), source })?;
        Ok(Some(listener))
    }
}

/// The pipe an upgrading agent waits on.
#[derive(Debug)]
pub struct Ready {
    pipe: File,
    /// The old agent's stderr, to write to from now on.
    stderr: Option<OwnedFd>,
}

impl Ready {
    /// Tells the old agent this one serves: it drains and exits. From here this
    /// agent writes to the stderr the old one had, not to the old one.
    pub fn serving(mut self) {
        if let Some(stderr) = self.stderr.take() {
            // SAFETY: dup2 onto descriptor 2, which std and the logger write to by
            // number; the pipe it was is closed by it.
            if unsafe { libc::dup2(stderr.as_raw_fd(), 2) } == -1 {
                tracing::warn!(error = %std::io::Error::last_os_error(), "cannot take the old agent's stderr");
            }
        }
        if let Err(error) = writeln!(self.pipe, "{READY}") {
            tracing::warn!(%error, "the upgrading agent cannot be told this one is ready");
        }
    }

    /// Tells the old agent why this one could not start: it serves on and reports it.
    pub fn failed(mut self, why: &dyn std::fmt::Display) {
        let _ = writeln!(self.pipe, "{why}");
    }
}

/// A descriptor of the running agent to hand over.
pub type Offer<'a> = (Passed, BorrowedFd<'a>);

/// Starts `run -c config` with the binary on disk now (the one `/proc/self/exe` was
/// started from, or what replaced it at its path) and `offered` as its inherited
/// descriptors, then waits for it to report. Returns its pid once it serves.
pub async fn start_new(config: &Path, offered: &[Offer<'_>]) -> Result<u32, UpgradeError> {
    let exe = exe_on_disk()?;
    let (mut reader, writer) = std::io::pipe().map_err(|source| UpgradeError::Spawn { exe: exe.clone(), source })?;
    let writer = OwnedFd::from(writer);
    let mut passed: Vec<Offer<'_>> = offered.to_vec();
    passed.push((Passed::Ready, std::os::fd::AsFd::as_fd(&writer)));
    let own_stderr = std::io::stderr();
    passed.push((Passed::Stderr, std::os::fd::AsFd::as_fd(&own_stderr)));
    let (stderr_reader, stderr_writer) =
        std::io::pipe().map_err(|source| UpgradeError::Spawn { exe: exe.clone(), source })?;
    let count = passed.len();
    // Each descriptor above the numbers they are to take in the child, so that
    // moving one into place never overwrites another still to be moved.
    let above = FIRST_FD + i32::try_from(count).unwrap_or(i32::MAX);
    let sources: Vec<OwnedFd> = passed
        .iter()
        .map(|(_, fd)| {
            // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor; ours to own.
            let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
            if copy == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: just made, owned by no one else.
            Ok(unsafe { OwnedFd::from_raw_fd(copy) })
        })
        .collect::<Result<_, _>>()
        .map_err(|source| UpgradeError::Spawn { exe: exe.clone(), source })?;
    let raw: Vec<RawFd> = sources.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let names: Vec<&str> = passed.iter().map(|(p, _)| p.name()).collect();
    let mut command = std::process::Command::new(&exe);
    command
        .arg("run")
        .arg("-c")
        .arg(config)
        .env("LISTEN_FDS", count.to_string())
        .env("LISTEN_FDNAMES", inherited::names_value(&names))
        // Ours were systemd's, for this process; the child's pid is not known yet.
        .env_remove("LISTEN_PID")
        .stdin(Stdio::null())
        .stderr(Stdio::from(OwnedFd::from(stderr_writer)));
    // SAFETY: between fork and exec only dup2, which is async-signal-safe; dup2
    // leaves the copy without FD_CLOEXEC, so it survives the exec.
    unsafe {
        command.pre_exec(move || {
            for (target, source) in (FIRST_FD..).zip(&raw) {
                if libc::dup2(*source, target) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn().map_err(|source| UpgradeError::Spawn { exe: exe.clone(), source })?;
    // Ours closed (the command holds the stderr pipe's end): each pipe ends when
    // the child closes it or exits.
    drop((command, sources, writer));
    let pid = child.id();
    let relayed = tokio::task::spawn_blocking(move || relay_stderr(stderr_reader));
    let report = tokio::task::spawn_blocking(move || {
        let mut said = String::new();
        // Bounded: what the child says of why it failed is a line or two.
        let _ = (&mut reader).take(64 * 1024).read_to_string(&mut said);
        said
    });
    let said = match tokio::time::timeout(READY_TIMEOUT, report).await {
        Ok(said) => said.unwrap_or_default(),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(UpgradeError::NotReady { exe, pid });
        }
    };
    if said.trim_end() == READY {
        tracing::info!(pid, exe = %exe.display(), "the new agent serves: draining");
        // The child is reaped by whoever adopts it once this process exits.
        return Ok(pid);
    }
    let status = tokio::task::spawn_blocking(move || child.wait()).await;
    let status = match status {
        Ok(Ok(status)) => status.to_string(),
        _ => "unknown status".to_owned(),
    };
    let said = said.trim();
    // What it wrote to stderr, when it said nothing itself (a binary of another
    // kind, a panic): ended by its exit.
    let tail = match tokio::time::timeout(Duration::from_secs(1), relayed).await {
        Ok(Ok(tail)) => tail,
        _ => String::new(),
    };
    let why = match (said.is_empty(), tail.is_empty()) {
        (false, _) => format!("{said} (exited, {status})"),
        (true, false) => format!("exited ({status}); its last lines: {tail}"),
        (true, true) => format!("exited ({status})"),
    };
    Err(UpgradeError::Failed { exe, pid, why })
}

/// Copies the new agent's stderr to this agent's until the new one takes this
/// stderr for its own or exits, keeping its last lines (bounded) for the report.
fn relay_stderr(reader: std::io::PipeReader) -> String {
    use std::io::BufRead as _;
    const LINES: usize = 10;
    const LINE_BYTES: usize = 512;
    let mut tail = std::collections::VecDeque::with_capacity(LINES);
    let mut reader = std::io::BufReader::new(reader);
    let mut line = Vec::new();
    while (&mut reader).take(64 * 1024).read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        let _ = std::io::stderr().write_all(&line);
        if tail.len() == LINES {
            tail.pop_front();
        }
        let text = String::from_utf8_lossy(&line[..line.len().min(LINE_BYTES)]).trim_end().to_owned();
        tail.push_back(text);
        line.clear();
    }
    Vec::from(tail).join(" | ")
}

/// The path this process's binary was started from: after a package upgrade the
/// file there is the new binary (the kernel shows the old one as `(deleted)`).
fn exe_on_disk() -> Result<PathBuf, UpgradeError> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(UpgradeError::Exe)?;
    let text = exe.to_string_lossy();
    Ok(text.strip_suffix(" (deleted)").map_or(exe.clone(), PathBuf::from))
}
