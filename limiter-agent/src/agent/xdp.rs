//! The agent's hold on the kernel layer: the loaded program, its maps and one live
//! link per interface.

use std::collections::BTreeMap;

use aya::programs::links::FdLink;

use crate::{
    config::{Config, xdp::XdpConfig},
    xdp::{self, Attachment, Kernel, LoadOptions, XdpError},
};

/// The loaded program and where it is attached.
pub struct XdpRuntime {
    pub kernel: Kernel,
    links: BTreeMap<String, (Attachment, FdLink)>,
    /// What `[xdp.new_sources]` is scaled by while the upstream sheds; `None`: as
    /// configured.
    pub tightened: Option<f64>,
}

impl std::fmt::Debug for XdpRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpRuntime").field("attached", &self.attachments()).finish_non_exhaustive()
    }
}

impl XdpRuntime {
    /// Loads the program (reusing pinned maps), puts `xdp` in force and attaches
    /// to every interface. Nothing is left attached if an interface fails.
    pub fn start(config: &Config, xdp: &XdpConfig) -> Result<Self, XdpError> {
        let options = LoadOptions { log: true, ..LoadOptions::for_config(config.agent.pin_dir.clone(), xdp) };
        let mut kernel = Kernel::load(&options)?;
        kernel.maps_mut().apply(xdp, config.proxy.as_ref())?;
        let mut runtime = Self { kernel, links: BTreeMap::new(), tightened: None };
        let added = runtime.attach_all(&xdp.interfaces, xdp.mode)?;
        for attachment in added {
            tracing::info!(interface = %attachment.interface, mode = %attachment.mode, "XDP attached");
        }
        // Links pinned by an earlier run for interfaces no longer configured.
        for stale in xdp::attached(&config.agent.pin_dir)? {
            if !xdp.interfaces.contains(&stale.interface) {
                xdp::detach(&config.agent.pin_dir, &stale)?;
                tracing::info!(interface = %stale.interface, "XDP detached (no longer configured)");
            }
        }
        Ok(runtime)
    }

    /// Attaches to each of `interfaces` not attached yet. On failure, the ones this
    /// call attached are detached again and the error is returned.
    pub fn attach_all(
        &mut self,
        interfaces: &[String],
        mode: crate::config::xdp::AttachMode,
    ) -> Result<Vec<Attachment>, XdpError> {
        let mut added = Vec::new();
        let missing: Vec<&String> = interfaces.iter().filter(|i| !self.links.contains_key(*i)).collect();
        for interface in missing {
            match xdp::attach(&mut self.kernel, interface, mode) {
                Ok((attachment, link)) => {
                    added.push(attachment.clone());
                    self.links.insert(interface.clone(), (attachment, link));
                }
                Err(error) => {
                    for attachment in &added {
                        self.detach(&attachment.interface);
                    }
                    return Err(error);
                }
            }
        }
        Ok(added)
    }

    /// Detaches from `interface`: unpins its link and closes ours.
    pub fn detach(&mut self, interface: &str) -> Option<Attachment> {
        let (attachment, link) = self.links.remove(interface)?;
        if let Err(error) = xdp::detach(self.kernel.pin_dir(), &attachment) {
            tracing::warn!(%interface, %error, "unpinning the XDP link failed");
        }
        drop(link);
        Some(attachment)
    }

    /// Detaches from every interface.
    pub fn detach_all(&mut self) -> Vec<Attachment> {
        let interfaces: Vec<String> = self.links.keys().cloned().collect();
        interfaces.iter().filter_map(|i| self.detach(i)).collect()
    }

    #[must_use]
    pub fn attachments(&self) -> Vec<Attachment> {
        self.links.values().map(|(a, _)| a.clone()).collect()
    }
}
