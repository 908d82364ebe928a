//! What a reload changes, derived from the config types (`#[derive(Changes)]`, from
//! `limiter-config-derive`): every field of every section is compared, so that a new
//! key shows in the reload report without a line written for it, and a key read only
//! at start is marked once, where it is declared.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    num::{NonZeroU16, NonZeroU32, NonZeroUsize},
    path::PathBuf,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use limiter_config_derive::Changes;

/// One line of a reload's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The dotted key: `proxy.max_connections`, `proxy.rules[login]`.
    pub key: String,
    pub what: What,
    /// Why only a restart applies it (possibly empty); `None`: it applies live.
    pub restart: Option<String>,
}

/// What became of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    Modified {
        before: String,
        after: String,
    },
    /// An entry of a table or a keyed list, shown whole.
    Added(String),
    Removed,
    /// Something the reload did rather than a value (an interface attached).
    Note(String),
}

impl Change {
    fn new(key: &str, what: What) -> Self {
        Self { key: key.to_owned(), what, restart: None }
    }

    #[must_use]
    pub fn modified(key: &str, before: String, after: String) -> Self {
        Self::new(key, What::Modified { before, after })
    }

    #[must_use]
    pub fn note(key: &str, what: String) -> Self {
        Self::new(key, What::Note(what))
    }

    /// The key, with the reason it needs a restart, as a refused reload names it.
    #[must_use]
    pub fn needing_restart(&self) -> Option<String> {
        match self.restart.as_deref()? {
            "" => Some(self.key.clone()),
            why => Some(format!("{} ({why})", self.key)),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        match &self.what {
            What::Modified { before, after } => write!(f, "{key}: {before} -> {after}"),
            What::Added(value) => write!(f, "{key} added: {value}"),
            What::Removed => write!(f, "{key} removed"),
            What::Note(note) => write!(f, "{key}: {note}"),
        }
    }
}

/// A config type a reload can report on.
pub trait Changes {
    /// Adds to `out` every key at or under `key` whose value differs in `new`.
    fn changes(&self, new: &Self, key: &str, out: &mut Vec<Change>);

    /// The value on one line of the report.
    fn describe(&self) -> String;
}

/// The elements of a list an operator tells apart by one of their fields.
pub trait Keyed {
    fn id(&self) -> String;
}

/// `parent.field`.
#[must_use]
pub fn child(parent: &str, field: &str) -> String {
    if parent.is_empty() { field.to_owned() } else { format!("{parent}.{field}") }
}

/// Marks `changes` as applied only by a restart, for `why`.
pub fn needs_restart(changes: &mut [Change], why: &str) {
    for change in changes {
        change.restart.get_or_insert_with(|| why.to_owned());
    }
}

/// Marks the change of `key` itself (a section added or removed) as applied only by
/// a restart, for `why`; the changes of the keys under it apply live.
pub fn presence_needs_restart(changes: &mut [Change], key: &str, why: &str) {
    for change in changes.iter_mut().filter(|change| change.key == key) {
        change.restart.get_or_insert_with(|| why.to_owned());
    }
}

/// Keeps the keys of `changes` and hides their values.
pub fn redact(changes: &mut [Change]) {
    for change in changes {
        let hidden = || "(redacted)".to_owned();
        match &mut change.what {
            What::Modified { before, after } => (*before, *after) = (hidden(), hidden()),
            What::Added(value) | What::Note(value) => *value = hidden(),
            What::Removed => {}
        }
    }
}

/// Elements of `old` and `new` matched by their id: each added, removed or changed
/// one under `key[<id>]`.
pub fn keyed<T: Keyed + Changes>(old: &[T], new: &[T], key: &str, out: &mut Vec<Change>) {
    fn by_id<'a, T: Keyed>(key: &str, list: &'a [T]) -> BTreeMap<String, &'a T> {
        list.iter().map(|item| (format!("{key}[{}]", item.id()), item)).collect()
    }
    entries(&by_id(key, old), &by_id(key, new), out);
}

