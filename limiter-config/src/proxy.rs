//! `[proxy]`: the HTTP reverse proxy, its plans, API keys and rules.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    num::{NonZeroU32, NonZeroUsize},
    str::FromStr,
    time::Duration,
};

use ipnet::IpNet;
use limiter_core::{
    Algorithm, Cost, CostFrom, CostSource, LimitSpec, adaptive,
    calendar::{Calendar, Period, Zone},
    carried::{JsonPointer, PointerError},
    path::{CanonicalPath, EscapedSlashes, PathOptions},
    spec::LimitOptions,
};
use serde::{Deserialize, Deserializer, de};

use super::{
    changes::{Changes, Keyed, shown},
    conditions::{Conditions, RawConditions, Seen},
    count_when::{self, CountWhen, RawCountWhen, RawStatus, StatusMatch},
    units::HumanDuration,
    xdp::parse_cidr,
};

/// `[proxy]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Changes)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    #[changes(restart)]
    pub listen: SocketAddr,
    /// Threads serving connections, each with its own upstream pool; `None`: one per
    /// CPU the agent may run on.
    #[changes(restart = "the threads start with the proxy", unset = "one per CPU")]
    pub workers: Option<NonZeroUsize>,
    /// `http://host:port` of the application.
    #[serde(deserialize_with = "upstream")]
    pub upstream: http::Uri,
    /// Peers whose `X-Forwarded-For` is believed.
    #[serde(default, deserialize_with = "cidrs")]
    pub trusted_proxies: Vec<IpNet>,
    /// The header in which a peer of `trusted_proxies` (a balancer that ends TLS
    /// itself) names the JA4 fingerprint of its client's handshake; `None`: only
    /// `[proxy.tls] fingerprint` gives requests one.
    #[serde(default, deserialize_with = "some_header_name")]
    pub ja4_header: Option<http::HeaderName>,
    /// `false`: shadow mode, decide and count but never reject or delay.
    #[serde(default = "yes")]
    pub enforce: bool,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Request bytes one connection may have held in memory at once (signed and
    /// chunked bodies are read whole before they are forwarded); `None`: 8 bodies of
    /// `max_body_bytes` (an HTTP/2 connection reads several at once).
    #[changes(unset = "8 × max_body_bytes")]
    pub max_buffered_bytes_per_connection: Option<u64>,
    /// The same over all of one client's connections (IPv6: its /64); `None`: 32
    /// bodies of `max_body_bytes`.
    #[changes(unset = "32 × max_body_bytes")]
    pub max_buffered_bytes_per_client: Option<u64>,
    #[serde(default = "default_header_timeout")]
    pub header_timeout: HumanDuration,
    /// Longest wait for the next request on a keep-alive connection (then closed).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: HumanDuration,
    /// Longest time from the first read of a body to its end (then 408).
    #[serde(default = "default_body_timeout")]
    pub body_timeout: HumanDuration,
    /// Connections open at once, over all clients; more are closed at accept.
    #[serde(default = "default_max_connections")]
    pub max_connections: NonZeroUsize,
    /// Connections open at once from one peer address (IPv6: one /64); trusted
    /// proxies are bound by `max_connections` only.
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: NonZeroUsize,
    /// Connections open at once from one IPv6 /56 (a household's usual share), so
    /// that its 256 /64s cannot hold every place.
    #[serde(default = "default_max_connections_per_ipv6_56")]
    pub max_connections_per_ipv6_56: NonZeroUsize,
    /// Connections open at once from one IPv6 /48 (a site's usual share).
    #[serde(default = "default_max_connections_per_ipv6_48")]
    pub max_connections_per_ipv6_48: NonZeroUsize,
    /// Connections open at once from one IPv4 /24; `None`: unbounded, since one /24
    /// is often many unrelated customers.
    pub max_connections_per_ipv4_24: Option<NonZeroUsize>,
    /// Longest wait for the upstream's response head (then 504).
    #[serde(default = "default_upstream_timeout")]
    pub upstream_timeout: HumanDuration,
    /// Longest wait for a write to the client to make progress (then the connection
    /// is cut, and with it the upstream's response): a client that stops reading
    /// cannot hold an upstream connection for ever.
    #[serde(default = "default_send_timeout")]
    pub send_timeout: HumanDuration,
    /// Requests one client (IPv4 address, IPv6 /64) may have in flight at once, over
    /// all its connections and HTTP/2 streams, from head to the end of the response;
    /// more get 429. Trusted proxies' own requests are exempt, not their clients'.
    #[serde(default = "default_max_requests_in_flight_per_client")]
    pub max_requests_in_flight_per_client: NonZeroUsize,
    /// Connections to the upstream open at once, over all workers, idle pooled ones
    /// included; a request that would need another gets 503.
    #[serde(default = "default_max_upstream_connections")]
    #[changes(restart = "the permits are counted from start")]
    pub max_upstream_connections: NonZeroUsize,
    /// Bound on per-key limiter state.
    #[serde(default = "default_max_tracked_keys")]
    pub max_tracked_keys: NonZeroUsize,
    #[serde(default)]
    #[changes(restart)]
    pub store: StoreKind,
    #[serde(default = "default_redis_url")]
    #[changes(restart, redacted)]
    pub redis_url: String,
    /// Start of every key this agent's fleet uses in Redis: agents sharing limits
    /// share it, and unrelated fleets on one server pick different ones.
    #[serde(default = "default_redis_prefix")]
    #[changes(restart)]
    pub redis_prefix: String,
    /// Longest wait for Redis per decision; past it, `store_failure` decides.
    #[serde(default = "default_redis_timeout")]
    #[changes(restart)]
    pub redis_timeout: HumanDuration,
    /// With `rediss://` or `rediss+cluster://`: the CA (PEM) the servers' certificates
    /// must chain to, instead of the system's roots.
    #[changes(restart)]
    pub redis_tls_ca: Option<std::path::PathBuf>,
    /// The limits' verdict while the store is unreachable (replay protection and
    /// idempotency fail closed whatever it says); unset is told apart from `local`, its
    /// default, so that `limiter check` can say the default changed.
    #[changes(unset = "local")]
    pub store_failure: Option<StoreFailure>,
    /// What a rule does with a request that lacks its key (no API key, no header).
    #[serde(default)]
    pub missing_key: MissingKey,
    /// `%2F`, `%5C`, `%00` or a raw `\` in a path: refused with 400, or kept encoded.
    #[serde(default, deserialize_with = "escaped_slashes")]
    pub escaped_slashes: EscapedSlashes,
    /// Rules and `+route` keys see the path in lower case (the default, since
    /// `false` lets a case-folding upstream's clients dodge path rules); unset is
    /// told apart from `true` so that `limiter check` can say the default changed.
    #[changes(unset = "true")]
    pub case_insensitive_paths: Option<bool>,
    /// What clients are told of the policies (a plan may say otherwise for its keys).
    #[serde(default)]
    pub disclose: Disclose,
    /// Each 429's `Retry-After` is spread at random over this share either side
    /// (0.1: ±10 %, never below 1 s), so that clients refused together do not all
    /// come back in the same second; 0: exact.
    #[serde(default, deserialize_with = "jitter")]
    pub retry_after_jitter: f64,
    /// The realm a 401's `WWW-Authenticate` challenges name (RFC 9110 §11.6.1).
    #[serde(default = "default_realm")]
    pub realm: String,
    #[serde(default)]
    pub plans: BTreeMap<String, Plan>,
    /// Areas of routes only keys holding them may call.
    #[serde(default)]
    #[changes(keyed)]
    pub scopes: Vec<Scope>,
    #[serde(default)]
    #[changes(keyed)]
    pub keys: Vec<ApiKey>,
    #[serde(default)]
    #[changes(keyed)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub signature: SignatureConfig,
    /// JSON Web Tokens that `jwt:CLAIM` keys count by; `None`: no token is read.
    pub jwt: Option<JwtConfig>,
    /// A JSON line for a sample of the limits' decisions; `None`: none.
    #[changes(restart_if_added_or_removed = "the file is opened at start")]
    pub decision_log: Option<DecisionLogConfig>,
    /// TLS on the listener; `None`: cleartext.
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub http2: Http2Config,
    #[serde(default)]
    pub body_keys: BodyKeysConfig,
    /// Whether the peers in `trusted_proxies` open each connection with a PROXY
    /// protocol header naming the client.
    #[serde(default)]
    pub proxy_protocol: ProxyProtocol,
    /// Longest silence in both directions on an upgraded connection (a WebSocket),
    /// then it is closed.
    #[serde(default = "default_tunnel_idle_timeout")]
    pub tunnel_idle_timeout: HumanDuration,
    /// The protocols a client may switch to through the proxy (`Upgrade`), compared
    /// without case and without a version; others are not forwarded, so that no
    /// upstream is asked for a tunnel (`h2c`, a custom one) it never meant to offer.
    #[serde(default = "websocket_only")]
    pub upgrade_protocols: Vec<String>,
    /// `[proxy.upstream_capacity]`: the requests in flight to the upstream at once,
    /// over every client, and the queue before them, served by plan priority; `None`:
    /// unbounded (or, with `[proxy.adaptive]`, no queue).
    pub upstream_capacity: Option<UpstreamCapacity>,
    /// `[proxy.adaptive]`: the upstream's limit in flight moved by its latency, in
    /// place of `[proxy.upstream_capacity] concurrency`; `None`: fixed.
    pub adaptive: Option<AdaptiveConfig>,
}

/// `[proxy.tls]`: the listener's certificates, read at start and on every reload.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain (PEM) for clients naming no host, or one no `sni` entry names.
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
    /// Certificates chosen by the host the client names (SNI).
    #[serde(default)]
    #[changes(keyed)]
    pub sni: Vec<SniCertificate>,
    /// The fingerprint taken of every handshake's ClientHello; `None`: none.
    pub fingerprint: Option<Fingerprint>,
}

