use http::{HeaderMap, HeaderValue, Method};
use std::{net::IpAddr, path::Path, sync::Barrier};

use std::time::Duration;

use limiter_core::{
    Algorithm, FakeClock,
    jwt::{self, Claims, testing::SigningKey},
};

use crate::{
    backend::Stores,
    config::{Config, ProxyConfig, count_when::Answer},
    limits::{Decision, Engine, PolicyStatus, RequestInfo, Verdict, VerdictKind, engine::PolicyKind},
};

/// On a minute boundary, as windows are aligned to the epoch.
const T0: Duration = Duration::from_secs(1_700_000_040);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn in_memory(config: &ProxyConfig, clock: FakeClock) -> Engine<FakeClock> {
    let stores = Stores::new(config).expect("memory stores cannot fail");
    Engine::new(config, clock, std::sync::Arc::new(stores))
}

/// Plans as in the issue: Free 100/min throttled from 80, Pro 1000/min from 900.
const BASE: &str = r#"
[proxy]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:3000"

[proxy.plans.free]
limit = 100
window = "1m"
throttle_from = 80
throttle_delay = "200ms"

[proxy.plans.pro]
limit = 1000
window = "1m"
throttle_from = 900
throttle_delay = "50ms"

[[proxy.keys]]
id = "k-free-1"
plan = "free"
auth = "bearer"

[[proxy.keys]]
id = "k-pro-1"
plan = "pro"
auth = "bearer"
"#;

fn config(extra: &str) -> ProxyConfig {
    parse(&format!("{BASE}{extra}"))
}

fn parse(text: &str) -> ProxyConfig {
    Config::parse(text, Path::new("test.toml")).expect("valid config").proxy.expect("[proxy]")
}

/// `BASE` and `extra` with `setting` added to `[proxy]`.
fn config_with(setting: &str, extra: &str) -> ProxyConfig {
    parse(&format!("{BASE}{extra}").replace("[proxy]\n", &format!("[proxy]\n{setting}\n")))
}

fn engine(extra: &str) -> (Engine<FakeClock>, FakeClock) {
    let clock = FakeClock::new(T0);
    (in_memory(&config(extra), clock.clone()), clock)
}

/// A request; `ip` is the client, `key` the X-API-Key.
struct Req {
    method: Method,
    path: &'static str,
    client: IpAddr,
    api_key: Option<&'static str>,
    headers: HeaderMap,
    jwt: Option<Claims>,
    query: Option<&'static str>,
    ja4: Option<limiter_core::ja4::Ja4>,
}

fn get(path: &'static str) -> Req {
    Req {
        method: Method::GET,
        path,
        client: "192.0.2.7".parse().expect("ip"),
        api_key: None,
        headers: HeaderMap::new(),
        jwt: None,
        query: None,
        ja4: None,
    }
}

impl Req {
    fn post(self) -> Self {
        Self { method: Method::POST, ..self }
    }

    fn from(self, ip: &str) -> Self {
        Self { client: ip.parse().expect("ip"), ..self }
    }

    fn key(self, key: &'static str) -> Self {
        Self { api_key: Some(key), ..self }
    }

    /// A verified token with `claims`.
    fn jwt(self, claims: &serde_json::Value) -> Self {
        const SECRET: &[u8] = b"an hs256 secret of some 32 bytes";
        let verifier = jwt::Verifier::new(Duration::ZERO).with_secrets(&[SECRET.to_vec()], jwt::Expected::default());
        let token = jwt::testing::sign("HS256", None, claims, &SigningKey::Hmac(SECRET.to_vec()));
        Self { jwt: Some(verifier.verify(token.as_bytes(), T0).expect("a valid token")), ..self }
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.append(name, HeaderValue::from_str(value).expect("header value"));
        self
    }

    fn query(self, query: &'static str) -> Self {
        Self { query: Some(query), ..self }
    }

    /// Presenting the TLS fingerprint `text`.
    fn ja4(self, text: &str) -> Self {
        Self { ja4: Some(text.parse().expect("a fingerprint")), ..self }
    }

    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            method: &self.method,
            path: self.path,
            client: self.client,
            api_key: self.api_key,
            jwt: self.jwt.as_ref(),
            headers: &self.headers,
            query: self.query,
            body_length: Some(0),
            body: None,
            ja4: self.ja4,
        }
    }

    fn to(&self, engine: &Engine<FakeClock>) -> Decision {
        ready(engine.decide(&self.info()))
    }
}

/// The value of a future that completes without waiting, as every memory-store
/// decision does: polled once, with no runtime.
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(future).poll(&mut context) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("a memory-store decision waited"),
    }
}

fn status<'d>(decision: &'d Decision, name: &str) -> &'d PolicyStatus {
    decision.policies.iter().find(|p| p.name == name).expect("policy status")
}

fn is_forward(d: &Decision) -> bool {
    d.verdict == Verdict::Forward
}

fn is_reject(d: &Decision) -> bool {
    matches!(d.verdict, Verdict::Reject { .. })
}

