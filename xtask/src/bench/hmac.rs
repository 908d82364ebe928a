//! The HMAC group: the `bench_hmac` example's signed-request verification
//! throughput by body size.

use std::fmt::Write as _;

use limiter_lab::report::{Hmac, Outcome};

use super::{Bench, format::num, svg::bar_chart};

pub const TITLE: &str = "5. HMAC verification";

pub fn run(bench: &mut Bench) -> Outcome<Hmac> {
    let bytes = bench.sizes.hmac_bytes.to_string();
    bench.example("bench_hmac", &[bytes])
}

pub fn markdown(m: &mut String, h: &Hmac) {
    let _ = writeln!(
        m,
        "## {TITLE} (body SHA-256 + string to sign + HMAC + replay cache)\n\n| body | verifications/s | MB/s |\n|---|---|---|"
    );
    for r in &h.rows {
        let _ = writeln!(
            m,
            "| {} B | {} | {:.0} |",
            r.body_bytes,
            num(Some(r.requests_per_second), 0),
            r.bytes_per_second / 1e6
        );
    }
    let _ = writeln!(m, "\n![hmac](hmac.svg)\n");
}

pub fn charts(h: &Hmac) -> Vec<(&'static str, String)> {
    let bars: Vec<(String, f64)> =
        h.rows.iter().map(|r| (format!("{} B", r.body_bytes), r.bytes_per_second / 1e6)).collect();
    vec![("hmac", bar_chart("HMAC verification throughput (higher is better)", "MB/s", &bars))]
}
