//! The JA4 ClientHello parser over arbitrary bytes, as a connection may start: the
//! capture's progress never asks for more than a capture holds, bytes with a
//! fingerprint are settled, and a fingerprint reads back as itself; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_core::ja4::{MAX_CAPTURE_BYTES, Ja4, Progress, fingerprint, progress};

fuzz_target!(|bytes: &[u8]| {
    match progress(bytes) {
        Progress::More(n) => assert!(n >= 1 && bytes.len() + n <= MAX_CAPTURE_BYTES, "asks {n} more after {}", bytes.len()),
        Progress::Settled => {}
    }
    if let Some(ja4) = fingerprint(bytes) {
        assert_eq!(ja4.to_string().parse::<Ja4>(), Ok(ja4));
        assert_eq!(progress(bytes), Progress::Settled);
    }
});
