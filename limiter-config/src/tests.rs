use std::{num::NonZeroU32, path::Path, time::Duration};

use limiter_core::{Algorithm, path::EscapedSlashes};

use super::{
    Config, ConfigError,
    xdp::{CidrAction, Port, SynPorts, Verdict},
};

const EXAMPLE: &str = include_str!("../../config/limiter.toml");

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("test.toml"))
}

/// `(line, key, message)` of a refused config.
fn refusal(text: &str) -> (usize, String, String) {
    match parse(text) {
        Err(ConfigError::Invalid { line, key, message, .. }) => (line, key, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const XDP: &str = "[xdp]\ninterfaces = [\"eth0\"]\n[xdp.limit]\npackets_per_second = 10\nburst = 20\n";

#[test]
fn example_config_parses_with_its_documented_values() {
    let config = parse(EXAMPLE).expect("example config");
    let xdp = config.xdp.expect("xdp");
    assert_eq!(xdp.limit.packets.packets_per_second.get(), 10_000);
    assert_eq!(xdp.cidr.len(), 2);
    assert!(matches!(xdp.cidr[1].action, CidrAction::Limit(l) if l.packets.burst.get() == 200));
    let proxy = config.proxy.expect("proxy");
    assert_eq!(proxy.plans["free"].limits[0].spec.limit, NonZeroU32::new(100).expect("nonzero"));
    assert_eq!(proxy.plans["free"].limits[0].spec.algorithm, Algorithm::SlidingWindowCounter);
    let pro: Vec<(String, &limiter_core::LimitSpec)> = proxy.plans["pro"].named_limits("pro").collect();
    let names: Vec<&str> = pro.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["pro.burst", "pro.minute", "pro.monthly"]);
    assert_eq!(pro[1].1.throttle.map(|t| (t.from, t.delay)), Some((900, Duration::from_millis(50))));
    assert!(pro[2].1.calendar.is_some());
    use crate::proxy::Disclose;
    assert_eq!(
        (proxy.disclose, proxy.plans["pro"].disclose, proxy.plans["free"].disclose),
        (Disclose::Minimal, Some(Disclose::Full), None)
    );
    assert_eq!(proxy.rules[2].key.to_string(), "json:/username folded to lower case");
    assert_eq!(proxy.rules[3].limit().expect("a limit rule").burst.map(NonZeroU32::get), Some(20));
    assert_eq!(proxy.body_keys.max_bytes, 16_384);
    assert_eq!(proxy.signature.max_skew.0, Duration::from_secs(300));
}

#[test]
fn demo_config_parses() {
    parse(include_str!("../../config/demo.toml")).expect("demo config");
}

#[test]
fn defaults_fill_what_is_left_out() {
    let config = parse(XDP).expect("minimal");
    assert!(config.agent.keep_attached_on_exit);
    let xdp = config.xdp.expect("xdp");
    assert!(xdp.enforce);
    assert_eq!((xdp.max_sources.get(), xdp.ipv6_prefix.0), (1_000_000, 64));
    assert!(config.proxy.is_none());
}

#[test]
fn syntax_error_names_its_line() {
    let (line, _, message) = refusal("[xdp]\ninterfaces = [\"eth0\"\n");
    assert_eq!(line, 2, "{message}");
}

#[test]
fn zero_rate_names_key_and_line() {
    let (line, key, message) = refusal(&XDP.replace("packets_per_second = 10", "packets_per_second = 0"));
    assert_eq!((line, key.as_str()), (4, "xdp.limit.packets_per_second"), "{message}");
}

#[test]
fn bad_cidr_names_its_rule() {
    let text = format!(
        "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n[[xdp.cidr]]\ncidr = \"10.0.0.300/8\"\naction = \"deny\"\n"
    );
    let (line, key, message) = refusal(&text);
    assert!(message.contains("10.0.0.300/8"), "{message}");
    assert!(key.starts_with("xdp.cidr[1]"), "{key}");
    assert!((9..=10).contains(&line), "{line}");
}

#[test]
fn host_bits_and_duplicates_are_refused() {
    let text = format!("{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.1/8\"\naction = \"allow\"\n");
    assert!(refusal(&text).2.contains("did you mean \"10.0.0.0/8\""));
    let text = format!(
        "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\n[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"deny\"\n"
    );
    assert_eq!(refusal(&text), (10, "xdp.cidr[1].cidr".to_owned(), "10.0.0.0/8 appears twice".to_owned()));
}

#[test]
fn limit_action_needs_its_rate() {
    let text = format!("{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\nburst = 5\n");
    assert!(refusal(&text).2.contains("needs packets_per_second and burst"));
}

#[test]
fn byte_budgets_parse_on_the_default_and_on_limit_rules() {
    let text = format!(
        "{}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\npackets_per_second = 5\nburst = 5\n\
         bytes_per_second = 1_250_000_000\nbyte_burst = 1_514\n\
         [[xdp.cidr]]\ncidr = \"10.1.0.0/16\"\naction = \"limit\"\npackets_per_second = 5\nburst = 5\n",
        XDP.replace("burst = 20", "burst = 20\nbytes_per_second = 5_000_000\nbyte_burst = 15_000")
    );
    let xdp = parse(&text).expect("byte budgets").xdp.expect("xdp");
    let bytes = xdp.limit.bytes.expect("default's byte budget");
    assert_eq!((bytes.bytes_per_second.get(), bytes.byte_burst.get()), (5_000_000, 15_000));
    assert_eq!(xdp.limit.to_string(), "10 pps, burst 20, 5000000 B/s, byte burst 15000");
    let rule_bytes: Vec<_> = xdp
        .cidr
        .iter()
        .map(|rule| match rule.action {
            CidrAction::Limit(limit) => limit.bytes.map(|b| b.bytes_per_second.get()),
            CidrAction::Allow | CidrAction::Deny => None,
        })
        .collect();
    assert_eq!(rule_bytes, [Some(1_250_000_000), None], "a rule without its own has none");
    let rates: Vec<_> = xdp.byte_rates_in_force().map(|rate| (rate.per_second(), rate.burst())).collect();
    assert_eq!(rates, [(5_000_000, 15_000), (1_250_000_000, 1_514)]);
    assert!(parse(XDP).expect("minimal").xdp.expect("xdp").limit.bytes.is_none());
}

#[test]
fn bad_byte_budgets_name_key_and_line() {
    let limit = |keys: &str| XDP.replace("burst = 20", &format!("burst = 20\n{keys}"));
    for (keys, says) in [
        ("bytes_per_second = 5_000_000", "bytes_per_second and byte_burst go together"),
        ("byte_burst = 5_000", "bytes_per_second and byte_burst go together"),
        ("bytes_per_second = 999\nbyte_burst = 5_000", "bytes_per_second = 999 is outside 1000 to 12500000000"),
        ("bytes_per_second = 12_500_000_001\nbyte_burst = 5_000", "is outside 1000 to 12500000000 (100 Gbit/s)"),
        ("bytes_per_second = 5_000_000\nbyte_burst = 1_513", "byte_burst = 1513 is below one full frame (1514"),
    ] {
        let (line, key, message) = refusal(&limit(keys));
        assert_eq!((line, key.as_str()), (3, "xdp.limit"), "{keys}: {message}");
        assert!(message.contains(says), "{keys}: {message}");
    }
    let (_, key, message) = refusal(&limit("bytes_per_second = 0\nbyte_burst = 5_000"));
    assert_eq!(key, "xdp.limit.bytes_per_second", "{message}");

    let rule =
        |action: &str, keys: &str| format!("{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"{action}\"\n{keys}\n");
    let (line, key, message) = refusal(&rule("allow", "bytes_per_second = 5_000_000\nbyte_burst = 5_000"));
    assert_eq!((line, key.as_str()), (6, "xdp.cidr[0]"), "{message}");
    assert!(message.contains("cidr 10.0.0.0/8: bytes_per_second and byte_burst only go with action = \"limit\""));
    let (_, key, message) = refusal(&rule("limit", "packets_per_second = 5\nburst = 5\nbytes_per_second = 5_000_000"));
    assert_eq!(key, "xdp.cidr[0]");
    assert!(message.contains("cidr 10.0.0.0/8: bytes_per_second and byte_burst go together"), "{message}");
    // The budgets and aggregates count packets only: a byte key there is unknown.
    let (_, key, _) = refusal(&format!("{XDP}[xdp.new_sources]\npackets_per_second = 5\nburst = 5\nbyte_burst = 5\n"));
    assert_eq!(key, "xdp.new_sources.byte_burst");
}

#[test]
fn port_entries_parse_and_bad_ones_name_key_and_line() {
    let entry = |protocol: &str, port: u32, extra: &str| {
        format!("[[xdp.port]]\nprotocol = \"{protocol}\"\nport = {port}\npackets_per_second = 50\nburst = 100\n{extra}")
    };
    let text = format!(
        "{XDP}{}{}",
        entry("udp", 443, "bytes_per_second = 1_000_000\nbyte_burst = 30_000\n"),
        entry("tcp", 443, "")
    );
    let xdp = parse(&text).expect("two services").xdp.expect("xdp");
    let ports: Vec<String> = xdp.port.iter().map(ToString::to_string).collect();
    assert_eq!(ports, ["udp/443: 50 pps, burst 100, 1000000 B/s, byte burst 30000", "tcp/443: 50 pps, burst 100"]);
    assert_eq!(xdp.byte_rates_in_force().count(), 1);

    let twice = format!("{XDP}{}{}", entry("udp", 53, ""), entry("udp", 53, ""));
    assert_eq!(refusal(&twice), (13, "xdp.port[1].port".to_owned(), "udp/53 appears twice".to_owned()));
    let many: String = (1..=17).map(|port| entry("tcp", port, "")).collect();
    let (_, key, message) = refusal(&format!("{XDP}{many}"));
    assert_eq!(key, "xdp.port[16]", "{message}");
    assert!(message.contains("at most 16 [[xdp.port]] entries"), "{message}");
    let (line, key, message) = refusal(&format!("{XDP}{}", entry("udp", 443, "byte_burst = 30_000\n")));
    assert_eq!((line, key.as_str()), (6, "xdp.port[0]"), "{message}");
    assert!(message.contains("port udp/443: bytes_per_second and byte_burst go together"), "{message}");
    let (_, key, message) = refusal(&format!("{XDP}{}", entry("sctp", 443, "")));
    assert_eq!(key, "xdp.port[0].protocol", "{message}");
    let (_, key, _) = refusal(&format!("{XDP}{}", entry("udp", 0, "")));
    assert_eq!(key, "xdp.port[0].port");
}

#[test]
fn unknown_key_is_named() {
    let (line, key, message) = refusal(&XDP.replace("burst = 20", "burst = 20\nbrust = 3"));
    assert!(message.contains("brust"), "{message}");
    assert_eq!((line, key.as_str()), (6, "xdp.limit.brust"));
}

#[test]
fn one_bad_rule_among_good_ones_refuses_the_whole_file() {
    let mut text = EXAMPLE.to_owned();
    text = text.replace("name = \"login\"\npath = \"/login\"", "name = \"login\"\npath = \"login\"");
    let (_, key, message) = refusal(&text);
    assert!(message.contains("path `login` must start with /"), "{message}");
    assert!(key.starts_with("proxy.rules[1]"), "{key}");
}

#[test]
fn missing_plan_is_named_with_its_line() {
    let text = EXAMPLE.replace("plan = \"free\"", "plan = \"gold\"");
    let (line, key, message) = refusal(&text);
    assert_eq!(key, "proxy.keys[0].plan");
    assert!(message.contains("gold"));
    let expected = EXAMPLE.lines().position(|l| l.starts_with("plan = \"free\"")).expect("plan line") + 1;
    assert_eq!(line, expected);
}

#[test]
fn truncated_file_is_refused() {
    let cut = EXAMPLE.find("burst = 20_000").expect("marker") + "burst = ".len();
    let (line, _, _) = refusal(&EXAMPLE[..cut]);
    let expected = EXAMPLE[..cut].lines().count();
    assert_eq!(line, expected);
}

#[test]
fn throttle_band_must_sit_below_the_limit() {
    let text = EXAMPLE.replace("throttle_from = 80", "throttle_from = 100");
    assert!(refusal(&text).2.contains("must be below limit"));
}

#[test]
fn a_progressive_band_reads_its_step_and_cap_and_names_the_plan_of_a_cap_below_the_delay() {
    let config = parse(EXAMPLE).expect("example config");
    let free = config.proxy.expect("proxy").plans["free"].limits[0].spec.throttle.expect("a band");
    let step = free.step.expect("a progressive band");
    assert_eq!((free.from, step.every.get(), step.max_delay), (80, 5, Duration::from_secs(1)));
    let (line, key, message) =
        refusal(&EXAMPLE.replace("throttle_max_delay = \"1s\"", "throttle_max_delay = \"100ms\""));
    assert!(message.contains("throttle_max_delay must be at least throttle_delay"), "{message}");
    assert!(key.starts_with("proxy.plans.free"), "{key}");
    let expected = EXAMPLE.lines().position(|l| l.starts_with("[proxy.plans.free]")).expect("plan line") + 1;
    assert!(line >= expected, "{line} before the plan's line {expected}");
    let (_, _, message) = refusal(&EXAMPLE.replace("throttle_step = 5", ""));
    assert!(message.contains("throttle_step and throttle_max_delay go with"), "{message}");
}

const PROXY: &str = "[proxy]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:3000\"\n";

#[test]
fn escalation_has_defaults_and_names_its_mistakes() {
    let config = parse(&format!("{XDP}{PROXY}[escalation]\nthreshold = 5\n")).expect("escalation");
    let escalation = config.escalation.expect("section");
    assert!(escalation.enabled);
    assert_eq!(escalation.threshold.get(), 5);
    assert_eq!((escalation.window, escalation.block_ttl), (Duration::from_secs(10), Duration::from_secs(600)));

    let (line, key, message) = refusal(&format!("{XDP}{PROXY}[escalation]\nthreshold = 5\nblock_ttl = \"0s\"\n"));
    assert_eq!((line, key.as_str()), (9, "escalation"), "{message}");
    assert!(message.contains("block_ttl"), "{message}");
    let (line, key, _) = refusal(&format!("{XDP}{PROXY}[escalation]\nthreshold = 0\n"));
    assert_eq!((line, key.as_str()), (10, "escalation.threshold"));
    let (_, key, message) = refusal(&format!("{PROXY}[escalation]\n"));
    assert_eq!(key, "escalation.enabled", "{message}");
}

#[test]
fn the_penalty_ladder_climbs_by_its_factor_up_to_its_cap_and_checks_its_keys() {
    use crate::escalation::Rung;
    let minutes = |m: u64| Rung::Block(Duration::from_secs(60 * m));
    let ladder = "[escalation]\nblock_ttl = \"10m\"\nblock_ttl_factor = 2\nblock_ttl_max = \"1h\"\n";
    let escalation = parse(&format!("{XDP}{PROXY}{ladder}")).expect("ladder").escalation.expect("section");
    assert_eq!(escalation.offence_memory, Duration::from_secs(7 * 86_400), "a week by default");
    let rungs: Vec<_> = (1..=6).map(|offence| escalation.rung(offence)).collect();
    assert_eq!(rungs, [minutes(10), minutes(20), minutes(40), minutes(60), minutes(60), minutes(60)]);

    let demoting =
        format!("{XDP}{PROXY}{ladder}demote_first = {{ packets_per_second = 20, burst = 40, ttl = \"5m\" }}\n");
    let escalation = parse(&demoting).expect("demote_first").escalation.expect("section");
    let Rung::Demote(demotion) = escalation.rung(1) else { panic!("the first offence demotes") };
    assert_eq!((demotion.limit.packets_per_second.get(), demotion.limit.burst.get()), (20, 40));
    assert_eq!(demotion.ttl, Duration::from_secs(300));
    assert_eq!((escalation.rung(2), escalation.rung(3)), (minutes(10), minutes(20)));

    let fixed = parse(&format!("{XDP}{PROXY}[escalation]\nblock_ttl = \"2d\"\n")).expect("a long block_ttl alone");
    let fixed = fixed.escalation.expect("section");
    assert!(!fixed.ladder(), "factor 1 without demote_first remembers nothing");
    assert_eq!((fixed.block_ttl_max, fixed.rung(5)), (Duration::from_secs(2 * 86_400), Rung::Block(fixed.block_ttl)));

    for (bad, line, key, says) in [
        ("block_ttl_factor = 0\n", 9, "escalation", "block_ttl_factor"),
        ("block_ttl_max = \"5m\"\n", 9, "escalation", "block_ttl_max"),
        ("offence_memory = \"0s\"\n", 9, "escalation", "offence_memory"),
        (
            "demote_first = { packets_per_second = 20, burst = 40, ttl = \"0s\" }\n",
            10,
            "escalation.demote_first",
            "ttl",
        ),
        (
            "demote_first = { packets_per_second = 2_000_000_000, burst = 40, ttl = \"1m\" }\n",
            10,
            "escalation.demote_first",
            "packets_per_second",
        ),
        ("demote_first = { packets_per_second = 20, ttl = \"1m\" }\n", 10, "escalation.demote_first", "burst"),
    ] {
        let (at, named, message) = refusal(&format!("{XDP}{PROXY}[escalation]\n{bad}"));
        assert_eq!((at, named.as_str()), (line, key), "{bad}: {message}");
        assert!(message.contains(says), "{bad}: {message}");
    }
}

#[test]
fn a_redis_store_refuses_limits_beyond_exact_lua_arithmetic() {
    let redis = "store = \"redis\"\n";
    let plan = "[proxy.plans.huge]\nlimit = 4_000_000_000\nwindow = \"30d\"\n";
    let (_, key, message) = refusal(&format!("{PROXY}{redis}{plan}"));
    assert_eq!(key, "proxy.plans.huge.limit", "{message}");
    parse(&format!("{PROXY}{plan}")).expect("the memory store takes it");
    let quotas = "[proxy.plans.huge]\nlimits = [\n  { name = \"month\", limit = 4_000_000_000, window = \"month\" },\n  \
                  { name = \"30d\", limit = 4_000_000_000, window = \"30d\" },\n]\n";
    let (_, key, message) = refusal(&format!("{PROXY}{redis}{quotas}"));
    assert_eq!(key, "proxy.plans.huge.limits[1]", "{message}: a calendar month counts only instants");
}

/// The kernel allocates an LRU map whole when it is created: a size beyond what a
/// small host's memory holds is refused by name and line, one past the bound as any.
#[test]
fn map_sizes_beyond_their_stated_bounds_are_refused_naming_key_and_line() {
    let at_bound = XDP.replace("[xdp.limit]", "max_sources = 8_388_608\n[xdp.limit]")
        + "[xdp.aggregate]\nmax_prefixes = 2_097_152\n[xdp.verified]\nmax = 2_097_152\n";
    let xdp = parse(&at_bound).expect("every size at its bound").xdp.expect("xdp");
    assert_eq!(
        (xdp.max_sources.get(), xdp.aggregate.max_prefixes.get(), xdp.verified.max.get()),
        (8_388_608, 2_097_152, 2_097_152)
    );
    for (from, to, line, key, bound) in [
        ("max_sources = 8_388_608", "max_sources = 8_388_609", 3, "xdp.max_sources", "8388608"),
        ("max_prefixes = 2_097_152", "max_prefixes = 4_000_000_000", 8, "xdp.aggregate.max_prefixes", "2097152"),
        ("max = 2_097_152", "max = 2_097_153", 10, "xdp.verified.max", "2097152"),
    ] {
        let (at, named, message) = refusal(&at_bound.replace(from, to));
        assert_eq!((at, named.as_str()), (line, key), "{message}");
        assert!(message.contains(&format!("above the most of {bound}")), "{message}");
    }
}

#[test]
fn spoofing_defences_are_off_by_default_and_parse_when_set() {
    let xdp = parse(XDP).expect("minimal").xdp.expect("xdp");
    assert_eq!((xdp.new_sources, xdp.syn, xdp.aggregate.limit), (None, None, None));
    assert_eq!((xdp.aggregate.ipv4_prefix.0, xdp.aggregate.ipv6_prefix.0), (24, 48));
    assert_eq!(xdp.verified.ttl.0, Duration::from_secs(600));
    let text = format!(
        "{XDP}[xdp.new_sources]\npackets_per_second = 500\nburst = 1000\n\
         [xdp.aggregate]\nipv4_prefix = 22\npackets_per_second = 2000\nburst = 4000\n\
         [xdp.verified]\nttl = \"1h\"\nmax = 1000\n[xdp.syn]\npackets_per_second = 100\nburst = 200\n\
         [[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"limit\"\npackets_per_second = 5\nburst = 5\n\
         aggregate_packets_per_second = 50\naggregate_burst = 100\n"
    );
    let xdp = parse(&text).expect("all set").xdp.expect("xdp");
    assert_eq!(xdp.new_sources.map(|l| (l.packets_per_second.get(), l.burst.get())), Some((500, 1000)));
    assert_eq!((xdp.aggregate.ipv4_prefix.0, xdp.aggregate.ipv6_prefix.0), (22, 48));
    assert_eq!(xdp.aggregate.limit.map(|l| l.burst.get()), Some(4000));
    assert_eq!((xdp.verified.ttl.0, xdp.verified.max.get()), (Duration::from_secs(3600), 1000));
    let syn = xdp.syn.as_ref().expect("syn");
    assert_eq!((syn.limit.packets_per_second.get(), syn.ports.as_ref()), (100, None));
    let share = syn.per_source();
    assert_eq!((share.packets_per_second.get(), share.burst.get()), (10, 20), "a tenth by default");
    assert_eq!(xdp.syn_ports(None), SynPorts::Every, "no proxy, no ports: every port");
    assert_eq!((xdp.verified.max_per_48().get(), xdp.verified.max_per_24().get()), (16, 64));
    assert_eq!(xdp.cidr[0].aggregate.map(|l| l.burst.get()), Some(100));

    let text = format!(
        "{XDP}[xdp.syn]\npackets_per_second = 100\nburst = 200\nper_source_packets_per_second = 3\n\
         per_source_burst = 7\nports = [443, 22]\n[xdp.verified]\nmax_per_48 = 2\nmax_per_24 = 9\n"
    );
    let xdp = parse(&text).expect("syn and verified set").xdp.expect("xdp");
    let share = xdp.syn.as_ref().expect("syn").per_source();
    assert_eq!((share.packets_per_second.get(), share.burst.get()), (3, 7));
    let ports = [443, 22].map(|p| std::num::NonZeroU16::new(p).expect("port")).to_vec();
    assert_eq!(xdp.syn_ports(None), SynPorts::Only(ports));
    assert_eq!((xdp.verified.max_per_48().get(), xdp.verified.max_per_24().get()), (2, 9));
}

#[test]
fn the_syn_budget_covers_the_proxys_port_unless_ports_say_otherwise() {
    let text = format!("{XDP}[xdp.syn]\npackets_per_second = 100\nburst = 200\n{PROXY}");
    let config = parse(&text).expect("valid");
    let (xdp, proxy) = (config.xdp.as_ref().expect("xdp"), config.proxy.as_ref());
    let port = std::num::NonZeroU16::new(proxy.expect("proxy").listen.port()).expect("a port");
    assert_eq!(xdp.syn_ports(proxy), SynPorts::Only(vec![port]));
    // A config written before `ports` and `per_source_*`, with a proxy: both defaults
    // change what it does, and limiter check says so.
    let warnings = xdp.syn_warnings(proxy);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains(&format!("only SYNs to the proxy's port {port}")), "{warnings:?}");
    assert!(warnings[1].contains("at most 10 pps, burst 20"), "{warnings:?}");
    assert!(xdp.verified_warning(proxy).is_some_and(|w| w.contains("once it has served it a response")));
    assert!(xdp.verified_warning(None).is_none(), "without a proxy nothing verifies at the handshake");
    let set = text.replace(
        "burst = 200\n",
        "burst = 200\nports = [443]\nper_source_packets_per_second = 5\nper_source_burst = 5\n\
         [xdp.verified]\nmax_per_48 = 16\nmax_per_24 = 64\n",
    );
    let config = parse(&set).expect("valid");
    let xdp = config.xdp.as_ref().expect("xdp");
    assert!(xdp.syn_warnings(config.proxy.as_ref()).is_empty());
    assert!(xdp.verified_warning(config.proxy.as_ref()).is_none());
}

#[test]
fn bad_spoofing_settings_name_key_and_line() {
    let (line, key, message) = refusal(&format!("{XDP}[xdp.new_sources]\npackets_per_second = 0\nburst = 5\n"));
    assert_eq!((line, key.as_str()), (7, "xdp.new_sources.packets_per_second"), "{message}");
    let (line, key, message) = refusal(&format!("{XDP}[xdp.aggregate]\nipv4_prefix = 33\n"));
    assert_eq!((line, key.as_str()), (7, "xdp.aggregate.ipv4_prefix"), "{message}");
    assert!(message.contains("1 to 32"), "{message}");
    let (line, key, message) = refusal(&format!("{XDP}[xdp.aggregate]\npackets_per_second = 10\n"));
    assert_eq!((line, key.as_str()), (6, "xdp.aggregate"), "{message}");
    assert!(message.contains("packets_per_second and burst go together"), "{message}");
    let (line, key, message) = refusal(&format!("{XDP}[xdp.verified]\nttl = \"0s\"\n"));
    assert_eq!((line, key.as_str()), (7, "xdp.verified.ttl"), "{message}");
    let (_, key, message) = refusal(&format!("{XDP}[xdp.syn]\npackets_per_second = 5\nbrust = 5\n"));
    assert_eq!(key, "xdp.syn.brust", "{message}");
    let syn = "[xdp.syn]\npackets_per_second = 5\nburst = 5\n";
    let (_, key, message) = refusal(&format!("{XDP}{syn}ports = [443, 443]\n"));
    assert_eq!((key.as_str(), message.as_str()), ("xdp.syn", "ports: 443 appears twice"), "{message}");
    let (_, _, message) = refusal(&format!("{XDP}{syn}ports = [0]\n"));
    assert!(message.contains("nonzero"), "{message}");
    let (_, _, message) = refusal(&format!("{XDP}{syn}per_source_burst = 2\n"));
    assert!(message.contains("per_source_packets_per_second and per_source_burst go together"), "{message}");
    let text = format!("{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\naggregate_burst = 5\n");
    let (line, key, message) = refusal(&text);
    assert!(key.starts_with("xdp.cidr[0]"), "{key}");
    assert_eq!(line, 6, "{message}");
    assert!(message.contains("aggregate_packets_per_second and aggregate_burst go together"), "{message}");
    let text = format!(
        "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\naction = \"allow\"\naggregate_packets_per_second = 5\naggregate_burst = 5\n"
    );
    assert!(refusal(&text).2.contains("an aggregate only goes with action = \"limit\""));
}

#[test]
fn the_service_policy_parses_with_its_defaults() {
    let xdp = parse(XDP).expect("no services").xdp.expect("xdp");
    assert_eq!(xdp.services, None, "absent: every packet goes on to the buckets");
    let text = format!(
        "{XDP}[xdp.services]\ntcp = [22, 443]\nudp = [443]\nudp_replies_from = [\"10.0.0.2/32\", \"2001:db8::53\"]\n"
    );
    let services = parse(&text).expect("services").xdp.expect("xdp").services.expect("services");
    let ports = |ports: &[Port]| ports.iter().map(|port| port.0.get()).collect::<Vec<_>>();
    assert_eq!((ports(&services.tcp), ports(&services.udp)), (vec![22, 443], vec![443]));
    assert_eq!((services.icmp, services.other), (Verdict::Pass, Verdict::Drop));
    let sources: Vec<String> = services.udp_replies_from.iter().map(|source| source.0.to_string()).collect();
    assert_eq!(sources, ["10.0.0.2/32", "2001:db8::53/128"]);
    let xdp = parse(&text).expect("services").xdp.expect("xdp");
    let summary = xdp.spoofing_summary(None);
    assert_eq!(
        summary.last().map(String::as_str),
        Some(
            "xdp.services: TCP to port 22, 443, UDP to port 443 (and to the ephemeral ports from 2 udp_replies_from \
             networks), ICMP passed, other protocols dropped: every other packet is dropped before the buckets"
        )
    );
    let text = format!("{XDP}[xdp.services]\ntcp = []\nicmp = \"drop\"\nother = \"pass\"\n");
    let services = parse(&text).expect("services").xdp.expect("xdp").services.expect("services");
    assert_eq!(
        (services.tcp.len(), services.udp.len(), services.icmp, services.other),
        (0, 0, Verdict::Drop, Verdict::Pass)
    );
}

#[test]
fn check_warns_of_a_service_policy_without_the_proxys_port() {
    let proxy = |listen: &str| format!("[proxy]\nlisten = \"{listen}\"\nupstream = \"http://127.0.0.1:3000\"\n");
    let warning = |services: &str, listen: &str| {
        let config = parse(&format!("{XDP}[xdp.services]\n{services}\n{}", proxy(listen))).expect("valid");
        config.xdp.as_ref().expect("xdp").services_warning(config.proxy.as_ref())
    };
    let missing = warning("tcp = [22]", "0.0.0.0:443").expect("a warning");
    assert!(missing.starts_with("xdp.services.tcp does not list the proxy's port 443: "), "{missing}");
    assert_eq!(warning("tcp = [22, 443]", "0.0.0.0:443"), None);
    assert_eq!(warning("tcp = [22]", "127.0.0.1:8080"), None, "a loopback listener is not behind the NIC");
}

#[test]
fn bad_service_policies_name_key_and_line() {
    let services = |body: &str| refusal(&format!("{XDP}[xdp.services]\ntcp = [22]\n{body}"));
    let (line, key, message) = services("udp = [53, 0]\n");
    assert_eq!((line, key.as_str(), message.as_str()), (8, "xdp.services.udp", "0 is not a port from 1 to 65535"));
    let (line, key, message) = services("udp = [65536]\n");
    assert_eq!((line, key.as_str(), message.as_str()), (8, "xdp.services.udp", "65536 is not a port from 1 to 65535"));
    let (line, key, message) = services("udp = [443, 123, 443]\n");
    assert_eq!((line, key.as_str(), message.as_str()), (8, "xdp.services.udp", "443 appears twice"));
    let (line, key, message) = refusal(&format!("{XDP}[xdp.services]\nudp = [443]\ntcp = [22, 22]\n"));
    assert_eq!((line, key.as_str(), message.as_str()), (8, "xdp.services.tcp", "22 appears twice"));
    let (line, key, message) = refusal(&format!("{XDP}[xdp.services]\nudp = [443]\n"));
    assert_eq!((line, key.as_str()), (6, "xdp.services"), "{message}");
    assert!(message.contains("missing field `tcp`"), "{message}");
    let (line, key, message) = services("icmp = \"reject\"\n");
    assert_eq!((line, key.as_str()), (8, "xdp.services.icmp"), "{message}");
    assert!(message.contains("expected `pass` or `drop`"), "{message}");
    let (line, key, message) = services("udp_replies_from = [\"10.0.0.1/8\"]\n");
    assert_eq!((line, key.as_str()), (8, "xdp.services.udp_replies_from"), "{message}");
    assert!(message.contains("host bits set"), "{message}");
    let (_, key, message) = services("udp_replies_from = [\"10.0.0.2\", \"10.0.0.2/32\"]\n");
    assert_eq!((key.as_str(), message.as_str()), ("xdp.services.udp_replies_from", "10.0.0.2/32 appears twice"));
    let many: Vec<String> = (1..=17).map(|i| format!("\"10.0.0.{i}\"")).collect();
    let (line, key, message) = services(&format!("udp_replies_from = [{}]\n", many.join(", ")));
    assert_eq!((line, key.as_str()), (8, "xdp.services.udp_replies_from"), "{message}");
    assert!(message.starts_with("17 networks, more than the 16"), "{message}");
    let (_, _, message) = services("udp_replies_from = [\"::/0\"]\n");
    assert!(message.contains("::ffff:0:0/96"), "{message}");
    let (_, key, _) = services("ports = [1]\n");
    assert_eq!(key, "xdp.services.ports");
}

/// Aggregate buckets are keyed by prefix: a rule's own aggregate on less than a whole
/// /24 (or a narrower limit rule carving into such a rule) would charge one /24's
/// bucket at two rates.
#[test]
fn a_rule_aggregate_must_cover_whole_prefixes() {
    let limit = "action = \"limit\"\npackets_per_second = 5\nburst = 5\n";
    let own = "aggregate_packets_per_second = 50\naggregate_burst = 100\n";
    let narrow = format!("{XDP}[[xdp.cidr]]\ncidr = \"10.1.2.0/25\"\n{limit}{own}");
    let (line, key, message) = refusal(&narrow);
    assert_eq!((line, key.as_str()), (7, "xdp.cidr[0].cidr"), "{message}");
    assert!(message.contains("narrower than the /24 prefixes"), "{message}");
    let v6 = format!("{XDP}[[xdp.cidr]]\ncidr = \"2001:db8::/56\"\n{limit}{own}");
    assert!(refusal(&v6).2.contains("narrower than the /48 prefixes"));
    let inside = format!(
        "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\n{limit}{own}[[xdp.cidr]]\ncidr = \"10.1.2.128/25\"\n{limit}"
    );
    let (_, key, message) = refusal(&inside);
    assert_eq!(key, "xdp.cidr[1].cidr", "{message}");
    assert!(message.contains("inside 10.0.0.0/8"), "{message}");
    // Whole prefixes, a narrower deny (which charges no aggregate), or a shorter
    // aggregate prefix are all consistent.
    parse(&format!(
        "{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\n{limit}{own}[[xdp.cidr]]\ncidr = \"10.1.2.0/24\"\n{limit}"
    ))
    .expect("a whole /24 inside");
    parse(&format!("{XDP}[[xdp.cidr]]\ncidr = \"10.0.0.0/8\"\n{limit}{own}[[xdp.cidr]]\ncidr = \"10.1.2.128/25\"\naction = \"deny\"\n"))
        .expect("a narrower deny");
    parse(&format!("{XDP}[xdp.aggregate]\nipv4_prefix = 25\n[[xdp.cidr]]\ncidr = \"10.1.2.0/25\"\n{limit}{own}"))
        .expect("a /25 aggregate");
}

#[test]
fn a_signature_key_without_secrets_is_refused_at_its_line() {
    let text = EXAMPLE.replace("secrets = [\"file:/etc/limiter/keys/k-free-1\"]", "");
    let (line, key, message) = refusal(&text);
    assert_eq!(key, "proxy.keys[0].id");
    assert!(message.contains("auth = \"bearer\""), "{message}");
    assert_eq!(line, text.lines().position(|l| l.starts_with("id = \"k-free-1\"")).expect("id line") + 1);
    let bearer = text.replace("id = \"k-free-1\"", "id = \"k-free-1\"\nauth = \"bearer\"");
    let config = parse(&bearer).expect("a bearer key needs no secrets");
    assert_eq!(config.proxy.expect("proxy").keys[0].auth, crate::proxy::KeyAuth::Bearer);
    let typo = EXAMPLE.replace("id = \"k-free-1\"", "id = \"k-free-1\"\nauth = \"token\"");
    assert_eq!(refusal(&typo).1, "proxy.keys[0].auth");
}

#[test]
fn idempotency_max_bytes_defaults_and_must_not_be_zero() {
    let config = parse(PROXY).expect("defaults");
    assert_eq!(config.proxy.expect("proxy").signature.idempotency_max_bytes.get(), 64 << 20);
    let (_, key, _) = refusal(&format!("{PROXY}[proxy.signature]\nidempotency_max_bytes = 0\n"));
    assert_eq!(key, "proxy.signature.idempotency_max_bytes");
}

#[test]
fn connection_bounds_have_defaults_and_name_their_mistakes() {
    let proxy = parse(PROXY).expect("minimal proxy").proxy.expect("proxy");
    assert_eq!((proxy.idle_timeout.0, proxy.body_timeout.0), (Duration::from_secs(60), Duration::from_secs(30)));
    assert_eq!((proxy.max_connections.get(), proxy.max_connections_per_ip.get()), (10_000, 256));

    let (line, key, message) = refusal(&format!("{PROXY}body_timeout = \"0s\"\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.body_timeout"), "{message}");
    let (line, key, _) = refusal(&format!("{PROXY}idle_timeout = \"0ms\"\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.idle_timeout"));
    let (line, key, _) = refusal(&format!("{PROXY}max_connections = 0\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.max_connections"));
    let (line, key, _) = refusal(&format!("{PROXY}\nmax_connections_per_ip = -1\n"));
    assert_eq!((line, key.as_str()), (5, "proxy.max_connections_per_ip"));
}

#[test]
fn buffered_bytes_default_to_bodies_of_max_body_bytes_and_hold_at_least_one() {
    let proxy = parse(&format!("{PROXY}max_body_bytes = 1000\n")).expect("proxy").proxy.expect("proxy");
    assert_eq!((proxy.buffered_bytes_per_connection(), proxy.buffered_bytes_per_client()), (8_000, 32_000));
    let set = format!(
        "{PROXY}max_body_bytes = 1000\nmax_buffered_bytes_per_connection = 1000\nmax_buffered_bytes_per_client = 5000\n"
    );
    let proxy = parse(&set).expect("proxy").proxy.expect("proxy");
    assert_eq!((proxy.buffered_bytes_per_connection(), proxy.buffered_bytes_per_client()), (1_000, 5_000));

    let (_, key, message) = refusal(&format!("{PROXY}max_body_bytes = 1000\nmax_buffered_bytes_per_client = 999\n"));
    assert_eq!(key, "proxy.max_buffered_bytes_per_client", "{message}");
    assert!(message.contains("at least max_body_bytes (1000)"), "{message}");
}

#[test]
fn workers_default_to_one_per_cpu_and_name_their_mistakes() {
    let proxy = parse(PROXY).expect("minimal proxy").proxy.expect("proxy");
    let cpus = std::thread::available_parallelism().expect("CPU count");
    assert_eq!((proxy.workers, proxy.workers()), (None, cpus));
    let proxy = parse(&format!("{PROXY}workers = 3\n")).expect("3 workers").proxy.expect("proxy");
    assert_eq!(proxy.workers().get(), 3);
    let (line, key, _) = refusal(&format!("{PROXY}workers = 0\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.workers"));
}

#[test]
fn path_keys_default_to_reject_and_case_insensitive_and_name_their_mistakes() {
    let proxy = parse(PROXY).expect("proxy").proxy.expect("proxy");
    assert_eq!(proxy.escaped_slashes, EscapedSlashes::Reject);
    assert!(proxy.case_insensitive_paths());
    assert!(proxy.path_options().case_insensitive);
    let keep = parse(&format!("{PROXY}escaped_slashes = \"keep\"\n")).expect("keep").proxy.expect("proxy");
    assert_eq!(keep.escaped_slashes, EscapedSlashes::Keep);

    let (line, key, message) = refusal(&format!("{PROXY}escaped_slashes = \"decode\"\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.escaped_slashes"), "{message}");
    assert!(message.contains("use reject or keep"), "{message}");

    let rule = |path: &str| {
        format!("[[proxy.rules]]\nname = \"r\"\npath = \"{path}\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1s\"\n")
    };
    for (path, fix) in
        [("/a//b", "/a/b"), ("/%6cogin", "/login"), ("/login/", "/login"), ("/a;x", "/a"), ("/a/../b", "/b")]
    {
        let (line, key, message) = refusal(&format!("{PROXY}{}", rule(path)));
        assert_eq!((line, key.as_str()), (6, "proxy.rules[0].path"), "{message}");
        assert!(message.contains(&format!("write `{fix}`")), "{path}: {message}");
    }
    let (_, key, message) = refusal(&format!("{PROXY}{}", rule("/a%2Fb")));
    assert_eq!(key, "proxy.rules[0].path", "{message}");
    parse(&format!("{PROXY}escaped_slashes = \"keep\"\n{}", rule("/a%2Fb"))).expect("kept encoded, it is canonical");

    for folded in
        [format!("{PROXY}{}", rule("/API")), format!("{PROXY}case_insensitive_paths = true\n{}", rule("/API"))]
    {
        let (_, key, message) = refusal(&folded);
        assert_eq!(key, "proxy.rules[0].path", "{message}");
        assert!(message.contains("lower case") && message.contains("write `/api`"), "{message}");
    }
    parse(&format!("{PROXY}case_insensitive_paths = false\n{}", rule("/API")))
        .expect("case-sensitive, any case is canonical");
}

#[test]
fn check_warns_of_path_rules_under_the_old_case_default_or_a_case_sensitive_one() {
    let rule = "[[proxy.rules]]\nname = \"r\"\npath = \"/api\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1s\"\n";
    let pattern = "[[proxy.rules]]\nname = \"r\"\naction = \"deny\"\nwhen.path_matches = \"^/admin\"\n";
    let warning = |text: &str| parse(text).expect("valid").proxy.expect("proxy").path_case_warnings();
    for rules in [rule, pattern] {
        let unset = warning(&format!("{PROXY}{rules}")).expect("the default changed under it");
        assert!(unset.contains("default is now true (it was false)"), "{unset}");
        let sensitive = warning(&format!("{PROXY}case_insensitive_paths = false\n{rules}")).expect("dodgeable");
        assert!(sensitive.contains("skips every path rule"), "{sensitive}");
        assert_eq!(warning(&format!("{PROXY}case_insensitive_paths = true\n{rules}")), None);
    }
    assert_eq!(warning(PROXY), None, "no path rule, nothing matches differently");
    assert_eq!(warning(&format!("{PROXY}case_insensitive_paths = false\n")), None);
}

#[test]
fn a_decision_log_takes_a_path_and_a_share_of_decisions() {
    let text = format!("{PROXY}decision_log = {{ path = \"/var/log/limiter/decisions.jsonl\" }}\n");
    let log = parse(&text).expect("a path alone").proxy.expect("proxy").decision_log.expect("decision log");
    assert_eq!((log.path.to_str(), log.sample), (Some("/var/log/limiter/decisions.jsonl"), 1.0));
    for bad in ["0", "1.5", "-0.1"] {
        let text = format!("{PROXY}decision_log = {{ path = \"/tmp/d\", sample = {bad} }}\n");
        let (_, key, message) = refusal(&text);
        assert!(key.starts_with("proxy.decision_log"), "{bad}: {key}");
        assert!(message.contains("more than 0, at most 1"), "{bad}: {message}");
    }
    assert!(refusal(&format!("{PROXY}decision_log = {{ file = \"/tmp/d\" }}\n")).2.contains("unknown field"));
}

#[test]
fn pattern_rules_refuse_bad_patterns_and_mixed_actions_by_key_and_line() {
    let rule = |body: &str| format!("{PROXY}[[proxy.rules]]\nname = \"r\"\n{body}");
    let (line, key, message) = refusal(&rule("action = \"deny\"\n[proxy.rules.when]\npath_matches = '(unclosed'\n"));
    assert!(key.starts_with("proxy.rules[0]"), "{key}");
    assert_eq!(line, 4, "{message}");
    assert!(message.contains("pattern `(unclosed`"), "{message}");
    let huge = rule("action = \"deny\"\n[proxy.rules.when]\nheader_matches = { \"x\" = '\\w{1000}{1000}' }\n");
    assert!(refusal(&huge).2.contains("size limit"), "{}", refusal(&huge).2);
    let long = rule(&format!("action = \"deny\"\n[proxy.rules.when]\npath_matches = '{}'\n", "a".repeat(1025)));
    assert!(refusal(&long).2.contains("at most 1024 bytes"));
    let mixed = rule("action = \"deny\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1m\"\n");
    assert!(refusal(&mixed).2.contains("counts nothing: it takes no limit, no concurrency and no key"));
    assert!(refusal(&rule("action = \"block\"\n")).2.contains("not limit, deny or tag"));
    assert!(refusal(&rule("key = \"ip\"\n")).2.contains("a limit rule needs limit and window"));
    let unknown = rule("action = \"tag\"\n[proxy.rules.when]\nuser_agent = \"x\"\n");
    let (_, key, message) = refusal(&unknown);
    assert!(key.contains("user_agent") && message.contains("unknown field"), "{key}: {message}");
    let bad_cidr = rule("action = \"deny\"\n[proxy.rules.when]\nclients = [\"10.0.0.0/33\"]\n");
    assert!(refusal(&bad_cidr).1.starts_with("proxy.rules[0]"));

    let parsed =
        parse(&rule("action = \"tag\"\n[proxy.rules.when]\nheaders_absent = [\"User-Agent\"]\n")).expect("tag");
    let tag = &parsed.proxy.expect("proxy").rules[0];
    assert_eq!((tag.action.clone(), tag.limit()), (crate::proxy::RuleAction::Tag, None));
    assert_eq!(tag.when.headers_absent, [http::HeaderName::from_static("user-agent")]);
}

#[test]
fn the_shipped_patterns_parse() {
    let text = format!("{PROXY}{}", include_str!("../../config/patterns.toml"));
    let proxy = parse(&text).expect("config/patterns.toml").proxy.expect("proxy");
    assert!(proxy.rules.len() >= 9 && proxy.rules.iter().all(|rule| rule.limit().is_none()));
}

#[test]
fn redis_urls_name_one_server_sentinels_or_a_cluster() {
    let with = |url: &str, prefix: &str| {
        format!("{PROXY}store = \"redis\"\nredis_url = \"{url}\"\nredis_prefix = \"{prefix}\"\n")
    };
    for url in [
        "redis://10.0.0.5:6379/",
        "rediss://r.example:6380/",
        "redis+sentinel://s1:26379,s2:26379/main",
        "redis+cluster://n1:7000,n2:7001/",
    ] {
        parse(&with(url, "limiter:")).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    for (url, says) in [
        ("http://r:6379/", "is not a redis://"),
        ("redis+sentinel://s1:26379/", "names its Sentinels and the master"),
        ("redis+cluster:///", "names its seed nodes"),
    ] {
        let (line, key, message) = refusal(&with(url, "limiter:"));
        assert_eq!((line, key.as_str()), (5, "proxy.redis_url"), "{url}: {message}");
        assert!(message.contains(says), "{url}: {message}");
    }
    parse(&with("rediss+cluster://n1:7000/", "limiter:")).expect("a TLS cluster");
    let ca = format!("{}redis_tls_ca = \"/etc/limiter/redis-ca.pem\"\n", with("redis://r:6379/", "limiter:"));
    assert!(refusal(&ca).2.contains("redis_tls_ca goes with a TLS URL"));
    let braces = refusal(&with("redis+cluster://n1:7000/", "{team}:"));
    assert!(braces.2.contains("cannot hold { or }"), "{}", braces.2);
}

#[test]
fn edge_keys_have_their_defaults_and_inconsistent_ones_are_refused_by_key_and_line() {
    use crate::proxy::ProxyProtocol;
    let proxy = parse(PROXY).expect("defaults").proxy.expect("proxy");
    assert_eq!(
        (proxy.tls, proxy.proxy_protocol, proxy.tunnel_idle_timeout.0),
        (None, ProxyProtocol::Off, Duration::from_secs(300))
    );
    assert_eq!(
        (proxy.http2.h2c, proxy.http2.max_concurrent_streams.get(), proxy.http2.max_header_list_bytes.get()),
        (false, 100, 16_384)
    );
    assert_eq!(proxy.http2.max_resets_per_minute.get(), 100);

    let (line, key, message) = refusal(&format!("{PROXY}proxy_protocol = \"v2\"\n"));
    assert_eq!((key.as_str(), line), ("proxy.proxy_protocol", PROXY.lines().count() + 1), "{message}");
    assert!(message.contains("trusted_proxies"), "{message}");
    assert!(refusal(&format!("{PROXY}proxy_protocol = \"v3\"\n")).2.contains("unknown variant"));
    let tls = "[proxy.tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n";
    let (_, key, message) = refusal(&format!("{PROXY}{tls}[proxy.http2]\nh2c = true\n"));
    assert_eq!(key, "proxy.http2.h2c", "{message}");
    let twice = "[[proxy.tls.sni]]\nname = \"a.test\"\ncert = \"/a\"\nkey = \"/a\"\n[[proxy.tls.sni]]\nname = \"A.test\"\ncert = \"/b\"\nkey = \"/b\"\n";
    let (line, key, message) = refusal(&format!("{PROXY}{tls}{twice}"));
    assert_eq!(key, "proxy.tls.sni[1].name", "{message}");
    assert_eq!(line, PROXY.lines().count() + 3 + 4 + 2, "{message}");
    assert_eq!(refusal(&format!("{PROXY}tunnel_idle_timeout = \"0s\"\n")).1, "proxy.tunnel_idle_timeout");
    assert!(refusal(&format!("{PROXY}[proxy.http2]\nmax_concurrent_streams = 0\n")).2.contains("nonzero"));
}

#[test]
fn every_key_kind_reads_back_from_its_name() {
    use crate::proxy::KeyKind;
    let kinds = [
        KeyKind::Ip,
        KeyKind::ApiKey,
        KeyKind::Header(http::HeaderName::from_static("x-tenant")),
        KeyKind::Query("page".to_owned()),
        KeyKind::Cookie("session".to_owned()),
        KeyKind::Json("/user/e~1mail".parse().expect("pointer")),
        KeyKind::Form("username".to_owned()),
    ];
    for kind in kinds {
        assert_eq!(kind.to_string().parse::<KeyKind>(), Ok(kind.clone()), "{kind}");
    }
    for nothing in ["header:", "query:", "cookie:", "form:", "ipv6", "jsonx:/a"] {
        assert!(nothing.parse::<KeyKind>().is_err(), "{nothing}");
    }
}

#[test]
fn a_key_of_several_parts_or_read_from_the_request_is_checked_naming_the_rule_and_line() {
    let rule = |key: &str, extra: &str| {
        format!(
            "{PROXY}[[proxy.rules]]\nname = \"login\"\npath = \"/login\"\nkey = {key}\n{extra}limit = 5\nwindow = \"1h\"\n"
        )
    };
    let key_line = PROXY.lines().count() + 4;
    let config = parse(&rule("[\"ip\", \"header:x-tenant\"]", "key_fold = \"lower\"\n")).expect("composite");
    let key = &config.proxy.as_ref().expect("proxy").rules[0].key;
    assert_eq!(key.to_string(), "[ip, header:x-tenant] folded to lower case");
    assert!(!key.needs_body() && !key.needs_proof());
    let config = parse(&rule("\"json:/user/name+route\"", "")).expect("json");
    let key = &config.proxy.as_ref().expect("proxy").rules[0].key;
    assert!(key.needs_body() && key.per_route);
    for (key, says) in [
        ("\"json:username\"", "starts with /"),
        ("\"json:/a~2\"", "RFC 6901"),
        ("[]", "at least one part"),
        ("[\"ip\", \"ip\"]", "twice"),
        ("\"cookie:\"", "is not a key"),
    ] {
        let (line, at, message) = refusal(&rule(key, ""));
        assert!(message.contains(says) && message.contains("login"), "{key}: {message}");
        assert!((key_line - 4..=key_line).contains(&line), "{key}: line {line} ({at}): {message}");
    }
    let (_, _, message) = refusal(&rule("\"ip\"", "key_fold = \"lower\"\n"));
    assert!(message.contains("key_fold folds what a client sends"), "{message}");
    let body_keys = parse(&format!("{PROXY}[proxy.body_keys]\nmax_bytes = 4096\n")).expect("body_keys");
    assert_eq!(body_keys.proxy.expect("proxy").body_keys.max_bytes, 4096);
}

#[test]
fn a_reload_report_names_every_changed_proxy_key_and_marks_the_restart_only_ones() {
    use crate::changes::{Change, Changes as _};
    let before = format!(
        "{PROXY}store_failure = \"allow\"\n[[proxy.rules]]\nname = \"login\"\npath = \"/login\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1m\"\n"
    );
    let after = before
        .replace(
            "listen = \"127.0.0.1:8080\"",
            "listen = \"127.0.0.1:8081\"\nmax_connections = 20000\nbody_timeout = \"5s\"",
        )
        .replace("store_failure = \"allow\"", "store_failure = \"deny\"")
        .replace("limit = 5", "limit = 10");
    let (old, new) = (parse(&before).expect("before"), parse(&after).expect("after"));
    let mut changes = Vec::new();
    old.changes(&new, "", &mut changes);
    let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
    for wanted in [
        "proxy.listen: 127.0.0.1:8080 -> 127.0.0.1:8081",
        "proxy.max_connections: 10000 -> 20000",
        "proxy.body_timeout: 30s -> 5s",
        "proxy.store_failure: allow -> deny",
        "proxy.rules[login]: limit 5 per 1m (sliding_window_counter) -> limit 10 per 1m (sliding_window_counter)",
    ] {
        assert!(lines.iter().any(|line| line == wanted), "{wanted} missing from {lines:#?}");
    }
    assert_eq!(changes.iter().filter_map(Change::needing_restart).collect::<Vec<_>>(), ["proxy.listen"]);
}

#[test]
fn escalate_is_for_deny_rules_and_check_names_those_that_no_longer_escalate() {
    let rules = "[[proxy.rules]]\nname = \"quiet\"\naction = \"deny\"\npath = \"/a\"\n\
                 [[proxy.rules]]\nname = \"loud\"\naction = \"deny\"\npath = \"/b\"\nescalate = true\n\
                 [[proxy.rules]]\nname = \"tagged\"\naction = \"tag\"\n";
    let config = parse(&format!("{XDP}{PROXY}{rules}[escalation]\nthreshold = 5\n")).expect("escalate");
    let proxy = config.proxy.as_ref().expect("proxy");
    assert_eq!(proxy.rules.iter().map(|r| r.escalate).collect::<Vec<_>>(), [false, true, false]);
    assert_eq!(config.deny_rules_not_escalating(), ["quiet"]);
    let off = parse(&format!("{XDP}{PROXY}{rules}[escalation]\nenabled = false\n")).expect("escalation off");
    assert!(off.deny_rules_not_escalating().is_empty(), "nothing escalates anyway");
    assert!(parse(&format!("{XDP}{PROXY}{rules}")).expect("no escalation").deny_rules_not_escalating().is_empty());

    let rule = |body: &str| format!("{PROXY}[[proxy.rules]]\nname = \"r\"\n{body}escalate = true\n");
    for body in ["action = \"tag\"\n", "key = \"ip\"\nlimit = 5\nwindow = \"1m\"\n"] {
        let (_, key, message) = refusal(&rule(body));
        assert!(key.starts_with("proxy.rules[0]"), "{body}: {key}");
        assert!(message.contains("escalate needs action = \"deny\""), "{body}: {message}");
    }
}

#[test]
fn upgrades_are_to_websocket_unless_said_otherwise_and_each_is_a_protocol_name() {
    let proxy = parse(PROXY).expect("proxy").proxy.expect("section");
    assert_eq!(proxy.upgrade_protocols, ["websocket"]);
    let text = format!("{PROXY}upgrade_protocols = [\"websocket\", \"h2c\"]\n");
    assert_eq!(parse(&text).expect("two").proxy.expect("section").upgrade_protocols, ["websocket", "h2c"]);
    for bad in ["", "websocket/13", "web socket"] {
        let (line, key, message) = refusal(&format!("{PROXY}upgrade_protocols = [\"h2c\", \"{bad}\"]\n"));
        assert_eq!((line, key.as_str()), (4, "proxy.upgrade_protocols"), "{bad}: {message}");
        assert!(message.contains(&format!("`{bad}`")), "{message}");
    }
}

#[test]
fn body_larger_than_counts_a_body_of_unknown_length_as_larger() {
    let text = format!("{PROXY}[[proxy.rules]]\nname = \"big\"\naction = \"deny\"\nwhen.body_larger_than = 4\n");
    let proxy = parse(&text).expect("valid").proxy.expect("proxy");
    let headers = http::HeaderMap::new();
    let holds = |body_length: Option<u64>| {
        let seen = super::conditions::Seen {
            method: &http::Method::POST,
            path: "/",
            query: None,
            client: std::net::IpAddr::from([192, 0, 2, 1]),
            headers: &headers,
            body_length,
            ja4: None,
        };
        proxy.rules[0].applies(&seen)
    };
    assert_eq!([None, Some(5), Some(4), Some(0)].map(holds), [true, true, false, false]);
}

#[test]
fn an_http1_head_announces_its_length_or_none_when_chunked() {
    use super::conditions::http1_body_length;
    let head = |headers: &[(&'static str, &'static str)]| {
        let mut map = http::HeaderMap::new();
        for &(name, value) in headers {
            map.append(name, http::HeaderValue::from_static(value));
        }
        http1_body_length(&map)
    };
    assert_eq!(head(&[]), Some(0));
    assert_eq!(head(&[("content-length", "12")]), Some(12));
    assert_eq!(head(&[("transfer-encoding", "chunked")]), None);
}

#[test]
fn check_warns_where_a_new_connection_bound_is_tighter_than_one_the_config_set() {
    let warnings = |extra: &str| {
        parse(&format!("{PROXY}{extra}")).expect("valid").proxy.expect("proxy").connection_bound_warnings()
    };
    assert_eq!(warnings(""), Vec::<String>::new(), "the defaults agree");
    let raised = warnings("max_connections_per_ip = 2000\n");
    assert_eq!(raised.len(), 2, "{raised:?}");
    assert!(raised[0].contains("one IPv6 client gets at most 1024"), "{raised:?}");
    assert!(raised[1].contains("only 256 requests in flight"), "{raised:?}");
    let widened =
        "max_connections_per_ip = 2000\nmax_connections_per_ipv6_56 = 4096\nmax_requests_in_flight_per_client = 2000\n";
    assert_eq!(warnings(widened), Vec::<String>::new());
    let upstream = warnings("max_connections = 20000\n");
    assert!(upstream.len() == 1 && upstream[0].contains("max_upstream_connections"), "{upstream:?}");
}

#[test]
fn a_jwt_key_needs_proxy_jwt_and_is_refused_at_its_rule_without_it() {
    let rules = "[[proxy.rules]]\nname = \"per-ip\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1s\"\n\
                 [[proxy.rules]]\nname = \"per-user\"\nkey = \"jwt:sub+route\"\nlimit = 3\nwindow = \"1m\"\n";
    let (line, key, message) = refusal(&format!("{PROXY}{rules}"));
    assert_eq!((line, key.as_str()), (11, "proxy.rules[1].key"), "{message}");
    assert!(message.contains("rule `per-user`") && message.contains("[proxy.jwt]"), "{message}");

    let jwt = "[proxy.jwt]\nhs256_secrets = [\"file:/etc/limiter/keys/jwt\"]\niss = \"https://id.example.com\"\n\
               issuers = [{ iss = \"https://login.example.org\", audiences = [\"api\"], jwks_file = \"/etc/limiter/jwks.json\" }]\n";
    let proxy = parse(&format!("{PROXY}{jwt}{rules}")).expect("with [proxy.jwt]").proxy.expect("proxy");
    let rule = &proxy.rules[1].key;
    assert_eq!(
        (rule.parts.as_slice(), rule.per_route, rule.to_string().as_str()),
        (&[crate::proxy::KeyKind::Jwt("sub".to_owned())][..], true, "jwt:sub+route")
    );
    let jwt = proxy.jwt.expect("jwt");
    assert_eq!((jwt.header.as_str(), jwt.leeway.0), ("authorization", Duration::from_secs(30)), "the defaults");
    assert_eq!((jwt.issuers[0].audiences.as_slice(), jwt.audiences.len()), (&["api".to_owned()][..], 0));

    for (bad, key) in [
        ("[proxy.jwt]\nleeway = \"30s\"\n", "proxy.jwt"),
        (
            "[proxy.jwt]\nissuers = [{ iss = \"a\", jwks_file = \"/j\" }, { iss = \"a\", jwks_file = \"/k\" }]\n",
            "proxy.jwt.issuers[1].iss",
        ),
        ("[proxy.jwt]\nissuers = [{ iss = \"a\", jwks_file = \"/j\" }]\naudiences = [\"api\"]\n", "proxy.jwt.iss"),
        ("[proxy.jwt]\nheader = \"not a header\"\nhs256_secrets = [\"env:S\"]\n", "proxy.jwt.header"),
    ] {
        let (line, at, message) = refusal(&format!("{PROXY}{bad}"));
        assert_eq!(at, key, "{message}");
        assert!(line > 3, "{key} at line {line}, in [proxy.jwt]");
    }
    let (_, key, message) =
        refusal(&format!("{PROXY}[[proxy.rules]]\nname = \"r\"\nkey = \"jwt:\"\nlimit = 1\nwindow = \"1s\"\n"));
    assert!(key == "proxy.rules[0]" && message.contains("jwt:CLAIM"), "{key}: {message}");
    let composite =
        "[[proxy.rules]]\nname = \"per-user-ip\"\nkey = [\"ip\", \"jwt:sub\"]\nlimit = 1\nwindow = \"1s\"\n";
    let (_, key, message) = refusal(&format!("{PROXY}{composite}"));
    assert_eq!(key, "proxy.rules[0].key", "a part of a composite: {message}");
}

/// Two scopes and three bearer keys: one holding `payments:write`, one holding none
/// (`scopes = []`), one listing none (every scope).
const SCOPES: &str = r#"[proxy.plans.p]
limit = 10
window = "1m"
[[proxy.scopes]]
name = "payments:write"
paths = ["/api/transfer", "/api/refund"]
methods = ["post"]
[[proxy.scopes]]
name = "admin"
paths = ["/api"]
[[proxy.keys]]
id = "k-pay"
plan = "p"
auth = "bearer"
scopes = ["payments:write"]
[[proxy.keys]]
id = "k-none"
plan = "p"
auth = "bearer"
scopes = []
[[proxy.keys]]
id = "k-all"
plan = "p"
auth = "bearer"
"#;

/// The scope `proxy` says a request misses, by name.
fn scope_missing(
    proxy: &crate::ProxyConfig,
    method: http::Method,
    path: &str,
    headers: &[(&'static str, &'static str)],
    key: Option<&crate::proxy::ApiKey>,
) -> Option<String> {
    let headers: http::HeaderMap = headers
        .iter()
        .map(|&(name, value)| (http::HeaderName::from_static(name), http::HeaderValue::from_static(value)))
        .collect();
    let seen = super::conditions::Seen {
        method: &method,
        path,
        query: None,
        client: std::net::IpAddr::from([192, 0, 2, 1]),
        headers: &headers,
        body_length: Some(0),
        ja4: None,
    };
    proxy.scope_missing(&seen, key).map(|scope| scope.name.clone())
}

#[test]
fn a_request_needs_every_scope_whose_area_it_is_in_and_none_outside_them() {
    use http::Method;
    let proxy = parse(&format!("{PROXY}{SCOPES}")).expect("scopes").proxy.expect("proxy");
    assert_eq!(proxy.scopes[0].methods, [Method::POST]);
    let [pay, none, all] = [0, 1, 2].map(|i| Some(&proxy.keys[i]));
    let missing = |method, path, headers, key| scope_missing(&proxy, method, path, headers, key);
    // Outside every area: any key, and a keyless request.
    for key in [pay, none, all, None] {
        assert_eq!(missing(Method::POST, "/public", &[], key), None);
        assert_eq!(missing(Method::POST, "/apix", &[], key), None, "a prefix is whole segments");
    }
    // `/api/transfer` by POST is in both areas: it needs both scopes.
    assert_eq!(missing(Method::POST, "/api/transfer", &[], pay).as_deref(), Some("admin"));
    assert_eq!(missing(Method::POST, "/api/transfer/7", &[], none).as_deref(), Some("payments:write"));
    assert_eq!(missing(Method::POST, "/api/transfer", &[], all), None, "no scopes listed: every one");
    assert_eq!(missing(Method::POST, "/api/transfer", &[], None).as_deref(), Some("payments:write"));
    // By GET it is in `admin`'s area only; a method override cannot take it out of
    // `payments:write`'s.
    assert_eq!(missing(Method::GET, "/api/transfer", &[], none).as_deref(), Some("admin"));
    let override_post = [("x-http-method-override", "POST")];
    assert_eq!(missing(Method::GET, "/api/refund", &override_post, none).as_deref(), Some("payments:write"));

    let only_payments = format!("{PROXY}{}", SCOPES.replace("paths = [\"/api\"]", "paths = [\"/admin\"]"));
    let proxy = parse(&only_payments).expect("scopes").proxy.expect("proxy");
    let [pay, none] = [0, 1].map(|i| Some(&proxy.keys[i]));
    let override_get = [("x-http-method-override", "GET")];
    assert_eq!(scope_missing(&proxy, Method::POST, "/api/refund", &override_get, pay), None, "inside its scope");
    assert_eq!(scope_missing(&proxy, Method::GET, "/api/refund", &[], none), None, "GET is outside every area");
    assert_eq!(scope_missing(&proxy, Method::HEAD, "/api/refund", &[], none), None);
    let missing = scope_missing(&proxy, Method::POST, "/api/refund", &override_get, none);
    assert_eq!(missing.as_deref(), Some("payments:write"), "served as POST or GET: in the area");
}

#[test]
fn scopes_name_their_mistakes_by_key_and_line() {
    let text = format!("{PROXY}{SCOPES}").replace("scopes = [\"payments:write\"]", "scopes = [\"payments:read\"]");
    let (line, key, message) = refusal(&text);
    assert_eq!(key, "proxy.keys[0].scopes", "{message}");
    assert_eq!(line, text.lines().position(|l| l.starts_with("scopes = [\"payments:read\"]")).expect("line") + 1);
    assert!(
        message.contains("key `k-pay` holds scope `payments:read`, which no [[proxy.scopes]] defines"),
        "{message}"
    );

    let twice = format!("{PROXY}{SCOPES}").replace("name = \"admin\"", "name = \"payments:write\"");
    let (line, key, message) = refusal(&twice);
    assert_eq!((line, key.as_str()), (12, "proxy.scopes[1].name"), "{message}");
    let (_, key, message) = refusal(&format!("{PROXY}{SCOPES}").replace("\"/api\"]", "\"/API/\"]"));
    assert_eq!(key, "proxy.scopes[1].paths", "{message}");
    assert!(message.contains("write `/api`"), "{message}");
    for (bad, wanted) in [
        ("paths = []", "needs paths"),
        ("paths = [\"api\"]", "path `api` must start with /"),
        ("paths = [\"/api\"]\nmethods = [\"G T\"]", "`G T` is not an HTTP method"),
        ("paths = [\"/api\"]\nkey = \"ip\"", "unknown field `key`"),
    ] {
        let (_, key, message) = refusal(&format!("{PROXY}{SCOPES}").replace("paths = [\"/api\"]", bad));
        assert!(key.starts_with("proxy.scopes"), "{bad}: {key}");
        assert!(message.contains(wanted), "{bad}: {message}");
    }
}

#[test]
fn the_realm_defaults_to_limiter_and_must_fit_in_a_quoted_string() {
    assert_eq!(parse(PROXY).expect("proxy").proxy.expect("proxy").realm, "limiter");
    let set = parse(&format!("{PROXY}realm = \"pay.example.com API\"\n")).expect("realm");
    assert_eq!(set.proxy.expect("proxy").realm, "pay.example.com API");
    for bad in ["", "a\\\"b", "a\\\\b", "caf\u{e9}"] {
        let (line, key, message) = refusal(&format!("{PROXY}realm = \"{bad}\"\n"));
        assert_eq!((line, key.as_str()), (4, "proxy.realm"), "{bad}: {message}");
    }
}

#[test]
fn check_names_the_keys_that_hold_every_scope_by_listing_none() {
    let warning = |text: &str| parse(text).expect("valid").proxy.expect("proxy").unscoped_keys_warning();
    let listed = warning(&format!("{PROXY}{SCOPES}")).expect("k-all lists none");
    assert!(listed.starts_with("proxy.keys k-all list no scopes"), "{listed}");
    let every_key_listing = format!("{PROXY}{SCOPES}scopes = [\"admin\"]\n");
    assert_eq!(warning(&every_key_listing), None);
    let without_scopes = SCOPES.split("[[proxy.scopes]]").next().expect("the plan");
    let unlisted = format!("{PROXY}{without_scopes}[[proxy.keys]]\nid = \"k\"\nplan = \"p\"\nauth = \"bearer\"\n");
    assert_eq!(warning(&unlisted), None, "no scope, nothing to hold");
}

#[test]
fn a_reload_report_shows_scopes_and_a_keys_scopes() {
    use crate::changes::Changes as _;
    let before = format!("{PROXY}{SCOPES}");
    let after = before.replace("scopes = [\"payments:write\"]", "scopes = []").replace("methods = [\"post\"]", "");
    let (old, new) = (parse(&before).expect("before"), parse(&after).expect("after"));
    let mut changes = Vec::new();
    old.changes(&new, "", &mut changes);
    let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        ["proxy.scopes[payments:write].methods: [POST] -> []", "proxy.keys[k-pay].scopes: [payments:write] -> []"]
    );
    assert!(changes.iter().all(|change| change.restart.is_none()), "scopes apply live: {changes:?}");
}

#[test]
fn the_examples_scope_parses_once_uncommented() {
    let mut text = EXAMPLE.to_owned();
    for line in ["scopes = [", "[[proxy.scopes]]", "name = \"payments:write\"", "paths = [", "methods = ["] {
        text = text.replace(&format!("# {line}"), line);
    }
    let proxy = parse(&text).expect("the example with its scope").proxy.expect("proxy");
    assert_eq!((proxy.scopes[0].name.as_str(), proxy.realm.as_str()), ("payments:write", "limiter"));
    assert_eq!(proxy.keys[0].scopes.as_deref(), Some(&["payments:write".to_owned()][..]));
}

#[test]
fn count_when_takes_codes_classes_and_timeout_on_limit_rules_and_names_the_rule_of_a_bad_entry() {
    use crate::count_when::StatusMatch;
    let rule = |body: &str| {
        format!(
            "{PROXY}[[proxy.rules]]\nname = \"login\"\npath = \"/login\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1h\"\n{body}"
        )
    };
    let config = parse(&rule("count_when = { status = [\"401\", 403, \"5xx\", \"timeout\"] }\n")).expect("count_when");
    let count_when = config.proxy.expect("proxy").rules[0].count_when.clone().expect("count_when");
    let code = |code| StatusMatch::Code(http::StatusCode::from_u16(code).expect("a status"));
    assert_eq!(count_when.status, [code(401), code(403), StatusMatch::Class(5), StatusMatch::Timeout]);
    assert_eq!(parse(&rule("")).expect("without").proxy.expect("proxy").rules[0].count_when, None);

    for (entry, written) in
        [("\"600\"", "\"600\""), ("99", "99"), ("\"4\"", "\"4\""), ("\"6xx\"", "\"6xx\""), ("\"408 \"", "\"408 \"")]
    {
        let (line, key, message) = refusal(&rule(&format!("count_when = {{ status = [\"401\", {entry}] }}\n")));
        assert_eq!((line, key.as_str()), (4, "proxy.rules[0]"), "{entry}: {message}");
        assert!(message.starts_with("rule `login`: count_when.status:"), "{entry}: {message}");
        assert!(message.contains(&format!("{written} is not a status")), "{entry}: {message}");
    }
    let (_, _, message) = refusal(&rule("count_when = { status = [] }\n"));
    assert!(message.contains("rule `login`: count_when.status needs an entry"), "{message}");
    let (_, key, message) = refusal(&rule("count_when = { status = [\"401\"], header = \"x\" }\n"));
    assert!(key.starts_with("proxy.rules[0]") && message.contains("unknown field `header`"), "{key}: {message}");
    let (_, _, message) = refusal(&rule("count_when = { status = [true] }\n"));
    assert!(message.contains("a status (\"401\"), a class (\"4xx\") or \"timeout\""), "{message}");
    let deny =
        format!("{PROXY}[[proxy.rules]]\nname = \"probe\"\naction = \"deny\"\ncount_when = {{ status = [\"401\"] }}\n");
    let (_, _, message) = refusal(&deny);
    assert!(message.contains("rule `probe`: count_when needs a limit rule"), "{message}");
}

#[test]
fn a_reload_report_shows_count_when_and_upstream_statuses() {
    use crate::changes::Changes as _;
    let rule = "[[proxy.rules]]\nname = \"login\"\nkey = \"ip\"\nlimit = 5\nwindow = \"1h\"\n";
    let before = format!("{XDP}{PROXY}{rule}[escalation]\nthreshold = 5\n");
    let after = format!(
        "{XDP}{PROXY}{rule}count_when = {{ status = [\"401\", \"4xx\"] }}\n[escalation]\nthreshold = 5\n\
         upstream_statuses = [401, 403]\n"
    );
    let (old, new) = (parse(&before).expect("before"), parse(&after).expect("after"));
    let mut changes = Vec::new();
    old.changes(&new, "", &mut changes);
    let lines: Vec<String> = changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "proxy.rules[login].count_when: off -> {status = [401, 4xx]}",
            "escalation.upstream_statuses: [] -> [401, 403]"
        ]
    );
    let (line, key, message) = refusal(&after.replace("[401, 403]", "[401, 600]"));
    assert_eq!((line, key.as_str()), (15, "escalation"), "{message}");
    assert!(message.contains("upstream_statuses: 600 is not an HTTP status (100 to 599)"), "{message}");
}

