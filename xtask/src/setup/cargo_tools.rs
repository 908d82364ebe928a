//! Tools built with `cargo install`, each at a pinned version.

use anyhow::{Context, Result, bail};

use super::background::Job;
use crate::util::{cmd, find_program};

/// A binary and the `cargo install` arguments that bring it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CargoTool {
    binary: &'static str,
    install: &'static [&'static str],
}

/// Runs the `fuzz/` targets (on nightly, which has the sanitizer and coverage flags
/// libFuzzer needs).
pub const CARGO_FUZZ: CargoTool =
    CargoTool { binary: "cargo-fuzz", install: &["cargo-fuzz", "--version", "=0.13.2", "--locked"] };
/// The bench's fixed-rate load tool (it corrects for coordinated omission), with only
/// the crates a request goes through optimised (see `xtask/oha-profile.toml`; cargo
/// runs from the workspace root). oha needs a TLS feature to build at all, so its
/// default (rustls) stays.
pub const OHA: CargoTool = CargoTool {
    binary: "oha",
    install: &["oha", "--version", "=1.16.0", "--locked", "--config", "xtask/oha-profile.toml"],
};

/// Makes the Debian package. Pinned, as its options and the maintainer scripts it
/// generates change between releases; built without LTO or much optimisation, as what
/// it does takes no time either way and its build would otherwise take minutes.
pub const CARGO_DEB: CargoTool = CargoTool {
    binary: "cargo-deb",
    install: &[
        "cargo-deb",
        "--version",
        "=3.8.0",
        "--locked",
        "--config",
        "profile.release.lto=false",
        "--config",
        "profile.release.opt-level=1",
        "--config",
        "profile.release.codegen-units=16",
    ],
};

impl CargoTool {
    pub fn name(self) -> &'static str {
        self.binary
    }

    pub fn present(self) -> bool {
        find_program(self.binary).is_some()
    }

    /// `cargo install` in the background.
    pub fn install(self) -> Result<Job> {
        let what = self.install.join(" ");
        Job::spawn(self.binary, &format!("`cargo install {what}`"), move |log| {
            let hint = format!("install it by hand, from the repository's root: cargo install {what}");
            log.run(cmd("cargo").arg("install").args(self.install)).context(hint.clone())?;
            if !self.present() {
                bail!("`{}` is not on PATH after cargo install; {hint}", self.binary);
            }
            Ok(())
        })
    }
}
