//! Pins need a bpf filesystem; a fresh host may not have one mounted.

use std::{ffi::CString, os::unix::ffi::OsStrExt as _, path::Path};

use super::XdpError;

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Makes sure `pin_dir` exists on a bpf filesystem, mounting bpffs at
/// `/sys/fs/bpf` first where nothing is mounted there (as systemd would).
pub(crate) fn ensure_mounted(pin_dir: &Path) -> Result<(), XdpError> {
    // Two loads at once must not stack two mounts, hiding the first one's pins.
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MOUNTING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !on_bpffs(Path::new(BPFFS_ROOT)) && pin_dir.starts_with(BPFFS_ROOT) {
        mount_bpffs()?;
    }
    std::fs::create_dir_all(pin_dir).map_err(|source| io_error(pin_dir, source))?;
    if !on_bpffs(pin_dir) {
        return Err(io_error(
            pin_dir,
            std::io::Error::other("not on a bpf filesystem: mount one (mount -t bpf bpf DIR) or change agent.pin_dir"),
        ));
    }
    Ok(())
}

fn on_bpffs(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and an out-pointer to a statfs we own.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) };
    rc == 0 && stat.f_type == BPF_FS_MAGIC
}

fn mount_bpffs() -> Result<(), XdpError> {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let (source, target, fstype) = (c("bpf"), c(BPFFS_ROOT), c("bpf"));
    // SAFETY: valid C strings; no data argument.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 { Ok(()) } else { Err(io_error(Path::new(BPFFS_ROOT), std::io::Error::last_os_error())) }
}

pub(super) fn io_error(path: &Path, source: std::io::Error) -> XdpError {
    XdpError::Io { path: path.display().to_string(), source }
}
