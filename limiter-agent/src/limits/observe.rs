//! What each policy has seen of its keys, for `limiter suggest`: the distribution of
//! per-key peaks (the most requests one key sent in any one window of the policy, or
//! units, for a policy whose requests cost more than one),
//! whatever the verdicts were, so that shadow mode shows the demand a limit would meet.
//!
//! Bounded in memory whatever the traffic: keys active in the current or the previous
//! window are tracked one by one (at most [`LIVE_KEYS`]; requests of keys beyond that
//! are counted as untracked), and a key idle for a whole window retires into a
//! fixed-size histogram, its peak final.
//!
//! Which keys are tracked must not be the attacker's choice, or a /52 sending one
//! request per /64 at each window's start fills the table with peaks of 1 and the
//! suggestion falls to 2. So the tracked keys are a sample that does not depend on
//! when keys come: those of the smallest keyed hash (a secret per process, so no
//! client can pick keys that get in), a newcomer of a smaller hash than the largest
//! tracked taking its place; and no source prefix (IPv6 /48, IPv4 /24) holds more
//! than [`PREFIX_SHARE`] of them. The engine leaves out a request another policy
//! refused, as it counts it for none of the others.

use std::{
    collections::{BTreeMap, HashMap, hash_map::RandomState},
    hash::BuildHasher as _,
    net::IpAddr,
    sync::Mutex,
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// Keys tracked one by one per policy.
pub const LIVE_KEYS: usize = 4096;

/// Keys tracked at once from one source prefix: a sixteenth of them.
pub const PREFIX_SHARE: u32 = LIVE_KEYS as u32 / 16;

/// Peaks below this are counted exactly; above, in [`SUB_BUCKETS`] buckets per power
/// of two (within 1/16 of the value).
const EXACT: u32 = 256;
const SUB_BUCKETS: u32 = 16;
const BUCKETS: usize = EXACT as usize + (32 - 8) * SUB_BUCKETS as usize;

/// What one observation counts: requests (what leaves the distribution with a key
/// out of the sample), and the units the peaks are counted in (a request's cost).
#[derive(Clone, Copy, Debug)]
pub(super) struct Usage {
    pub(super) requests: u64,
    pub(super) units: u32,
}

impl Usage {
    /// One request of one unit.
    #[cfg(test)]
    pub(super) const ONE: Self = Self { requests: 1, units: 1 };
}

#[derive(Debug)]
pub(super) struct Observation {
    window: Duration,
    /// The sample's hash: seeded from the system's random source.
    hasher: RandomState,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the observation started (the limiter's clock).
    since: Duration,
    /// The window the live keys were last swept at.
    swept: u64,
    /// The tracked keys, by their keyed hash: the sample keeps the smallest.
    live: BTreeMap<u64, KeyPeak>,
    /// Tracked keys per source prefix.
    per_prefix: HashMap<Prefix, u32>,
    retired: Box<[u64; BUCKETS]>,
    untracked: u64,
}

/// A request's source, to IPv6 /48 or IPv4 /24: what one site or one cheap
/// allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Prefix(u128);

impl Prefix {
    fn of(client: IpAddr) -> Self {
        match client {
            IpAddr::V4(v4) => Self(u128::from(u32::from(v4) & !0xff)),
            // Apart from every IPv4 prefix by the top bit.
            IpAddr::V6(v6) => Self(u128::from(v6) & !((1 << 80) - 1) | 1),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct KeyPeak {
    prefix: Prefix,
    /// Requests counted, all windows together: they leave the distribution with the
    /// key if it leaves the sample.
    requests: u64,
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
    /// Keys sampled.
    pub keys: u64,
    /// Requests of keys out of the sample, not in the distribution.
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
        let state = State {
            since: now,
            swept: 0,
            live: BTreeMap::new(),
            per_prefix: HashMap::new(),
            retired: Box::new([0; BUCKETS]),
            untracked: 0,
        };
        Self { window, hasher: RandomState::new(), state: Mutex::new(state) }
    }

    fn window_at(&self, now: Duration) -> u64 {
        u64::try_from(now.as_nanos() / self.window.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// Counts `usage` of `key` from `client` at `now`.
    pub(super) fn observe(&self, key: &str, client: IpAddr, usage: Usage, now: Duration) {
        let window = self.window_at(now);
        let hash = self.hasher.hash_one(key);
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if window > state.swept {
            state.sweep(window);
        }
        if !state.live.contains_key(&hash) && !state.admit(hash, Prefix::of(client), window) {
            state.untracked += 1;
            return;
        }
        let Some(entry) = state.live.get_mut(&hash) else { return };
        if entry.window != window {
            entry.peak = entry.best();
            entry.count = 0;
            entry.window = window;
        }
        entry.count = entry.count.saturating_add(usage.units);
        entry.requests += usage.requests;
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
    /// Takes the key of `hash` from `prefix` into the sample if its prefix has room
    /// and, in a full table, its hash is below the largest, which leaves the sample.
    fn admit(&mut self, hash: u64, prefix: Prefix, window: u64) -> bool {
        if self.per_prefix.get(&prefix).is_some_and(|&n| n >= PREFIX_SHARE) {
            return false;
        }
        if self.live.len() >= LIVE_KEYS {
            match self.live.last_key_value() {
                Some((&largest, _)) if largest > hash => {
                    if let Some((_, left)) = self.live.pop_last() {
                        forget(&mut self.per_prefix, left.prefix);
                        self.untracked += left.requests;
                    }
                }
                _ => return false,
            }
        }
        self.live.insert(hash, KeyPeak { prefix, requests: 0, window, count: 0, peak: 0 });
        *self.per_prefix.entry(prefix).or_default() += 1;
        true
    }

    /// Retires the keys idle since before the previous window: their peaks are final.
    fn sweep(&mut self, window: u64) {
        let (retired, per_prefix) = (&mut self.retired, &mut self.per_prefix);
        self.live.retain(|_, peak| {
            let keep = peak.window + 1 >= window;
            if !keep {
                retired[bucket(peak.best())] += 1;
                forget(per_prefix, peak.prefix);
            }
            keep
        });
        self.swept = window;
    }
}

/// One key of `prefix` fewer in the sample.
fn forget(per_prefix: &mut HashMap<Prefix, u32>, prefix: Prefix) {
    if let Some(n) = per_prefix.get_mut(&prefix) {
        *n -= 1;
        if *n == 0 {
            per_prefix.remove(&prefix);
        }
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
    use std::{
        net::{IpAddr, Ipv4Addr, Ipv6Addr},
        time::Duration,
    };

    use super::{EXACT, LIVE_KEYS, Observation, PREFIX_SHARE, Usage, bucket, lower_bound};

    const MINUTE: Duration = Duration::from_secs(60);
    const T0: Duration = Duration::from_secs(1_700_000_040);

    /// A client of its own /24.
    fn client(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | n << 8))
    }

    /// The /64 number `n` of 2001:db8:0:X000::/52, and its key.
    fn poisoner(n: u16) -> (IpAddr, String) {
        let ip = Ipv6Addr::new(0x2001, 0xdb8, 0, 0x1000 | n, 0, 0, 0, 1);
        (IpAddr::V6(ip), format!("ip={:x}:{:x}:0:{:x}::/64", 0x2001, 0xdb8, 0x1000 | n))
    }

    /// 100 real clients, 10 requests each over each minute, after a poisoner's
    /// requests at each minute's start; the suggestion's p99.
    fn p99_with(poison: impl Fn(&Observation, Duration)) -> (u32, u64) {
        let observation = Observation::new(MINUTE, T0);
        for minute in 0..3 {
            let start = T0 + MINUTE * minute;
            poison(&observation, start);
            for i in 0..10 {
                for key in 0..100 {
                    observation.observe(
                        &format!("ip=client-{key}"),
                        client(key),
                        Usage::ONE,
                        start + Duration::from_secs(1 + i * 5),
                    );
                }
            }
        }
        let peaks = observation.peaks(100, T0 + MINUTE * 3);
        (peaks.p99, peaks.keys)
    }

    /// Issue 25 item 2: the first 4 096 keys of a window were tracked, so one /52
    /// sending one request per /64 at each window's start took the whole table.
    #[test]
    fn one_prefix_flooding_new_keys_at_each_window_start_does_not_deflate_the_peaks() {
        let (p99, keys) = p99_with(|observation, start| {
            for n in 0..4_096 {
                let (ip, key) = poisoner(n);
                observation.observe(&key, ip, Usage::ONE, start);
            }
        });
        assert_eq!(p99, 10, "the real clients' peak");
        assert_eq!(keys, 100 + u64::from(PREFIX_SHARE), "the /48's share, and the 100 clients");
    }

    /// The same flood from as many /48s: the sample keeps keys whatever their time
    /// of arrival, so nearly all the clients' (2.4 % of the keys) are in it.
    #[test]
    fn keys_from_many_prefixes_at_each_window_start_do_not_crowd_out_later_ones() {
        let (p99, keys) = p99_with(|observation, start| {
            for n in 0..4_096_u16 {
                let ip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 1));
                observation.observe(&format!("ip=2001:db8:{n:x}::/64"), ip, Usage::ONE, start);
            }
        });
        assert_eq!(p99, 10, "the real clients' peak");
        assert!(keys >= LIVE_KEYS as u64, "{keys}");
    }

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
                    observation.observe(&format!("{prefix}-{key}"), client(key), Usage::ONE, at);
                    at += Duration::from_millis(1);
                }
            }
        }
        // A minute later the light keys come back with 1 each: their peaks stay 2.
        for key in 0..90 {
            observation.observe(&format!("light-{key}"), client(key), Usage::ONE, T0 + MINUTE);
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
        for key in 0..(LIVE_KEYS as u32 + 10) {
            observation.observe(&format!("k{key}"), client(key), Usage::ONE, T0);
        }
        assert_eq!(observation.peaks(100, T0).untracked_requests, 10);
        // Two windows on, every key has retired and there is room again.
        observation.observe("late", client(0), Usage::ONE, T0 + MINUTE * 2);
        let state = observation.state.lock().expect("state");
        assert_eq!(state.live.len(), 1);
        assert_eq!(state.retired.iter().sum::<u64>(), LIVE_KEYS as u64);
    }
}