#[test]
fn a_free_key_sending_105_in_a_minute_gets_80_fast_20_delayed_5_rejected() {
    let (engine, clock) = engine("");
    let request = get("/api/items").key("k-free-1");
    let mut verdicts = Vec::new();
    for i in 0..105_u64 {
        let d = request.to(&engine);
        let free = status(&d, "free");
        assert_eq!((free.limit, free.window), (100, secs(60)));
        if !is_reject(&d) {
            assert_eq!(free.remaining, 99 - i, "Remaining counts down one per request");
        }
        verdicts.push(d.verdict);
        clock.advance(millis(500));
    }
    assert!(verdicts[..80].iter().all(|v| *v == Verdict::Forward));
    assert!(verdicts[80..100].iter().all(|v| *v == Verdict::Delay(millis(200))));
    // The 101st comes 50 s into the window; the window ends 10 s later and the
    // previous window then weighs 100 × (60 − e)/60, down to 99 at e = 0.6 s.
    assert!(verdicts[100..].iter().all(|v| matches!(v, Verdict::Reject { .. })));
    assert_eq!(verdicts[100], Verdict::Reject { retry_after: secs(10) + millis(600) });

    let pro = get("/api/items").key("k-pro-1").to(&engine);
    assert_eq!((&pro.verdict, status(&pro, "pro").remaining), (&Verdict::Forward, 999), "Pro is not affected");
}

#[test]
fn a_rejected_request_names_the_violated_policy_and_keeps_the_counts() {
    let (engine, _) = engine("");
    let request = get("/").key("k-free-1");
    for _ in 0..100 {
        assert!(!is_reject(&request.to(&engine)));
    }
    let d = request.to(&engine);
    assert_eq!(d.violated, ["free"]);
    let free = status(&d, "free");
    assert_eq!((free.remaining, free.reset_after), (0, secs(120)));
}

#[test]
fn the_sixth_login_post_from_one_ip_is_rejected_but_a_get_is_not() {
    let (engine, clock) = engine(
        r#"
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#,
    );
    let login = get("/login").post();
    for left in (0..5).rev() {
        let d = login.to(&engine);
        assert!(is_forward(&d));
        assert_eq!(status(&d, "login").remaining, left);
        clock.advance(secs(1));
    }
    let sixth = login.to(&engine);
    assert_eq!(sixth.verdict, Verdict::Reject { retry_after: secs(55) });
    assert_eq!(sixth.violated, ["login"]);
    let read = get("/login").to(&engine);
    assert!(is_forward(&read) && read.policies.is_empty(), "GET /login matches no rule");
    assert!(is_forward(&login.from("192.0.2.8").to(&engine)), "another client has its own bucket");
    assert!(is_forward(&get("/loginx").post().to(&engine)), "a prefix is a whole path segment");
}

const PER_IP: &str = r#"
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

#[test]
fn either_of_two_rules_tripping_rejects_and_nothing_is_charged() {
    let (engine, _) = engine(
        r#"
[[proxy.keys]]
id = "k-free-2"
plan = "free"
auth = "bearer"

[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "fixed_window"
limit = 4
window = "1m"

[[proxy.rules]]
name = "per-key"
key = "api_key"
algorithm = "fixed_window"
limit = 2
window = "1m"
"#,
    );
    let request = get("/").key("k-pro-1");
    assert_eq!(request.to(&engine).policies.len(), 3, "two rules and the plan");
    let second = request.to(&engine);
    assert!(is_forward(&second));
    assert_eq!((status(&second, "per-ip").remaining, status(&second, "pro").remaining), (2, 998));
    for _ in 0..3 {
        let refused = request.to(&engine);
        assert_eq!(refused.verdict, Verdict::Reject { retry_after: secs(60) });
        assert_eq!(refused.violated, ["per-key"]);
        assert_eq!(status(&refused, "per-ip").remaining, 2, "not charged");
        assert_eq!(status(&refused, "pro").remaining, 998, "not charged");
    }
    // Two more from the address spend the per-IP quota; then it trips for a fresh key.
    assert!(is_forward(&get("/").key("k-free-1").to(&engine)));
    assert!(is_forward(&get("/").key("k-free-1").to(&engine)));
    let d = get("/").key("k-free-2").to(&engine);
    assert_eq!(d.violated, ["per-ip"]);
    assert_eq!(status(&d, "per-key").remaining, 2, "the key's rule was not charged");
    assert_eq!(status(&d, "free").remaining, 100, "nor its plan");
}

#[test]
fn the_strictest_verdict_wins() {
    let (engine, clock) = engine(
        r#"
[[proxy.rules]]
name = "short"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "10s"
throttle_from = 0
throttle_delay = "100ms"

[[proxy.rules]]
name = "long"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1m"
throttle_from = 1
throttle_delay = "300ms"
"#,
    );
    clock.advance(secs(5));
    assert_eq!(get("/").to(&engine).verdict, Verdict::Delay(millis(100)));
    assert_eq!(get("/").to(&engine).verdict, Verdict::Delay(millis(300)), "the longest delay");
    let both = get("/").to(&engine);
    assert_eq!(both.verdict, Verdict::Reject { retry_after: secs(55) }, "the longest retry");
    assert_eq!(both.violated, ["short", "long"]);
}

/// A progressive band on a token bucket counts the tokens in use: as they come
/// back, the delay steps down again.
#[test]
fn a_progressive_band_steps_with_the_usage_and_back_down_as_tokens_return() {
    let (engine, clock) = engine(
        r#"
[[proxy.rules]]
name = "stepped"
key = "ip"
algorithm = "token_bucket"
limit = 10
window = "10s"
throttle_from = 4
throttle_delay = "100ms"
throttle_step = 2
throttle_max_delay = "250ms"
"#,
    );
    let verdicts: Vec<_> = (0..10).map(|_| get("/").to(&engine).verdict).collect();
    let delays = [0, 0, 0, 0, 100, 100, 200, 200, 250, 250].map(|ms| match ms {
        0 => Verdict::Forward,
        ms => Verdict::Delay(millis(ms)),
    });
    assert_eq!(verdicts, delays);
    // 5 tokens back: the next request brings the use to 6, 2 beyond the band's start.
    clock.advance(secs(5));
    assert_eq!(get("/").to(&engine).verdict, Verdict::Delay(millis(100)));
}

#[test]
fn a_leaky_bucket_queue_delays_requests_to_the_rate() {
    let (engine, _) = engine(
        r#"
[[proxy.rules]]
name = "shaped"
key = "ip"
algorithm = "leaky_bucket"
limit = 10
window = "1s"
queue = 2
"#,
    );
    let verdicts: Vec<_> = (0..4).map(|_| get("/").to(&engine).verdict).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Forward,
            Verdict::Delay(millis(100)),
            Verdict::Delay(millis(200)),
            Verdict::Reject { retry_after: millis(100) }
        ]
    );
}

