//! Loading the program: the object is embedded in the agent at build time.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    maps::MapInfo,
    programs::{ProgramError, Xdp},
};
use aya_log::EbpfLogger;
use limiter_common::maps::{self as names, Entries, Sizing};

use super::{XdpError, bpffs, maps::KernelMaps};
use crate::config::xdp::{AggregateConfig, VerifiedConfig, XdpConfig};

/// aya-log's reader, forwarding to the `log` crate.
pub(crate) type Logger = EbpfLogger<&'static dyn log::Log>;

/// The compiled XDP program (built by `build.rs` from `limiter-ebpf`).
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter"));

/// Name of the XDP function in the object.
pub(crate) const PROGRAM_NAME: &str = "limiter";

/// Times a program is handed to the verifier before its EAGAIN is taken for an answer.
const LOAD_ATTEMPTS: u32 = 5;

/// `aya_log_common::Level` values: records at or below the level are emitted.
const LOG_LEVEL_OFF: u8 = 0;
const LOG_LEVEL_INFO: u8 = 3;

/// A do-nothing XDP program of the object: a floor the limiter's cost is measured
/// against. The agent never loads or attaches one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// `xdp_pass`: every frame goes on to the stack.
    Pass,
    /// `xdp_drop`: every frame is dropped, the least a filter can cost.
    Drop,
}

impl Floor {
    /// The program's name in the object.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "xdp_pass",
            Self::Drop => "xdp_drop",
        }
    }
}

/// How to load the program.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Maps are pinned (or found pinned) here.
    pub pin_dir: PathBuf,
    /// Capacity of the sources LRU; only used when the maps are created.
    pub max_sources: u32,
    /// Capacity of the prefix aggregates LRU; likewise.
    pub max_prefixes: u32,
    /// Capacity of the verified sources LRU; likewise.
    pub max_verified: u32,
    /// Forward the program's log records (aya-log) to the `log` crate.
    pub log: bool,
}

impl LoadOptions {
    /// How many entries a map of `entries` is created with.
    #[must_use]
    pub fn entries(&self, entries: Entries) -> u32 {
        match entries {
            Entries::Fixed(n) => n,
            Entries::Configured(Sizing::MaxSources) => self.max_sources,
            Entries::Configured(Sizing::MaxPrefixes) => self.max_prefixes,
            Entries::Configured(Sizing::MaxVerified) => self.max_verified,
        }
    }

    /// The map sizes of `config`, without logging.
    #[must_use]
    pub fn for_config(pin_dir: PathBuf, config: &XdpConfig) -> Self {
        Self {
            pin_dir,
            max_sources: config.max_sources.get(),
            max_prefixes: config.aggregate.max_prefixes.get(),
            max_verified: config.verified.max.get(),
            log: false,
        }
    }

    /// `max_sources` sources and the default sizes of the other maps, without logging.
    #[must_use]
    pub fn with_sources(pin_dir: PathBuf, max_sources: u32) -> Self {
        Self {
            pin_dir,
            max_sources,
            max_prefixes: AggregateConfig::default().max_prefixes.get(),
            max_verified: VerifiedConfig::default().max.get(),
            log: false,
        }
    }
}

/// A loaded (not yet attached) program and its maps.
pub struct Kernel {
    ebpf: Ebpf,
    maps: KernelMaps,
    logger: Option<Logger>,
    pin_dir: PathBuf,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("pin_dir", &self.pin_dir).finish_non_exhaustive()
    }
}

impl Kernel {
    /// Loads the program, reusing maps already pinned under `pin_dir` (so buckets
    /// and counters survive a restart) after checking they have this build's layout.
    pub fn load(options: &LoadOptions) -> Result<Self, XdpError> {
        bpffs::ensure_mounted(&options.pin_dir)?;
        check_pinned_layout(options)?;
        let pins = NewPins::before(&options.pin_dir);
        let kernel = Self::load_pinning(options)?;
        pins.keep();
        Ok(kernel)
    }

    /// [`Self::load`] once the pins found are known to fit.
    fn load_pinning(options: &LoadOptions) -> Result<Self, XdpError> {
        // aya-log checks this level before formatting anything: with logging off,
        // a log statement costs the program one load and one branch.
        let log_level: u8 = if options.log { LOG_LEVEL_INFO } else { LOG_LEVEL_OFF };
        let mut loader = EbpfLoader::new();
        loader.override_global("AYA_LOG_LEVEL", &log_level, true).default_map_pin_directory(&options.pin_dir);
        for map in names::ALL.iter().filter(|map| matches!(map.entries, Entries::Configured(_))) {
            loader.map_max_entries(map.name, options.entries(map.entries));
        }
        let mut ebpf = loader.load(PROGRAM).map_err(XdpError::Load)?;
        let logger = if options.log { Some(EbpfLogger::init(&mut ebpf).map_err(XdpError::Log)?) } else { None };
        let program: &mut Xdp =
            ebpf.program_mut(PROGRAM_NAME).ok_or(XdpError::MissingProgram)?.try_into().map_err(XdpError::Program)?;
        load_program(program)?;
        let maps = KernelMaps::take(&mut ebpf)?;
        if !maps.layout_matches()? {
            return Err(XdpError::IncompatibleLayout {
                name: names::SETTINGS,
                dir: options.pin_dir.display().to_string(),
                found: format!("layout version {}", maps.settings()?.layout_version),
            });
        }
        Ok(Self { ebpf, maps, logger, pin_dir: options.pin_dir.clone() })
    }

