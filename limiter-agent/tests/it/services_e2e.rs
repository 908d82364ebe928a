//! `[xdp.services]` on a real veth: a reflection flood to ports the host does not
//! serve dropped whole at the NIC, while `curl` through the proxy on the served port
//! works throughout and the host's own TCP and UDP to a server in the namespace get
//! their replies back through the program. Needs root and curl.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use limiter::xdp::{KernelMaps, ephemeral_ports, source_key};
use limiter_common::counters::Counter;
use limiter_lab::{
    netns::{HostLab, in_namespace, ip, spawn_in_namespace},
    support::{
        agent::{AgentProcess, agent_section},
        proxy::Upstream,
        unique,
    },
};

/// Datagrams the reflection flood sends.
const FLOOD: u64 = 20_000;

/// A DNS reflection: `count` datagrams from port 53 of `from` (inside `ns`) to
/// `host`'s ephemeral ports, one after the other, 200 every 10 ms; how long it took.
fn reflect(ns: &str, from: Ipv4Addr, host: Ipv4Addr, count: u64) -> Duration {
    let [first, last] = ephemeral_ports();
    in_namespace(ns, move || {
        let socket = UdpSocket::bind((from, 53)).expect("bind port 53");
        let started = Instant::now();
        let span = u64::from(last - first) + 1;
        for i in 0..count {
            let port = first + u16::try_from(i % span).unwrap_or(0);
            socket.send_to(b"an answer nobody asked for", (host, port)).expect("send");
            if i % 200 == 199 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        started.elapsed()
    })
    .expect("enter namespace")
}

/// `curl` through the proxy from namespace `ns` every 50 ms until `stop`;
/// (answered 200, tried).
fn keep_curling(ns: &str, url: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64)> {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        let (mut ok, mut tried) = (0, 0);
        while !stop.load(Ordering::Relaxed) || tried < 3 {
            let output = std::process::Command::new("ip")
                .args(["netns", "exec", &ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .args(["--max-time", "5", &url])
                .output()
                .expect("curl");
            tried += 1;
            ok += u64::from(output.stdout == b"200");
            std::thread::sleep(Duration::from_millis(50));
        }
        (ok, tried)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reflection_flood_is_dropped_whole_while_the_proxy_serves_and_the_hosts_own_traffic_returns() {
    let upstream = Upstream::start().await;
    let name = unique("svc");
    let host_lab = HostLab::new(&name, 30);
    let xdp = host_lab.xdp_section();
    let HostLab { lab, host, client, listen } = host_lab;
    // The reflector: a second address inside, not among the UDP reply sources.
    let reflector = Ipv4Addr::new(client.octets()[0], client.octets()[1], client.octets()[2], 3);
    ip(&["-n", &lab.ns, "addr", "add", &format!("{reflector}/24"), "dev", "eth0"]).expect("second address");
    let config = format!(
        "{agent}{xdp}[xdp.services]\ntcp = [{port}]\nudp_replies_from = [\"{client}/32\"]\n\n\
         [proxy]\nlisten = \"{listen}\"\nupstream = \"http://{upstream}\"\n",
        agent = agent_section(&name, "keep_attached_on_exit = false"),
        port = listen.port(),
        upstream = upstream.addr,
    );
    let agent = AgentProcess::start(&name, &config);

    let stop = Arc::new(AtomicBool::new(false));
    let curls = keep_curling(&lab.ns, format!("http://{listen}/"), stop.clone());
    let elapsed = reflect(&lab.ns, reflector, host, FLOOD);
    stop.store(true, Ordering::Relaxed);
    let (ok, tried) = curls.join().expect("curl thread");
    eprintln!("reflection: {FLOOD} datagrams in {elapsed:?}; curl: {ok} of {tried} answered 200");
    assert_eq!(ok, tried, "every request through the proxy was served during the flood");
    let dropped =
        agent.until("the program to meet every datagram", || agent.counter(Counter::DroppedService), |n| *n >= FLOOD);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!((dropped, agent.counter(Counter::DroppedService)), (FLOOD, FLOOD), "the flood, and nothing else");
    let maps = KernelMaps::open_pinned(&agent.pin_dir).expect("pinned maps");
    let reflector_key = source_key(std::net::IpAddr::V4(reflector), 64);
    assert!(maps.source(&reflector_key).is_none(), "dropped before the buckets: the reflector has none");

    // The host's own connections out: the replies arrive on its ephemeral ports, from
    // a port it does not serve.
    let server = TcpListener::bind("0.0.0.0:0").expect("port");
    let tcp_port = server.local_addr().expect("address").port();
    drop(server);
    let echo = spawn_in_namespace(&lab.ns, move || {
        let listener = TcpListener::bind((client, tcp_port)).expect("bind in the namespace");
        let (mut stream, _) = listener.accept().expect("accept");
        let mut line = [0u8; 4];
        stream.read_exact(&mut line).expect("read");
        stream.write_all(b"pong").expect("write");
    });
    let udp_echo = spawn_in_namespace(&lab.ns, move || {
        let socket = UdpSocket::bind((client, 0)).expect("bind in the namespace");
        let port = socket.local_addr().expect("address").port();
        (socket, port)
    })
    .join()
    .expect("udp server")
    .expect("enter namespace");
    let (udp_server, udp_port) = udp_echo;
    let answering = std::thread::spawn(move || {
        let mut buffer = [0u8; 16];
        let (n, from) = udp_server.recv_from(&mut buffer).expect("query");
        udp_server.send_to(&buffer[..n], from).expect("answer");
    });
    let started = Instant::now();
    let mut stream = loop {
        match TcpStream::connect_timeout(&SocketAddr::from((client, tcp_port)), Duration::from_secs(3)) {
            Ok(stream) => break stream,
            // The listener inside may not be bound yet.
            Err(_) if started.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(50)),
            Err(error) => panic!("connect to the namespace: {error}"),
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    stream.write_all(b"ping").expect("write");
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).expect("the server's answer came back in");
    assert_eq!(&reply, b"pong");
    echo.join().expect("tcp server").expect("enter namespace");
    let socket = UdpSocket::bind((host, 0)).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    socket.send_to(b"query", (client, udp_port)).expect("query");
    let mut answer = [0u8; 16];
    let (n, _) = socket.recv_from(&mut answer).expect("the answer from udp_replies_from came back in");
    assert_eq!(&answer[..n], b"query");
    answering.join().expect("udp server");
    assert_eq!(agent.counter(Counter::DroppedService), FLOOD, "nothing of the host's own traffic was dropped");
    let client_key = source_key(std::net::IpAddr::V4(client), 64);
    assert!(maps.source(&client_key).is_some_and(|state| state.packets > 0), "the replies met the program");
}