const BY_KEY: &str = r#"
[[proxy.rules]]
name = "by-key"
key = "api_key"
algorithm = "fixed_window"
limit = 3
window = "1m"

[[proxy.rules]]
name = "by-tenant"
path = "/tenant"
key = "header:x-tenant"
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

#[test]
fn requests_without_a_known_key_share_one_bucket_and_allocate_nothing_more() {
    let (engine, _) = engine(BY_KEY);
    let unknown = ["bogus-1", "bogus-2"];
    assert!(is_forward(&get("/").to(&engine)));
    assert!(is_forward(&get("/").key(unknown[0]).to(&engine)));
    let third = get("/").key(unknown[1]).to(&engine);
    assert!(is_forward(&third));
    assert!(third.policies.iter().all(|p| p.name == "by-key"), "no plan for an unknown key");
    assert_eq!(get("/").to(&engine).violated, ["by-key"]);
    assert_eq!(engine.tracked_keys(), 1);
    assert!(is_forward(&get("/").key("k-free-1").to(&engine)), "a known key has its own bucket");
    assert_eq!(engine.tracked_keys(), 3, "its rule bucket and its plan's");
}

#[test]
fn a_missing_key_can_be_refused_without_counting() {
    let engine = in_memory(&config_with("missing_key = \"reject\"", BY_KEY), FakeClock::new(T0));
    let missing = |rule: &str| Verdict::MissingKey { rule: rule.to_owned() };
    assert_eq!(get("/").to(&engine).verdict, missing("by-key"));
    assert_eq!(get("/").key("bogus").to(&engine).verdict, missing("by-key"));
    assert_eq!(get("/tenant").key("k-free-1").to(&engine).verdict, missing("by-tenant"));
    assert_eq!(get("/tenant").key("k-free-1").header("x-tenant", "").to(&engine).verdict, missing("by-tenant"));
    assert_eq!(engine.tracked_keys(), 0);
    assert!(is_forward(&get("/tenant").key("k-free-1").header("x-tenant", "acme").to(&engine)));
}

#[test]
fn header_values_are_keys_and_long_ones_are_hashed() {
    let (engine, _) = engine(BY_KEY);
    let long = "x".repeat(10_000);
    for tenant in ["acme", "globex", long.as_str()] {
        let request = get("/tenant").key("k-pro-1").header("x-tenant", tenant);
        let d = request.to(&engine);
        assert_eq!(status(&d, "by-tenant").remaining, 2, "{tenant:.10}: its own bucket");
    }
}

#[test]
fn a_jwt_claim_is_the_clients_own_bucket_wherever_it_comes_from() {
    let (engine, _) = engine(
        r#"
[proxy.jwt]
hs256_secrets = ["env:UNREAD_HERE"]

[[proxy.rules]]
name = "per-user"
key = "jwt:sub"
algorithm = "token_bucket"
limit = 2
window = "1m"
"#,
    );
    let alice = serde_json::json!({"sub": "alice"});
    assert!(is_forward(&get("/").from("192.0.2.1").jwt(&alice).to(&engine)));
    assert!(is_forward(&get("/").from("2001:db8::1").jwt(&alice).to(&engine)), "from anywhere, one bucket");
    let refused = get("/").from("198.51.100.9").jwt(&alice).to(&engine);
    assert!(is_reject(&refused) && refused.own_bucket_refused, "{refused:?}");
    assert!(is_forward(&get("/").jwt(&serde_json::json!({"sub": "bob"})).to(&engine)), "another subject");
    // A number by its text, a long value by its hash: each its own bucket.
    let long = "x".repeat(1_000);
    for sub in [serde_json::json!(42), serde_json::json!(long)] {
        let request = get("/").jwt(&serde_json::json!({ "sub": sub }));
        assert_eq!(status(&request.to(&engine), "per-user").remaining, 1, "{sub:.10}");
    }
    // No token, or a claim that names no one: the shared missing-key bucket.
    let shared = [get("/"), get("/").jwt(&serde_json::json!({"sub": ""})), get("/").jwt(&serde_json::json!({}))];
    let remaining: Vec<u64> = shared.iter().map(|request| status(&request.to(&engine), "per-user").remaining).collect();
    assert_eq!(remaining, [1, 0, 0]);
    assert!(!get("/").to(&engine).own_bucket_refused, "the missing-key bucket is anyone's");
}

