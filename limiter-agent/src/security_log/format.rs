//! An event's line: a JSON object, or CEF
//! (`CEF:0|limiter|limiter|VERSION|SIG|NAME|SEVERITY|k=v …`, with CEF's escapes).

use std::{fmt::Write as _, time::Duration};

use ipnet::IpNet;
use serde::Serialize;

use super::{
    event::{EventKind, SecurityEvent},
    suppress::Summary,
};
use crate::config::agent::SecurityLogFormat;

/// One line's fields, whatever the format.
#[derive(Debug, Serialize)]
struct Line<'a> {
    /// Unix time, in seconds with milliseconds.
    time: f64,
    #[serde(skip)]
    kind: EventKind,
    /// `kind`, named.
    event: &'static str,
    /// A summary's: the kind of the events it counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    of: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// An address, or a block's CIDR; absent from the summary of the clients past
    /// the bound on those followed.
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a str>,
    /// A summary's count.
    #[serde(skip_serializing_if = "Option::is_none")]
    suppressed: Option<u64>,
    /// A summary's: when the event written before those it counts was.
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<f64>,
}

/// An address, or a CIDR wider than one.
fn client(net: IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() { net.addr().to_string() } else { net.to_string() }
}

fn seconds(time: Duration) -> f64 {
    (time.as_millis() as f64) / 1000.0
}

/// `event` at `now` (Unix time) as a line ending in `\n`.
pub(super) fn event(format: SecurityLogFormat, event: &SecurityEvent, now: Duration) -> String {
    let line = Line {
        time: seconds(now),
        kind: event.kind,
        event: event.kind.as_str(),
        of: None,
        reason: event.reason,
        client: Some(client(event.client)),
        key_id: event.key_id.as_deref(),
        rule: event.rule.as_deref(),
        ttl_s: event.ttl.map(|ttl| ttl.as_secs()),
        plan: event.plan.as_deref(),
        suppressed: None,
        since: None,
    };
    render(format, &line)
}

/// `summary` at `now` as a line ending in `\n`.
pub(super) fn summary(format: SecurityLogFormat, summary: &Summary, now: Duration) -> String {
    let subject = &summary.subject;
    let line = Line {
        time: seconds(now),
        kind: EventKind::Suppressed,
        event: EventKind::Suppressed.as_str(),
        of: Some(subject.kind.as_str()),
        reason: subject.reason,
        client: subject.client.map(client),
        key_id: None,
        rule: None,
        ttl_s: None,
        plan: None,
        suppressed: Some(summary.suppressed),
        since: Some(seconds(summary.since)),
    };
    render(format, &line)
}

fn render(format: SecurityLogFormat, line: &Line<'_>) -> String {
    let mut text = match format {
        // Serialising strings and numbers cannot fail.
        SecurityLogFormat::Json => serde_json::to_string(line).unwrap_or_default(),
        SecurityLogFormat::Cef => cef(line),
    };
    text.push('\n');
    text
}

/// The CEF line: the kind's Signature ID, Name and Severity in the header, the rest
/// in the extension under CEF's own keys where it has one (`rt`, `src`, `reason`,
/// `suser`, `cnt`), labelled custom ones else.
fn cef(line: &Line<'_>) -> String {
    let (name, severity) = line.kind.cef();
    let name = match line.suppressed {
        Some(n) => format!("{n} {} events suppressed", line.of.unwrap_or_default()),
        None => name.to_owned(),
    };
    let mut text = format!(
        "CEF:0|limiter|limiter|{}|{}|{}|{severity}|",
        header(env!("CARGO_PKG_VERSION")),
        header(line.event),
        header(&name)
    );
    let time_ms = (line.time * 1000.0).round() as u64;
    let mut fields: Vec<(&'static str, String)> = vec![("rt", time_ms.to_string())];
    if let Some(client) = &line.client {
        match client.split_once('/') {
            Some((address, _)) => {
                fields.push(("src", address.to_owned()));
                custom(&mut fields, ("cs3Label", "cs3"), "cidr", client.clone());
            }
            None => fields.push(("src", client.clone())),
        }
    }
    if let Some(reason) = line.reason {
        fields.push(("reason", reason.to_owned()));
    }
    if let Some(key_id) = line.key_id {
        fields.push(("suser", key_id.to_owned()));
    }
    if let Some(rule) = line.rule {
        custom(&mut fields, ("cs1Label", "cs1"), "rule", rule.to_owned());
    }
    if let Some(plan) = line.plan {
        custom(&mut fields, ("cs2Label", "cs2"), "plan", plan.to_owned());
    }
    if let Some(of) = line.of {
        custom(&mut fields, ("cs4Label", "cs4"), "of", of.to_owned());
    }
    if let Some(ttl) = line.ttl_s {
        custom(&mut fields, ("cn1Label", "cn1"), "ttlSeconds", ttl.to_string());
    }
    if let Some(n) = line.suppressed {
        fields.push(("cnt", n.to_string()));
    }
    for (i, (key, value)) in fields.iter().enumerate() {
        let separator = if i == 0 { "" } else { " " };
        let _ = write!(text, "{separator}{key}={}", extension(value));
    }
    text
}

/// A custom extension field: its label under `slot.0`, its value under `slot.1`.
fn custom(fields: &mut Vec<(&'static str, String)>, slot: (&'static str, &'static str), label: &str, value: String) {
    fields.push((slot.0, label.to_owned()));
    fields.push((slot.1, value));
}

/// A header field, `\` and `|` escaped (and no line break).
fn header(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '\r' | '\n' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// An extension value, `\` and `=` escaped and line breaks written `\n`, `\r`.
fn extension(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' | '=' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ => out.push(c),
        }
    }
    out
}
