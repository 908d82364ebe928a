//! One agent per pin dir and per admin socket: a second `limiter run` must stop
//! before it touches a map (loading would rewrite the running agent's settings).
//! The locks are `flock`s, so that a killed agent leaves none behind. A `flock` needs
//! only a descriptor, read-only will do: the socket's lock file is the owner's alone
//! (0600), or any local user could hold it and keep the agent from starting.

use std::{
    fs::{File, Permissions},
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
};

use super::upgrade::{Inherited, Offer, Passed};
use crate::config::Config;

/// Held for as long as the agent runs.
#[derive(Debug)]
pub struct AgentLock {
    socket: File,
    pin_dir: Option<File>,
}

/// Why the agent could not take its locks.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another agent runs on {path} (its lock is held); stop it first")]
    Held { path: String },
    #[error("lock {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    PinDir(#[from] crate::xdp::XdpError),
}

impl AgentLock {
    /// Locks `<admin_socket>.lock` and, with `[xdp]`, the pin dir.
    pub fn acquire(config: &Config) -> Result<Self, LockError> {
        let socket_lock = config.agent.admin_socket.with_added_extension("lock");
        let mut lock = Self { socket: lock(&socket_lock, true)?, pin_dir: None };
        if config.xdp.is_some() {
            lock.pin_dir(&config.agent.pin_dir)?;
        }
        Ok(lock)
    }

    /// Takes the locks the agent this one replaces handed over, else acquires them.
    /// Handed over, they are the same `flock`s (one open file each, shared by the
    /// two processes), so that no third agent can start between them.
    pub fn acquire_or_inherit(config: &Config, inherited: &mut Inherited) -> Result<Self, LockError> {
        let Some(socket) = inherited.take(Passed::Lock) else { return Self::acquire(config) };
        let mut lock = Self { socket: File::from(socket), pin_dir: inherited.take(Passed::PinLock).map(File::from) };
        if config.xdp.is_some() {
            lock.pin_dir(&config.agent.pin_dir)?;
        }
        Ok(lock)
    }

    /// The locks, to hand to the agent replacing this one.
    pub fn offer(&self) -> Vec<Offer<'_>> {
        use std::os::fd::AsFd as _;
        let mut offer = vec![(Passed::Lock, self.socket.as_fd())];
        offer.extend(self.pin_dir.as_ref().map(|pin_dir| (Passed::PinLock, pin_dir.as_fd())));
        offer
    }

    /// Locks the pin dir itself (bpffs holds no plain files, but a directory can be
    /// locked), once: before the kernel layer is first loaded, at start or by a reload.
    pub fn pin_dir(&mut self, pin_dir: &Path) -> Result<(), LockError> {
        if self.pin_dir.is_none() {
            crate::xdp::ensure_mounted(pin_dir)?;
            self.pin_dir = Some(lock(pin_dir, false)?);
        }
        Ok(())
    }
}

fn lock(path: &Path, create: bool) -> Result<File, LockError> {
    let io = |source| LockError::Io { path: path.display().to_string(), source };
    if create && let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let file = if create {
        let file = File::options().create(true).truncate(false).write(true).mode(0o600).open(path).map_err(io)?;
        // One left by an older agent, or made under another umask, is narrowed too.
        file.set_permissions(Permissions::from_mode(0o600)).map_err(io)?;
        file
    } else {
        File::open(path).map_err(io)?
    };
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(LockError::Held { path: path.display().to_string() }),
        Err(std::fs::TryLockError::Error(source)) => Err(io(source)),
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt as _, process::Command};

    use super::*;

    /// `flock -n PATH true` as the user nobody: whether that user can hold the lock.
    fn nobody_can_lock(path: &Path) -> bool {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "flock", "-n"])
            .arg(path)
            .arg("true")
            .status()
            .expect("setpriv runs")
            .success()
    }

    #[test]
    fn no_other_user_can_hold_the_socket_lock() {
        let dir = std::env::temp_dir().join(limiter_lab::support::unique("limiter-lock"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).expect("dir mode");
        let path = dir.join("agent.sock.lock");
        // As an older agent left it: readable by all, so anyone could flock it.
        std::fs::write(&path, "").expect("old lock");
        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).expect("old mode");
        assert!(nobody_can_lock(&path), "the test cannot tell: nobody could not lock a 0644 file");

        let held = lock(&path, true).expect("lock");
        drop(held);
        let mode = std::fs::metadata(&path).expect("lock file").permissions().mode() & 0o777;
        let nobody = nobody_can_lock(&path);
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(mode, 0o600);
        assert!(!nobody, "another user can hold the agent's lock");
    }
}
