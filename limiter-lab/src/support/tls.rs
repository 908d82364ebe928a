//! Certificates made with openssl for one test: a CA, a certificate for 127.0.0.1
//! signed by it, and more for other names on demand.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// A CA and a certificate for 127.0.0.1 (and `localhost`) signed by it.
#[derive(Debug)]
pub struct TestTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    dir: PathBuf,
}

impl TestTls {
    #[must_use]
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("limiter-tls-{}", super::unique("")));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        let mut tls = Self { ca: dir.join("ca.pem"), cert: PathBuf::new(), key: PathBuf::new(), dir };
        tls.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=limiter test CA",
        ]);
        (tls.cert, tls.key) = tls.issue("server", "127.0.0.1", "IP:127.0.0.1,DNS:localhost");
        tls
    }

    /// A certificate and key signed by the CA, files named after `name`, with
    /// common name `cn` and `subject_alt_names` (openssl's form: `DNS:a,IP:1.2.3.4`).
    #[must_use]
    pub fn issue(&self, name: &str, cn: &str, subject_alt_names: &str) -> (PathBuf, PathBuf) {
        let (key, csr, cert, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        let subject = format!("/CN={cn}");
        self.openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &subject]);
        std::fs::write(self.dir.join(&ext), format!("subjectAltName={subject_alt_names}\n")).expect("extensions");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "1",
            "-extfile",
            &ext,
        ]);
        (self.dir.join(cert), self.dir.join(key))
    }

    /// [`PROXY_HEAD`](super::proxy::PROXY_HEAD) for a listener with this certificate:
    /// TLS, so without `h2c` (HTTP/2 comes by ALPN).
    #[cfg(feature = "agent")]
    #[must_use]
    pub fn proxy_head(&self) -> String {
        let head = super::proxy::PROXY_HEAD.replace("http2.h2c = true\n", "");
        format!("{head}[proxy.tls]\ncert = {:?}\nkey = {:?}\n", self.cert, self.key)
    }

    /// The directory the files are in, removed on drop.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn openssl(&self, args: &[&str]) {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl (cargo xtask setup installs it)");
        assert!(status.success(), "openssl {args:?}");
    }

    /// What a Redis server needs to speak TLS with this certificate (clients need none).
    pub(super) fn redis_server_args(&self) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--tls-cert-file".to_owned(),
            path(&self.cert),
            "--tls-key-file".to_owned(),
            path(&self.key),
            "--tls-ca-cert-file".to_owned(),
            path(&self.ca),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]
    }

    pub(super) fn redis_cli_args(&self) -> Vec<String> {
        vec!["--tls".to_owned(), "--cacert".to_owned(), self.ca.display().to_string()]
    }
}

impl Default for TestTls {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