/// `[proxy.tls] fingerprint`: which fingerprint of a ClientHello is taken.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "lowercase")]
pub enum Fingerprint {
    /// FoxIO's JA4 ([`limiter_core::ja4`]).
    Ja4,
}

/// `[[proxy.tls.sni]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct SniCertificate {
    /// The host name, matched without regard to case.
    pub name: String,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl Keyed for SniCertificate {
    fn id(&self) -> String {
        self.name.clone()
    }
}

/// `[proxy.body_keys]`: how much of a body is read for the rules keyed on it
/// (`json:`, `form:`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, default)]
pub struct BodyKeysConfig {
    /// A body longer than this is not read for a key (the key is missing), and is
    /// forwarded as it streams in.
    pub max_bytes: u64,
}

impl Default for BodyKeysConfig {
    fn default() -> Self {
        Self { max_bytes: 16 << 10 }
    }
}

/// `[proxy.http2]`: HTTP/2 from clients (over TLS it is offered by ALPN).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Config {
    /// Cleartext HTTP/2 from clients that know the listener speaks it (prior knowledge).
    pub h2c: bool,
    /// Streams a client may have open at once on one connection.
    pub max_concurrent_streams: NonZeroU32,
    /// Largest header list of a request (names, values and 32 bytes each); over it, 431.
    pub max_header_list_bytes: NonZeroU32,
    /// Requests a client may cancel before their answer, per connection and minute;
    /// past it (the rapid-reset attack) the connection is cut.
    pub max_resets_per_minute: NonZeroU32,
}

impl Default for Http2Config {
    fn default() -> Self {
        Self {
            h2c: false,
            max_concurrent_streams: NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN),
            max_header_list_bytes: NonZeroU32::new(16 << 10).unwrap_or(NonZeroU32::MIN),
            max_resets_per_minute: NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// `proxy.proxy_protocol`: which PROXY protocol header trusted peers send.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum ProxyProtocol {
    #[default]
    Off,
    V1,
    V2,
    /// Either version, told apart by its first bytes.
    Any,
}

/// `proxy.decision_log = { path, sample }`.
#[derive(Clone, Debug, Deserialize, PartialEq, Changes)]
#[serde(deny_unknown_fields)]
pub struct DecisionLogConfig {
    /// The file lines are appended to; opened at start.
    #[changes(restart = "the file is opened at start")]
    pub path: std::path::PathBuf,
    /// Share of decisions written: 1 writes every one, 0.01 one in a hundred.
    #[serde(default = "every_decision", deserialize_with = "sample")]
    pub sample: f64,
}

fn jitter<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let share = f64::deserialize(deserializer)?;
    if (0.0..1.0).contains(&share) {
        Ok(share)
    } else {
        Err(de::Error::custom(format!("{share} is not a share of Retry-After: at least 0, less than 1")))
    }
}

fn every_decision() -> f64 {
    1.0
}

fn websocket_only() -> Vec<String> {
    vec!["websocket".to_owned()]
}

fn sample<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let share = f64::deserialize(deserializer)?;
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(de::Error::custom(format!("{share} is not a share of decisions: more than 0, at most 1")))
    }
}

/// Where per-key state lives.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    #[default]
    Memory,
    Redis,
}

/// The limits' verdict while the shared store is unreachable.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum StoreFailure {
    /// Every request goes on unlimited: whoever can slow the shared Redis lifts
    /// every limit of the fleet.
    Allow,
    Deny,
    /// Each agent enforces the limits itself, each quota divided by the agents the
    /// fleet's heartbeats counted while the store was up.
    #[default]
    Local,
}

/// Policy for a request that lacks the key a rule counts by.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum MissingKey {
    /// All such requests share one bucket per rule: limited together, never unlimited.
    #[default]
    Shared,
    /// Refused outright (401 for a missing API key, 400 for a missing header).
    Reject,
}

/// A record that holds a limit as written in the config, with `$extra` fields before
/// it; `limit_spec` checks it into a [`LimitSpec`]. A macro rather than
/// `#[serde(flatten)]`, which would drop `deny_unknown_fields` and the lines of errors.
macro_rules! with_limit {
    ($(#[$meta:meta])* struct $name:ident { $($(#[$field_meta:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $name {
            $($(#[$field_meta])* $field: $ty,)*
            #[serde(default, deserialize_with = "some_algorithm")]
            algorithm: Option<Algorithm>,
            limit: Option<NonZeroU32>,
            window: Option<WrittenWindow>,
            burst: Option<NonZeroU32>,
            throttle_from: Option<u32>,
            throttle_delay: Option<HumanDuration>,
            throttle_step: Option<NonZeroU32>,
            throttle_max_delay: Option<HumanDuration>,
            queue: Option<u32>,
            cost: Option<NonZeroU32>,
            cost_from: Option<RawCostFrom>,
        }

        impl $name {
            /// The limit written, `None` if the record sets none of its fields; a
            /// calendar window turns in `zone` (UTC if `None`).
            fn limit_spec(&self, zone: Option<&Zone>) -> Result<Option<LimitSpec>, String> {
                let (Some(limit), Some(window)) = (self.limit, self.window) else {
                    let any = self.algorithm.is_some()
                        || self.limit.is_some()
                        || self.window.is_some()
                        || self.burst.is_some()
                        || self.throttle_from.is_some()
                        || self.throttle_delay.is_some()
                        || self.throttle_step.is_some()
                        || self.throttle_max_delay.is_some()
                        || self.queue.is_some()
                        || self.cost.is_some()
                        || self.cost_from.is_some();
                    return if any { Err("a limit needs both limit and window".to_owned()) } else { Ok(None) };
                };
                let (window, calendar) = match window {
                    WrittenWindow::Length(length) => (length.0, None),
                    WrittenWindow::Calendar(period) => {
                        (period.nominal(), Some(Calendar { period, zone: zone.cloned().unwrap_or_default() }))
                    }
                };
                // A calendar window counts in fixed windows, and only there.
                let algorithm = self.algorithm.unwrap_or(if calendar.is_some() { Algorithm::FixedWindow } else { Algorithm::default() });
                let options = LimitOptions {
                    burst: self.burst,
                    throttle_from: self.throttle_from,
                    throttle_delay: self.throttle_delay.map(|d| d.0),
                    throttle_step: self.throttle_step,
                    throttle_max_delay: self.throttle_max_delay.map(|d| d.0),
                    queue: self
                        .queue
                        .map(|queue| NonZeroU32::new(queue).ok_or_else(|| "a leaky_bucket's queue must be at least 1".to_owned()))
                        .transpose()?,
                    calendar,
                    cost: match (self.cost, &self.cost_from) {
                        (None, None) => Cost::default(),
                        (Some(units), None) => Cost::Units(units),
                        (None, Some(from)) => Cost::From(from.checked()?),
                        (Some(_), Some(_)) => return Err(limiter_core::SpecError::CostAndCostFrom.to_string()),
                    },
                };
                LimitSpec::new(algorithm, limit, window, options).map(Some).map_err(|error| error.to_string())
            }
        }
    };
}

/// `cost_from = { response_header = "…", max = N, strip = true }` or
/// `{ upstream_ms = true, max = N }` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCostFrom {
    response_header: Option<String>,
    #[serde(default)]
    upstream_ms: bool,
    max: Option<NonZeroU32>,
    strip: Option<bool>,
}

impl RawCostFrom {
    fn checked(&self) -> Result<CostFrom, String> {
        let max = self.max.ok_or("cost_from needs max: the most units one request is charged")?;
        let source = match (&self.response_header, self.upstream_ms) {
            (Some(name), false) => CostSource::ResponseHeader {
                name: http::HeaderName::try_from(name.as_str())
                    .map_err(|_| format!("cost_from.response_header: `{name}` is not a header name"))?,
                strip: self.strip.unwrap_or(true),
            },
            (None, true) if self.strip.is_some() => {
                return Err("cost_from.strip goes with response_header: upstream_ms reads no header".to_owned());
            }
            (None, true) => CostSource::UpstreamMs,
            (Some(_), true) => return Err("cost_from takes response_header or upstream_ms = true, not both".to_owned()),
            (None, false) => return Err("cost_from needs response_header = \"…\" or upstream_ms = true".to_owned()),
        };
        Ok(CostFrom { source, max })
    }
}

/// A limit's `window` as written: a length (`"1m"`), or a calendar period (`"month"`).
#[derive(Clone, Copy, Debug)]
enum WrittenWindow {
    Length(HumanDuration),
    Calendar(Period),
}

impl<'de> Deserialize<'de> for WrittenWindow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if let Ok(period) = text.parse() {
            return Ok(Self::Calendar(period));
        }
        HumanDuration::parse(&text).map(Self::Length).map_err(|error| {
            de::Error::custom(format!("{error}; or a calendar window: \"day\", \"week\" or \"month\""))
        })
    }
}

/// `calendar_tz`: the zone a record's calendar windows turn in.
fn calendar_zone(calendar_tz: Option<&str>) -> Result<Option<Zone>, String> {
    calendar_tz.map(Zone::named).transpose().map_err(|error| error.to_string())
}

/// `calendar_tz` set where no window turns on the calendar would change nothing.
const ZONE_WITHOUT_CALENDAR: &str = "calendar_tz goes with a window of \"day\", \"week\" or \"month\"";

with_limit! {
    /// A plan's whole record.
    struct RawPlan {
        disclose: Option<Disclose>,
        priority: Option<u8>,
        refusal: Option<RefusalAdvice>,
        calendar_tz: Option<String>,
        limits: Option<Vec<RawPlanLimit>>,
    }
}

with_limit! {
    /// One entry of a plan's `limits`.
    struct RawPlanLimit {
        name: String,
    }
}

