//! A namespace behind a veth with the agent attached to the host side: the kernel
//! layer's end-to-end test bench.

use std::net::Ipv4Addr;

use super::{
    agent::{AgentProcess, agent_section},
    unique,
};
use crate::netns::VethNamespace;

/// The lab: clients inside `net.ns` at `sources`, the host at `host_ip`, the agent
/// attached to `net.host_if`.
#[derive(Debug)]
pub struct XdpLab {
    pub name: String,
    pub host_ip: Ipv4Addr,
    pub sources: Vec<Ipv4Addr>,
    // Field order is drop order: the agent goes before the namespace.
    pub agent: AgentProcess,
    pub net: VethNamespace,
}

impl XdpLab {
    /// Starts a lab with `sources` client addresses; `agent_extra` goes into
    /// `[agent]`, `xdp_body` into `[xdp]` after the interface list.
    pub fn start(sources: u8, agent_extra: &str, xdp_body: &str) -> Self {
        let name = unique("lim-");
        let net_id = 100 + u8::try_from(std::process::id() % 100).unwrap_or(0);
        let subnet = u8::try_from(name.len() * 7 % 200).unwrap_or(0) + u8::try_from(crate_counter() % 50).unwrap_or(0);
        let host_ip = Ipv4Addr::new(10, net_id, subnet, 1);
        let sources: Vec<Ipv4Addr> = (0..sources).map(|i| Ipv4Addr::new(10, net_id, subnet, 2 + i)).collect();
        let source_cidrs: Vec<String> = sources.iter().map(|s| format!("{s}/24")).collect();
        let source_refs: Vec<&str> = source_cidrs.iter().map(String::as_str).collect();
        let host_if = format!("{}h", &name[..name.len().min(13)]);
        let net =
            VethNamespace::new(&name, &host_if, "eth0", &format!("{host_ip}/24"), &source_refs).expect("veth lab");
        let config = Self::config_text(&name, &host_if, agent_extra, xdp_body);
        let agent = AgentProcess::start(&name, &config);
        Self { name, host_ip, sources, agent, net }
    }

    /// The config text for this lab with another `[xdp]` body (for reloads).
    pub fn config_with(&self, agent_extra: &str, xdp_body: &str) -> String {
        Self::config_text(&self.name, &self.net.host_if, agent_extra, xdp_body)
    }

    fn config_text(name: &str, host_if: &str, agent_extra: &str, xdp_body: &str) -> String {
        format!("{}[xdp]\ninterfaces = [\"{host_if}\"]\n{xdp_body}\n", agent_section(name, agent_extra))
    }
}

fn crate_counter() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
