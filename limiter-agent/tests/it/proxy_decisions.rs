//! What the operator sees of the proxy's decisions: counts by rule and plan, and the
//! sampled decision log, through real sockets.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use http::{Method, StatusCode};
use limiter::signature::KeySecrets;
use limiter_core::Clock as _;
use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, TestClient, Upstream, proxy_config},
    unique,
    wait::until_async,
};

/// A 3-a-minute login rule by IP, and a bearer key whose id must never be logged.
const LIMITS: &str = r#"
[proxy.plans.basic]
limit = 1000
window = "1m"
[[proxy.keys]]
id = "bearer-id-is-a-secret"
plan = "basic"
auth = "bearer"
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

/// The lines of `path` once it has exactly `count` of them (one more fails too). The
/// writer task may be halfway through a line: only whole lines count.
async fn lines(path: &std::path::Path, count: usize) -> Vec<serde_json::Value> {
    let whole_lines = || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.split_inclusive('\n').filter(|line| line.ends_with('\n')).map(str::to_owned).collect::<Vec<_>>()
    };
    let lines =
        until_async(&format!("{count} lines in the decision log"), whole_lines, |lines| lines.len() == count).await;
    lines.iter().map(|line| serde_json::from_str(line).expect("a JSON line")).collect()
}

#[tokio::test]
async fn decisions_are_counted_by_rule_and_plan_and_a_sample_is_logged_without_keys() {
    let log = std::env::temp_dir().join(format!("{}.jsonl", unique("decisions")));
    let head = format!("{PROXY_HEAD}decision_log = {{ path = \"{}\", sample = 0.5 }}\n", log.display());
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{head}{LIMITS}"), upstream.addr).await;
    let client = TestClient::default();
    let key = [("x-api-key", "bearer-id-is-a-secret")];
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(client.request(Method::POST, &proxy.url("/login?user=a"), &key, b"").await.status);
    }
    for _ in 0..3 {
        statuses.push(client.request(Method::GET, &proxy.url("/items"), &key, b"").await.status);
    }
    let too_many = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(statuses, [[StatusCode::OK; 3].as_slice(), &[too_many; 2], &[StatusCode::OK; 3]].concat());

    // The two refused logins count for the rule only: the plan let 6 through.
    let expected =
        [("rule", "login", 3, 0, 2), ("plan", "basic", 6, 0, 0)].map(|(k, n, f, t, r)| (k.to_owned(), n, f, t, r));
    let stats = proxy
        .stats_until("the decisions counted by rule and plan", |stats| {
            let counts: Vec<(String, &str, u64, u64, u64)> = stats
                .policies
                .iter()
                .map(|p| (p.kind.to_string(), p.name.as_str(), p.forwarded, p.throttled, p.rejected))
                .collect();
            counts == expected
        })
        .await;
    assert_eq!(stats.store, "memory");

    // One decision in two, evenly: the 2nd, 4th, 6th and 8th.
    let logged = lines(&log, 4).await;
    assert_eq!(logged.len(), 4, "{logged:?}");
    let verdicts: Vec<&str> = logged.iter().map(|line| line["verdict"].as_str().expect("verdict")).collect();
    assert_eq!(verdicts, ["forward", "reject", "forward", "forward"]);
    let refused = &logged[1];
    assert_eq!((refused["method"].as_str(), refused["path"].as_str()), (Some("POST"), Some("/login")));
    assert_eq!(refused["client"], "127.0.0.1");
    assert_eq!(refused["violated"], serde_json::json!(["login"]));
    assert_eq!(refused["policies"], serde_json::json!(["login", "basic"]));
    assert_eq!(refused["plan"], "basic");
    assert!(refused["wait_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 60_000), "{refused}");
    let expected_time = proxy.clock.now().as_secs_f64();
    assert!((refused["time"].as_f64().expect("time") - expected_time).abs() < 1.0, "{refused}");
    let text = serde_json::to_string(&logged).expect("lines");
    assert!(!text.contains("bearer-id-is-a-secret"), "a key reached the log: {text}");
    // The writer counts a line once it is flushed, after a reader may see it.
    proxy
        .stats_until("the 4 lines counted as written", |stats| {
            (stats.decision_log_dropped, stats.decision_log_written) == (0, 4)
        })
        .await;

    // The share reloads live: every decision from here on.
    let every = format!("{head}{LIMITS}").replace("sample = 0.5", "sample = 1");
    proxy.proxy.reconfigure(proxy_config(&every, upstream.addr), KeySecrets::default()).expect("reload");
    for _ in 0..2 {
        client.request(Method::GET, &proxy.url("/items"), &key, b"").await;
    }
    assert_eq!(lines(&log, 6).await.len(), 6);
    let _ = std::fs::remove_file(&log);
}

/// A tmpfs of `bytes`, mounted for one test and unmounted when it ends: a disk that
/// fills up for real, midway through a line.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(bytes: usize) -> Self {
        let dir = std::env::temp_dir().join(unique("tmpfs"));
        std::fs::create_dir(&dir).expect("mount point");
        let size = format!("size={bytes}");
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &size, "limiter-test"]).arg(&dir).status();
        assert!(mounted.expect("mount").success(), "mount a tmpfs on {}", dir.display());
        Self { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: the proxy's writer may still hold the log open as it winds down.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The text of the decision log, asserted to be whole JSON lines, and their count.
fn whole_lines(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).expect("the decision log");
    let tail = &text[text.len().saturating_sub(120)..];
    assert!(text.is_empty() || text.ends_with('\n'), "the log ends in half a line: …{tail:?}");
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|_| panic!("half a JSON line: {line:?}"));
    }
    text.lines().count()
}

