use std::{fmt::Write as _, num::NonZeroUsize, sync::Arc, time::Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{T0, secs, spec};
use crate::{
    Algorithm, LimitSpec,
    limits::store::{Bucket, Charge, MemoryStore},
};

fn bound(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("nonzero")
}

/// Charges one request to `key` alone; whether it was admitted.
fn hit(store: &MemoryStore, policy: &Arc<str>, spec: &LimitSpec, key: &str, at: std::time::Duration) -> bool {
    store.apply(&[Bucket { policy, key, spec }], at, Charge::AllOrNothing)[0].admitted
}

#[test]
fn a_million_random_keys_stay_within_the_bound() {
    let store = MemoryStore::new(bound(10_000));
    let policy: Arc<str> = "rule \"per-ip\"".into();
    let spec = spec(Algorithm::SlidingWindowCounter, 100, secs(60));
    let mut rng = StdRng::seed_from_u64(5);
    let started = Instant::now();
    let mut key = String::new();
    for _ in 0..1_000_000 {
        key.clear();
        write!(key, "ip={:x}", rng.random::<u64>()).expect("to a String");
        assert!(hit(&store, &policy, &spec, &key, T0));
    }
    assert!(store.tracked_keys() <= 10_000);
    assert_eq!(store.tracked_keys(), 10_000, "the bound is used in full");
    assert_eq!(store.evictions(), 1_000_000 - 10_000);
    assert!(started.elapsed().as_secs() < 60, "took {:?}", started.elapsed());
}

#[test]
fn a_full_bucket_is_evicted_first_then_the_one_full_again_soonest() {
    let store = MemoryStore::with_shards(bound(4), 1);
    let policy: Arc<str> = "p".into();
    // One token per 10, 20, 30 and 40 seconds: full again at T0 + that.
    let specs: Vec<_> = (1..=4).map(|i| spec(Algorithm::TokenBucket, 1, secs(10 * i))).collect();
    let keys = ["a", "b", "c", "d"];
    for (key, spec) in keys.iter().zip(&specs) {
        assert!(hit(&store, &policy, spec, key, T0));
    }
    // At T0 + 25 s, "a" and "b" are full: evicting either loses nothing.
    assert!(hit(&store, &policy, &specs[3], "e", T0 + secs(25)));
    assert!(hit(&store, &policy, &specs[3], "f", T0 + secs(25)));
    assert_eq!((store.tracked_keys(), store.evictions()), (4, 2));
    assert!(!hit(&store, &policy, &specs[2], "c", T0 + secs(25)), "c kept: still empty");
    assert!(!hit(&store, &policy, &specs[3], "d", T0 + secs(25)), "d kept: still empty");
    // None is full now; "c" is full again soonest (T0 + 30 s).
    assert!(hit(&store, &policy, &specs[3], "g", T0 + secs(26)));
    assert!(!hit(&store, &policy, &specs[3], "d", T0 + secs(26)), "d kept");
    assert!(hit(&store, &policy, &specs[2], "c", T0 + secs(26)), "c was evicted");
}

#[test]
fn a_request_never_evicts_its_own_buckets() {
    let store = MemoryStore::with_shards(bound(1), 1);
    let (p, q): (Arc<str>, Arc<str>) = ("p".into(), "q".into());
    let spec = spec(Algorithm::FixedWindow, 1, secs(60));
    let both = [Bucket { policy: &p, key: "k", spec: &spec }, Bucket { policy: &q, key: "k", spec: &spec }];
    assert!(store.apply(&both, T0, Charge::AllOrNothing).iter().all(|o| o.admitted));
    assert_eq!((store.tracked_keys(), store.evictions()), (1, 0));
    let again = store.apply(&both, T0, Charge::AllOrNothing);
    assert!(!again[0].admitted, "the first bucket was kept");
}

#[test]
fn nothing_is_charged_unless_every_bucket_admits() {
    let store = MemoryStore::new(bound(100));
    let (wide, narrow): (Arc<str>, Arc<str>) = ("wide".into(), "narrow".into());
    let (ten, one) = (spec(Algorithm::FixedWindow, 10, secs(60)), spec(Algorithm::FixedWindow, 1, secs(60)));
    let request = [Bucket { policy: &wide, key: "k", spec: &ten }, Bucket { policy: &narrow, key: "k", spec: &one }];
    let first = store.apply(&request, T0, Charge::AllOrNothing);
    assert_eq!(first[0].after.remaining, 9);
    for _ in 0..5 {
        let refused = store.apply(&request, T0, Charge::AllOrNothing);
        assert_eq!((refused[0].admitted, refused[1].admitted), (true, false));
        assert_eq!(refused[0].before.remaining, 9, "the wide bucket was not charged");
    }
    let penalties = store.apply(&request, T0, Charge::EachAdmitting);
    assert_eq!(penalties[0].after.remaining, 8, "a penalty charges what admits");
    assert_eq!(store.apply(&request, T0, Charge::AllOrNothing)[0].before.remaining, 8);
}

#[test]
fn a_smaller_bound_and_dropped_policies_shrink_the_store() {
    let store = MemoryStore::with_shards(bound(1_000), 1);
    let (keep, drop): (Arc<str>, Arc<str>) = ("keep".into(), "drop".into());
    let spec = spec(Algorithm::FixedWindow, 5, secs(60));
    for i in 0..50 {
        let key = i.to_string();
        assert!(hit(&store, &keep, &spec, &key, T0));
        assert!(hit(&store, &drop, &spec, &key, T0));
    }
    assert_eq!(store.tracked_keys(), 100);
    store.retain_policies(&|policy| policy == "keep");
    assert_eq!((store.tracked_keys(), store.evictions()), (50, 0));
    store.set_capacity(bound(20));
    assert_eq!((store.tracked_keys(), store.evictions()), (20, 30));
}

#[test]
fn checking_without_charging_changes_no_bucket_and_tracks_none() {
    let policy: Arc<str> = "p".into();
    for algorithm in Algorithm::ALL {
        let store = MemoryStore::new(bound(100));
        let spec = spec(algorithm, 3, secs(60));
        let one = [Bucket { policy: &policy, key: algorithm.name(), spec: &spec }];
        for _ in 0..5 {
            let looked = store.apply(&one, T0, Charge::Nothing);
            assert!(looked[0].admitted, "{algorithm:?}");
            assert_eq!(looked[0].before.remaining, 3, "{algorithm:?}");
        }
        assert_eq!(store.tracked_keys(), 0, "{algorithm:?}: a new bucket is not stored by a look");
        assert!(hit(&store, &policy, &spec, algorithm.name(), T0));
        let two = [one[0], Bucket { policy: &policy, key: "other", spec: &spec }];
        for _ in 0..5 {
            assert_eq!(store.apply(&two, T0, Charge::Nothing)[0].before.remaining, 2, "{algorithm:?}");
        }
        let charged = (0..5).filter(|_| hit(&store, &policy, &spec, algorithm.name(), T0)).count();
        assert_eq!(charged, 2, "{algorithm:?}: looks spent nothing");
    }
}

#[test]
fn every_tracked_bucket_stays_found_through_evictions() {
    // One shard, two policies: evictions move buckets within both tables.
    let store = MemoryStore::with_shards(bound(300), 1);
    let policies: [Arc<str>; 2] = ["a".into(), "b".into()];
    let spec = spec(Algorithm::FixedWindow, 1, secs(60));
    let mut rng = StdRng::seed_from_u64(9);
    let keys: Vec<String> = (0..2_000).map(|i| format!("k{i}")).collect();
    for round in 0..5_000 {
        let (policy, key) = (&policies[rng.random_range(0..2)], &keys[rng.random_range(0..keys.len())]);
        hit(&store, policy, &spec, key, T0);
        if round % 500 == 499 {
            // A bucket charged once is empty: found, it refuses; lost, it would admit.
            let found = policies
                .iter()
                .flat_map(|policy| keys.iter().map(move |key| (policy, key)))
                .filter(|&(policy, key)| {
                    let look = [Bucket { policy, key, spec: &spec }];
                    !store.apply(&look, T0, Charge::Nothing)[0].admitted
                })
                .count();
            assert_eq!(found, store.tracked_keys(), "round {round}");
        }
    }
    assert_eq!(store.tracked_keys(), 300);
    assert!(store.evictions() > 1_000);
}
