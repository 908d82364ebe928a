//! `proxy.decision_log`: one JSON line for a sample of the limits' decisions, for
//! finding out afterwards who was refused by what. Lines go through a bounded queue
//! to a thread of their own ([`crate::appender`]), so a slow disk never holds a
//! request: a line that finds the queue full is dropped and counted, and a full disk
//! costs whole lines only.
//!
//! A line names the client address, the method, the canonical path, the verdict, the
//! rules and plan that counted the request and what each rule keys by (`json:/username`),
//! never a key's value or any other header: a bearer key's id is its secret, a username
//! is personal data. It names the client's TLS fingerprint (`ja4`), which says which
//! TLS stack connected, not who.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use limiter_core::ja4::Ja4;
use serde::Serialize;

use crate::{
    appender::{self, Appender},
    limits::{RequestInfo, VerdictKind},
};

/// The writer's handle; dropping it ends the writer thread once the queue is written.
#[derive(Debug)]
pub(super) struct DecisionLog {
    lines: Appender,
    /// Decisions offered for sampling since the start.
    offered: AtomicU64,
}

/// One decision as logged.
#[derive(Debug, Serialize)]
pub(super) struct Entry<'a> {
    /// Unix time, in seconds with milliseconds.
    pub(super) time: f64,
    pub(super) client: IpAddr,
    pub(super) method: &'a str,
    /// The canonical path, without the query.
    pub(super) path: &'a str,
    pub(super) verdict: VerdictKind,
    /// For `delay`, and for `reject` (its `Retry-After`, before `retry_after_jitter`
    /// spreads it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) wait_ms: Option<u64>,
    /// For a request a rule's `concurrency` applies to: how long it waited in the
    /// queue, let in or refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) queued_ms: Option<u64>,
    /// The rules and the plan that counted the request.
    pub(super) policies: Vec<&'a str>,
    /// What each rule that counted or refused the request keys by, as configured:
    /// the kind of key, never its value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) keys: BTreeMap<&'a str, String>,
    /// The plan of the key the request proved.
    pub(super) plan: Option<&'a str>,
    /// The policies that refused it.
    pub(super) violated: &'a [String],
    /// The `tag` rules that applied.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) tagged: &'a [String],
    /// `false` in shadow mode: the verdict was counted, not carried out.
    pub(super) enforced: bool,
    /// The client's TLS fingerprint, if it has one: a stack's, not a person's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ja4: Option<Ja4>,
}

impl<'a> Entry<'a> {
    /// `request` at `now`, forwarded, with nothing counted yet.
    pub(super) fn new(now: Duration, request: &RequestInfo<'a>, enforced: bool) -> Self {
        Self {
            time: (now.as_millis() as f64) / 1000.0,
            client: request.client,
            method: request.method.as_str(),
            path: request.path,
            verdict: VerdictKind::Forward,
            wait_ms: None,
            queued_ms: None,
            policies: Vec::new(),
            keys: BTreeMap::new(),
            plan: None,
            violated: &[],
            tagged: &[],
            enforced,
            ja4: request.ja4,
        }
    }
}

impl DecisionLog {
    /// Opens `path` for appending (created 0640) and starts the writer
    /// ([`crate::appender`]).
    pub(super) fn open(path: &Path) -> std::io::Result<Self> {
        let lines = Appender::spawn("decision-log", appender::open(path)?, Arc::default())?;
        Ok(Self { lines, offered: AtomicU64::new(0) })
    }

    /// Whether this decision is in the sample: exactly one in every `1 / share`,
    /// spread evenly, so that a test (and an operator) can count on the share.
    pub(super) fn sampled(&self, share: f64) -> bool {
        let n = self.offered.fetch_add(1, Ordering::Relaxed) as f64;
        ((n + 1.0) * share).floor() > (n * share).floor()
    }

    pub(super) fn write(&self, entry: &Entry<'_>) {
        let Ok(mut line) = serde_json::to_string(entry) else { return };
        line.push('\n');
        self.lines.send(line);
    }

    pub(super) fn counts(&self) -> (u64, u64) {
        self.lines.counts()
    }
}
