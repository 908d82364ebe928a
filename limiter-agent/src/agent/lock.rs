//! One agent per pin dir and per admin socket: a second `limiter run` must stop
//! before it touches a map (loading would rewrite the running agent's settings).
//! The locks are `flock`s, so that a killed agent leaves none behind.

use std::{fs::File, path::Path};

use crate::config::Config;

/// Held for as long as the agent runs.
#[derive(Debug)]
pub struct AgentLock {
    _socket: File,
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
        let mut lock = Self { _socket: lock(&socket_lock, true)?, pin_dir: None };
        if config.xdp.is_some() {
            lock.pin_dir(&config.agent.pin_dir)?;
        }
        Ok(lock)
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
        File::options().create(true).truncate(false).write(true).open(path).map_err(io)?
    } else {
        File::open(path).map_err(io)?
    };
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(LockError::Held { path: path.display().to_string() }),
        Err(std::fs::TryLockError::Error(source)) => Err(io(source)),
    }
}
