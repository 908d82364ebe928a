//! TLS on the listener, with clients no one here wrote: `openssl s_client` for the
//! versions, ALPN and SNI, curl for requests over HTTP/1.1 and HTTP/2, and the real
//! agent for certificates replaced under it (`limiter reload`, and the watcher).

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio},
    time::{Duration, Instant},
};

use limiter_lab::support::{
    agent::{AgentProcess, agent_section},
    proxy::{RunningProxy, Upstream, raw_exchange},
    tls::TestTls,
    unique,
    wait::assert_about,
};

/// `openssl s_client` on `addr` with `args`, sending nothing: what it printed.
async fn s_client(addr: &str, ca: &Path, args: &[&str]) -> String {
    let output = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", addr, "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("openssl s_client (cargo xtask setup installs it)");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

async fn curl(args: &[&str]) -> Output {
    tokio::process::Command::new("curl").args(["-sS", "--max-time", "10"]).args(args).output().await.expect("curl")
}

#[tokio::test]
async fn tls_1_3_and_1_2_are_spoken_with_alpn_and_older_versions_are_refused() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let proxy = RunningProxy::start(&tls.proxy_head(), upstream.addr).await;
    let addr = proxy.addr.to_string();

    let tls13 = s_client(&addr, &tls.ca, &["-tls1_3", "-alpn", "h2,http/1.1"]).await;
    assert!(tls13.contains("New, TLSv1.3"), "{tls13}");
    assert!(tls13.contains("ALPN protocol: h2"), "{tls13}");
    assert!(tls13.contains("Verify return code: 0 (ok)"), "{tls13}");
    let tls12 = s_client(&addr, &tls.ca, &["-tls1_2", "-alpn", "http/1.1"]).await;
    assert!(tls12.contains("New, TLSv1.2"), "{tls12}");
    assert!(tls12.contains("ALPN protocol: http/1.1"), "{tls12}");

    let before = proxy.proxy.stats().tls_handshake_failures;
    // The client allows TLS 1.1 at security level 0, so the refusal is the server's.
    let tls11 = s_client(&addr, &tls.ca, &["-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0"]).await;
    assert!(!tls11.contains("New, TLSv1.1"), "{tls11}");
    // Counted once the worker sees the handshake end, after the client has the alert.
    proxy.stats_until("the refused handshake counted", |stats| stats.tls_handshake_failures == before + 1).await;
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn curl_verifies_the_certificate_and_is_limited_over_http1_and_http2() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let rule = "[[proxy.rules]]\nname = \"api\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 3\nwindow = \"1m\"\n";
    let proxy = RunningProxy::start(&format!("{}{rule}", tls.proxy_head()), upstream.addr).await;
    let url = format!("https://127.0.0.1:{}/api", proxy.addr.port());
    let ca = tls.ca.display().to_string();
    let mut statuses = Vec::new();
    for version in ["--http1.1", "--http2", "--http1.1", "--http2"] {
        let output =
            curl(&["--cacert", &ca, version, "-o", "/dev/null", "-w", "%{http_version} %{http_code}", &url]).await;
        assert!(output.status.success(), "curl {version}: {}", String::from_utf8_lossy(&output.stderr));
        statuses.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    assert_eq!(statuses, ["1.1 200", "2 200", "1.1 200", "2 429"]);
    let headers = curl(&["--cacert", &ca, "--http2", "-D", "-", "-o", "/dev/null", &url]).await;
    let headers = String::from_utf8_lossy(&headers.stdout);
    assert!(headers.contains("ratelimit-policy: \"api\";q=3;w=60"), "{headers}");
    assert!(headers.contains("retry-after:"), "{headers}");
    assert_eq!(upstream.count(), 3);
    for seen in upstream.seen() {
        assert_eq!(
            seen.headers.get("host").map(|h| h.as_bytes()),
            Some(format!("127.0.0.1:{}", proxy.addr.port()).as_bytes())
        );
    }
    // Without the CA the certificate is not trusted.
    let untrusted = curl(&["-o", "/dev/null", &url]).await;
    assert_eq!(untrusted.status.code(), Some(60), "curl's code for a certificate it cannot verify");
}

#[tokio::test]
async fn the_certificate_is_chosen_by_the_name_the_client_asks_for() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let (api_cert, api_key) = tls.issue("api", "api.example.test", "DNS:api.example.test");
    let sni = format!("[[proxy.tls.sni]]\nname = \"API.example.test\"\ncert = {api_cert:?}\nkey = {api_key:?}\n");
    let proxy = RunningProxy::start(&format!("{}{sni}", tls.proxy_head()), upstream.addr).await;
    let addr = proxy.addr.to_string();
    let named =
        s_client(&addr, &tls.ca, &["-servername", "api.example.test", "-verify_hostname", "api.example.test"]).await;
    assert!(named.contains("subject=CN = api.example.test"), "{named}");
    assert!(named.contains("Verify return code: 0 (ok)"), "{named}");
    let unnamed = s_client(&addr, &tls.ca, &["-noservername"]).await;
    assert!(unnamed.contains("subject=CN = 127.0.0.1"), "{unnamed}");
    let other = s_client(&addr, &tls.ca, &["-servername", "www.example.test"]).await;
    assert!(other.contains("subject=CN = 127.0.0.1"), "the default certificate for a name none has: {other}");
}

