//! Indices of the per-CPU packet counters.
//!
//! Every frame the program sees ends in exactly one of the verdict counters
//! (`passed`, `allowed`, `dropped_*`); `malformed`, `would_drop`, `new_sources` and
//! `non_ip` count events on top of the verdict.

/// One per-CPU counter.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Passed after the source's bucket admitted it (or a would-drop in dry run).
    Passed = 0,
    /// Dropped: the source's bucket was empty.
    DroppedRateLimit = 1,
    /// Dropped: a deny CIDR or a runtime block matched.
    DroppedDeny = 2,
    /// Passed unlimited by an allow CIDR, or as link-local control traffic (ARP is
    /// counted as `non_ip`, neighbour discovery here).
    Allowed = 3,
    /// Truncated or inconsistent headers, whatever the verdict.
    Malformed = 4,
    /// Dry run: would have been dropped by a limit, a deny or a block.
    WouldDrop = 5,
    /// A source seen for the first time (or again after LRU eviction).
    NewSources = 6,
    /// Dropped because `malformed = "drop"`.
    DroppedMalformed = 7,
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): always passed.
    NonIp = 8,
    /// Dropped: a source without a bucket found the new-source budget empty (it was
    /// not inserted).
    DroppedNewSource = 9,
    /// Dropped: the bucket of the source's prefix was empty.
    DroppedAggregate = 10,
    /// Dropped: a TCP SYN from an unverified source found the SYN budget empty.
    DroppedSyn = 11,
    /// Dropped: a TCP SYN from an unverified source had spent its share of the SYN
    /// budget.
    DroppedSynShare = 12,
    /// Dropped: an IPv6 packet from an IPv4-mapped address (`::ffff:0:0/96`), which no
    /// IPv6 host sends and the stack refuses: it must not pass as the IPv4 source.
    DroppedV4Mapped = 13,
    /// Dropped by `[xdp.services]`: TCP or UDP to a port the host does not serve
    /// (and no reply to its own connection), ICMP under `icmp = "drop"`, another IP
    /// protocol under `other = "drop"`.
    DroppedService = 14,
    /// Dropped: the source's byte budget had too few bytes left for the frame.
    DroppedBytes = 15,
}

impl Counter {
    /// Every counter in index order.
    pub const ALL: [Self; 16] = [
        Self::Passed,
        Self::DroppedRateLimit,
        Self::DroppedDeny,
        Self::Allowed,
        Self::Malformed,
        Self::WouldDrop,
        Self::NewSources,
        Self::DroppedMalformed,
        Self::NonIp,
        Self::DroppedNewSource,
        Self::DroppedAggregate,
        Self::DroppedSyn,
        Self::DroppedSynShare,
        Self::DroppedV4Mapped,
        Self::DroppedService,
        Self::DroppedBytes,
    ];

    /// Size of the counters array.
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// The name used in `limiter stats --json` and in metrics.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::DroppedRateLimit => "dropped_rate_limit",
            Self::DroppedDeny => "dropped_deny",
            Self::Allowed => "allowed",
            Self::Malformed => "malformed",
            Self::WouldDrop => "would_drop",
            Self::NewSources => "new_sources",
            Self::DroppedMalformed => "dropped_malformed",
            Self::NonIp => "non_ip",
            Self::DroppedNewSource => "dropped_new_source",
            Self::DroppedAggregate => "dropped_aggregate",
            Self::DroppedSyn => "dropped_syn",
            Self::DroppedSynShare => "dropped_syn_share",
            Self::DroppedV4Mapped => "dropped_v4_mapped",
            Self::DroppedService => "dropped_service",
            Self::DroppedBytes => "dropped_bytes",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Counter;

    #[test]
    fn indices_match_positions() {
        for (i, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, i, "{}", counter.name());
        }
    }
}
