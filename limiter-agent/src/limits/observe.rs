//! What each policy has seen of its keys, for `limiter suggest`: the distribution of
//! per-key peaks (the most requests one key sent in any one window of the policy),
//! whatever the verdicts were, so that shadow mode shows the demand a limit would meet.
//!
//! Bounded in memory whatever the traffic: keys active in the current or the previous
//! window are tracked one by one (at most [`LIVE_KEYS`]; requests of keys beyond that
//! are counted as untracked), and a key idle for a whole window retires into a
//! fixed-size histogram, its peak final.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use serde::{Deserialize, Serialize};

/// Keys tracked one by one per policy.
pub const LIVE_KEYS: usize = 4096;

/// Peaks below this are counted exactly; above, in [`SUB_BUCKETS`] buckets per power
/// of two (within 1/16 of the value).
const EXACT: u32 = 256;
const SUB_BUCKETS: u32 = 16;
const BUCKETS: usize = EXACT as usize + (32 - 8) * SUB_BUCKETS as usize;

#[derive(Debug)]
pub(super) struct Observation {
    window: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the observation started (the limiter's clock).
    since: Duration,
    /// The window the live keys were last swept at.
    swept: u64,
    live: HashMap<String, KeyPeak>,
    retired: Box<[u64; BUCKETS]>,
    untracked: u64,
}

#[derive(Debug, Clone, Copy)]
struct KeyPeak {
    /// The window `count` is for.
    window: u64,
    count: u32,
    /// The most in any earlier window.
    peak: u32,
}

impl KeyPeak {
    fn best(&self) -> u32 {
        self.peak.max(self.count)
    }
}

/// The distribution of per-key peaks one policy has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peaks {
    /// Seconds observed.
    pub observed_secs: u64,
    /// Keys seen (one by one).
    pub keys: u64,
    /// Requests of keys beyond [`LIVE_KEYS`] at once, not in the distribution.
    pub untracked_requests: u64,
    pub p50: u32,
    pub p95: u32,
    pub p99: u32,
    pub max: u32,
    /// Keys whose peak went over `limit`.
    pub keys_over: u64,
}

impl Observation {
    pub(super) fn new(window: Duration, now: Duration) -> Self {
        let state = State { since: now, swept: 0, live: HashMap::new(), retired: Box::new([0; BUCKETS]), untracked: 0 };
        Self { window, state: Mutex::new(state) }
    }

