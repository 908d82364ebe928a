//! The limiter XDP program: per-source token buckets, CIDR policy and runtime blocks.
//!
//! A frame goes `parse` → blocks → CIDR policy → the source's bucket
//! (`limiter_common::bucket`) → one verdict counter. Every tunable is read from maps
//! on each packet, so the agent changes limits without reloading the program.
//!
//! Minimum kernel: 5.12 (BPF_CMPXCHG); tested on 6.18.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "BPF has no core::sync::atomic for u64, see atomic.rs")]

mod atomic;
mod maps;
mod parse;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_ktime_get_ns,
    macros::xdp,
    maps::lpm_trie::Key,
    programs::XdpContext,
};
use aya_log_ebpf::{debug, warn};
use limiter_common::{
    bucket::{self, Rate},
    counters::Counter,
    maps::{Action, OCCUPIED_BLOCK_V4, OCCUPIED_BLOCK_V6, OCCUPIED_CIDR_V4, OCCUPIED_CIDR_V6, SourceKey, SourceState},
};

use crate::{
    maps::{BLOCK_V4, BLOCK_V6, CIDR_V4, CIDR_V6, SOURCES, count, may_hold, settings},
    parse::{Frame, Packet, parse},
};

/// Attempts at the compare-and-swap before refusing the packet; only CPUs racing on
/// one source retry, and refusing keeps the bucket exact.
const CAS_ATTEMPTS: usize = 8;
/// `BPF_NOEXIST`: insert only if absent, so racing CPUs keep one bucket.
const BPF_NOEXIST: u64 = 1;

#[xdp]
pub fn limiter(ctx: XdpContext) -> u32 {
    let Some(settings) = settings() else {
        count(Counter::Passed);
        return XDP_PASS;
    };
    let enforce = settings.enforce != 0;
    let packet = match parse(&ctx, settings.ipv6_prefix) {
        Frame::NonIp => {
            count(Counter::NonIp);
            count(Counter::Passed);
            return XDP_PASS;
        }
        Frame::Malformed => {
            count(Counter::Malformed);
            return if settings.malformed_drop != 0 { refuse(enforce, Counter::DroppedMalformed) } else { pass() };
        }
        Frame::Ip(packet) => packet,
    };
    if packet.malformed {
        count(Counter::Malformed);
        if settings.malformed_drop != 0 {
            return refuse(enforce, Counter::DroppedMalformed);
        }
    }
    if packet.link_control {
        count(Counter::Allowed);
        return XDP_PASS;
    }
    if blocked(&packet) {
        return refuse(enforce, Counter::DroppedDeny);
    }
    let rate = match policy(&packet) {
        Some((Action::Allow, _)) => {
            count(Counter::Allowed);
            return XDP_PASS;
        }
        Some((Action::Deny, _)) => return refuse(enforce, Counter::DroppedDeny),
        Some((Action::Limit, rate)) => rate,
        None => settings.default_rate,
    };
    // Read the clock only once a bucket needs it: it is the costliest helper here.
    let now = unsafe { bpf_ktime_get_ns() };
    if charge(&ctx, &SourceKey { addr: packet.source }, now, rate) {
        pass()
    } else {
        refuse(enforce, Counter::DroppedRateLimit)
    }
}

/// Returns XDP_PASS and nothing else: the floor that `cargo xtask bench` measures the
/// limiter against. The agent never loads or attaches it.
#[xdp]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

#[inline(always)]
fn pass() -> u32 {
    count(Counter::Passed);
    XDP_PASS
}

/// Drops, or in dry run counts a would-drop and passes.
#[inline(always)]
fn refuse(enforce: bool, reason: Counter) -> u32 {
    if enforce {
        count(reason);
        XDP_DROP
    } else {
        count(Counter::WouldDrop);
        pass()
    }
}

#[inline(always)]
fn blocked(packet: &Packet) -> bool {
    let block = match packet.v4 {
        Some(v4) if may_hold(OCCUPIED_BLOCK_V4) => BLOCK_V4.get(Key::new(32, v4)),
        None if may_hold(OCCUPIED_BLOCK_V6) => BLOCK_V6.get(Key::new(128, packet.v6)),
        _ => return false,
    };
    // A block without expiry needs no clock.
    block.is_some_and(|block| block.expires_at_ns == 0 || block.active(unsafe { bpf_ktime_get_ns() }))
}

#[inline(always)]
fn policy(packet: &Packet) -> Option<(Action, Rate)> {
    let policy = match packet.v4 {
        Some(v4) if may_hold(OCCUPIED_CIDR_V4) => CIDR_V4.get(Key::new(32, v4)),
        None if may_hold(OCCUPIED_CIDR_V6) => CIDR_V6.get(Key::new(128, packet.v6)),
        _ => None,
    }?;
    let action = match policy.action {
        0 => Action::Allow,
        1 => Action::Deny,
        _ => Action::Limit,
    };
    Some((action, policy.rate))
}

/// Charges one packet to the source's bucket; `false` if the bucket is empty.
#[inline(always)]
fn charge(ctx: &XdpContext, key: &SourceKey, now: u64, rate: Rate) -> bool {
    let state = match SOURCES.get_ptr_mut(key) {
        Some(state) => state,
        None => {
            // A new source: its first packet is charged in the value inserted, so one
            // insert replaces insert, second lookup and three atomics. A CPU that
            // loses the race to insert charges the winner's bucket below, by CAS.
            let admitted = bucket::admit(SourceState::default().tat_ns, now, rate);
            let first = SourceState {
                tat_ns: admitted.unwrap_or(SourceState::default().tat_ns),
                packets: 1,
                dropped: u64::from(admitted.is_none()),
            };
            if SOURCES.insert(key, first, BPF_NOEXIST).is_ok() {
                count(Counter::NewSources);
                debug!(ctx, "new source {:i}", key.addr);
                return admitted.is_some();
            }
            let Some(state) = SOURCES.get_ptr_mut(key) else {
                // Evicted between insert and lookup by a flood of new sources: refuse
                // rather than admit unaccounted.
                return false;
            };
            state
        }
    };
    // SAFETY: `state` points into a live map value whose fields are 8-byte aligned
    // u64s that every CPU only touches atomically.
    let (tat, packets, dropped) =
        unsafe { (&raw mut (*state).tat_ns, &raw mut (*state).packets, &raw mut (*state).dropped) };
    unsafe { atomic::increment(packets) };
    let mut current = unsafe { atomic::load(tat) };
    for _ in 0..CAS_ATTEMPTS {
        let Some(next) = bucket::admit(current, now, rate) else {
            unsafe { atomic::increment(dropped) };
            return false;
        };
        match unsafe { atomic::compare_exchange(tat, current, next) } {
            Ok(()) => return true,
            Err(seen) => current = seen,
        }
    }
    warn!(ctx, "bucket of {:i} contended past {} attempts", key.addr, CAS_ATTEMPTS);
    unsafe { atomic::increment(dropped) };
    false
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
