//! Requests in flight, bounded per key, with a bounded queue of the requests waiting
//! for one of them to end (a rule's `concurrency`, `queue` and `queue_timeout`).
//!
//! A key's entry holds how many of its requests are in flight and its waiters, in
//! (priority, arrival) order. A waiter is a oneshot channel and a task parked on it,
//! never a thread; the unit of a request that ends goes straight to the first waiter,
//! so that no newcomer overtakes the queue. A waiter whose future is dropped (its
//! client went away, its wait timed out) takes itself out of the queue. An entry with
//! nothing in flight and nothing waiting is removed, so that the map holds at most one
//! entry per request in flight or waiting.
//!
//! An entry may give classes of requests (plans, for the upstream's gate under
//! `[proxy.adaptive]`) a guaranteed share of its limit, `floor(share × limit)`
//! places. A class is under its share while fewer of its requests are in flight than
//! that. A place that frees goes to the first waiter of a class under its share, else
//! to the first waiter; a full queue refuses (or gives up the last waiter of) a class
//! over its share, never one under it, so that no class under its share is shed for
//! another. A class borrows what the others leave unused: a place free is taken
//! whatever the shares. Finding the waiter scans the queue, which `queue` bounds.
//!
//! The counts are this agent's: concurrency is not shared across a fleet.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::sync::oneshot;

use crate::config::proxy::Concurrency;

/// A gate's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GateBounds {
    /// In flight at once.
    pub limit: usize,
    /// Waiting beyond `limit`.
    pub queue: usize,
    /// Longest wait.
    pub timeout: Duration,
}

/// Which gate: a rule's, for one of its keys, or the whole upstream's
/// (`[proxy.upstream_capacity]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Gate {
    Rule { rule: String, key: String },
    Upstream,
}

/// The places in flight one request holds, given back when its response ends (or,
/// for a tunnel, when the tunnel closes).
pub(super) type Held = Vec<Unit<Gate>>;

/// Which kind of gate refused a request: the `gate` label of
/// `limiter_proxy_shed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    /// A rule's `concurrency` (429).
    Rule,
    /// `[proxy.upstream_capacity]` (503).
    Upstream,
}

impl GateKind {
    pub const ALL: [Self; 2] = [Self::Rule, Self::Upstream];

    /// As the JSON names it (a test holds the two together).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Rule => "rule",
            Self::Upstream => "upstream",
        }
    }
}

/// Why a request was not let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shed {
    /// The queue was full (or shrank under it, or a request of a higher priority
    /// took its place).
    QueueFull,
    /// It waited `queue_timeout`.
    QueueTimeout,
}

impl Shed {
    pub const ALL: [Self; 2] = [Self::QueueFull, Self::QueueTimeout];

    /// The `reason` label of `limiter_proxy_shed_total`, as the JSON names it (a
    /// test holds the two together).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
        }
    }
}

/// What a gate is found by.
pub(super) trait GateKey: Eq + Hash + Clone {}

impl<K: Eq + Hash + Clone> GateKey for K {}

/// Where a waiter stands: lower priorities first, then by arrival.
type Place = (u8, u64);

/// The class a request is counted in for the shares (a plan's name, or `keyless`).
pub(super) type Class = Arc<str>;

/// Each class's share of a limit (0 to 1); a class without one has none guaranteed.
pub(super) type ShareTable = Arc<BTreeMap<String, f64>>;

/// The shares of a gate without any (a rule's).
pub(super) static NO_SHARES: LazyLock<ShareTable> = LazyLock::new(ShareTable::default);

/// Where a request waits, and how it will be let in.
#[derive(Debug)]
struct Waiter<K: GateKey> {
    admit: oneshot::Sender<Unit<K>>,
    class: Class,
}

/// One key's requests in flight and waiting.
#[derive(Debug)]
struct Entry<K: GateKey> {
    bounds: GateBounds,
    in_flight: usize,
    waiting: BTreeMap<Place, Waiter<K>>,
    shares: ShareTable,
    /// In flight by class, for the shares (only while there are shares).
    by_class: HashMap<Class, usize>,
}

impl GateBounds {
    pub(super) fn of(concurrency: &Concurrency) -> Self {
        Self {
            limit: usize::try_from(concurrency.limit.get()).unwrap_or(usize::MAX),
            queue: usize::try_from(concurrency.queue).unwrap_or(usize::MAX),
            timeout: concurrency.queue_timeout.0,
        }
    }
}