#[test]
fn ipv6_clients_share_a_bucket_per_64_and_mapped_ipv4_is_ipv4() {
    let (engine, _) = engine(PER_IP);
    let remaining = |ip: &str| status(&get("/").from(ip).to(&engine), "per-ip").remaining;
    assert_eq!(remaining("2001:db8:1:2::1"), 99);
    assert_eq!(remaining("2001:db8:1:2:ffff::9"), 98, "same /64");
    assert_eq!(remaining("2001:db8:1:3::1"), 99, "another /64");
    assert_eq!(remaining("198.51.100.1"), 99);
    assert_eq!(remaining("::ffff:198.51.100.1"), 98, "IPv4-mapped");
}

#[test]
fn route_keys_count_each_path_separately() {
    let (engine, _) = engine(
        r#"
[[proxy.rules]]
name = "upload"
path = "/upload"
key = "ip+route"
algorithm = "token_bucket"
limit = 1
window = "1m"
"#,
    );
    assert!(is_forward(&get("/upload/a").to(&engine)));
    assert!(is_reject(&get("/upload/a").to(&engine)), "same client, same route");
    assert!(is_forward(&get("/upload/b").to(&engine)), "another route under the prefix");
    assert!(is_forward(&get("/upload/a").from("192.0.2.9").to(&engine)), "another client");
    let long: &'static str = Box::leak(format!("/upload/{}", "x".repeat(500)).into_boxed_str());
    assert!(is_forward(&get(long).to(&engine)));
    assert!(is_reject(&get(long).to(&engine)), "a long path is keyed by its hash, still per route");
}

#[test]
fn a_reload_keeps_counts_when_only_the_limit_changes() {
    let (engine, clock) = engine("");
    let request = get("/").key("k-free-1");
    for _ in 0..50 {
        request.to(&engine);
    }
    clock.advance(secs(1));
    let mut lower = config("");
    lower.plans.get_mut("free").expect("free plan").limits[0].spec.limit =
        std::num::NonZeroU32::new(60).expect("nonzero");
    engine.reconfigure(&lower);
    let d = request.to(&engine);
    assert_eq!(status(&d, "free").limit, 60);
    assert_eq!(status(&d, "free").remaining, 9, "60 − 51: the 50 before the reload still count");

    // A new window is a new policy: its counts start over.
    engine.reconfigure(&parse(
        &BASE.replace("window = \"1m\"\nthrottle_from = 80", "window = \"2m\"\nthrottle_from = 80"),
    ));
    assert_eq!(engine.tracked_keys(), 0, "the old policy's state is dropped");
    assert_eq!(status(&request.to(&engine), "free").remaining, 99);
}

#[test]
fn penalties_charge_only_ip_rules_and_never_past_full() {
    let (engine, clock) = engine(
        r#"
[[proxy.rules]]
name = "transfer-ip"
path = "/transfer"
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1m"

[[proxy.rules]]
name = "transfer-key"
path = "/transfer"
key = "api_key"
algorithm = "fixed_window"
limit = 5
window = "1m"
"#,
    );
    let transfer = get("/transfer").post().key("k-pro-1");
    for _ in 0..3 {
        ready(engine.penalize(&transfer.info()));
    }
    let d = transfer.to(&engine);
    assert_eq!((status(&d, "transfer-ip").remaining, status(&d, "transfer-key").remaining), (1, 4));
    for _ in 0..10 {
        ready(engine.penalize(&transfer.info()));
    }
    assert!(is_reject(&transfer.to(&engine)));
    clock.advance(secs(60));
    assert!(is_forward(&transfer.to(&engine)), "a full bucket took no debt");
}

#[test]
fn an_early_refusal_asks_only_the_rules_needing_no_key_and_charges_nothing() {
    let (engine, _) = engine(
        r#"
[[proxy.rules]]
name = "upload-ip"
path = "/upload"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1m"

[[proxy.rules]]
name = "upload-key"
path = "/upload"
key = "api_key"
algorithm = "fixed_window"
limit = 1
window = "1m"
"#,
    );
    let upload = get("/upload").post().key("k-pro-1");
    for _ in 0..3 {
        assert!(ready(engine.refuse_early(&upload.info())).is_none(), "room in the IP's bucket");
    }
    let d = upload.to(&engine);
    assert_eq!((status(&d, "upload-ip").remaining, status(&d, "upload-key").remaining), (1, 0), "nothing charged");
    // The key's bucket is empty, but it is the key's to prove: not asked early.
    assert!(ready(engine.refuse_early(&upload.info())).is_none());
    assert!(is_reject(&upload.to(&engine)), "the key's own limit");
    assert!(ready(engine.refuse_early(&get("/upload").post().info())).is_none());
    assert!(is_forward(&get("/upload").post().to(&engine)), "the IP's last one, keyless");
    let early = ready(engine.refuse_early(&upload.info())).expect("the IP is out");
    assert!(is_reject(&early) && early.own_bucket_refused, "{early:?}");
    assert_eq!(early.violated, ["upload-ip"]);
    assert!(ready(engine.refuse_early(&get("/elsewhere").post().info())).is_none(), "no rule applies");
    let counts = engine.policy_counts();
    let ip = counts.iter().find(|c| c.name == "upload-ip").expect("upload-ip");
    assert_eq!((ip.forwarded, ip.rejected), (2, 1), "the early refusal counted as one");
}