/// A full disk costs the log its lines, never a request: they are counted as dropped,
/// the file keeps only whole lines (the one the disk cut off midway is cut back), and
/// once there is room again lines are written again.
#[tokio::test]
async fn a_full_disk_drops_whole_lines_and_never_a_request() {
    const PAGE: usize = 4096;
    let disk = Tmpfs::mount(4 * PAGE);
    // The log gets one page: about 20 lines, the last of them cut by the disk.
    let filler = disk.dir.join("filler");
    std::fs::write(&filler, vec![0u8; 3 * PAGE]).expect("fill the disk");
    let log = disk.dir.join("decisions.jsonl");
    let rule = "[[proxy.rules]]\nname = \"items\"\npath = \"/items\"\nkey = \"ip\"\nlimit = 1000\nwindow = \"1m\"\n";
    let text = format!("{PROXY_HEAD}decision_log = {{ path = \"{}\" }}\n{rule}", log.display());
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&text, upstream.addr).await;
    let client = TestClient::default();

    const REQUESTS: u64 = 60;
    for _ in 0..REQUESTS {
        assert_eq!(client.request(Method::GET, &proxy.url("/items"), &[], b"").await.status, StatusCode::OK);
    }
    let stats = proxy
        .stats_until("every line written or dropped", |stats| {
            stats.decision_log_written + stats.decision_log_dropped == REQUESTS
        })
        .await;
    assert!(stats.decision_log_dropped > 0 && stats.decision_log_written > 0, "{stats:?}");
    assert_eq!(whole_lines(&log) as u64, stats.decision_log_written);

    // Room again: the next lines are written, after the whole ones.
    std::fs::remove_file(&filler).expect("free the disk");
    for _ in 0..5 {
        assert_eq!(client.request(Method::GET, &proxy.url("/items"), &[], b"").await.status, StatusCode::OK);
    }
    let written = stats.decision_log_written + 5;
    proxy.stats_until("the 5 lines written", |now| now.decision_log_written == written).await;
    assert_eq!(whole_lines(&log) as u64, written);
}

