//! The limiter XDP program: per-source token buckets, CIDR policy and runtime blocks,
//! and what holds against spoofed sources: a budget for new sources, prefix
//! aggregates and a SYN budget, all skipped by verified sources.
//!
//! A frame goes `parse` → blocks → CIDR policy → the service policy (with
//! `[xdp.services]`: the ports the host serves) → demotion (a demoted source's
//! bucket takes the demoted rate) → the source's bucket and byte budget (its
//! `[[xdp.port]]` service's in place of the default's, for a packet to a listed
//! port; for a source without them, the new-source budget) → its prefix's aggregate
//! → for a SYN to a served port, the source's share of the SYN budget, then the
//! budget (`limiter_common::bucket`, `bucket.rs`) → one verdict counter. The shared buckets
//! come after the source's own, so that a source refused by its own limit does not
//! also drain what its neighbours, or everyone, share. Every tunable is read from maps
//! on each packet, so the agent changes limits without reloading the program.
//!
//! Minimum kernel: 5.12 (BPF_CMPXCHG); tested on 6.18.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "BPF has no core::sync::atomic for u64, see atomic.rs")]

mod atomic;
mod bucket;
mod maps;
mod parse;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_xdp_get_buff_len},
    macros::xdp,
    maps::lpm_trie::Key,
    programs::XdpContext,
};
use aya_log_ebpf::debug;
use limiter_common::{
    addr::{V4_MAPPED_BITS, mask_v6},
    bucket::{ByteRate, Rate, Taken},
    counters::Counter,
    maps::{
        Action, BUDGET_NEW_SOURCES, BUDGET_SYN, BucketKey, CidrPolicy, FEATURE_AGGREGATE, FEATURE_COARSE_CLOCK,
        FEATURE_NEW_SOURCES, FEATURE_PORTS, FEATURE_SERVICES, FEATURE_SYN, OCCUPIED_BLOCK_V4, OCCUPIED_BLOCK_V6,
        OCCUPIED_CIDR_V4, OCCUPIED_CIDR_V6, OCCUPIED_DEMOTE, Settings, SourceKey,
    },
};

use crate::{
    bucket::{Bytes, Charged, charge, take_budget},
    maps::{
        AGGREGATES, BLOCK_V4, BLOCK_V6, BUDGETS, CIDR_V4, CIDR_V6, DEMOTE, SOURCES, SYN_SHARES, count, may_hold,
        settings, verified,
    },
    parse::{Frame, Packet, Syn, parse},
};

// `frags`: a jumbo frame arrives as several buffers; without it a native attach to
// a link whose MTU exceeds a page is refused.
#[xdp(frags)]
pub fn limiter(ctx: XdpContext) -> u32 {
    let Some(settings) = settings() else {
        count(Counter::Passed);
        return XDP_PASS;
    };
    let enforce = settings.enforce != 0;
    let mut packet = Packet::EMPTY;
    match parse(&ctx, settings.ipv6_prefix, &mut packet) {
        Frame::NonIp => {
            count(Counter::NonIp);
            count(Counter::Passed);
            return XDP_PASS;
        }
        Frame::Malformed => {
            count(Counter::Malformed);
            return if settings.malformed_drop != 0 { refuse(enforce, Counter::DroppedMalformed) } else { pass() };
        }
        Frame::V4Mapped => return refuse(enforce, Counter::DroppedV4Mapped),
        Frame::Ip => {}
    }
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
    let no_aggregate = Rate { interval_ns: 0, tolerance_ns: 0 };
    // Each value is read through a reference where it lies: a tuple returned in an
    // `Option` leaves its payload undefined on the `None` path, and the verifier
    // refuses the program once LLVM copies such a register.
    let (rate, byte_rate, rule_aggregate, service) = match policy(&packet) {
        Some(rule) => match rule.action {
            ALLOW => {
                count(Counter::Allowed);
                return XDP_PASS;
            }
            DENY => return refuse(enforce, Counter::DroppedDeny),
            _ => (rule.rate, rule.bytes, rule.aggregate, false),
        },
        None => match port_limit(&packet, settings) {
            Some(entry) => (settings.port_rates[entry], settings.port_bytes[entry], no_aggregate, true),
            None => (settings.default_rate, settings.default_bytes, no_aggregate, false),
        },
    };
    // Before the buckets, so that a flood to ports nobody serves (a reflection's)
    // neither spends its sources' tokens nor makes buckets for them. A fragment
    // after the first shows no port: it follows its source's buckets, and the stack
    // cannot reassemble it without the first, which was checked.
    if settings.has(FEATURE_SERVICES)
        && !packet.later_fragment
        && !settings.serves(packet.protocol, packet.port, packet.reply, &packet.v6)
    {
        return refuse(enforce, Counter::DroppedService);
    }
    // After the CIDR rules, so that an allow rule is never demoted; the source keeps
    // its bucket (its TAT), only the rate it refills at changes.
    let mut rate = rate;
    demote(&packet, &mut rate);
    let bytes = frame_bytes(&ctx, byte_rate);
    // Read the clock only once a bucket needs it: it is the costliest helper here.
    let now = bucket_clock(settings);
    let key = SourceKey { addr: packet.source };
    let mut proof = Proof::Unknown;
    let syn = budgeted_syn(&packet, settings);
    // A source without a bucket is refused before the map is touched when the budget
    // is empty: a flood of spoofed sources neither pays for an insert nor evicts the
    // buckets of the sources already known.
    let bucket = if service {
        BucketKey { addr: key.addr, port: packet.port, protocol: packet.protocol, reserved: 0 }
    } else {
        BucketKey::source(&key)
    };
    let charged = charge(&ctx, &SOURCES, &bucket, now, rate, bytes, || {
        !settings.has(FEATURE_NEW_SOURCES)
            || proof.verified(&key, now)
            || take_budget(&ctx, &BUDGETS, BUDGET_NEW_SOURCES, now, settings.new_source_rate)
    });
    match charged {
        Charged::Refused => return refuse(enforce, Counter::DroppedNewSource),
        Charged::Inserted(_) => {
            count(Counter::NewSources);
            debug!(&ctx, "new source {:i}", key.addr);
        }
        Charged::Existing(_) | Charged::Raced(_) => {}
    }
    match charged.taken() {
        Some(Taken::OverPackets) => return refuse(enforce, Counter::DroppedRateLimit),
        Some(Taken::OverBytes) => return refuse(enforce, Counter::DroppedBytes),
        Some(Taken::Admitted) | None => {}
    }
    if let Some(aggregate) = aggregate_rate(settings, rule_aggregate)
        && !proof.verified(&key, now)
        && !charge(&ctx, &AGGREGATES, &prefix_key(&packet, settings), now, aggregate, Bytes::NONE, || true).admitted()
    {
        return refuse(enforce, Counter::DroppedAggregate);
    }
    if syn
        && !proof.verified(&key, now)
        && let Some(refused) = charge_syn(&ctx, &key, now, settings)
    {
        return refuse(enforce, refused);
    }
    pass()
}