#[test]
fn concurrency_takes_its_queue_with_or_without_a_rate_and_refuses_an_ambiguous_queue() {
    use crate::proxy::{Concurrency, DEFAULT_QUEUE_TIMEOUT, RuleAction};
    let rule = |body: &str| format!("{PROXY}[[proxy.rules]]\nname = \"reports\"\npath = \"/api/reports\"\n{body}");
    let only = parse(&rule("key = \"api_key\"\nconcurrency = 4\nqueue = 20\nqueue_timeout = \"2s\"\n"))
        .expect("concurrency alone")
        .proxy
        .expect("proxy");
    let limit = NonZeroU32::new(4).expect("4");
    assert_eq!(only.rules[0].action, RuleAction::Concurrent);
    let queue_timeout = crate::units::HumanDuration(Duration::from_secs(2));
    assert_eq!(only.rules[0].concurrency, Some(Concurrency { limit, queue: 20, queue_timeout }));
    let rated = parse(&rule("key = \"ip\"\nlimit = 10\nwindow = \"1s\"\nconcurrency = 4\n"))
        .expect("with a rate")
        .proxy
        .expect("proxy");
    assert!(rated.rules[0].limit().is_some_and(|spec| spec.queue.is_none()));
    let defaulted = crate::units::HumanDuration(DEFAULT_QUEUE_TIMEOUT);
    assert_eq!(rated.rules[0].concurrency, Some(Concurrency { limit, queue: 0, queue_timeout: defaulted }));
    // A leaky bucket keeps its own queue beside a concurrency without one.
    let leaky = "key = \"ip\"\nalgorithm = \"leaky_bucket\"\nlimit = 10\nwindow = \"1s\"\n";
    let shaped = parse(&rule(&format!("{leaky}queue = 5\n"))).expect("a shaper").proxy.expect("proxy");
    assert_eq!(shaped.rules[0].limit().and_then(|spec| spec.queue).map(NonZeroU32::get), Some(5));
    assert!(parse(&rule(&format!("{leaky}concurrency = 2\n"))).is_ok());

    for (body, says) in [
        (format!("{leaky}concurrency = 2\nqueue = 5\n"), "queue is ambiguous on a leaky_bucket rule with concurrency"),
        ("key = \"ip\"\nlimit = 10\nwindow = \"1s\"\nqueue = 5\n".to_owned(), "queue needs concurrency"),
        (
            "key = \"ip\"\nlimit = 10\nwindow = \"1s\"\nqueue_timeout = \"1s\"\n".to_owned(),
            "queue_timeout needs concurrency",
        ),
        (
            "key = \"ip\"\nconcurrency = 2\nqueue = 3\nqueue_timeout = \"0s\"\n".to_owned(),
            "queue_timeout must be longer",
        ),
        ("concurrency = 2\n".to_owned(), "a concurrency rule needs a key"),
        ("action = \"deny\"\nconcurrency = 2\n".to_owned(), "it takes no limit, no concurrency"),
        ("key = \"ip\"\nconcurrency = 2\ncount_when = { status = [\"2xx\"] }\n".to_owned(), "count_when needs a limit"),
    ] {
        let (line, key, message) = refusal(&rule(&body));
        assert_eq!((line, key.as_str()), (4, "proxy.rules[0]"), "{body}: {message}");
        assert!(message.starts_with("rule `reports`: ") && message.contains(says), "{body}: {message}");
    }
    let (_, _, message) = refusal(&rule("key = \"ip\"\nconcurrency = 0\n"));
    assert!(message.contains("nonzero"), "{message}");
}