/// One `[proxy.plans.NAME]`: the limits every request of its keys is counted in.
#[derive(Clone, Debug, Deserialize, PartialEq, Changes)]
#[serde(try_from = "RawPlan")]
pub struct Plan {
    /// One at least: the plan's own `limit` and `window`, or its `limits` list.
    pub limits: Vec<PlanLimit>,
    /// What the rate-limit headers tell this plan's clients, instead of `proxy.disclose`.
    #[changes(unset = "proxy.disclose")]
    pub disclose: Option<Disclose>,
    /// Where its requests stand in `[proxy.upstream_capacity]`'s queue: lower first.
    pub priority: u8,
    /// What a 429 this plan refuses tells the client to do.
    pub refusal: Option<RefusalAdvice>,
}

/// One of a plan's limits.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanLimit {
    /// Its name in `limits`; `None` for a plan written with one `limit` and `window`,
    /// which goes by the plan's name.
    pub name: Option<String>,
    pub spec: LimitSpec,
}

shown!(PlanLimit => |quota| match &quota.name {
    Some(name) => format!("{name}: {}", describe_limit(&quota.spec)),
    None => describe_limit(&quota.spec),
});

impl TryFrom<RawPlan> for Plan {
    type Error = String;

    fn try_from(raw: RawPlan) -> Result<Self, String> {
        let zone = calendar_zone(raw.calendar_tz.as_deref())?;
        let limits = match (raw.limit_spec(zone.as_ref())?, &raw.limits) {
            (Some(spec), None) => vec![PlanLimit { name: None, spec }],
            (Some(_), Some(_)) => {
                return Err("a plan has limit and window, or a list of limits = [ … ], not both".to_owned());
            }
            (None, None) => {
                return Err("a plan needs limit and window, or limits = [ { name, limit, window }, … ]".to_owned());
            }
            (None, Some(written)) if written.is_empty() => return Err("limits lists at least one limit".to_owned()),
            (None, Some(written)) => {
                let mut limits: Vec<PlanLimit> = Vec::with_capacity(written.len());
                for (i, quota) in written.iter().enumerate() {
                    let name = quota.name.clone();
                    if name.is_empty() {
                        return Err(format!("limits[{i}] needs a name"));
                    }
                    if limits.iter().any(|other| other.name.as_ref() == Some(&name)) {
                        return Err(format!("limit name `{name}` appears twice in limits"));
                    }
                    let spec = quota
                        .limit_spec(zone.as_ref())
                        .and_then(|spec| spec.ok_or_else(|| "a limit needs both limit and window".to_owned()))
                        .map_err(|message| format!("limits[{i}] (`{name}`): {message}"))?;
                    limits.push(PlanLimit { name: Some(name), spec });
                }
                limits
            }
        };
        if zone.is_some() && limits.iter().all(|quota| quota.spec.calendar.is_none()) {
            return Err(ZONE_WITHOUT_CALENDAR.to_owned());
        }
        Ok(Self {
            limits,
            disclose: raw.disclose,
            priority: raw.priority.unwrap_or(DEFAULT_PLAN_PRIORITY),
            refusal: raw.refusal,
        })
    }
}

impl Plan {
    /// Each limit with the name its policy goes by: the plan's own for a plan of one
    /// unnamed limit, `PLAN.LIMIT` for an entry of `limits`.
    pub fn named_limits<'a>(&'a self, plan: &'a str) -> impl Iterator<Item = (String, &'a LimitSpec)> + 'a {
        self.limits.iter().map(move |quota| match &quota.name {
            Some(name) => (format!("{plan}.{name}"), &quota.spec),
            None => (plan.to_owned(), &quota.spec),
        })
    }
}

/// `refusal = { detail, link }` on a plan or a limit rule: what the 429 it refuses
/// with tells the client to do (its `detail` and `"upgrade"`, and `Link: <link>;
/// rel="upgrade"`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawRefusalAdvice")]
pub struct RefusalAdvice {
    /// The problem's `detail` instead of the generic one.
    pub detail: Option<String>,
    /// An absolute `http(s)` URL, checked to be safe in a header (visible ASCII, no
    /// `<` or `>`).
    pub link: Option<String>,
}

/// `refusal` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRefusalAdvice {
    detail: Option<String>,
    link: Option<String>,
}

/// The longest `refusal.detail`: a sentence or two, not a page in every 429.
const MAX_REFUSAL_DETAIL: usize = 1024;

impl TryFrom<RawRefusalAdvice> for RefusalAdvice {
    type Error = String;

    fn try_from(raw: RawRefusalAdvice) -> Result<Self, String> {
        if raw.detail.is_none() && raw.link.is_none() {
            return Err("refusal needs a detail or a link (or neither key, and no refusal)".to_owned());
        }
        if let Some(detail) = &raw.detail
            && (detail.is_empty() || detail.len() > MAX_REFUSAL_DETAIL || detail.chars().any(char::is_control))
        {
            return Err(format!(
                "refusal.detail must be 1 to {MAX_REFUSAL_DETAIL} bytes of text without control characters"
            ));
        }
        if let Some(link) = &raw.link {
            check_link(link).map_err(|why| format!("refusal.link `{}`: {why}", link.escape_debug()))?;
        }
        Ok(Self { detail: raw.detail, link: raw.link })
    }
}

/// An absolute `http(s)` URL that goes into a `Link` header as it is: visible ASCII
/// (no CR or LF to split the header, no space), no `<` or `>` to end its brackets.
fn check_link(link: &str) -> Result<(), &'static str> {
    if !link.bytes().all(|byte| byte.is_ascii_graphic()) || link.contains(['<', '>']) {
        return Err("must be visible ASCII without spaces, CR, LF, < or > (percent-encode them)");
    }
    let uri: http::Uri = link.parse().map_err(|_| "is not a URL")?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(()),
        _ => Err("must be an absolute http:// or https:// URL"),
    }
}

/// How much the rate-limit headers and refusals tell a client about the policies.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum Disclose {
    /// Every policy that counted the request, by name, with its quota; the names of
    /// the ones that refused it.
    Full,
    /// The most restrictive policy only, under a neutral name; no names in refusals.
    #[default]
    Minimal,
    /// `Retry-After` on a 429 and nothing else.
    None,
}

fn some_algorithm<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Algorithm>, D::Error> {
    String::deserialize(deserializer)?.parse().map(Some).map_err(de::Error::custom)
}

fn escaped_slashes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<EscapedSlashes, D::Error> {
    String::deserialize(deserializer)?.parse().map_err(de::Error::custom)
}

/// `redis_url`'s topology.
#[derive(Debug, PartialEq, Eq)]
pub enum RedisUrl {
    Single,
    /// `redis+sentinel://host:port,…/MASTER`: the Sentinels' `redis://` URLs.
    Sentinel {
        nodes: Vec<String>,
        master: String,
    },
    /// `redis+cluster://host:port,…/` (`rediss+cluster://` with TLS): the seed nodes'
    /// `redis://` (`rediss://`) URLs.
    Cluster {
        nodes: Vec<String>,
    },
}

impl RedisUrl {
    /// Which topology `url` names (its hosts are checked when connecting).
    #[must_use]
    pub fn parse(url: &str) -> Self {
        let hosts = |scheme: &str, list: &str| {
            list.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{h}/")).collect()
        };
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (list, master) = rest.split_once('/').unwrap_or((rest, ""));
            Self::Sentinel { nodes: hosts("redis", list), master: master.trim_end_matches('/').to_owned() }
        } else if let Some(rest) = url.strip_prefix("redis+cluster://") {
            Self::Cluster { nodes: hosts("redis", rest.trim_end_matches('/')) }
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            Self::Cluster { nodes: hosts("rediss", rest.trim_end_matches('/')) }
        } else {
            Self::Single
        }
    }
}

/// One `[[proxy.keys]]`: an API key, its plan and its signing secrets.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub id: String,
    pub plan: String,
    /// `file:PATH` or `env:NAME` references; several for rotation.
    #[serde(default)]
    #[changes(redacted)]
    pub secrets: Vec<String>,
    /// What proves that a request is this key's, and so may spend its plan.
    #[serde(default)]
    pub auth: KeyAuth,
    /// The key's signatures also cover the `Host` header (lowercased), so that a request
    /// signed for one site does not verify on another behind the same keys.
    #[serde(default)]
    pub sign_host: bool,
    /// The `[[proxy.scopes]]` the key holds; `None`: every one.
    #[changes(unset = "every scope")]
    pub scopes: Option<Vec<String>>,
}

impl Keyed for ApiKey {
    fn id(&self) -> String {
        self.id.clone()
    }
}

impl ApiKey {
    /// Whether the key holds the scope named `scope`.
    #[must_use]
    pub fn holds(&self, scope: &str) -> bool {
        self.scopes.as_ref().is_none_or(|held| held.iter().any(|name| name == scope))
    }
}

/// One `[[proxy.scopes]]`: an area of routes that only a proven key holding the scope
/// may call.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawScope")]
pub struct Scope {
    pub name: String,
    /// Path prefixes of the area, matched as a rule's `path`.
    pub paths: Vec<String>,
    /// Methods of the area (all if empty), as [`crate::methods`] tells which a request
    /// may be served as.
    pub methods: Vec<http::Method>,
}

impl Keyed for Scope {
    fn id(&self) -> String {
        self.name.clone()
    }
}

/// One `[[proxy.scopes]]` record.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScope {
    name: String,
    paths: Vec<String>,
    #[serde(default)]
    methods: Vec<String>,
}

impl TryFrom<RawScope> for Scope {
    type Error = String;

    fn try_from(raw: RawScope) -> Result<Self, String> {
        let in_scope = |message: String| format!("scope `{}`: {message}", raw.name);
        if raw.name.is_empty() {
            return Err("a scope needs a name".to_owned());
        }
        if raw.paths.is_empty() {
            return Err(in_scope("a scope needs paths, or its area would be empty".to_owned()));
        }
        if let Some(path) = raw.paths.iter().find(|path| !path.starts_with('/')) {
            return Err(in_scope(format!("path `{path}` must start with /")));
        }
        let methods = parse_methods(&raw.methods).map_err(in_scope)?;
        Ok(Self { name: raw.name, paths: raw.paths, methods })
    }
}

