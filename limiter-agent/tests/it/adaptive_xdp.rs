//! `[proxy.adaptive.kernel] tighten_new_sources` end to end: an agent with the kernel
//! layer on a veth and the proxy in front of an upstream that holds the one request
//! its limit lets in; refused requests every 200 ms keep it shedding, and
//! `limiter stats` shows `[xdp.new_sources]` halved once that has lasted 10 s, across
//! a reload, and restored 10 s after the last refusal.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use limiter_lab::{
    netns::HostLab,
    support::{
        agent::{AgentProcess, agent_section},
        proxy::Upstream,
        unique,
        wait::{PATIENCE, until_within},
    },
};

/// Apart from escalation_xdp's subnets (8 to 12), which run at the same time.
const ADAPTIVE_SUBNET: u8 = 20;

/// How long shedding lasts before the budget is tightened, and how long without a
/// refusal before it is restored (the proxy's, fixed).
const TIGHTEN_AFTER: Duration = Duration::from_secs(10);
const RESTORE_AFTER: Duration = Duration::from_secs(10);

/// One GET from the host: its status, `None` without an answer.
fn get(proxy: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&proxy, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.split(' ').nth(1)?.parse().ok()
}

/// `[xdp.new_sources]` as `limiter stats --json` reads it from the kernel's settings.
fn budget(stats: &serde_json::Value) -> (u64, u64) {
    let budget = &stats["xdp"]["new_sources"];
    (budget["packets_per_second"].as_u64().unwrap_or(0), budget["burst"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread")]
async fn shedding_ten_seconds_halves_the_new_source_budget_until_ten_seconds_without() {
    let upstream = Upstream::start().await;
    let upstream_addr = upstream.addr;
    tokio::task::spawn_blocking(move || {
        let name = unique("adapt");
        // Kept to the end: dropping it removes the namespace.
        let lab = HostLab::new(&name, ADAPTIVE_SUBNET);
        let (xdp, proxy) = (lab.xdp_section(), lab.listen);
        let config = format!(
            r#"{agent}
{xdp}[xdp.new_sources]
packets_per_second = 1000
burst = 2000
[proxy]
listen = "{proxy}"
upstream = "http://{upstream_addr}"
upstream_timeout = "60s"
[proxy.adaptive]
min_limit = 1
max_limit = 1
initial_limit = 1
[proxy.adaptive.kernel]
tighten_new_sources = 0.5
"#,
            agent = agent_section(&name, "keep_attached_on_exit = false"),
        );
        let mut agent = AgentProcess::start(&name, &config);
        assert_eq!(budget(&agent.cli_json(&["stats", "--json"])), (1000, 2000));

        // The one place, held: every other request is refused (503), the upstream
        // shedding.
        let held = std::thread::spawn(move || get(proxy, "/hold"));
        agent.until("the held request at the upstream", || upstream.count(), |count| *count >= 1);
        let shedding = Arc::new(AtomicBool::new(true));
        let refusing = {
            let shedding = Arc::clone(&shedding);
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while shedding.load(Ordering::Relaxed) {
                    statuses.push(get(proxy, "/"));
                    std::thread::sleep(Duration::from_millis(200));
                }
                statuses
            })
        };
        let started = Instant::now();
        let stats = agent.stats_until("shedding", |stats| stats["proxy"]["adaptive"]["shedding"] == true);
        assert_eq!(stats["proxy"]["adaptive"]["limit"], 1);
        let look = || agent.cli_json(&["stats", "--json"]);
        let tightened =
            until_within(TIGHTEN_AFTER + PATIENCE, "the budget halved", look, |stats| budget(stats) == (500, 1000));
        assert_eq!(tightened["proxy"]["adaptive"]["tightened"], true);
        assert!(started.elapsed() >= TIGHTEN_AFTER - Duration::from_secs(1), "after {:?}", started.elapsed());
        let reloaded = agent.reload_with(&config);
        assert!(reloaded.status.success(), "{}", String::from_utf8_lossy(&reloaded.stderr));
        assert_eq!(budget(&agent.cli_json(&["stats", "--json"])), (500, 1000), "a reload keeps it tightened");

        shedding.store(false, Ordering::Relaxed);
        let statuses = refusing.join().expect("refusing client");
        assert!(statuses.iter().all(|status| *status == Some(503)), "{statuses:?}");
        let stopped = Instant::now();
        let look = || agent.cli_json(&["stats", "--json"]);
        let restored =
            until_within(RESTORE_AFTER + PATIENCE, "the budget restored", look, |stats| budget(stats) == (1000, 2000));
        assert_eq!(restored["proxy"]["adaptive"]["tightened"], false);
        assert!(stopped.elapsed() >= RESTORE_AFTER - Duration::from_secs(1), "after {:?}", stopped.elapsed());
        upstream.release(1);
        assert_eq!(held.join().expect("held client"), Some(200));
        drop(agent);
    })
    .await
    .expect("blocking test");
}