#[test]
fn upstream_capacity_and_plan_priorities_have_defaults_and_name_their_mistakes() {
    use crate::proxy::{DEFAULT_PLAN_PRIORITY, UpstreamCapacity};
    let plans = "[proxy.plans.pro]\nlimit = 10\nwindow = \"1s\"\npriority = 0\n[proxy.plans.free]\nlimit = 10\nwindow = \"1s\"\n";
    let capacity = "[proxy.upstream_capacity]\nconcurrency = 256\nqueue = 1024\n";
    let proxy = parse(&format!("{PROXY}{plans}{capacity}")).expect("capacity").proxy.expect("proxy");
    let concurrency = NonZeroU32::new(256);
    let queue_timeout = crate::units::HumanDuration(Duration::from_secs(1));
    assert_eq!(proxy.upstream_capacity, Some(UpstreamCapacity { concurrency, queue: 1024, queue_timeout }));
    assert_eq!((proxy.plans["pro"].priority, proxy.plans["free"].priority), (0, DEFAULT_PLAN_PRIORITY));
    assert_eq!(parse(PROXY).expect("without").proxy.expect("proxy").upstream_capacity, None);

    let (line, key, message) = refusal(&format!("{PROXY}{capacity}queue_timeout = \"0s\"\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.upstream_capacity"), "{message}");
    assert!(message.contains("queue_timeout must be longer than 0"), "{message}");
    let (_, key, message) = refusal(&format!("{PROXY}{capacity}limit = 3\n"));
    assert!(key.starts_with("proxy.upstream_capacity") && message.contains("unknown field `limit`"), "{message}");
    let (_, _, message) = refusal(&format!("{PROXY}{plans}").replace("priority = 0", "priority = 256"));
    assert!(message.contains("256"), "{message}");
    let table = "[proxy]\nlisten = \"127.0.0.1:8080\"\n[proxy.upstream]\nconcurrency = 2\n";
    let (_, key, message) = refusal(table);
    assert!(key.starts_with("proxy.upstream") && message.contains("[proxy.upstream_capacity]"), "{key}: {message}");
    let (line, key, message) = refusal(&format!("{PROXY}[proxy.upstream_capacity]\nqueue = 5\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.upstream_capacity"), "{message}");
    assert!(message.contains("needs concurrency"), "{message}");
}

