//! Escalation (`[escalation]`): a source the proxy keeps refusing is blocked in the
//! kernel layer, so that it stops costing the proxy anything.
//!
//! The proxy counts each refusal a directly connected client caused itself (see
//! `proxy/blame.rs`: never one a third party can bring about), and each answer of the
//! upstream with a status of `upstream_statuses` (a login's 401), in the
//! [`Escalator`], a sliding window log per source (the limits' own algorithm), kept
//! where `proxy.store` keeps the limits (`counts.rs`). The rejection past
//! `threshold` within `window` is an offence ([`Escalator::offend`]), whose penalty
//! climbs a ladder (`ladder.rs`): the first blocks the source for `block_ttl` (or,
//! with `demote_first`, puts it in a slow kernel bucket), each later one within
//! `offence_memory` for `block_ttl_factor` times the last block, up to
//! `block_ttl_max`. The [`Escalation`] goes to the agent loop, which owns the kernel
//! maps and puts the penalty in place (the kernel drops the source, or limits it at
//! the demoted rate, until the TTL lapses). Clients behind a trusted
//! proxy are never escalated: their packets come from the proxy, which a block would
//! cut off whole.
//!
//! With `store = "redis"` the agent also publishes each escalation ([`publish`]):
//! every agent of the fleet follows the channel ([`follow`]) and blocks the source
//! too, and an agent that starts (or reconnects) later learns the blocks still active
//! from a sorted set kept beside the channel.
//!
//! Every block, crossed here or learnt from the fleet, is checked against this
//! agent's config before it reaches the kernel ([`Escalator::admit`]): exactly one
//! source wide (IPv4 /32, IPv6 `/ipv6_prefix`), and covering no `allow` CIDR and no
//! trusted proxy. Whoever can publish on the channel could otherwise drop all
//! traffic of every agent with one `0.0.0.0/0`. A block lasts no longer than the
//! longest this agent's ladder gives (a demotion than its `demote_first.ttl`),
//! whatever TTL it was published with.
//!
//! Each block is also kept here, keyed by the source as the proxy resolved it
//! ([`Escalator::blocked`]): a client behind a PROXY protocol balancer reaches the
//! kernel layer as the balancer, so its block there does nothing, and the proxy
//! closes its connections itself once the balancer's header names it.
//!
//! `[escalation.fingerprint]` counts refusals per TLS fingerprint too: past its
//! threshold, each source that presented the fingerprint lately commits an offence
//! ([`Escalator::offend`]; `fingerprint.rs`), through the same ladder, channel and
//! [`Escalator::admit`].

mod counts;
mod fingerprint;
mod ladder;

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::StreamExt as _;
use ipnet::IpNet;
use redis::Script;
use tokio::sync::mpsc;

use limiter_core::{
    Clock, LimitSpec, SystemClock,
    ja4::Ja4,
    limits::{Bucket, MemoryStore},
};

use self::{
    counts::RedisCounts,
    fingerprint::Fingerprints,
    ladder::{Histories, RedisOffences},
};
use crate::{
    backend::Backend,
    config::{
        Config,
        escalation::{EscalationConfig, FingerprintEscalation, Rung},
        xdp::{CidrAction, PacketLimit},
    },
    fleet::{Fleet, FleetError, MAX_BACKOFF, MIN_BACKOFF},
};

/// A penalty to put in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Escalation {
    pub cidr: IpNet,
    pub penalty: Penalty,
    pub ttl: Duration,
    /// Crossed on this agent (so to publish), or learnt from the fleet.
    pub local: bool,
}

/// What the kernel layer does to an escalated source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Penalty {
    /// Drops it.
    Block,
    /// Limits it at this rate in place of its own (its bucket kept).
    Demote(PacketLimit),
}

/// Counts rejections per source and escalates those past the threshold, measuring
/// the window with the proxy's clock `C`.
#[derive(Debug)]
pub struct Escalator<C: Clock = SystemClock> {
    settings: RwLock<Arc<Settings>>,
    store: Backend<Local, Arc<Fleetwide>>,
    clock: C,
    sender: mpsc::Sender<Escalation>,
    blocked: Arc<Blocked>,
    fingerprints: Fingerprints,
}