impl Scope {
    /// Whether a request is in the scope's area: one of its paths is a prefix of the
    /// route, and the request may be served as one of its methods.
    #[must_use]
    pub fn covers(&self, seen: &Seen<'_>) -> bool {
        self.paths.iter().any(|prefix| path_has_prefix(seen.path, prefix))
            && (self.methods.is_empty() || crate::methods::served_as_any(seen, &self.methods))
    }
}

/// `auth` of a `[[proxy.keys]]`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, Changes)]
#[serde(rename_all = "snake_case")]
pub enum KeyAuth {
    /// A valid signature (key ids are not secrets).
    #[default]
    Signature,
    /// `X-API-Key` alone: the key id is a bearer secret. Weaker: anyone who sees one
    /// request can spend the key's quota.
    Bearer,
}

/// What a rule counts requests by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Changes)]
#[changes(display)]
pub struct KeySpec {
    /// What the key is made of: one kind, or a composite (`key = ["ip",
    /// "header:x-tenant"]`) that every part must be present for.
    pub parts: Vec<KeyKind>,
    /// `+route`: count per rule path as well.
    pub per_route: bool,
    /// `key_fold`: how the values a client sends are folded first.
    pub fold: KeyFold,
}

impl KeySpec {
    /// A key of one kind.
    #[must_use]
    pub fn of(kind: KeyKind) -> Self {
        Self { parts: vec![kind], per_route: false, fold: KeyFold::None }
    }

    /// Whether the key is this one kind alone.
    #[must_use]
    pub fn is(&self, kind: &KeyKind) -> bool {
        matches!(self.parts.as_slice(), [only] if only == kind)
    }

    /// Whether some part needs the key a request proves (`api_key`).
    #[must_use]
    pub fn needs_proof(&self) -> bool {
        self.parts.contains(&KeyKind::ApiKey)
    }

    /// Whether some part is a claim of the request's JWT (`jwt:`).
    #[must_use]
    pub fn needs_token(&self) -> bool {
        self.parts.iter().any(|part| matches!(part, KeyKind::Jwt(_)))
    }

    /// Whether some part is the client's TLS fingerprint (`ja4`).
    #[must_use]
    pub fn needs_fingerprint(&self) -> bool {
        self.parts.contains(&KeyKind::Ja4)
    }

    /// Whether some part is read from the body (`json:`, `form:`).
    #[must_use]
    pub fn needs_body(&self) -> bool {
        self.parts.iter().any(KeyKind::in_body)
    }
}

/// `key_fold` of a rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Changes)]
#[serde(rename_all = "snake_case")]
pub enum KeyFold {
    /// Values as sent.
    #[default]
    None,
    /// Values in lower case, so that `Alice` and `alice` share a bucket.
    Lower,
}

/// One part of a [`KeySpec`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The client address (IPv6 per /64).
    Ip,
    /// A known `X-API-Key`.
    ApiKey,
    /// The value of a request header (lower-case name).
    Header(http::HeaderName),
    /// A query parameter, percent-decoded; its first occurrence.
    Query(String),
    /// A cookie.
    Cookie(String),
    /// A member of a JSON body.
    Json(JsonPointer),
    /// A field of an `application/x-www-form-urlencoded` body.
    Form(String),
    /// A claim of the request's JWT, if it verified (`[proxy.jwt]`).
    Jwt(String),
    /// The JA4 fingerprint of the client's TLS handshake (`[proxy.tls] fingerprint`,
    /// or `ja4_header` from a trusted proxy).
    Ja4,
}

impl KeyKind {
    /// Read from the body, which is then read for it (up to `[proxy.body_keys]`).
    #[must_use]
    pub fn in_body(&self) -> bool {
        matches!(self, Self::Json(_) | Self::Form(_))
    }

    /// Whether its value is whatever the client chooses to send (what `key_fold`
    /// folds), rather than its address, a key it proved or a claim of a token it
    /// proved.
    #[must_use]
    pub fn client_chosen(&self) -> bool {
        !matches!(self, Self::Ip | Self::ApiKey | Self::Jwt(_))
    }
}

impl fmt::Display for KeyKind {
    /// The name a rule's `key` is written with, which [`KeyKind::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip => f.write_str("ip"),
            Self::ApiKey => f.write_str("api_key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::Cookie(name) => write!(f, "cookie:{name}"),
            Self::Json(pointer) => write!(f, "json:{pointer}"),
            Self::Form(name) => write!(f, "form:{name}"),
            Self::Jwt(claim) => write!(f, "jwt:{claim}"),
            Self::Ja4 => f.write_str("ja4"),
        }
    }
}

/// Why a rule's `key` names no key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "`{0}` is not a key: use ip, api_key, ja4, header:NAME, query:NAME, cookie:NAME, json:/POINTER, form:NAME \
         or jwt:CLAIM, optionally with +route"
    )]
    Unknown(String),
    #[error("`{text}`: {error} (RFC 6901)")]
    Pointer { text: String, error: PointerError },
    #[error("a composite key lists at least one part")]
    EmptyComposite,
    #[error("`{0}` is listed twice in the key")]
    Repeated(String),
}

impl FromStr for KeyKind {
    type Err = KeyError;

    fn from_str(text: &str) -> Result<Self, KeyError> {
        let unknown = || KeyError::Unknown(text.to_owned());
        let named = |name: &str| if name.is_empty() { Err(unknown()) } else { Ok(name.to_owned()) };
        match text.split_once(':') {
            None if text == "ip" => Ok(Self::Ip),
            None if text == "api_key" => Ok(Self::ApiKey),
            None if text == "ja4" => Ok(Self::Ja4),
            Some(("header", name)) => http::HeaderName::try_from(name).map(Self::Header).map_err(|_| unknown()),
            Some(("query", name)) => named(name).map(Self::Query),
            Some(("cookie", name)) => named(name).map(Self::Cookie),
            Some(("form", name)) => named(name).map(Self::Form),
            Some(("jwt", claim)) => named(claim).map(Self::Jwt),
            Some(("json", pointer)) => {
                pointer.parse().map(Self::Json).map_err(|error| KeyError::Pointer { text: text.to_owned(), error })
            }
            _ => Err(unknown()),
        }
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts.as_slice() {
            [only] => write!(f, "{only}")?,
            parts => {
                let parts: Vec<String> = parts.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", parts.join(", "))?;
            }
        }
        f.write_str(if self.per_route { "+route" } else { "" })?;
        match self.fold {
            KeyFold::None => Ok(()),
            KeyFold::Lower => f.write_str(" folded to lower case"),
        }
    }
}

/// A rule's `key` as written: one kind, or the parts of a composite.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum WrittenKey {
    One(String),
    Composite(Vec<String>),
}

impl TryFrom<WrittenKey> for KeySpec {
    type Error = KeyError;

    fn try_from(written: WrittenKey) -> Result<Self, KeyError> {
        let written = match written {
            WrittenKey::One(text) => vec![text],
            WrittenKey::Composite(parts) if parts.is_empty() => return Err(KeyError::EmptyComposite),
            WrittenKey::Composite(parts) => parts,
        };
        let mut spec = Self { parts: Vec::with_capacity(written.len()), per_route: false, fold: KeyFold::None };
        for text in &written {
            let kind = match text.strip_suffix("+route") {
                Some(kind) => {
                    spec.per_route = true;
                    kind
                }
                None => text.as_str(),
            };
            let kind: KeyKind = kind.parse()?;
            if spec.parts.contains(&kind) {
                return Err(KeyError::Repeated(kind.to_string()));
            }
            spec.parts.push(kind);
        }
        Ok(spec)
    }
}

/// One `[[proxy.rules]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawRule")]
pub struct Rule {
    pub name: String,
    /// Path prefix the rule applies to (all paths if absent).
    pub path: Option<String>,
    /// Methods the rule applies to (all if empty), as [`crate::methods`] tells which
    /// a request may be served as.
    pub methods: Vec<http::Method>,
    /// `when`: what else a request must show for the rule to apply.
    pub when: Conditions,
    #[changes(flatten)]
    pub action: RuleAction,
    /// What a limit counts by (`ip` for `deny` and `tag`, which count nothing).
    pub key: KeySpec,
    pub require_signature: bool,
    /// A `deny` rule's refusals count towards escalation: only for a rule nothing but
    /// the client itself makes it break (a third party can make a browser send almost
    /// any path).
    pub escalate: bool,
    /// A limit rule's requests keep their unit only for these answers of the upstream.
    pub count_when: Option<CountWhen>,
    /// How many of its requests each key may have in flight, and how many more wait.
    pub concurrency: Option<Concurrency>,
    /// What a 429 this rule refuses tells the client to do.
    pub refusal: Option<RefusalAdvice>,
    /// `plans`: the rule counts only requests proving a key on one of these plans;
    /// empty: every request.
    pub plans: Vec<String>,
}

/// A rule's `concurrency`, `queue` and `queue_timeout`: each key's requests in flight
/// (forwarded, their response not yet finished), and how many more may wait for one of
/// them to end, for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Changes)]
pub struct Concurrency {
    pub limit: NonZeroU32,
    /// Waiting beyond `limit`; more are refused at once.
    pub queue: u32,
    /// Longest wait in the queue; then refused.
    pub queue_timeout: HumanDuration,
}

/// `queue_timeout` unless set: long enough to ride out a burst, short next to a
/// client's own timeout.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(1);

/// `[proxy.upstream_capacity]`: the upstream's requests in flight, over every client,
/// and the queue before them. `concurrency` is there unless `[proxy.adaptive]` moves
/// the limit instead (checked with the whole config).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(try_from = "RawUpstreamCapacity")]
pub struct UpstreamCapacity {
    #[changes(unset = "[proxy.adaptive]")]
    pub concurrency: Option<NonZeroU32>,
    /// Waiting beyond the limit; more are refused at once.
    pub queue: u32,
    /// Longest wait in the queue; then refused.
    pub queue_timeout: HumanDuration,
}