impl<K: GateKey> Entry<K> {
    fn new(bounds: GateBounds, shares: ShareTable) -> Self {
        Self { bounds, in_flight: 0, waiting: BTreeMap::new(), shares, by_class: HashMap::new() }
    }

    fn idle(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty()
    }

    /// Whether fewer of `class`'s requests are in flight than its share guarantees.
    fn under_share(&self, class: &str) -> bool {
        let Some(&share) = self.shares.get(class) else { return false };
        // A share is at most 1: the product stays within the limit.
        let guaranteed = (share * self.bounds.limit as f64).floor() as usize;
        self.by_class.get(class).copied().unwrap_or(0) < guaranteed
    }

    /// One more of `class` in flight; how many are, this one included.
    fn take(&mut self, class: &Class) -> usize {
        self.in_flight += 1;
        if !self.shares.is_empty() {
            *self.by_class.entry(Arc::clone(class)).or_default() += 1;
        }
        self.in_flight
    }

    /// One fewer of `class` in flight.
    fn give_back(&mut self, class: &str) {
        self.in_flight -= 1;
        if let Some(count) = self.by_class.get_mut(class) {
            *count -= 1;
            if *count == 0 {
                self.by_class.remove(class);
            }
        }
    }

    /// The waiter a place that frees goes to: the first of a class under its share,
    /// else the first; waiters gone are passed over (and left for their own drop).
    fn next(&mut self) -> Option<Waiter<K>> {
        let open = |waiter: &&Waiter<K>| !waiter.admit.is_closed();
        let place = self
            .waiting
            .iter()
            .filter(|(_, waiter)| open(waiter))
            .find(|(_, waiter)| self.under_share(&waiter.class))
            .or_else(|| self.waiting.iter().find(|(_, waiter)| open(waiter)))
            .map(|(&place, _)| place)?;
        self.waiting.remove(&place)
    }

    /// The waiter a newcomer of `class` and `priority` takes the place of in a full
    /// queue: the last of a lower priority, or, for a newcomer under its share, the
    /// last of any class over its share; never one of a class under its share.
    fn displaced(&self, class: &str, priority: u8) -> Option<Place> {
        let newcomer_under = self.under_share(class);
        self.waiting
            .iter()
            .rev()
            .find(|&(&(waiting, _), waiter)| !self.under_share(&waiter.class) && (newcomer_under || waiting > priority))
            .map(|(&place, _)| place)
    }

    /// Lets waiters in while the limit allows.
    fn admit_while_room(&mut self, key: &K, admitted: &mut Vec<(Waiter<K>, K, usize)>) {
        while self.in_flight < self.bounds.limit
            && let Some(waiter) = self.next()
        {
            let depth = self.take(&waiter.class);
            admitted.push((waiter, key.clone(), depth));
        }
    }
}

#[derive(Debug)]
struct State<K: GateKey> {
    entries: HashMap<K, Entry<K>>,
    arrivals: u64,
}

/// The gates of one kind (every rule's keys, or the whole upstream), by key.
#[derive(Debug)]
pub(super) struct Gates<K: GateKey>(Mutex<State<K>>);

impl<K: GateKey> Default for Gates<K> {
    fn default() -> Self {
        Self(Mutex::new(State { entries: HashMap::new(), arrivals: 0 }))
    }
}

/// One request's place in flight through a gate; dropping it ends it, which lets the
/// first waiter in.
#[derive(Debug)]
pub(super) struct Unit<K: GateKey> {
    gates: Arc<Gates<K>>,
    key: K,
    class: Class,
    depth: usize,
}

impl<K: GateKey> Unit<K> {
    /// Which gate it holds a place in.
    pub(super) fn key(&self) -> &K {
        &self.key
    }

    /// The requests in flight through its gate when it was let in, itself included.
    pub(super) fn depth(&self) -> usize {
        self.depth
    }
}

/// A request in a queue; dropped before it was let in, it leaves the queue.
struct Waiting<'g, K: GateKey> {
    gates: &'g Gates<K>,
    key: &'g K,
    place: Place,
}