/// Rejections and offences per source, counted by this agent alone.
#[derive(Debug)]
struct Local {
    counts: MemoryStore,
    histories: Histories,
}

/// Rejections and offences per source, counted in the fleet's Redis.
#[derive(Debug)]
struct Fleetwide {
    counts: RedisCounts,
    offences: RedisOffences,
}

/// The blocks in force, until when (by the escalator's clock).
#[derive(Debug, Default)]
struct Blocked(Mutex<HashMap<IpNet, Duration>>);

/// Blocks kept for the proxy at most: past it the one lapsing soonest goes first
/// (the kernel layer still holds it).
const MAX_BLOCKED: usize = 65_536;

impl Blocked {
    fn insert(&self, escalation: &Escalation, now: Duration) {
        let mut blocked = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if blocked.len() >= MAX_BLOCKED {
            blocked.retain(|_, until| *until > now);
        }
        if blocked.len() >= MAX_BLOCKED
            && let Some(soonest) = blocked.iter().min_by_key(|(_, until)| **until).map(|(cidr, _)| *cidr)
        {
            blocked.remove(&soonest);
        }
        let until = blocked.entry(escalation.cidr).or_default();
        *until = (*until).max(now.saturating_add(escalation.ttl));
    }

    fn remove(&self, cidr: IpNet) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&cidr);
    }

    fn contains(&self, cidr: IpNet, now: Duration) -> bool {
        let mut blocked = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match blocked.get(&cidr) {
            Some(until) if *until > now => true,
            Some(_) => {
                blocked.remove(&cidr);
                false
            }
            None => false,
        }
    }
}

#[derive(Debug)]
struct Settings {
    /// `None`: disabled.
    limit: Option<LimitSpec>,
    /// The counting policy's identity: a new window or threshold starts over.
    identity: Arc<str>,
    /// `[escalation]`, if on.
    escalation: Option<EscalationConfig>,
    /// `allow` CIDRs and trusted proxies: never blocked, not even in part.
    protected: Vec<IpNet>,
    ipv6_prefix: u8,
    /// The upstream's answers that count as refusals.
    upstream_statuses: Vec<http::StatusCode>,
    /// `[escalation.fingerprint]`, with its counting policy and that policy's
    /// identity; `None`: off.
    fingerprint: Option<(FingerprintEscalation, LimitSpec, Arc<str>)>,
}

/// Why a block was not put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BlockRefused {
    #[error("{0} is not one source wide (IPv4 /32, IPv6 /xdp.ipv6_prefix)")]
    NotOneSource(IpNet),
    #[error("{0} overlaps {1}, an allow CIDR or trusted proxy")]
    Protected(IpNet, IpNet),
}

impl BlockRefused {
    /// The security log's `reason`.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::NotOneSource(_) => "not_one_source",
            Self::Protected(..) => "protected",
        }
    }
}

impl Settings {
    fn new(config: &Config) -> Self {
        let escalation = config.escalation.clone().filter(|e| e.enabled);
        let limit = escalation.as_ref().map(|e| counts::counting(e.threshold, e.window));
        let identity = format!("escalation {:?}", limit.as_ref().map(|l| (l.limit, l.window)));
        let xdp = config.xdp.as_ref();
        Self {
            limit,
            identity: identity.into(),
            protected: xdp
                .iter()
                .flat_map(|x| x.cidr.iter().filter(|c| c.action == CidrAction::Allow).map(|c| c.cidr))
                .chain(config.proxy.iter().flat_map(|p| p.trusted_proxies.iter().copied()))
                .collect(),
            ipv6_prefix: xdp.map_or(64, |x| x.ipv6_prefix.0),
            upstream_statuses: escalation.as_ref().map(|e| e.upstream_statuses.clone()).unwrap_or_default(),
            fingerprint: escalation.as_ref().and_then(|e| e.fingerprint).map(|settings| {
                let (spec, identity) = fingerprint::policy(&settings);
                (settings, spec, identity.into())
            }),
            escalation,
        }
    }

