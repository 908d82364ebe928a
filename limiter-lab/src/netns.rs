//! Network namespaces and veth pairs for end-to-end tests, removed on drop.

use std::process::Command;

/// Runs `ip` with `args`.
pub fn ip(args: &[&str]) -> std::io::Result<()> {
    let output = Command::new("ip").args(args).output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim())))
    }
}

/// A namespace `ns` joined to the host by a veth pair: `host_if` (host side, with
/// `host_addr`) and `ns_if` (inside, with `ns_addr`). Addresses are CIDRs.
#[derive(Debug)]
pub struct VethNamespace {
    pub ns: String,
    pub host_if: String,
}

/// A veth lab for an agent's kernel layer: the host side at 10.N.subnet.1, the
/// client inside at 10.N.subnet.2 (N from the process id, so that test runs side by
/// side differ), and a port free on the host address for the proxy.
#[derive(Debug)]
pub struct HostLab {
    pub lab: VethNamespace,
    pub host: std::net::Ipv4Addr,
    pub client: std::net::Ipv4Addr,
    pub listen: std::net::SocketAddr,
}

impl HostLab {
    /// Named `name` (its host interface after it), on `subnet`.
    #[must_use]
    pub fn new(name: &str, subnet: u8) -> Self {
        let net = 200 + u8::try_from(std::process::id() % 50).unwrap_or(0);
        let host = std::net::Ipv4Addr::new(10, net, subnet, 1);
        let client = std::net::Ipv4Addr::new(10, net, subnet, 2);
        let lab = VethNamespace::new(
            name,
            &format!("{}h", &name[..name.len().min(13)]),
            "eth0",
            &format!("{host}/24"),
            &[&format!("{client}/24")],
        )
        .expect("veth lab");
        let port = std::net::TcpListener::bind((host, 0)).and_then(|l| l.local_addr()).expect("free port").port();
        Self { lab, host, client, listen: std::net::SocketAddr::from((host, port)) }
    }

    /// An `[xdp]` section on the lab's host interface whose per-source bucket no test's
    /// traffic fills, so that only what a test adds after it drops anything.
    #[must_use]
    pub fn xdp_section(&self) -> String {
        format!(
            "[xdp]\ninterfaces = [\"{}\"]\nmode = \"auto\"\n[xdp.limit]\npackets_per_second = 100000\nburst = 100000\n",
            self.lab.host_if
        )
    }
}

impl VethNamespace {
    pub fn new(ns: &str, host_if: &str, ns_if: &str, host_addr: &str, ns_addrs: &[&str]) -> std::io::Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        let _ = Command::new("ip").args(["link", "del", host_if]).output();
        ip(&["netns", "add", ns])?;
        let created = Self { ns: ns.to_owned(), host_if: host_if.to_owned() };
        ip(&["link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns])?;
        ip(&["addr", "add", host_addr, "dev", host_if])?;
        ip(&["link", "set", host_if, "up"])?;
        for addr in ns_addrs {
            ip(&["-n", ns, "addr", "add", addr, "dev", ns_if])?;
        }
        ip(&["-n", ns, "link", "set", ns_if, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(created)
    }

    /// A command run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns, program]);
        command
    }
}

impl Drop for VethNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Runs `f` on a thread that has entered namespace `ns` (setns affects only the
/// calling thread), so sockets it opens live in the namespace.
pub fn in_namespace<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| enter(ns).map(|()| f()))
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("namespace thread panicked")))
    })
}

/// [`in_namespace`] on a detached thread, for work that runs alongside the caller.
pub fn spawn_in_namespace<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<T>> {
    let ns = ns.to_owned();
    std::thread::spawn(move || enter(&ns).map(|()| f()))
}

/// Moves the calling thread into namespace `ns`.
fn enter(ns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    // SAFETY: setns on a valid namespace fd, for this thread only.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