/// `[proxy.upstream_capacity]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreamCapacity {
    concurrency: Option<NonZeroU32>,
    queue: Option<u32>,
    queue_timeout: Option<HumanDuration>,
}

impl TryFrom<RawUpstreamCapacity> for UpstreamCapacity {
    type Error = String;

    fn try_from(raw: RawUpstreamCapacity) -> Result<Self, String> {
        // Checked as a rule's queue is; the limit does not bear on it.
        let Concurrency { queue, queue_timeout, .. } = Concurrency::new(NonZeroU32::MIN, raw.queue, raw.queue_timeout)?;
        Ok(Self { concurrency: raw.concurrency, queue, queue_timeout })
    }
}

/// `[proxy.adaptive]`: the bounds the upstream's limit moves between, what counts as
/// a loss, and each plan's guaranteed share of the limit.
#[derive(Clone, Debug, Deserialize, PartialEq, Changes)]
#[serde(try_from = "RawAdaptive")]
pub struct AdaptiveConfig {
    /// `algorithm`, `min_limit`, `max_limit`, `initial_limit` and `tolerance`: a
    /// change starts the limit again from `initial_limit`.
    pub settings: adaptive::Settings,
    /// The upstream's answers that count as losses (`count_when`'s entries).
    pub losses: Vec<StatusMatch>,
    /// `[proxy.adaptive.shares]`: by plan name (or `keyless`), the part of the limit
    /// its requests are guaranteed; checked against the plans with the whole config.
    pub shares: BTreeMap<String, f64>,
    /// `[proxy.adaptive.kernel] tighten_new_sources`: what `[xdp.new_sources]` is
    /// scaled by while the upstream has been shedding for a while; `None`: kept.
    pub tighten_new_sources: Option<f64>,
}

/// The class of `[proxy.adaptive.shares]` that requests proving no key are in.
pub const KEYLESS_SHARE: &str = "keyless";

/// `algorithm` as written.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawAlgorithm {
    #[default]
    Gradient2,
    Aimd,
}

/// `[proxy.adaptive]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdaptive {
    #[serde(default)]
    algorithm: RawAlgorithm,
    #[serde(default = "default_min_limit")]
    min_limit: u32,
    #[serde(default = "default_max_limit")]
    max_limit: u32,
    #[serde(default = "default_initial_limit")]
    initial_limit: u32,
    #[serde(default = "default_tolerance")]
    tolerance: f64,
    losses: Option<Vec<RawStatus>>,
    #[serde(default)]
    shares: BTreeMap<String, f64>,
    kernel: Option<RawAdaptiveKernel>,
}

/// `[proxy.adaptive.kernel]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdaptiveKernel {
    tighten_new_sources: f64,
}

fn default_min_limit() -> u32 {
    8
}

fn default_max_limit() -> u32 {
    1024
}

fn default_initial_limit() -> u32 {
    64
}

fn default_tolerance() -> f64 {
    1.5
}

impl TryFrom<RawAdaptive> for AdaptiveConfig {
    type Error = String;

    fn try_from(raw: RawAdaptive) -> Result<Self, String> {
        let algorithm = match raw.algorithm {
            RawAlgorithm::Gradient2 => adaptive::Algorithm::Gradient2,
            RawAlgorithm::Aimd => adaptive::Algorithm::Aimd,
        };
        let settings =
            adaptive::Settings::new(algorithm, raw.min_limit, raw.max_limit, raw.initial_limit, raw.tolerance)
                .map_err(|error| error.to_string())?;
        let losses = match &raw.losses {
            Some(losses) => count_when::statuses(losses).map_err(|error| format!("losses: {error}"))?,
            None => vec![StatusMatch::Class(5), StatusMatch::Timeout],
        };
        let tighten_new_sources = raw.kernel.map(|kernel| kernel.tighten_new_sources);
        if let Some(factor) = tighten_new_sources
            && !(factor > 0.0 && factor <= 1.0)
        {
            return Err(format!("kernel.tighten_new_sources = {factor} must be more than 0 and at most 1"));
        }
        Ok(Self { settings, losses, shares: raw.shares, tighten_new_sources })
    }
}

impl Concurrency {
    /// `limit` in flight, with `queue` (default 0) waiting up to `queue_timeout`
    /// ([`DEFAULT_QUEUE_TIMEOUT`]).
    fn new(limit: NonZeroU32, queue: Option<u32>, queue_timeout: Option<HumanDuration>) -> Result<Self, String> {
        let queue = queue.unwrap_or(0);
        let queue_timeout = queue_timeout.unwrap_or(HumanDuration(DEFAULT_QUEUE_TIMEOUT));
        if queue > 0 && queue_timeout.0.is_zero() {
            return Err("queue_timeout must be longer than 0 (or queue = 0, to refuse at once)".to_owned());
        }
        Ok(Self { limit, queue, queue_timeout })
    }
}

/// A plan's `priority` unless set: `[proxy.upstream_capacity]`'s queue serves lower
/// first.
pub const DEFAULT_PLAN_PRIORITY: u8 = 10;

/// The `priority` of a request that proved no key.
pub const KEYLESS_PRIORITY: u8 = 20;

impl Keyed for Rule {
    fn id(&self) -> String {
        self.name.clone()
    }
}

/// What a rule does with the requests it applies to.
#[derive(Clone, Debug, PartialEq, Eq, Changes)]
pub enum RuleAction {
    /// Counts them in a bucket per key.
    Limit(LimitSpec),
    /// Refuses them with 403.
    Deny,
    /// Counts and logs them, and lets them through (to try a deny rule out).
    Tag,
    /// Counts no rate: only bounds each key's requests in flight (`concurrency`).
    Concurrent,
}

impl RuleAction {
    /// The limit of a `limit` rule.
    #[must_use]
    pub const fn limit(&self) -> Option<&LimitSpec> {
        match self {
            Self::Limit(spec) => Some(spec),
            Self::Deny | Self::Tag | Self::Concurrent => None,
        }
    }
}

with_limit! {
    /// One `[[proxy.rules]]` record.
    struct RawRule {
        name: String,
        path: Option<String>,
        #[serde(default)]
        methods: Vec<String>,
        action: Option<String>,
        #[serde(default)]
        when: RawConditions,
        key: Option<WrittenKey>,
        #[serde(default)]
        key_fold: KeyFold,
        #[serde(default)]
        require_signature: bool,
        #[serde(default)]
        escalate: bool,
        count_when: Option<RawCountWhen>,
        concurrency: Option<NonZeroU32>,
        queue_timeout: Option<HumanDuration>,
        refusal: Option<RefusalAdvice>,
        calendar_tz: Option<String>,
        plans: Option<Vec<String>>,
    }
}

impl TryFrom<RawRule> for Rule {
    type Error = String;

    fn try_from(mut raw: RawRule) -> Result<Self, String> {
        let name = raw.name.clone();
        let in_rule = |message: String| format!("rule `{name}`: {message}");
        if raw.name.is_empty() {
            return Err("a rule needs a name".to_owned());
        }
        let concurrency = raw.concurrency(&in_rule)?;
        if let Some(path) = &raw.path
            && !path.starts_with('/')
        {
            return Err(in_rule(format!("path `{path}` must start with /")));
        }
        let methods = parse_methods(&raw.methods).map_err(in_rule)?;
        let zone = calendar_zone(raw.calendar_tz.as_deref()).map_err(in_rule)?;
        let limit = raw.limit_spec(zone.as_ref()).map_err(in_rule)?;
        if zone.is_some() && limit.as_ref().is_none_or(|spec| spec.calendar.is_none()) {
            return Err(in_rule(ZONE_WITHOUT_CALENDAR.to_owned()));
        }
        let key = raw.key.clone().map(KeySpec::try_from).transpose().map_err(|error| in_rule(error.to_string()))?;
        let (action, key) = match (raw.action.as_deref(), limit, key) {
            (None | Some("limit"), Some(spec), Some(key)) => {
                (RuleAction::Limit(spec), KeySpec { fold: raw.key_fold, ..key })
            }
            (None | Some("limit"), None, Some(key)) if concurrency.is_some() => {
                (RuleAction::Concurrent, KeySpec { fold: raw.key_fold, ..key })
            }
            (None | Some("limit"), Some(_), None) => return Err(in_rule("a limit rule needs a key".to_owned())),
            (None | Some("limit"), None, None) if concurrency.is_some() => {
                return Err(in_rule("a concurrency rule needs a key".to_owned()));
            }
            (None | Some("limit"), None, _) => {
                return Err(in_rule(
                    "a limit rule needs limit and window, or concurrency (or action = \"deny\" or \"tag\")".to_owned(),
                ));
            }
            (Some(action @ ("deny" | "tag")), None, None) if concurrency.is_none() => {
                let action = if action == "deny" { RuleAction::Deny } else { RuleAction::Tag };
                (action, KeySpec { fold: raw.key_fold, ..KeySpec::of(KeyKind::Ip) })
            }
            (Some(action @ ("deny" | "tag")), _, _) => {
                return Err(in_rule(format!(
                    "action = \"{action}\" counts nothing: it takes no limit, no concurrency and no key"
                )));
            }
            (Some(other), _, _) => {
                return Err(in_rule(format!("action `{other}` is not limit, deny or tag")));
            }
        };
        if key.fold != KeyFold::None && !key.parts.iter().any(KeyKind::client_chosen) {
            return Err(in_rule(format!(
                "key_fold folds what a client sends: key = \"{key}\" has no header:, query:, cookie:, json: or form: part"
            )));
        }
        if raw.require_signature && (!key.needs_proof() || !matches!(action, RuleAction::Limit(_))) {
            return Err(in_rule(
                "require_signature needs a limit rule with key = \"api_key\" (or \"api_key+route\")".to_owned(),
            ));
        }
        if raw.escalate && action != RuleAction::Deny {
            return Err(in_rule(
                "escalate needs action = \"deny\": limits escalate by whose bucket refused".to_owned(),
            ));
        }
        if matches!(action, RuleAction::Deny | RuleAction::Tag) && raw.plans.is_some() {
            return Err(in_rule(
                "plans needs a limit or concurrency rule: deny and tag rules screen requests before their key is proven"
                    .to_owned(),
            ));
        }
        if raw.plans.as_ref().is_some_and(Vec::is_empty) {
            return Err(in_rule("plans lists at least one plan (leave it out to count every request)".to_owned()));
        }
        let when = Conditions::try_from(raw.when).map_err(in_rule)?;
        let count_when = raw.count_when.map(CountWhen::try_from).transpose().map_err(in_rule)?;
        if count_when.is_some() && action.limit().is_some_and(|spec| spec.cost.post_paid().is_some()) {
            return Err(in_rule(
                "count_when and cost_from: a post-paid request takes nothing to give back at admission, and is \
                 charged what its answer says"
                    .to_owned(),
            ));
        }
        if count_when.is_some() && !matches!(action, RuleAction::Limit(_)) {
            return Err(in_rule(
                "count_when needs a limit rule with limit and window: deny and tag rules count nothing, and \
                 concurrency gives its unit back when the response ends"
                    .to_owned(),
            ));
        }
        if raw.refusal.is_some() && !matches!(action, RuleAction::Limit(_)) {
            return Err(in_rule(
                "refusal needs a limit rule with limit and window: it is what that limit's 429 says".to_owned(),
            ));
        }
        Ok(Self {
            name: raw.name,
            path: raw.path,
            methods,
            when,
            action,
            key,
            require_signature: raw.require_signature,
            escalate: raw.escalate,
            count_when,
            concurrency,
            refusal: raw.refusal,
            plans: raw.plans.unwrap_or_default(),
        })
    }
}