impl<K: GateKey> Drop for Waiting<'_, K> {
    fn drop(&mut self) {
        let mut state = self.gates.lock();
        let Some(entry) = state.entries.get_mut(self.key) else { return };
        // Not there any more: let in (its unit, if sent, is dropped with the
        // receiver and goes to the next) or refused.
        entry.waiting.remove(&self.place);
        if entry.idle() {
            state.entries.remove(self.key);
        }
    }
}

impl<K: GateKey> Gates<K> {
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // Every change under the lock leaves the counts whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place in flight for `key`'s request of `class` under `bounds` and `shares`
    /// (a key seen first takes them; later, [`Self::rebound`] and [`Self::relimit`]
    /// change them): at once if fewer than `limit` are in flight, else once a place
    /// is its turn (see the module's doc), within `timeout`.
    pub(super) async fn enter(
        self: &Arc<Self>,
        key: K,
        (bounds, shares): (GateBounds, &ShareTable),
        priority: u8,
        class: &Class,
    ) -> Result<Unit<K>, Shed> {
        let (place, admitted) = {
            let mut state = self.lock();
            state.arrivals += 1;
            let place = (priority, state.arrivals);
            let entry = state.entries.entry(key.clone()).or_insert_with(|| Entry::new(bounds, Arc::clone(shares)));
            if entry.in_flight < entry.bounds.limit && entry.waiting.is_empty() {
                let depth = entry.take(class);
                drop(state);
                return Ok(Unit { gates: Arc::clone(self), key, class: Arc::clone(class), depth });
            }
            if entry.waiting.len() >= entry.bounds.queue {
                match entry.displaced(class, priority) {
                    Some(displaced) => {
                        entry.waiting.remove(&displaced);
                    }
                    None => {
                        if entry.idle() {
                            state.entries.remove(&key);
                        }
                        return Err(Shed::QueueFull);
                    }
                }
            }
            let (admit, admitted) = oneshot::channel();
            entry.waiting.insert(place, Waiter { admit, class: Arc::clone(class) });
            (place, admitted)
        };
        let timeout = bounds.timeout;
        let waiting = Waiting { gates: self, key: &key, place };
        let outcome = tokio::time::timeout(timeout, admitted).await;
        drop(waiting);
        match outcome {
            Ok(Ok(unit)) => Ok(unit),
            Ok(Err(_)) => Err(Shed::QueueFull),
            Err(_) => Err(Shed::QueueTimeout),
        }
    }

    /// A place in flight taken whatever the bounds (shadow mode), and what they would
    /// have said had the request queued: [`Shed::QueueFull`] past `limit + queue`.
    /// It never waits; a wait's timeout is not foreseen.
    pub(super) fn enter_unbounded(
        self: &Arc<Self>,
        key: K,
        (bounds, shares): (GateBounds, &ShareTable),
        class: &Class,
    ) -> (Unit<K>, Option<Shed>) {
        let mut state = self.lock();
        let entry = state.entries.entry(key.clone()).or_insert_with(|| Entry::new(bounds, Arc::clone(shares)));
        let would =
            (entry.in_flight >= entry.bounds.limit.saturating_add(entry.bounds.queue)).then_some(Shed::QueueFull);
        let depth = entry.take(class);
        drop(state);
        (Unit { gates: Arc::clone(self), key, class: Arc::clone(class), depth }, would)
    }

    /// Gives `key`'s entry, if it has one, the limit `limit` (the adaptive limit
    /// moving): one that grew lets waiters in; one that shrank below what is in
    /// flight cuts nothing, it only lets in less until fewer are.
    pub(super) fn relimit(self: &Arc<Self>, key: &K, limit: usize) {
        let mut admitted = Vec::new();
        {
            let mut state = self.lock();
            let Some(entry) = state.entries.get_mut(key) else { return };
            entry.bounds.limit = limit;
            entry.admit_while_room(key, &mut admitted);
        }
        self.hand_over(admitted);
    }

