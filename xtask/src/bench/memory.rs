//! The memory group: the `bench_memory` example's bytes per tracked key in the
//! proxy and per tracked source in the kernel.

use std::fmt::Write as _;

use limiter_lab::report::{Memory, Outcome};

use super::{Bench, format::num};

pub const TITLE: &str = "6. Memory";

pub fn run(bench: &mut Bench) -> Outcome<Memory> {
    let s = bench.sizes;
    bench.example("bench_memory", &[s.memory_keys.to_string(), s.memory_sources.to_string()])
}

pub fn markdown(m: &mut String, mem: &Memory) {
    let _ = writeln!(m, "## {TITLE}\n\n| where | bytes per tracked key |\n|---|---|");
    for r in &mem.proxy {
        let _ = writeln!(m, "| proxy, {} ({} keys, heap) | {} |", r.algorithm, r.keys, num(Some(r.bytes_per_key), 0));
    }
    let k = &mem.kernel;
    let _ = writeln!(
        m,
        "| kernel sources map ({}, {} slots, key {} B + value {} B) | {} |",
        k.map_type,
        k.capacity,
        k.key_bytes,
        k.value_bytes,
        num(Some(k.bytes_per_source), 0)
    );
}
