//! The config parser over arbitrary text: a config or an error naming a line, never
//! a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use limiter_config::{Config, ConfigError};

fuzz_target!(|text: &str| {
    match Config::parse(text, Path::new("fuzz.toml")) {
        Ok(_) => {}
        Err(ConfigError::Invalid { line, .. }) => assert!((1..=text.matches('\n').count() + 1).contains(&line)),
        Err(error) => panic!("parsing text cannot fail to read: {error}"),
    }
});
