//! One path for every reload (SIGHUP, `limiter reload`, a changed file): read and
//! validate the whole file, refuse what cannot change while running, then apply —
//! new interfaces first (undone if one fails), settings and CIDRs in place (no
//! bucket is refilled, no program reloaded), removed interfaces last.

use limiter_core::LimitSpec;

use crate::{
    config::{
        Config, ProxyConfig,
        xdp::{PacketLimit, XdpConfig},
    },
    xdp::CidrChanges,
};

/// Why a reload was refused; the running config stays in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    #[error("{0} cannot change while the agent runs; restart it to apply")]
    NeedsRestart(&'static str),
    #[error("applying the kernel layer failed: {0}")]
    Xdp(#[from] crate::xdp::XdpError),
    #[error("applying the proxy failed: {0}")]
    Proxy(String),
}

/// Refuses changes that only a restart can make.
pub fn check_restartless(old: &Config, new: &Config) -> Result<(), ReloadError> {
    if old.agent.pin_dir != new.agent.pin_dir {
        return Err(ReloadError::NeedsRestart("agent.pin_dir"));
    }
    if old.agent.admin_socket != new.agent.admin_socket {
        return Err(ReloadError::NeedsRestart("agent.admin_socket"));
    }
    if old.agent.metrics != new.agent.metrics {
        return Err(ReloadError::NeedsRestart("agent.metrics"));
    }
    if let (Some(old), Some(new)) = (&old.xdp, &new.xdp)
        && old.max_sources != new.max_sources
    {
        return Err(ReloadError::NeedsRestart("xdp.max_sources (the sources map is sized when created)"));
    }
    if let (Some(old), Some(new)) = (&old.xdp, &new.xdp)
        && old.aggregate.max_prefixes != new.aggregate.max_prefixes
    {
        return Err(ReloadError::NeedsRestart("xdp.aggregate.max_prefixes (the map is sized when created)"));
    }
    if let (Some(old), Some(new)) = (&old.xdp, &new.xdp)
        && old.verified.max != new.verified.max
    {
        return Err(ReloadError::NeedsRestart("xdp.verified.max (the map is sized when created)"));
    }
    if let (Some(old), Some(new)) = (&old.proxy, &new.proxy)
        && old.listen != new.listen
    {
        return Err(ReloadError::NeedsRestart("proxy.listen"));
    }
    if old.proxy.is_some() != new.proxy.is_some() {
        return Err(ReloadError::NeedsRestart("[proxy] (adding or removing the proxy)"));
    }
    Ok(())
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
    let mut lines = Vec::new();
    if old.enforce != new.enforce {
        lines.push(format!("proxy.enforce: {} -> {}", old.enforce, new.enforce));
    }
    for (name, spec) in &new.plans {
        match old.plans.get(name) {
            None => lines.push(format!("proxy.plans.{name} added: {}", limit(spec))),
            Some(before) if before != spec => {
                lines.push(format!("proxy.plans.{name}: {} -> {}", limit(before), limit(spec)))
            }
            Some(_) => {}
        }
    }
    lines.extend(old.plans.keys().filter(|n| !new.plans.contains_key(*n)).map(|n| format!("proxy.plans.{n} removed")));
    for rule in &new.rules {
        match old.rules.iter().find(|r| r.name == rule.name) {
            None => lines.push(format!("proxy.rules.{} added: {}", rule.name, limit(&rule.limit))),
            Some(before) if before != rule => {
                lines.push(format!("proxy.rules.{}: {} -> {}", rule.name, limit(&before.limit), limit(&rule.limit)));
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
