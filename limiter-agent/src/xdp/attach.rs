//! Attaching to interfaces through pinned links, so that the filter outlives the
//! agent (`keep_attached_on_exit`) and a restarted agent swaps its program into the
//! same link atomically instead of detaching and re-attaching.
//!
//! A link is pinned as `<pin_dir>/link@<mode>@<interface>`: the name records the
//! mode the kernel accepted, which the kernel does not report for XDP links, and
//! whether it is generic only because the driver refused native (`generic-fallback`),
//! so that `limiter stats` can show the cost cliff. bpffs refuses `.` in names, so
//! the interface (`eth0.100`) is written with `%2E`.

use std::{fmt, path::Path};

use aya::programs::{
    XdpMode,
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
};

use super::{Kernel, XdpError, bpffs::io_error};
use crate::config::xdp::AttachMode;

const LINK_PREFIX: &str = "link@";
/// The mode part of a generic link made after the driver refused native.
const FALLBACK_MODE: &str = "generic-fallback";

/// Where the program is attached, and how.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub interface: String,
    pub mode: AttachedMode,
    /// Generic because the driver refused native under `mode = "auto"`.
    pub fallback: bool,
}

/// The mode an attachment got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachedMode {
    Native,
    Generic,
}

impl AttachedMode {
    fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }

    fn xdp_mode(self) -> XdpMode {
        match self {
            Self::Native => XdpMode::Driver,
            Self::Generic => XdpMode::Skb,
        }
    }
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Attaches the loaded program to `interface` and pins the link. An existing pinned
/// link for the interface (left by an earlier agent) gets the new program swapped in
/// atomically, keeping its mode. Returns the live link; dropping it leaves the
/// filter attached as long as the pin exists.
pub fn attach(kernel: &mut Kernel, interface: &str, mode: AttachMode) -> Result<(Attachment, FdLink), XdpError> {
    let pin_dir = kernel.pin_dir().to_owned();
    let program = kernel.program_mut()?;
    let attach_error = |source| XdpError::Attach { interface: interface.to_owned(), source };
    if let Some(existing) = attached(&pin_dir)?.into_iter().find(|a| a.interface == interface) {
        match swap_into(program, &pin_dir, &existing) {
            Ok(link) => return Ok((existing, link)),
            // A link whose interface went away (and came back) is severed: it can
            // only be dropped and replaced by a fresh attachment.
            Err(error) => {
                tracing::warn!(%interface, %error, "the pinned XDP link cannot be reused; attaching afresh");
                detach(&pin_dir, &existing)?;
            }
        }
    }
    let candidates: &[AttachedMode] = match mode {
        AttachMode::Auto => &[AttachedMode::Native, AttachedMode::Generic],
        AttachMode::Native => &[AttachedMode::Native],
        AttachMode::Generic => &[AttachedMode::Generic],
    };
    let mut native_error = None;
    for &candidate in candidates {
        match program.attach(interface, candidate.xdp_mode()) {
            Ok(id) => {
                let link = program.take_link(id).map_err(attach_error)?;
                let link = FdLink::try_from(link).map_err(XdpError::Link)?;
                let fallback = native_error.is_some();
                if let Some(error) = &native_error {
                    tracing::warn!(
                        %interface, %error,
                        "the driver refused native XDP; attached in generic mode, which costs several times more \
                         per packet (set xdp.mode = \"native\" to refuse to start instead)"
                    );
                }
                let attachment = Attachment { interface: interface.to_owned(), mode: candidate, fallback };
                let pinned = link
                    .pin(link_path(&pin_dir, &attachment))
                    .map_err(|source| XdpError::Pin { interface: interface.to_owned(), source })?;
                return Ok((attachment, FdLink::from(pinned)));
            }
            Err(error) if mode == AttachMode::Native => {
                return Err(XdpError::NativeRefused { interface: interface.to_owned(), source: error });
            }
            Err(error) if candidate == AttachedMode::Native => native_error = Some(error),
            Err(error) => return Err(attach_error(error)),
        }
    }
    Err(attach_error(native_error.unwrap_or(aya::programs::ProgramError::AlreadyAttached)))
}

/// Swaps `program` into the pinned link of `existing`, atomically.
fn swap_into(program: &mut aya::programs::Xdp, pin_dir: &Path, existing: &Attachment) -> Result<FdLink, XdpError> {
    let attach_error = |source| XdpError::Attach { interface: existing.interface.clone(), source };
    let pinned = PinnedLink::from_pin(link_path(pin_dir, existing)).map_err(XdpError::Link)?;
    let link = XdpLink::try_from(FdLink::from(pinned)).map_err(XdpError::Link)?;
    let id = program.attach_to_link(link).map_err(attach_error)?;
    let link = program.take_link(id).map_err(attach_error)?;
    FdLink::try_from(link).map_err(XdpError::Link)
}

/// Interfaces with a pinned link under `pin_dir`.
pub fn attached(pin_dir: &Path) -> Result<Vec<Attachment>, XdpError> {
    let entries = match std::fs::read_dir(pin_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error(pin_dir, error)),
    };
    let mut attachments = Vec::new();
    for entry in entries {
        let name = entry.map_err(|e| io_error(pin_dir, e))?.file_name();
        let Some((mode, interface)) =
            name.to_str().and_then(|n| n.strip_prefix(LINK_PREFIX)).and_then(|n| n.split_once('@'))
        else {
            continue;
        };
        let interface = interface.replace("%2E", ".").replace("%25", "%");
        let (mode, fallback) = match mode {
            "native" => (AttachedMode::Native, false),
            "generic" => (AttachedMode::Generic, false),
            FALLBACK_MODE => (AttachedMode::Generic, true),
            _ => continue,
        };
        attachments.push(Attachment { interface, mode, fallback });
    }
    attachments.sort_by(|a, b| a.interface.cmp(&b.interface));
    Ok(attachments)
}

/// Unpins the link of one interface: once no process holds it, the kernel detaches.
pub fn detach(pin_dir: &Path, attachment: &Attachment) -> Result<(), XdpError> {
    let path = link_path(pin_dir, attachment);
    std::fs::remove_file(&path).map_err(|e| io_error(&path, e))
}

/// Removes every link and map pin under `pin_dir`, and the directory.
pub fn detach_all(pin_dir: &Path) -> Result<Vec<Attachment>, XdpError> {
    let attachments = attached(pin_dir)?;
    for attachment in &attachments {
        detach(pin_dir, attachment)?;
    }
    for map in limiter_common::maps::ALL {
        let path = pin_dir.join(map.name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(&path, error)),
        }
    }
    match std::fs::remove_dir(pin_dir) {
        Ok(()) => Ok(attachments),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(attachments),
        Err(error) => Err(io_error(pin_dir, error)),
    }
}

fn link_path(pin_dir: &Path, attachment: &Attachment) -> std::path::PathBuf {
    let interface = attachment.interface.replace('%', "%25").replace('.', "%2E");
    let mode = if attachment.fallback { FALLBACK_MODE } else { attachment.mode.name() };
    pin_dir.join(format!("{LINK_PREFIX}{mode}@{interface}"))
}