    /// The longest `penalty` this agent puts in place, whoever asks: `None`
    /// without escalation (then the fleet's TTL stands).
    fn longest(&self, penalty: Penalty) -> Option<Duration> {
        let escalation = self.escalation.as_ref()?;
        Some(match (penalty, escalation.demote_first) {
            (Penalty::Demote(_), Some(demotion)) => demotion.ttl,
            _ => escalation.longest_block(),
        })
    }

    /// The CIDR the kernel layer tracks `source` under (IPv6 by its prefix).
    fn cidr(&self, source: IpAddr) -> IpNet {
        let source = source.to_canonical();
        let prefix = if source.is_ipv4() { 32 } else { self.ipv6_prefix };
        IpNet::new(source, prefix).map_or(IpNet::from(source), |net| net.trunc())
    }

    /// The counting bucket of the source `key`; `None` with escalation off.
    fn bucket<'a>(&'a self, key: &'a str) -> Option<Bucket<'a>> {
        Some(Bucket { policy: &self.identity, key, spec: self.limit.as_ref()? })
    }

    fn check(&self, cidr: IpNet) -> Result<(), BlockRefused> {
        if self.cidr(cidr.addr()) != cidr {
            return Err(BlockRefused::NotOneSource(cidr));
        }
        // Either way round: an allow CIDR narrower than the IPv6 prefix lies inside
        // the block.
        match self.protected.iter().find(|p| p.contains(&cidr) || cidr.contains(*p)) {
            Some(protected) => Err(BlockRefused::Protected(cidr, *protected)),
            None => Ok(()),
        }
    }
}

impl<C: Clock> Escalator<C> {
    /// Escalations go to `sender`, the agent loop. Rejections are counted in the
    /// Redis of `fleet` when there is one (then [`Self::record`] needs a tokio
    /// runtime), else in memory; `clock` is the proxy's.
    #[must_use]
    pub fn new(config: &Config, sender: mpsc::Sender<Escalation>, clock: C, fleet: Option<Fleet>) -> Self {
        Self {
            settings: RwLock::new(Arc::new(Settings::new(config))),
            store: match fleet {
                None => Backend::Memory(Local { counts: counts::memory(), histories: Histories::default() }),
                Some(fleet) => Backend::Redis(Arc::new(Fleetwide {
                    counts: RedisCounts::new(fleet.clone()),
                    offences: RedisOffences::new(fleet),
                })),
            },
            clock,
            sender,
            blocked: Arc::default(),
            fingerprints: Fingerprints::default(),
        }
    }

    /// Takes a new config's `[escalation]` and allowlist.
    pub fn reconfigure(&self, config: &Config) {
        *self.settings.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(Settings::new(config));
    }

    /// The penalty to put in place for `escalation` under the current config:
    /// refused unless one source wide and clear of protected addresses, and lasting
    /// no longer than this agent's longest block (a demotion: `demote_first.ttl`);
    /// whoever publishes on the fleet's channel could otherwise block a source for
    /// years.
    pub fn admit(&self, escalation: Escalation) -> Result<Escalation, BlockRefused> {
        let settings = self.settings.read().unwrap_or_else(PoisonError::into_inner);
        settings.check(escalation.cidr)?;
        let ttl = settings.longest(escalation.penalty).map_or(escalation.ttl, |longest| escalation.ttl.min(longest));
        let admitted = Escalation { ttl, ..escalation };
        if admitted.penalty == Penalty::Block {
            self.blocked.insert(&admitted, self.clock.now());
        }
        Ok(admitted)
    }

    /// `limiter unblock` lifted `cidr`'s block: the proxy lets it in again, and its
    /// offences are forgotten (here and in the fleet) unless `keep_history`.
    pub async fn unblocked(&self, cidr: IpNet, keep_history: bool) -> Result<(), FleetError> {
        self.blocked.remove(cidr);
        if keep_history {
            return Ok(());
        }
        match &self.store {
            Backend::Memory(local) => {
                local.histories.forget(cidr);
                Ok(())
            }
            Backend::Redis(fleetwide) => fleetwide.offences.forget(cidr).await,
        }
    }