#[test]
fn adaptive_kernel_tightening_warns_without_a_budget_to_scale() {
    let kernel = "[proxy.adaptive]\n[proxy.adaptive.kernel]\ntighten_new_sources = 0.5\n";
    let without_xdp = parse(&format!("{PROXY}{kernel}")).expect("without [xdp]");
    assert_eq!(without_xdp.proxy.as_ref().and_then(|p| p.adaptive.as_ref()?.tighten_new_sources), Some(0.5));
    assert!(without_xdp.tightening_nothing());
    assert!(parse(&format!("{XDP}{PROXY}{kernel}")).expect("without new_sources").tightening_nothing());
    let budget = "[xdp.new_sources]\npackets_per_second = 100\nburst = 200\n";
    assert!(!parse(&format!("{XDP}{budget}{PROXY}{kernel}")).expect("with a budget").tightening_nothing());
    assert!(!parse(&format!("{XDP}{PROXY}[proxy.adaptive]\n")).expect("not tightening").tightening_nothing());
}

#[test]
fn adaptive_has_defaults_replaces_a_fixed_concurrency_and_names_its_mistakes() {
    use crate::{count_when::StatusMatch, proxy::UpstreamCapacity};
    use limiter_core::adaptive::{Algorithm, Settings};
    let plans = "[proxy.plans.pro]\nlimit = 10\nwindow = \"1s\"\n[proxy.plans.free]\nlimit = 10\nwindow = \"1s\"\n";
    let queue = "[proxy.upstream_capacity]\nqueue = 50\n";
    let adaptive = "[proxy.adaptive]\n[proxy.adaptive.shares]\npro = 0.6\nfree = 0.3\nkeyless = 0.1\n";
    let proxy = parse(&format!("{PROXY}{plans}{queue}{adaptive}")).expect("adaptive").proxy.expect("proxy");
    let adaptive_config = proxy.adaptive.expect("adaptive");
    assert_eq!(adaptive_config.settings, Settings::new(Algorithm::Gradient2, 8, 1024, 64, 1.5).expect("defaults"));
    assert_eq!(adaptive_config.losses, vec![StatusMatch::Class(5), StatusMatch::Timeout]);
    assert_eq!(adaptive_config.shares.get("keyless"), Some(&0.1));
    let timeout = crate::units::HumanDuration(Duration::from_secs(1));
    assert_eq!(
        proxy.upstream_capacity,
        Some(UpstreamCapacity { concurrency: None, queue: 50, queue_timeout: timeout })
    );
    let written = "[proxy.adaptive]\nalgorithm = \"aimd\"\nmin_limit = 2\nmax_limit = 40\ninitial_limit = 4\n\
                   tolerance = 2.0\nlosses = [\"503\", 429, \"timeout\"]\n";
    let adaptive_config = parse(&format!("{PROXY}{written}")).expect("written").proxy.expect("proxy").adaptive;
    let adaptive_config = adaptive_config.expect("adaptive");
    assert_eq!(adaptive_config.settings, Settings::new(Algorithm::Aimd, 2, 40, 4, 2.0).expect("written"));
    assert_eq!(adaptive_config.losses.iter().map(ToString::to_string).collect::<Vec<_>>(), ["503", "429", "timeout"]);

    let both = format!("{PROXY}[proxy.upstream_capacity]\nqueue = 5\nconcurrency = 8\n[proxy.adaptive]\n");
    let (line, key, message) = refusal(&both);
    assert_eq!((line, key.as_str()), (6, "proxy.upstream_capacity.concurrency"), "{message}");
    assert!(message.contains("[proxy.adaptive] moves"), "{message}");
    let unknown = format!("{PROXY}{plans}[proxy.adaptive]\n[proxy.adaptive.shares]\npro = 0.5\ngold = 0.2\n");
    let (line, key, message) = refusal(&unknown);
    assert_eq!((line, key.as_str()), (13, "proxy.adaptive.shares.gold"), "{message}");
    assert!(message.contains("no plan named `gold`"), "{message}");
    let over = format!("{PROXY}{plans}[proxy.adaptive]\n[proxy.adaptive.shares]\npro = 0.8\nfree = 0.3\n");
    let (line, key, message) = refusal(&over);
    assert_eq!((line, key.as_str()), (11, "proxy.adaptive.shares"), "{message}");
    assert!(message.contains("sum to 1.1"), "{message}");
    let negative = format!("{PROXY}{plans}[proxy.adaptive]\n[proxy.adaptive.shares]\npro = -0.1\n");
    let (line, key, message) = refusal(&negative);
    assert_eq!((line, key.as_str()), (12, "proxy.adaptive.shares.pro"), "{message}");
    for (written, expected) in [
        ("min_limit = 0", "min_limit must be at least 1"),
        ("min_limit = 10\ninitial_limit = 5", "min_limit = 10 ≤ initial_limit = 5"),
        ("max_limit = 32", "initial_limit = 64 ≤ max_limit = 32"),
        ("tolerance = 0.5", "tolerance = 0.5"),
        ("losses = [\"6xx\"]", "losses: \"6xx\" is not a status"),
        ("algorithm = \"vegas\"", "unknown variant `vegas`"),
        ("limit = 3", "unknown field `limit`"),
        ("[proxy.adaptive.kernel]\ntighten_new_sources = 0", "tighten_new_sources = 0 must be more than 0"),
        ("[proxy.adaptive.kernel]\ntighten_new_sources = 1.5", "tighten_new_sources = 1.5 must be more than 0"),
        ("[proxy.adaptive.kernel]\ntighten = 0.5", "unknown field `tighten`"),
    ] {
        let (line, key, message) = refusal(&format!("{PROXY}[proxy.adaptive]\n{written}\n"));
        assert!(line >= 4 && key.starts_with("proxy.adaptive"), "{written}: {line} {key}: {message}");
        assert!(message.contains(expected), "{written}: {message}");
    }
}

