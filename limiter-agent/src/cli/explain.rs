//! `limiter explain`: which rules, plan and kernel buckets a request or a source
//! meets, with each one's quota now when the agent runs, charging nothing. No peer
//! has this: an operator can ask "what happens to this request?" before and after
//! a change.

use std::{net::IpAddr, path::Path, process::ExitCode, sync::Arc};

use serde::Serialize;

use super::CliError;
use crate::{
    agent::{Request, Response, admin},
    backend::Stores,
    config::{Config, proxy::StoreKind},
    limits::{Engine, VerdictKind},
    proxy::explain::{ExplainRequest, ProofKind, ProxyExplanation, explain},
    xdp::{KernelMaps, SourceExplanation, XdpError},
};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The request's method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// The request's path (a query is ignored, as by the rules); without it only the
    /// kernel layer is explained.
    #[arg(long)]
    pub path: Option<String>,
    /// A header, as `Name: value`; repeat for more.
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// The request's body, read from this file, for the rules keyed on it (`json:`,
    /// `form:`, with the `Content-Type` given as a header).
    #[arg(long, value_name = "PATH")]
    pub body_file: Option<std::path::PathBuf>,
    /// The client address: the request's TCP peer, and the source explained at the
    /// kernel layer.
    #[arg(long, default_value = "127.0.0.1")]
    pub ip: IpAddr,
    /// The JA4 fingerprint of the client's TLS handshake, for the rules keyed on it
    /// (`ja4`, `when.ja4`, `when.ja4_matches`).
    #[arg(long, value_name = "FINGERPRINT")]
    pub ja4: Option<limiter_core::ja4::Ja4>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `limiter explain --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Explained {
    /// `None`: no `--path`, so no request to explain.
    pub proxy: Option<ProxyAnswer>,
    /// `None`: no pinned maps (the agent never ran with `[xdp]`).
    pub kernel: Option<SourceExplanation>,
}

/// The proxy's explanation, and whose it is.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyAnswer {
    pub source: AnswerSource,
    #[serde(flatten)]
    pub outcome: ProxyOutcome,
}

/// Who explained the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerSource {
    /// The running agent, with each bucket's quota now.
    Agent,
    /// The config alone: no agent answered, so nothing was looked up.
    Config,
}

#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum ProxyOutcome {
    Explained(Box<ProxyExplanation>),
    Failed { error: String },
}

pub fn run(path: &Path, args: &ExplainArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let proxy = match &args.path {
        Some(request_path) => Some(explain_request(&config, &request(args, request_path)?)?),
        None => None,
    };
    let kernel = match KernelMaps::open_pinned(&config.agent.pin_dir) {
        Ok(mut maps) => Some(maps.explain_source(args.ip)?),
        Err(XdpError::MissingMap(..)) => None,
        Err(error) => return Err(error.into()),
    };
    let explained = Explained { proxy, kernel };
    if args.json {
        // Through a `Value`, whose maps are sorted: the keys keep the order they had.
        println!("{}", serde_json::to_string_pretty(&serde_json::to_value(&explained)?)?);
    } else {
        print!("{}", render(&explained));
    }
    Ok(ExitCode::SUCCESS)
}

fn request(args: &ExplainArgs, path: &str) -> Result<ExplainRequest, CliError> {
    let headers = args
        .headers
        .iter()
        .map(|header| match header.split_once(':') {
            Some((name, value)) => Ok((name.trim().to_owned(), value.trim().to_owned())),
            None => Err(CliError::Usage(format!("--header {header:?}: expected `Name: value`"))),
        })
        .collect::<Result<_, _>>()?;
    let body = match &args.body_file {
        Some(file) => Some(
            std::fs::read(file).map_err(|error| CliError::Usage(format!("--body-file {}: {error}", file.display())))?,
        ),
        None => None,
    };
    Ok(ExplainRequest {
        method: args.method.clone(),
        path: path.to_owned(),
        headers,
        peer: args.ip,
        body,
        ja4: args.ja4,
    })
}

/// The running agent's explanation (with live quotas), or the config's alone when no
/// agent answers.
fn explain_request(config: &Config, request: &ExplainRequest) -> Result<ProxyAnswer, CliError> {
    let Some(proxy) = &config.proxy else {
        let error = "the config has no [proxy] section".to_owned();
        return Ok(ProxyAnswer { source: AnswerSource::Config, outcome: ProxyOutcome::Failed { error } });
    };
    let asked = admin::ask_blocking(
        &config.agent.admin_socket,
        &Request::Explain { request: request.clone() },
        super::AGENT_TIMEOUT,
    );
    let (source, explained) = match asked {
        Ok(Response::Explained { explanation }) => (AnswerSource::Agent, Ok(explanation)),
        Ok(Response::Rejected { error }) => (AnswerSource::Agent, Err(error)),
        Ok(other) => return Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
        Err(admin::AdminError::Unreachable { .. }) => {
            // Matching needs no state: a memory store that is never looked at.
            let mut offline = proxy.clone();
            offline.store = StoreKind::Memory;
            let stores = Stores::new(&offline)?;
            let engine = Engine::new(&offline, limiter_core::SystemClock, Arc::new(stores));
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            let explained = runtime
                .block_on(explain(&offline, &engine, request, false, None))
                .map(Box::new)
                .map_err(|e| e.to_string());
            (AnswerSource::Config, explained)
        }
        Err(error) => return Err(error.into()),
    };
    let outcome = match explained {
        Ok(explanation) => ProxyOutcome::Explained(explanation),
        Err(error) => ProxyOutcome::Failed { error },
    };
    Ok(ProxyAnswer { source, outcome })
}

/// The human form.
fn render(explained: &Explained) -> String {
    let mut out = String::new();
    match explained.proxy.as_ref().map(|answer| &answer.outcome) {
        Some(ProxyOutcome::Failed { error }) => out += &format!("proxy: {error}\n"),
        Some(ProxyOutcome::Explained(proxy)) => render_proxy(&mut out, proxy),
        None => {}
    }
    if let Some(kernel) = &explained.kernel {
        render_kernel(&mut out, kernel);
    }
    out
}

fn render_proxy(out: &mut String, proxy: &ProxyExplanation) {
    let key = match (&proxy.key, proxy.proof) {
        (Some(key), Some(ProofKind::Signature)) => format!("key {key}, if its signature is valid"),
        (Some(key), _) => format!("key {key}, bearer"),
        _ => "no key".to_owned(),
    };
    *out += &format!("proxy: {} from {} ({key})\n", proxy.route, proxy.client);
    if let Some(rule) = &proxy.denied_by {
        *out += &format!("  denied (403) by rule {rule}, before the limits\n");
    }
    for rule in &proxy.tagged {
        *out += &format!("  tagged by rule {rule}\n");
    }
    if let Some(scopes) = &proxy.scopes {
        *out += &match (&scopes.missing, scopes.status, &proxy.key) {
            (Some(scope), Some(status), Some(key)) => {
                format!("  refused ({status}) before the limits: key {key} does not hold scope {scope}\n")
            }
            (Some(scope), Some(status), None) => {
                format!("  refused ({status}) before the limits: scope {scope} needs a proven key that holds it\n")
            }
            _ if scopes.covering.is_empty() => "  in no scope's area: open to any request\n".to_owned(),
            (_, _, key) => format!(
                "  in the area of scope {}, which key {} holds\n",
                scopes.covering.join(", "),
                key.as_deref().unwrap_or_default()
            ),
        };
    }
    let limits = &proxy.limits;
    match limits.verdict {
        Some(verdict) => {
            let wait = match (verdict, limits.wait_ms) {
                (VerdictKind::Reject, Some(ms)) => format!(" (retry after {:.1} s)", ms as f64 / 1000.0),
                (VerdictKind::Delay, Some(ms)) => format!(" (held {:.1} s)", ms as f64 / 1000.0),
                _ => String::new(),
            };
            *out += &format!("  now: {verdict}{wait}\n");
        }
        None => *out += "  now: unknown (no agent running: quotas not looked up)\n",
    }
    if let Some(rule) = &limits.missing_key {
        *out += &format!("  missing key for rule {rule}: refused before counting\n");
    }
    if limits.require_signature {
        *out += "  this route requires a signature\n";
    }
    for policy in &limits.policies {
        let quota = match (policy.remaining, policy.admits) {
            (Some(remaining), Some(admits)) => {
                format!("  remaining {remaining}{}", if admits { "" } else { "  refuses" })
            }
            _ => String::new(),
        };
        let limit = format!("{}/{}s", policy.limit, policy.window_secs);
        let counted = policy.count_when.as_ref().map(|status| format!("  counts only {}", status.join(", ")));
        let units = Some(&policy.units).filter(|units| *units != "requests").map(|units| format!("  in {units}"));
        *out += &format!(
            "  {:<4} {:<16} {:<28} {:<22} {limit:<10}{quota}{}{}\n",
            policy.kind.to_string(),
            policy.name,
            policy.key,
            policy.algorithm.name(),
            counted.unwrap_or_default(),
            units.unwrap_or_default(),
        );
    }
    for gate in &limits.gates {
        let now = match (gate.inflight, gate.queued) {
            (Some(inflight), Some(queued)) => format!("  now {inflight} in flight, {queued} queued"),
            _ => String::new(),
        };
        *out += &format!(
            "  gate {:<16} {:<28} {} in flight, queue {} for {:.1} s{now}\n",
            gate.rule,
            gate.key,
            gate.concurrency,
            gate.queue,
            gate.queue_timeout_ms as f64 / 1000.0,
        );
    }
    if let Some(adaptive) = &proxy.adaptive {
        *out += &format!(
            "  upstream: adaptive limit {} now, {} in flight, {} queued\n",
            adaptive.limit, adaptive.inflight, adaptive.queued
        );
    }
    if limits.policies.is_empty() && limits.gates.is_empty() && limits.missing_key.is_none() {
        *out += "  no rule or plan counts it\n";
    }
}

fn render_kernel(out: &mut String, kernel: &SourceExplanation) {
    let note = kernel.note.map(|n| format!(" ({n})")).unwrap_or_default();
    *out += &format!(
        "kernel: {}{note}: {}{}\n",
        kernel.source,
        kernel.verdict,
        if kernel.enforce { "" } else { " (dry run: counted only)" }
    );
    if let Some((cidr, left)) = &kernel.block {
        let left = left.map_or("until unblocked".to_owned(), |s| format!("{s} s left"));
        *out += &format!("  blocked by {cidr} ({left})\n");
    }
    if let Some(rule) = &kernel.rule {
        *out += &format!("  rule {} {}\n", rule.cidr, rule.action);
    }
    if let Some((cidr, left)) = &kernel.demoted {
        let left = left.map_or("until undemoted".to_owned(), |s| format!("{s} s left"));
        *out += &format!("  demoted by {cidr} ({left})\n");
    }
    if let Some(limit) = &kernel.limit {
        *out += &format!("  bucket {} pps, burst {}\n", limit.packets_per_second, limit.burst);
    }
    match &kernel.bucket {
        Some(bucket) => {
            *out += &format!("  {} packets, {} dropped, {} tokens\n", bucket.packets, bucket.dropped, bucket.tokens);
        }
        None => *out += "  no bucket yet (a new source)\n",
    }
    if kernel.verified {
        *out += "  verified: skips the new-source budget, aggregates and SYN budget\n";
    }
}