    /// Whether `source` (as the proxy resolved it: the client a PROXY header named)
    /// is blocked now, by this agent's escalation or the fleet's.
    pub fn blocked(&self, source: IpAddr) -> bool {
        let cidr = self.settings.read().unwrap_or_else(PoisonError::into_inner).cidr(source);
        self.blocked.contains(cidr, self.clock.now())
    }

    /// Whether an answer of the upstream with `status` counts as a rejection
    /// (`upstream_statuses`).
    pub fn counts_upstream(&self, status: http::StatusCode) -> bool {
        self.settings.read().unwrap_or_else(PoisonError::into_inner).upstream_statuses.contains(&status)
    }

    /// Counts one rejection of a directly connected `source`.
    pub fn record(&self, source: IpAddr) {
        let settings = Arc::clone(&self.settings.read().unwrap_or_else(PoisonError::into_inner));
        if settings.limit.is_none() {
            return;
        }
        let cidr = settings.cidr(source);
        if settings.check(cidr).is_err() {
            return;
        }
        // Read at the rejection: a count that falls back after Redis failed to answer
        // is still of its time.
        let (key, now) = (cidr.to_string(), self.clock.now());
        match &self.store {
            Backend::Memory(local) => {
                if settings.bucket(&key).is_some_and(|bucket| counts::crossed(&local.counts, bucket, now)) {
                    self.punish(&settings, cidr, now);
                }
            }
            Backend::Redis(fleetwide) => {
                let fleetwide = Arc::clone(fleetwide);
                let (sender, blocked) = (self.sender.clone(), Arc::clone(&self.blocked));
                tokio::spawn(async move {
                    let Some(bucket) = settings.bucket(&key) else { return };
                    if fleetwide.counts.crossed(bucket, now).await {
                        punish_in_fleet(&settings, &fleetwide, &sender, &blocked, cidr, now).await;
                    }
                });
            }
        }
    }

    /// One offence of `source`, whatever saw it (the proxy's refusals past the
    /// threshold, or another escalation such as a fingerprint's): the ladder picks
    /// its penalty and the agent loop puts it in place. Never for a protected source.
    /// With the fleet's Redis, needs a tokio runtime.
    /// `false`: the source is protected (or escalation off), and nothing was done.
    pub fn offend(&self, source: IpAddr) -> bool {
        let settings = Arc::clone(&self.settings.read().unwrap_or_else(PoisonError::into_inner));
        let cidr = settings.cidr(source);
        if settings.escalation.is_none() || settings.check(cidr).is_err() {
            return false;
        }
        self.punish(&settings, cidr, self.clock.now());
        true
    }

    /// Records an offence of `cidr` (a source already checked) at `now` and sends
    /// the penalty its ladder gives.
    fn punish(&self, settings: &Arc<Settings>, cidr: IpNet, now: Duration) {
        match &self.store {
            Backend::Memory(local) => {
                let penalty = ladder_of(settings, &self.blocked, cidr, now).and_then(|(escalation, memory)| {
                    let offence = match memory {
                        Some(memory) => local.histories.offend(cidr, now, memory)?,
                        None => 1,
                    };
                    Some(escalation_of(escalation, cidr, offence))
                });
                escalate(&self.sender, &self.blocked, penalty, now);
            }
            Backend::Redis(fleetwide) => {
                let (settings, fleetwide) = (Arc::clone(settings), Arc::clone(fleetwide));
                let (sender, blocked) = (self.sender.clone(), Arc::clone(&self.blocked));
                tokio::spawn(async move { punish_in_fleet(&settings, &fleetwide, &sender, &blocked, cidr, now).await });
            }
        }
    }
}

/// [`Escalator::punish`], the history in the fleet's Redis.
async fn punish_in_fleet(
    settings: &Settings,
    fleetwide: &Fleetwide,
    sender: &mpsc::Sender<Escalation>,
    blocked: &Blocked,
    cidr: IpNet,
    now: Duration,
) {
    let Some((escalation, memory)) = ladder_of(settings, blocked, cidr, now) else { return };
    let offence = match memory {
        Some(memory) => fleetwide.offences.offend(cidr, now, memory).await,
        None => Some(1),
    };
    let penalty = offence.map(|offence| escalation_of(escalation, cidr, offence));
    escalate(sender, blocked, penalty, now);
}