#[test]
fn costs_parse_on_rules_and_plans_and_name_their_mistakes() {
    use limiter_core::{Cost, CostFrom, CostSource};
    let nz = |n| NonZeroU32::new(n).expect("nonzero");
    let rule = |body: &str| {
        format!("{PROXY}[[proxy.rules]]\nname = \"search\"\nkey = \"ip\"\nlimit = 20\nwindow = \"1m\"\n{body}")
    };
    let search = parse(&rule("cost = 5\n")).expect("a cost").proxy.expect("proxy");
    assert_eq!(search.rules[0].limit().map(|spec| spec.cost.upfront()), Some(5));
    let metered = parse(&rule("cost_from = { response_header = \"X-Request-Cost\", max = 1000 }\n")).expect("metered");
    let header = http::HeaderName::from_static("x-request-cost");
    let expected = CostFrom { source: CostSource::ResponseHeader { name: header, strip: true }, max: nz(1000) };
    assert_eq!(metered.proxy.expect("proxy").rules[0].limit().map(|spec| &spec.cost), Some(&Cost::From(expected)));
    let plan = format!(
        "{PROXY}[proxy.plans.compute]\nlimit = 60_000\nwindow = \"1m\"\ncost_from = {{ upstream_ms = true, max = 30_000 }}\n"
    );
    let plans = parse(&plan).expect("an upstream_ms plan").proxy.expect("proxy").plans;
    let expected = CostFrom { source: CostSource::UpstreamMs, max: nz(30_000) };
    assert_eq!(plans["compute"].limits[0].spec.cost, Cost::From(expected));
    let quotas = format!(
        "{PROXY}[proxy.plans.pro]\nlimits = [\n  {{ name = \"minute\", limit = 100, window = \"1m\", cost = 5 }},\n  \
         {{ name = \"day\", limit = 10_000, window = \"day\", cost_from = {{ upstream_ms = true, max = 100 }} }},\n]\n"
    );
    let plans = parse(&quotas).expect("costs in a plan's limits").proxy.expect("proxy").plans;
    let costs: Vec<(u32, bool)> = plans["pro"]
        .limits
        .iter()
        .map(|quota| (quota.spec.cost.upfront(), quota.spec.cost.post_paid().is_some()))
        .collect();
    assert_eq!(costs, [(5, false), (0, true)], "each quota its own cost");

    for (body, says) in [
        ("cost = 21\n", "cost = 21 is more than the 20 units"),
        ("cost = 0\n", "nonzero"),
        ("cost = 2\ncost_from = { upstream_ms = true, max = 10 }\n", "cost and cost_from go apart"),
        ("algorithm = \"sliding_window_log\"\ncost = 2\n", "a cost other than 1 needs another algorithm"),
        (
            "algorithm = \"leaky_bucket\"\nqueue = 3\ncost_from = { upstream_ms = true, max = 10 }\n",
            "cost_from needs a bucket that can go into debt",
        ),
        ("cost_from = { upstream_ms = true }\n", "cost_from needs max"),
        ("cost_from = { max = 10 }\n", "cost_from needs response_header"),
        ("cost_from = { upstream_ms = true, response_header = \"x-cost\", max = 10 }\n", "not both"),
        ("cost_from = { upstream_ms = true, max = 10, strip = false }\n", "strip goes with response_header"),
        ("cost_from = { response_header = \"no spaces\", max = 10 }\n", "`no spaces` is not a header name"),
        ("cost_from = { header = \"x-cost\", max = 10 }\n", "unknown field `header`"),
        (
            "cost_from = { upstream_ms = true, max = 10 }\ncount_when = { status = [\"5xx\"] }\n",
            "count_when and cost_from",
        ),
    ] {
        let (line, key, message) = refusal(&rule(body));
        assert!(line >= 4 && key.starts_with("proxy.rules[0]"), "{body}: {line} {key}: {message}");
        assert!(message.contains(says), "{body}: {message}");
    }
    let (line, key, message) = refusal(&format!("{PROXY}[proxy.plans.free]\nlimit = 4\nwindow = \"1m\"\ncost = 5\n"));
    assert_eq!((line, key.as_str()), (4, "proxy.plans.free"), "{message}");
    assert!(message.contains("cost = 5 is more than the 4 units"), "{message}");
}