    /// Gives every entry the bounds and shares `bounds_of` says (`None`: no bound any
    /// more): a queue that shrank refuses its last waiters, a limit that grew lets the
    /// first ones in; what is in flight stays.
    pub(super) fn rebound(self: &Arc<Self>, bounds_of: impl Fn(&K) -> Option<(GateBounds, ShareTable)>) {
        let mut admitted = Vec::new();
        {
            let mut state = self.lock();
            for (key, entry) in &mut state.entries {
                let (bounds, shares) = bounds_of(key).unwrap_or_else(|| {
                    (GateBounds { limit: usize::MAX, queue: 0, timeout: Duration::ZERO }, ShareTable::default())
                });
                // A request still to come under the old config keeps its wait.
                entry.bounds = GateBounds { timeout: entry.bounds.timeout, ..bounds };
                // Classes are counted only while there are shares: turned on, they
                // count from what is let in from now.
                if shares.is_empty() {
                    entry.by_class.clear();
                }
                entry.shares = shares;
                entry.admit_while_room(key, &mut admitted);
                while entry.waiting.len() > entry.bounds.queue {
                    entry.waiting.pop_last();
                }
            }
            state.entries.retain(|_, entry| !entry.idle());
        }
        self.hand_over(admitted);
    }

    /// Sends each unit to its waiter, outside the lock; one whose waiter is gone comes
    /// back and is dropped, which hands it on.
    fn hand_over(self: &Arc<Self>, admitted: Vec<(Waiter<K>, K, usize)>) {
        for (waiter, key, depth) in admitted {
            drop(waiter.admit.send(Unit { gates: Arc::clone(self), key, class: waiter.class, depth }));
        }
    }

    /// In flight and waiting, summed over the keys `group` puts together.
    pub(super) fn totals<G: Eq + Hash>(&self, group: impl Fn(&K) -> G) -> HashMap<G, (u64, u64)> {
        let state = self.lock();
        let mut totals: HashMap<G, (u64, u64)> = HashMap::new();
        for (key, entry) in &state.entries {
            let total = totals.entry(group(key)).or_default();
            total.0 += entry.in_flight as u64;
            total.1 += entry.waiting.len() as u64;
        }
        totals
    }

    /// `key`'s requests in flight and waiting.
    pub(super) fn of(&self, key: &K) -> (u64, u64) {
        self.lock().entries.get(key).map_or((0, 0), |entry| (entry.in_flight as u64, entry.waiting.len() as u64))
    }

    /// Keys with an entry.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.lock().entries.len()
    }
}