    fn window_at(&self, now: Duration) -> u64 {
        u64::try_from(now.as_nanos() / self.window.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// Counts one request of `key` at `now`.
    pub(super) fn observe(&self, key: &str, now: Duration) {
        let window = self.window_at(now);
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if window > state.swept {
            state.sweep(window);
        }
        if !state.live.contains_key(key) {
            if state.live.len() >= LIVE_KEYS {
                state.untracked += 1;
                return;
            }
            state.live.insert(key.to_owned(), KeyPeak { window, count: 0, peak: 0 });
        }
        let Some(entry) = state.live.get_mut(key) else { return };
        if entry.window != window {
            entry.peak = entry.best();
            entry.count = 0;
            entry.window = window;
        }
        entry.count = entry.count.saturating_add(1);
    }

    /// The distribution so far, and how many keys went over `limit`.
    pub(super) fn peaks(&self, limit: u32, now: Duration) -> Peaks {
        let state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut histogram = state.retired.clone();
        for peak in state.live.values() {
            histogram[bucket(peak.best())] += 1;
        }
        let keys: u64 = histogram.iter().sum();
        let over = histogram.iter().enumerate().filter(|(i, _)| lower_bound(*i) > limit).map(|(_, n)| n).sum();
        let rank = |p: f64| {
            // Nearest rank: the smallest peak that at least p of the keys stay at or under.
            let wanted = ((p * keys as f64).ceil() as u64).max(1);
            let mut seen = 0;
            histogram.iter().enumerate().find_map(|(i, n)| {
                seen += n;
                (seen >= wanted).then(|| lower_bound(i))
            })
        };
        Peaks {
            observed_secs: now.saturating_sub(state.since).as_secs(),
            keys,
            untracked_requests: state.untracked,
            p50: rank(0.50).unwrap_or(0),
            p95: rank(0.95).unwrap_or(0),
            p99: rank(0.99).unwrap_or(0),
            max: state.live.values().map(KeyPeak::best).chain(max_retired(&state.retired)).max().unwrap_or(0),
            keys_over: over,
        }
    }
}

impl State {
    /// Retires the keys idle since before the previous window: their peaks are final.
    fn sweep(&mut self, window: u64) {
        let retired = &mut self.retired;
        self.live.retain(|_, peak| {
            let keep = peak.window + 1 >= window;
            if !keep {
                retired[bucket(peak.best())] += 1;
            }
            keep
        });
        self.swept = window;
    }
}

/// The largest peak in the retired histogram (its bucket's lower bound).
fn max_retired(histogram: &[u64; BUCKETS]) -> Option<u32> {
    histogram.iter().rposition(|n| *n > 0).map(lower_bound)
}

fn bucket(value: u32) -> usize {
    if value < EXACT {
        return value as usize;
    }
    let power = 31 - value.leading_zeros(); // 8 and up
    let sub = (value >> (power - 4)) & (SUB_BUCKETS - 1);
    EXACT as usize + ((power - 8) * SUB_BUCKETS + sub) as usize
}

/// The smallest value in bucket `i`.
fn lower_bound(i: usize) -> u32 {
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    if i < EXACT {
        return i;
    }
    let (power, sub) = ((i - EXACT) / SUB_BUCKETS + 8, (i - EXACT) % SUB_BUCKETS);
    (1 << power) | (sub << (power - 4))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{EXACT, LIVE_KEYS, Observation, bucket, lower_bound};

    const MINUTE: Duration = Duration::from_secs(60);
    const T0: Duration = Duration::from_secs(1_700_000_040);

    #[test]
    fn buckets_are_exact_below_256_and_within_a_sixteenth_above() {
        for value in [0, 1, 255, 256, 257, 300, 1_000, 65_535, 1 << 20, u32::MAX] {
            let low = lower_bound(bucket(value));
            assert!(low <= value, "{value}");
            if value < EXACT {
                assert_eq!(low, value);
            } else {
                assert!(f64::from(value - low) <= f64::from(value) / 16.0, "{value} in a bucket from {low}");
            }
        }
    }

    /// 90 keys peak at 2, 9 at 8 and one at 30 in a minute: nearest-rank
    /// percentiles, the maximum, and the one key over a limit of 10.
    #[test]
    fn peaks_are_per_key_over_any_window() {
        let observation = Observation::new(MINUTE, T0);
        let mut at = T0;
        for (keys, each, prefix) in [(90, 2, "light"), (9, 8, "busy"), (1, 30, "heavy")] {
            for key in 0..keys {
                for _ in 0..each {
                    observation.observe(&format!("{prefix}-{key}"), at);
                    at += Duration::from_millis(1);
                }
            }
        }
        // A minute later the light keys come back with 1 each: their peaks stay 2.
        for key in 0..90 {
            observation.observe(&format!("light-{key}"), T0 + MINUTE);
        }
        let peaks = observation.peaks(10, T0 + MINUTE * 3);
        assert_eq!((peaks.keys, peaks.p50, peaks.p95, peaks.p99, peaks.max), (100, 2, 8, 8, 30));
        assert_eq!((peaks.keys_over, peaks.observed_secs, peaks.untracked_requests), (1, 180, 0));
    }

    /// Keys idle for a window retire into the histogram; the live table never holds
    /// more than LIVE_KEYS, and what does not fit is counted, not lost silently.
    #[test]
    fn memory_stays_bounded_through_a_flood_of_keys() {
        let observation = Observation::new(MINUTE, T0);
        for key in 0..(LIVE_KEYS + 10) {
            observation.observe(&format!("k{key}"), T0);
        }
        assert_eq!(observation.peaks(100, T0).untracked_requests, 10);
        // Two windows on, every key has retired and there is room again.
        observation.observe("late", T0 + MINUTE * 2);
        let state = observation.state.lock().expect("state");
        assert_eq!(state.live.len(), 1);
        assert_eq!(state.retired.iter().sum::<u64>(), LIVE_KEYS as u64);
    }
}
