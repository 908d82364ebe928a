//! A Redis server for the tests: the one `cargo xtask test` runs
//! (`LIMITER_TEST_REDIS_URL`), or a private `redis-server` on a free port, so that
//! plain `cargo test` works too. Each test names its keys with its own prefix.

use super::{free_port, tls::TestTls, wait::until_within};
use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A running server.
#[derive(Debug)]
pub struct TestRedis {
    pub port: u16,
    url: String,
    /// `None` for the server `cargo xtask test` runs.
    child: Option<Child>,
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

impl TestRedis {
    /// The shared test server if there is one, else a private one.
    pub fn shared() -> Self {
        match std::env::var("LIMITER_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => Self { port: 0, url, child: None },
            _ => Self::private(),
        }
    }

    /// A server of this test's own, which it may stop and start again.
    pub fn private() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut redis = Self { port, url: format!("redis://127.0.0.1:{port}/"), child: None };
        redis.start();
        redis
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Starts the private server (again, on the same port) and waits until it answers.
    pub fn start(&mut self) {
        let binary = std::env::var("LIMITER_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e} (install redis-server)"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the private server's process (SIGSTOP): it holds its connections and
    /// answers nothing, as a server stuck in a slow script or swapping does.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a [`Self::pause`]d server run again.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a private server").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Kills the private server (a crash, not a shutdown).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A 100-a-minute plan for the bearer key `k-free`, for fleets of proxies. Redis
/// measures with its own clock, which no test can hold still: a sliding log has no
/// window edge for a test to straddle, so the counts are exact whenever it runs.
pub const FREE_PLAN: &str = r#"
[proxy.plans.free]
algorithm = "sliding_window_log"
limit = 100
window = "1m"
[[proxy.keys]]
id = "k-free"
plan = "free"
auth = "bearer"
"#;

/// A key prefix no other test (or earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("test:{test}:{}:{nanos}:{}:", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// How long a test proxy waits for Redis. The default (100 ms) is a deployment's, next
/// to its server: on a loaded test machine a slow answer would become
/// `store_failure`'s verdict, and a count the test states would be off by it. The
/// outages the tests make (a killed server, an unknown CA) are refused at once, not
/// waited out.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// The `[proxy]` keys that put a proxy on the server at `url` under `prefix`.
pub fn redis_keys_at(url: &str, prefix: &str, store_failure: &str) -> String {
    format!(
        "store = \"redis\"\nredis_url = \"{url}\"\nredis_prefix = \"{prefix}\"\nstore_failure = \"{store_failure}\"\n\
         redis_timeout = \"{}ms\"\n",
        REDIS_TIMEOUT.as_millis()
    )
}

/// The `[proxy]` keys that put a proxy on this server under `prefix`.
pub fn redis_keys(redis: &TestRedis, prefix: &str, store_failure: &str) -> String {
    redis_keys_at(redis.url(), prefix, store_failure)
}

fn redis_server() -> String {
    std::env::var("LIMITER_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// `redis-cli -p port args…`'s output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (installed with redis-server)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits at most `within` until `done` says so.
fn wait_for(what: &str, within: Duration, done: impl FnMut() -> bool) {
    until_within(within, what, done, |happened| *happened);
}

/// Redis servers of one test, killed when dropped.
#[derive(Debug, Default)]
struct Servers {
    children: Vec<(u16, Child)>,
    dir: Option<std::path::PathBuf>,
}

impl Servers {
    fn dir(&mut self) -> std::path::PathBuf {
        self.dir
            .get_or_insert_with(|| {
                let dir = std::env::temp_dir().join(format!("limiter-redis-{}", unique_prefix("").replace(':', "-")));
                std::fs::create_dir_all(&dir).expect("a directory for the servers");
                dir
            })
            .clone()
    }

    fn start(&mut self, program: &str, port: u16, args: &[String]) {
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e} (cargo xtask setup installs it)"));
        self.children.push((port, child));
        wait_for(&format!("{program} listening on {port}"), Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Kills the server on `port` (a crash).
    fn kill(&mut self, port: u16) {
        if let Some(i) = self.children.iter().position(|(p, _)| *p == port) {
            let (_, mut child) = self.children.remove(i);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A free port whose cluster bus port (10 000 above it) is free too: ephemeral ports
/// are too high for that.
fn cluster_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = 20_000 + (u64::from(std::process::id()) * 97 + NEXT.fetch_add(1, Ordering::Relaxed) * 13) % 9_000;
    (0..9_000)
        .map(|i| u16::try_from(20_000 + (start - 20_000 + i * 7) % 9_000).unwrap_or(20_000))
        .find(|port| [*port, port + 10_000].iter().all(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok()))
        .expect("a free port pair below 40 000")
}

/// A Redis Cluster of three masters and three replicas on the loopback, made with
/// `redis-cli --cluster create`; a node that stops answering for 1 s is failed over.
#[derive(Debug)]
pub struct TestCluster {
    pub ports: Vec<u16>,
    servers: Servers,
    /// The certificates of a cluster that speaks TLS only (clients and bus).
    tls: Option<TestTls>,
}

impl TestCluster {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster that speaks only TLS, on clients' links and on its bus, with
    /// certificates made for the test.
    pub fn start_tls() -> Self {
        Self::start_with(Some(TestTls::new()))
    }

    fn start_with(tls: Option<TestTls>) -> Self {
        let mut servers = Servers::default();
        let dir = servers.dir();
        let ports: Vec<u16> = (0..6).map(|_| cluster_port()).collect();
        for port in &ports {
            let listen = match &tls {
                Some(tls) => {
                    let mut args = [
                        "--port",
                        "0",
                        "--tls-port",
                        &port.to_string(),
                        "--tls-cluster",
                        "yes",
                        "--tls-replication",
                        "yes",
                    ]
                    .map(str::to_owned)
                    .to_vec();
                    args.extend(tls.redis_server_args());
                    args
                }
                None => vec!["--port".to_owned(), port.to_string()],
            };
            let args = [
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-node-timeout",
                "1000",
                // A replica that never synced cannot be promoted; the default waits
                // 5 s for more replicas before the first transfer.
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                &dir.display().to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(str::to_owned);
            servers.start(&redis_server(), *port, &[listen, args.to_vec()].concat());
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .args(tls.iter().flat_map(TestTls::redis_cli_args))
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Self { ports, servers, tls };
        cluster.wait_until_ok();
        cluster
    }

    /// `redis+cluster://` (`rediss+cluster://` with TLS) with every node as a seed.
    #[must_use]
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}/", nodes.join(","))
    }

    /// The CA the nodes' certificates chain to, for a TLS cluster.
    #[must_use]
    pub fn ca(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(|tls| tls.ca.as_path())
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        let tls: Vec<String> = self.tls.iter().flat_map(TestTls::redis_cli_args).collect();
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        redis_cli(port, &[tls.as_slice(), args].concat())
    }

    /// Waits until every live node says the cluster is ok, and every replica has
    /// synced with its master (only a synced replica can be promoted).
    pub fn wait_until_ok(&self) {
        wait_for("cluster_state:ok and synced replicas", Duration::from_secs(30), || {
            self.live_ports().iter().all(|port| {
                let replication = self.cli(*port, &["info", "replication"]);
                self.cli(*port, &["cluster", "info"]).contains("cluster_state:ok")
                    && (replication.contains("role:master") || replication.contains("master_link_status:up"))
            })
        });
    }

    fn live_ports(&self) -> Vec<u16> {
        self.servers.children.iter().map(|(port, _)| *port).collect()
    }

    /// The port of the master serving `key`'s slot now.
    #[must_use]
    pub fn master_of(&self, key: &str) -> u16 {
        self.serving(key).expect("a master serves the slot")
    }

    /// The port of the live master that serves `key`'s slot, if one does.
    fn serving(&self, key: &str) -> Option<u16> {
        let any = self.live_ports()[0];
        let slot: u16 = self.cli(any, &["cluster", "keyslot", key]).trim().parse().expect("a slot");
        let nodes = self.cli(any, &["cluster", "nodes"]);
        nodes
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .find(|line| {
                line.split_whitespace().skip(8).any(|range| {
                    let (low, high) = range.split_once('-').unwrap_or((range, range));
                    matches!((low.parse::<u16>(), high.parse::<u16>()), (Ok(l), Ok(h)) if (l..=h).contains(&slot))
                })
            })
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|address| address.split(['@', ':']).nth(1))
            .and_then(|port| port.parse().ok())
    }

    /// Moves `key`'s slot to another master as `redis-cli --cluster reshard` does, one
    /// step at a time: IMPORTING and MIGRATING, MIGRATE of its keys in batches (clients
    /// get ASK for the keys gone), then the slot's new owner told to every master.
    /// The new master's port.
    pub fn migrate_slot_of(&self, key: &str) -> u16 {
        let any = self.live_ports()[0];
        let slot = self.cli(any, &["cluster", "keyslot", key]).trim().to_owned();
        let source = self.master_of(key);
        let masters: Vec<u16> = self
            .cli(any, &["cluster", "nodes"])
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .filter_map(|line| line.split_whitespace().nth(1)?.split(['@', ':']).nth(1)?.parse().ok())
            .collect();
        let target = *masters.iter().find(|port| **port != source).expect("another master");
        let id = |port: u16| self.cli(port, &["cluster", "myid"]).trim().to_owned();
        let (source_id, target_id) = (id(source), id(target));
        self.cli(target, &["cluster", "setslot", &slot, "importing", &source_id]);
        self.cli(source, &["cluster", "setslot", &slot, "migrating", &target_id]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let keys = self.cli(source, &["cluster", "getkeysinslot", &slot, "10"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = target.to_string();
            let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "keys"];
            args.extend(keys);
            let reply = self.cli(source, &args);
            if reply.trim() != "OK" && reply.trim() != "NOKEY" {
                // Seen on a loaded machine: the target had forgotten that it imports
                // the slot and answered MOVED, for ever. Said again, or the test fails
                // instead of hanging the suite.
                assert!(Instant::now() < deadline, "MIGRATE of slot {slot} keeps failing: {reply}");
                self.cli(target, &["cluster", "setslot", &slot, "importing", &source_id]);
                self.cli(source, &["cluster", "setslot", &slot, "migrating", &target_id]);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for master in masters {
            self.cli(master, &["cluster", "setslot", &slot, "node", &target_id]);
        }
        target
    }

    /// Kills the master serving `key` and waits until its replica serves the slot
    /// and the cluster is whole again.
    pub fn kill_master_of(&mut self, key: &str) {
        let master = self.master_of(key);
        self.servers.kill(master);
        wait_for("the failover", Duration::from_secs(30), || self.serving(key).is_some_and(|port| port != master));
        self.wait_until_ok();
    }
}

/// A master, its replica and one Sentinel watching them as `limiter-test` (quorum
/// 1, the master deemed down after 500 ms).
#[derive(Debug)]
pub struct TestSentinel {
    pub master: u16,
    pub replica: u16,
    pub sentinel: u16,
    servers: Servers,
}

/// The master's name the Sentinel knows.
pub const SENTINEL_MASTER: &str = "limiter-test";

impl TestSentinel {
    pub fn start() -> Self {
        let mut servers = Servers::default();
        let dir = servers.dir();
        let (master, replica, sentinel) = (free_port(), free_port(), free_port());
        let node = |port: u16| {
            ["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(str::to_owned)
        };
        servers.start(&redis_server(), master, &node(master));
        let mut replica_args = node(replica).to_vec();
        replica_args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), master.to_string()]);
        servers.start(&redis_server(), replica, &replica_args);
        let config = dir.join("sentinel.conf");
        // A master silent for 3 s is down: with 500 ms, a master descheduled that long
        // on a loaded machine was failed over in the middle of a test's first requests.
        std::fs::write(
            &config,
            format!(
                "port {sentinel}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 3000\nsentinel failover-timeout {SENTINEL_MASTER} 2000\n",
                dir.display()
            ),
        )
        .expect("sentinel.conf");
        servers.start("redis-sentinel", sentinel, &[config.display().to_string()]);
        let sentinels = Self { master, replica, sentinel, servers };
        wait_for("the Sentinel sees the replica", Duration::from_secs(30), || {
            redis_cli(sentinel, &["sentinel", "replicas", SENTINEL_MASTER]).contains(&replica.to_string())
        });
        sentinels
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{SENTINEL_MASTER}", self.sentinel)
    }

    /// Waits until the replica has every write the master has (replication is
    /// asynchronous: a crash loses what it had not sent).
    pub fn wait_replicated(&self) {
        let offset = |port: u16, field: &str| -> Option<u64> {
            let info = redis_cli(port, &["info", "replication"]);
            info.lines().find_map(|line| line.strip_prefix(field)).and_then(|n| n.trim().parse().ok())
        };
        wait_for("the replica to catch up", Duration::from_secs(10), || {
            let master = offset(self.master, "master_repl_offset:");
            master.is_some() && offset(self.replica, "slave_repl_offset:") >= master
        });
    }

    /// Kills the master and waits until the Sentinel names the replica instead.
    pub fn kill_master_and_fail_over(&mut self) {
        self.servers.kill(self.master);
        let replica = self.replica.to_string();
        wait_for("the Sentinel's failover", Duration::from_secs(30), || {
            redis_cli(self.sentinel, &["sentinel", "get-master-addr-by-name", SENTINEL_MASTER]).contains(&replica)
        });
    }
}

/// One `redis-server` that speaks only TLS, with its certificates.
#[derive(Debug)]
pub struct TestTlsRedis {
    pub port: u16,
    pub tls: TestTls,
    _server: Servers,
}

impl TestTlsRedis {
    #[must_use]
    pub fn start() -> Self {
        let (tls, port, mut server) = (TestTls::new(), free_port(), Servers::default());
        let mut args =
            ["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                .map(str::to_owned)
                .to_vec();
        args.extend(tls.redis_server_args());
        server.start(&redis_server(), port, &args);
        Self { port, tls, _server: server }
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }
}
