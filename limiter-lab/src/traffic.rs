//! Bounded UDP traffic from a namespace and a receiver that timestamps arrivals.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::netns::in_namespace;

/// Sends `count` datagrams from `from` (inside `ns`) to `to`, `per_tick` of them
/// every 10 ms; returns how long it took.
pub fn send(ns: &str, from: Ipv4Addr, to: SocketAddr, count: u64, per_tick: u64) -> std::io::Result<Duration> {
    let per_tick = per_tick.max(1);
    in_namespace(ns, || {
        let socket = UdpSocket::bind((from, 0))?;
        let started = Instant::now();
        for i in 0..count {
            // A full socket buffer is part of a flood; the count is what was tried.
            let _ = socket.send_to(&i.to_be_bytes(), to);
            if i % per_tick == per_tick - 1 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(started.elapsed())
    })?
}

/// Arrivals on a UDP socket, recorded by a background thread until dropped.
#[derive(Debug)]
pub struct Receiver {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<(Instant, Ipv4Addr)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn bind(ip: Ipv4Addr) -> std::io::Result<Self> {
        let socket = UdpSocket::bind((ip, 0))?;
        hold_a_flood(&socket)?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let addr = socket.local_addr()?;
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (arrivals, stop) = (arrivals.clone(), stop.clone());
            move || {
                let mut buffer = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, SocketAddr::V4(from))) = socket.recv_from(&mut buffer)
                        && let Ok(mut arrivals) = arrivals.lock()
                    {
                        arrivals.push((Instant::now(), *from.ip()));
                    }
                }
            }
        });
        Ok(Self { addr, arrivals, stop, thread: Some(thread) })
    }

    /// Arrivals from `source` so far, with their times.
    pub fn from(&self, source: Ipv4Addr) -> Vec<Instant> {
        self.arrivals
            .lock()
            .map(|a| a.iter().filter(|(_, s)| *s == source).map(|(t, _)| *t).collect())
            .unwrap_or_default()
    }

    /// Waits until nothing has arrived for `quiet`, so that in-flight datagrams are counted.
    pub fn settle(&self, quiet: Duration) {
        let mut seen = usize::MAX;
        loop {
            std::thread::sleep(quiet);
            let now = self.arrivals.lock().map(|a| a.len()).unwrap_or_default();
            if now == seen {
                return;
            }
            seen = now;
        }
    }
}

/// Room in the socket's buffer for every datagram of a test's flood: on a loaded
/// machine the receiving thread may be held back while the kernel layer passes a
/// second's worth, which a default buffer (a few hundred datagrams) would drop.
fn hold_a_flood(socket: &UdpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let bytes: libc::c_int = 64 << 20;
    // SAFETY: setsockopt on a socket we own, with an int it reads and does not keep.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            // Past net.core.rmem_max: the tests run as root.
            libc::SO_RCVBUFFORCE,
            std::ptr::from_ref(&bytes).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if set == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