#[test]
fn a_refusal_takes_a_detail_and_an_absolute_http_link() {
    let text = format!(
        "{PROXY}[proxy.plans.free]\nlimit = 10\nwindow = \"1m\"\n\
         refusal = {{ detail = \"Buy more.\", link = \"https://example.com/upgrade?plan=pro\" }}\n"
    );
    let proxy = parse(&text).expect("a refusal").proxy.expect("proxy");
    let advice = proxy.plans["free"].refusal.as_ref().expect("the plan's refusal");
    assert_eq!(
        (advice.detail.as_deref(), advice.link.as_deref()),
        (Some("Buy more."), Some("https://example.com/upgrade?plan=pro"))
    );
    for (bad, why) in [
        ("ftp://example.com/", "absolute http"),
        ("/upgrade", "absolute http"),
        ("https://example.com/a b", "visible ASCII"),
        ("https://example.com/\\r\\nSet-Cookie: x=1", "visible ASCII"),
        ("https://example.com/<x>", "visible ASCII"),
    ] {
        let text = format!(
            "{PROXY}[[proxy.rules]]\nname = \"r\"\nkey = \"ip\"\nlimit = 1\nwindow = \"1m\"\n\
             refusal = {{ link = \"{bad}\" }}\n"
        );
        let (line, key, message) = refusal(&text);
        assert_eq!(key, "proxy.rules[0].refusal", "{bad}");
        assert_eq!(line, text.lines().position(|l| l.starts_with("refusal")).expect("its line") + 1, "{bad}");
        assert!(message.contains(why), "{bad}: {message}");
    }
    let empty = format!("{PROXY}[proxy.plans.free]\nlimit = 10\nwindow = \"1m\"\nrefusal = {{}}\n");
    assert!(refusal(&empty).2.contains("needs a detail or a link"));
    let deny = format!("{PROXY}[[proxy.rules]]\nname = \"d\"\naction = \"deny\"\nrefusal = {{ detail = \"no\" }}\n");
    assert!(refusal(&deny).2.contains("refusal needs a limit rule"));
}