#[test]
fn two_hundred_concurrent_requests_on_one_key_with_limit_50_forward_exactly_50() {
    for algorithm in ["token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"] {
        let (engine, _) = engine(&format!(
            "[[proxy.rules]]\nname = \"per-key\"\nkey = \"api_key\"\nalgorithm = \"{algorithm}\"\nlimit = 50\nwindow = \"1h\"\n"
        ));
        let request = get("/").key("k-pro-1");
        let start = Barrier::new(200);
        let forwarded = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..200)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        is_forward(&request.to(&engine))
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("thread")).filter(|&forwarded| forwarded).count()
        });
        assert_eq!(forwarded, 50, "{algorithm}");
    }
}

#[test]
fn random_clients_stay_within_the_bound() {
    let engine = in_memory(&config_with("max_tracked_keys = 10_000", PER_IP), FakeClock::new(T0));
    for i in 0..200_000_u32 {
        let request = get("/").from(&std::net::Ipv4Addr::from(i.wrapping_mul(2_654_435_761)).to_string());
        assert!(is_forward(&request.to(&engine)));
    }
    assert!(engine.tracked_keys() <= 10_000);
    assert_eq!(engine.evictions(), 200_000 - engine.tracked_keys() as u64);
}

#[test]
fn a_rule_requiring_a_signature_requires_it_on_its_path_only() {
    let (engine, _) = engine(
        r#"
[[proxy.rules]]
name = "transfer"
path = "/api/transfer"
require_signature = true
key = "api_key"
algorithm = "token_bucket"
limit = 10
window = "1s"
burst = 20
"#,
    );
    assert!(get("/api/transfer").key("k-pro-1").to(&engine).require_signature);
    assert!(!get("/api/other").key("k-pro-1").to(&engine).require_signature);
}

#[test]
fn explain_shows_every_matching_bucket_and_its_quota_without_charging_it() {
    let (engine, _clock) = engine(
        r#"
[[proxy.rules]]
name = "login"
path = "/login"
methods = ["POST"]
limit = 5
window = "1m"
key = "ip"

[[proxy.rules]]
name = "elsewhere"
path = "/other"
limit = 1
window = "1m"
key = "ip"
"#,
    );
    let login = get("/login").post().key("k-free-1");
    for _ in 0..3 {
        assert!(is_forward(&login.to(&engine)));
    }
    for _ in 0..4 {
        let explained = ready(engine.explain(&login.info(), true));
        assert_eq!(explained.verdict, Some(VerdictKind::Forward));
        let names: Vec<(PolicyKind, &str, &str)> =
            explained.policies.iter().map(|p| (p.kind, p.name.as_str(), p.key.as_str())).collect();
        assert_eq!(
            names,
            [(PolicyKind::Rule, "login", "ip=192.0.2.7"), (PolicyKind::Plan, "free", "api_key=k-free-1")]
        );
        assert_eq!(explained.policies[0].remaining, Some(2), "3 of 5 spent, explaining spends none");
        assert_eq!(explained.policies[1].remaining, Some(97));
        assert_eq!(
            (explained.policies[0].algorithm, explained.policies[0].limit),
            (Algorithm::SlidingWindowCounter, 5)
        );
    }
    assert_eq!((0..5).filter(|_| is_forward(&login.to(&engine))).count(), 2, "exactly the 2 explain showed");
    let refused = ready(engine.explain(&login.info(), true));
    assert_eq!(
        (refused.verdict, refused.policies[0].admits, refused.policies[1].admits),
        (Some(VerdictKind::Reject), Some(false), Some(true))
    );
    assert!(refused.wait_ms.is_some_and(|ms| ms > 0), "{refused:?}");

    let from_config = ready(engine.explain(&login.info(), false));
    assert_eq!(from_config.verdict, None);
    assert!(from_config.policies.iter().all(|p| p.remaining.is_none() && p.admits.is_none()));
    assert_eq!(from_config.policies.len(), 2);
}

fn counts_of(engine: &Engine<FakeClock>, name: &str) -> (u64, u64, u64) {
    let counts = engine.policy_counts();
    let policy = counts.iter().find(|p| p.name == name).expect("policy counts");
    (policy.forwarded, policy.throttled, policy.rejected)
}

/// Each rule and plan counts its own part: the plan delays from its 81st request,
/// the rule refuses from its 91st, and a request the rule refused counts for no
/// other policy.
#[test]
fn each_rule_and_plan_counts_what_it_forwarded_throttled_and_refused() {
    let rule = "[[proxy.rules]]\nname = \"per-ip\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 90\nwindow = \"1m\"\n";
    let (engine, clock) = engine(rule);
    let request = get("/api/items").key("k-free-1");
    for _ in 0..95 {
        request.to(&engine);
        clock.advance(millis(100));
    }
    assert_eq!(counts_of(&engine, "per-ip"), (90, 0, 5));
    assert_eq!(counts_of(&engine, "free"), (80, 10, 0));
    assert_eq!(counts_of(&engine, "pro"), (0, 0, 0));
    let kinds: Vec<(PolicyKind, String)> = engine.policy_counts().into_iter().map(|p| (p.kind, p.name)).collect();
    let expected = [(PolicyKind::Rule, "per-ip"), (PolicyKind::Plan, "free"), (PolicyKind::Plan, "pro")]
        .map(|(k, n)| (k, n.to_owned()));
    assert_eq!(kinds, expected, "rules first, then plans by name");

    // A reload that keeps the names keeps the counts, whatever else changed.
    engine.reconfigure(&config(&rule.replace("limit = 90", "limit = 10")));
    assert_eq!(counts_of(&engine, "per-ip"), (90, 0, 5));
    request.to(&engine);
    assert_eq!(counts_of(&engine, "per-ip"), (90, 0, 6));
    engine.reconfigure(&config(&rule.replace("per-ip", "per-client")));
    assert_eq!(counts_of(&engine, "per-client"), (0, 0, 0), "a new name starts from zero");
}