/// A body-keyed rule's lines say what it keys by, never the username: the log is for
/// finding out who was refused by what, and a username is personal data.
#[tokio::test]
async fn a_body_keyed_rule_logs_its_key_kind_and_never_the_value() {
    let log = std::env::temp_dir().join(format!("{}.jsonl", unique("decisions")));
    let config = format!(
        "{PROXY_HEAD}decision_log = {{ path = \"{}\" }}\n[[proxy.rules]]\nname = \"logins-per-user\"\n\
         path = \"/login\"\nkey = [\"ip\", \"json:/username\"]\nalgorithm = \"fixed_window\"\nlimit = 1\n\
         window = \"1m\"\n",
        log.display()
    );
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    let client = TestClient::default();
    let json = [("content-type", "application/json")];
    let body = br#"{"username":"alice.private@example.com"}"#;
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(client.request(Method::POST, &proxy.url("/login"), &json, body).await.status);
    }
    statuses.push(client.request(Method::GET, &proxy.url("/items"), &[], b"").await.status);
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS, StatusCode::OK]);

    let logged = lines(&log, 3).await;
    let verdicts: Vec<&str> = logged.iter().map(|line| line["verdict"].as_str().expect("verdict")).collect();
    assert_eq!(verdicts, ["forward", "reject", "forward"]);
    let keyed_by = serde_json::json!({ "logins-per-user": "[ip, json:/username]" });
    assert_eq!((&logged[0]["keys"], &logged[1]["keys"]), (&keyed_by, &keyed_by));
    assert!(logged[2].get("keys").is_none(), "no rule counted /items: {}", logged[2]);
    let text = serde_json::to_string(&logged).expect("lines");
    assert!(!text.contains("alice.private"), "a key's value reached the log: {text}");
    let _ = std::fs::remove_file(&log);
}

/// `limiter suggest`'s figures from a known mix in shadow mode: 90 clients send 2
/// requests in a minute, 9 send 8 and one sends 30, against a rule of 10.
#[tokio::test]
async fn shadow_mode_observes_the_mix_and_suggests_a_limit_that_survives_a_reload() {
    let rule =
        "[[proxy.rules]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n";
    let head = format!("{PROXY_HEAD}enforce = false\ntrusted_proxies = [\"127.0.0.1/32\"]\n");
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&format!("{head}{rule}"), upstream.addr).await;
    proxy.clock.set(Duration::from_secs(1_800_000_000));
    let client = TestClient::default();
    let mut sent = 0;
    for (clients, each, net) in [(90, 2, 1), (9, 8, 2), (1, 30, 3)] {
        for host in 0..clients {
            let address = format!("10.{net}.0.{host}");
            for _ in 0..each {
                let reply = client.request(Method::GET, &proxy.url("/"), &[("x-forwarded-for", &address)], b"").await;
                assert_eq!(reply.status, StatusCode::OK, "shadow mode forwards everything");
                sent += 1;
            }
        }
    }
    assert_eq!(upstream.count(), sent);
    // Shadow mode counted what enforcing would have refused: the 30-request client's
    // 20 over the limit.
    let counts = |stats: &limiter::proxy::ProxyStats| {
        stats.policies.iter().find(|p| p.name == "per-ip").map(|p| (p.forwarded, p.rejected))
    };
    proxy.stats_until("the rule's counts", |stats| counts(stats) == Some((sent as u64 - 20, 20))).await;
    // A decision is observed before it is counted: the figures are whole now.
    let per_ip = |proxy: &RunningProxy| {
        proxy.proxy.suggest(1.5).into_iter().find(|s| s.name == "per-ip").expect("the rule's suggestion")
    };
    let suggestion = per_ip(&proxy);
    let peaks = &suggestion.peaks;
    assert_eq!((peaks.keys, peaks.p50, peaks.p95, peaks.p99, peaks.max), (100, 2, 8, 8, 30));
    assert_eq!((peaks.keys_over, suggestion.limit, suggestion.suggested_limit), (1, 10, Some(12)));

    // A reload that changes the limit keeps what was observed.
    let raised = format!("{head}{rule}").replace("limit = 10", "limit = 20");
    proxy.proxy.reconfigure(proxy_config(&raised, upstream.addr), KeySecrets::default()).expect("reload");
    let after = per_ip(&proxy);
    assert_eq!((after.peaks.keys, after.peaks.max, after.limit, after.peaks.keys_over), (100, 30, 20, 1));
}
