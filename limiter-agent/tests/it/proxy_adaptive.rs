//! `[proxy.adaptive]` against an upstream whose latency grows with its load beyond
//! ten in flight: 200 clients bring the limit down near the knee, the requests let
//! in stay fast, pro (guaranteed its share, served first) keeps being served while
//! free is shed, and the limit climbs back once the load is gone.

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use http::StatusCode;
use limiter::proxy::ProxyStats;
use limiter_lab::support::{
    proxy::{LOADED_BASE, PROXY_HEAD, RunningProxy, TestClient, Upstream},
    wait::{PATIENCE, until_within_async},
};

/// Plans `pro` (priority 0) and `free`, a bearer key on each; the adaptive limit with
/// the bounds and shares. A short queue (pro takes the place of free in it)
/// and a tolerance of 1.2 keep what is let in within 3 × the unloaded latency.
fn config() -> String {
    format!(
        "{PROXY_HEAD}[proxy.upstream_capacity]\nqueue = 8\nqueue_timeout = \"60ms\"\n\
         [proxy.adaptive]\nalgorithm = \"gradient2\"\nmin_limit = 8\nmax_limit = 1024\ninitial_limit = 64\n\
         tolerance = 1.2\nlosses = [\"5xx\", \"timeout\"]\n\
         [proxy.adaptive.shares]\npro = 0.6\nfree = 0.3\nkeyless = 0.1\n\
         [proxy.plans.pro]\nlimit = 1000000\nwindow = \"1m\"\npriority = 0\n\
         [proxy.plans.free]\nlimit = 1000000\nwindow = \"1m\"\n\
         [[proxy.keys]]\nid = \"k-pro\"\nplan = \"pro\"\nauth = \"bearer\"\n\
         [[proxy.keys]]\nid = \"k-free\"\nplan = \"free\"\nauth = \"bearer\"\n"
    )
}

/// One request a client sent: when, for which key, what came back how fast.
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Instant,
    pro: bool,
    status: StatusCode,
    elapsed: Duration,
}

/// Clients in a loop, each sending a request to `/loaded` and pausing [`THINK`]
/// after its answer, until told to stop.
struct Load {
    sent: Arc<Mutex<Vec<Sent>>>,
    heavy: Arc<AtomicBool>,
    light: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A client's pause between an answer and its next request.
const THINK: Duration = Duration::from_secs(1);

/// Clients, one in five with the pro key; the first [`LIGHT`] go on after the
/// heavy load stops.
const CLIENTS: usize = 200;
const LIGHT: usize = 10;

/// Clients per HTTP/2 connection.
const PER_CONNECTION: usize = 25;

impl Load {
    fn start(proxy: &RunningProxy) -> Self {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (heavy, light) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
        let url = proxy.url("/loaded");
        let mut connections = Vec::new();
        let tasks = (0..CLIENTS)
            .map(|i| {
                if i % PER_CONNECTION == 0 {
                    connections.push(TestClient::h2c());
                }
                let client = connections.last().cloned().expect("a connection");
                let (sent, url) = (Arc::clone(&sent), url.clone());
                let running = Arc::clone(if i < LIGHT { &light } else { &heavy });
                let pro = i % 5 == 0;
                // Spread over one pause, so that the clients do not send in step.
                let offset = THINK * u32::try_from(i).unwrap_or(0) / u32::try_from(CLIENTS).unwrap_or(1);
                tokio::spawn(async move {
                    let key = if pro { "k-pro" } else { "k-free" };
                    tokio::time::sleep(offset).await;
                    while running.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        let reply = client.get(&url, &[("x-api-key", key)]).await;
                        let status = reply.status;
                        sent.lock().unwrap_or_else(PoisonError::into_inner).push(Sent {
                            at,
                            pro,
                            status,
                            elapsed: reply.elapsed,
                        });
                        tokio::time::sleep(THINK).await;
                    }
                })
            })
            .collect();
        Self { sent, heavy, light, tasks }
    }

    fn sent_between(&self, from: Instant, to: Instant) -> Vec<Sent> {
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.iter().filter(|sent| sent.at >= from && sent.at < to).copied().collect()
    }

    async fn stop(self) {
        self.heavy.store(false, Ordering::Relaxed);
        self.light.store(false, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("a client");
        }
    }
}

fn limit(stats: &ProxyStats) -> u32 {
    stats.adaptive.as_ref().expect("adaptive stats").limit
}

/// The `q`-quantile of `values`, sorted in place.
fn quantile(values: &mut [Duration], q: f64) -> Duration {
    values.sort();
    let index = ((values.len() as f64 - 1.0) * q).round() as usize;
    values[index]
}