#[test]
fn a_request_refused_for_a_missing_key_counts_as_its_rules_refusal() {
    let engine = in_memory(&config_with("missing_key = \"reject\"", BY_KEY), FakeClock::new(T0));
    get("/").to(&engine);
    get("/tenant").key("k-free-1").to(&engine);
    assert_eq!(counts_of(&engine, "by-key"), (0, 0, 1));
    assert_eq!(counts_of(&engine, "by-tenant"), (0, 0, 1));
    assert_eq!(counts_of(&engine, "free"), (0, 0, 0));
}

#[test]
fn kinds_display_as_the_json_names_them() {
    let json = |value: serde_json::Value| value.as_str().map(str::to_owned);
    for kind in VerdictKind::ALL {
        assert_eq!(json(serde_json::json!(kind)), Some(kind.to_string()));
    }
    for kind in PolicyKind::ALL {
        assert_eq!(json(serde_json::json!(kind)), Some(kind.to_string()));
    }
}

/// A refusal is the client's own doing only when a bucket keyed by its address or its
/// proven key (or that key's plan, or a composite with either as a part) refused: the
/// missing-key bucket and the values a client chooses are anyone's.
#[test]
fn a_refusal_is_the_clients_own_only_from_its_address_or_proven_key() {
    let rules = r#"
[[proxy.rules]]
name = "by-ip"
path = "/ip"
key = "ip"
limit = 2
window = "1m"

[[proxy.rules]]
name = "by-key"
path = "/key"
key = "api_key"
limit = 2
window = "1m"

[[proxy.rules]]
name = "by-header"
path = "/header"
key = "header:x-user"
limit = 2
window = "1m"

[[proxy.rules]]
name = "by-ip-too"
path = "/header"
key = "ip"
limit = 1000
window = "1m"

[[proxy.rules]]
name = "by-tenant-and-ip"
path = "/composite"
key = ["header:x-tenant", "ip"]
limit = 2
window = "1m"

[[proxy.rules]]
name = "by-user"
path = "/query"
key = "query:user"
limit = 2
window = "1m"
"#;
    let (engine, clock) = engine(rules);
    // Past each bucket's 2, then one more: which refusals were the client's own.
    let third = |request: &Req| {
        for _ in 0..2 {
            assert!(matches!(request.to(&engine).verdict, Verdict::Forward | Verdict::Delay(_)));
        }
        let refused = request.to(&engine);
        assert!(matches!(refused.verdict, Verdict::Reject { .. }), "{refused:?}");
        refused.own_bucket_refused
    };
    assert!(third(&get("/ip")), "its own address");
    assert!(third(&get("/key").key("k-free-1")), "its own proven key");
    assert!(!third(&get("/key").from("192.0.2.8")), "the shared missing-key bucket");
    assert!(!third(&get("/header").header("x-user", "victim")), "a header anyone can send");
    assert!(third(&get("/composite").header("x-tenant", "acme")), "a value of its own, with its address");
    assert!(!third(&get("/query").query("user=victim")), "a username anyone can try");
    let free = get("/other").key("k-free-1").from("192.0.2.9");
    for _ in 0..98 {
        assert!(matches!(free.to(&engine).verdict, Verdict::Forward | Verdict::Delay(_)));
    }
    let over_plan = free.to(&engine);
    assert!(matches!(over_plan.verdict, Verdict::Reject { .. }) && over_plan.own_bucket_refused, "its plan");
    clock.advance(secs(120));
    let forwarded = get("/ip").to(&engine);
    assert!(forwarded.verdict == Verdict::Forward && !forwarded.own_bucket_refused, "{forwarded:?}");
}

/// Issue 25 item 2: requests another policy refused once counted in every policy's
/// peaks, so one address sending a new `x-user` a request deflated `by-user`'s
/// suggestion; they count only in the refusing policy's, whose demand they are.
#[test]
fn limiter_suggest_leaves_out_requests_another_policy_refused() {
    let (engine, _) = engine(
        r#"
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "fixed_window"
limit = 60
window = "1m"
[[proxy.rules]]
name = "by-user"
key = "header:x-user"
algorithm = "fixed_window"
limit = 1000
window = "1m"
"#,
    );
    for user in 0..1_000 {
        get("/").from("198.51.100.1").header("x-user", &format!("poison-{user}")).to(&engine);
    }
    for user in 0..5 {
        for _ in 0..50 {
            let request = get("/").from(&format!("192.0.2.{}", 10 + user)).header("x-user", &format!("real-{user}"));
            assert!(is_forward(&request.to(&engine)));
        }
    }
    let suggestions = engine.suggest(1.0);
    let peaks = |name: &str| &suggestions.iter().find(|s| s.name == name).expect("a suggestion").peaks;
    let by_user = peaks("by-user");
    assert_eq!((by_user.keys, by_user.p99, by_user.max), (60 + 5, 50, 50), "60 poison keys per-ip admitted");
    let per_ip = peaks("per-ip");
    assert_eq!((per_ip.keys, per_ip.max), (6, 1_000), "per-ip saw all it refused");
}

