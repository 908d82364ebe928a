//! `[agent.security_log]`: one event per refused signature, scope or `deny` rule, as
//! JSON or CEF, to a file or a syslog socket; a flood from one client is one line a
//! second and summaries.

use std::{
    collections::BTreeMap,
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use http::{Method, StatusCode};
use limiter::config::{Config, agent::SecurityLogConfig};
use limiter::security_log::{LogCount, SecurityEvent, SecurityLog};
use limiter_core::{Clock as _, SystemClock};
use limiter_lab::support::{
    agent::{AgentProcess, agent_section},
    free_port,
    proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, exchange_from, secret_file, signed_route_config},
    unique,
    wait::{until, until_async},
};

/// The whole lines of the file at `path` once there are `count` of them.
async fn lines_of(path: &Path, count: usize) -> Vec<String> {
    let whole = || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.split_inclusive('\n').filter(|line| line.ends_with('\n')).map(str::to_owned).collect::<Vec<_>>()
    };
    until_async(&format!("{count} lines in the security log"), whole, |lines| lines.len() == count).await
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}.log", unique(name)))
}

/// A raw HTTP/1.1 request to the signed route, its MAC wrong.
fn bad_mac_request() -> String {
    let timestamp = SystemClock.now().as_secs();
    format!(
        "POST /api/transfer HTTP/1.1\r\nhost: test\r\nx-api-key: k-pay\r\nx-timestamp: {timestamp}\r\n\
         x-signature: {}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}",
        "0".repeat(64)
    )
}

