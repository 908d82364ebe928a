//! The config files and scripts of the HTTP groups: nginx as upstream and as the
//! `limit_req` anchor, limiter with each rule set, and the wrk hooks.

use std::path::Path;

pub const KEY_ID: &str = "bench-key";
pub const SECRET: &str = "bench-secret-0123456789abcdef";

/// The plan of the bench key, which every rule set below starts with. Limits far
/// above the load, so that every request is decided and forwarded: the bench measures
/// what deciding costs, not how cheap a 429 is.
macro_rules! plan {
    () => {
        r#"
[proxy.plans.bench]
limit = 1000000000
window = "1s"
"#
    };
}

/// The bench plan as an API product sells one: a burst, a minute and a calendar month,
/// each far above the load.
macro_rules! three_quota_plan {
    () => {
        r#"
[proxy.plans.bench]
limits = [
  { name = "burst", limit = 1000000000, window = "1s", algorithm = "token_bucket", burst = 1000000000 },
  { name = "minute", limit = 1000000000, window = "1m" },
  { name = "monthly", limit = 4000000000, window = "month" },
]
"#
    };
}

/// The per-IP rule of the rule sets below, the same in each.
macro_rules! per_ip_rule {
    () => {
        r#"
[[proxy.rules]]
name = "per-ip"
key = "ip"
algorithm = "sliding_window_counter"
limit = 1000000000
window = "1s"
"#
    };
}

/// The per-key rule of the rule sets below.
macro_rules! per_key_rule {
    () => {
        r#"
[[proxy.rules]]
name = "per-key"
key = "api_key"
algorithm = "token_bucket"
limit = 1000000000
window = "1s"
"#
    };
}

pub const LIMITER_RULES: &str = concat!(plan!(), per_ip_rule!(), per_key_rule!());

/// [`LIMITER_RULES`] with the plan of three quotas: what a plan's further quotas cost.
pub const LIMITER_RULES_THREE_QUOTAS: &str = concat!(three_quota_plan!(), per_ip_rule!(), per_key_rule!());

/// [`LIMITER_RULES`] with a `concurrency` on the per-IP rule far above the load, so
/// that nothing ever queues: what holding a place in flight costs a request.
pub const LIMITER_RULES_CONCURRENCY: &str =
    concat!(plan!(), per_ip_rule!(), "concurrency = 1000000\n", per_key_rule!());

/// A rule keyed on a JSON body's member beside the per-IP one: what reading a body
/// for its key costs. The bench's logins all name one user, far below the limit.
pub const LIMITER_BODY_KEY: &str = concat!(
    plan!(),
    per_ip_rule!(),
    r#"
[[proxy.rules]]
name = "per-user"
path = "/login"
methods = ["POST"]
key = "json:/username"
key_fold = "lower"
algorithm = "sliding_window_counter"
limit = 1000000000
window = "1s"
"#
);

/// The login the body-key scenario posts.
pub const LOGIN_BODY: &str = r#"{"username":"alice","password":"correct horse battery staple"}"#;

pub const LIMITER_SIGNED: &str = concat!(
    plan!(),
    r#"
[[proxy.rules]]
name = "signed"
path = "/signed"
require_signature = true
key = "api_key"
algorithm = "token_bucket"
limit = 1000000000
window = "1s"
"#
);

pub const WRK_DONE: &str = r#"
function done(summary, latency, requests)
  local s = summary.duration / 1e6
  local bad = summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format('{"rps": %.1f, "requests": %d, "errors": %d, "p50_ms": %.3f, "p99_ms": %.3f, "p999_ms": %.3f}\n',
    summary.requests / s, summary.requests, bad, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency:percentile(99.9) / 1e3))
end
"#;

/// How a proxy's listener speaks to its clients, the same on nginx and limiter so
/// that their rows compare like with like.
#[derive(Clone, Copy, Debug)]
pub enum Listener<'a> {
    Http1,
    /// HTTP/2 in the clear, to clients that know it (prior knowledge).
    H2c,
    /// TLS only, offering h2 and http/1.1 by ALPN.
    Tls {
        cert: &'a Path,
        key: &'a Path,
    },
}

