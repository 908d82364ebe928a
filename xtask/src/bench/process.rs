//! The servers the HTTP groups run (nginx, limiter): started, waited for until they
//! answer, and stopped on drop.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Bench, configs::slug};
use crate::util::cmd;

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether 127.0.0.1:`port` answers an HTTP/1.1 request: a complete answer, not just
/// a listening socket.
pub fn answers_http1(port: u16) -> impl Fn() -> bool {
    move || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1")
    }
}

fn wait_ready(child: &mut Child, name: &str, answers: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited at start: {status}");
        }
        if answers() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("{name} did not answer within 15 s")
}

/// A server child, started once `answers` holds, stopped with SIGTERM (nginx's
/// master then stops its workers) and reaped when dropped.
pub struct Server {
    child: Child,
}

impl Server {
    pub fn nginx(
        bench: &mut Bench,
        nginx: &Path,
        dir: &Path,
        name: &str,
        conf: &str,
        answers: impl Fn() -> bool,
    ) -> Result<Self> {
        fs::create_dir_all(dir.join("tmp"))?;
        let conf_path = dir.join(format!("{}.conf", slug(name)));
        fs::write(&conf_path, conf.replace("PREFIX", &dir.display().to_string()))?;
        let mut c = cmd(nginx);
        c.arg("-p").arg(dir).arg("-e").arg("stderr").arg("-c").arg(&conf_path).stdout(Stdio::null());
        bench.record(&c);
        let child = c.spawn().with_context(|| format!("cannot start nginx ({name})"))?;
        let mut server = Self { child };
        wait_ready(&mut server.child, name, answers)?;
        Ok(server)
    }

    pub fn limiter(
        bench: &mut Bench,
        limiter: &Path,
        dir: &Path,
        name: &str,
        conf: &str,
        answers: impl Fn() -> bool,
    ) -> Result<Self> {
        let conf_path = dir.join(format!("{}.toml", slug(name)));
        fs::write(&conf_path, conf)?;
        let mut c = cmd(limiter);
        c.args(["run", "-c"]).arg(&conf_path).env("LIMITER_LOG", "warn").stdout(Stdio::null());
        bench.record(&c);
        let child = c.spawn().with_context(|| format!("cannot start {}", limiter.display()))?;
        let mut server = Self { child };
        wait_ready(&mut server.child, name, answers)?;
        Ok(server)
    }
}

impl Server {
    /// Waits up to `patience` for the server to exit by itself; whether it did.
    pub fn exited_within(&mut self, patience: Duration) -> Result<bool> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(true);
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(false)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
