//! The PROXY protocol header parser over arbitrary bytes, as a trusted peer's
//! connection may start: a header no longer than the bytes, a wait for more that stops
//! short of `MAX_V2_BYTES`, or an error; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_core::proxy_protocol::{Accepted, MAX_V2_BYTES, parse};

fuzz_target!(|bytes: &[u8]| {
    for accepted in [Accepted::V1, Accepted::V2, Accepted::Any] {
        match parse(bytes, accepted) {
            Ok(Some((_, consumed))) => assert!(consumed <= bytes.len()),
            Ok(None) => assert!(bytes.len() < MAX_V2_BYTES, "waits for more after {} bytes", bytes.len()),
            Err(_) => {}
        }
    }
});