/// Entries of `old` and `new` under the same key compared; the others added or removed.
fn entries<T: Changes>(old: &BTreeMap<String, &T>, new: &BTreeMap<String, &T>, out: &mut Vec<Change>) {
    for (key, after) in new {
        match old.get(key) {
            Some(before) => before.changes(after, key, out),
            None => out.push(Change::new(key, What::Added(after.describe()))),
        }
    }
    out.extend(old.keys().filter(|key| !new.contains_key(*key)).map(|key| Change::new(key, What::Removed)));
}

/// Compares `old` and `new` as one value, shown by its `describe`.
pub fn whole<T: Changes + PartialEq + ?Sized>(old: &T, new: &T, key: &str, out: &mut Vec<Change>) {
    if old != new {
        out.push(Change::modified(key, old.describe(), new.describe()));
    }
}

/// Compares an `Option` whose `None` stands for a default, `unset` (see the derive's
/// `unset`): setting it to that very value is still reported, as the key now written.
pub fn defaulted<T: Changes + PartialEq>(
    old: &Option<T>,
    new: &Option<T>,
    unset: &str,
    key: &str,
    out: &mut Vec<Change>,
) {
    match (old, new) {
        (Some(before), Some(after)) => before.changes(after, key, out),
        (None, None) => {}
        _ => out.push(Change::modified(key, describe_defaulted(old, unset), describe_defaulted(new, unset))),
    }
}

/// `value`, or `unset (default)`.
#[must_use]
pub fn describe_defaulted<T: Changes>(value: &Option<T>, unset: &str) -> String {
    value.as_ref().map_or_else(|| format!("{unset} (default)"), Changes::describe)
}

impl<T: Changes + PartialEq> Changes for Option<T> {
    fn changes(&self, new: &Self, key: &str, out: &mut Vec<Change>) {
        match (self, new) {
            (Some(before), Some(after)) => before.changes(after, key, out),
            (None, None) => {}
            _ => whole(self, new, key, out),
        }
    }

    fn describe(&self) -> String {
        self.as_ref().map_or_else(|| "off".to_owned(), Changes::describe)
    }
}

/// A list compared whole: `[a, b]`.
impl<T: Changes + PartialEq> Changes for Vec<T> {
    fn changes(&self, new: &Self, key: &str, out: &mut Vec<Change>) {
        whole(self, new, key, out);
    }

    fn describe(&self) -> String {
        format!("[{}]", self.iter().map(Changes::describe).collect::<Vec<_>>().join(", "))
    }
}

/// A pair in a list (a header and its pattern): `a: b`.
impl<A: Changes + PartialEq, B: Changes + PartialEq> Changes for (A, B) {
    fn changes(&self, new: &Self, key: &str, out: &mut Vec<Change>) {
        whole(self, new, key, out);
    }

    fn describe(&self) -> String {
        format!("{}: {}", self.0.describe(), self.1.describe())
    }
}

/// A table of named entries (`[proxy.plans.NAME]`), each under `key.NAME`.
impl<T: Changes> Changes for BTreeMap<String, T> {
    fn changes(&self, new: &Self, key: &str, out: &mut Vec<Change>) {
        fn by_name<'a, T>(key: &str, table: &'a BTreeMap<String, T>) -> BTreeMap<String, &'a T> {
            table.iter().map(|(name, value)| (child(key, name), value)).collect()
        }
        entries(&by_name(key, self), &by_name(key, new), out);
    }

    fn describe(&self) -> String {
        let entries: Vec<String> = self.iter().map(|(name, value)| format!("{name} = {}", value.describe())).collect();
        format!("{{{}}}", entries.join(", "))
    }
}

/// Values compared whole and shown by `$show`.
macro_rules! shown {
    ($($type:ty => $show:expr),* $(,)?) => {$(
        impl $crate::changes::Changes for $type {
            fn changes(&self, new: &Self, key: &str, out: &mut Vec<$crate::changes::Change>) {
                $crate::changes::whole(self, new, key, out);
            }

            fn describe(&self) -> String {
                let show: fn(&$type) -> String = $show;
                show(self)
            }
        }
    )*};
}
pub(crate) use shown;