#[tokio::test]
async fn the_limit_settles_near_the_knee_keeps_latency_low_serves_pro_and_climbs_back() {
    let upstream = Upstream::start().await;
    let proxy = RunningProxy::start(&config(), upstream.addr).await;
    let client = TestClient::h2c();
    let mut unloaded = Vec::new();
    for _ in 0..10 {
        let reply = client.get(&proxy.url("/loaded"), &[("x-api-key", "k-pro")]).await;
        assert_eq!(reply.status, StatusCode::OK);
        unloaded.push(reply.elapsed);
    }
    let unloaded = quantile(&mut unloaded, 0.5);
    assert!(unloaded >= LOADED_BASE, "{unloaded:?}");

    let load = Load::start(&proxy);
    let started = Instant::now();
    // Settled: down from 64 into [8, 40], and what it lets in no longer as slow as
    // what the higher limits before let in (at most twice the unloaded latency).
    let settled = proxy
        .stats_until("the limit settled", |stats| {
            let adaptive = stats.adaptive.as_ref().expect("adaptive stats");
            let latency = adaptive.latency_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0));
            (8..=40).contains(&adaptive.limit) && latency.is_some_and(|latency| latency <= unloaded * 2)
        })
        .await;
    assert!(started.elapsed() <= Duration::from_secs(10), "settled after {:?}", started.elapsed());
    // Watched over five seconds: it stays down, and the upstream gate sheds.
    let from = Instant::now();
    let (mut lowest, mut highest, mut shedding) = (limit(&settled), limit(&settled), false);
    while from.elapsed() < Duration::from_secs(5) {
        let stats = proxy.proxy.stats();
        lowest = lowest.min(limit(&stats));
        highest = highest.max(limit(&stats));
        shedding |= stats.adaptive.as_ref().is_some_and(|adaptive| adaptive.shedding);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let to = Instant::now();
    assert!((8..=40).contains(&lowest) && (8..=40).contains(&highest), "the limit moved within {lowest}..={highest}");
    assert!(shedding, "the upstream gate shed while loaded");

    // A light load goes on: the limit grows back towards where it started.
    load.heavy.store(false, Ordering::Relaxed);
    let stopped = Instant::now();
    // Past what the load held it to; by √limit an interval at most, so slower than
    // the fall, and every interval needs an answer of the light load.
    let recovered =
        until_within_async(2 * PATIENCE, "the limit climbs back", || proxy.proxy.stats(), |stats| limit(stats) > 40)
            .await;
    let recovered_after = stopped.elapsed();
    assert!(!recovered.adaptive.as_ref().expect("adaptive").probing);
    let window = load.sent_between(from, to);
    load.stop().await;

    let (pro, free): (Vec<Sent>, Vec<Sent>) = window.iter().partition(|sent| sent.pro);
    let served = |sent: &[Sent]| sent.iter().filter(|sent| sent.status == StatusCode::OK).count();
    assert!(pro.len() >= 100 && free.len() >= 400, "{} pro, {} free sent", pro.len(), free.len());
    assert!(served(&pro) * 100 >= pro.len() * 99, "pro served {} of {}", served(&pro), pro.len());
    let shed = free.iter().filter(|sent| sent.status == StatusCode::SERVICE_UNAVAILABLE).count();
    assert!(shed * 4 >= free.len(), "free shed {shed} of {}", free.len());
    assert_eq!(served(&free) + shed, free.len(), "free is served or shed (503), nothing else");
    let mut admitted: Vec<Duration> =
        window.iter().filter(|sent| sent.status == StatusCode::OK).map(|sent| sent.elapsed).collect();
    let p99 = quantile(&mut admitted, 0.99);
    assert!(p99 < unloaded * 3, "p99 {p99:?} of {} admitted, unloaded {unloaded:?}", admitted.len());
    let free_shed = |stats: &ProxyStats| -> u64 {
        stats.shed.iter().filter(|shed| shed.plan == "free").map(|shed| shed.count).sum()
    };
    proxy.stats_until("every free 503 counted as shed", |stats| free_shed(stats) >= shed as u64).await;
    eprintln!(
        "unloaded {unloaded:?}; settled after {:?} at {lowest}..={highest}; p99 {p99:?}; pro {}/{}; free shed \
         {shed}/{}; recovered to {} after {:?}",
        from - started,
        served(&pro),
        pro.len(),
        free.len(),
        limit(&recovered),
        recovered_after,
    );
}
