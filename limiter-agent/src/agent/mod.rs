//! The running agent: owns the kernel layer (and the proxy), reloads on SIGHUP, on
//! `limiter reload` and when the config file changes, answers the admin socket,
//! hands its sockets to a new binary on `limiter upgrade` and SIGUSR2, and stops
//! cleanly on SIGTERM.

pub mod admin;
pub mod lock;
mod reload;
mod systemd;
mod upgrade;
mod watch;
mod xdp;

use std::{
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::{
    io::BufReader,
    net::UnixListener,
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, oneshot},
};

pub use self::{
    admin::{AgentStats, EscalationStats, Reloads, Request, Response},
    reload::ReloadError,
    upgrade::{Inherited, READY_TIMEOUT, Ready, UpgradeError},
    xdp::XdpRuntime,
};
use limiter_core::{Clock as _, SystemClock};

use crate::{
    config::{self, Config, ConfigError, changes::Change},
    escalation::{self, Escalation, Escalator, Penalty},
    fleet::Fleet,
    metrics::{AgentGauges, MetricsSources},
    proxy::{Proxy, Serving},
    security_log::{SecurityEvent, SecurityLog},
    signature::KeySecrets,
};

/// A config and the secrets it references, read in the agent's environment: what
/// `limiter run` and `limiter check` start from and a reload applies.
#[derive(Clone, Debug, Default)]
pub struct LoadedConfig {
    pub config: Config,
    pub secrets: KeySecrets,
}

