//! The program's maps, pinned by name (see `limiter_common::maps` for each one's job).

use aya_ebpf::{
    macros::map,
    maps::{Array, LpmTrie, LruHashMap, PerCpuArray},
};
use limiter_common::{
    counters::Counter,
    maps::{
        BUDGET_SLOTS, Block, BucketKey, CidrPolicy, Demotion, MAX_BLOCKS, MAX_CIDRS, MAX_DEMOTIONS, MAX_SYN_SHARES,
        OCCUPANCY_SLOTS, SETTINGS_SLOTS, Settings, SourceKey, SourceState, Verified,
    },
};

/// Sized by the agent from `xdp.max_sources` at load time.
#[map]
pub static SOURCES: LruHashMap<BucketKey, SourceState> = LruHashMap::pinned(1, 0);

/// Sized by the agent from `xdp.aggregate.max_prefixes` at load time.
#[map]
pub static AGGREGATES: LruHashMap<SourceKey, SourceState> = LruHashMap::pinned(1, 0);

/// Sized by the agent from `xdp.verified.max` at load time.
#[map]
pub static VERIFIED: LruHashMap<SourceKey, Verified> = LruHashMap::pinned(1, 0);

#[map]
pub static SYN_SHARES: LruHashMap<SourceKey, SourceState> = LruHashMap::pinned(MAX_SYN_SHARES, 0);

#[map]
pub static BUDGETS: Array<SourceState> = Array::pinned(BUDGET_SLOTS, 0);

#[map]
pub static CIDR_V4: LpmTrie<[u8; 4], CidrPolicy> = LpmTrie::pinned(MAX_CIDRS, 0);

#[map]
pub static CIDR_V6: LpmTrie<[u8; 16], CidrPolicy> = LpmTrie::pinned(MAX_CIDRS, 0);

#[map]
pub static BLOCK_V4: LpmTrie<[u8; 4], Block> = LpmTrie::pinned(MAX_BLOCKS, 0);

#[map]
pub static BLOCK_V6: LpmTrie<[u8; 16], Block> = LpmTrie::pinned(MAX_BLOCKS, 0);

/// Both families, IPv4 mapped (`limiter_common::maps::DEMOTE`).
#[map]
pub static DEMOTE: LpmTrie<[u8; 16], Demotion> = LpmTrie::pinned(MAX_DEMOTIONS, 0);

#[map]
pub static SETTINGS: Array<Settings> = Array::pinned(SETTINGS_SLOTS, 0);

#[map]
pub static SETTINGS_ACTIVE: Array<u32> = Array::pinned(1, 0);

#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(Counter::COUNT, 0);

#[map]
pub static OCCUPANCY: Array<u32> = Array::pinned(OCCUPANCY_SLOTS, 0);

/// Whether the trie of `slot` (`limiter_common::maps::OCCUPIED_*`) may hold entries;
/// an array lookup the verifier inlines, far cheaper than an LPM walk.
#[inline(always)]
pub fn may_hold(slot: u32) -> bool {
    OCCUPANCY.get(slot).is_none_or(|flag| *flag != 0)
}

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; XDP runs with preemption off, so nothing races us.
        unsafe { *slot += 1 };
    }
}

/// Whether `key` proved its address and the proof has not lapsed at `now`.
#[inline(always)]
pub fn verified(key: &SourceKey, now: u64) -> bool {
    // SAFETY: a map value the program only reads; a concurrent rewrite by user space
    // replaces the 8-byte expiry in one store.
    unsafe { VERIFIED.get(key) }.is_some_and(|entry| entry.active(now))
}

/// The active settings record, or `None` before the agent has written one.
#[inline(always)]
pub fn settings() -> Option<&'static Settings> {
    let active = *SETTINGS_ACTIVE.get(0)?;
    SETTINGS.get(active)
}
