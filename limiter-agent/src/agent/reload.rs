//! One path for every reload (SIGHUP, `limiter reload`, a changed file): read and
//! validate the whole file, refuse what cannot change while running, then apply —
//! new interfaces first (undone if one fails), settings and CIDRs in place (no
//! bucket is refilled, no program reloaded), removed interfaces last.

use limiter_core::LimitSpec;

use crate::{
    config::{
        Config, ProxyConfig,
        proxy::{Rule, RuleAction, StoreKind},
        xdp::{PacketLimit, XdpConfig},
    },
    xdp::CidrChanges,
};

/// Why a reload was refused; the running config stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    #[error("{0}: cannot change while the agent runs; restart it to apply")]
    NeedsRestart(String),
    #[error("applying the kernel layer failed: {0}")]
    Xdp(#[from] crate::xdp::XdpError),
    #[error("applying the proxy failed: {0}")]
    Proxy(String),
    #[error(transparent)]
    Lock(#[from] super::lock::LockError),
}

/// Refuses changes that only a restart can make, naming every such key: a reload
/// never reports success while one of them is silently left as it was.
pub fn check_restartless(old: &Config, new: &Config) -> Result<(), ReloadError> {
    let changed: Vec<&str> =
        restart_only(old, new).into_iter().filter_map(|(key, differs)| differs.then_some(key)).collect();
    if changed.is_empty() { Ok(()) } else { Err(ReloadError::NeedsRestart(changed.join(", "))) }
}

/// Every key read only when the agent starts, and whether it differs. The rest
/// apply live: `[xdp]` settings and rules (and interfaces) through the maps, the
/// proxy's through its snapshot and engine, `keep_attached_on_exit` at stop.
fn restart_only(old: &Config, new: &Config) -> Vec<(&'static str, bool)> {
    let (a, b) = (&old.agent, &new.agent);
    let mut keys = vec![
        ("agent.pin_dir", a.pin_dir != b.pin_dir),
        ("agent.admin_socket", a.admin_socket != b.admin_socket),
        ("agent.metrics", a.metrics != b.metrics),
        ("agent.log_format (the logger is set up at start)", a.log_format != b.log_format),
        ("[proxy] (adding or removing the proxy)", old.proxy.is_some() != new.proxy.is_some()),
    ];
    if let (Some(a), Some(b)) = (&old.xdp, &new.xdp) {
        keys.push(("xdp.max_sources (the sources map is sized when created)", a.max_sources != b.max_sources));
        keys.push(("xdp.mode (attached interfaces keep theirs)", a.mode != b.mode));
        keys.push((
            "xdp.aggregate.max_prefixes (the map is sized when created)",
            a.aggregate.max_prefixes != b.aggregate.max_prefixes,
        ));
        keys.push(("xdp.verified.max (the map is sized when created)", a.verified.max != b.verified.max));
    }
    if let (Some(a), Some(b)) = (&old.proxy, &new.proxy) {
        let (sa, sb) = (&a.signature, &b.signature);
        keys.extend([
            ("proxy.listen", a.listen != b.listen),
            ("proxy.workers (the threads start with the proxy)", a.workers != b.workers),
            ("proxy.store", a.store != b.store),
            ("proxy.redis_url", a.redis_url != b.redis_url),
            ("proxy.redis_prefix", a.redis_prefix != b.redis_prefix),
            ("proxy.redis_timeout", a.redis_timeout != b.redis_timeout),
            ("proxy.redis_tls_ca", a.redis_tls_ca != b.redis_tls_ca),
            ("proxy.signature.replay_cache_size", sa.replay_cache_size != sb.replay_cache_size),
            ("proxy.signature.idempotency_ttl", sa.idempotency_ttl != sb.idempotency_ttl),
            ("proxy.signature.idempotency_max_entries", sa.idempotency_max_entries != sb.idempotency_max_entries),
            (
                "proxy.signature.idempotency_max_body_bytes",
                sa.idempotency_max_body_bytes != sb.idempotency_max_body_bytes,
            ),
            ("proxy.signature.idempotency_max_bytes", sa.idempotency_max_bytes != sb.idempotency_max_bytes),
            (
                "proxy.decision_log.path (the file is opened at start)",
                a.decision_log.as_ref().map(|log| &log.path) != b.decision_log.as_ref().map(|log| &log.path),
            ),
        ]);
        // The fleet's blocks are followed (or not) from the start.
        let follows = |c: &Config, p: &ProxyConfig| {
            p.store == StoreKind::Redis && c.escalation.as_ref().is_some_and(|e| e.enabled)
        };
        keys.push(("escalation.enabled (with store = \"redis\")", follows(old, a) != follows(new, b)));
    }
    keys
}

/// Human lines for what changed in `[xdp]`, besides interfaces.
pub fn describe_xdp(old: Option<&XdpConfig>, new: Option<&XdpConfig>, cidrs: &CidrChanges) -> Vec<String> {
    let mut lines = Vec::new();
    match (old, new) {
        (None, Some(_)) => lines.push("xdp: kernel layer enabled".to_owned()),
        (Some(_), None) => lines.push("xdp: kernel layer disabled".to_owned()),
        (Some(old), Some(new)) => {
            let limit = |c: &XdpConfig| describe_limit(Some(c.limit));
            let mut changed = |key: &str, before: String, after: String| {
                if before != after {
                    lines.push(format!("{key}: {before} -> {after}"));
                }
            };
            changed("xdp.limit", limit(old), limit(new));
            changed("xdp.enforce", old.enforce.to_string(), new.enforce.to_string());
            changed("xdp.malformed", format!("{:?}", old.malformed), format!("{:?}", new.malformed));
            changed("xdp.ipv6_prefix", old.ipv6_prefix.0.to_string(), new.ipv6_prefix.0.to_string());
            changed("xdp.mode", format!("{:?}", old.mode), format!("{:?}", new.mode));
            changed("xdp.new_sources", describe_limit(old.new_sources), describe_limit(new.new_sources));
            changed("xdp.syn", describe_limit(old.syn), describe_limit(new.syn));
            let aggregate = |c: &XdpConfig| {
                let a = &c.aggregate;
                format!("{} per /{} and /{}", describe_limit(a.limit), a.ipv4_prefix.0, a.ipv6_prefix.0)
            };
            changed("xdp.aggregate", aggregate(old), aggregate(new));
            changed("xdp.verified.ttl", old.verified.ttl.to_string(), new.verified.ttl.to_string());
        }
        (None, None) => {}
    }
    let rule = |cidr: &ipnet::IpNet| {
        new.and_then(|n| n.cidr.iter().find(|r| r.cidr == *cidr))
            .map_or(String::new(), |r| format!(" ({:?})", r.action))
    };
    lines.extend(cidrs.added.iter().map(|c| format!("xdp.cidr added {c}{}", rule(c))));
    lines.extend(cidrs.changed.iter().map(|c| format!("xdp.cidr changed {c}{}", rule(c))));
    lines.extend(cidrs.removed.iter().map(|c| format!("xdp.cidr removed {c}")));
    lines
}

fn describe_limit(limit: Option<PacketLimit>) -> String {
    limit.map_or_else(|| "off".to_owned(), |l| l.to_string())
}

/// Human lines for what changed in `[proxy]`: plans, rules, keys, mode.
pub fn describe_proxy(old: &ProxyConfig, new: &ProxyConfig) -> Vec<String> {
    let limit = |spec: &LimitSpec| {
        let throttle = spec.throttle.map_or(String::new(), |t| format!(", throttle from {} by {:?}", t.from, t.delay));
        format!("{} per {:?} ({:?}{throttle})", spec.limit, spec.window, spec.algorithm)
    };
    let rule_does = |rule: &Rule| match &rule.action {
        RuleAction::Limit(spec) => limit(spec),
        RuleAction::Deny => "deny".to_owned(),
        RuleAction::Tag => "tag".to_owned(),
    };
    let mut lines = Vec::new();
    if old.enforce != new.enforce {
        lines.push(format!("proxy.enforce: {} -> {}", old.enforce, new.enforce));
    }
    if old.disclose != new.disclose {
        lines.push(format!("proxy.disclose: {:?} -> {:?}", old.disclose, new.disclose));
    }
    match (&old.tls, &new.tls) {
        (None, Some(_)) => lines.push("proxy.tls: new connections speak TLS".to_owned()),
        (Some(_), None) => lines.push("proxy.tls removed: new connections are cleartext".to_owned()),
        // Read again whether or not the paths changed: a renewed certificate keeps its path.
        (Some(_), Some(_)) => lines.push("proxy.tls: certificates read again for new connections".to_owned()),
        (None, None) => {}
    }
    if old.http2 != new.http2 {
        lines.push(format!("proxy.http2: {:?} -> {:?} for new connections", old.http2, new.http2));
    }
    if old.proxy_protocol != new.proxy_protocol {
        lines.push(format!("proxy.proxy_protocol: {:?} -> {:?}", old.proxy_protocol, new.proxy_protocol));
    }
    for (name, plan) in &new.plans {
        match old.plans.get(name) {
            None => lines.push(format!("proxy.plans.{name} added: {}", limit(&plan.spec))),
            Some(before) if before.spec != plan.spec => {
                lines.push(format!("proxy.plans.{name}: {} -> {}", limit(&before.spec), limit(&plan.spec)))
            }
            Some(before) if before.disclose != plan.disclose => {
                lines.push(format!("proxy.plans.{name}.disclose: {:?} -> {:?}", before.disclose, plan.disclose))
            }
            Some(_) => {}
        }
    }
    lines.extend(old.plans.keys().filter(|n| !new.plans.contains_key(*n)).map(|n| format!("proxy.plans.{n} removed")));
    for rule in &new.rules {
        match old.rules.iter().find(|r| r.name == rule.name) {
            None => lines.push(format!("proxy.rules.{} added: {}", rule.name, rule_does(rule))),
            Some(before) if before != rule => {
                lines.push(format!("proxy.rules.{}: {} -> {}", rule.name, rule_does(before), rule_does(rule)));
            }
            Some(_) => {}
        }
    }
    lines.extend(
        old.rules
            .iter()
            .filter(|r| !new.rules.iter().any(|n| n.name == r.name))
            .map(|r| format!("proxy.rules.{} removed", r.name)),
    );
    if old.keys != new.keys {
        lines.push(format!("proxy.keys: {} -> {} keys", old.keys.len(), new.keys.len()));
    }
    if old.trusted_proxies != new.trusted_proxies {
        lines.push("proxy.trusted_proxies changed".to_owned());
    }
    lines
}