/// Values shown as they print.
macro_rules! shown_by_display {
    ($($type:ty),* $(,)?) => {
        shown!($($type => ToString::to_string),*);
    };
}

shown_by_display!(
    bool,
    u8,
    u16,
    u32,
    u64,
    usize,
    f64,
    String,
    NonZeroU16,
    NonZeroU32,
    NonZeroUsize,
    SocketAddr,
    IpNet,
    http::Uri,
    http::Method,
    http::HeaderName,
    limiter_core::Algorithm,
    limiter_core::path::EscapedSlashes,
    limiter_core::ja4::Ja4,
);

shown!(
    PathBuf => |path| path.display().to_string(),
    http::StatusCode => |status| status.as_u16().to_string(),
    limiter_core::adaptive::Settings => |settings| format!(
        "{} between {} and {} from {}, tolerance {}",
        settings.algorithm().name(),
        settings.min_limit(),
        settings.max_limit(),
        settings.initial_limit(),
        settings.tolerance()
    ),
);

#[cfg(test)]
mod tests {
    use std::{num::NonZeroU32, time::Duration};

    use super::*;
    use crate::xdp::PacketLimit;

    fn limit(packets_per_second: u32) -> PacketLimit {
        let nonzero = |n| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        PacketLimit { packets_per_second: nonzero(packets_per_second), burst: nonzero(10) }
    }

    #[derive(Clone, Debug, PartialEq, Changes)]
    struct Entry {
        name: String,
        weight: u32,
    }

    impl Keyed for Entry {
        fn id(&self) -> String {
            self.name.clone()
        }
    }

    /// A section as a new key extends one: each field is reported by being declared,
    /// and the one read only at start is marked where it is declared.
    #[derive(Clone, Debug, PartialEq, Changes)]
    struct Section {
        rate: Option<PacketLimit>,
        #[changes(restart = "sized at start")]
        size: usize,
        a_new_key: Duration,
        #[changes(redacted)]
        password: String,
        #[changes(keyed)]
        entries: Vec<Entry>,
        #[changes(restart_if_added_or_removed = "opened at start")]
        log: Option<Entry>,
        #[changes(unset = "yes")]
        folds: Option<bool>,
    }

    fn entry(name: &str, weight: u32) -> Entry {
        Entry { name: name.to_owned(), weight }
    }

    #[test]
    fn every_declared_field_is_reported_under_its_key() {
        let old = Section {
            rate: None,
            size: 10,
            a_new_key: Duration::from_secs(60),
            password: "old".to_owned(),
            entries: vec![entry("a", 1), entry("b", 2)],
            log: None,
            folds: None,
        };
        let new = Section {
            rate: Some(limit(100)),
            size: 20,
            a_new_key: Duration::from_millis(1500),
            password: "new".to_owned(),
            entries: vec![entry("b", 3), entry("c", 1)],
            log: Some(entry("log", 1)),
            folds: Some(false),
        };
        let mut changes = Vec::new();
        old.changes(&new, "section", &mut changes);
        let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "section.rate: off -> 100 pps, burst 10",
                "section.size: 10 -> 20",
                "section.a_new_key: 1m -> 1500ms",
                "section.password: (redacted) -> (redacted)",
                "section.entries[b].weight: 2 -> 3",
                "section.entries[c] added: {name = c, weight = 1}",
                "section.entries[a] removed",
                "section.log: off -> {name = log, weight = 1}",
                "section.folds: yes (default) -> false",
            ]
        );
        let restart: Vec<String> = changes.iter().filter_map(Change::needing_restart).collect();
        assert_eq!(restart, ["section.size (sized at start)", "section.log (opened at start)"]);
        let heavier = Section { log: Some(entry("log", 2)), ..new.clone() };
        let mut live = Vec::new();
        new.changes(&heavier, "section", &mut live);
        assert_eq!(live, [Change::modified("section.log.weight", "1".to_owned(), "2".to_owned())]);
        let mut none = Vec::new();
        old.changes(&old.clone(), "section", &mut none);
        assert_eq!(none, []);
    }
}
