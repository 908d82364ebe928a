//! One path for every reload (SIGHUP, `limiter reload`, a changed file): read and
//! validate the whole file, refuse what cannot change while running, then apply —
//! new interfaces first (undone if one fails), settings and CIDRs in place (no
//! bucket is refilled, no program reloaded), removed interfaces last.
//!
//! What a reload changes is derived from the config types (`limiter_config::changes`):
//! every key is compared, and a key read only at start is marked where it is
//! declared. What no single key says is added here: escalation following the
//! fleet's blocks, which depends on two sections.

use crate::config::{
    Config,
    changes::{Change, Changes as _, presence_needs_restart},
    proxy::StoreKind,
};

/// Why a reload was refused; the running config stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    #[error("{0}: cannot change while the agent runs; restart it to apply")]
    NeedsRestart(String),
    #[error("applying the kernel layer failed: {0}")]
    Xdp(#[from] crate::xdp::XdpError),
    #[error("applying the proxy failed: {0}")]
    Proxy(String),
    #[error("agent.security_log: {0}")]
    SecurityLog(String),
    #[error(transparent)]
    Lock(#[from] super::lock::LockError),
}

/// Every key whose value `new` changes from `old`, marked where only a restart
/// applies it.
#[must_use]
pub fn changes(old: &Config, new: &Config) -> Vec<Change> {
    let mut changes = Vec::new();
    old.changes(new, "", &mut changes);
    // The fleet's blocks are followed (or not) from the start. A change of the store
    // itself is refused already.
    let follows = |c: &Config| {
        c.proxy.as_ref().is_some_and(|p| p.store == StoreKind::Redis)
            && c.escalation.as_ref().is_some_and(|e| e.enabled)
    };
    if follows(old) != follows(new) {
        for key in ["escalation", "escalation.enabled"] {
            presence_needs_restart(&mut changes, key, "with store = \"redis\"");
        }
    }
    changes
}

/// Refuses changes that only a restart can make, naming every such key: a reload
/// never reports success while one of them is silently left as it was.
pub fn check_restartless(changes: &[Change]) -> Result<(), ReloadError> {
    let keys: Vec<String> = changes.iter().filter_map(Change::needing_restart).collect();
    if keys.is_empty() { Ok(()) } else { Err(ReloadError::NeedsRestart(keys.join(", "))) }
}
