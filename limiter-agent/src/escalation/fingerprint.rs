//! `[escalation.fingerprint]`: a TLS fingerprint's refusals, and the sources that
//! presented it lately. Bots that rotate their addresses over a residential proxy
//! pool never cross a per-source threshold, but they share a TLS stack: once the
//! requests presenting one fingerprint collect `threshold` refusals within `window`,
//! each source that presented it within `window` (the latest `max_sources`) is
//! blocked, one source at a time, as `[escalation]` blocks one.
//!
//! Counted in this agent's memory (a fleet shares the blocks, through the
//! escalation channel, not the counts), in bounded tables: at most
//! [`MAX_FINGERPRINTS`] fingerprints, the one presented least lately making room for
//! a new one, each with at most `max_sources` sources, the one seen least lately
//! making room.

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    num::NonZeroUsize,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use limiter_core::{
    LimitSpec,
    ja4::Ja4,
    limits::{Bucket, MemoryStore},
};

use crate::config::escalation::FingerprintEscalation;

/// Fingerprints tracked at once, both their sources and their refusals.
pub(super) const MAX_FINGERPRINTS: usize = 4096;

/// The counting policy of `settings`: its identity starts the counts over when the
/// threshold or window changes.
pub(super) fn policy(settings: &FingerprintEscalation) -> (LimitSpec, String) {
    let spec = super::counts::counting(settings.threshold, settings.window);
    (spec, format!("fingerprint escalation {:?}", (settings.threshold, settings.window)))
}

/// Each fingerprint's refusals and latest sources.
#[derive(Debug)]
pub(super) struct Fingerprints {
    refusals: MemoryStore,
    sources: Mutex<HashMap<Ja4, Sources>>,
}

/// One fingerprint's sources, the one seen latest last, each with when.
#[derive(Debug, Default)]
struct Sources(VecDeque<(IpAddr, Duration)>);

impl Sources {
    fn latest(&self) -> Duration {
        self.0.back().map_or(Duration::ZERO, |(_, at)| *at)
    }
}

impl Default for Fingerprints {
    fn default() -> Self {
        let capacity = NonZeroUsize::new(MAX_FINGERPRINTS).unwrap_or(NonZeroUsize::MIN);
        Self { refusals: MemoryStore::new(capacity).admitting_untracked(), sources: Mutex::default() }
    }
}

impl Fingerprints {
    /// Notes that `source` presented `ja4` at `now`, keeping at most `max_sources`.
    pub(super) fn presented(&self, ja4: Ja4, source: IpAddr, now: Duration, max_sources: usize) {
        let mut tables = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        if !tables.contains_key(&ja4)
            && tables.len() >= MAX_FINGERPRINTS
            && let Some(stalest) = tables.iter().min_by_key(|(_, sources)| sources.latest()).map(|(ja4, _)| *ja4)
        {
            tables.remove(&stalest);
        }
        let sources = &mut tables.entry(ja4).or_default().0;
        if let Some(at) = sources.iter().position(|(seen, _)| *seen == source) {
            sources.remove(at);
        }
        while sources.len() >= max_sources {
            sources.pop_front();
        }
        sources.push_back((source, now));
    }

    /// Counts one refusal of a request presenting `ja4` at `now` in `bucket`; past its
    /// threshold, the sources that presented it since `since`, which it forgets (its
    /// next crossing blocks those that come after).
    pub(super) fn refused(&self, bucket: Bucket<'_>, ja4: Ja4, now: Duration, since: Duration) -> Vec<IpAddr> {
        if !super::counts::crossed(&self.refusals, bucket, now) {
            return Vec::new();
        }
        let mut tables = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(Sources(sources)) = tables.remove(&ja4) else { return Vec::new() };
        sources.into_iter().filter(|(_, at)| *at >= since).map(|(source, _)| source).collect()
    }
}