#[test]
fn retry_after_jitter_is_a_share_below_one() {
    let proxy = parse(&format!("{PROXY}retry_after_jitter = 0.1\n")).expect("jitter").proxy.expect("proxy");
    assert!((proxy.retry_after_jitter - 0.1).abs() < f64::EPSILON);
    assert_eq!(parse(PROXY).expect("default").proxy.expect("proxy").retry_after_jitter, 0.0);
    for bad in ["1.0", "-0.1", "2"] {
        let (_, key, message) = refusal(&format!("{PROXY}retry_after_jitter = {bad}\n"));
        assert_eq!(key, "proxy.retry_after_jitter", "{bad}");
        assert!(message.contains("less than 1"), "{bad}: {message}");
    }
}

#[test]
fn a_security_log_takes_a_path_or_a_syslog_socket() {
    use crate::agent::SecurityLogFormat;
    let text = "[agent.security_log]\npath = \"/var/log/limiter/security.cef\"\nformat = \"cef\"\nsyslog = \"unix:///dev/log\"\n";
    let log = parse(text).expect("both").agent.security_log.expect("the section");
    assert_eq!(log.format, SecurityLogFormat::Cef);
    assert_eq!(log.syslog.as_deref(), Some(Path::new("/dev/log")));
    let syslog_only = parse("[agent.security_log]\nsyslog = \"unix:///dev/log\"\n").expect("syslog alone");
    assert_eq!(syslog_only.agent.security_log.expect("the section").format, SecurityLogFormat::Json);
    for (bad, why) in [
        ("format = \"json\"\n", "needs a path, a syslog socket"),
        ("syslog = \"udp://10.0.0.1:514\"\n", "unix:///absolute/path"),
        ("path = \"security.log\"\n", "must be absolute"),
    ] {
        let (line, key, message) = refusal(&format!("[agent.security_log]\n{bad}"));
        assert_eq!((line, key.as_str()), (1, "agent.security_log"), "{bad}");
        assert!(message.contains(why), "{bad}: {message}");
    }
    assert!(refusal("[agent.security_log]\npath = \"/x\"\nformat = \"xml\"\n").2.contains("unknown variant"));
}

