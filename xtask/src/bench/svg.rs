//! One SVG bar chart per group, drawn by hand: the report needs no plotting crate.

use std::fmt::Write as _;

/// A horizontal bar chart, one bar per (label, value).
pub fn bar_chart(title: &str, unit: &str, bars: &[(String, f64)]) -> String {
    let (width, label_w, bar_h, top) = (760.0, 300.0, 26.0, 40.0);
    let max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max).max(1e-12);
    let height = top + bars.len() as f64 * (bar_h + 8.0) + 20.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
        escape(title)
    );
    let colors = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6"];
    for (i, (label, value)) in bars.iter().enumerate() {
        let y = top + i as f64 * (bar_h + 8.0);
        let w = (width - label_w - 120.0) * value / max;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<rect x=\"{label_w}\" y=\"{y}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{}\"/>\n\
             <text x=\"{:.1}\" y=\"{}\">{} {}</text>\n",
            label_w - 8.0,
            y + bar_h * 0.7,
            escape(label),
            colors[i % colors.len()],
            label_w + w + 6.0,
            y + bar_h * 0.7,
            pretty(*value),
            escape(unit)
        );
    }
    s + "</svg>\n"
}

fn pretty(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0} k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_chart_is_svg_with_one_bar_per_value() {
        let svg = bar_chart("t <1>", "ns", &[("a".into(), 1.0), ("b".into(), 2.0)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("t &lt;1&gt;"));
    }
}
