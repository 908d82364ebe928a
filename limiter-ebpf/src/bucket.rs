//! Charging a packet to a bucket kept in map memory: a source's, a prefix's, or one
//! of the global budgets. Every bucket is one GCRA TAT (`limiter_common::bucket`)
//! changed only by compare-and-swap, so CPUs charging one bucket at once never lose
//! an update and no bucket admits more than its rate and burst.

use aya_ebpf::maps::{Array, LruHashMap};
use aya_log_ebpf::warn;
use limiter_common::{
    bucket::{self, Rate},
    maps::{SourceKey, SourceState},
};

use crate::atomic;

/// Attempts at the compare-and-swap before refusing the packet; only CPUs racing on
/// one bucket retry, and refusing keeps the bucket exact.
const CAS_ATTEMPTS: usize = 8;
/// `BPF_NOEXIST`: insert only if absent, so racing CPUs keep one bucket.
const BPF_NOEXIST: u64 = 1;

/// Charges one packet to the bucket at `state`; `false` if it is empty.
#[inline(always)]
fn take(ctx: &aya_ebpf::programs::XdpContext, state: *mut SourceState, now: u64, rate: Rate) -> bool {
    // SAFETY: `state` points into a live map value whose fields are 8-byte aligned
    // u64s that every CPU only touches atomically.
    let (tat, packets, dropped) =
        unsafe { (&raw mut (*state).tat_ns, &raw mut (*state).packets, &raw mut (*state).dropped) };
    // SAFETY: as above.
    unsafe { atomic::increment(packets) };
    // SAFETY: as above.
    let mut current = unsafe { atomic::load(tat) };
    for _ in 0..CAS_ATTEMPTS {
        let Some(next) = bucket::admit(current, now, rate) else {
            // SAFETY: as above.
            unsafe { atomic::increment(dropped) };
            return false;
        };
        // SAFETY: as above.
        match unsafe { atomic::compare_exchange(tat, current, next) } {
            Ok(()) => return true,
            Err(seen) => current = seen,
        }
    }
    warn!(ctx, "a bucket was contended past {} attempts", CAS_ATTEMPTS);
    // SAFETY: as above.
    unsafe { atomic::increment(dropped) };
    false
}

/// Charges one packet to the global bucket in `slot` of `budgets`; `false` if it is
/// empty (or missing, which only a broken load could cause: refusing is safe).
///
/// One shared TAT rather than per-CPU shares: the flood and the clients land on
/// whichever CPUs the NIC's hash picks, and a share stranded on an idle CPU would
/// shrink the budget seen by the busy ones. The compare-and-swap keeps the one
/// bucket exact however many CPUs race on it; they only contend while a flood is
/// already being refused.
#[inline(always)]
pub fn take_budget(
    ctx: &aya_ebpf::programs::XdpContext,
    budgets: &Array<SourceState>,
    slot: u32,
    now: u64,
    rate: Rate,
) -> bool {
    budgets.get_ptr_mut(slot).is_some_and(|state| take(ctx, state, now, rate))
}

/// What [`charge`] did.
pub enum Charged {
    /// The key had a bucket; whether it admitted the packet.
    Existing(bool),
    /// The key had none and this packet made it; whether it was admitted.
    Inserted(bool),
    /// The key had none and `may_insert` refused to make one: the map is untouched.
    Refused,
    /// The key had none and `may_insert` allowed one, but another CPU's insert won:
    /// this packet was charged to that bucket; whether it was admitted.
    Raced(bool),
}

impl Charged {
    #[inline(always)]
    pub fn admitted(&self) -> bool {
        matches!(self, Self::Existing(true) | Self::Inserted(true) | Self::Raced(true))
    }
}

/// Charges one packet to the bucket of `key` in `map`. A key without one gets a
/// full bucket with this packet already charged, if `may_insert` allows: one insert
/// instead of insert, second lookup and three atomics. A CPU that loses the race to
/// insert charges the winner's bucket, by CAS.
#[inline(always)]
pub fn charge(
    ctx: &aya_ebpf::programs::XdpContext,
    map: &LruHashMap<SourceKey, SourceState>,
    key: &SourceKey,
    now: u64,
    rate: Rate,
    may_insert: impl FnOnce() -> bool,
) -> Charged {
    if let Some(state) = map.get_ptr_mut(key) {
        return Charged::Existing(take(ctx, state, now, rate));
    }
    if !may_insert() {
        return Charged::Refused;
    }
    let admitted = bucket::admit(SourceState::default().tat_ns, now, rate);
    let first = SourceState {
        tat_ns: admitted.unwrap_or(SourceState::default().tat_ns),
        packets: 1,
        dropped: u64::from(admitted.is_none()),
    };
    if map.insert(key, first, BPF_NOEXIST).is_ok() {
        return Charged::Inserted(admitted.is_some());
    }
    // Evicted between insert and lookup by a flood of new keys: refuse rather than
    // admit unaccounted.
    Charged::Raced(map.get_ptr_mut(key).is_some_and(|state| take(ctx, state, now, rate)))
}