/// Charges a SYN to the source's share of the SYN budget, then to the budget; the
/// counter of its refusal, if refused.
#[inline(always)]
fn charge_syn(ctx: &XdpContext, key: &SourceKey, now: u64, settings: &Settings) -> Option<Counter> {
    // A source without a share takes the budget's token before one is made for it,
    // so that SYNs the empty budget refuses never churn the shares.
    let share = charge(ctx, &SYN_SHARES, key, now, settings.syn_source_rate, Bytes::NONE, || {
        take_budget(ctx, &BUDGETS, BUDGET_SYN, now, settings.syn_rate)
    });
    match share {
        Charged::Refused => Some(Counter::DroppedSyn),
        // The budget's token was taken for the insert, whichever CPU's insert won.
        Charged::Inserted(Taken::Admitted) | Charged::Raced(Taken::Admitted) => None,
        Charged::Existing(Taken::Admitted) => {
            (!take_budget(ctx, &BUDGETS, BUDGET_SYN, now, settings.syn_rate)).then_some(Counter::DroppedSyn)
        }
        Charged::Existing(_) | Charged::Inserted(_) | Charged::Raced(_) => Some(Counter::DroppedSynShare),
    }
}

/// The bucket and byte budget of the `[[xdp.port]]` service the packet goes to, if
/// it is listed: TCP or UDP to a port its header shows (a non-first fragment's
/// shows none, so it is charged to its source's bucket).
#[inline(always)]
fn port_limit(packet: &Packet, settings: &Settings) -> Option<usize> {
    if !settings.has(FEATURE_PORTS) || packet.port == 0 {
        return None;
    }
    settings.port_entry(packet.protocol, packet.port)
}

/// The frame's byte budget, if `rate` is one: the frame's whole length, Ethernet
/// header to its last byte (1 514 for a full frame on a 1 500-byte MTU), fragments
/// of a multi-buffer frame included. Without a budget the length is not read.
#[inline(always)]
fn frame_bytes(ctx: &XdpContext, rate: ByteRate) -> Bytes {
    if !rate.is_set() {
        return Bytes::NONE;
    }
    // SAFETY: the helper only reads the context the kernel handed us.
    Bytes { length: unsafe { bpf_xdp_get_buff_len(ctx.ctx) }, rate }
}

