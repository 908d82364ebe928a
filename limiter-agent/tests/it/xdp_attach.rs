//! Attaching to real links: a device without native XDP (loopback), and a jumbo-MTU
//! veth that only a multi-buffer (`xdp.frags`) program may attach to natively.
//! Needs root.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
};

use limiter::{
    config::xdp::AttachMode,
    xdp::{self, AttachedMode, XdpError},
};
use limiter_common::counters::Counter;
use limiter_lab::{
    netns::{VethNamespace, in_namespace, ip},
    support::{
        agent::{agent_section, limiter_bin},
        kernel::{TestKernel, xdp_config},
        unique,
    },
};

/// A namespace whose loopback stands for a device without native XDP: `lo`'s
/// driver has none (unlike veth), and a namespace gives each test its own.
fn namespace() -> VethNamespace {
    let name = unique("lnat");
    VethNamespace::new(&name, &format!("{name}h"), "eth0", "10.99.78.1/24", &["10.99.78.2/24"]).expect("namespace")
}

fn kernel() -> TestKernel {
    TestKernel::new(&xdp_config("[xdp.limit]\npackets_per_second = 1000\nburst = 1000\n"))
}

#[test]
fn native_mode_fails_loudly_where_the_driver_refuses_it() {
    let net = namespace();
    let mut kernel = kernel();
    let error = in_namespace(&net.ns, || xdp::attach(&mut kernel.kernel, "lo", AttachMode::Native).map(|_| ()))
        .expect("namespace")
        .expect_err("lo has no native XDP");
    assert!(matches!(error, XdpError::NativeRefused { .. }), "{error:?}");
    assert!(error.to_string().contains("does not fall back"), "{error}");
    assert!(xdp::attached(&kernel.pin_dir).expect("links").is_empty(), "nothing left attached");
}

#[test]
fn auto_mode_records_a_fallback_to_generic() {
    let net = namespace();
    let mut kernel = kernel();
    let (attachment, _link) = in_namespace(&net.ns, || xdp::attach(&mut kernel.kernel, "lo", AttachMode::Auto))
        .expect("namespace")
        .expect("generic attach");
    assert_eq!((attachment.mode, attachment.fallback), (AttachedMode::Generic, true));
    // What `limiter stats` and the metrics read back from the pins.
    let attached = xdp::attached(&kernel.pin_dir).expect("links");
    assert_eq!(attached, [attachment]);
    let (generic, _link) =
        xdp::attach(&mut kernel.kernel, &net.host_if, AttachMode::Generic).expect("generic on request");
    assert!(!generic.fallback, "generic by request is no fallback");
}

#[test]
fn native_attach_to_a_jumbo_mtu_veth_passes_jumbo_frames() {
    let name = unique("ljmb");
    let (host, inside) = (Ipv4Addr::new(10, 99, 77, 1), Ipv4Addr::new(10, 99, 77, 2));
    let net = VethNamespace::new(&name, &format!("{name}h"), "eth0", &format!("{host}/24"), &[&format!("{inside}/24")])
        .expect("veth");
    ip(&["link", "set", &net.host_if, "mtu", "9000"]).expect("host mtu");
    ip(&["-n", &net.ns, "link", "set", "eth0", "mtu", "9000"]).expect("namespace mtu");
    let mut kernel = kernel();
    let (attachment, _link) =
        xdp::attach(&mut kernel.kernel, &net.host_if, AttachMode::Native).expect("native attach at MTU 9000");
    assert_eq!((attachment.mode, attachment.fallback), (AttachedMode::Native, false));

    let receiver = UdpSocket::bind((host, 0)).expect("receiver");
    receiver.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let to = receiver.local_addr().expect("addr");
    const JUMBO: usize = 8_500;
    in_namespace(&net.ns, || {
        let socket = UdpSocket::bind((inside, 0)).expect("sender");
        socket.send_to(&[7u8; JUMBO], to).expect("send jumbo datagram");
    })
    .expect("namespace");
    let mut buffer = vec![0u8; 9_000];
    let (len, from) = receiver.recv_from(&mut buffer).expect("the jumbo datagram arrives");
    assert_eq!((len, from.ip()), (JUMBO, std::net::IpAddr::V4(inside)));
    assert_eq!(kernel.counter(Counter::Malformed), 0, "a multi-buffer frame is whole, not cut short");
    assert!(kernel.counter(Counter::Passed) >= 1);
}

