//! The TOML config: schema with defaults, parsing, and validation that names the key
//! and line of every mistake.
//!
//! A config is parsed and validated whole before anything uses it, so a bad file
//! never half-applies. Checks that serde cannot express live in `TryFrom` impls of
//! the raw records, which keeps the error attached to the right table and line.

pub mod agent;
pub mod changes;
pub mod conditions;
pub mod count_when;
pub mod escalation;
pub mod methods;
pub mod proxy;
pub mod units;
pub mod xdp;

use std::{
    fs,
    ops::Range,
    path::{Path, PathBuf},
};

use serde::Deserialize;

// The derived `Changes` impls name this crate by its own name, here as elsewhere.
extern crate self as limiter_config;

use self::changes::Changes;

pub use self::{agent::AgentConfig, escalation::EscalationConfig, proxy::ProxyConfig, xdp::XdpConfig};

/// Where every command looks for the config unless `-c` says otherwise.
pub const DEFAULT_PATH: &str = "/etc/limiter/limiter.toml";

/// A whole, validated config.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Changes)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub agent: AgentConfig,
    /// The kernel layer; absent: no XDP program is loaded.
    pub xdp: Option<XdpConfig>,
    /// The HTTP proxy; absent: no proxy runs.
    #[changes(restart_if_added_or_removed = "adding or removing the proxy")]
    pub proxy: Option<ProxyConfig>,
    /// Blocks in the kernel layer for sources the proxy keeps refusing; absent: none.
    pub escalation: Option<EscalationConfig>,
}

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {key}: {message}")]
    Invalid { path: PathBuf, line: usize, key: String, message: String },
}

impl Config {
    /// Reads and validates the config at `path`. Secrets are not read: parsing does
    /// no I/O beyond the file, and commands that only need the pin directory or the
    /// socket must not need them (see the agent's `LoadedConfig`, which reads them).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read(path)?, path)
    }

    /// Validates config text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|error| {
            let span = error.span().unwrap_or(0..0);
            let (mut line, mut key) = locate(text, span);
            if let Some(index) = key.strip_suffix("[0]").and_then(|array| first_bad_element(text, array)) {
                key = format!("{}[{index}]", &key[..key.len() - 3]);
                line = line_of(text, &key);
            }
            ConfigError::Invalid { path: path.to_owned(), line, key, message: error.message().trim().to_owned() }
        })?;
        config.validate().map_err(|(key, message)| ConfigError::at_key(text, path, key, message))?;
        Ok(config)
    }

    /// Trusted proxies whose most specific covering `[[xdp.cidr]]` rule is not an
    /// `allow` or `limit` (none, or a `deny`): the kernel layer limits each as one
    /// ordinary client, or drops it, though it carries all of its clients' traffic.
    #[must_use]
    pub fn unshielded_trusted_proxies(&self) -> Vec<ipnet::IpNet> {
        let (Some(xdp), Some(proxy)) = (&self.xdp, &self.proxy) else { return Vec::new() };
        let shielded = |trusted: &ipnet::IpNet| {
            // The kernel's trie applies the longest prefix that matches.
            let applying =
                xdp.cidr.iter().filter(|rule| rule.cidr.contains(trusted)).max_by_key(|rule| rule.cidr.prefix_len());
            applying.is_some_and(|rule| !matches!(rule.action, xdp::CidrAction::Deny))
        };
        proxy.trusted_proxies.iter().filter(|trusted| !shielded(trusted)).copied().collect()
    }

    /// With `[escalation]` on, the `deny` rules whose refusals no longer escalate (they
    /// all did before `escalate` existed): those without `escalate = true`.
    #[must_use]
    pub fn deny_rules_not_escalating(&self) -> Vec<&str> {
        let (Some(proxy), true) = (&self.proxy, self.escalation.as_ref().is_some_and(|e| e.enabled)) else {
            return Vec::new();
        };
        let quiet = |rule: &&proxy::Rule| rule.action == proxy::RuleAction::Deny && !rule.escalate;
        proxy.rules.iter().filter(quiet).map(|rule| rule.name.as_str()).collect()
    }

    /// Whether `[proxy.adaptive.kernel] tighten_new_sources` is set with no
    /// `[xdp.new_sources]` budget to scale.
    #[must_use]
    pub fn tightening_nothing(&self) -> bool {
        let tightens = self.proxy.as_ref().and_then(|proxy| proxy.adaptive.as_ref()?.tighten_new_sources).is_some();
        tightens && self.xdp.as_ref().is_none_or(|xdp| xdp.new_sources.is_none())
    }

    /// Checks that span records (references, duplicates); returns the key at fault.
    fn validate(&self) -> Result<(), (String, String)> {
        if let Some(xdp) = &self.xdp {
            xdp.validate()?;
        }
        if let Some(proxy) = &self.proxy {
            proxy.validate()?;
        }
        if self.escalation.as_ref().is_some_and(|e| e.enabled) && (self.proxy.is_none() || self.xdp.is_none()) {
            return Err((
                "escalation.enabled".to_owned(),
                "escalation needs both [proxy] (which counts rejections) and [xdp] (which blocks)".to_owned(),
            ));
        }
        Ok(())
    }
}

