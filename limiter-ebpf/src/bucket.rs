//! Charging a packet to a bucket kept in map memory: a source's, a prefix's, or one
//! of the global budgets. Every bucket is one GCRA TAT (`limiter_common::bucket`)
//! changed only by compare-and-swap, so CPUs charging one bucket at once never lose
//! an update and no bucket admits more than its rate and burst.
//!
//! A source may also have a byte budget: a second TAT beside the first, charged the
//! frame's length (`limiter_common::bucket::admit_frame`). The two cannot change
//! in one compare-and-swap, so a frame first checks the byte bucket, without
//! charging it, then charges the packet bucket, then the bytes: a frame
//! the packet bucket refuses never costs bytes, and one the byte bucket refuses costs
//! no packet, except when another CPU took the last bytes of the same source between
//! the check and the charge. Then this frame is refused with its packet spent: an
//! error only ever against the source, at most one packet per CPU racing it, and
//! never an admission beyond either budget.

use aya_ebpf::maps::{Array, LruHashMap};
use aya_log_ebpf::warn;
use limiter_common::{
    bucket::{self, ByteRate, Rate, Taken},
    maps::SourceState,
};

use crate::atomic;

/// Attempts at the compare-and-swap before refusing the packet; only CPUs racing on
/// one bucket retry, and refusing keeps the bucket exact.
const CAS_ATTEMPTS: usize = 8;
/// `BPF_NOEXIST`: insert only if absent, so racing CPUs keep one bucket.
const BPF_NOEXIST: u64 = 1;

/// A frame's byte budget: its length and the bucket's rate.
#[derive(Clone, Copy)]
pub struct Bytes {
    pub length: u64,
    pub rate: ByteRate,
}

impl Bytes {
    /// No byte budget: the byte bucket is neither read nor charged.
    pub const NONE: Self = Self { length: 0, rate: ByteRate::NONE };
}

/// Replaces the TAT at `word` with what `decide` makes of it, by compare-and-swap,
/// retried while other CPUs win; `decide`'s refusal, or `contended` once they won
/// [`CAS_ATTEMPTS`] times.
///
/// # Safety
/// `word` points to a live, 8-byte aligned `u64` in map memory that every CPU only
/// touches atomically.
#[inline(always)]
unsafe fn update(
    ctx: &aya_ebpf::programs::XdpContext,
    word: *mut u64,
    contended: Taken,
    decide: impl Fn(u64) -> Result<u64, Taken>,
) -> Taken {
    // SAFETY: per the caller.
    let mut current = unsafe { atomic::load(word) };
    for _ in 0..CAS_ATTEMPTS {
        let next = match decide(current) {
            Ok(next) => next,
            Err(refused) => return refused,
        };
        // SAFETY: per the caller.
        match unsafe { atomic::compare_exchange(word, current, next) } {
            Ok(()) => return Taken::Admitted,
            Err(seen) => current = seen,
        }
    }
    warn!(ctx, "a bucket was contended past {} attempts", CAS_ATTEMPTS);
    contended
}

