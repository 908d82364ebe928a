//! `limiter explain`: which rules, plan and kernel buckets a request or a source
//! meets, with each one's quota now when the agent runs, charging nothing. No peer
//! has this: an operator can ask "what happens to this request?" before and after
//! a change.

use std::{net::IpAddr, path::Path, process::ExitCode, sync::Arc};

use serde_json::{Value, json};

use super::CliError;
use crate::{
    agent::{Request, Response, admin},
    backend::Stores,
    config::{Config, proxy::StoreKind},
    limits::Engine,
    proxy::explain::{ExplainRequest, explain},
    xdp::{KernelMaps, XdpError},
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
    /// The client address: the request's TCP peer, and the source explained at the
    /// kernel layer.
    #[arg(long, default_value = "127.0.0.1")]
    pub ip: IpAddr,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(path: &Path, args: &ExplainArgs) -> Result<ExitCode, CliError> {
    let config = Config::load(path)?;
    let proxy = match &args.path {
        Some(request_path) => Some(explain_request(&config, &request(args, request_path)?)?),
        None => None,
    };
    let kernel = match KernelMaps::open_pinned(&config.agent.pin_dir) {
        Ok(mut maps) => Some(serde_json::to_value(maps.explain_source(args.ip)?)?),
        Err(XdpError::MissingMap(..)) => None,
        Err(error) => return Err(error.into()),
    };
    let explained = json!({ "proxy": proxy, "kernel": kernel });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explained)?);
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
    Ok(ExplainRequest { method: args.method.clone(), path: path.to_owned(), headers, peer: args.ip })
}

/// The running agent's explanation (with live quotas), or the config's alone when no
/// agent answers. `source` says which.
fn explain_request(config: &Config, request: &ExplainRequest) -> Result<Value, CliError> {
    let Some(proxy) = &config.proxy else {
        return Ok(json!({ "source": "config", "error": "the config has no [proxy] section" }));
    };
    let asked = admin::ask_blocking(
        &config.agent.admin_socket,
        &Request::Explain { request: request.clone() },
        super::AGENT_TIMEOUT,
    );
    let (source, explained) = match asked {
        Ok(Response::Explained { mut explanation }) => {
            explanation["source"] = json!("agent");
            return Ok(explanation);
        }
        Ok(Response::Rejected { error }) => ("agent", Err(error)),
        Ok(other) => return Err(CliError::UnexpectedAnswer(format!("{other:?}"))),
        Err(admin::AdminError::Unreachable { .. }) => {
            // Matching needs no state: a memory store that is never looked at.
            let mut offline = proxy.clone();
            offline.store = StoreKind::Memory;
            let stores = Stores::new(&offline)?;
            let engine = Engine::new(&offline, limiter_core::SystemClock, Arc::new(stores));
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            ("config", runtime.block_on(explain(&offline, &engine, request, false)).map_err(|e| e.to_string()))
        }
        Err(error) => return Err(error.into()),
    };
    Ok(match explained {
        Ok(explanation) => {
            let mut value = serde_json::to_value(explanation)?;
            value["source"] = json!(source);
            value
        }
        Err(error) => json!({ "source": source, "error": error }),
    })
}

/// The human form.
fn render(explained: &Value) -> String {
    let mut out = String::new();
    let proxy = &explained["proxy"];
    if let Some(error) = proxy["error"].as_str() {
        out += &format!("proxy: {error}\n");
    } else if proxy.is_object() {
        let key = match (proxy["key"].as_str(), proxy["proof"].as_str()) {
            (Some(key), Some("signature")) => format!("key {key}, if its signature is valid"),
            (Some(key), _) => format!("key {key}, bearer"),
            _ => "no key".to_owned(),
        };
        out += &format!("proxy: {} from {} ({key})\n", proxy["route"].as_str().unwrap_or("?"), text(&proxy["client"]));
        if let Some(rule) = proxy["denied_by"].as_str() {
            out += &format!("  denied (403) by rule {rule}, before the limits\n");
        }
        for rule in proxy["tagged"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            out += &format!("  tagged by rule {rule}\n");
        }
        match proxy["verdict"].as_str() {
            Some(verdict) => {
                let wait = match (verdict, proxy["wait_ms"].as_u64()) {
                    ("reject", Some(ms)) => format!(" (retry after {:.1} s)", ms as f64 / 1000.0),
                    ("delay", Some(ms)) => format!(" (held {:.1} s)", ms as f64 / 1000.0),
                    _ => String::new(),
                };
                out += &format!("  now: {verdict}{wait}\n");
            }
            None => out += "  now: unknown (no agent running: quotas not looked up)\n",
        }
        if let Some(rule) = proxy["missing_key"].as_str() {
            out += &format!("  missing key for rule {rule}: refused before counting\n");
        }
        if proxy["require_signature"].as_bool() == Some(true) {
            out += "  this route requires a signature\n";
        }
        for policy in proxy["policies"].as_array().into_iter().flatten() {
            let quota = match (policy["remaining"].as_u64(), policy["admits"].as_bool()) {
                (Some(remaining), Some(admits)) => {
                    format!("  remaining {remaining}{}", if admits { "" } else { "  refuses" })
                }
                _ => String::new(),
            };
            let limit = format!("{}/{}s", policy["limit"], policy["window_secs"].as_f64().unwrap_or_default());
            out += &format!(
                "  {:<4} {:<16} {:<28} {:<22} {limit:<10}{quota}\n",
                text(&policy["kind"]),
                text(&policy["name"]),
                text(&policy["key"]),
                text(&policy["algorithm"]),
            );
        }
        if proxy["policies"].as_array().is_some_and(Vec::is_empty) && proxy["missing_key"].is_null() {
            out += "  no rule or plan counts it\n";
        }
    }
    let kernel = &explained["kernel"];
    if kernel.is_object() {
        let note = kernel["note"].as_str().map(|n| format!(" ({n})")).unwrap_or_default();
        out += &format!(
            "kernel: {}{note}: {}{}\n",
            text(&kernel["source"]),
            text(&kernel["verdict"]),
            if kernel["enforce"].as_bool() == Some(false) { " (dry run: counted only)" } else { "" }
        );
        if let Some([cidr, left]) = kernel["block"].as_array().map(Vec::as_slice) {
            let left = left.as_u64().map_or("until unblocked".to_owned(), |s| format!("{s} s left"));
            out += &format!("  blocked by {} ({left})\n", text(cidr));
        }
        if kernel["rule"].is_object() {
            out += &format!("  rule {} {}\n", text(&kernel["rule"]["cidr"]), text(&kernel["rule"]["action"]));
        }
        if kernel["limit"].is_object() {
            out += &format!(
                "  bucket {} pps, burst {}\n",
                kernel["limit"]["packets_per_second"], kernel["limit"]["burst"]
            );
        }
        match kernel["bucket"].as_object() {
            Some(bucket) => {
                out += &format!(
                    "  {} packets, {} dropped, {} tokens\n",
                    bucket["packets"], bucket["dropped"], bucket["tokens"]
                );
            }
            None => out += "  no bucket yet (a new source)\n",
        }
        if kernel["verified"].as_bool() == Some(true) {
            out += "  verified: skips the new-source budget, aggregates and SYN budget\n";
        }
    }
    out
}

fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}