/// Whether the packet is a SYN that takes from the SYN budget: one to a port the
/// host serves, or one that a first fragment hides (it may be to any port).
#[inline(always)]
fn budgeted_syn(packet: &Packet, settings: &Settings) -> bool {
    settings.has(FEATURE_SYN)
        && match packet.syn {
            Syn::No => false,
            Syn::Open => settings.syn_port_counts(packet.port),
            Syn::Hidden => true,
        }
}

/// The clock of every bucket. The tick-grained one (a load of the time the last tick
/// stored, against a TSC read for the precise one) when the agent found its error
/// within bound for every rate in force (`limiter_common::bucket::coarse_clock_fits`).
/// Both are `CLOCK_MONOTONIC`, the coarse one up to a tick behind, so a bucket may
/// switch between them: a TAT ahead of `now` only delays the refill.
#[inline(always)]
fn bucket_clock(settings: &Settings) -> u64 {
    // SAFETY: helpers without arguments or preconditions.
    unsafe { if settings.has(FEATURE_COARSE_CLOCK) { bpf_ktime_get_coarse_ns() } else { bpf_ktime_get_ns() } }
}

/// Whether the source is verified, looked up at most once and only when a check
/// that verified sources skip is about to run.
enum Proof {
    Unknown,
    Known(bool),
}

impl Proof {
    #[inline(always)]
    fn verified(&mut self, key: &SourceKey, now: u64) -> bool {
        match *self {
            Self::Known(verified) => verified,
            Self::Unknown => {
                let verified = verified(key, now);
                *self = Self::Known(verified);
                verified
            }
        }
    }
}

/// The aggregate bucket that applies: the rule's own, else the global one if on.
#[inline(always)]
fn aggregate_rate(settings: &Settings, rule: Rate) -> Option<Rate> {
    if rule.interval_ns != 0 {
        Some(rule)
    } else if settings.has(FEATURE_AGGREGATE) {
        Some(settings.aggregate_rate)
    } else {
        None
    }
}

/// The key of the prefix the packet's source is aggregated under.
#[inline(always)]
fn prefix_key(packet: &Packet, settings: &Settings) -> SourceKey {
    let addr = match packet.v4() {
        Some(_) => mask_v6(packet.source, V4_MAPPED_BITS + settings.aggregate_ipv4_prefix),
        None => mask_v6(packet.v6, settings.aggregate_ipv6_prefix),
    };
    SourceKey { addr }
}

/// Returns XDP_PASS and nothing else: the floor that `cargo xtask bench` measures the
/// limiter against. The agent never loads or attaches it.
#[xdp]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    XDP_PASS
}

/// Returns XDP_DROP and nothing else: the floor of a filter on the flood bench's veth,
/// where dropping spares the stack. The agent never loads or attaches it.
#[xdp]
pub fn xdp_drop(_ctx: XdpContext) -> u32 {
    XDP_DROP
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
    let block = match packet.v4() {
        Some(v4) if may_hold(OCCUPIED_BLOCK_V4) => BLOCK_V4.get(Key::new(32, v4)),
        None if may_hold(OCCUPIED_BLOCK_V6) => BLOCK_V6.get(Key::new(128, packet.v6)),
        _ => return false,
    };
    // A block without expiry needs no clock.
    block.is_some_and(|block| block.expires_at_ns == 0 || block.active(unsafe { bpf_ktime_get_ns() }))
}

/// Replaces `rate` with the demoted rate of the packet's source, if a demotion in
/// force covers it. Written in place rather than returned: LLVM leaves the payload
/// of a `None` undefined, and the verifier refuses the program that copies it.
#[inline(always)]
fn demote(packet: &Packet, rate: &mut Rate) {
    if !may_hold(OCCUPIED_DEMOTE) {
        return;
    }
    // One trie for both families, IPv4 in its mapped form (`packet.v6` holds it for
    // an IPv4 source): a lookup per family doubled the paths the verifier walks
    // through the buckets, past its limit.
    let Some(demotion) = DEMOTE.get(Key::new(128, packet.v6)) else { return };
    // A demotion without expiry needs no clock.
    let expiry = demotion.expiry;
    // SAFETY: a helper without arguments or preconditions.
    if expiry.expires_at_ns == 0 || expiry.active(unsafe { bpf_ktime_get_ns() }) {
        *rate = demotion.rate;
    }
}

/// [`CidrPolicy::action`] of an `allow` and a `deny` rule; anything else limits.
const ALLOW: u32 = Action::Allow as u32;
const DENY: u32 = Action::Deny as u32;

/// The CIDR rule of the packet's source, if one covers it.
#[inline(always)]
fn policy(packet: &Packet) -> Option<&'static CidrPolicy> {
    match packet.v4() {
        Some(v4) if may_hold(OCCUPIED_CIDR_V4) => CIDR_V4.get(Key::new(32, v4)),
        None if may_hold(OCCUPIED_CIDR_V6) => CIDR_V6.get(Key::new(128, packet.v6)),
        _ => None,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