impl LoadedConfig {
    /// Reads the config at `path`, then every secret it references.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&config::read(path)?, path)
    }

    /// Parses config text, then reads every secret it references: a missing or
    /// unreadable secret is a config error at its key's line.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config = Config::parse(text, path)?;
        let secrets = match &config.proxy {
            Some(proxy) => KeySecrets::load(proxy)
                .map_err(|error| ConfigError::at_key(text, path, error.key, error.source.to_string()))?,
            None => KeySecrets::default(),
        };
        Ok(Self { config, secrets })
    }
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Xdp(#[from] crate::xdp::XdpError),
    #[error("admin socket {path}: {source}")]
    AdminSocket {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("escalation: {0}")]
    Fleet(#[from] crate::fleet::FleetError),
    #[error("agent.security_log: {0}")]
    SecurityLog(#[source] std::io::Error),
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
}

/// The proxy and its workers.
#[derive(Debug)]
struct ProxyRuntime {
    proxy: Arc<Proxy>,
    serving: Serving,
}

impl ProxyRuntime {
    /// Binds `config.listen`, or serves on `inherited` (see [`Inherited::proxy`]).
    async fn start(
        config: &crate::config::ProxyConfig,
        secrets: &KeySecrets,
        inherited: Option<std::net::TcpListener>,
    ) -> Result<Self, AgentError> {
        let taken = inherited.is_some();
        let proxy =
            Arc::new(Proxy::bind_or_take(Arc::new(config.clone()), secrets.clone(), SystemClock, inherited).await?);
        let serving = proxy.serve()?;
        tracing::info!(listen = %proxy.local_addr(), inherited = taken, upstream = %config.upstream, workers = %config.workers(), "proxy serving");
        Ok(Self { proxy, serving })
    }

    /// Stops accepting and lets in-flight requests finish, cutting what is still
    /// open after `drain_timeout` (see [`Serving::stop`]).
    async fn drain(self, drain_timeout: Duration) {
        let started = std::time::Instant::now();
        self.serving.stop(drain_timeout).await;
        match self.proxy.stats().drain_cut {
            0 => tracing::info!(took = ?started.elapsed(), "proxy drained"),
            cut => tracing::warn!(
                drain_cut = cut,
                ?drain_timeout,
                "proxy drained: connections still open at drain_timeout cut"
            ),
        }
    }
}

/// The agent's state between events.
#[derive(Debug)]
pub struct Agent {
    config_path: PathBuf,
    config: Config,
    /// The secrets `config` references, as read when it was applied.
    secrets: KeySecrets,
    /// The file's text when last applied, with its certificates' stamps (see
    /// [`watch::state`]), to notice edits.
    applied: Option<String>,
    xdp: Option<XdpRuntime>,
    proxy: Option<ProxyRuntime>,
    gauges: Arc<AgentGauges>,
    /// With both the proxy and the kernel layer: the proxy's rejections escalate.
    escalation: Option<EscalationRuntime>,
    lock: lock::AgentLock,
    /// With both: the proxy marks the peer of every request it serves verified.
    verifier: Option<Arc<crate::xdp::Verifier>>,
    /// `[agent.security_log]`, kept across reloads (off while the config has none).
    security: Arc<SecurityLog>,
}

/// What escalation runs on: the proxy's counter, the blocks it asks for, and the
/// fleet's Redis when the proxy shares its store.
#[derive(Debug)]
struct EscalationRuntime {
    escalator: Arc<Escalator>,
    /// Taken by the agent loop.
    requests: Option<mpsc::Receiver<Escalation>>,
    fleet: Option<Fleet>,
}

/// Blocks waiting for the agent loop; a flood beyond it waits for the next rejection.
const ESCALATION_QUEUE: usize = 1024;

impl Agent {
    /// Puts `config` in force: loads and attaches the kernel layer, binds the proxy.
    /// The proxy serves on the socket `inherited` holds, if it does.
    pub async fn start(
        config_path: PathBuf,
        loaded: LoadedConfig,
        lock: lock::AgentLock,
        inherited: &mut Inherited,
    ) -> Result<Self, AgentError> {
        let LoadedConfig { config, secrets } = loaded;
        let security = SecurityLog::start(config.agent.security_log.as_ref()).map_err(AgentError::SecurityLog)?;
        let xdp = match &config.xdp {
            Some(xdp) => Some(XdpRuntime::start(&config, xdp)?),
            None => None,
        };
        let proxy = match &config.proxy {
            Some(proxy) => Some(ProxyRuntime::start(proxy, &secrets, inherited.proxy(proxy.listen)?).await?),
            None => None,
        };
        if let Some(runtime) = &proxy {
            runtime.proxy.log_security_to(Arc::clone(&security));
        }
        let gauges = Arc::<AgentGauges>::default();
        let escalation = match (&proxy, &xdp) {
            (Some(runtime), Some(_)) => Some(EscalationRuntime::start(&config, &runtime.proxy, &gauges)),
            _ => None,
        };
        let applied = std::fs::read_to_string(&config_path).ok().map(|text| watch::state(&text, &config));
        let mut agent = Self {
            config_path,
            config,
            secrets,
            applied,
            xdp,
            proxy,
            gauges,
            escalation,
            verifier: None,
            lock,
            security,
        };
        agent.connect_verifier()?;
        agent.publish_attachments();
        Ok(agent)
    }

    /// With both layers running, hands the proxy a handle on the verified sources
    /// (once: a proxy keeps its hook), or gives it the reloaded config's TTL.
    fn connect_verifier(&mut self) -> Result<(), crate::xdp::XdpError> {
        let (Some(proxy), Some(_), Some(xdp)) = (&self.proxy, &self.xdp, &self.config.xdp) else {
            return Ok(());
        };
        match &self.verifier {
            Some(verifier) => verifier.reconfigure(xdp),
            None => {
                let verifier = Arc::new(crate::xdp::Verifier::open(&self.config.agent.pin_dir, xdp)?);
                proxy.proxy.on_served(verifier.clone());
                self.verifier = Some(verifier);
            }
        }
        Ok(())
    }

    fn publish_attachments(&self) {
        if let Ok(mut attached) = self.gauges.attached.lock() {
            *attached = self.xdp.as_ref().map(XdpRuntime::attachments).unwrap_or_default();
        }
    }

    /// What the metrics endpoint reads.
    #[must_use]
    pub fn metrics_sources(&self) -> MetricsSources {
        MetricsSources {
            pin_dir: self.config.agent.pin_dir.clone(),
            agent: self.gauges.clone(),
            proxy: self.proxy.as_ref().map(|p| p.proxy.clone()),
            security_log: Arc::clone(&self.security),
        }
    }

    /// Re-reads the config (from `path`, or the agent's own file) and applies it.
    /// On error nothing changed and the running config stays in force.
    pub fn reload(&mut self, path: Option<&Path>) -> Result<Vec<Change>, ReloadError> {
        self.reload_text(path, None)
    }

    /// Reloads `text` when given (what the watcher saw settle), else the file.
    fn reload_text(&mut self, path: Option<&Path>, text: Option<String>) -> Result<Vec<Change>, ReloadError> {
        let result = self.try_reload(path.unwrap_or(&self.config_path.clone()), text);
        match &result {
            Ok(changes) => {
                self.gauges.reloads_ok.fetch_add(1, Ordering::Relaxed);
                let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
                tracing::info!(?changes, "config reloaded");
            }
            Err(error) => {
                self.gauges.reloads_rejected.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, in_force = %self.config_path.display(), "config rejected; the running config stays in force");
            }
        }
        self.gauges.last_reload_unix.store(SystemClock.now().as_secs(), Ordering::Relaxed);
        self.publish_attachments();
        result
    }

    fn try_reload(&mut self, path: &Path, text: Option<String>) -> Result<Vec<Change>, ReloadError> {
        let text = match text {
            Some(text) => text,
            None => std::fs::read_to_string(path).map_err(|source| {
                ReloadError::Invalid(crate::config::ConfigError::Read { path: path.to_owned(), source })
            })?,
        };
        // Secrets are read here, in the agent's environment, not the CLI's.
        let LoadedConfig { config: new, secrets } = LoadedConfig::parse(&text, path)?;
        let mut changes = reload::changes(&self.config, &new);
        reload::check_restartless(&changes)?;
        // Opened before anything is applied, so that a path it cannot open refuses the
        // reload; put in place once the rest is.
        let security = self
            .security
            .prepare(new.agent.security_log.as_ref())
            .map_err(|error| ReloadError::SecurityLog(error.to_string()))?;
        // Escalation is wired to the proxy and the kernel layer when the agent starts.
        if self.escalation.is_none() && new.proxy.is_some() && new.escalation.as_ref().is_some_and(|e| e.enabled) {
            return Err(ReloadError::NeedsRestart("escalation (the agent started without [xdp])".to_owned()));
        }
        // The proxy first: its reconfigure is all or nothing, and it is undone below
        // if the kernel layer then fails.
        if let (Some(runtime), Some(proxy)) = (&self.proxy, &new.proxy) {
            runtime
                .proxy
                .reconfigure(Arc::new(proxy.clone()), secrets.clone())
                .map_err(|e| ReloadError::Proxy(e.to_string()))?;
            if proxy.tls.is_some() {
                // Read again whether or not the paths changed: a renewed certificate keeps its path.
                changes.push(Change::note("proxy.tls", "certificates read again for new connections".to_owned()));
            }
            if proxy.jwt.is_some() {
                // As for certificates: a rotated JWKS keeps its path.
                changes.push(Change::note("proxy.jwt", "secrets and JWKS files read again".to_owned()));
            }
        }
        match self.apply_xdp(&new, &mut changes) {
            Ok(()) => {}
            Err(error) => {
                if let (Some(runtime), Some(old)) = (&self.proxy, &self.config.proxy) {
                    let _ = runtime.proxy.reconfigure(Arc::new(old.clone()), self.secrets.clone());
                }
                return Err(error);
            }
        }
        if let Some(escalation) = &self.escalation {
            escalation.escalator.reconfigure(&new);
        }
        self.security.install(security);
        self.config = new;
        self.secrets = secrets;
        if let Err(error) = self.connect_verifier() {
            tracing::warn!(%error, "the proxy cannot mark its clients verified");
        }
        self.applied = Some(watch::state(&text, &self.config));
        // `limiter reload -c OTHER` makes OTHER the agent's file from now on, so
        // that watching the old one cannot bring its config back.
        self.config_path = path.to_owned();
        Ok(changes)
    }

    /// Puts `new`'s kernel layer in force, adding the interfaces it attached and
    /// detached to `changes`.
    fn apply_xdp(&mut self, new: &Config, changes: &mut Vec<Change>) -> Result<(), ReloadError> {
        match (&mut self.xdp, &new.xdp) {
            (Some(runtime), Some(xdp)) => {
                let added = runtime.attach_all(&xdp.interfaces, xdp.mode)?;
                // A reload while the upstream sheds keeps the budget tightened.
                match runtime.kernel.maps_mut().apply_tightened(xdp, new.proxy.as_ref(), runtime.tightened) {
                    Ok(()) => {}
                    Err(error) => {
                        // Back to the running config: this reload's interfaces off, its
                        // settings and rules replaced by the old ones.
                        for attachment in &added {
                            runtime.detach(&attachment.interface);
                        }
                        if let Some(old) = &self.config.xdp
                            && let Err(undo) = runtime.kernel.maps_mut().apply_tightened(
                                old,
                                self.config.proxy.as_ref(),
                                runtime.tightened,
                            )
                        {
                            tracing::error!(%undo, "restoring the running [xdp] settings and rules failed: the kernel layer may hold part of the rejected config");
                        }
                        return Err(error.into());
                    }
                }
                changes.extend(added.iter().map(attached));
                let removed: Vec<String> = runtime
                    .attachments()
                    .into_iter()
                    .map(|a| a.interface)
                    .filter(|i| !xdp.interfaces.contains(i))
                    .collect();
                for interface in removed {
                    runtime.detach(&interface);
                    changes.push(detached(&interface));
                }
            }
            (None, Some(xdp)) => {
                self.lock.pin_dir(&new.agent.pin_dir)?;
                let runtime = XdpRuntime::start(new, xdp)?;
                changes.extend(runtime.attachments().iter().map(attached));
                self.xdp = Some(runtime);
            }
            (Some(runtime), None) => {
                for attachment in runtime.detach_all() {
                    changes.push(detached(&attachment.interface));
                }
                self.xdp = None;
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// Scales the kernel's `[xdp.new_sources]` budget while the proxy says the upstream
    /// has been shedding long enough (`[proxy.adaptive.kernel]`), and restores it once
    /// it says so. The proxy never holds the kernel: the agent asks it each tick.
    fn follow_shedding(&mut self) {
        let wanted = self.proxy.as_ref().and_then(|runtime| runtime.proxy.kernel_tightening());
        let (Some(runtime), Some(xdp)) = (self.xdp.as_mut(), &self.config.xdp) else { return };
        if wanted == runtime.tightened {
            return;
        }
        match runtime.kernel.maps_mut().apply_tightened(xdp, self.config.proxy.as_ref(), wanted) {
            Ok(()) => {
                runtime.tightened = wanted;
                match wanted {
                    Some(factor) => tracing::warn!(factor, "upstream shedding: new-source budget tightened"),
                    None => tracing::info!("upstream no longer shedding: new-source budget restored"),
                }
            }
            Err(error) => tracing::error!(%error, "cannot scale the new-source budget"),
        }
    }

    /// Puts an escalation's block (or demotion) in the kernel layer and, if it was
    /// crossed here, tells the fleet.
    fn escalate(&mut self, escalation: Escalation) {
        let Some(xdp) = &mut self.xdp else { return };
        let escalation = match self.escalation.as_ref().map(|e| e.escalator.admit(escalation)) {
            Some(Err(refused)) => {
                self.gauges.blocks_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%refused, local = escalation.local, "escalated penalty refused");
                if !escalation.local {
                    self.security.record(&SecurityEvent::fleet_block_refused(escalation.cidr, refused.reason()));
                }
                return;
            }
            Some(Ok(admitted)) => admitted,
            None => escalation,
        };
        let Escalation { cidr, penalty, ttl, local } = escalation;
        let by = if local { "escalation" } else { "fleet" };
        let maps = xdp.kernel.maps_mut();
        match penalty {
            Penalty::Block => {
                if local {
                    self.security.record(&SecurityEvent::escalation_block(cidr, ttl));
                }
                match maps.block(cidr, Some(ttl)) {
                    Ok(()) => {
                        if local {
                            tracing::warn!(%cidr, ?ttl, "source blocked: too many rejections");
                        } else {
                            tracing::info!(%cidr, ?ttl, "source blocked: escalated by another agent");
                        }
                        self.security.record(&SecurityEvent::kernel_block(cidr, Some(ttl), by));
                    }
                    Err(error) => {
                        self.gauges.block_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(%cidr, %error, "cannot block an escalated source");
                    }
                }
            }
            Penalty::Demote(limit) => match maps.demote(cidr, limit.rate(), Some(ttl)) {
                Ok(()) => {
                    self.gauges.demotions.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%cidr, ?ttl, %limit, local, "source demoted: its first offence");
                    self.security.record(&SecurityEvent::kernel_demote(cidr, limit, Some(ttl), by));
                }
                Err(error) => {
                    self.gauges.block_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(%cidr, %error, "cannot demote an escalated source");
                }
            },
        }
        if local && let Some(fleet) = self.escalation.as_ref().and_then(|e| e.fleet.clone()) {
            tokio::spawn(async move {
                if let Err(error) = escalation::publish(&fleet, escalation).await {
                    tracing::warn!(%cidr, %error, "escalation not published to the fleet");
                }
            });
        }
    }

    /// Reads the config file (and the certificates it names) for the watcher: its
    /// text once an edit has settled.
    fn settled_edit(&self, settle: &mut watch::Settle) -> Option<String> {
        let current = std::fs::read_to_string(&self.config_path).ok().map(|text| watch::state(&text, &self.config));
        let settled = settle.observe(current, self.applied.as_deref(), std::time::Instant::now())?;
        Some(watch::text_of(&settled).to_owned())
    }

    /// Agent-side figures for `limiter stats` (the kernel counters come from the pins).
    #[must_use]
    pub fn stats(&self) -> AgentStats {
        let gauges = &self.gauges;
        AgentStats {
            attached: self.xdp.as_ref().map(XdpRuntime::attachments).unwrap_or_default(),
            reloads: Reloads {
                ok: gauges.reloads_ok.load(Ordering::Relaxed),
                rejected: gauges.reloads_rejected.load(Ordering::Relaxed),
                last_unix: gauges.last_reload_unix.load(Ordering::Relaxed),
            },
            escalation: EscalationStats {
                blocks_refused: gauges.blocks_refused.load(Ordering::Relaxed),
                block_failures: gauges.block_failures.load(Ordering::Relaxed),
                demotions: gauges.demotions.load(Ordering::Relaxed),
            },
            security_log: self.security.stats(),
            proxy: self.proxy.as_ref().map(|p| p.proxy.stats()),
        }
    }

    /// Answers `limiter unblock`'s note: off the loop, as forgetting a history in
    /// Redis waits for it.
    fn unblocked(&self, cidr: ipnet::IpNet, keep_history: bool, reply: oneshot::Sender<Response>) {
        let Some(escalator) = self.escalation.as_ref().map(|e| Arc::clone(&e.escalator)) else {
            let _ = reply.send(Response::Forgotten { history_cleared: false });
            return;
        };
        tokio::spawn(async move {
            let response = match escalator.unblocked(cidr, keep_history).await {
                Ok(()) => Response::Forgotten { history_cleared: !keep_history },
                Err(error) => Response::Rejected { error: format!("the offence history is kept: {error}") },
            };
            let _ = reply.send(response);
        });
    }

    /// Answers `limiter explain` for the proxy.
    fn explain(&self, request: crate::proxy::explain::ExplainRequest, reply: oneshot::Sender<Response>) {
        let Some(proxy) = self.proxy.as_ref().map(|p| Arc::clone(&p.proxy)) else {
            let _ = reply.send(Response::Rejected { error: "the proxy is not configured".to_owned() });
            return;
        };
        tokio::spawn(async move {
            let response = match proxy.explain(&request).await {
                Ok(explanation) => Response::Explained { explanation: Box::new(explanation) },
                Err(error) => Response::Rejected { error: error.to_string() },
            };
            let _ = reply.send(response);
        });
    }

    /// Starts the binary on disk as the agent replacing this one, handing it the
    /// proxy's socket, the locks and `offered`; its pid once it serves.
    async fn upgrade(&self, offered: &[upgrade::Offer<'_>]) -> Result<u32, UpgradeError> {
        let mut offer = self.lock.offer();
        offer.extend(self.proxy.as_ref().map(|p| (upgrade::Passed::Proxy, p.proxy.listener())));
        offer.extend_from_slice(offered);
        upgrade::start_new(&self.config_path, &offer).await
    }

    /// Stops, draining the proxy for up to `drain_timeout`. On [`Exit::Detach`] (or a
    /// stop with `keep_attached_on_exit = false`) the XDP links are removed;
    /// otherwise the pinned links keep the filter in place (after an upgrade, the
    /// new agent's program in them).
    pub async fn stop(mut self, exit: Exit) {
        if let Some(proxy) = self.proxy.take() {
            proxy.drain(self.config.agent.drain_timeout.0).await;
        }
        if let Some(runtime) = &mut self.xdp {
            if exit == Exit::Upgraded {
                tracing::info!("the new agent holds the XDP links");
            } else if exit == Exit::Detach || !self.config.agent.keep_attached_on_exit {
                for attachment in runtime.detach_all() {
                    tracing::info!(interface = %attachment.interface, "XDP detached");
                }
            } else {
                tracing::info!("leaving the XDP filter attached (agent.keep_attached_on_exit)");
            }
        }
    }
}

/// Why the agent stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM or SIGINT.
    Stop,
    /// `limiter detach`.
    Detach,
    /// A new agent serves on this one's sockets.
    Upgraded,
}

/// A listening socket the agent serves in a task of its own, with a descriptor of
/// it kept to hand over.
#[derive(Debug)]
struct Listening {
    task: tokio::task::JoinHandle<()>,
    fd: OwnedFd,
}

impl Listening {
    fn spawn(fd: std::io::Result<OwnedFd>, serve: impl Future<Output = ()> + Send + 'static) -> std::io::Result<Self> {
        Ok(Self { fd: fd?, task: tokio::spawn(serve) })
    }
}

/// The admin socket, served into the agent loop's channel, with a descriptor of it
/// kept to hand over.
#[derive(Debug)]
struct Admin {
    fd: OwnedFd,
    /// `None` while paused.
    task: Option<tokio::task::JoinHandle<()>>,
    requests: mpsc::Sender<(Request, oneshot::Sender<Response>)>,
}

impl Admin {
    fn serve(
        listener: UnixListener,
        requests: mpsc::Sender<(Request, oneshot::Sender<Response>)>,
    ) -> std::io::Result<Self> {
        let fd = listener.as_fd().try_clone_to_owned()?;
        Ok(Self { fd, task: Some(tokio::spawn(serve_admin(listener, requests.clone()))), requests })
    }

    /// Stops accepting (connections wait in the socket's queue) and returns once no
    /// more is accepted.
    async fn pause(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Accepts again after [`Admin::pause`].
    fn resume(&mut self) -> std::io::Result<()> {
        let listener = std::os::unix::net::UnixListener::from(self.fd.try_clone()?);
        let listener = UnixListener::from_std(listener)?;
        self.task = Some(tokio::spawn(serve_admin(listener, self.requests.clone())));
        Ok(())
    }
}

/// Hands this agent's sockets to a new one (see [`Agent::upgrade`]); its pid once
/// it serves. The admin socket is not served meanwhile: a request sent during the
/// hand-over waits in its queue for the new agent (or for this one again, if the new
/// one fails), so that none is taken by an agent that has handed over.
async fn hand_over(agent: &Agent, admin: &mut Admin, metrics: Option<&Listening>) -> Result<u32, UpgradeError> {
    admin.pause().await;
    let mut offered = vec![(upgrade::Passed::Admin, admin.fd.as_fd())];
    offered.extend(metrics.map(|m| (upgrade::Passed::Metrics, m.fd.as_fd())));
    let upgraded = agent.upgrade(&offered).await;
    drop(offered);
    if upgraded.is_err()
        && let Err(error) = admin.resume()
    {
        tracing::error!(%error, "the admin socket cannot be served again");
    }
    upgraded
}

/// Runs the agent until SIGTERM/SIGINT, `limiter detach` or a finished upgrade. It
/// serves on the sockets `inherited` holds (an upgrade's or systemd's) and binds
/// the others; `ready` (an upgrade's) is told once it serves, or why it could not.
pub async fn run(
    config_path: PathBuf,
    loaded: LoadedConfig,
    mut inherited: Inherited,
    ready: Option<Ready>,
) -> Result<(), AgentError> {
    let running = match Running::start(config_path, loaded, &mut inherited).await {
        Ok(running) => running,
        Err(error) => {
            if let Some(ready) = ready {
                ready.failed(&error);
            }
            return Err(error);
        }
    };
    // Whatever was passed and not taken is closed.
    drop(inherited);
    if let Some(ready) = ready {
        ready.serving();
    }
    systemd::notify_ready();
    running.serve().await;
    Ok(())
}

/// The agent and what it listens on.
struct Running {
    agent: Agent,
    socket_path: PathBuf,
    admin: Admin,
    metrics: Option<Listening>,
    incoming: mpsc::Receiver<(Request, oneshot::Sender<Response>)>,
    signals: Signals,
}

/// The signals the agent acts on, handled from before it reports ready: SIGHUP's
/// and SIGUSR2's default is to end the process.
struct Signals {
    hangup: Signal,
    terminate: Signal,
    interrupt: Signal,
    user2: Signal,
}

impl Signals {
    fn new() -> Result<Self, AgentError> {
        let handle = |kind| signal(kind).map_err(AgentError::Signal);
        Ok(Self {
            hangup: handle(SignalKind::hangup())?,
            terminate: handle(SignalKind::terminate())?,
            interrupt: handle(SignalKind::interrupt())?,
            user2: handle(SignalKind::user_defined2())?,
        })
    }
}

impl Running {
    async fn start(config_path: PathBuf, loaded: LoadedConfig, inherited: &mut Inherited) -> Result<Self, AgentError> {
        let signals = Signals::new()?;
        let socket_path = loaded.config.agent.admin_socket.clone();
        let metrics_addr = loaded.config.agent.metrics;
        let lock = lock::AgentLock::acquire_or_inherit(&loaded.config, inherited)?;
        for proxy in loaded.config.unshielded_trusted_proxies() {
            tracing::warn!(%proxy, "trusted proxy not covered by an [[xdp.cidr]] allow or limit rule: XDP limits it as one client");
        }
        let mut agent = Agent::start(config_path, loaded, lock, inherited).await?;
        if let Some(logger) = agent.xdp.as_mut().and_then(|x| x.kernel.take_logger()) {
            spawn_log_reader(logger);
        }
        let metrics = match (metrics_addr, inherited.metrics()?) {
            (Some(addr), inherited) => {
                let error = |source| AgentError::Metrics { addr, source };
                let listener = match inherited.filter(|l| l.local_addr().is_ok_and(|at| at == addr)) {
                    Some(listener) => listener,
                    None => crate::metrics::bind(addr).await.map_err(error)?,
                };
                tracing::info!(%addr, "metrics at /metrics");
                let fd = listener.as_fd().try_clone_to_owned();
                Some(Listening::spawn(fd, crate::metrics::serve(listener, agent.metrics_sources())).map_err(error)?)
            }
            (None, _) => None,
        };
        let (requests, incoming) = mpsc::channel::<(Request, oneshot::Sender<Response>)>(16);
        let listener = match inherited.admin()? {
            Some(listener) => listener,
            None => bind_admin(&socket_path)?,
        };
        let admin = Admin::serve(listener, requests)
            .map_err(|source| AgentError::AdminSocket { path: socket_path.display().to_string(), source })?;
        Ok(Self { agent, socket_path, admin, metrics, incoming, signals })
    }

    async fn serve(mut self) {
        let agent = &mut self.agent;
        let Signals { hangup, terminate, interrupt, user2 } = &mut self.signals;
        let mut watch = tokio::time::interval(watch::WATCH_INTERVAL);
        let mut settle = watch::Settle::default();
        let mut escalations = agent.escalation.as_mut().and_then(|e| e.requests.take());
        tracing::info!(admin_socket = %self.socket_path.display(), pid = std::process::id(), "agent running");
        let exit = loop {
            tokio::select! {
                _ = hangup.recv() => { let _ = agent.reload(None); }
                _ = terminate.recv() => break Exit::Stop,
                _ = interrupt.recv() => break Exit::Stop,
                _ = user2.recv() => {
                    match hand_over(agent, &mut self.admin, self.metrics.as_ref()).await {
                        Ok(_) => break Exit::Upgraded,
                        Err(error) => tracing::error!(%error, "upgrade (SIGUSR2) failed"),
                    }
                }
                _ = watch.tick() => {
                    agent.follow_shedding();
                    if let Some(text) = agent.settled_edit(&mut settle) {
                        tracing::info!("config file changed");
                        let _ = agent.reload_text(None, Some(text));
                    }
                }
                Some(escalation) = next(&mut escalations) => agent.escalate(escalation),
                Some((request, reply)) = self.incoming.recv() => {
                    let (response, exit) = match request {
                        Request::Reload { config } => match agent.reload(config.as_deref()) {
                            Ok(changes) => (Response::Reloaded { changes }, None),
                            Err(error) => (Response::Rejected { error: error.to_string() }, None),
                        },
                        Request::Stats => (Response::Stats { stats: Box::new(agent.stats()) }, None),
                        Request::Top { n } => {
                            let clients = agent.proxy.as_ref().map(|p| p.proxy.top_clients(n));
                            (Response::Top { clients }, None)
                        }
                        Request::Suggest { headroom } => {
                            let suggestions = agent.proxy.as_ref().map(|p| p.proxy.suggest(headroom));
                            (Response::Suggested { suggestions }, None)
                        }
                        Request::Detach => (Response::Detaching, Some(Exit::Detach)),
                        Request::Upgrade => {
                            match hand_over(agent, &mut self.admin, self.metrics.as_ref()).await {
                                Ok(pid) => (Response::Upgraded { old: std::process::id(), new: pid }, Some(Exit::Upgraded)),
                                Err(error) => (Response::Rejected { error: error.to_string() }, None),
                            }
                        }
                        Request::Explain { request } => {
                            // Off the loop: with Redis, the look-up waits up to redis_timeout.
                            agent.explain(request, reply);
                            continue;
                        }
                        Request::Unblocked { cidr, keep_history } => {
                            agent.unblocked(cidr, keep_history, reply);
                            continue;
                        }
                    };
                    let _ = reply.send(response);
                    if let Some(exit) = exit { break exit; }
                }
            }
        };
        tracing::info!(?exit, "stopping");
        let Self { agent, socket_path, admin, metrics, incoming, .. } = self;
        if exit == Exit::Upgraded
            && let Some(metrics) = &metrics
        {
            // The new agent answers on it from now on.
            metrics.task.abort();
        }
        let late = tokio::spawn(answer_late(incoming, exit));
        agent.stop(exit).await;
        let mut admin = admin;
        admin.pause().await;
        drop(admin);
        // The process exits next: every answer is written first (the last of the
        // admin connections ends `late`), the upgrade's and the detach's among them.
        let _ = tokio::time::timeout(Duration::from_secs(1), late).await;
        // After an upgrade the socket's path is the new agent's.
        if exit != Exit::Upgraded {
            let _ = std::fs::remove_file(&socket_path);
        }
    }
}

/// Answers what reaches the admin socket once the agent loop has ended, until the
/// last admin connection is gone.
async fn answer_late(mut incoming: mpsc::Receiver<(Request, oneshot::Sender<Response>)>, exit: Exit) {
    let error = match exit {
        Exit::Upgraded => "this agent has handed over to a new one and is draining: ask again",
        Exit::Stop | Exit::Detach => "the agent is stopping",
    };
    while let Some((_, reply)) = incoming.recv().await {
        let _ = reply.send(Response::Rejected { error: error.to_owned() });
    }
}

/// The reload report's line for an interface a reload attached.
fn attached(attachment: &crate::xdp::Attachment) -> Change {
    Change::note("xdp.interfaces", format!("attached {} ({})", attachment.interface, attachment.mode))
}

fn detached(interface: &str) -> Change {
    Change::note("xdp.interfaces", format!("detached {interface}"))
}

/// The next escalation, or never without escalation.
async fn next(escalations: &mut Option<mpsc::Receiver<Escalation>>) -> Option<Escalation> {
    match escalations {
        Some(receiver) => receiver.recv().await,
        None => std::future::pending().await,
    }
}

impl EscalationRuntime {
    /// Hands the proxy its escalator and, with a shared store and escalation on,
    /// follows the fleet's blocks.
    fn start(config: &Config, proxy: &Proxy, gauges: &AgentGauges) -> Self {
        let (sender, requests) = mpsc::channel(ESCALATION_QUEUE);
        let enabled = config.escalation.as_ref().is_some_and(|e| e.enabled);
        // The proxy's own connection: the store is chosen once, in `backend`.
        let fleet = proxy.fleet().filter(|_| enabled).cloned();
        let escalator = Arc::new(Escalator::new(config, sender.clone(), SystemClock, fleet.clone()));
        proxy.escalate_to(escalator.clone());
        if let Some(fleet) = &fleet {
            tokio::spawn(escalation::follow(fleet.clone(), sender, gauges.blocks_refused.clone()));
        }
        Self { escalator, requests: Some(requests), fleet }
    }
}

fn bind_admin(path: &Path) -> Result<UnixListener, AgentError> {
    let error = |source| AgentError::AdminSocket { path: path.display().to_string(), source };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(error)?;
    }
    // A socket file left by a killed agent would make bind fail; a live agent
    // answering on it means a second one must not start.
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(error(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another agent is running")));
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(error)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(error)?;
    Ok(listener)
}

async fn serve_admin(listener: UnixListener, requests: mpsc::Sender<(Request, oneshot::Sender<Response>)>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                crate::accept::backoff("admin", &error).await;
                continue;
            }
        };
        let requests = requests.clone();
        tokio::spawn(async move {
            let mut stream = BufReader::new(stream);
            let Ok(Some(request)) =
                tokio::time::timeout(Duration::from_secs(5), admin::read_request(&mut stream)).await
            else {
                let _ =
                    admin::write_response(&mut stream, &Response::Rejected { error: "malformed request".to_owned() })
                        .await;
                return;
            };
            let (reply, answer) = oneshot::channel();
            if requests.send((request, reply)).await.is_err() {
                return;
            }
            if let Ok(response) = answer.await {
                let _ = admin::write_response(&mut stream, &response).await;
            }
        });
    }
}

/// Forwards the XDP program's aya-log records to the agent's log.
fn spawn_log_reader(logger: crate::xdp::Logger) {
    #[expect(deprecated, reason = "the AsyncFd owns the logger and with it the fd, which is what I/O safety asks")]
    let Ok(mut logger) = tokio::io::unix::AsyncFd::with_interest(logger, tokio::io::Interest::READABLE) else {
        tracing::warn!("cannot poll the XDP program's log; its records are dropped");
        return;
    };
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = logger.readable_mut().await else { return };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::LoadedConfig;
    use crate::config::ConfigError;

    const EXAMPLE: &str = include_str!("../../../config/limiter.toml");

    #[test]
    fn missing_secret_is_a_config_error_at_its_line() {
        let error = LoadedConfig::parse(EXAMPLE, Path::new("test.toml")).expect_err("no such secret file");
        let ConfigError::Invalid { line, key, message, .. } = error else { panic!("{error:?}") };
        assert_eq!(key, "proxy.keys[0].secrets");
        assert!(message.contains("/etc/limiter/keys/k-free-1"), "{message}");
        let expected = EXAMPLE.lines().position(|l| l.starts_with("secrets = ")).expect("secrets line") + 1;
        assert_eq!(line, expected);
    }
}
