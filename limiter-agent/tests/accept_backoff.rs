//! Accept loops out of file descriptors: each must pause rather than spin on a core,
//! and serve again once descriptors are free. Alone in its test binary because it
//! exhausts the process's descriptors.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use limiter::metrics::{AgentGauges, MetricsSources, serve};
use limiter_lab::support::{
    proxy::{PROXY_HEAD, RunningProxy, Upstream},
    wait::PATIENCE,
};

/// How long a loop runs out of descriptors while its CPU time is measured.
const STARVED: Duration = Duration::from_secs(1);

/// CPU time of the whole process: the proxy's accept loops run on worker threads of
/// their own, and nothing else in this binary runs meanwhile.
fn process_cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0, "getrusage");
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Holds every free descriptor (under a lowered soft limit) until dropped.
struct Exhausted {
    files: Vec<File>,
    limit: libc::rlimit,
}

impl Exhausted {
    fn new() -> Self {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: plain syscalls on a struct we own.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit), 0, "getrlimit");
            let lowered = libc::rlimit { rlim_cur: limit.rlim_cur.min(512), rlim_max: limit.rlim_max };
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lowered), 0, "setrlimit");
        }
        let mut files = Vec::new();
        loop {
            match File::open("/dev/null") {
                Ok(file) => files.push(file),
                Err(error) if error.raw_os_error() == Some(libc::EMFILE) => break,
                Err(error) => panic!("opening /dev/null: {error}"),
            }
        }
        Self { files, limit }
    }
}

impl Drop for Exhausted {
    fn drop(&mut self) {
        self.files.clear();
        // SAFETY: restores the limit read in `new`.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const self.limit) };
    }
}

/// Connects to `addr` (the kernel completes the handshake from the backlog, before
/// any accept), then starves the process of descriptors for [`STARVED`] and returns
/// the CPU time the process spent meanwhile, and the connection.
async fn starve_with_a_client_waiting(addr: std::net::SocketAddr) -> (Duration, TcpStream) {
    let client = TcpStream::connect(addr).expect("connect");
    client.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    let exhausted = Exhausted::new();
    let before = process_cpu_time();
    tokio::time::sleep(STARVED).await;
    let spent = process_cpu_time() - before;
    drop(exhausted);
    (spent, client)
}

/// Sends `request` on the waiting connection and reads the answer, off the runtime.
async fn exchange(mut client: TcpStream, request: &'static [u8]) -> String {
    tokio::task::spawn_blocking(move || {
        client.write_all(request).expect("write");
        let mut response = String::new();
        let _ = client.read_to_string(&mut response);
        response
    })
    .await
    .expect("client")
}

/// A loop that retries at once would take about all of [`STARVED`] on its thread;
/// even on a loaded machine it gets more than a tenth of it.
fn assert_paused(loop_name: &str, spent: Duration) {
    assert!(
        spent < STARVED / 10,
        "the {loop_name} accept loop used {spent:?} of CPU in {STARVED:?} without descriptors"
    );
}

#[test]
fn accept_loops_pause_without_descriptors_and_recover() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind metrics");
        let addr = listener.local_addr().expect("metrics address");
        let sources = MetricsSources {
            pin_dir: "/nonexistent".into(),
            agent: AgentGauges::default().into(),
            proxy: None,
            security_log: std::sync::Arc::default(),
        };
        let metrics = tokio::spawn(serve(listener, sources));
        let (spent, client) = starve_with_a_client_waiting(addr).await;
        assert_paused("metrics", spent);
        let response = exchange(client, b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        metrics.abort();

        let upstream = Upstream::start().await;
        let proxy = RunningProxy::start(PROXY_HEAD, upstream.addr).await;
        let (spent, client) = starve_with_a_client_waiting(proxy.addr).await;
        assert_paused("proxy", spent);
        let response = exchange(client, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    });
}