impl RawRule {
    /// The rule's `concurrency` with its `queue` and `queue_timeout`, taking the
    /// `queue` from the limit: on a rule with `concurrency` it is the concurrency's
    /// (where it would be a leaky bucket's too, it is refused as ambiguous).
    fn concurrency(&mut self, in_rule: &dyn Fn(String) -> String) -> Result<Option<Concurrency>, String> {
        let leaky = self.algorithm == Some(Algorithm::LeakyBucket);
        let Some(limit) = self.concurrency else {
            if self.queue_timeout.is_some() {
                return Err(in_rule("queue_timeout needs concurrency".to_owned()));
            }
            if self.queue.is_some() && !leaky {
                return Err(in_rule(
                    "queue needs concurrency (requests waiting for one in flight to end), or algorithm = \
                     \"leaky_bucket\" (a queue released at the rate)"
                        .to_owned(),
                ));
            }
            return Ok(None);
        };
        if leaky && self.queue.is_some() {
            return Err(in_rule(
                "queue is ambiguous on a leaky_bucket rule with concurrency: the bucket's queue or the \
                 concurrency's? Split it into two rules"
                    .to_owned(),
            ));
        }
        Concurrency::new(limit, self.queue.take(), self.queue_timeout).map(Some).map_err(in_rule)
    }
}

impl Rule {
    /// Whether the rule counts requests of a key on `plan` (`None`: a request that
    /// proved no key).
    #[must_use]
    pub fn counts_plan(&self, plan: Option<&str>) -> bool {
        self.plans.is_empty() || plan.is_some_and(|plan| self.plans.iter().any(|name| name == plan))
    }

    /// Whether the rule applies to a request: its path, methods and `when`.
    #[must_use]
    pub fn applies(&self, seen: &Seen<'_>) -> bool {
        self.path.as_deref().is_none_or(|prefix| path_has_prefix(seen.path, prefix))
            && (self.methods.is_empty() || crate::methods::served_as_any(seen, &self.methods))
            && self.when.hold(seen)
    }

    /// The limit of a `limit` rule.
    #[must_use]
    pub fn limit(&self) -> Option<&LimitSpec> {
        self.action.limit()
    }
}

/// Methods as a rule or scope lists them, in any case.
fn parse_methods(methods: &[String]) -> Result<Vec<http::Method>, String> {
    methods
        .iter()
        .map(|m| {
            http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("`{m}` is not an HTTP method"))
        })
        .collect()
}

/// `/login` matches `/login`, `/login/` and `/login/x`, not `/loginx`.
fn path_has_prefix(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || rest.starts_with('?') || prefix.ends_with('/'),
        None => false,
    }
}

/// `[proxy.signature]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields, default)]
pub struct SignatureConfig {
    pub max_skew: HumanDuration,
    #[changes(restart)]
    pub idempotency_ttl: HumanDuration,
    /// Bound on remembered signatures (replay protection).
    #[changes(restart)]
    pub replay_cache_size: NonZeroUsize,
    /// Bound on stored idempotent responses.
    #[changes(restart)]
    pub idempotency_max_entries: NonZeroUsize,
    /// Responses larger than this are not stored for idempotent replay.
    #[changes(restart)]
    pub idempotency_max_body_bytes: usize,
    /// Bound on the idempotency store's memory (responses and keys), shared out
    /// equally among the configured keys.
    #[changes(restart)]
    pub idempotency_max_bytes: NonZeroUsize,
}

