//! The admin socket: one JSON request line in, one JSON response line out, on the
//! Unix socket `agent.admin_socket`. `limiter reload`, `limiter stats`, `limiter
//! explain`, `limiter top --watch` and `limiter detach` are its clients.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::UnixStream,
};

/// What a client asks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// Re-read the config (the agent's own path unless `config` names another).
    Reload { config: Option<std::path::PathBuf> },
    /// Proxy counters and agent state.
    Stats,
    /// Detach the XDP program and stop.
    Detach,
    /// What the proxy would do with a request now, charging nothing.
    Explain { request: crate::proxy::explain::ExplainRequest },
    /// The proxy's `n` heaviest clients.
    Top { n: usize },
    /// What each limit's keys peaked at, and limits `headroom` above.
    Suggest { headroom: f64 },
    /// Start the binary on disk on this agent's sockets, then drain and exit.
    Upgrade,
    /// `limiter unblock` lifted `cidr`'s block: the proxy lets it in again, and its
    /// offence history is forgotten unless `keep_history`.
    Unblocked { cidr: ipnet::IpNet, keep_history: bool },
}

/// The agent's answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Empty: nothing changed.
    Reloaded {
        changes: Vec<crate::config::changes::Change>,
    },
    Rejected {
        error: String,
    },
    /// Boxed: the largest answer by far, and rarely asked.
    Stats {
        stats: Box<AgentStats>,
    },
    Detaching,
    /// Boxed: the second largest.
    Explained {
        explanation: Box<crate::proxy::explain::ProxyExplanation>,
    },
    /// `None`: the agent runs without `[proxy]`.
    Top {
        clients: Option<Vec<crate::proxy::ClientRow>>,
    },
    /// `None`: the agent runs without `[proxy]`.
    Suggested {
        suggestions: Option<Vec<crate::limits::Suggestion>>,
    },
    /// The escalation took note of an unblock; `history_cleared`: the source's
    /// offences were forgotten.
    Forgotten {
        history_cleared: bool,
    },
    /// The new agent (pid `new`) serves; the old one (`old`) drains and exits.
    Upgraded {
        old: u32,
        new: u32,
    },
}

/// What only the running agent knows, for `limiter stats` (the kernel counters are
/// read from the pinned maps, agent or not).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentStats {
    /// Where the XDP program is attached now.
    pub attached: Vec<crate::xdp::Attachment>,
    pub reloads: Reloads,
    pub escalation: EscalationStats,
    /// `[agent.security_log]`'s lines and suppressed events.
    #[serde(default)]
    pub security_log: crate::security_log::SecurityLogStats,
    /// `None`: the agent runs without `[proxy]`.
    pub proxy: Option<crate::proxy::ProxyStats>,
}

/// Reloads since the agent started.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reloads {
    pub ok: u64,
    pub rejected: u64,
    /// When the last one, applied or rejected, was asked for (Unix seconds).
    pub last_unix: u64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EscalationStats {
    /// Escalated blocks (local or from the fleet) refused as malformed, too wide or
    /// protected.
    pub blocks_refused: u64,
    /// Escalated blocks or demotions the kernel layer could not put in place (a
    /// trie full of entries in force).
    pub block_failures: u64,
    /// Escalated demotions put in place (the penalty ladder's `demote_first`, local
    /// or from the fleet).
    #[serde(default)]
    pub demotions: u64,
}

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no agent answers on {path}: {source}")]
    Unreachable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent on {0} did not answer in time")]
    Timeout(String),
    #[error("bad answer from the agent: {0}")]
    Protocol(String),
}

/// Sends one request to the agent listening on `socket`.
pub async fn ask(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, AdminError> {
    let path = socket.display().to_string();
    let exchange = async {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|source| AdminError::Unreachable { path: path.clone(), source })?;
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_string(request).map_err(|e| AdminError::Protocol(e.to_string()))?;
        line.push('\n');
        let io = |source| AdminError::Unreachable { path: path.clone(), source };
        write.write_all(line.as_bytes()).await.map_err(io)?;
        let mut answer = String::new();
        BufReader::new(read).read_line(&mut answer).await.map_err(io)?;
        serde_json::from_str(&answer).map_err(|e| AdminError::Protocol(format!("{e}: {answer:?}")))
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| AdminError::Timeout(path.clone()))?
}

/// [`ask`] from synchronous CLI code.
pub fn ask_blocking(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, AdminError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| AdminError::Unreachable { path: socket.display().to_string(), source })?;
    runtime.block_on(ask(socket, request, timeout))
}

/// Reads one request line from a connection; `None` on a malformed or empty one.
pub(super) async fn read_request(stream: &mut BufReader<UnixStream>) -> Option<Request> {
    let mut line = String::new();
    // A client that sends more than this is not one of ours.
    let mut limited = (&mut *stream).take(64 * 1024);
    limited.read_line(&mut line).await.ok()?;
    serde_json::from_str(&line).ok()
}

pub(super) async fn write_response(stream: &mut BufReader<UnixStream>, response: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(response).map_err(std::io::Error::other)?;
    line.push('\n');
    stream.get_mut().write_all(line.as_bytes()).await
}
