//! `cargo xtask install`: the release binary, the example config (never overwriting
//! an operator's), the key directory and the systemd unit.

use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::util::{cargo_build, cmd, find_program, run as run_cmd, target_dir, workspace_root};

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Installation prefix of the binary (`<prefix>/bin/limiter`).
    #[arg(long, default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Print what would be done, change nothing (not even setup or the build).
    #[arg(long)]
    pub dry_run: bool,
    /// Prefix every destination path with DIR (staging and tests); skips systemctl.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

const UNIT_BINARY: &str = "/usr/local/bin/limiter";

pub fn run(opts: &Opts) -> Result<()> {
    if opts.dry_run {
        println!("would run: cargo build --release -p limiter-agent");
    } else {
        cargo_build(true)?;
    }
    let unit = install(opts, &target_dir().join("release/limiter"), &workspace_root())?;
    let systemd = Path::new("/run/systemd/system").is_dir() && find_program("systemctl").is_some();
    if opts.root.is_some() {
        println!("installed under {}; unit: {}", dest(opts, Path::new("/")).display(), unit.display());
    } else if !systemd {
        println!(
            "systemd unit: {} (systemd is not running here; with systemd: systemctl daemon-reload && systemctl enable --now limiter)",
            unit.display()
        );
    } else if opts.dry_run {
        println!("would run: systemctl daemon-reload");
    } else {
        run_cmd(cmd("systemctl").arg("daemon-reload"))?;
        println!(
            "edit /etc/limiter/limiter.toml ([xdp] interfaces, [proxy] upstream), then: systemctl enable --now limiter"
        );
    }
    Ok(())
}