/// The ladder that applies to an offence of `cidr` at `now`: `None` while the source
/// is blocked already (a block lifted early is forgotten by `limiter unblock`), or
/// with escalation off; the memory is `None` for a ladder of one rung, which needs
/// no history.
fn ladder_of<'a>(
    settings: &'a Settings,
    blocked: &Blocked,
    cidr: IpNet,
    now: Duration,
) -> Option<(&'a EscalationConfig, Option<ladder::Memory>)> {
    let escalation = settings.escalation.as_ref()?;
    if !escalation.ladder() {
        return Some((escalation, None));
    }
    if blocked.contains(cidr, now) {
        return None;
    }
    Some((escalation, Some(ladder::Memory { window: escalation.window, offence_memory: escalation.offence_memory })))
}

/// The penalty of `cidr`'s `offence`-th offence.
fn escalation_of(escalation: &EscalationConfig, cidr: IpNet, offence: u32) -> Escalation {
    let (penalty, ttl) = match escalation.rung(offence) {
        Rung::Block(ttl) => (Penalty::Block, ttl),
        Rung::Demote(demotion) => (Penalty::Demote(demotion.limit), demotion.ttl),
    };
    Escalation { cidr, penalty, ttl, local: true }
}

impl<C: Clock> Escalator<C> {
    /// Whether `[escalation.fingerprint]` is on: only then are sources noted.
    pub fn counts_fingerprints(&self) -> bool {
        self.settings.read().unwrap_or_else(PoisonError::into_inner).fingerprint.is_some()
    }

    /// Notes that `source`, connected directly, presented `ja4` in its handshake.
    pub fn presented(&self, ja4: Ja4, source: IpAddr) {
        let settings = Arc::clone(&self.settings.read().unwrap_or_else(PoisonError::into_inner));
        let Some((fingerprint, ..)) = &settings.fingerprint else { return };
        let max_sources = usize::try_from(fingerprint.max_sources.get()).unwrap_or(usize::MAX);
        self.fingerprints.presented(ja4, source.to_canonical(), self.clock.now(), max_sources);
    }

    /// Counts one refusal of a request presenting `ja4` (from a source connected
    /// directly); the one past `threshold` within `window` is an offence of each
    /// source that presented it within `window`, punished as [`Self::record`]
    /// punishes one (blocked, or demoted by `demote_first`): one source wide, never
    /// an `allow` CIDR or a trusted proxy.
    pub fn record_fingerprint(&self, ja4: Ja4) {
        let settings = Arc::clone(&self.settings.read().unwrap_or_else(PoisonError::into_inner));
        let Some((fingerprint, spec, identity)) = &settings.fingerprint else { return };
        let key = ja4.to_string();
        let now = self.clock.now();
        let bucket = Bucket { policy: identity, key: &key, spec };
        let sources = self.fingerprints.refused(bucket, ja4, now, now.saturating_sub(fingerprint.window));
        if sources.is_empty() {
            return;
        }
        let punished = sources.into_iter().filter(|source| self.offend(*source)).count();
        tracing::warn!(%ja4, sources = punished, "TLS fingerprint escalated: each recent source takes its ladder's next penalty");
    }
}

/// Blocks `escalation` here at once (the agent loop also puts it in the kernel
/// layer) and hands it to the agent loop; nothing for `None`.
fn escalate(sender: &mpsc::Sender<Escalation>, blocked: &Blocked, escalation: Option<Escalation>, now: Duration) {
    let Some(escalation) = escalation else { return };
    if escalation.penalty == Penalty::Block {
        blocked.insert(&escalation, now);
    }
    // A full queue means the agent is busy blocking; the source's next rejection
    // tries again.
    let _ = sender.try_send(escalation);
}

/// The fleet's names for escalations: the set of its active blocks, or demotions.
fn penalties_key(fleet: &Fleet, demotions: bool) -> String {
    fleet.key(if demotions { "demotions" } else { "blocks" })
}