impl<K: GateKey> Drop for Unit<K> {
    fn drop(&mut self) {
        let next = {
            let mut state = self.gates.lock();
            let Some(entry) = state.entries.get_mut(&self.key) else { return };
            entry.give_back(&self.class);
            // Room for one once this ends: the waiter whose turn it is takes it.
            let next = if entry.in_flight < entry.bounds.limit { entry.next() } else { None };
            let next = next.map(|waiter| {
                let depth = entry.take(&waiter.class);
                (waiter, self.key.clone(), depth)
            });
            if entry.idle() {
                state.entries.remove(&self.key);
            }
            next
        };
        if let Some(next) = next {
            self.gates.hand_over(vec![next]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future, pin::Pin, task::Poll};

    use super::*;

    const BOUNDS: GateBounds = GateBounds { limit: 2, queue: 3, timeout: Duration::from_secs(1) };

    /// Whether `future` is ready after the tasks ready to run have run.
    async fn ready<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        tokio::task::yield_now().await;
        std::future::poll_fn(|cx| match Pin::new(&mut *future).poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    type Waiter = Pin<Box<dyn Future<Output = Result<Unit<&'static str>, Shed>>>>;

    fn waiter(gates: &Arc<Gates<&'static str>>, priority: u8, bounds: GateBounds) -> Waiter {
        let gates = Arc::clone(gates);
        Box::pin(async move { enter(&gates, bounds, priority).await })
    }

    async fn enter(
        gates: &Arc<Gates<&'static str>>,
        bounds: GateBounds,
        priority: u8,
    ) -> Result<Unit<&'static str>, Shed> {
        gates.enter("k", (bounds, &ShareTable::default()), priority, &Class::from("free")).await
    }

    #[tokio::test(start_paused = true)]
    async fn serves_by_priority_then_arrival_and_refuses_past_the_queue() {
        let gates = Arc::new(Gates::default());
        let first = enter(&gates, BOUNDS, 5).await.expect("first");
        let second = enter(&gates, BOUNDS, 5).await.expect("second");
        let mut late = waiter(&gates, 5, BOUNDS);
        let mut early = waiter(&gates, 5, BOUNDS);
        // Polled in this order: `late` arrives first.
        assert!(ready(&mut late).await.is_none() && ready(&mut early).await.is_none());
        let mut urgent = waiter(&gates, 0, BOUNDS);
        assert!(ready(&mut urgent).await.is_none());
        // Full: a fourth of the same priority is refused, one of a higher takes the
        // place of the last.
        assert_eq!(enter(&gates, BOUNDS, 5).await.err(), Some(Shed::QueueFull));
        let mut displacing = waiter(&gates, 1, BOUNDS);
        assert!(ready(&mut displacing).await.is_none());
        assert_eq!(ready(&mut early).await.map(|r| r.err()), Some(Some(Shed::QueueFull)));
        drop(first);
        let urgent = ready(&mut urgent).await.expect("urgent let in first").expect("a unit");
        assert!(ready(&mut displacing).await.is_none() && ready(&mut late).await.is_none());
        drop(second);
        let displacing = ready(&mut displacing).await.expect("then priority 1").expect("a unit");
        drop(urgent);
        let late = ready(&mut late).await.expect("then the rest by arrival").expect("a unit");
        drop((displacing, late));
        assert_eq!(gates.entries(), 0, "an idle key leaves the map");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_dropped_leaves_the_queue_and_its_unit_goes_on() {
        let gates = Arc::new(Gates::default());
        let held = enter(&gates, GateBounds { limit: 1, ..BOUNDS }, 0).await.expect("held");
        let bounds = GateBounds { limit: 1, ..BOUNDS };
        let mut gone = waiter(&gates, 0, bounds);
        let mut next = waiter(&gates, 0, bounds);
        assert!(ready(&mut gone).await.is_none() && ready(&mut next).await.is_none());
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(1, 2)));
        drop(gone);
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(1, 1)), "the dropped waiter left the queue");
        drop(held);
        let next = ready(&mut next).await.expect("next let in").expect("a unit");
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(1, 0)));
        drop(next);
        assert_eq!(gates.entries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_timeout() {
        let gates = Arc::new(Gates::default());
        let bounds = GateBounds { limit: 1, queue: 1, timeout: Duration::from_millis(900) };
        let _held = enter(&gates, bounds, 0).await.expect("held");
        let start = tokio::time::Instant::now();
        assert_eq!(enter(&gates, bounds, 0).await.err(), Some(Shed::QueueTimeout));
        assert_eq!(start.elapsed(), Duration::from_millis(900));
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(1, 0)), "the timed-out waiter left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shrinking_queue_refuses_its_last_and_keeps_what_is_in_flight() {
        let gates = Arc::new(Gates::default());
        let bounds = GateBounds { limit: 1, queue: 3, timeout: Duration::from_secs(5) };
        let held = enter(&gates, bounds, 0).await.expect("held");
        let mut waiters: Vec<Waiter> = (0..3).map(|_| waiter(&gates, 0, bounds)).collect();
        for waiter in &mut waiters {
            assert!(ready(waiter).await.is_none());
        }
        gates.rebound(|_| Some((GateBounds { queue: 1, ..bounds }, ShareTable::default())));
        assert_eq!(ready(&mut waiters[2]).await.map(|r| r.err()), Some(Some(Shed::QueueFull)));
        assert_eq!(ready(&mut waiters[1]).await.map(|r| r.err()), Some(Some(Shed::QueueFull)));
        assert!(ready(&mut waiters[0]).await.is_none(), "the first still waits");
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(1, 1)));
        drop(held);
        assert!(ready(&mut waiters[0]).await.is_some_and(|r| r.is_ok()));
        // A bound lifted lets every waiter in.
        let held = enter(&gates, bounds, 0).await.expect("held");
        let mut more: Vec<Waiter> = (0..2).map(|_| waiter(&gates, 0, bounds)).collect();
        for waiter in &mut more {
            assert!(ready(waiter).await.is_none());
        }
        gates.rebound(|_| None);
        for waiter in &mut more {
            assert!(ready(waiter).await.is_some_and(|r| r.is_ok()));
        }
        drop(held);
    }

    fn of_class(gates: &Arc<Gates<&'static str>>, shares: &ShareTable, class: &'static str) -> Waiter {
        let (gates, shares) = (Arc::clone(gates), Arc::clone(shares));
        Box::pin(async move { gates.enter("k", (BOUNDS_OF_4, &shares), 10, &Class::from(class)).await })
    }

    const BOUNDS_OF_4: GateBounds = GateBounds { limit: 4, queue: 3, timeout: Duration::from_secs(1) };

    #[tokio::test(start_paused = true)]
    async fn a_class_under_its_share_goes_first_and_is_never_shed_for_one_over_it() {
        let gates = Arc::new(Gates::default());
        let shares: ShareTable = Arc::new([("pro".to_owned(), 0.5), ("free".to_owned(), 0.5)].into());
        // Free borrows the places pro leaves unused.
        let mut free_in_flight = Vec::new();
        for _ in 0..4 {
            free_in_flight.push(ready(&mut of_class(&gates, &shares, "free")).await.expect("at once").expect("a unit"));
        }
        assert_eq!(free_in_flight.iter().map(Unit::depth).collect::<Vec<_>>(), [1, 2, 3, 4]);
        let mut free_first = of_class(&gates, &shares, "free");
        let mut pro_first = of_class(&gates, &shares, "pro");
        let mut free_last = of_class(&gates, &shares, "free");
        for waiter in [&mut free_first, &mut pro_first, &mut free_last] {
            assert!(ready(waiter).await.is_none());
        }
        // The queue is full: pro, under its share, takes the place of the last free
        // waiter, of the same priority; free, over its share, is refused.
        let mut pro_second = of_class(&gates, &shares, "pro");
        assert!(ready(&mut pro_second).await.is_none());
        assert_eq!(ready(&mut free_last).await.map(|r| r.err()), Some(Some(Shed::QueueFull)));
        assert_eq!(ready(&mut of_class(&gates, &shares, "free")).await.map(|r| r.err()), Some(Some(Shed::QueueFull)));
        // Places that free go to pro, though free came first, until pro has its two.
        drop(free_in_flight.pop());
        let pro_one = ready(&mut pro_first).await.expect("pro first").expect("a unit");
        assert_eq!(pro_one.depth(), 4);
        assert!(ready(&mut free_first).await.is_none());
        drop(free_in_flight.pop());
        let pro_two = ready(&mut pro_second).await.expect("pro second").expect("a unit");
        assert!(ready(&mut free_first).await.is_none());
        // Now free is under its share (one left of its two) and goes next.
        drop(free_in_flight.pop());
        let free_again = ready(&mut free_first).await.expect("then free").expect("a unit");
        // A limit that shrinks under what is in flight cuts nothing and lets none in.
        gates.relimit(&"k", 2);
        let mut after = of_class(&gates, &shares, "pro");
        assert!(ready(&mut after).await.is_none());
        assert_eq!(gates.of(&"k"), (4, 1));
        drop((pro_one, pro_two));
        assert!(ready(&mut after).await.is_none(), "two still in flight, the limit is 2");
        drop(free_again);
        assert!(ready(&mut after).await.is_some_and(|r| r.is_ok()), "under the limit again");
        drop(free_in_flight);
        assert_eq!(gates.entries(), 0);
    }

    #[test]
    fn reasons_are_named_as_the_json_names_them() {
        for shed in Shed::ALL {
            assert_eq!(serde_json::to_value(shed).expect("json"), shed.as_str());
        }
        for kind in GateKind::ALL {
            assert_eq!(serde_json::to_value(kind).expect("json"), kind.as_str());
        }
    }

    #[test]
    fn shadow_mode_takes_units_past_the_bounds_and_says_what_would_be_refused() {
        let gates = Arc::new(Gates::default());
        let bounds = GateBounds { limit: 1, queue: 1, timeout: Duration::from_secs(1) };
        let (first, would_first) = gates.enter_unbounded("k", (bounds, &ShareTable::default()), &Class::from("free"));
        let (second, would_second) = gates.enter_unbounded("k", (bounds, &ShareTable::default()), &Class::from("free"));
        let (third, would_third) = gates.enter_unbounded("k", (bounds, &ShareTable::default()), &Class::from("free"));
        assert_eq!((would_first, would_second, would_third), (None, None, Some(Shed::QueueFull)));
        assert_eq!(gates.totals(|_| ()).get(&()), Some(&(3, 0)));
        drop((first, second, third));
        assert_eq!(gates.entries(), 0);
    }
}
