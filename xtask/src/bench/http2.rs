//! The HTTP/2 group, driven from here: an upstream nginx over HTTP/1.1, and in front
//! of it limiter and nginx `limit_req` speaking HTTP/2 to their clients, over TLS and
//! in the clear (h2c), loaded by h2load.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{Context, Result, bail};
use limiter_lab::report::{Http2, Http2Row};

use super::{
    Bench,
    configs::{KEY_ID, LIMITER_RULES, Listener, limiter_conf, nginx_limit_req_conf},
    format::num,
    http::Stage,
    process::{Server, free_port},
    svg::bar_chart,
};
use crate::util::{cmd, find_program};

pub const TITLE: &str = "3b. HTTP/2";

pub fn run(bench: &mut Bench) -> Result<Http2> {
    let Stage { dir, nginx, upstream_port, secret, mut servers } = Stage::new(bench, "http2")?;
    let h2load = find_program("h2load").context("h2load not found (cargo xtask setup)")?;
    let openssl = find_program("openssl").context("openssl not found (cargo xtask setup)")?;
    let limiter = bench.bin_dir.join("limiter");

    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let mut c = cmd(&openssl);
    c.args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert);
    bench.run_recorded(&mut c)?;
    let tls = Listener::Tls { cert: &cert, key: &key };
    let mut scenarios = Vec::new();
    for (name, rules, listener) in [
        ("limiter, no rules, TLS", "", tls),
        ("limiter, per-IP + per-key + plan, TLS", LIMITER_RULES, tls),
        ("limiter, per-IP + per-key + plan, h2c", LIMITER_RULES, Listener::H2c),
    ] {
        let port = free_port()?;
        let (url, protocol) = target(listener, port);
        let conf = limiter_conf(&dir, name, port, upstream_port, listener, rules, &secret);
        servers.push(Server::limiter(bench, &limiter, &dir, name, &conf, answers_h2(&h2load, &url))?);
        scenarios.push((name, url, protocol));
    }
    for (name, listener) in [("nginx limit_req, TLS", tls), ("nginx limit_req, h2c", Listener::H2c)] {
        let port = free_port()?;
        let (url, protocol) = target(listener, port);
        let conf = nginx_limit_req_conf(port, upstream_port, listener);
        servers.push(Server::nginx(bench, &nginx, &dir, name, &conf, answers_h2(&h2load, &url))?);
        scenarios.push((name, url, protocol));
    }

    let s = bench.sizes;
    let mut rows = Vec::new();
    for (name, url, protocol) in &scenarios {
        let mut c = h2load_command(&h2load, s.http2_requests, s.http2_connections, s.http2_streams, url);
        bench.record(&c);
        let out = c.output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let row = parse(name, url, &text).with_context(|| format!("h2load output for {name}: {text}"))?;
        // Over TLS h2load falls back to http/1.1 when ALPN does not give h2, which
        // would measure HTTP/1.1 under this group's name.
        if row.protocol != *protocol {
            bail!("h2load spoke {} to {name}, not {protocol}", row.protocol);
        }
        rows.push(row);
    }
    drop(servers);
    Ok(Http2 {
        load_tool: "h2load -t 1 (h2 by ALPN over TLS, h2c by prior knowledge in the clear)".to_owned(),
        requests: s.http2_requests,
        connections: s.http2_connections,
        streams: s.http2_streams,
        rows,
    })
}

/// The URL h2load loads on a listener and the protocol it must speak there.
fn target(listener: Listener, port: u16) -> (String, &'static str) {
    match listener {
        Listener::Tls { .. } => (format!("https://127.0.0.1:{port}/"), "h2"),
        Listener::H2c | Listener::Http1 => (format!("http://127.0.0.1:{port}/"), "h2c"),
    }
}

/// h2load with the bench key, as the HTTP group's requests name it. A connection
/// silent for 5 s is given up, so that a stalled server fails its row instead of
/// hanging the run.
fn h2load_command(h2load: &Path, requests: u32, connections: u32, streams: u32, url: &str) -> Command {
    let mut c = cmd(h2load);
    let (requests, connections, streams) = (requests.to_string(), connections.to_string(), streams.to_string());
    let key = format!("X-API-Key: {KEY_ID}");
    c.args(["-n", &requests, "-c", &connections, "-m", &streams, "-t", "1", "-N", "5", "-H", &key, url]);
    c
}

