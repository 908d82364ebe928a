use std::{fmt::Write as _, num::NonZeroUsize, sync::Arc, time::Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{T0, nz, secs, spec};
use crate::{
    Algorithm, LimitSpec,
    limits::store::{Bucket, Charge, MemoryStore, Refund},
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
    // Two tokens, one back per 5, 10, 15 and 20 seconds: with one taken, full again at
    // T0 + that, and none exhausted.
    let specs: Vec<_> =
        (1..=4).map(|i| LimitSpec { burst: Some(nz(2)), ..spec(Algorithm::TokenBucket, 1, secs(5 * i)) }).collect();
    let keys = ["a", "b", "c", "d"];
    for (key, spec) in keys.iter().zip(&specs) {
        assert!(hit(&store, &policy, spec, key, T0));
    }
    // At T0 + 12 s, "a" and "b" are full: evicting either loses nothing.
    assert!(hit(&store, &policy, &specs[3], "e", T0 + secs(12)));
    assert!(hit(&store, &policy, &specs[3], "f", T0 + secs(12)));
    assert_eq!((store.tracked_keys(), store.evictions()), (4, 2));
    let left = |key, spec| store.apply(&[Bucket { policy: &policy, key, spec }], T0 + secs(12), Charge::Nothing)[0];
    assert_eq!(left("c", &specs[2]).before.remaining, 1, "c kept");
    assert_eq!(left("d", &specs[3]).before.remaining, 1, "d kept");
    // None is full now; "c" is full again soonest (T0 + 15 s).
    assert!(hit(&store, &policy, &specs[3], "g", T0 + secs(13)));
    assert_eq!(left("d", &specs[3]).before.remaining, 1, "d kept");
    assert_eq!(left("c", &specs[2]).before.remaining, 2, "c was evicted");
}

#[test]
fn a_flood_of_new_keys_never_evicts_an_exhausted_bucket() {
    for algorithm in Algorithm::ALL {
        let login: Arc<str> = "rule \"login\"".into();
        let spec = spec(algorithm, 5, secs(60));
        let tries = |store: &MemoryStore, at| (0..10).filter(|_| hit(store, &login, &spec, "user=alice", at)).count();
        // One shard of 64, so that the brute-forcer's bucket is in every sample; and
        // the same attempts against a store that sees no flood.
        let (store, quiet) = (MemoryStore::with_shards(bound(64), 1), MemoryStore::with_shards(bound(64), 1));
        assert_eq!((tries(&store, T0), tries(&quiet, T0)), (5, 5), "{algorithm:?}");
        // New keys, each charged once, 50 s on: evictable, and back to full no sooner
        // than the brute-forcer's bucket, which made it the victim.
        let flood = (0..10_000).filter(|i| hit(&store, &login, &spec, &format!("user={i}"), T0 + secs(50))).count();
        assert_eq!(store.tracked_keys(), 64, "{algorithm:?}");
        assert_eq!((flood, store.evictions()), (10_000, 10_000 - 63), "{algorithm:?}");
        // No fresh attempts: only what time gave back (a token bucket's, by 51 s).
        assert_eq!(tries(&store, T0 + secs(51)), tries(&quiet, T0 + secs(51)), "{algorithm:?}");
    }
}

#[test]
fn a_refused_key_stays_held_until_its_bucket_is_full_again() {
    let store = MemoryStore::with_shards(bound(1), 1);
    let login: Arc<str> = "login".into();
    let spec = spec(Algorithm::FixedWindow, 5, secs(60));
    // The window turns at T0 + 60 s: T0 is on a minute.
    for _ in 0..5 {
        assert!(hit(&store, &login, &spec, "alice", T0));
    }
    // Its refusals count as use; at the window's end it is full and may go.
    assert!(!hit(&store, &login, &spec, "alice", T0 + secs(59)));
    let refused =
        store.apply(&[Bucket { policy: &login, key: "mallory", spec: &spec }], T0 + secs(30), Charge::AllOrNothing);
    assert!(!refused[0].admitted, "a new key is refused while every candidate is exhausted");
    assert_eq!(refused[0].retry_after, secs(30));
    assert_eq!((store.untracked_new_keys(), store.evictions()), (1, 0));
    assert!(hit(&store, &login, &spec, "mallory", T0 + secs(60)));
    assert_eq!((store.untracked_new_keys(), store.evictions(), store.tracked_keys()), (1, 1, 1));
}

#[test]
fn a_store_admitting_untracked_keys_admits_them_without_evicting() {
    let store = MemoryStore::with_shards(bound(1), 1).admitting_untracked();
    let policy: Arc<str> = "escalation".into();
    let spec = spec(Algorithm::SlidingWindowLog, 1, secs(60));
    assert!(hit(&store, &policy, &spec, "a", T0));
    for _ in 0..3 {
        assert!(hit(&store, &policy, &spec, "b", T0));
    }
    assert!(!hit(&store, &policy, &spec, "a", T0), "a kept");
    assert_eq!((store.untracked_new_keys(), store.evictions()), (3, 0));
}

#[test]
fn a_request_refused_for_want_of_room_charges_none_of_its_buckets() {
    let store = MemoryStore::with_shards(bound(2), 1);
    let (p, q): (Arc<str>, Arc<str>) = ("p".into(), "q".into());
    let (one, ten) = (spec(Algorithm::FixedWindow, 1, secs(60)), spec(Algorithm::FixedWindow, 10, secs(60)));
    assert!(hit(&store, &p, &one, "exhausted", T0));
    assert!(hit(&store, &q, &ten, "tracked", T0));
    // The new bucket's only candidate is exhausted (the other is the request's own).
    let request = [Bucket { policy: &q, key: "new", spec: &ten }, Bucket { policy: &q, key: "tracked", spec: &ten }];
    let outcomes = store.apply(&request, T0, Charge::AllOrNothing);
    assert_eq!((outcomes[0].admitted, outcomes[1].admitted), (false, true));
    assert_eq!(store.untracked_new_keys(), 1);
    let after = store.apply(&request[1..], T0, Charge::Nothing);
    assert_eq!(after[0].before.remaining, 9, "the tracked bucket was not charged");
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
    // Never exhausted, so always evictable; charged once, a bucket has one fewer.
    let spec = spec(Algorithm::FixedWindow, 1_000, secs(60));
    let mut rng = StdRng::seed_from_u64(9);
    let keys: Vec<String> = (0..2_000).map(|i| format!("k{i}")).collect();
    for round in 0..5_000 {
        let (policy, key) = (&policies[rng.random_range(0..2)], &keys[rng.random_range(0..keys.len())]);
        hit(&store, policy, &spec, key, T0);
        if round % 500 == 499 {
            // A bucket charged is not full: found, it has fewer; lost, it would be full.
            let found = policies
                .iter()
                .flat_map(|policy| keys.iter().map(move |key| (policy, key)))
                .filter(|&(policy, key)| {
                    let look = [Bucket { policy, key, spec: &spec }];
                    store.apply(&look, T0, Charge::Nothing)[0].before.remaining < 1_000
                })
                .count();
            assert_eq!(found, store.tracked_keys(), "round {round}");
        }
    }
    assert_eq!(store.tracked_keys(), 300);
    assert!(store.evictions() > 1_000);
}

#[test]
fn a_charge_says_when_it_counted_and_a_refund_reaches_only_a_tracked_bucket() {
    let store = MemoryStore::with_shards(bound(2), 1);
    let policy: Arc<str> = "login".into();
    let spec = spec(Algorithm::TokenBucket, 2, secs(60));
    let bucket = |key| Bucket { policy: &policy, key, spec: &spec };
    let remaining = |key, at| store.apply(&[bucket(key)], at, Charge::Nothing)[0].before.remaining;
    let charged = store.apply(&[bucket("a"), bucket("b")], T0, Charge::AllOrNothing);
    assert_eq!(charged.iter().map(|o| o.charged_at).collect::<Vec<_>>(), [Some(T0), Some(T0)]);
    assert_eq!(store.apply(&[bucket("a")], T0, Charge::Nothing)[0].charged_at, None, "a look charges nothing");
    store.refund(&[Refund { bucket: bucket("a"), charged_at: T0 }], T0);
    assert_eq!((remaining("a", T0), remaining("b", T0)), (2, 1));
    // "a", charged again, is full again first: a new key evicts it.
    assert!(store.apply(&[bucket("a")], T0 + secs(1), Charge::AllOrNothing)[0].admitted);
    let b = store.apply(&[bucket("b")], T0 + secs(2), Charge::AllOrNothing)[0];
    assert!(store.apply(&[bucket("c")], T0 + secs(3), Charge::AllOrNothing)[0].admitted);
    assert_eq!((store.tracked_keys(), store.evictions()), (2, 1));
    store.refund(&[Refund { bucket: bucket("a"), charged_at: T0 + secs(1) }], T0 + secs(3));
    assert_eq!(store.tracked_keys(), 2, "an evicted bucket is not made again");
    store.refund(&[Refund { bucket: bucket("b"), charged_at: b.charged_at.expect("charged") }], T0 + secs(3));
    assert_eq!(remaining("b", T0 + secs(3)), 1, "one of b's two back, less the second since");
    store.retain_policies(&|_| false);
    store.refund(&[Refund { bucket: bucket("c"), charged_at: T0 + secs(3) }], T0 + secs(3));
    assert_eq!(store.tracked_keys(), 0, "a dropped policy's bucket is not made again");
}
