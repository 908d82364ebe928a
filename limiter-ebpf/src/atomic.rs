//! 64-bit atomics on map memory.
//!
//! The BPF target declares no compare-and-swap, so `core::sync::atomic` offers no
//! `AtomicU64` operations there; the intrinsics still lower to BPF_ATOMIC
//! instructions (BPF_ADD, BPF_CMPXCHG), which LLVM emits at every BPF CPU version
//! and the kernel accepts from 5.12.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

/// Adds one to `*counter`.
///
/// # Safety
/// `counter` points to a live, 8-byte aligned `u64` in map memory.
#[inline(always)]
pub unsafe fn increment(counter: *mut u64) {
    // SAFETY: per the caller.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(counter, 1) };
}

/// Reads `*value` in one 64-bit load (BPF has no atomic-load instruction before v4,
/// and an aligned 8-byte load never tears).
///
/// # Safety
/// As for [`increment`].
#[inline(always)]
pub unsafe fn load(value: *mut u64) -> u64 {
    // SAFETY: per the caller.
    unsafe { core::ptr::read_volatile(value) }
}

/// Replaces `*value` with `new` if it still holds `current`; returns what it held.
///
/// # Safety
/// As for [`increment`].
#[inline(always)]
pub unsafe fn compare_exchange(value: *mut u64, current: u64, new: u64) -> Result<(), u64> {
    // SAFETY: per the caller.
    let (seen, swapped) = unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(value, current, new) };
    if swapped { Ok(()) } else { Err(seen) }
}
