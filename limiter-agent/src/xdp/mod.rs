//! The kernel layer from user space: load the XDP program, attach and pin it, and
//! read and write its maps — from the running agent or, through the pins, from any
//! CLI command.
//!
//! Minimum kernel: 5.12 (BPF_CMPXCHG in the program; bpf_link for XDP since 5.9).

mod attach;
mod bpffs;
mod explain;
mod load;
mod map_access;
mod maps;
pub(crate) mod stats;
mod tries;
mod verified;

pub use self::{
    attach::{AttachedMode, Attachment, attach, attached, detach, detach_all},
    explain::Limit,
    load::{Floor, Kernel, LoadOptions},
    map_access::{coarse_tick_ns, ephemeral_ports, monotonic_now_ns},
    maps::{BlockEntry, DemotionEntry, KernelMaps},
    stats::CounterSnapshot,
    verified::{Verifier, source_key},
};
pub(crate) use self::{
    bpffs::ensure_mounted,
    explain::SourceExplanation,
    load::Logger,
    stats::{SourceRow, XdpStats},
};

/// Everything that can go wrong in the kernel layer.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("loading the XDP program failed: {0}")]
    Load(#[source] aya::EbpfError),
    #[error("the XDP program is missing from the object (build problem)")]
    MissingProgram,
    #[error("XDP program: {0}")]
    Program(#[source] aya::programs::ProgramError),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {0} is missing: is the agent's program loaded? (pin dir {1})")]
    MissingMap(&'static str, String),
    #[error(
        "pinned map {name} under {dir} has another layout ({found}); it was made by an incompatible \
         build: run `limiter detach` to remove the old program and its state, then start again"
    )]
    IncompatibleLayout { name: &'static str, dir: String, found: String },
    #[error(
        "{0} reaches into ::ffff:0:0/96, where the demotions keep IPv4 sources: write an IPv4 range as \
         IPv4, and an IPv6 one that leaves ::ffff:0:0/96 out"
    )]
    MappedRange(ipnet::IpNet),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("attaching to {interface}: {source}")]
    Attach {
        interface: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("pinning the link of {interface}: {source}")]
    Pin {
        interface: String,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("link: {0}")]
    Link(#[source] aya::programs::links::LinkError),
    #[error(
        "{cidr} holds {sources} sources, more than the {max} one command verifies: write an allow rule \
         ([[xdp.cidr]] action = \"allow\") for a range that wide"
    )]
    TooManySources { cidr: ipnet::IpNet, sources: u64, max: u64 },
    #[error(
        "{interface} refused native XDP ({source}); mode = \"native\" does not fall back: use mode = \"auto\" to \
         accept generic mode, at a much higher cost per packet"
    )]
    NativeRefused {
        interface: String,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("aya-log: {0}")]
    Log(#[source] aya_log::Error),
}
