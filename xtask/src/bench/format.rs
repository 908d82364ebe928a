//! How a figure is written in the report, apart from `markdown.rs` so that the groups,
//! which `markdown.rs` calls for their sections, need nothing back from it.

/// A figure with `digits` decimals, or a dash when it was not measured.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.digits$}"))
}
