//! Source addresses as the kernel layer keys them.
//!
//! Every source is 16 bytes: IPv4 sources (and IPv4-mapped IPv6 ones) as
//! `::ffff:a.b.c.d`, IPv6 sources masked to the configured prefix, so that one
//! host holding a whole /64 cannot mint a fresh bucket per address.

/// `::ffff:0:0/96`, the IPv4-mapped prefix.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
/// Bits of [`V4_MAPPED_PREFIX`] in front of an IPv4 source's 16-byte key.
pub const V4_MAPPED_BITS: u8 = 96;

/// The 16-byte form of an IPv4 source.
#[inline(always)]
#[must_use]
pub const fn v4_mapped(v4: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3]]
}

/// The IPv4 address inside an IPv4-mapped IPv6 address, if it is one.
#[inline(always)]
#[must_use]
pub fn as_v4(v6: &[u8; 16]) -> Option<[u8; 4]> {
    let mut i = 0;
    while i < 12 {
        if v6[i] != V4_MAPPED_PREFIX[i] {
            return None;
        }
        i += 1;
    }
    Some([v6[12], v6[13], v6[14], v6[15]])
}

/// Zeroes every bit of `v6` past the first `prefix_len` (clamped to 128).
///
/// On two 64-bit halves rather than byte by byte: in the XDP program a byte loop
/// with a branch per byte took some 90 bytes of its 512-byte stack.
#[inline(always)]
#[must_use]
pub fn mask_v6(v6: [u8; 16], prefix_len: u8) -> [u8; 16] {
    let bits = u32::from(if prefix_len > 128 { 128 } else { prefix_len });
    // The top `n` bits of a half, `n` from 0 to 64.
    let top = |n: u32| if n == 0 { 0 } else { u64::MAX << (64 - n) };
    let [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p] = v6;
    let high = u64::from_be_bytes([a, b, c, d, e, f, g, h]) & top(if bits > 64 { 64 } else { bits });
    let low = u64::from_be_bytes([i, j, k, l, m, n, o, p]) & top(bits.saturating_sub(64));
    let [a, b, c, d, e, f, g, h] = high.to_be_bytes();
    let [i, j, k, l, m, n, o, p] = low.to_be_bytes();
    [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p]
}

#[cfg(test)]
mod tests {
    use super::{as_v4, mask_v6, v4_mapped};

    #[test]
    fn mapped_round_trip() {
        let mapped = v4_mapped([192, 0, 2, 7]);
        assert_eq!(as_v4(&mapped), Some([192, 0, 2, 7]));
        assert_eq!(as_v4(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4]), None);
    }

    #[test]
    fn masks_whole_and_partial_bytes() {
        let all = [0xff; 16];
        assert_eq!(mask_v6(all, 0), [0; 16]);
        assert_eq!(mask_v6(all, 128), all);
        assert_eq!(mask_v6(all, 200), all);
        let m = mask_v6(all, 60);
        assert_eq!(&m[..7], &[0xff; 7]);
        assert_eq!(m[7], 0xf0);
        assert_eq!(&m[8..], &[0; 8]);
    }
}
