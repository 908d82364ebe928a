//! `[agent]`: where the agent pins, listens and reports.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Deserializer, de};

use crate::{changes::Changes, units::HumanDuration};

/// `[agent]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// bpffs directory for the maps and XDP links.
    #[changes(restart)]
    pub pin_dir: PathBuf,
    /// Unix socket of the running agent (reload, proxy stats).
    #[changes(restart)]
    pub admin_socket: PathBuf,
    /// Prometheus endpoint; `""` disables it.
    #[serde(deserialize_with = "metrics_address")]
    #[changes(restart)]
    pub metrics: Option<SocketAddr>,
    /// Leave the XDP filter attached (through its pinned link) when the agent stops.
    pub keep_attached_on_exit: bool,
    /// How long a stop or an upgrade waits for in-flight requests and open tunnels
    /// before it cuts them.
    pub drain_timeout: HumanDuration,
    /// `text` or `json` log lines.
    #[changes(restart = "the logger is set up at start")]
    pub log_format: LogFormat,
}

/// Shape of the agent's log lines.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from("/sys/fs/bpf/limiter"),
            admin_socket: PathBuf::from("/run/limiter.sock"),
            metrics: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            keep_attached_on_exit: true,
            drain_timeout: HumanDuration(Duration::from_secs(30)),
            log_format: LogFormat::Text,
        }
    }
}

fn metrics_address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        de::Error::custom(format!("`{text}` is not an address like \"127.0.0.1:9464\" (or \"\" to disable)"))
    })
}
