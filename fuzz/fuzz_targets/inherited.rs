//! The parser of the descriptors a process was started with (`LISTEN_PID`,
//! `LISTEN_FDS`, `LISTEN_FDNAMES`) over arbitrary text: a list of at most `MAX_FDS`
//! named descriptors from 3 on, or an error; never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_core::inherited::{FIRST_FD, ListenEnv, MAX_FDS, parse};

fuzz_target!(|bytes: &[u8]| {
    // Three variables, separated by NUL (which no environment value holds); a missing
    // one is unset.
    let text = String::from_utf8_lossy(bytes);
    let mut parts = text.split('\0');
    let env = ListenEnv { listen_pid: parts.next(), listen_fds: parts.next(), listen_fdnames: parts.next() };
    if let Ok(passed) = parse(env, 4242) {
        assert!(passed.len() <= MAX_FDS);
        for (fd, named) in (FIRST_FD..).zip(&passed) {
            assert_eq!(named.fd, fd);
            assert!(!named.name.is_empty() && !named.name.contains(':'));
        }
    }
});
