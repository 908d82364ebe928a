use std::time::Duration;

use super::{
    EventKind, SecurityEvent,
    format::{event, summary},
    shown_key_id,
    suppress::{Subject, Summary},
};
use crate::config::agent::SecurityLogFormat;
use limiter_core::signature::FailureReason;

const NOW: Duration = Duration::from_millis(1_800_000_000_250);

fn net<T: std::str::FromStr>(text: &str) -> T {
    text.parse().unwrap_or_else(|_| panic!("{text}: not an address"))
}

fn parsed(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|error| panic!("{line}: {error}"))
}

#[test]
fn a_json_event_names_its_kind_reason_client_and_key() {
    let failure = SecurityEvent::signature_failure(net("2001:db8::7"), FailureReason::BadMac, Some("k-pay".into()));
    let line: serde_json::Value = parsed(&event(SecurityLogFormat::Json, &failure, NOW));
    assert_eq!(
        line,
        serde_json::json!({
            "time": 1_800_000_000.25, "event": "signature_failure", "reason": "bad_mac",
            "client": "2001:db8::7", "key_id": "k-pay"
        })
    );
    let replay = SecurityEvent::signature_failure(net("192.0.2.1"), FailureReason::Replay, None);
    assert_eq!(replay.kind, EventKind::Replay);
    let block = SecurityEvent::kernel_block(net("2001:db8::/64"), Some(Duration::from_secs(600)), "fleet");
    let line: serde_json::Value = parsed(&event(SecurityLogFormat::Json, &block, NOW));
    assert_eq!(
        (&line["client"], &line["ttl_s"], &line["reason"]),
        (&"2001:db8::/64".into(), &600.into(), &"fleet".into())
    );
}

#[test]
fn a_summary_counts_the_events_it_stands_for() {
    let subject =
        Subject { client: Some(net("192.0.2.1/32")), kind: EventKind::SignatureFailure, reason: Some("bad_mac") };
    let summarised = Summary { subject, suppressed: 41, since: NOW - Duration::from_secs(1) };
    let line: serde_json::Value = parsed(&summary(SecurityLogFormat::Json, &summarised, NOW));
    assert_eq!(
        line,
        serde_json::json!({
            "time": 1_800_000_000.25, "event": "suppressed", "of": "signature_failure", "reason": "bad_mac",
            "client": "192.0.2.1", "suppressed": 41, "since": 1_799_999_999.25
        })
    );
    let cef = summary(SecurityLogFormat::Cef, &summarised, NOW);
    assert!(cef.starts_with("CEF:0|limiter|limiter|"), "{cef}");
    assert!(
        cef.contains("|suppressed|41 signature_failure events suppressed|3|") && cef.contains(" cnt=41\n"),
        "{cef}"
    );
}

#[test]
fn cef_escapes_its_separators() {
    let denied = SecurityEvent::deny_rule(net("192.0.2.1"), "no|pipes=or\\slashes\nhere");
    let line = event(SecurityLogFormat::Cef, &denied, NOW);
    assert_eq!(
        line,
        format!(
            "CEF:0|limiter|limiter|{}|deny_rule|Denied by rule|6|rt=1800000000250 src=192.0.2.1 cs1Label=rule \
             cs1=no|pipes\\=or\\\\slashes\\nhere\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn a_bearer_key_or_an_unknown_one_is_shortened() {
    assert_eq!(shown_key_id("k-pay", true), "k-pay");
    assert_eq!(shown_key_id("sk-live-0123456789", false), "sk-l…");
    assert_eq!(shown_key_id("ab", false), "ab…");
    let demoted = SecurityEvent::demotion(net("192.0.2.1"), shown_key_id("sk-live-1", false), "free", "abuse");
    let line: serde_json::Value = parsed(&event(SecurityLogFormat::Json, &demoted, NOW));
    assert_eq!((&line["event"], &line["plan"], &line["key_id"]), (&"demotion".into(), &"free".into(), &"sk-l…".into()));
}