impl ConfigError {
    /// A mistake at the dotted `key` of the config `text` read from `path`, found at
    /// its line.
    #[must_use]
    pub fn at_key(text: &str, path: &Path, key: String, message: String) -> Self {
        Self::Invalid { path: path.to_owned(), line: line_of(text, &key), key, message }
    }
}

/// The text of the config at `path`.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })
}

/// The line (1-based) of `span` and the dotted key written there, found from the
/// text itself: the nearest table header above, plus the key on the line.
fn locate(text: &str, span: Range<usize>) -> (usize, String) {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..start].matches('\n').count() + 1;
    let line_text = text[line_start..].lines().next().unwrap_or("").trim();

    let mut table = String::new();
    let mut arrays: Vec<(String, usize)> = Vec::new();
    for header in text[..line_start].lines().map(str::trim).chain(
        // A span that starts on a header names that header.
        line_text.starts_with('[').then_some(line_text),
    ) {
        if let Some(name) = header.strip_prefix("[[").and_then(|h| h.split("]]").next()) {
            let name = name.trim().to_owned();
            let index = arrays.iter().filter(|(n, _)| *n == name).count();
            arrays.push((name.clone(), index));
            table = format!("{name}[{index}]");
        } else if let Some(name) = header.strip_prefix('[').and_then(|h| h.split(']').next()) {
            table = name.trim().to_owned();
        }
    }
    let key = match line_text.split_once('=') {
        Some((key, _)) if !line_text.starts_with('[') => key.trim().trim_matches('"').to_owned(),
        _ => String::new(),
    };
    let path = match (table.is_empty(), key.is_empty()) {
        (true, true) => "(document)".to_owned(),
        (true, false) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    };
    (line, path)
}

/// `agent.admin_socket` of the file at `path`, read leniently (the default where the
/// file is unreadable or broken), so that `limiter reload` can reach the agent to
/// have it judge a broken file.
#[must_use]
pub fn admin_socket_of(path: &Path) -> PathBuf {
    let Ok(text) = fs::read_to_string(path) else {
        return AgentConfig::default().admin_socket;
    };
    let parsed = toml::from_str::<toml::Table>(&text)
        .ok()
        .and_then(|doc| doc.get("agent")?.get("admin_socket")?.as_str().map(PathBuf::from));
    // A file broken elsewhere (cut short, a typo further down) still names its socket.
    let scanned = || {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            let value = value.split('#').next().unwrap_or_default();
            (key.trim() == "admin_socket").then(|| PathBuf::from(value.trim().trim_matches('"')))
        })
    };
    parsed.or_else(scanned).unwrap_or_else(|| AgentConfig::default().admin_socket)
}

/// toml reports an error inside an array of tables at the array's first element;
/// this finds the element at fault: the shortest prefix of the array that fails.
fn first_bad_element(text: &str, array: &str) -> Option<usize> {
    fn elements<'a>(table: &'a mut toml::Table, path: &str) -> Option<&'a mut Vec<toml::Value>> {
        match path.split_once('.') {
            Some((head, rest)) => elements(table.get_mut(head)?.as_table_mut()?, rest),
            None => table.get_mut(path)?.as_array_mut(),
        }
    }
    let mut document: toml::Table = toml::from_str(text).ok()?;
    let len = elements(&mut document, array)?.len();
    (0..len).find(|&i| {
        let mut prefix = document.clone();
        if let Some(elements) = elements(&mut prefix, array) {
            elements.truncate(i + 1);
        }
        Config::deserialize(prefix).is_err()
    })
}

/// The line (1-based) where a dotted key like `proxy.keys[1].plan` is written:
/// the header of its table (the n-th `[[...]]` for an index), then the key's own
/// line below it if present.
fn line_of(text: &str, key: &str) -> usize {
    // A key naming a table (`proxy.jwt`) is at its header.
    if let Some(header) =
        text.lines().position(|line| line.trim().strip_prefix('[').and_then(|l| l.strip_suffix(']')) == Some(key))
    {
        return header + 1;
    }
    let mut table = key;
    let mut field = None;
    let mut index = None;
    if let Some((head, rest)) = key.split_once('[') {
        table = head;
        let (i, after) = rest.split_once(']').unwrap_or((rest, ""));
        index = i.parse::<usize>().ok();
        field = after.strip_prefix('.');
    } else if let Some((head, last)) = key.rsplit_once('.') {
        table = head;
        field = Some(last);
    }
    let lines: Vec<&str> = text.lines().collect();
    let header = |line: &str| {
        let line = line.trim();
        match index {
            Some(_) => line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")).map(str::trim) == Some(table),
            None => line.strip_prefix('[').and_then(|l| l.strip_suffix(']')).map(str::trim) == Some(table),
        }
    };
    let Some(start) = lines.iter().enumerate().filter(|(_, l)| header(l)).map(|(i, _)| i).nth(index.unwrap_or(0))
    else {
        // An inline array (`issuers = [{ … }]`) has no headers: its own line, then.
        return if index.is_some() { line_of(text, table) } else { 1 };
    };
    let field_line = field.and_then(|field| {
        lines[start + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with('['))
            .position(|l| l.split_once('=').is_some_and(|(k, _)| k.trim() == field))
    });
    start + 1 + field_line.map_or(0, |offset| offset + 1)
}

#[cfg(test)]
mod tests;
