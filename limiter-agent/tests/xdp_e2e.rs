//! The agent attached to a real veth, with real UDP traffic from a namespace.

use std::time::Duration;

use limiter_lab::{support::xdp_lab::XdpLab, traffic};

const RATE: u64 = 1_000;
const BURST: u64 = 100;

#[test]
fn flood_is_held_to_its_rate_while_a_slow_flow_loses_nothing() {
    let lab = XdpLab::start(
        2,
        "keep_attached_on_exit = false",
        &format!("[xdp.limit]\npackets_per_second = {RATE}\nburst = {BURST}\n"),
    );
    let (flooder, polite) = (lab.sources[0], lab.sources[1]);
    let receiver = traffic::Receiver::bind(lab.host_ip).expect("receiver");
    const FLOOD: u64 = 30_000;
    const POLITE: u64 = 40;
    let flood_elapsed = std::thread::scope(|scope| {
        // 30 000 packets over about a second: 30x the limit.
        let flood = scope.spawn(|| traffic::send(&lab.net.ns, flooder, receiver.addr, FLOOD, 300).expect("send"));
        scope.spawn(|| traffic::send(&lab.net.ns, polite, receiver.addr, POLITE, 1).expect("send"));
        flood.join().expect("flood")
    });
    receiver.settle(Duration::from_millis(200));

    let flood_received = receiver.from(flooder).len() as u64;
    let polite_received = receiver.from(polite).len() as u64;
    eprintln!(
        "flood: {flood_received} of {FLOOD} received in {flood_elapsed:?}; slow flow: {polite_received} of {POLITE}"
    );
    assert_eq!(polite_received, POLITE, "the slow flow lost packets");
    let ceiling = BURST + (flood_elapsed.as_secs_f64() * RATE as f64).ceil() as u64 + RATE / 20;
    let floor = (flood_elapsed.as_secs_f64() * RATE as f64 * 0.8) as u64;
    assert!(
        (floor..=ceiling).contains(&flood_received),
        "flood got {flood_received} through in {flood_elapsed:?}; expected {floor}..={ceiling}"
    );

    let stats = lab.agent.cli_json(&["stats", "--json"]);
    assert_eq!(stats["xdp"]["packets"]["dropped_rate_limit"].as_u64(), Some(FLOOD - flood_received), "{stats}");
    assert_eq!(stats["xdp"]["attached"][0]["interface"].as_str(), Some(lab.net.host_if.as_str()));
    let top = lab.agent.cli_json(&["top", "-n", "5", "--json"]);
    let row = |ip: std::net::Ipv4Addr| {
        top.as_array().and_then(|rows| rows.iter().find(|r| r["source"] == ip.to_string())).cloned()
    };
    let flood_row = row(flooder).expect("flooder in top");
    assert_eq!(flood_row["packets"].as_u64(), Some(FLOOD));
    assert_eq!(flood_row["dropped"].as_u64(), Some(FLOOD - flood_received));
    let polite_row = row(polite).expect("polite source in top");
    assert_eq!((polite_row["packets"].as_u64(), polite_row["dropped"].as_u64()), (Some(POLITE), Some(0)));
}