/// Charges one frame to the buckets at `state`: its packet, and its bytes if
/// `bytes` is a budget (see the module's comment for the order).
#[inline(always)]
fn take(ctx: &aya_ebpf::programs::XdpContext, state: *mut SourceState, now: u64, rate: Rate, bytes: Bytes) -> Taken {
    // SAFETY: `state` points into a live map value whose fields are 8-byte aligned
    // u64s that every CPU only touches atomically.
    let (tat, byte_tat, packets, dropped) = unsafe {
        (&raw mut (*state).tat_ns, &raw mut (*state).byte_tat, &raw mut (*state).packets, &raw mut (*state).dropped)
    };
    // SAFETY: as above.
    unsafe { atomic::increment(packets) };
    let over_bytes =
        |byte_tat: u64| bucket::admit_bytes(byte_tat, now, bytes.length, bytes.rate).ok_or(Taken::OverBytes);
    let over_packets = |tat: u64| bucket::admit(tat, now, rate).ok_or(Taken::OverPackets);
    // The bytes are checked once, not again on each retry of the packet's CAS: a
    // retry means another CPU is charging this source, the race the byte charge
    // below answers anyway, and each branch in the loop is more paths for the
    // verifier to walk.
    // SAFETY: as above.
    let mut taken = if bytes.rate.is_set() && over_bytes(unsafe { atomic::load(byte_tat) }).is_err() {
        Taken::OverBytes
    } else {
        // SAFETY: as above.
        unsafe { update(ctx, tat, Taken::OverPackets, over_packets) }
    };
    if taken == Taken::Admitted && bytes.rate.is_set() {
        // SAFETY: as above.
        taken = unsafe { update(ctx, byte_tat, Taken::OverBytes, over_bytes) };
    }
    if taken != Taken::Admitted {
        // SAFETY: as above.
        unsafe { atomic::increment(dropped) };
    }
    taken
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
    budgets.get_ptr_mut(slot).is_some_and(|state| take(ctx, state, now, rate, Bytes::NONE) == Taken::Admitted)
}

/// What [`charge`] did.
pub enum Charged {
    /// The key had a bucket; what it did to the packet.
    Existing(Taken),
    /// The key had none and this packet made it; what it did to the packet.
    Inserted(Taken),
    /// The key had none and `may_insert` refused to make one: the map is untouched.
    Refused,
    /// The key had none and `may_insert` allowed one, but another CPU's insert won:
    /// this packet was charged to that bucket; what it did to the packet.
    Raced(Taken),
}

impl Charged {
    /// What the bucket did to the packet; `None` if there was no bucket.
    #[inline(always)]
    pub fn taken(&self) -> Option<Taken> {
        match *self {
            Self::Existing(taken) | Self::Inserted(taken) | Self::Raced(taken) => Some(taken),
            Self::Refused => None,
        }
    }

    #[inline(always)]
    pub fn admitted(&self) -> bool {
        self.taken() == Some(Taken::Admitted)
    }
}

/// Charges one packet (and with `bytes`, its bytes) to the buckets of `key` in
/// `map`. A key without one gets full buckets with this packet already charged, if
/// `may_insert` allows: one insert instead of insert, second lookup and three
/// atomics. A CPU that loses the race to insert charges the winner's bucket, by CAS.
#[inline(always)]
pub fn charge<K>(
    ctx: &aya_ebpf::programs::XdpContext,
    map: &LruHashMap<K, SourceState>,
    key: &K,
    now: u64,
    rate: Rate,
    bytes: Bytes,
    may_insert: impl FnOnce() -> bool,
) -> Charged {
    // One `take` for both a bucket found and one another CPU's insert made: each
    // inlined copy of it is walked again by the verifier.
    let (state, raced) = match map.get_ptr_mut(key) {
        Some(state) => (state, false),
        None => {
            if !may_insert() {
                return Charged::Refused;
            }
            let full = SourceState::default();
            let (first, taken) =
                match bucket::admit_frame(full.tat_ns, full.byte_tat, now, rate, bytes.length, bytes.rate) {
                    Ok((tat_ns, byte_tat)) => {
                        (SourceState { tat_ns, byte_tat, packets: 1, dropped: 0 }, Taken::Admitted)
                    }
                    Err(refused) => (SourceState { packets: 1, dropped: 1, ..full }, refused),
                };
            if map.insert(key, first, BPF_NOEXIST).is_ok() {
                return Charged::Inserted(taken);
            }
            // Evicted between insert and lookup by a flood of new keys: refuse rather
            // than admit unaccounted.
            match map.get_ptr_mut(key) {
                Some(state) => (state, true),
                None => return Charged::Raced(Taken::OverPackets),
            }
        }
    };
    let taken = take(ctx, state, now, rate, bytes);
    if raced { Charged::Raced(taken) } else { Charged::Existing(taken) }
}