#[tokio::test]
async fn a_stalled_client_hello_is_cut_at_header_timeout_and_counted() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let header_timeout = Duration::from_secs(1);
    let config = tls.proxy_head().replace("[proxy.tls]", "header_timeout = \"1s\"\n[proxy.tls]");
    let proxy = RunningProxy::start(&config, upstream.addr).await;
    // A handshake record announcing a ClientHello of 512 bytes, then the first few of
    // them; and a connection that sends nothing at all.
    let half_hello: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
    for (failures, sent) in (1..).zip([half_hello, b""]) {
        let start = Instant::now();
        let response = raw_exchange(proxy.addr, sent).await;
        assert!(!response.contains("HTTP/"), "{response}");
        assert_about(&format!("{} closed", sent.escape_ascii()), start.elapsed(), header_timeout);
        proxy.stats_until("the stalled handshake counted", |stats| stats.tls_handshake_failures == failures).await;
    }
    assert_eq!(upstream.count(), 0);
}

/// A TLS connection held open by `openssl s_client -quiet`, on which requests are
/// written and their answers read, line by line.
struct OpenConnection {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl OpenConnection {
    fn open(addr: &str, ca: &Path) -> Self {
        let mut child = Command::new("openssl")
            .args(["s_client", "-quiet", "-connect", addr, "-CAfile"])
            .arg(ca)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, stdin, stdout }
    }

    /// Sends a GET and reads its whole answer; the status line.
    fn get(&mut self) -> String {
        self.stdin.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write request");
        self.stdin.flush().expect("flush");
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).expect("response") > 0, "closed before the head ended");
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_owned());
        }
        let length: usize = head
            .iter()
            .find_map(|line| line.strip_prefix("content-length: "))
            .and_then(|n| n.parse().ok())
            .expect("content-length");
        let mut body = vec![0; length];
        self.stdout.read_exact(&mut body).expect("body");
        head.first().cloned().unwrap_or_default()
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn subject(agent_addr: &str, ca: &Path) -> String {
    let output = Command::new("openssl")
        .args(["s_client", "-connect", agent_addr, "-CAfile"])
        .arg(ca)
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().find(|line| line.starts_with("subject=")).unwrap_or("<no subject>").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_replaced_under_the_agent_serve_new_connections_and_a_bad_one_is_refused() {
    let (upstream, tls) = (Upstream::start().await, TestTls::new());
    let name = unique("ltls");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let addr = format!("127.0.0.1:{port}");
    let (cert, key) = (tls.dir().join("live.pem"), tls.dir().join("live.key"));
    std::fs::copy(&tls.cert, &cert).expect("cert");
    std::fs::copy(&tls.key, &key).expect("key");
    let config = format!(
        "{}[proxy]\nlisten = \"{addr}\"\nupstream = \"http://{}\"\n[proxy.tls]\ncert = {cert:?}\nkey = {key:?}\n",
        agent_section(&name, ""),
        upstream.addr
    );
    let agent = AgentProcess::start(&name, &config);
    assert_eq!(subject(&addr, &tls.ca), "subject=CN = 127.0.0.1");
    let mut open = OpenConnection::open(&addr, &tls.ca);
    assert_eq!(open.get(), "HTTP/1.1 200 OK");

    // Renewed by `limiter reload`.
    let (renewed_cert, renewed_key) = tls.issue("renewed", "renewed.example.test", "IP:127.0.0.1");
    std::fs::copy(&renewed_cert, &cert).expect("cert");
    std::fs::copy(&renewed_key, &key).expect("key");
    let reload = agent.cli(&["reload"]);
    assert!(reload.status.success(), "{}", String::from_utf8_lossy(&reload.stderr));
    assert!(String::from_utf8_lossy(&reload.stdout).contains("proxy.tls: certificates read again"));
    assert_eq!(subject(&addr, &tls.ca), "subject=CN = renewed.example.test");
    assert_eq!(open.get(), "HTTP/1.1 200 OK", "the connection opened before the reload goes on");

    // A broken certificate is refused, naming the key, and the last good one serves on.
    std::fs::write(&cert, "not a certificate\n").expect("cert");
    let refused = agent.cli(&["reload"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("proxy.tls.cert"), "{stderr}");
    assert_eq!(subject(&addr, &tls.ca), "subject=CN = renewed.example.test");

    // Renewed in place, with no command: the watcher reads the certificate again.
    let (third_cert, third_key) = tls.issue("third", "third.example.test", "IP:127.0.0.1");
    std::fs::copy(&third_key, &key).expect("key");
    std::fs::copy(&third_cert, &cert).expect("cert");
    agent.until(
        "the watcher to apply the renewed certificate",
        || subject(&addr, &tls.ca),
        |subject| subject == "subject=CN = third.example.test",
    );
    assert_eq!(open.get(), "HTTP/1.1 200 OK");
}