/// A memory cgroup of its own, under the one this test runs in, removed on drop (once
/// its process has exited): the kernel charges a BPF map's memory to the cgroup of
/// the process creating it, so within this limit a map larger than it is refused as
/// on a host that has not the memory.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn new(name: &str, limit_bytes: u64) -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("own cgroups");
        // cgroup v1's memory hierarchy if mounted, else the unified one.
        let (root, path, limit_file) = match own.lines().find_map(|l| l.split_once(":memory:")) {
            Some((_, path)) => ("/sys/fs/cgroup/memory", path.to_owned(), "memory.limit_in_bytes"),
            None => {
                let path = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a memory cgroup");
                let root = if std::path::Path::new("/sys/fs/cgroup/unified").exists() {
                    "/sys/fs/cgroup/unified"
                } else {
                    "/sys/fs/cgroup"
                };
                (root, path.to_owned(), "memory.max")
            }
        };
        let dir = std::path::Path::new(root).join(path.trim_start_matches('/')).join(name);
        std::fs::create_dir(&dir).expect("memory cgroup");
        let cgroup = Self { dir };
        std::fs::write(cgroup.dir.join(limit_file), limit_bytes.to_string()).expect("memory limit");
        cgroup
    }

    /// `command` run inside the cgroup: a shell moves itself in, then execs it.
    fn command(&self, program: &std::path::Path) -> std::process::Command {
        let mut command = std::process::Command::new("sh");
        command.arg("-c").arg("echo $$ > \"$0\" && exec \"$@\"").arg(self.dir.join("cgroup.procs")).arg(program);
        command
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `xdp.max_sources` within its bound but beyond the memory the host has (here, a
/// cgroup's 96 MiB): the kernel refuses the sources map, and the agent exits saying
/// so, leaving no map pinned (aya pins each map it creates, before the one it
/// cannot) and no program on the interface.
#[test]
fn a_map_the_kernel_cannot_hold_fails_the_start_leaving_nothing_pinned_or_attached() {
    let name = unique("lmem");
    let net =
        VethNamespace::new(&name, &format!("{name}h"), "eth0", "10.99.79.1/24", &["10.99.79.2/24"]).expect("namespace");
    let dir = std::path::PathBuf::from(format!("/tmp/{name}"));
    std::fs::create_dir_all(&dir).expect("test dir");
    let config = dir.join("limiter.toml");
    let max_sources = limiter_common::maps::Sizing::MaxSources.max_entries();
    std::fs::write(
        &config,
        format!(
            "{}[xdp]\ninterfaces = [\"{}\"]\nmax_sources = {max_sources}\n\
             [xdp.limit]\npackets_per_second = 1000\nburst = 1000\n",
            agent_section(&name, ""),
            net.host_if
        ),
    )
    .expect("config");
    let pin_dir = std::path::PathBuf::from(format!("/sys/fs/bpf/{name}"));
    let cgroup = MemoryCgroup::new(&name, 96 << 20);
    let output = cgroup
        .command(&limiter_bin())
        .args(["run", "-c"])
        .arg(&config)
        .env("LIMITER_LOG", "info")
        .output()
        .expect("limiter run");
    drop(cgroup);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the agent started: {log}");
    assert!(log.contains("SOURCES"), "the refused map is named: {log}");

    let pinned: Vec<&str> =
        limiter_common::maps::ALL.iter().map(|map| map.name).filter(|name| pin_dir.join(name).exists()).collect();
    let links = xdp::attached(&pin_dir).expect("links");
    let link = std::process::Command::new("ip").args(["-d", "link", "show", "dev", &net.host_if]).output().expect("ip");
    let link = String::from_utf8_lossy(&link.stdout);
    let _ = std::fs::remove_dir_all(&pin_dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(pinned.is_empty(), "maps left pinned: {pinned:?}");
    assert!(links.is_empty(), "no link pinned: {links:?}");
    assert!(link.contains("state") && !link.contains("prog/xdp"), "no program attached: {link}");
}

/// `limiter check` refuses a map size past its bound by key and line, before any
/// kernel is asked.
#[test]
fn check_refuses_a_map_size_beyond_its_bound_naming_key_and_line() {
    let dir = std::env::temp_dir().join(unique("lbound"));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("limiter.toml");
    std::fs::write(
        &path,
        "[xdp]\ninterfaces = [\"eth0\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 10\n\
         [xdp.verified]\nmax = 100_000_000\n",
    )
    .expect("config");
    let output = std::process::Command::new(limiter_bin()).arg("check").arg("-c").arg(&path).output().expect("check");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains(":7: xdp.verified.max: "), "{stderr}");
    assert!(stderr.contains("above the most of 2097152"), "{stderr}");
}
