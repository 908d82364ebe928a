//! `cargo xtask package`: the Debian package, made by cargo-deb from what
//! `[package.metadata.deb]` in limiter-agent/Cargo.toml lists: the binary (with the
//! eBPF program inside), its completions and manual pages, the example config as a
//! conffile, the systemd unit, the Grafana dashboard and the alert rules.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{
    install::{MAN_PAGES, install_docs},
    setup::{BUILD_STEPS, CARGO_DEB, DPKG_DEV, Needs},
    util::{cargo_build, cmd, show, target_dir},
};

/// The build, cargo-deb and the `dpkg-shlibdeps` it finds the package's Depends with.
pub const NEEDS: Needs = Needs { steps: BUILD_STEPS, debian: &[DPKG_DEV], cargo: &[CARGO_DEB] };

#[derive(Debug, clap::Args)]
pub struct Opts {
    /// Package the debug build: made in seconds, for trying the package, never for
    /// production (unoptimised, and cargo-deb warns that it does not support it).
    #[arg(long)]
    pub debug: bool,
}

/// The cargo profile whose binary is packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Release,
    Dev,
}

impl Profile {
    /// Its directory under the target directory.
    fn dir(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "debug",
        }
    }
}

pub fn run(opts: &Opts) -> Result<()> {
    let profile = if opts.debug { Profile::Dev } else { Profile::Release };
    cargo_build(profile == Profile::Release)?;
    let deb = build(profile, &target_dir().join("debian"))?;
    println!(
        "package: {}\ninstall it with: dpkg -i {0}; edit /etc/limiter/limiter.toml, then: systemctl enable --now limiter",
        deb.display()
    );
    Ok(())
}

/// Makes the package of the binary `profile` has already built into `output` and
/// returns its path. The completions and manual pages are written by that binary,
/// into the staging directory the manifest's assets name.
fn build(profile: Profile, output: &Path) -> Result<PathBuf> {
    let built = target_dir().join(profile.dir());
    let binary = built.join("limiter");
    if !binary.is_file() {
        bail!("{} is not built", binary.display());
    }
    let staging = built.join("deb-assets");
    // A page or script of an older build must not be packaged.
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("cannot clear {}", staging.display()))?;
    }
    let share = staging.join("share");
    install_docs(false, &binary, &share)?;
    gzip_man_pages(&share.join(MAN_PAGES))?;

    let mut c = cmd("cargo");
    c.args(["deb", "-p", "limiter-agent", "--no-build", "--output"]).arg(output);
    if profile == Profile::Dev {
        // Stripped of its line tables (half its size) and gzipped by gzip -1: made
        // in 4 s here, where xz takes 10 s even with --fast, 75 s without.
        c.args(["--profile", "dev", "--strip", "--compress-type", "gz", "--compress-system", "--fast"]);
    }
    let line = show(&c);
    println!("{line}");
    let out = c.output().with_context(|| format!("cannot start `{line}`"))?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("`{}` failed: {}\n{stdout}", line.trim_start_matches("$ "), out.status);
    }
    // cargo-deb prints the path of the package it made, last.
    let deb = stdout.lines().last().map(PathBuf::from).filter(|p| p.is_file());
    deb.with_context(|| format!("cargo deb did not name the package it made: {stdout}"))
}