/// Whether one request by h2load succeeds: xtask speaks neither TLS nor HTTP/2 itself.
fn answers_h2<'a>(h2load: &'a Path, url: &'a str) -> impl Fn() -> bool + 'a {
    move || {
        h2load_command(h2load, 1, 1, 1, url).output().is_ok_and(|out| {
            let text = String::from_utf8_lossy(&out.stdout);
            line(&text, "requests:").and_then(|r| count(r, "succeeded")).is_ok_and(|n| n == 1)
        })
    }
}

/// The figures the report keeps from h2load's text summary.
fn parse(scenario: &str, url: &str, text: &str) -> Result<Http2Row> {
    let finished = line(text, "finished in")?;
    let rps = finished.split(", ").find_map(|p| p.strip_suffix(" req/s")).context("no req/s")?.parse()?;
    let requests = line(text, "requests:")?;
    let status = line(text, "status codes:")?;
    let times: Vec<&str> = line(text, "time for request:")?.split_whitespace().collect();
    // min, max, mean, sd, +/- sd
    let [_, max, mean, ..] = times[..] else { bail!("time for request: {times:?}") };
    Ok(Http2Row {
        scenario: scenario.to_owned(),
        url: url.to_owned(),
        protocol: line(text, "Application protocol:")?.to_owned(),
        tls: line(text, "TLS Protocol:").ok().map(str::to_owned),
        rps,
        succeeded: count(requests, "succeeded")?,
        failed: count(requests, "failed")?,
        status_2xx: count(status, "2xx")?,
        status_4xx: count(status, "4xx")?,
        mean_ms: ms(mean)?,
        max_ms: ms(max)?,
    })
}

/// The rest of the line that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> Result<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(prefix)).map(str::trim).with_context(|| format!("no `{prefix}` line"))
}

/// The number before `name` in one of h2load's "N name, N name" lists.
fn count(list: &str, name: &str) -> Result<u64> {
    list.split(", ")
        .find_map(|part| part.strip_suffix(name)?.trim().parse().ok())
        .with_context(|| format!("no {name} in `{list}`"))
}

/// One of h2load's durations (`109us`, `2.85ms`, `1.05s`) in milliseconds.
fn ms(duration: &str) -> Result<f64> {
    let (value, scale) = if let Some(v) = duration.strip_suffix("us") {
        (v, 1e-3)
    } else if let Some(v) = duration.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = duration.strip_suffix('s') {
        (v, 1e3)
    } else {
        bail!("not a duration: {duration}")
    };
    Ok(value.parse::<f64>().with_context(|| format!("not a duration: {duration}"))? * scale)
}

pub fn markdown(m: &mut String, h: &Http2) {
    let _ = writeln!(
        m,
        "## {TITLE} (loopback, one upstream nginx over HTTP/1.1, {} requests per run, {} connections × {} streams)\n\n\
         Load: {}.\n",
        h.requests, h.connections, h.streams, h.load_tool
    );
    let _ = writeln!(
        m,
        "| scenario | protocol | req/s | succeeded | failed | 2xx / 4xx | mean / max ms |\n|---|---|---|---|---|---|---|"
    );
    for r in &h.rows {
        let protocol = r.tls.as_ref().map_or_else(|| r.protocol.clone(), |tls| format!("{} over {tls}", r.protocol));
        let _ = writeln!(
            m,
            "| {} | {protocol} | {} | {} | {} | {} / {} | {} / {} |",
            r.scenario,
            num(Some(r.rps), 0),
            r.succeeded,
            r.failed,
            r.status_2xx,
            r.status_4xx,
            num(Some(r.mean_ms), 2),
            num(Some(r.max_ms), 2),
        );
    }
    let _ = writeln!(
        m,
        "\nThe limits of the HTTP group, far above the load; the certificate is a self-signed P-256 one made for the run.\n\n\
         ![http2](http2.svg)\n"
    );
}

