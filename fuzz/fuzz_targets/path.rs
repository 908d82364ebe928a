//! The path canonicaliser over arbitrary paths and options: never a panic, and a
//! canonical path is its own canonical form.

#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_core::path::{CanonicalPath, EscapedSlashes, PathOptions};

fuzz_target!(|input: (bool, bool, &str)| {
    let (keep, case_insensitive, raw) = input;
    let escaped_slashes = if keep { EscapedSlashes::Keep } else { EscapedSlashes::Reject };
    let options = PathOptions { escaped_slashes, case_insensitive };
    let Ok(path) = CanonicalPath::parse(raw, options) else {
        return;
    };
    assert_eq!(CanonicalPath::parse(path.forward(), options).as_ref(), Ok(&path), "{raw:?}");
    let route = CanonicalPath::parse(path.route(), options).map(|again| again.route().to_owned());
    assert_eq!(route.as_deref(), Ok(path.route()), "{raw:?}");
    for form in [path.forward(), path.route()] {
        assert!(form.starts_with('/') && form.is_ascii() && !form.contains('\\'), "{raw:?} -> {form:?}");
        let segments: Vec<&str> = form.split('/').skip(1).collect();
        for (i, segment) in segments.iter().enumerate() {
            assert!(!segment.is_empty() || i + 1 == segments.len(), "{raw:?} -> {form:?}");
            assert!(!matches!(*segment, "." | ".."), "{raw:?} -> {form:?}");
        }
    }
});
