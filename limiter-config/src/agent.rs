//! `[agent]`: where the agent pins, listens and reports.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Deserializer, de};

use crate::changes::Changes;

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
    /// `text` or `json` log lines.
    #[changes(restart = "the logger is set up at start")]
    pub log_format: LogFormat,
    /// `[agent.security_log]`: one line per security event; `None`: none.
    pub security_log: Option<SecurityLogConfig>,
}

/// `[agent.security_log]`: where security events go and in which shape; opened again
/// on a reload that changes it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawSecurityLog")]
pub struct SecurityLogConfig {
    /// The file events are appended to.
    pub path: Option<PathBuf>,
    pub format: SecurityLogFormat,
    /// `syslog = "unix:///dev/log"`: the datagram socket each event is sent to as well.
    pub syslog: Option<PathBuf>,
}

/// The shape of a security event's line.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum SecurityLogFormat {
    /// One JSON object a line.
    #[default]
    Json,
    /// ArcSight's Common Event Format: `CEF:0|limiter|limiter|VERSION|SIG|NAME|SEVERITY|k=v …`.
    Cef,
}

/// `[agent.security_log]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurityLog {
    path: Option<PathBuf>,
    #[serde(default)]
    format: SecurityLogFormat,
    syslog: Option<String>,
}

impl TryFrom<RawSecurityLog> for SecurityLogConfig {
    type Error = String;

    fn try_from(raw: RawSecurityLog) -> Result<Self, String> {
        let syslog = raw.syslog.as_deref().map(syslog_socket).transpose()?;
        if raw.path.is_none() && syslog.is_none() {
            return Err("the security log needs a path, a syslog socket, or both".to_owned());
        }
        if raw.path.as_deref().is_some_and(|path| !path.is_absolute()) {
            return Err("path must be absolute: the agent's working directory is no place for a log".to_owned());
        }
        Ok(Self { path: raw.path, format: raw.format, syslog })
    }
}

/// The socket of `unix:///dev/log`.
fn syslog_socket(url: &str) -> Result<PathBuf, String> {
    match url.strip_prefix("unix://").map(Path::new) {
        Some(path) if path.is_absolute() => Ok(path.to_owned()),
        _ => Err(format!("syslog `{}` is not a unix:///absolute/path of a datagram socket", url.escape_debug())),
    }
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
            log_format: LogFormat::Text,
            security_log: None,
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