/// Failed logins per client, 2 an hour, beside all logins per client.
const LOGINS: &str = r#"
[[proxy.rules]]
name = "failed-logins"
path = "/login"
methods = ["POST"]
key = "ip"
limit = 2
window = "1h"
count_when = { status = ["401", "4xx", "timeout"] }

[[proxy.rules]]
name = "logins"
path = "/login"
key = "ip"
limit = 100
window = "1h"
"#;

#[test]
fn a_count_when_rule_gives_back_the_unit_of_an_answer_it_does_not_count() {
    let (engine, _clock) = engine(LOGINS);
    let login = get("/login").post();
    let answer = |code| Answer::Status(http::StatusCode::from_u16(code).expect("a status"));
    for answered in [answer(200), answer(302), answer(500), Answer::Unsent] {
        let d = login.to(&engine);
        assert!(is_forward(&d));
        assert_eq!(status(&d, "failed-logins").remaining, 1, "the unit is taken while the answer is awaited");
        assert_eq!(d.refundable.len(), 1, "only the count_when rule's charge");
        assert!(ready(engine.refund(&d.refundable, answered)), "{answered:?}");
    }
    for answered in [answer(401), Answer::Timeout] {
        let d = login.to(&engine);
        assert!(!ready(engine.refund(&d.refundable, answered)), "{answered:?} counts");
    }
    let refused = login.to(&engine);
    assert!(is_reject(&refused));
    assert_eq!((refused.violated.as_slice(), refused.refundable.len()), (&["failed-logins".to_owned()][..], 0));
    assert_eq!(status(&refused, "logins").remaining, 94, "all six counted by the rule without count_when");
    let explained = ready(engine.explain(&login.info(), false));
    let counted: Vec<Option<Vec<String>>> = explained.policies.iter().map(|p| p.count_when.clone()).collect();
    assert_eq!(counted, [Some(vec!["401".to_owned(), "4xx".to_owned(), "timeout".to_owned()]), None]);
}

/// A plan metered by its upstream: one unit a second returns, each request is
/// admitted while a unit is left and charged its answer's 7 afterwards, so the third
/// leaves a debt of one and the fourth waits for it and one more: 2 s.
#[test]
fn a_post_paid_plan_is_charged_into_debt_and_admits_again_once_it_is_repaid() {
    let (engine, clock) = engine(
        r#"
[proxy.plans.metered]
algorithm = "token_bucket"
limit = 20
window = "20s"
cost_from = { response_header = "x-request-cost", max = 1000 }

[[proxy.keys]]
id = "k-meter"
plan = "metered"
auth = "bearer"
"#,
    );
    let request = get("/api").key("k-meter");
    for before in [20, 13, 6] {
        let decision = request.to(&engine);
        assert!(is_forward(&decision), "{before} left");
        assert_eq!(status(&decision, "metered").remaining, before, "nothing taken at admission");
        let [owed] = decision.owed.as_slice() else { panic!("one post-paid charge: {:?}", decision.owed) };
        let settled = ready(engine.charge_owed(&[(owed.clone(), owed.cost_from().units(Some(7)))]));
        let left: Vec<(&str, u64)> = settled.iter().map(|s| (s.name.as_str(), s.remaining)).collect();
        assert_eq!(left, [("metered", before.saturating_sub(7))], "the balance once charged, 0 in debt");
    }
    let refused = request.to(&engine);
    assert_eq!(refused.verdict, Verdict::Reject { retry_after: secs(2) }, "20 − 21: the unit owed and one more");
    assert!(refused.owed.is_empty(), "a refused request owes nothing");
    clock.advance(secs(2) - millis(1));
    assert!(is_reject(&request.to(&engine)));
    clock.advance(millis(1));
    assert_eq!(status(&request.to(&engine), "metered").remaining, 1);
    assert_eq!(engine.post_paid_charges(), 3);
    let suggestion = engine.suggest(1.0).into_iter().find(|s| s.name == "metered").expect("the plan");
    assert_eq!(suggestion.units, "units (x-request-cost, at most 1000)");
    assert_eq!(suggestion.peaks.max, 21 + 2, "the units charged, and the one each refusal needed");
}

/// `cost = 5` takes five units of every bucket it names, and `limiter suggest` counts
/// them.
#[test]
fn a_costly_rule_takes_its_units_and_suggest_counts_them() {
    let (engine, _clock) = engine(
        "[[proxy.rules]]\nname = \"search\"\npath = \"/search\"\nkey = \"ip\"\nlimit = 20\nwindow = \"1m\"\ncost = 5\n",
    );
    let left: Vec<u64> = (0..4).map(|_| status(&get("/search").to(&engine), "search").remaining).collect();
    assert_eq!(left, [15, 10, 5, 0]);
    assert!(is_reject(&get("/search").to(&engine)));
    let suggestion = engine.suggest(1.0).into_iter().find(|s| s.name == "search").expect("the rule");
    assert_eq!((suggestion.units.as_str(), suggestion.peaks.max), ("units (5 a request)", 25));
}