    /// The XDP program, for attaching or `BPF_PROG_TEST_RUN`.
    pub fn program(&self) -> Result<&Xdp, XdpError> {
        self.ebpf.program(PROGRAM_NAME).ok_or(XdpError::MissingProgram)?.try_into().map_err(XdpError::Program)
    }

    pub(crate) fn program_mut(&mut self) -> Result<&mut Xdp, XdpError> {
        self.ebpf.program_mut(PROGRAM_NAME).ok_or(XdpError::MissingProgram)?.try_into().map_err(XdpError::Program)
    }

    /// The object's `floor` program, loaded on first use (for a test run, or to
    /// attach on a bench's link).
    pub fn floor(&mut self, floor: Floor) -> Result<&mut Xdp, XdpError> {
        let program: &mut Xdp = self
            .ebpf
            .program_mut(floor.name())
            .ok_or(XdpError::MissingProgram)?
            .try_into()
            .map_err(XdpError::Program)?;
        if program.fd().is_err() {
            load_program(program)?;
        }
        Ok(program)
    }

    #[must_use]
    pub fn maps(&self) -> &KernelMaps {
        &self.maps
    }

    pub fn maps_mut(&mut self) -> &mut KernelMaps {
        &mut self.maps
    }

    #[must_use]
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The aya-log reader, to be polled while the program runs; dropping it closes
    /// the log ring buffer the program writes to.
    pub(crate) fn take_logger(&mut self) -> Option<Logger> {
        self.logger.take()
    }
}

/// The maps a load pins that were not pinned before it: aya creates and pins them
/// one by one, so a map the kernel refuses (too large for its memory), or a program
/// it refuses, would leave the ones before it pinned at the sizes of a config that
/// never ran, for the next start to trip over. Dropped before [`Self::keep`], it
/// unpins them; maps an earlier run pinned stay, with their buckets.
struct NewPins {
    dir: PathBuf,
    existed: [bool; names::ALL.len()],
    kept: bool,
}

impl NewPins {
    fn before(dir: &Path) -> Self {
        Self { dir: dir.to_owned(), existed: names::ALL.map(|map| dir.join(map.name).exists()), kept: false }
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for NewPins {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        for (map, existed) in names::ALL.iter().zip(self.existed) {
            let path = self.dir.join(map.name);
            if !existed
                && path.exists()
                && let Err(error) = std::fs::remove_file(&path)
            {
                tracing::warn!(path = %path.display(), %error, "unpinning a map of the failed load failed");
            }
        }
    }
}

/// Refuses pinned maps whose kind or record sizes differ from this build's: aya
/// would otherwise reuse them silently and the program would misread them.
fn check_pinned_layout(options: &LoadOptions) -> Result<(), XdpError> {
    let pin_dir = &options.pin_dir;
    for map in names::ALL {
        let path = pin_dir.join(map.name);
        if !path.exists() {
            continue;
        }
        let name = map.name;
        let info = MapInfo::from_pin(&path).map_err(|source| XdpError::Map { name, source })?;
        let found = (info.key_size() as usize, info.value_size() as usize, info.max_entries());
        let records_match = (found.0, found.1) == (map.key_size, map.value_size);
        if records_match && found.2 == options.entries(map.entries) {
            continue;
        }
        let hint = match map.entries {
            Entries::Configured(sizing) if records_match => {
                format!("{} {} pinned, {} configured", sizing.key(), found.2, options.entries(map.entries))
            }
            _ => format!("key {} bytes, value {} bytes, {} entries", found.0, found.1, found.2),
        };
        return Err(XdpError::IncompatibleLayout { name, dir: pin_dir.display().to_string(), found: hint });
    }
    Ok(())
}

/// Loads `program`, again if the verifier gave up with EAGAIN: it does when a signal
/// is pending on the loading thread (a child process that exited, under the agent's
/// or a test harness's SIGCHLD handler), whatever the program; libbpf retries alike.
fn load_program(program: &mut Xdp) -> Result<(), XdpError> {
    let mut attempt = 1;
    loop {
        match program.load() {
            Err(ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempt < LOAD_ATTEMPTS =>
            {
                attempt += 1;
            }
            result => return result.map_err(XdpError::Program),
        }
    }
}