impl Default for SignatureConfig {
    fn default() -> Self {
        Self {
            max_skew: HumanDuration(Duration::from_secs(300)),
            idempotency_ttl: HumanDuration(Duration::from_secs(86_400)),
            replay_cache_size: NonZeroUsize::new(1_000_000).unwrap_or(NonZeroUsize::MIN),
            idempotency_max_entries: NonZeroUsize::new(100_000).unwrap_or(NonZeroUsize::MIN),
            idempotency_max_body_bytes: 65_536,
            // 1,024 responses at the largest stored size, or some 60,000 API-sized
            // (1 KiB) ones: the store stays a small part of an edge host's memory.
            idempotency_max_bytes: NonZeroUsize::new(64 << 20).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// `[proxy.jwt]`: the tokens clients prove themselves with. Secrets and JWKS files
/// are read with the config, at start and on every reload.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The header carrying `Bearer TOKEN` (or the bare token).
    #[serde(default = "authorization", deserialize_with = "header_name")]
    pub header: http::HeaderName,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_jwt_leeway")]
    pub leeway: HumanDuration,
    /// `file:PATH` or `env:NAME` references to the secrets of HS256, HS384 and HS512
    /// tokens; several for rotation.
    #[serde(default)]
    #[changes(redacted)]
    pub hs256_secrets: Vec<String>,
    /// The `iss` a token of `hs256_secrets` must carry; `None`: any.
    pub iss: Option<String>,
    /// The audiences a token of `hs256_secrets` must name one of (`aud`); empty: any.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Issuers of RS, PS, ES and EdDSA tokens, each picked by the token's `iss`.
    #[serde(default)]
    #[changes(keyed)]
    pub issuers: Vec<JwtIssuer>,
}

/// One `proxy.jwt.issuers` entry.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Changes)]
#[serde(deny_unknown_fields)]
pub struct JwtIssuer {
    pub iss: String,
    /// The audiences its tokens must name one of; empty: any.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Its public keys (a JWKS document), read again on reload and when it changes.
    pub jwks_file: std::path::PathBuf,
}

impl Keyed for JwtIssuer {
    fn id(&self) -> String {
        self.iss.clone()
    }
}

impl JwtConfig {
    fn validate(&self) -> Result<(), (String, String)> {
        if self.hs256_secrets.is_empty() && self.issuers.is_empty() {
            return Err(("proxy.jwt".to_owned(), "verifies no token: give hs256_secrets, issuers, or both".to_owned()));
        }
        if self.hs256_secrets.is_empty() && (self.iss.is_some() || !self.audiences.is_empty()) {
            return Err((
                "proxy.jwt.iss".to_owned(),
                "iss and audiences are what tokens of hs256_secrets must say, and there are none; an issuer's \
                 go in its issuers entry"
                    .to_owned(),
            ));
        }
        for (i, issuer) in self.issuers.iter().enumerate() {
            if issuer.iss.is_empty() || self.issuers[..i].iter().any(|other| other.iss == issuer.iss) {
                return Err((
                    format!("proxy.jwt.issuers[{i}].iss"),
                    format!("`{}` is empty or appears twice", issuer.iss),
                ));
            }
        }
        Ok(())
    }
}

fn authorization() -> http::HeaderName {
    http::header::AUTHORIZATION
}

fn header_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<http::HeaderName, D::Error> {
    let text = String::deserialize(deserializer)?;
    http::HeaderName::try_from(text.as_str()).map_err(|_| de::Error::custom(format!("`{text}` is not a header name")))
}

fn some_header_name<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<http::HeaderName>, D::Error> {
    header_name(deserializer).map(Some)
}

fn default_jwt_leeway() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

impl ProxyConfig {
    /// Whether requests may carry a TLS fingerprint: their handshake's, or a trusted
    /// proxy's `ja4_header`.
    #[must_use]
    pub fn fingerprints(&self) -> bool {
        self.ja4_header.is_some() || self.tls.as_ref().is_some_and(|tls| tls.fingerprint.is_some())
    }

    /// How request paths are canonicalised (see [`limiter_core::path`]).
    #[must_use]
    pub fn path_options(&self) -> PathOptions {
        PathOptions { escaped_slashes: self.escaped_slashes, case_insensitive: self.case_insensitive_paths() }
    }

    /// Whether rules see paths in lower case: `case_insensitive_paths`, by default yes.
    #[must_use]
    pub fn case_insensitive_paths(&self) -> bool {
        self.case_insensitive_paths.unwrap_or(PathOptions::default().case_insensitive)
    }

    /// What `limiter check` says of a config whose path rules match differently than
    /// before the default of `case_insensitive_paths` became `true`, or can be dodged
    /// by changing a letter's case.
    #[must_use]
    pub fn path_case_warnings(&self) -> Option<String> {
        let by_path = self.rules.iter().any(|rule| rule.path.is_some() || rule.when.path_matches.is_some());
        match self.case_insensitive_paths {
            _ if !by_path => None,
            None => Some(
                "proxy.case_insensitive_paths is not set, and its default is now true (it was false): rules now \
                 match paths in any case, so that `/API/TRANSFER` no longer skips a rule for `/api/transfer` on an \
                 upstream that folds case; set it to true to keep this, or to false if the upstream tells paths \
                 apart by case"
                    .to_owned(),
            ),
            Some(false) => Some(
                "proxy.case_insensitive_paths = false: a request that changes a letter's case (`/API/TRANSFER`) \
                 skips every path rule, which an upstream that folds case (Express, ASP.NET Core, IIS) then serves; \
                 keep it only if the upstream tells paths apart by case"
                    .to_owned(),
            ),
            Some(true) => None,
        }
    }

    /// The limits' verdict while the shared store is unreachable: `store_failure`, by
    /// default `local`.
    #[must_use]
    pub fn store_failure(&self) -> StoreFailure {
        self.store_failure.unwrap_or_default()
    }

    /// What `limiter check` says of a config on Redis that relied on the default of
    /// `store_failure` before it became `local`.
    #[must_use]
    pub fn store_failure_warning(&self) -> Option<String> {
        (self.store == StoreKind::Redis && self.store_failure.is_none()).then(|| {
            "proxy.store_failure is not set, and its default is now \"local\" (it was \"allow\"): while Redis \
             does not answer, each agent enforces its share of every limit instead of letting every request \
             through; set it to \"local\" to keep this, or to \"allow\" or \"deny\""
                .to_owned()
        })
    }

    /// The `refusal` a 429 carries when the policies `violated` (rules, then the plan
    /// of the key the request proved, `plan`) refused it: the first of them that has
    /// one. A refusing policy that is no rule is the plan's.
    #[must_use]
    pub fn refusal_advice(&self, violated: &[String], plan: Option<&str>) -> Option<&RefusalAdvice> {
        let plan = plan.and_then(|plan| self.plans.get(plan));
        violated.iter().find_map(|name| match self.rules.iter().find(|rule| rule.name == *name) {
            Some(rule) => rule.refusal.as_ref(),
            None => plan?.refusal.as_ref(),
        })
    }

    /// The first scope whose area a request is in that `key`, the key it proved, does
    /// not hold; for a keyless request (`None`), the first whose area it is in. A
    /// request needs every scope whose area it is in: with `methods` matched as every
    /// method it may be served as, holding any one of them would let a key into
    /// another's area by a method override.
    #[must_use]
    pub fn scope_missing(&self, seen: &Seen<'_>, key: Option<&ApiKey>) -> Option<&Scope> {
        self.scopes.iter().find(|scope| scope.covers(seen) && key.is_none_or(|key| !key.holds(&scope.name)))
    }

    /// What `limiter check` says of keys that list no scopes while some exist: they
    /// hold every one, which a key added before the scopes may not be meant to.
    #[must_use]
    pub fn unscoped_keys_warning(&self) -> Option<String> {
        let unscoped: Vec<&str> =
            self.keys.iter().filter(|key| key.scopes.is_none()).map(|key| key.id.as_str()).collect();
        (!self.scopes.is_empty() && !unscoped.is_empty()).then(|| {
            format!(
                "proxy.keys {} list no scopes, so they hold every [[proxy.scopes]]: give each the scopes it \
                 needs (scopes = [] for none)",
                unscoped.join(", ")
            )
        })
    }

    /// What `limiter check` says of connection bounds a config set before the wider
    /// prefixes, the in-flight cap and the upstream bound existed, where one of those
    /// (by default or not) is now the tighter bound.
    #[must_use]
    pub fn connection_bound_warnings(&self) -> Vec<String> {
        let per_ip = self.max_connections_per_ip.get();
        let mut warnings = Vec::new();
        let ipv6 = self.max_connections_per_ipv6_56.min(self.max_connections_per_ipv6_48).get();
        if per_ip > ipv6 {
            warnings.push(format!(
                "proxy.max_connections_per_ip = {per_ip}, but an IPv6 /56 may hold {} connections and a /48 {} \
                 (max_connections_per_ipv6_56, max_connections_per_ipv6_48, new bounds): one IPv6 client gets at \
                 most {ipv6}; raise them if it needs more",
                self.max_connections_per_ipv6_56, self.max_connections_per_ipv6_48
            ));
        }
        let in_flight = self.max_requests_in_flight_per_client.get();
        if per_ip > in_flight {
            warnings.push(format!(
                "proxy.max_connections_per_ip = {per_ip}, but a client may have only {in_flight} requests in \
                 flight at once (max_requests_in_flight_per_client, a new bound): more get 429"
            ));
        }
        let upstream = self.max_upstream_connections.get();
        if self.max_connections.get() > upstream {
            warnings.push(format!(
                "proxy.max_connections = {}, but at most {upstream} connections to the upstream are open at once \
                 (max_upstream_connections, a new bound): a request needing another gets 503",
                self.max_connections
            ));
        }
        warnings
    }

    /// How many threads serve connections: `workers`, or one per CPU the agent may
    /// run on.
    /// `max_buffered_bytes_per_connection`, or its default.
    #[must_use]
    pub fn buffered_bytes_per_connection(&self) -> u64 {
        self.max_buffered_bytes_per_connection.unwrap_or(self.max_body_bytes.saturating_mul(8))
    }

    /// `max_buffered_bytes_per_client`, or its default.
    #[must_use]
    pub fn buffered_bytes_per_client(&self) -> u64 {
        self.max_buffered_bytes_per_client.unwrap_or(self.max_body_bytes.saturating_mul(32))
    }

    #[must_use]
    pub fn workers(&self) -> NonZeroUsize {
        self.workers.unwrap_or_else(|| std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN))
    }

    /// Checks across records: plan and scope references, rule and scope names and
    /// paths, the realm. Errors name the key.
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        for (i, key) in self.keys.iter().enumerate() {
            if !self.plans.contains_key(&key.plan) {
                return Err((
                    format!("proxy.keys[{i}].plan"),
                    format!("no plan named `{}` in [proxy.plans]", key.plan),
                ));
            }
            if self.keys[..i].iter().any(|k| k.id == key.id) {
                return Err((format!("proxy.keys[{i}].id"), format!("key id `{}` appears twice", key.id)));
            }
            if key.secrets.is_empty() && key.auth == KeyAuth::Signature {
                return Err((
                    format!("proxy.keys[{i}].id"),
                    format!(
                        "key `{}` has no secrets, so no request could ever prove it: add secrets, or set \
                         auth = \"bearer\" to take the key id itself as proof",
                        key.id
                    ),
                ));
            }
            if key.secrets.is_empty() && key.sign_host {
                return Err((format!("proxy.keys[{i}].sign_host"), "needs the key's secrets".to_owned()));
            }
            if let Some(unknown) =
                key.scopes.iter().flatten().find(|name| !self.scopes.iter().any(|scope| &scope.name == *name))
            {
                return Err((
                    format!("proxy.keys[{i}].scopes"),
                    format!("key `{}` holds scope `{unknown}`, which no [[proxy.scopes]] defines", key.id),
                ));
            }
        }
        for (i, scope) in self.scopes.iter().enumerate() {
            if self.scopes[..i].iter().any(|s| s.name == scope.name) {
                return Err((format!("proxy.scopes[{i}].name"), format!("scope name `{}` appears twice", scope.name)));
            }
            for path in &scope.paths {
                self.check_rule_path(path).map_err(|message| (format!("proxy.scopes[{i}].paths"), message))?;
            }
        }
        // Written into a quoted string, which `"` and `\` would end or escape.
        if self.realm.is_empty()
            || !self.realm.bytes().all(|b| b == b' ' || (b.is_ascii_graphic() && b != b'"' && b != b'\\'))
        {
            return Err((
                "proxy.realm".to_owned(),
                format!("`{}` is not a realm: visible ASCII and spaces, without \" or \\", self.realm),
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if self.rules[..i].iter().any(|r| r.name == rule.name) {
                return Err((format!("proxy.rules[{i}].name"), format!("rule name `{}` appears twice", rule.name)));
            }
            if let Some(path) = &rule.path {
                self.check_rule_path(path).map_err(|message| (format!("proxy.rules[{i}].path"), message))?;
            }
            if let Some(unknown) = rule.plans.iter().find(|plan| !self.plans.contains_key(*plan)) {
                return Err((
                    format!("proxy.rules[{i}].plans"),
                    format!("rule `{}` counts plan `{unknown}`, which [proxy.plans] does not define", rule.name),
                ));
            }
            if (rule.key.needs_fingerprint() || rule.when.needs_fingerprint()) && !self.fingerprints() {
                return Err((
                    format!("proxy.rules[{i}]"),
                    format!(
                        "rule `{}` reads the client's JA4 fingerprint, but neither [proxy.tls] fingerprint nor \
                         ja4_header gives requests one, so no request would have it",
                        rule.name
                    ),
                ));
            }
            if rule.key.needs_token() && self.jwt.is_none() {
                return Err((
                    format!("proxy.rules[{i}].key"),
                    format!(
                        "rule `{}` counts by a JWT claim (`{}`), but there is no [proxy.jwt] to verify tokens with, \
                         so every request would lack its key",
                        rule.name, rule.key
                    ),
                ));
            }
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate()?;
        }
        self.check_adaptive()?;
        for (key, timeout) in [
            ("proxy.idle_timeout", &self.idle_timeout),
            ("proxy.body_timeout", &self.body_timeout),
            ("proxy.tunnel_idle_timeout", &self.tunnel_idle_timeout),
            ("proxy.send_timeout", &self.send_timeout),
        ] {
            if timeout.0.is_zero() {
                return Err((key.to_owned(), "must be longer than 0".to_owned()));
            }
        }
        for (key, cap) in [
            ("proxy.max_buffered_bytes_per_connection", self.max_buffered_bytes_per_connection),
            ("proxy.max_buffered_bytes_per_client", self.max_buffered_bytes_per_client),
        ] {
            if cap.is_some_and(|cap| cap < self.max_body_bytes) {
                return Err((
                    key.to_owned(),
                    format!(
                        "must be at least max_body_bytes ({}), or a body within it could never be read",
                        self.max_body_bytes
                    ),
                ));
            }
        }
        let token = |name: &str| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        if let Some(bad) = self.upgrade_protocols.iter().find(|protocol| !token(protocol)) {
            return Err((
                "proxy.upgrade_protocols".to_owned(),
                format!("`{bad}` is not a protocol name (an HTTP token, without a version)"),
            ));
        }
        if self.proxy_protocol != ProxyProtocol::Off && self.trusted_proxies.is_empty() {
            return Err((
                "proxy.proxy_protocol".to_owned(),
                "only peers in proxy.trusted_proxies may send a PROXY header, and there are none".to_owned(),
            ));
        }
        if let Some(tls) = &self.tls {
            if self.http2.h2c {
                return Err((
                    "proxy.http2.h2c".to_owned(),
                    "the listener speaks only TLS ([proxy.tls]), where HTTP/2 is offered by ALPN".to_owned(),
                ));
            }
            for (i, sni) in tls.sni.iter().enumerate() {
                if sni.name.is_empty() || tls.sni[..i].iter().any(|s| s.name.eq_ignore_ascii_case(&sni.name)) {
                    return Err((
                        format!("proxy.tls.sni[{i}].name"),
                        format!("`{}` is empty or appears twice", sni.name),
                    ));
                }
            }
        }
        if self.store == StoreKind::Redis {
            self.check_redis_url().map_err(|message| ("proxy.redis_url".to_owned(), message))?;
            if self.redis_timeout.0.is_zero() {
                return Err(("proxy.redis_timeout".to_owned(), "must be longer than 0".to_owned()));
            }
            let rules = self
                .rules
                .iter()
                .enumerate()
                .filter_map(|(i, rule)| Some((format!("proxy.rules[{i}].limit"), rule.limit()?)));
            let plans = self.plans.iter().flat_map(|(name, plan)| {
                plan.limits.iter().enumerate().map(move |(i, quota)| {
                    let key = match &quota.name {
                        Some(_) => format!("proxy.plans.{name}.limits[{i}]"),
                        None => format!("proxy.plans.{name}.limit"),
                    };
                    (key, &quota.spec)
                })
            });
            for (key, spec) in rules.chain(plans) {
                spec.check_exact_in_doubles().map_err(|error| (key, error.to_string()))?;
            }
        }
        Ok(())
    }

    /// `[proxy.upstream_capacity] concurrency` or `[proxy.adaptive]`, not both; shares
    /// of plans that exist, each between 0 and 1, summing to at most 1.
    fn check_adaptive(&self) -> Result<(), (String, String)> {
        let fixed = self.upstream_capacity.as_ref().and_then(|capacity| capacity.concurrency);
        let Some(adaptive) = &self.adaptive else {
            return match self.upstream_capacity {
                Some(UpstreamCapacity { concurrency: None, .. }) => Err((
                    "proxy.upstream_capacity".to_owned(),
                    "needs concurrency (or a [proxy.adaptive] section to move the limit)".to_owned(),
                )),
                _ => Ok(()),
            };
        };
        if fixed.is_some() {
            return Err((
                "proxy.upstream_capacity.concurrency".to_owned(),
                "[proxy.adaptive] moves the upstream's limit between min_limit and max_limit: remove concurrency \
                 (queue and queue_timeout stay)"
                    .to_owned(),
            ));
        }
        for (name, &share) in &adaptive.shares {
            let key = format!("proxy.adaptive.shares.{name}");
            if name != KEYLESS_SHARE && !self.plans.contains_key(name) {
                return Err((key, format!("no plan named `{name}` in [proxy.plans] (nor `{KEYLESS_SHARE}`)")));
            }
            if !(0.0..=1.0).contains(&share) {
                return Err((key, format!("{share} is not a share between 0 and 1")));
            }
        }
        let total: f64 = adaptive.shares.values().sum();
        if total > 1.0 + f64::EPSILON {
            return Err((
                "proxy.adaptive.shares".to_owned(),
                format!("the shares sum to {total}, more than the whole limit (1)"),
            ));
        }
        Ok(())
    }

    /// A URL of one of the topologies `fleet` connects to.
    fn check_redis_url(&self) -> Result<(), String> {
        let url = &self.redis_url;
        if self.redis_tls_ca.is_some() && !url.starts_with("rediss") {
            return Err(format!("`{url}`: redis_tls_ca goes with a TLS URL, rediss:// or rediss+cluster://"));
        }
        match RedisUrl::parse(url) {
            RedisUrl::Single if url.starts_with("redis://") || url.starts_with("rediss://") => Ok(()),
            RedisUrl::Single => Err(format!(
                "`{url}` is not a redis://, rediss://, redis+sentinel://HOSTS/MASTER, redis+cluster://HOSTS/ or \
                 rediss+cluster://HOSTS/ URL"
            )),
            RedisUrl::Sentinel { nodes, master } if nodes.is_empty() || master.is_empty() => Err(format!(
                "`{url}`: a Sentinel URL names its Sentinels and the master: redis+sentinel://HOST:PORT,…/MASTER"
            )),
            RedisUrl::Cluster { nodes } if nodes.is_empty() => {
                Err(format!("`{url}`: a cluster URL names its seed nodes: redis+cluster://HOST:PORT,…/"))
            }
            RedisUrl::Cluster { .. } if self.redis_prefix.contains(['{', '}']) => Err(format!(
                "`{url}`: in a cluster redis_prefix is the hash tag of every key, so it cannot hold {{ or }}"
            )),
            RedisUrl::Sentinel { .. } | RedisUrl::Cluster { .. } => Ok(()),
        }
    }

    /// Requests are matched on their canonical route, so a rule or scope path in
    /// another form would never match: it must be its own route.
    fn check_rule_path(&self, path: &str) -> Result<(), String> {
        let canonical =
            CanonicalPath::parse(path, self.path_options()).map_err(|error| format!("`{path}`: {error}"))?;
        if canonical.route() != path {
            let why = if self.case_insensitive_paths() {
                ", in lower case (case_insensitive_paths, on unless set to false)"
            } else {
                ""
            };
            return Err(format!(
                "`{path}` would never match: requests are matched on their canonical path{why}; write `{}`",
                canonical.route()
            ));
        }
        Ok(())
    }
}

fn upstream<'de, D: Deserializer<'de>>(deserializer: D) -> Result<http::Uri, D::Error> {
    let text = match toml::Value::deserialize(deserializer)? {
        toml::Value::String(text) => text,
        toml::Value::Table(_) => {
            return Err(de::Error::custom(
                "upstream is the application's http://host:port; its requests in flight are bounded in \
                 [proxy.upstream_capacity]",
            ));
        }
        other => {
            return Err(de::Error::custom(format!("upstream must be http://host:port, not a {}", other.type_str())));
        }
    };
    let uri: http::Uri = text.parse().map_err(|_| de::Error::custom(format!("`{text}` is not a URL")))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(de::Error::custom(format!("upstream `{text}` must be http://host:port")));
    }
    Ok(uri)
}

fn cidrs<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<IpNet>, D::Error> {
    Vec::<String>::deserialize(deserializer)?.iter().map(|c| parse_cidr(c).map_err(de::Error::custom)).collect()
}

fn yes() -> bool {
    true
}

fn default_max_body_bytes() -> u64 {
    1_048_576
}

fn default_header_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}