/// Debian policy wants manual pages gzipped; cargo-deb compresses only the pages it
/// did not find under the target directory. `-n`: no name or time stamp inside, so
/// the same page makes the same file.
fn gzip_man_pages(dir: &Path) -> Result<()> {
    let pages: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot list {}", dir.display()))?;
    if pages.is_empty() {
        bail!("no manual pages in {}", dir.display());
    }
    crate::util::run(cmd("gzip").arg("-9nf").args(&pages))
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt, process::Output};

    use super::*;
    use crate::{
        install::COMPLETIONS,
        util::{find_program, workspace_root},
    };

    const PACKAGE: &str = "limiter";
    const CONFIG: &str = "/etc/limiter/limiter.toml";
    const KEYS: &str = "/etc/limiter/keys";
    const EXAMPLE_KEY: &str = "/etc/limiter/keys/k-free-1";
    /// A key file as an operator adds one, which purge must keep.
    const OPERATOR_KEY: &str = "/etc/limiter/keys/k-operator";
    const UNIT: &str = "/usr/lib/systemd/system/limiter.service";
    /// What systemd and deb-systemd-helper keep of the unit outside the package's
    /// files: its mask (while removed, not purged), its enablement and the record
    /// of it.
    const UNIT_STATE: [&str; 3] = [
        "/etc/systemd/system/limiter.service",
        "/etc/systemd/system/multi-user.target.wants/limiter.service",
        "/var/lib/systemd/deb-systemd-helper-enabled/limiter.service.dsh-also",
    ];

    fn run(program: &str, args: &[&str]) -> Output {
        let output = cmd(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{program} {args:?}: {}\n{said}", output.status);
        output
    }

    fn stdout(program: &str, args: &[&str]) -> String {
        String::from_utf8_lossy(&run(program, args).stdout).into_owned()
    }

    /// `dpkg ACTION TARGET` without running triggers: man-db's rebuilds its index
    /// of every page on the machine, 13 s each time on a busy machine here, so
    /// [`Installed`] runs the pending ones once, at the end.
    fn dpkg(action: &str, target: &str) -> Output {
        run("dpkg", &["--no-triggers", action, target])
    }

    fn mode(path: &str) -> u32 {
        fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}")).permissions().mode() & 0o7777
    }

    fn same_file(installed: &str, source: &str) {
        let source = workspace_root().join(source);
        assert_eq!(fs::read(installed).expect(installed), fs::read(&source).expect("source"), "{installed}");
    }

    /// Purges the package when the test ends, however it ends, with the key file
    /// the test added, and runs the triggers its steps left pending: the machine
    /// is left as it was.
    struct Installed;

    impl Installed {
        fn new(deb: &Path) -> Self {
            let installed = Installed;
            dpkg("-i", &deb.to_string_lossy());
            installed
        }
    }

    impl Drop for Installed {
        fn drop(&mut self) {
            let _ = cmd("dpkg").args(["--no-triggers", "--purge", PACKAGE]).output();
            let _ = fs::remove_file(OPERATOR_KEY);
            let _ = fs::remove_dir(KEYS);
            let _ = fs::remove_dir("/etc/limiter");
            let _ = cmd("dpkg").args(["--triggers-only", "--pending"]).output();
        }
    }

    /// The test replaces whatever is installed at the package's paths, so it runs
    /// only where there is none of it.
    fn assert_nothing_of_the_package_here() {
        let status = cmd("dpkg-query").args(["-W", "-f=${db:Status-Status}", PACKAGE]).output().expect("dpkg-query");
        let status = String::from_utf8_lossy(&status.stdout);
        assert!(
            status.is_empty() || status == "not-installed",
            "the {PACKAGE} package is {status} on this machine, and this test would replace it: \
             dpkg --purge {PACKAGE} first, or skip the test"
        );
        for path in [&["/usr/bin/limiter", "/etc/limiter"][..], &UNIT_STATE].concat() {
            assert!(fs::symlink_metadata(path).is_err(), "{path} exists, and this test would replace or remove it");
        }
    }

    /// The package of the debug binary `cargo xtask test` has just built, installed
    /// on this machine with dpkg: its files and modes, `limiter check` of the
    /// installed config, the unit as systemd reads it; then removed (the conffile
    /// stays), purged (nothing stays), and purged again with a key file an operator
    /// added (that file stays). Needs root.
    #[test]
    fn the_package_installs_checks_and_purges_clean() {
        let _lab = crate::util::LAB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The machine has one dpkg database: a suite run in another worktree at the
        // same time would install and purge the package under this one.
        let machine = fs::File::create("/run/lock/limiter-package-test").expect("lock file");
        machine.lock().expect("lock");
        assert!(
            target_dir().join("debug/limiter").is_file(),
            "run through `cargo xtask test` (cargo test --workspace builds target/debug/limiter)"
        );
        assert_nothing_of_the_package_here();
        let output = std::env::temp_dir().join(format!("xtask-package-{}", std::process::id()));
        let deb = build(Profile::Dev, &output).expect("package");

        let installed = Installed::new(&deb);
        // Without "/.", which every package lists.
        let files: Vec<String> = stdout("dpkg", &["-L", PACKAGE]).lines().skip(1).map(str::to_owned).collect();
        assert_eq!(mode("/usr/bin/limiter"), 0o755);
        same_file(CONFIG, "config/limiter.toml");
        assert_eq!(mode(CONFIG), 0o640);
        assert_eq!(stdout("dpkg-query", &["-W", "-f=${Conffiles}", PACKAGE]).split_whitespace().next(), Some(CONFIG));
        assert_eq!(mode(KEYS), 0o700);
        assert_eq!(mode(EXAMPLE_KEY), 0o600);
        let secret = fs::read_to_string(EXAMPLE_KEY).expect("example key");
        assert!(secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit()), "{secret:?}");
        same_file(UNIT, "packaging/limiter.service");
        assert_eq!(mode(UNIT), 0o644);
        same_file("/usr/share/limiter/grafana/limiter.json", "packaging/grafana/limiter.json");
        same_file("/usr/share/limiter/prometheus/limiter-rules.yml", "packaging/prometheus/limiter-rules.yml");
        for (_, path) in COMPLETIONS {
            assert_eq!(mode(&format!("/usr/share/{path}")), 0o644, "{path}");
        }
        let pages: Vec<&String> = files.iter().filter(|f| f.starts_with("/usr/share/man/man1/")).collect();
        assert!(pages.iter().any(|p| p.as_str() == "/usr/share/man/man1/limiter.1.gz"), "{pages:?}");
        assert!(pages.iter().all(|p| p.ends_with(".gz")), "{pages:?}");
        // $auto: dpkg-shlibdeps on the binary, which links libc and libgcc_s; cargo-deb
        // leaves out libgcc-s1, which every Debian system has (priority required).
        let depends = stdout("dpkg-query", &["-W", "-f=${Depends}", PACKAGE]);
        assert!(depends.starts_with("libc6 (>= ") && !depends.contains(','), "{depends}");

        // As shipped, the config checks clean: the example key's secret was generated.
        let check = run("/usr/bin/limiter", &["check", "-c", CONFIG]);
        assert_eq!(String::from_utf8_lossy(&check.stderr), "", "limiter check warned");
        assert!(String::from_utf8_lossy(&check.stdout).starts_with(&format!("{CONFIG}: ok (xdp, proxy)\n")));
        run("bash", &["-c", "source /usr/share/bash-completion/completions/limiter && complete -p limiter"]);
        match find_program("systemd-analyze") {
            Some(analyze) => {
                let verify = run(&analyze.to_string_lossy(), &["verify", UNIT]);
                let said = [verify.stdout, verify.stderr].concat();
                assert!(said.is_empty(), "systemd-analyze verify: {}", String::from_utf8_lossy(&said));
            }
            None => println!("systemd-analyze not installed: the installed unit is not verified"),
        }
        // As the operator does (no --now: the test does not run the agent); purge
        // must take the enablement away with the unit.
        match find_program("systemctl") {
            Some(systemctl) => {
                run(&systemctl.to_string_lossy(), &["enable", PACKAGE]);
            }
            None => println!("systemctl not installed: purging an enabled unit is not tried"),
        }

        dpkg("-r", PACKAGE);
        same_file(CONFIG, "config/limiter.toml");
        assert!(Path::new(EXAMPLE_KEY).is_file(), "remove keeps the configuration");
        let left: Vec<&String> = files.iter().filter(|f| Path::new(f).is_file() && f.as_str() != CONFIG).collect();
        assert!(left.is_empty(), "dpkg -r left {left:?}");

        dpkg("--purge", PACKAGE);
        let dirs_left: Vec<&str> = files.iter().map(String::as_str).filter(|f| Path::new(f).exists()).collect();
        assert!(dirs_left.iter().all(|d| Path::new(d).is_dir()), "purge left {dirs_left:?}");
        // A directory may stay only as another package's (/usr/share/man, ...).
        run("dpkg-query", &[&["-S"], dirs_left.as_slice()].concat());
        for path in [&["/etc/limiter"][..], &UNIT_STATE].concat() {
            assert!(fs::symlink_metadata(path).is_err(), "purge left {path}");
        }

        dpkg("-i", &deb.to_string_lossy());
        fs::write(OPERATOR_KEY, "an operator's secret, not the package's\n").expect("operator key");
        let purge = dpkg("--purge", PACKAGE);
        assert!(String::from_utf8_lossy(&purge.stderr).contains("limiter: kept /etc/limiter"), "{purge:?}");
        assert!(Path::new(OPERATOR_KEY).is_file(), "purge removed a key file the package did not install");
        assert!(!Path::new(EXAMPLE_KEY).exists() && !Path::new(CONFIG).exists());
        drop(installed);
        assert!(!Path::new("/etc/limiter").exists());
        fs::remove_dir_all(&output).expect("cleanup");
    }
}
