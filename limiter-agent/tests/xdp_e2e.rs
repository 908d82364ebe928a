//! The agent attached to a real veth, with real UDP traffic from a namespace.

mod support;

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use support::{
    agent::{AgentProcess, agent_section},
    netns::{VethNamespace, in_namespace},
    unique,
};

const RATE: u64 = 1_000;
const BURST: u64 = 100;

/// Counts datagrams per source until `stop` is set and the socket has gone quiet.
fn receive(socket: &UdpSocket, stop: &AtomicBool) -> HashMap<Ipv4Addr, u64> {
    socket.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let mut counts = HashMap::new();
    let mut buffer = [0u8; 64];
    loop {
        match socket.recv_from(&mut buffer) {
            Ok((_, SocketAddr::V4(from))) => *counts.entry(*from.ip()).or_insert(0) += 1,
            Ok(_) => {}
            Err(_) if stop.load(Ordering::Relaxed) => return counts,
            Err(_) => {}
        }
    }
}

#[test]
fn flood_is_held_to_its_rate_while_a_slow_flow_loses_nothing() {
    let name = unique("lim-e2e-");
    let net = 200 + (std::process::id() % 50) as u8;
    let host_ip = Ipv4Addr::new(10, net, 7, 1);
    let flooder = Ipv4Addr::new(10, net, 7, 2);
    let polite = Ipv4Addr::new(10, net, 7, 3);
    let lab = VethNamespace::new(
        &name,
        &format!("{}h", &name[..name.len().min(13)]),
        "eth0",
        &format!("{host_ip}/24"),
        &[&format!("{flooder}/24"), &format!("{polite}/24")],
    );
    let config = format!(
        "{}[xdp]\ninterfaces = [\"{}\"]\nmode = \"auto\"\n[xdp.limit]\npackets_per_second = {RATE}\nburst = {BURST}\n",
        agent_section(&name, "keep_attached_on_exit = false"),
        lab.host_if
    );
    let agent = AgentProcess::start(&name, &config);

    let receiver = UdpSocket::bind((host_ip, 0)).expect("bind receiver");
    let target = receiver.local_addr().expect("addr");
    let stop = AtomicBool::new(false);
    const FLOOD: u64 = 30_000;
    const POLITE: u64 = 40;
    let (counts, flood_elapsed) = std::thread::scope(|scope| {
        let counting = scope.spawn(|| receive(&receiver, &stop));
        let (flood_elapsed, ()) = std::thread::scope(|senders| {
            let flood = senders.spawn(|| {
                in_namespace(&lab.ns, || {
                    let socket = UdpSocket::bind((flooder, 0)).expect("bind flooder");
                    let started = Instant::now();
                    // 30 000 packets over about a second: 30x the limit.
                    for i in 0..FLOOD {
                        let _ = socket.send_to(&i.to_be_bytes(), target);
                        if i % 300 == 299 {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    started.elapsed()
                })
            });
            let slow = senders.spawn(|| {
                in_namespace(&lab.ns, || {
                    let socket = UdpSocket::bind((polite, 0)).expect("bind polite");
                    for i in 0..POLITE {
                        socket.send_to(&i.to_be_bytes(), target).expect("send");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            });
            (flood.join().expect("flood"), slow.join().expect("slow"))
        });
        stop.store(true, Ordering::Relaxed);
        (counting.join().expect("receiver"), flood_elapsed)
    });

    let flood_received = counts.get(&flooder).copied().unwrap_or(0);
    eprintln!("flood: {flood_received} of {FLOOD} received in {flood_elapsed:?}; slow flow: {counts:?}");
    assert_eq!(counts.get(&polite).copied(), Some(POLITE), "the slow flow lost packets: {counts:?}");
    let ceiling = BURST + (flood_elapsed.as_secs_f64() * RATE as f64).ceil() as u64 + RATE / 20;
    let floor = (flood_elapsed.as_secs_f64() * RATE as f64 * 0.8) as u64;
    assert!(
        (floor..=ceiling).contains(&flood_received),
        "flood got {flood_received} through in {flood_elapsed:?}; expected {floor}..={ceiling}"
    );

    let stats = agent.cli_json(&["stats", "--json"]);
    let packets = &stats["xdp"]["packets"];
    assert_eq!(packets["dropped_rate_limit"].as_u64(), Some(FLOOD - flood_received), "{stats}");
    assert_eq!(stats["xdp"]["attached"][0]["interface"].as_str(), Some(lab.host_if.as_str()));
    let top = agent.cli_json(&["top", "-n", "5", "--json"]);
    let row = |ip: Ipv4Addr| top.as_array().and_then(|rows| rows.iter().find(|r| r["source"] == ip.to_string())).cloned();
    let flood_row = row(flooder).expect("flooder in top");
    assert_eq!(flood_row["packets"].as_u64(), Some(FLOOD));
    assert_eq!(flood_row["dropped"].as_u64(), Some(FLOOD - flood_received));
    let polite_row = row(polite).expect("polite source in top");
    assert_eq!((polite_row["packets"].as_u64(), polite_row["dropped"].as_u64()), (Some(POLITE), Some(0)));
}