fn default_body_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

fn default_max_connections() -> NonZeroUsize {
    NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN)
}

fn default_max_connections_per_ip() -> NonZeroUsize {
    NonZeroUsize::new(256).unwrap_or(NonZeroUsize::MIN)
}

fn default_max_connections_per_ipv6_56() -> NonZeroUsize {
    NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN)
}

fn default_max_connections_per_ipv6_48() -> NonZeroUsize {
    NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN)
}

fn default_send_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}

fn default_max_requests_in_flight_per_client() -> NonZeroUsize {
    NonZeroUsize::new(256).unwrap_or(NonZeroUsize::MIN)
}

fn default_max_upstream_connections() -> NonZeroUsize {
    NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN)
}

fn default_tunnel_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}

fn default_upstream_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

fn default_max_tracked_keys() -> NonZeroUsize {
    NonZeroUsize::new(1_000_000).unwrap_or(NonZeroUsize::MIN)
}

fn default_realm() -> String {
    "limiter".to_owned()
}

fn default_redis_prefix() -> String {
    "limiter:".to_owned()
}

fn default_redis_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(100))
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379/".to_owned()
}

shown!(LimitSpec => describe_limit);

/// `5 per 1m (sliding_window_log, throttle from 4 by 100ms)`; a progressive band
/// `throttle from 50 by 100ms more every 10 up to 2s`.
fn describe_limit(spec: &LimitSpec) -> String {
    let mut options = vec![spec.algorithm.to_string()];
    options.extend(spec.burst.map(|burst| format!("burst {burst}")));
    options.extend(spec.throttle.map(|t| {
        let band = format!("throttle from {} by {}", t.from, HumanDuration(t.delay));
        match t.step {
            None => band,
            Some(step) => format!("{band} more every {} up to {}", step.every, HumanDuration(step.max_delay)),
        }
    }));
    options.extend(spec.queue.map(|queue| format!("queue {queue}")));
    match &spec.cost {
        Cost::Units(units) if units.get() == 1 => {}
        Cost::Units(units) => options.push(format!("cost {units}")),
        Cost::From(CostFrom { source: CostSource::ResponseHeader { name, .. }, max }) => {
            options.push(format!("cost from {name} up to {max}"));
        }
        Cost::From(CostFrom { source: CostSource::UpstreamMs, max }) => {
            options.push(format!("cost the upstream's ms up to {max}"));
        }
    }
    let window = spec.calendar.as_ref().map_or_else(|| HumanDuration(spec.window).to_string(), ToString::to_string);
    format!("{} per {window} ({})", spec.limit, options.join(", "))
}