/// Sends a request with a bad MAC from each of 127.0.0.2, .3 and .4: three clients, so
/// three events (one client's are one a second).
async fn three_bad_macs(proxy: &RunningProxy) {
    for last in 2..=4 {
        let answer = exchange_from([127, 0, 0, last], proxy.addr, bad_mac_request().as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
}

#[tokio::test]
async fn three_bad_macs_are_three_json_events() {
    let path = log_path("security-json");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&signed_route_config("", &secret_file(b"k-pay-secret")), upstream.addr).await;
    let log = proxy.log_security(&format!("path = \"{}\"\nformat = \"json\"\n", path.display()));
    three_bad_macs(&proxy).await;
    let lines = lines_of(&path, 3).await;
    let events: Vec<serde_json::Value> =
        lines.iter().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect();
    for (event, last) in events.iter().zip(2..) {
        assert_eq!(event["event"], "signature_failure", "{event}");
        assert_eq!(event["reason"], "bad_mac", "{event}");
        assert_eq!(event["client"], format!("127.0.0.{last}"), "{event}");
        // A signing key's id is no secret.
        assert_eq!(event["key_id"], "k-pay", "{event}");
        assert!(event["time"].as_f64().is_some_and(|time| time > 1.7e9), "{event}");
    }
    until("the lines counted", || log.stats(), |stats| stats.get(LogCount::Written) == 3);
    let _ = std::fs::remove_file(&path);
}

/// A CEF line, parsed by the format's grammar: seven `|`-separated header fields
/// (`\|` and `\\` escaped) after `CEF:`, then `key=value` pairs separated by spaces,
/// a value running to the space before the next `key=` (`\=`, `\\`, `\n` escaped).
#[derive(Debug)]
struct Cef {
    header: Vec<String>,
    extension: BTreeMap<String, String>,
}

fn parse_cef(line: &str) -> Cef {
    let rest = line.strip_prefix("CEF:").unwrap_or_else(|| panic!("not CEF: {line}"));
    let mut header = Vec::new();
    let mut field = String::new();
    let mut chars = rest.chars();
    while header.len() < 7 {
        match chars.next().unwrap_or_else(|| panic!("a header cut short: {line}")) {
            '\\' => field.push(chars.next().unwrap_or_else(|| panic!("a dangling escape: {line}"))),
            '|' => header.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    let extension_text: String = chars.collect();
    let mut extension = BTreeMap::new();
    let mut key = String::new();
    let mut value = String::new();
    let mut in_value = false;
    let mut chars = extension_text.chars().peekable();
    let keep = |extension: &mut BTreeMap<String, String>, key: &mut String, value: &mut String| {
        assert!(!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric()), "a bad key {key:?}: {line}");
        assert!(extension.insert(std::mem::take(key), value.trim_end().to_owned()).is_none(), "a key twice: {line}");
        value.clear();
    };
    while let Some(c) = chars.next() {
        match (in_value, c) {
            (false, '=') => in_value = true,
            (false, c) => key.push(c),
            (true, '\\') => match chars.next() {
                Some('n') => value.push('\n'),
                Some('r') => value.push('\r'),
                Some(c @ ('\\' | '=')) => value.push(c),
                other => panic!("a bad escape {other:?}: {line}"),
            },
            (true, '=') => panic!("an unescaped = in a value: {line}"),
            (true, ' ') => {
                // A space ends the value only if a key and `=` follow.
                let ahead: String = chars.clone().take_while(|c| *c != ' ').collect();
                match ahead.split_once('=') {
                    Some((next, _)) if !next.is_empty() && next.chars().all(|c| c.is_ascii_alphanumeric()) => {
                        keep(&mut extension, &mut key, &mut value);
                        in_value = false;
                    }
                    _ => value.push(' '),
                }
            }
            (true, c) => value.push(c),
        }
    }
    if in_value {
        keep(&mut extension, &mut key, &mut value);
    }
    Cef { header, extension }
}

#[tokio::test]
async fn three_bad_macs_are_three_cef_events() {
    let path = log_path("security-cef");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&signed_route_config("", &secret_file(b"k-pay-secret")), upstream.addr).await;
    proxy.log_security(&format!("path = \"{}\"\nformat = \"cef\"\n", path.display()));
    three_bad_macs(&proxy).await;
    for (line, last) in lines_of(&path, 3).await.iter().zip(2..) {
        let cef = parse_cef(line.trim_end_matches('\n'));
        assert_eq!(cef.header[..3], ["0", "limiter", "limiter"], "{cef:?}");
        assert_eq!(cef.header[4..], ["signature_failure", "Signature refused", "5"], "{cef:?}");
        assert_eq!(cef.extension["src"], format!("127.0.0.{last}"), "{cef:?}");
        assert_eq!(cef.extension["reason"], "bad_mac", "{cef:?}");
        assert_eq!(cef.extension["suser"], "k-pay", "{cef:?}");
        assert!(cef.extension["rt"].parse::<u64>().is_ok_and(|ms| ms > 1_700_000_000_000), "{cef:?}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_cef_parser_takes_escapes_and_spaces_in_values() {
    let cef = parse_cef(r"CEF:0|a\|b|c\\d|1|sig|name|5|msg=one two\=three src=192.0.2.1 cs1=x\\y\nz");
    assert_eq!(cef.header, ["0", "a|b", "c\\d", "1", "sig", "name", "5"]);
    assert_eq!(cef.extension["msg"], "one two=three");
    assert_eq!(cef.extension["src"], "192.0.2.1");
    assert_eq!(cef.extension["cs1"], "x\\y\nz");
}

/// 10 000 bad MACs from one client: a line a second at most for it, the rest counted
/// and summarised, none lost.
#[tokio::test]
async fn a_flood_of_bad_macs_is_a_line_a_second_and_summaries() {
    const REQUESTS: usize = 10_000;
    const TASKS: usize = 16;
    let path = log_path("security-flood");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&signed_route_config("", &secret_file(b"k-pay-secret")), upstream.addr).await;
    let log = proxy.log_security(&format!("path = \"{}\"\n", path.display()));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (client, url) = (TestClient::default(), proxy.url("/api/transfer"));
        tasks.spawn(async move {
            let timestamp = SystemClock.now().as_secs().to_string();
            let bad = "0".repeat(64);
            let headers = [("x-api-key", "k-pay"), ("x-timestamp", timestamp.as_str()), ("x-signature", bad.as_str())];
            for _ in 0..REQUESTS / TASKS {
                assert_eq!(client.request(Method::POST, &url, &headers, b"{}").await.status, StatusCode::UNAUTHORIZED);
            }
        });
    }
    tasks.join_all().await;
    let flooded = started.elapsed();
    // Every event is a line or suppressed, and every suppressed one is summarised
    // once the sweep has seen its interval out.
    let parsed = || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect();
        let events = lines.iter().filter(|line| line["event"] == "signature_failure").count();
        let summaries: Vec<u64> = lines
            .iter()
            .filter(|line| line["event"] == "suppressed")
            .filter_map(|line| line["suppressed"].as_u64())
            .collect();
        (events, summaries, log.stats().get(LogCount::Suppressed))
    };
    let (events, summaries, suppressed) =
        until_async("every event written or summarised", parsed, |(events, summaries, suppressed)| {
            *events as u64 + suppressed == REQUESTS as u64 && summaries.iter().sum::<u64>() == *suppressed
        })
        .await;
    let seconds = flooded.as_secs() as usize + 2;
    assert!(events <= seconds, "{events} events ({suppressed} suppressed) in {flooded:?}: more than one a second");
    println!(
        "{REQUESTS} bad MACs in {flooded:?}: {events} events, {} summaries, {suppressed} suppressed",
        summaries.len()
    );
    // Each summary, whether written before the next event or by the sweep while the
    // flood goes on, starts the client's interval again: at most one a second too,
    // counted until the last summary is in.
    let observed = started.elapsed();
    let summarised = summaries.len();
    assert!(
        summarised <= observed.as_secs() as usize + 2,
        "{summarised} summaries in {observed:?}: more than one a second"
    );
    assert_eq!(log.stats().get(LogCount::Dropped), 0);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn events_go_to_a_syslog_socket_as_datagrams() {
    let socket = log_path("security-syslog");
    let daemon = UnixDatagram::bind(&socket).expect("bind the syslog socket");
    daemon.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&signed_route_config("", &secret_file(b"k-pay-secret")), upstream.addr).await;
    proxy.log_security(&format!("syslog = \"unix://{}\"\nformat = \"cef\"\n", socket.display()));
    let answer = exchange_from([127, 0, 0, 5], proxy.addr, bad_mac_request().as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let message = tokio::task::spawn_blocking(move || {
        let mut buffer = [0u8; 2048];
        let n = daemon.recv(&mut buffer).expect("a message on the syslog socket");
        String::from_utf8(buffer[..n].to_vec()).expect("text")
    })
    .await
    .expect("the reader");
    let header = format!("<84>limiter[{}]: ", std::process::id());
    let cef = parse_cef(message.strip_prefix(&header).unwrap_or_else(|| panic!("no syslog header: {message}")));
    assert_eq!((cef.header[4].as_str(), cef.extension["src"].as_str()), ("signature_failure", "127.0.0.5"));
    let _ = std::fs::remove_file(&socket);
}

#[tokio::test]
async fn scope_refusals_and_deny_rules_are_events_and_a_bearer_key_is_shortened() {
    let path = log_path("security-scopes");
    let text = format!(
        r#"{PROXY_HEAD}
[proxy.plans.free]
limit = 100
window = "1m"
[[proxy.keys]]
id = "bearer-secret-id"
plan = "free"
auth = "bearer"
scopes = ["reports"]
[[proxy.scopes]]
name = "admin"
paths = ["/admin"]
[[proxy.scopes]]
name = "reports"
paths = ["/reports"]
[[proxy.rules]]
name = "no-wp"
path = "/wp-login.php"
action = "deny"
"#
    );
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    proxy.log_security(&format!("path = \"{}\"\n", path.display()));
    let client = TestClient::default();
    let key = [("x-api-key", "bearer-secret-id")];
    assert_eq!(client.get(&proxy.url("/admin/users"), &key).await.status, StatusCode::FORBIDDEN);
    assert_eq!(client.get(&proxy.url("/admin/users"), &[]).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(client.get(&proxy.url("/wp-login.php"), &[]).await.status, StatusCode::FORBIDDEN);
    let lines = lines_of(&path, 3).await;
    let events: Vec<serde_json::Value> =
        lines.iter().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect();
    let fields = |event: &serde_json::Value| {
        ["event", "reason", "rule", "key_id"].map(|field| event[field].as_str().unwrap_or("-").to_owned())
    };
    assert_eq!(fields(&events[0]), ["scope_refused", "missing_scope", "admin", "bear…"]);
    assert_eq!(fields(&events[1]), ["scope_refused", "no_key", "admin", "-"]);
    assert_eq!(fields(&events[2]), ["deny_rule", "-", "no-wp", "-"]);
    assert!(!lines.concat().contains("bearer-secret-id"), "a bearer key in the log: {lines:?}");
    let _ = std::fs::remove_file(&path);
}

/// A reload that changes the section: the new file takes the events from then on,
/// and the counts go on.
#[test]
fn a_changed_section_moves_the_events_to_its_file() {
    let (first, second) = (log_path("security-first"), log_path("security-second"));
    let section = |path: &Path| -> SecurityLogConfig {
        let text = format!("[agent.security_log]\npath = \"{}\"\n", path.display());
        Config::parse(&text, Path::new("test.toml")).expect("config").agent.security_log.expect("the section")
    };
    let log = SecurityLog::start(Some(&section(&first))).expect("open");
    let event = |last| SecurityEvent::deny_rule(std::net::IpAddr::from([192, 0, 2, last]), "rule");
    log.record(&event(1));
    until("the first line", || log.stats(), |stats| stats.get(LogCount::Written) == 1);
    log.install(log.prepare(Some(&section(&first))).expect("unchanged"));
    log.install(log.prepare(Some(&section(&second))).expect("the second file"));
    log.record(&event(2));
    until("the second line", || log.stats(), |stats| stats.get(LogCount::Written) == 2);
    let read = |path: &Path| std::fs::read_to_string(path).expect("the log");
    assert!(read(&first).contains("192.0.2.1") && !read(&first).contains("192.0.2.2"));
    assert!(read(&second).contains("192.0.2.2"));
    // Off: nothing more is written.
    log.install(log.prepare(None).expect("off"));
    log.record(&event(3));
    assert!(!read(&second).contains("192.0.2.3"));
    // A directory that does not exist refuses the change before anything else is applied.
    let missing = std::env::temp_dir().join(unique("no-such-dir")).join("security.log");
    assert!(log.prepare(Some(&section(&missing))).is_err());
    let _ = (std::fs::remove_file(&first), std::fs::remove_file(&second));
}

/// The agent hands its proxy the log it starts, counts its lines in `limiter stats`,
/// and a reload of the section moves the events to the new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_logs_its_proxys_events_and_a_reload_moves_them() {
    let upstream = Upstream::start().await;
    let (name, listen, secret) = (unique("lseclog"), free_port(), secret_file(b"k-pay-secret"));
    let (first, second) = (log_path("security-agent-first"), log_path("security-agent-second"));
    let proxy = signed_route_config("", &secret)
        .replace("127.0.0.1:0", &format!("127.0.0.1:{listen}"))
        .replace("{upstream}", &upstream.addr.to_string());
    let text = |log: &Path| {
        format!(
            "{}[agent.security_log]\npath = \"{}\"\nformat = \"cef\"\n{proxy}",
            agent_section(&name, ""),
            log.display()
        )
    };
    let mut agent = AgentProcess::start(&name, &text(&first));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], listen));
    let answer = exchange_from([127, 0, 0, 2], addr, bad_mac_request().as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(lines_of(&first, 1).await[0].contains("src=127.0.0.2"));

    let reload = agent.reload_with(&text(&second));
    assert!(reload.status.success(), "{}", String::from_utf8_lossy(&reload.stderr));
    assert!(String::from_utf8_lossy(&reload.stdout).contains("agent.security_log"));
    let answer = exchange_from([127, 0, 0, 3], addr, bad_mac_request().as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(lines_of(&second, 1).await[0].contains("src=127.0.0.3"));
    assert_eq!(std::fs::read_to_string(&first).expect("the first log").lines().count(), 1);
    agent.stats_until("both lines counted", |stats| stats["agent"]["security_log"]["written"] == 2);

    // A section whose file cannot be opened refuses the reload: the second stays.
    let missing = std::env::temp_dir().join(unique("no-such-dir")).join("security.log");
    let refused = agent.reload_with(&text(&missing));
    assert!(!refused.status.success(), "{}", String::from_utf8_lossy(&refused.stdout));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("agent.security_log"));
    let _ = (std::fs::remove_file(&first), std::fs::remove_file(&second));
}