impl Listener<'_> {
    /// nginx's `listen` line, with its certificate. nginx 1.22 (Debian bookworm's)
    /// turns HTTP/2 on there, not with `http2 on;`, and offers TLS 1.3, which
    /// limiter negotiates, only when told to.
    fn nginx_listen(self, port: u16) -> String {
        match self {
            Self::Http1 => format!("listen 127.0.0.1:{port};"),
            Self::H2c => format!("listen 127.0.0.1:{port} http2;"),
            Self::Tls { cert, key } => format!(
                "listen 127.0.0.1:{port} ssl http2;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    \
                 ssl_protocols TLSv1.2 TLSv1.3;",
                cert.display(),
                key.display()
            ),
        }
    }

    fn limiter_tables(self) -> String {
        match self {
            Self::Http1 => String::new(),
            Self::H2c => "[proxy.http2]\nh2c = true\n".to_owned(),
            Self::Tls { cert, key } => {
                format!("[proxy.tls]\ncert = \"{}\"\nkey = \"{}\"\n", cert.display(), key.display())
            }
        }
    }
}

pub fn upstream_conf(port: u16) -> String {
    format!(
        "worker_processes 1;\ndaemon off;\npid PREFIX/upstream.pid;\nerror_log stderr warn;\nevents {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path PREFIX/tmp;\n  proxy_temp_path PREFIX/tmp;\n  \
         fastcgi_temp_path PREFIX/tmp;\n  uwsgi_temp_path PREFIX/tmp;\n  scgi_temp_path PREFIX/tmp;\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n"
    )
}

/// nginx as a reverse proxy with `limit_req` zones equivalent to limiter's rules:
/// per IP, per API key, and a "plan" zone for the keys of the bench plan. The pid
/// file is named by port because the HTTP/2 group runs two in one directory.
pub fn nginx_limit_req_conf(port: u16, upstream: u16, listener: Listener) -> String {
    let listen = listener.nginx_listen(port);
    format!(
        "worker_processes 2;\ndaemon off;\npid PREFIX/nginx-limit-req-{port}.pid;\nerror_log stderr warn;\nevents {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path PREFIX/tmp;\n  proxy_temp_path PREFIX/tmp;\n  \
         fastcgi_temp_path PREFIX/tmp;\n  uwsgi_temp_path PREFIX/tmp;\n  scgi_temp_path PREFIX/tmp;\n  \
         limit_req_zone $binary_remote_addr zone=per_ip:10m rate=1000000r/s;\n  \
         limit_req_zone $http_x_api_key zone=per_key:10m rate=1000000r/s;\n  \
         map $http_x_api_key $plan_bench {{ \"{KEY_ID}\" $http_x_api_key; default \"\"; }}\n  \
         limit_req_zone $plan_bench zone=plan_bench:10m rate=1000000r/s;\n  \
         upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}\n  \
         server {{\n    {listen}\n    location / {{\n      limit_req zone=per_ip burst=1000000 nodelay;\n      \
         limit_req zone=per_key burst=1000000 nodelay;\n      limit_req zone=plan_bench burst=1000000 nodelay;\n      \
         limit_req_status 429;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
         proxy_set_header X-Forwarded-For $remote_addr;\n      proxy_pass http://up;\n    }}\n  }}\n}}\n"
    )
}

/// limiter in front of `upstream` with `rules`, which define the bench plan (none: a
/// bare proxy, without the bench key either).
pub fn limiter_conf(
    dir: &Path,
    name: &str,
    port: u16,
    upstream: u16,
    listener: Listener,
    rules: &str,
    secret: &Path,
) -> String {
    let slug = slug(name);
    let extra = if rules.is_empty() {
        String::new()
    } else {
        // The bench's unsigned requests name the key: a bearer key, so that its plan
        // and per-key rule count them.
        format!(
            "{rules}\n[[proxy.keys]]\nid = \"{KEY_ID}\"\nplan = \"bench\"\nsecrets = [\"file:{}\"]\n\
             auth = \"bearer\"\n",
            secret.display()
        )
    };
    format!(
        "[agent]\npin_dir = \"/sys/fs/bpf/limiter-bench-{slug}-{pid}\"\nadmin_socket = \"{dir}/{slug}.sock\"\nmetrics = \"\"\n\n\
         [proxy]\nlisten = \"127.0.0.1:{port}\"\nupstream = \"http://127.0.0.1:{upstream}\"\nmax_tracked_keys = 1000000\n{listener}{extra}",
        pid = std::process::id(),
        dir = dir.display(),
        listener = listener.limiter_tables(),
    )
}

/// A scenario name as it can appear in file and pin names.
pub fn slug(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect()
}
