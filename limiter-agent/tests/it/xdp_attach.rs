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
