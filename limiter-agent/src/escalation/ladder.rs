//! Each source's offences (threshold crossings), which pick the rung of its next
//! penalty (`EscalationConfig::rung`): in this agent's memory, or in the fleet's
//! Redis with `proxy.store = "redis"`, so that an offence on any agent counts for
//! the fleet (`offences.lua`).
//!
//! A crossing within one `window` of the source's last offence is that offence
//! still: the rejections already in flight when it crossed, or a demoted source's
//! first ones, do not climb the ladder on their own.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use ipnet::IpNet;
use redis::Script;

use crate::fleet::Fleet;

/// Sources whose offences are remembered in memory at once. Past it, the one whose
/// last offence is oldest is forgotten (its history lapsed first, if any did): that
/// source's next offence starts the ladder again, a shorter penalty at worst.
const MAX_OFFENDERS: usize = 65_536;
/// Offences kept per source: enough rungs to reach any `block_ttl_max` from any
/// `block_ttl` with a factor of 2 or more.
const MAX_REMEMBERED: usize = 64;

/// How long and how far back offences count.
#[derive(Clone, Copy, Debug)]
pub(super) struct Memory {
    pub window: Duration,
    pub offence_memory: Duration,
}

/// Offence times per source, by the escalator's clock.
#[derive(Debug, Default)]
pub(super) struct Histories(Mutex<Offenders>);

#[derive(Debug, Default)]
struct Offenders {
    histories: HashMap<IpNet, VecDeque<Duration>>,
    /// Each source by its last offence, so that the one to forget at the bound is
    /// found without a walk: a botnet's sources offending at once must not make
    /// each offence cost the whole map.
    by_last: BTreeSet<(Duration, IpNet)>,
}

impl Histories {
    /// Records an offence of `cidr` at `now`; how many it has within the memory,
    /// this one included, or `None` if it is its last one still.
    pub(super) fn offend(&self, cidr: IpNet, now: Duration, memory: Memory) -> Option<u32> {
        let mut offenders = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Offenders { histories, by_last } = &mut *offenders;
        if histories.len() >= MAX_OFFENDERS
            && !histories.contains_key(&cidr)
            && let Some((_, oldest)) = by_last.pop_first()
        {
            histories.remove(&oldest);
        }
        let history = histories.entry(cidr).or_default();
        let last = history.back().copied();
        while history.front().is_some_and(|at| now.saturating_sub(*at) >= memory.offence_memory) {
            history.pop_front();
        }
        if history.back().is_some_and(|last| now.saturating_sub(*last) < memory.window) {
            return None;
        }
        history.push_back(now);
        if history.len() > MAX_REMEMBERED {
            history.pop_front();
        }
        if let Some(last) = last {
            by_last.remove(&(last, cidr));
        }
        by_last.insert((now, cidr));
        Some(u32::try_from(history.len()).unwrap_or(u32::MAX))
    }

    pub(super) fn forget(&self, cidr: IpNet) {
        let mut offenders = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = offenders.histories.remove(&cidr).and_then(|history| history.back().copied()) {
            offenders.by_last.remove(&(last, cidr));
        }
    }
}

#[cfg(test)]
impl Histories {
    /// Sources remembered, and whether the index agrees.
    pub(super) fn len(&self) -> (usize, bool) {
        let offenders = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (offenders.histories.len(), offenders.histories.len() == offenders.by_last.len())
    }
}

/// The fleet's histories, and this agent's own to decide by while Redis is away.
#[derive(Debug)]
pub(super) struct RedisOffences {
    fleet: Fleet,
    fallback: Histories,
}

fn script() -> Script {
    Script::new(include_str!("offences.lua"))
}

impl RedisOffences {
    pub(super) fn new(fleet: Fleet) -> Self {
        Self { fleet, fallback: Histories::default() }
    }

    fn key(&self, cidr: IpNet) -> String {
        self.fleet.key(&format!("offences:{cidr}"))
    }

    /// [`Histories::offend`] in the fleet's Redis (by its clock), or in this agent's
    /// own histories while Redis cannot be reached.
    pub(super) async fn offend(&self, cidr: IpNet, now: Duration, memory: Memory) -> Option<u32> {
        let script = script();
        let key = self.key(cidr);
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        let answer: Result<u32, _> = self
            .fleet
            .call(|mut connection| {
                let mut invocation = script.key(&key);
                invocation.arg("offend").arg(millis(memory.offence_memory)).arg(millis(memory.window));
                invocation.arg(MAX_REMEMBERED);
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await;
        match answer {
            Ok(0) => None,
            Ok(offences) => Some(offences),
            Err(error) => {
                tracing::debug!(%error, %cidr, "offence counted locally: the fleet's Redis did not answer");
                self.fallback.offend(cidr, now, memory)
            }
        }
    }

    /// Forgets `cidr`'s history here and in the fleet.
    pub(super) async fn forget(&self, cidr: IpNet) -> Result<(), crate::fleet::FleetError> {
        self.fallback.forget(cidr);
        let script = script();
        let key = self.key(cidr);
        let _: i64 = self
            .fleet
            .call(|mut connection| {
                let mut invocation = script.key(&key);
                invocation.arg("forget");
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await?;
        Ok(())
    }
}