/// 2027-01-31T23:59:50Z.
const END_OF_JANUARY: Duration = Duration::from_secs(1_801_439_990);

#[test]
fn a_spent_monthly_quota_refuses_until_the_first_of_the_month_and_is_full_there() {
    let plan = r#"
[proxy.plans.metered]
limits = [
  { name = "minute", limit = 100, window = "1m" },
  { name = "monthly", limit = 3, window = "month" },
]
[[proxy.keys]]
id = "k-metered"
plan = "metered"
auth = "bearer"
"#;
    let clock = FakeClock::new(END_OF_JANUARY);
    let engine = in_memory(&config(plan), clock.clone());
    let request = get("/").key("k-metered");
    for n in 1..=3 {
        assert!(is_forward(&request.to(&engine)), "request {n}");
    }
    let refused = request.to(&engine);
    assert_eq!(refused.verdict, Verdict::Reject { retry_after: secs(10) });
    assert_eq!(refused.violated, ["metered.monthly"]);
    let monthly = status(&refused, "metered.monthly");
    assert_eq!((monthly.remaining, monthly.reset_after, monthly.window), (0, secs(10), secs(30 * 86_400)));
    assert_eq!(status(&refused, "metered.minute").remaining, 97, "refused by one quota, charged to none");
    clock.set(END_OF_JANUARY + secs(10));
    let february = request.to(&engine);
    assert!(is_forward(&february));
    assert_eq!(status(&february, "metered.monthly").remaining, 2, "full at 00:00:00, less this request");
}

#[test]
fn a_berlin_day_across_the_change_to_summer_time_is_23_hours() {
    let rule = r#"
[[proxy.rules]]
name = "daily"
key = "ip"
limit = 1
window = "day"
calendar_tz = "Europe/Berlin"
"#;
    // 2027-03-27T23:00:00Z: midnight in Berlin, the day the clocks go forward.
    let midnight = secs(1_806_188_400);
    let clock = FakeClock::new(midnight);
    let engine = in_memory(&config(rule), clock.clone());
    assert!(is_forward(&get("/").to(&engine)));
    assert_eq!(get("/").to(&engine).verdict, Verdict::Reject { retry_after: secs(23 * 3600) });
    clock.set(midnight + secs(23 * 3600) - millis(1));
    assert!(is_reject(&get("/").to(&engine)));
    clock.set(midnight + secs(23 * 3600));
    assert!(is_forward(&get("/").to(&engine)), "the 29th began 23 hours after the 28th");
}

#[test]
fn a_rule_for_some_plans_counts_only_their_keys() {
    let rule = r#"
[[proxy.rules]]
name = "free-exports"
path = "/api/export"
key = "ip"
plans = ["free"]
limit = 1
window = "1m"
"#;
    let (engine, _) = engine(rule);
    let free = get("/api/export").key("k-free-1");
    assert!(is_forward(&free.to(&engine)));
    assert_eq!(free.to(&engine).violated, ["free-exports"]);
    // The same address, on another plan or with no key: not the rule's.
    let pro = get("/api/export").key("k-pro-1").to(&engine);
    assert!(is_forward(&pro) && pro.policies.iter().all(|p| p.name != "free-exports"));
    let keyless = get("/api/export").to(&engine);
    assert!(is_forward(&keyless) && keyless.policies.is_empty());
}

#[test]
fn a_ja4_bucket_is_its_fingerprints_whoever_presents_it() {
    let rules = r#"
[[proxy.rules]]
name = "per-stack"
path = "/stack"
key = "ja4"
algorithm = "fixed_window"
limit = 1
window = "1h"

[[proxy.rules]]
name = "per-stack-and-ip"
path = "/both"
key = ["ja4", "ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#;
    let engine = in_memory(&config_with("ja4_header = \"x-ja4\"", rules), FakeClock::new(T0));
    let (bot, other) = ("t13d1516h2_8daaf6152771_e5627efa2ab1", "t12i0601h1_2c9a3d3a8c57_0e5d25d7bb07");
    assert!(is_forward(&get("/stack").from("192.0.2.1").ja4(bot).to(&engine)));
    let refused = get("/stack").from("198.51.100.9").ja4(bot).to(&engine);
    assert!(is_reject(&refused), "another address, the same stack: {refused:?}");
    assert!(refused.fingerprint_bucket_refused && !refused.own_bucket_refused, "{refused:?}");
    assert!(is_forward(&get("/stack").from("198.51.100.9").ja4(other).to(&engine)), "another stack");
    // Without a fingerprint the key is missing: the shared missing-key bucket.
    let missing: Vec<u64> = [get("/stack"), get("/stack").from("198.51.100.9")]
        .iter()
        .map(|request| status(&request.to(&engine), "per-stack").remaining)
        .collect();
    assert_eq!(missing, [0, 0]);
    assert!(!get("/stack").to(&engine).fingerprint_bucket_refused, "the missing-key bucket is anyone's");
    // With the address a part, the bucket is the client's own.
    assert!(is_forward(&get("/both").from("192.0.2.1").ja4(bot).to(&engine)));
    assert!(is_forward(&get("/both").from("198.51.100.9").ja4(bot).to(&engine)));
    let own = get("/both").from("192.0.2.1").ja4(bot).to(&engine);
    assert!(is_reject(&own) && own.own_bucket_refused && !own.fingerprint_bucket_refused, "{own:?}");
}
