//! What every typed map wrapper needs: the kernel's clock, an error naming the map,
//! and an LRU map's size. Apart from `maps.rs` so that the wrappers it holds
//! (`verified.rs`) need nothing back from it.

use aya::maps::Map;

use super::XdpError;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
#[must_use]
pub fn monotonic_now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: an out-pointer to a timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// The resolution of `CLOCK_MONOTONIC_COARSE` (= `bpf_ktime_get_coarse_ns`): one
/// jiffy, `1 / CONFIG_HZ`. If the kernel cannot say, a bound no rate fits, so the
/// buckets keep the precise clock.
#[must_use]
pub fn coarse_tick_ns() -> u64 {
    let mut resolution = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: an out-pointer to a timespec we own.
    let status = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut resolution) };
    let nanos = u64::try_from(resolution.tv_sec).unwrap_or(u64::MAX).saturating_mul(1_000_000_000);
    match nanos.checked_add(u64::try_from(resolution.tv_nsec).unwrap_or(u64::MAX)) {
        Some(tick) if status == 0 && tick != 0 => tick,
        _ => u64::MAX,
    }
}

/// The host's ephemeral ports (`net.ipv4.ip_local_port_range`, which IPv6 shares):
/// where the replies to its own connections arrive. Linux's default range if the
/// file cannot be read or says something else than two ports.
#[must_use]
pub fn ephemeral_ports() -> [u16; 2] {
    const LINUX_DEFAULT: [u16; 2] = [32_768, 60_999];
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    port_range(&text).unwrap_or(LINUX_DEFAULT)
}

/// `ip_local_port_range`'s two ports (`32768\t60999\n`), first and last.
fn port_range(text: &str) -> Option<[u16; 2]> {
    let mut ports = text.split_whitespace().map(str::parse::<u16>);
    match (ports.next(), ports.next(), ports.next()) {
        (Some(Ok(first)), Some(Ok(last)), None) if first <= last => Some([first, last]),
        _ => None,
    }
}

pub(super) fn map_error(name: &'static str) -> impl Fn(aya::maps::MapError) -> XdpError {
    move |source| XdpError::Map { name, source }
}

/// `max_entries` of an LRU hash (0 for any other kind).
pub(super) fn capacity(map: &Map, name: &'static str) -> Result<u32, XdpError> {
    match map {
        Map::LruHashMap(data) => Ok(data.info().map_err(map_error(name))?.max_entries()),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::port_range;

    #[test]
    fn the_ephemeral_range_is_two_ports_in_order() {
        assert_eq!(port_range("32768\t60999\n"), Some([32_768, 60_999]));
        assert_eq!(port_range("1024 1024"), Some([1_024, 1_024]));
        for bad in ["", "60999 32768", "32768", "1 2 3", "0x10 20", "70000 80000"] {
            assert_eq!(port_range(bad), None, "{bad:?}");
        }
    }
}
