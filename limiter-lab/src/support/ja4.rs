//! Handshakes captured as they cross the loopback (`tcpdump`), and their JA4
//! fingerprints computed from the capture by `ja4.py`, an implementation of the spec
//! of its own: what the proxy computes is checked against another reading of the same
//! bytes.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// `tcpdump` writing what crosses the loopback to or from `port`, until [`Self::finish`].
#[derive(Debug)]
pub struct Capture {
    tcpdump: Child,
    pub file: PathBuf,
}

impl Capture {
    /// Started once tcpdump says it is listening; each packet written as it comes
    /// (`--immediate-mode`: else the kernel's buffer may still hold the handshake
    /// when the capture is stopped).
    #[must_use]
    pub fn start(port: u16) -> Self {
        let file = std::env::temp_dir().join(format!("{}.pcap", super::unique("limiter-ja4-")));
        let mut tcpdump = Command::new("tcpdump")
            .args(["-i", "lo", "--immediate-mode", "-U", "-s", "0", "-Z", "root", "-w"])
            .arg(&file)
            .args(["tcp", "port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (cargo xtask setup installs it)");
        let stderr = tcpdump.stderr.take().expect("tcpdump's stderr");
        let mut lines = BufReader::new(stderr).lines();
        let listening = lines.by_ref().map_while(Result::ok).any(|line| line.contains("listening on"));
        assert!(listening, "tcpdump did not start capturing");
        // Drained, so that tcpdump never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { tcpdump, file }
    }

    /// Stops the capture (SIGINT: tcpdump writes out what it holds) and returns the
    /// JA4 of each ClientHello sent to `port` in it, by `ja4.py`.
    #[must_use]
    pub fn finish(mut self, port: u16) -> Vec<String> {
        let pid = libc::pid_t::try_from(self.tcpdump.id()).expect("a pid");
        // SAFETY: signals the child this capture started and still waits for.
        unsafe { libc::kill(pid, libc::SIGINT) };
        self.tcpdump.wait().expect("tcpdump exits");
        let fingerprints = fingerprints_in(&self.file, port);
        let _ = std::fs::remove_file(&self.file);
        fingerprints
    }
}

/// The JA4 of each ClientHello sent to `port` in the pcap file `file`, by `ja4.py`.
#[must_use]
pub fn fingerprints_in(file: &Path, port: u16) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/support/ja4.py");
    let output = Command::new("python3").arg(script).arg(file).arg(port.to_string()).output().expect("python3");
    assert!(output.status.success(), "ja4.py: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}