fn channel(fleet: &Fleet) -> String {
    fleet.key("escalations")
}

fn script() -> Script {
    Script::new(include_str!("blocks.lua"))
}

/// Tells every agent of the fleet to block (or demote) `escalation.cidr`, and
/// records the penalty for agents that start later.
pub(crate) async fn publish(fleet: &Fleet, escalation: Escalation) -> Result<(), FleetError> {
    let script = script();
    let (member, demotion) = match escalation.penalty {
        Penalty::Block => (escalation.cidr.to_string(), false),
        Penalty::Demote(limit) => {
            (format!("demote {} {} {}", escalation.cidr, limit.packets_per_second, limit.burst), true)
        }
    };
    let (key, channel) = (penalties_key(fleet, demotion), channel(fleet));
    let ttl = u64::try_from(escalation.ttl.as_millis()).unwrap_or(u64::MAX).max(1);
    let _receivers: i64 = fleet
        .call(|mut connection| {
            let mut invocation = script.key(&key);
            invocation.arg("add").arg(&member).arg(ttl).arg(&channel);
            async move { invocation.invoke_async(&mut connection).await }
        })
        .await?;
    Ok(())
}

/// Follows the fleet's escalations for as long as `sender` is open: the blocks and
/// demotions still active first, then each one published. Reconnects with backoff,
/// learning the active ones again each time, so that none published meanwhile is
/// missed.
/// Malformed entries are counted in `refused`.
pub async fn follow(fleet: Fleet, sender: mpsc::Sender<Escalation>, refused: Arc<AtomicU64>) {
    let mut backoff = MIN_BACKOFF;
    while !sender.is_closed() {
        match follow_once(&fleet, &sender, &refused).await {
            Ok(()) => backoff = MIN_BACKOFF,
            Err(error) => {
                tracing::debug!(%error, "following the fleet's escalations");
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

async fn follow_once(fleet: &Fleet, sender: &mpsc::Sender<Escalation>, refused: &AtomicU64) -> Result<(), FleetError> {
    let mut pubsub = fleet.pubsub().await?;
    // Subscribed before listing, so that a block published in between is not lost.
    pubsub.subscribe(channel(fleet)).await?;
    let script = script();
    for demotions in [false, true] {
        let key = penalties_key(fleet, demotions);
        let active: Vec<String> = fleet
            .call(|mut connection| {
                let mut invocation = script.key(&key);
                invocation.arg("list");
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await?;
        for pair in active.chunks_exact(2) {
            if let Some(escalation) = parse_counted(&format!("{} {}", pair[0], pair[1]), refused) {
                let _ = sender.send(escalation).await;
            }
        }
    }
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let text = message.get_payload::<String>().unwrap_or_default();
        if let Some(escalation) = parse_counted(&text, refused)
            && sender.send(escalation).await.is_err()
        {
            return Ok(());
        }
    }
    Err(FleetError::Down)
}

fn parse_counted(text: &str, refused: &AtomicU64) -> Option<Escalation> {
    let escalation = parse(text);
    if escalation.is_none() {
        refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(message = %text, "ignoring a malformed fleet escalation");
    }
    escalation
}

/// `CIDR TTL_MS` or `demote CIDR PPS BURST TTL_MS`, as published.
fn parse(text: &str) -> Option<Escalation> {
    let words: Vec<&str> = text.split(' ').collect();
    let (cidr, penalty, ttl) = match words[..] {
        [cidr, ttl] => (cidr, Penalty::Block, ttl),
        ["demote", cidr, pps, burst, ttl] => {
            let limit = PacketLimit::new(pps.parse().ok()?, burst.parse().ok()?).ok()?;
            (cidr, Penalty::Demote(limit), ttl)
        }
        _ => return None,
    };
    let ttl = ttl.parse::<u64>().ok().filter(|&ms| ms > 0)?;
    Some(Escalation { cidr: cidr.parse().ok()?, penalty, ttl: Duration::from_millis(ttl), local: false })
}

#[cfg(test)]
mod tests;