fn dest(opts: &Opts, path: &Path) -> PathBuf {
    match &opts.root {
        Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

/// Installs every file; returns the unit's path. `src` is the workspace root.
fn install(opts: &Opts, binary: &Path, src: &Path) -> Result<PathBuf> {
    let bin_path = opts.prefix.join("bin/limiter");
    put(opts.dry_run, binary, &dest(opts, &bin_path), 0o755, |t| fs::copy(binary, t).map(drop))?;

    let config = dest(opts, Path::new("/etc/limiter/limiter.toml"));
    let example = src.join("config/limiter.toml");
    if config.exists() {
        println!("kept existing {} (the example is {})", config.display(), example.display());
    } else {
        // Group-readable, for an operator group; it holds secret paths, not secrets.
        put(opts.dry_run, &example, &config, 0o640, |t| fs::copy(&example, t).map(drop))?;
    }

    let keys = dest(opts, Path::new("/etc/limiter/keys"));
    println!("{} {} (700)", if opts.dry_run { "would create" } else { "create" }, keys.display());
    if !opts.dry_run {
        fs::create_dir_all(&keys).with_context(|| format!("cannot create {}", keys.display()))?;
        fs::set_permissions(&keys, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot chmod {}", keys.display()))?;
    }
    restrict_keys(opts.dry_run, &keys)?;

    let template = src.join("packaging/limiter.service");
    let text = fs::read_to_string(&template).with_context(|| format!("cannot read {}", template.display()))?;
    let text = text.replace(UNIT_BINARY, &bin_path.to_string_lossy());
    let unit = dest(opts, Path::new("/etc/systemd/system/limiter.service"));
    put(opts.dry_run, &template, &unit, 0o644, |t| fs::write(t, &text))?;
    Ok(unit)
}

/// Makes every key file already in `keys` 0600: a secret others can read lets them
/// sign as its key (`limiter check` warns about such files too).
fn restrict_keys(dry_run: bool, keys: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(keys) else { return Ok(()) };
    for entry in entries {
        let path = entry.with_context(|| format!("cannot list {}", keys.display()))?.path();
        let meta = fs::metadata(&path).with_context(|| format!("cannot stat {}", path.display()))?;
        if !meta.is_file() || meta.permissions().mode() & 0o777 == 0o600 {
            continue;
        }
        println!("{} {} (600)", if dry_run { "would chmod" } else { "chmod" }, path.display());
        if !dry_run {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot chmod {}", path.display()))?;
        }
    }
    Ok(())
}

/// Writes through a temporary file and a rename, so replacing a running binary does
/// not fail with ETXTBSY and a reader never sees half a file.
fn put(dry_run: bool, from: &Path, to: &Path, mode: u32, write: impl FnOnce(&Path) -> io::Result<()>) -> Result<()> {
    println!("{} {} -> {} ({mode:o})", if dry_run { "would install" } else { "install" }, from.display(), to.display());
    if dry_run {
        return Ok(());
    }
    let dir = to.parent().context("destination has no parent")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = to.with_extension("xtask-tmp");
    write(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", tmp.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("cannot move {} to {}", tmp.display(), to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn installs_into_a_root_and_keeps_an_existing_config() {
        let tmp = std::env::temp_dir().join(format!("xtask-install-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let binary = tmp.join("limiter-built");
        fs::create_dir_all(&tmp).expect("mkdir");
        fs::write(&binary, b"\x7fELF fake").expect("write binary");
        let root = tmp.join("root");
        let opts = Opts { prefix: "/opt/lim".into(), dry_run: true, root: Some(root.clone()) };

        install(&opts, &binary, &workspace_root()).expect("dry run");
        assert!(!root.exists(), "a dry run must not create anything");

        let opts = Opts { dry_run: false, ..opts };
        let unit = install(&opts, &binary, &workspace_root()).expect("install");
        let bin = root.join("opt/lim/bin/limiter");
        let config = root.join("etc/limiter/limiter.toml");
        assert_eq!(fs::read(&bin).expect("bin"), b"\x7fELF fake");
        assert_eq!(mode(&bin), 0o755);
        assert_eq!(
            fs::read(&config).expect("config"),
            fs::read(workspace_root().join("config/limiter.toml")).expect("example")
        );
        assert_eq!(mode(&config), 0o640);
        assert_eq!(mode(&root.join("etc/limiter/keys")), 0o700);
        assert_eq!(unit, root.join("etc/systemd/system/limiter.service"));
        let text = fs::read_to_string(&unit).expect("unit");
        assert!(text.contains("\nExecStart=/opt/lim/bin/limiter run -c /etc/limiter/limiter.toml\n"), "{text}");
        assert!(!text.contains(UNIT_BINARY));
        assert_eq!(mode(&unit), 0o644);

        fs::write(&config, "# the operator's\n").expect("edit config");
        let key = root.join("etc/limiter/keys/k-free-1");
        fs::write(&key, "0123456789abcdef\n").expect("write key");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod key");
        install(&opts, &binary, &workspace_root()).expect("reinstall");
        assert_eq!(fs::read_to_string(&config).expect("config"), "# the operator's\n");
        assert_eq!(mode(&key), 0o600);
        fs::remove_dir_all(&tmp).expect("cleanup");
    }

    #[test]
    fn the_unit_is_hardened_and_systemd_accepts_it() {
        let template = workspace_root().join("packaging/limiter.service");
        let text = fs::read_to_string(&template).expect("unit");
        let settings: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
        for wanted in [
            "LimitNOFILE=1048576",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ReadWritePaths=/sys/fs/bpf /run",
            "ProtectHome=yes",
            "CapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN CAP_SYS_ADMIN CAP_PERFMON CAP_NET_BIND_SERVICE",
        ] {
            assert!(settings.contains(&wanted), "{wanted} missing from {}", template.display());
        }
        let Some(analyze) = find_program("systemd-analyze") else {
            println!("systemd-analyze not installed: the unit's syntax is not checked");
            return;
        };
        // verify wants the ExecStart binary to exist.
        let dir = std::env::temp_dir().join(format!("xtask-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        let unit = dir.join("limiter.service");
        fs::write(&unit, text.replace(UNIT_BINARY, "/bin/true")).expect("write unit");
        let output = std::process::Command::new(analyze).arg("verify").arg(&unit).output().expect("systemd-analyze");
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success() && said.is_empty(), "systemd-analyze verify: {said}");
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
