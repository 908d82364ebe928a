//! `limiter explain` through the real binary against a running agent: the rules, plan
//! and kernel buckets a request meets, with live quotas, and nothing charged.

use std::{
    io::{Read as _, Write as _},
    net::TcpListener,
};

use limiter_lab::support::{proxy::Upstream, xdp_lab::XdpLab};
use serde_json::Value;

/// One request from 127.0.0.1 on a new connection; its status.
fn send(proxy: &str, method: &str, path: &str, api_key: &str) -> u16 {
    let mut stream = std::net::TcpStream::connect(proxy).expect("connect to the proxy");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nX-API-Key: {api_key}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    reply.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status")
}

fn explain(lab: &XdpLab, path: &str) -> Value {
    lab.agent.cli_json(&[
        "explain",
        "--method",
        "POST",
        "--path",
        path,
        "-H",
        "X-API-Key: k-free",
        "--ip",
        "127.0.0.1",
        "--json",
    ])
}

fn remaining(explained: &Value) -> Vec<(String, Option<u64>)> {
    explained["proxy"]["policies"]
        .as_array()
        .expect("policies")
        .iter()
        .map(|p| (p["name"].as_str().expect("name").to_owned(), p["remaining"].as_u64()))
        .collect()
}

#[test]
fn explain_shows_live_quotas_and_kernel_verdicts_and_charges_nothing() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = runtime.block_on(Upstream::start());
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let proxy = format!("127.0.0.1:{port}");
    let mut lab = XdpLab::start(
        1,
        "",
        &format!(
            r#"[xdp.limit]
packets_per_second = 1000
burst = 2000
[[xdp.cidr]]
cidr = "198.51.100.0/24"
action = "deny"
[proxy]
listen = "{proxy}"
upstream = "http://{upstream}"
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1m"
[proxy.plans.free]
limit = 100
window = "1m"
[[proxy.keys]]
id = "k-free"
plan = "free"
auth = "bearer"
"#,
            upstream = upstream.addr
        ),
    );
    for _ in 0..3 {
        assert_eq!(send(&proxy, "POST", "/login", "k-free"), 200);
    }
    for _ in 0..3 {
        let explained = explain(&lab, "/login");
        let proxy_part = &explained["proxy"];
        assert_eq!(proxy_part["source"], "agent", "{explained}");
        assert_eq!((proxy_part["verdict"].as_str(), proxy_part["key"].as_str()), (Some("forward"), Some("k-free")));
        assert_eq!(proxy_part["client"], "127.0.0.1");
        assert_eq!(remaining(&explained), [("login".to_owned(), Some(2)), ("free".to_owned(), Some(97))]);
        assert_eq!(proxy_part["policies"][0]["key"], "ip=127.0.0.1");
        assert_eq!(proxy_part["policies"][1]["key"], "api_key=k-free");
    }
    // An encoded path is explained as the rules see it.
    assert_eq!(explain(&lab, "/%6Cogin")["proxy"]["route"], "/login");
    let statuses: Vec<u16> = (0..3).map(|_| send(&proxy, "POST", "/login", "k-free")).collect();
    assert_eq!(statuses, [200, 200, 429], "exactly the 2 that explain showed were left");
    let refused = explain(&lab, "/login");
    assert_eq!(refused["proxy"]["verdict"], "reject");
    assert_eq!(refused["proxy"]["policies"][0]["admits"], false);
    assert!(refused["proxy"]["wait_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 60_000), "{refused}");
    let text = String::from_utf8(
        lab.agent.cli(&["explain", "--method", "POST", "--path", "/login", "-H", "X-API-Key: k-free"]).stdout,
    )
    .expect("utf-8");
    assert!(text.contains("  now: reject (retry after "), "{text}");
    assert!(text.contains("login") && text.contains("remaining 0  refuses"), "{text}");

    // The kernel layer: a deny rule, a runtime block, the source's own bucket.
    let kernel = |ip: &str| lab.agent.cli_json(&["explain", "--ip", ip, "--json"])["kernel"].clone();
    assert_eq!(kernel("198.51.100.9")["verdict"], "drop: deny rule");
    assert_eq!(kernel("198.51.100.9")["rule"]["cidr"], "198.51.100.0/24");
    let source = lab.sources[0].to_string();
    let fresh = kernel(&source);
    assert_eq!((fresh["verdict"].as_str(), fresh["limit"]["packets_per_second"].as_u64()), (Some("pass"), Some(1000)));
    let demote = ["demote", &source, "--packets-per-second", "5", "--burst", "10", "--ttl", "1m"];
    assert!(lab.agent.cli(&demote).status.success());
    let demoted = kernel(&source);
    assert_eq!(demoted["demoted"][0], format!("{source}/32"), "{demoted}");
    assert_eq!(
        (demoted["limit"]["packets_per_second"].as_u64(), demoted["limit"]["burst"].as_u64()),
        (Some(5), Some(10))
    );
    assert!(lab.agent.cli(&["block", &format!("{source}/32"), "--ttl", "1m"]).status.success());
    let blocked = kernel(&source);
    assert_eq!(blocked["verdict"], "drop: blocked", "{blocked}");
    assert_eq!(blocked["block"][0], format!("{source}/32"));
    assert_eq!(kernel("fe80::1")["note"], "link-local");

    // Without an agent: what the config says, without quotas.
    lab.agent.stop_with(libc::SIGTERM);
    let offline = explain(&lab, "/login");
    assert_eq!(offline["proxy"]["source"], "config", "{offline}");
    assert_eq!(offline["proxy"]["verdict"], Value::Null);
    assert_eq!(remaining(&offline), [("login".to_owned(), None), ("free".to_owned(), None)]);
    assert_eq!(upstream.count(), 5);
}