#[test]
fn a_plan_lists_named_quotas_with_calendar_windows_in_its_zone() {
    let text = format!(
        r#"{PROXY}
[proxy.plans.pro]
limits = [
  {{ name = "burst", limit = 20, window = "1s", algorithm = "token_bucket", burst = 40 }},
  {{ name = "monthly", limit = 1_000_000, window = "month" }},
]
calendar_tz = "Europe/Berlin"
"#
    );
    let proxy = parse(&text).expect("a plan of two quotas").proxy.expect("proxy");
    let pro = &proxy.plans["pro"];
    let named: Vec<(String, Algorithm)> = pro.named_limits("pro").map(|(name, spec)| (name, spec.algorithm)).collect();
    assert_eq!(
        named,
        [("pro.burst".to_owned(), Algorithm::TokenBucket), ("pro.monthly".to_owned(), Algorithm::FixedWindow)]
    );
    let calendar = pro.limits[1].spec.calendar.as_ref().expect("a calendar window");
    assert_eq!(calendar.to_string(), "month in Europe/Berlin");
    assert_eq!(pro.limits[1].spec.window, Duration::from_secs(30 * 86_400));
    assert!(pro.limits[0].spec.calendar.is_none());
}

#[test]
fn quota_and_calendar_mistakes_are_refused_at_their_line() {
    let plan = |body: &str| format!("{PROXY}\n[proxy.plans.pro]\n{body}\n");
    for (text, needle) in [
        (
            plan("limit = 5\nwindow = \"month\"\nalgorithm = \"sliding_window_counter\""),
            "only algorithm = \"fixed_window\"",
        ),
        (
            plan("limits = [{ name = \"a\", limit = 5, window = \"week\", algorithm = \"token_bucket\" }]"),
            "limits[0] (`a`)",
        ),
        (
            plan(
                "limits = [{ name = \"a\", limit = 5, window = \"1s\" }, { name = \"a\", limit = 9, window = \"1m\" }]",
            ),
            "appears twice",
        ),
        (plan("limit = 5\nwindow = \"1s\"\nlimits = [{ name = \"a\", limit = 5, window = \"1s\" }]"), "not both"),
        (plan("limits = []"), "at least one"),
        (plan("limit = 5\nwindow = \"day\"\ncalendar_tz = \"Mars/Olympus\""), "`Mars/Olympus` is not a time zone"),
        (plan("limit = 5\nwindow = \"1m\"\ncalendar_tz = \"UTC\""), "calendar_tz goes with"),
    ] {
        let (line, key, message) = refusal(&text);
        assert!(key.starts_with("proxy.plans.pro"), "{key}: {message}");
        assert_eq!(line, 5, "{message}");
        assert!(message.contains(needle), "{message} lacks {needle}");
    }
    let (line, key, message) = refusal(&plan("limit = 5\nwindow = \"fortnight\""));
    assert_eq!((line, key.as_str()), (7, "proxy.plans.pro.window"), "{message}");
    assert!(message.contains("\"day\", \"week\" or \"month\""), "{message}");
    let rule = |body: &str| {
        format!(
            "{PROXY}\n[proxy.plans.free]\nlimit = 1\nwindow = \"1s\"\n[[proxy.rules]]\nname = \"r\"\nkey = \"ip\"\nlimit = 5\nwindow = \"day\"\n{body}\n"
        )
    };
    let (_, key, message) = refusal(&rule("plans = [\"gold\"]"));
    assert_eq!(key, "proxy.rules[0].plans", "{message}");
    assert!(message.contains("`gold`"), "{message}");
    let (_, _, message) = refusal(&rule("plans = []"));
    assert!(message.contains("at least one plan"), "{message}");
    let (_, _, message) = refusal(&rule("algorithm = \"sliding_window_log\""));
    assert!(message.contains("rule `r`") && message.contains("fixed_window"), "{message}");
    let proxy =
        parse(&rule("plans = [\"free\"]\ncalendar_tz = \"America/New_York\"")).expect("valid").proxy.expect("proxy");
    assert_eq!(proxy.rules[0].plans, ["free"]);
    assert!(proxy.rules[0].counts_plan(Some("free")) && !proxy.rules[0].counts_plan(Some("pro")));
    assert!(!proxy.rules[0].counts_plan(None), "a keyless request is on no plan");
}

/// The README's worked example of three tiers is a config `limiter check` takes.
#[test]
fn the_readmes_three_tiers_parse() {
    let readme = include_str!("../../README.md");
    let example = readme.split("an API product with three tiers and monthly quotas").nth(1).expect("the example");
    let toml = example.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).expect("its config");
    let proxy = parse(&format!("{PROXY}{toml}")).expect("the README's example").proxy.expect("proxy");
    let quotas: Vec<usize> = ["free", "pro", "enterprise"].map(|plan| proxy.plans[plan].limits.len()).into();
    assert_eq!(quotas, [2, 3, 2]);
}

/// The README's worked edge host serving 443 only is a config `limiter check` takes
/// without a warning of its service policy.
#[test]
fn the_readmes_edge_host_serving_443_parses() {
    let readme = include_str!("../../README.md");
    let example = readme.split("A worked config for an edge host serving 443 only").nth(1).expect("the example");
    let toml = example.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).expect("its config");
    let config = parse(toml).expect("the README's example");
    let xdp = config.xdp.as_ref().expect("xdp");
    let services = xdp.services.as_ref().expect("services");
    let ports = |ports: &[Port]| ports.iter().map(|port| port.0.get()).collect::<Vec<_>>();
    assert_eq!((ports(&services.tcp), ports(&services.udp)), (vec![443], vec![443]));
    assert_eq!(services.udp_replies_from.len(), 2);
    assert_eq!(xdp.services_warning(config.proxy.as_ref()), None);
}

/// A TLS section for the fingerprint tests (the files are read by the agent, not here).
const TLS: &str = "[proxy.tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\nfingerprint = \"ja4\"\n";

#[test]
fn ja4_keys_and_conditions_parse_and_match() {
    let text = format!(
        "{PROXY}{TLS}[[proxy.rules]]\nname = \"per-stack\"\nkey = [\"ja4\", \"ip\"]\nlimit = 10\nwindow = \"1m\"\n\
         [[proxy.rules]]\nname = \"curl\"\naction = \"deny\"\nwhen.ja4 = [\"t13d3112h2_e8f1e7e78f70_6bebaf5329ac\"]\n\
         [[proxy.rules]]\nname = \"old\"\naction = \"tag\"\nwhen.ja4_matches = '^t1[01]'\n"
    );
    let proxy = parse(&text).expect("valid").proxy.expect("proxy");
    assert_eq!(proxy.tls.as_ref().and_then(|tls| tls.fingerprint), Some(crate::proxy::Fingerprint::Ja4));
    assert_eq!(proxy.rules[0].key.to_string(), "[ja4, ip]");
    assert!(proxy.rules[0].key.needs_fingerprint() && proxy.fingerprints());
    let headers = http::HeaderMap::new();
    let applies = |rule: usize, ja4: Option<&str>| {
        let seen = super::conditions::Seen {
            method: &http::Method::GET,
            path: "/",
            query: None,
            client: std::net::IpAddr::from([192, 0, 2, 1]),
            headers: &headers,
            body_length: Some(0),
            ja4: ja4.map(|text| text.parse().expect("a fingerprint")),
        };
        proxy.rules[rule].applies(&seen)
    };
    assert!(applies(1, Some("t13d3112h2_e8f1e7e78f70_6bebaf5329ac")));
    assert!(!applies(1, Some("t13d1516h2_8daaf6152771_e5627efa2ab1")));
    assert!(applies(2, Some("t10d1516h2_8daaf6152771_e5627efa2ab1")));
    assert!(!applies(2, Some("t13d1516h2_8daaf6152771_e5627efa2ab1")));
    // A request without a fingerprint meets neither condition.
    assert!(!applies(1, None) && !applies(2, None));
}

#[test]
fn ja4_mistakes_are_named() {
    let rule = "[[proxy.rules]]\nname = \"r\"\naction = \"deny\"\n";
    let (_, key, message) = refusal(&format!("{PROXY}{TLS}{rule}when.ja4 = [\"chrome\"]\n"));
    assert_eq!(key, "proxy.rules[0]", "{message}");
    assert!(message.contains("`chrome` is not a JA4 fingerprint"), "{message}");
    // Nothing gives requests a fingerprint: the rule could never apply.
    let (_, key, message) = refusal(&format!("{PROXY}{rule}when.ja4_matches = \"^t13\"\n"));
    assert_eq!(key, "proxy.rules[0]", "{message}");
    assert!(message.contains("neither [proxy.tls] fingerprint nor ja4_header"), "{message}");
    let limited = "[[proxy.rules]]\nname = \"r\"\nkey = \"ja4\"\nlimit = 1\nwindow = \"1s\"\n";
    assert!(refusal(&format!("{PROXY}{limited}")).2.contains("ja4_header"));
    assert!(parse(&format!("{PROXY}ja4_header = \"x-ja4\"\n{limited}")).is_ok());
    let (_, key, _) = refusal(&format!("{PROXY}ja4_header = \"not a header\"\n"));
    assert_eq!(key, "proxy.ja4_header");
    let (_, key, _) = refusal(&format!("{PROXY}{}", TLS.replace("\"ja4\"", "\"ja3\"")));
    assert_eq!(key, "proxy.tls.fingerprint");
}

#[test]
fn fingerprint_escalation_has_defaults_and_bounds() {
    let config =
        parse(&format!("{XDP}{PROXY}[escalation]\n[escalation.fingerprint]\nthreshold = 20\n")).expect("valid");
    let fingerprint = config.escalation.and_then(|e| e.fingerprint).expect("the section");
    assert_eq!(
        (fingerprint.threshold.get(), fingerprint.window, fingerprint.max_sources.get()),
        (20, Duration::from_secs(10), 256)
    );
    let (_, key, message) =
        refusal(&format!("{XDP}{PROXY}[escalation]\n[escalation.fingerprint]\nmax_sources = 100000\n"));
    assert_eq!(key, "escalation.fingerprint", "{message}");
    assert!(message.contains("max_sources is at most 1024"), "{message}");
    let (_, key, _) = refusal(&format!("{XDP}{PROXY}[escalation]\n[escalation.fingerprint]\nwindow = \"0s\"\n"));
    assert_eq!(key, "escalation.fingerprint");
}
