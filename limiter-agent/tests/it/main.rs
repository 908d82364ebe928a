//! Every integration test of the agent but one, as modules of one binary: one link
//! of the agent instead of two dozen, and the tests of all of them share the harness's
//! threads. `accept_backoff` stays a binary of its own: it exhausts the process's descriptors.

mod adaptive_xdp;
mod agent_upgrade;
mod byte_budgets;
mod cli_docs;
mod control_plane;
mod escalation_xdp;
mod explain;
mod fleet_redis;
mod fleet_topologies;
mod kernel;
mod proxy_adaptive;
mod proxy_bodies;
mod proxy_body_keys;
mod proxy_bounds;
mod proxy_concurrency;
mod proxy_costs;
mod proxy_count_when;
mod proxy_decisions;
mod proxy_disclose;
mod proxy_escalation;
mod proxy_http2;
mod proxy_ja4;
mod proxy_jwt;
mod proxy_limits;
mod proxy_paths;
mod proxy_patterns;
mod proxy_protocol;
mod proxy_quotas;
mod proxy_refusal;
mod proxy_robustness;
mod proxy_scopes;
mod proxy_shares;
mod proxy_signature;
mod proxy_tls;
mod proxy_upgrade;
mod security_log;
mod services;
mod services_e2e;
mod spoof_e2e;
mod spoofing;
mod top_screen;
mod xdp_attach;
mod xdp_e2e;