pub fn charts(h: &Http2) -> Vec<(&'static str, String)> {
    let throughput: Vec<(String, f64)> = h.rows.iter().map(|r| (r.scenario.clone(), r.rps)).collect();
    vec![("http2", bar_chart("HTTP/2 throughput (higher is better)", "req/s", &throughput))]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `h2load -n 5000 -c 10 -m 10 -t 1 -H 'X-API-Key: bench-key' https://127.0.0.1:18443/`
    /// against nginx 1.22 with `limit_req` at 100 r/s, burst 1000.
    const TLS_WITH_429: &str = r#"starting benchmark...
spawning thread #0: 10 total client(s). 5000 total requests
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2
progress: 10% done
progress: 20% done
progress: 30% done
progress: 40% done
progress: 50% done
progress: 60% done
progress: 70% done
progress: 80% done
progress: 90% done
progress: 100% done

finished in 63.31ms, 78980.21 req/s, 15.55MB/s
requests: 5000 total, 5000 started, 5000 done, 1006 succeeded, 3994 failed, 0 errored, 0 timeout
status codes: 1006 2xx, 0 3xx, 3994 4xx, 0 5xx
traffic: 1008.26KB (1032458) total, 257.78KB (263964) headers (space savings 46.57%), 662.11KB (678004) data
                     min         max         mean         sd        +/- sd
time for request:       37us     30.22ms       952us      2.26ms    98.18%
time for connect:     2.75ms      7.44ms      5.23ms      1.60ms    60.00%
time to 1st byte:     7.59ms     26.72ms     14.73ms      6.22ms    70.00%
req/s           :    7992.59     9668.05     8519.88      499.66    80.00%
"#;

    /// `h2load -n 2000 -c 10 -m 10 -t 1 http://127.0.0.1:18080/` against nginx 1.22's
    /// `listen ... http2;`.
    const H2C: &str = r#"starting benchmark...
spawning thread #0: 10 total client(s). 2000 total requests
Application protocol: h2c
progress: 10% done
progress: 20% done
progress: 30% done
progress: 40% done
progress: 50% done
progress: 60% done
progress: 70% done
progress: 80% done
progress: 90% done
progress: 100% done

finished in 28.57ms, 70005.95 req/s, 4.62MB/s
requests: 2000 total, 2000 started, 2000 done, 2000 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 2000 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 135.24KB (138490) total, 93.75KB (96000) headers (space savings 51.02%), 5.86KB (6000) data
                     min         max         mean         sd        +/- sd
time for request:       66us      2.19ms      1.05ms       420us    70.10%
time for connect:      143us       670us       354us       158us    70.00%
time to 1st byte:      946us      2.94ms      1.68ms       688us    70.00%
req/s           :    7087.93    11657.70     8343.43     1662.29    80.00%
"#;

    /// `h2load -n 1 -c 1 http://127.0.0.1:1/`: nothing listening.
    const REFUSED: &str = r#"starting benchmark...
spawning thread #0: 1 total client(s). 1 total requests

finished in 291us, 0.00 req/s, 0B/s
requests: 1 total, 0 started, 0 done, 0 succeeded, 1 failed, 1 errored, 0 timeout
status codes: 0 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 0B (0) total, 0B (0) headers (space savings 0.00%), 0B (0) data
                     min         max         mean         sd        +/- sd
time for request:        0us         0us         0us         0us     0.00%
time for connect:        0us         0us         0us         0us     0.00%
time to 1st byte:        0us         0us         0us         0us     0.00%
req/s           :       0.00        0.00        0.00        0.00   100.00%
"#;

    #[test]
    fn parses_h2load_over_tls_with_rejections() {
        let row = parse("s", "https://127.0.0.1:18443/", TLS_WITH_429).expect("parses");
        assert_eq!((row.protocol.as_str(), row.tls.as_deref()), ("h2", Some("TLSv1.3")));
        assert_eq!(row.rps, 78980.21);
        assert_eq!((row.succeeded, row.failed, row.status_2xx, row.status_4xx), (1006, 3994, 1006, 3994));
        assert!((row.mean_ms - 0.952).abs() < 1e-9 && (row.max_ms - 30.22).abs() < 1e-9, "{row:?}");
    }

    #[test]
    fn parses_h2load_in_the_clear() {
        let row = parse("s", "http://127.0.0.1:18080/", H2C).expect("parses");
        assert_eq!((row.protocol.as_str(), row.tls.as_deref()), ("h2c", None));
        assert_eq!((row.rps, row.succeeded, row.failed, row.status_2xx), (70005.95, 2000, 0, 2000));
        assert!((row.mean_ms - 1.05).abs() < 1e-9 && (row.max_ms - 2.19).abs() < 1e-9, "{row:?}");
    }

    #[test]
    fn a_run_without_a_connection_is_an_error() {
        assert!(parse("s", "http://127.0.0.1:1/", REFUSED).is_err());
        assert_eq!(line(REFUSED, "requests:").and_then(|r| count(r, "succeeded")).ok(), Some(0));
    }

    #[test]
    fn durations_in_each_unit() {
        for (d, expected) in [("109us", 0.109), ("2.85ms", 2.85), ("1.05s", 1050.0)] {
            assert!((ms(d).expect(d) - expected).abs() < 1e-9, "{d}");
        }
        assert!(ms("12").is_err() && ms("xms").is_err());
    }
}
