//! A Redis server for the tests: the one `cargo xtask test` runs
//! (`LIMITER_TEST_REDIS_URL`), or a private `redis-server` on a free port, so that
//! plain `cargo test` works too. Each test names its keys with its own prefix.

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

    /// Kills the private server (a crash, not a shutdown).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A key prefix no other test (or earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("test:{test}:{}:{nanos}:{}:", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The `[proxy]` keys that put a proxy on this server under `prefix`.
pub fn redis_keys(redis: &TestRedis, prefix: &str, store_failure: &str) -> String {
    format!(
        "store = \"redis\"\nredis_url = \"{}\"\nredis_prefix = \"{prefix}\"\nstore_failure = \"{store_failure}\"\n",
        redis.url()
    )
}
