use super::*;

/// ClientHellos from the pcaps of FoxIO's reference implementation
/// (`pcap/tls12.pcap`, `tls-alpn-h2.pcap`, `badcurveball.pcap`), as their records,
/// with the JA4 its test data gives each.
const VECTORS: [(&str, &str); 3] = [
    (include_str!("tls12.hex"), "t13d1715h2_5b57614c22b0_3d5424432f57"),
    (include_str!("tls-alpn-h2.hex"), "t12d4605h2_85626a9a5f7f_aaf95bb78ec9"),
    (include_str!("badcurveball.hex"), "t13d1615h2_46e7e9700bed_45f260be83e2"),
];

fn records(hex_text: &str) -> Vec<u8> {
    hex::decode(hex_text.trim()).unwrap_or_else(|error| panic!("bad test vector: {error}"))
}

fn ja4(records: &[u8]) -> String {
    fingerprint(records).map(|ja4| ja4.to_string()).unwrap_or_default()
}

/// A ClientHello in one record: `version` as the hello's own, `extensions` in order.
fn hello(version: u16, ciphers: &[u16], extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    body.extend_from_slice(&[7; 32]);
    body.extend_from_slice(&[32]);
    body.extend_from_slice(&[9; 32]);
    body.extend_from_slice(&u16::try_from(ciphers.len() * 2).unwrap_or(0).to_be_bytes());
    for cipher in ciphers {
        body.extend_from_slice(&cipher.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]);
    let mut listed = Vec::new();
    for (kind, data) in extensions {
        listed.extend_from_slice(&kind.to_be_bytes());
        listed.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        listed.extend_from_slice(data);
    }
    body.extend_from_slice(&u16::try_from(listed.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(&listed);
    split(&body, usize::MAX)
}

/// The ClientHello with `body` as handshake message, in records of at most `most`
/// bytes of it.
fn split(body: &[u8], most: usize) -> Vec<u8> {
    let length = u32::try_from(body.len()).unwrap_or(0).to_be_bytes();
    let mut message = vec![CLIENT_HELLO, length[1], length[2], length[3]];
    message.extend_from_slice(body);
    let mut records = Vec::new();
    for chunk in message.chunks(most.min(1 << 14)) {
        records.extend_from_slice(&[CONTENT_HANDSHAKE, 3, 1]);
        records.extend_from_slice(&u16::try_from(chunk.len()).unwrap_or(0).to_be_bytes());
        records.extend_from_slice(chunk);
    }
    records
}

fn u16_list(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

fn sni(name: &str) -> (u16, Vec<u8>) {
    let mut entry = vec![0];
    entry.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
    entry.extend_from_slice(name.as_bytes());
    let mut data = u16::try_from(entry.len()).unwrap_or(0).to_be_bytes().to_vec();
    data.extend_from_slice(&entry);
    (EXT_SERVER_NAME, data)
}

fn alpn(protocols: &[&[u8]]) -> (u16, Vec<u8>) {
    let mut list = Vec::new();
    for protocol in protocols {
        list.push(u8::try_from(protocol.len()).unwrap_or(0));
        list.extend_from_slice(protocol);
    }
    let mut data = u16::try_from(list.len()).unwrap_or(0).to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    (EXT_ALPN, data)
}

fn signature_algorithms(values: &[u16]) -> (u16, Vec<u8>) {
    let list = u16_list(values);
    let mut data = u16::try_from(list.len()).unwrap_or(0).to_be_bytes().to_vec();
    data.extend_from_slice(&list);
    (EXT_SIGNATURE_ALGORITHMS, data)
}

fn supported_versions(values: &[u16]) -> (u16, Vec<u8>) {
    let list = u16_list(values);
    let mut data = vec![u8::try_from(list.len()).unwrap_or(0)];
    data.extend_from_slice(&list);
    (EXT_SUPPORTED_VERSIONS, data)
}

/// The spec's example: its ciphers, extensions and signature algorithms in the order
/// it gives them.
const SPEC_CIPHERS: [u16; 15] = [
    0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f,
    0x0035,
];
const SPEC_SIGNATURES: [u16; 8] = [0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601];

fn spec_extensions() -> Vec<(u16, Vec<u8>)> {
    [
        0x001b, 0x0000, 0x0033, 0x0010, 0x4469, 0x0017, 0x002d, 0x000d, 0x0005, 0x0023, 0x0012, 0x002b, 0xff01, 0x000b,
        0x000a, 0x0015,
    ]
    .into_iter()
    .map(|kind| match kind {
        EXT_SERVER_NAME => sni("example.com"),
        EXT_ALPN => alpn(&[b"h2", b"http/1.1"]),
        EXT_SIGNATURE_ALGORITHMS => signature_algorithms(&SPEC_SIGNATURES),
        EXT_SUPPORTED_VERSIONS => supported_versions(&[0x0304, 0x0303]),
        other => (other, Vec::new()),
    })
    .collect()
}

#[test]
fn the_reference_captures_give_their_fingerprints() {
    for (hex_text, expected) in VECTORS {
        let records = records(hex_text);
        assert_eq!(progress(&records), Progress::Settled);
        assert_eq!(ja4(&records), expected);
    }
}

#[test]
fn the_spec_example_gives_its_fingerprint() {
    assert_eq!(
        hash12(&hex_list(&{
            let mut sorted = SPEC_CIPHERS;
            sorted.sort_unstable();
            sorted
        })),
        *b"8daaf6152771"
    );
    let extensions = "0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01";
    assert_eq!(hash12(&format!("{extensions}_0403,0804,0401,0503,0805,0501,0806,0601")), *b"e5627efa2ab1");
    assert_eq!(hash12(extensions), *b"6d807ffa2a79");
    let records = hello(0x0303, &SPEC_CIPHERS, &spec_extensions());
    assert_eq!(ja4(&records), "t13d1516h2_8daaf6152771_e5627efa2ab1");
}

#[test]
fn grease_is_ignored_everywhere() {
    let plain = ja4(&hello(0x0303, &SPEC_CIPHERS, &spec_extensions()));
    let mut ciphers = vec![0x0a0a];
    ciphers.extend_from_slice(&SPEC_CIPHERS);
    ciphers.push(0xfafa);
    let mut extensions = vec![(0x2a2a, vec![0])];
    for (kind, data) in spec_extensions() {
        extensions.push(match kind {
            EXT_SIGNATURE_ALGORITHMS => signature_algorithms(&[&[0x1a1a][..], &SPEC_SIGNATURES].concat()),
            // GREASE is the highest value offered: the version is still 1.3.
            EXT_SUPPORTED_VERSIONS => supported_versions(&[0xbaba, 0x0304, 0x0303]),
            _ => (kind, data),
        });
    }
    extensions.push((0xdada, Vec::new()));
    assert_eq!(ja4(&hello(0x0303, &ciphers, &extensions)), plain);
    assert!(grease(0x0a0a) && grease(0xfafa) && !grease(0x0a1a) && !grease(0x1301));
}

#[test]
fn sni_marks_a_domain_and_its_absence_an_address() {
    let with = ja4(&hello(0x0303, &[0x1301], &[sni("example.com"), (0x0017, Vec::new())]));
    let without = ja4(&hello(0x0303, &[0x1301], &[(0x0017, Vec::new())]));
    assert_eq!(&with[..10], "t12d010200");
    assert_eq!(&without[..10], "t12i010100");
    // SNI is counted, not hashed: both have the same extension hash.
    assert_eq!(with[24..], without[24..]);
}

#[test]
fn alpn_gives_the_first_and_last_characters_of_its_first_protocol() {
    let chars = |protocols: &[&[u8]]| ja4(&hello(0x0303, &[0x1301], &[alpn(protocols)]))[8..10].to_owned();
    assert_eq!(chars(&[b"h2", b"http/1.1"]), "h2");
    assert_eq!(chars(&[b"http/1.1", b"h2"]), "h1");
    assert_eq!(chars(&[b"x"]), "xx");
    assert_eq!(chars(&[b"", b"h2"]), "00");
    assert_eq!(chars(&[]), "00");
    assert_eq!(ja4(&hello(0x0303, &[0x1301], &[(0x0017, Vec::new())]))[8..10], *"00");
    // The spec's examples of values that are not letters or digits.
    for (protocol, expected) in [
        (&[0xab][..], "ab"),
        (&[0x20], "20"),
        (&[0xab, 0xcd], "ad"),
        (&[0x20, 0x61], "21"),
        (&[0x30, 0xab], "3b"),
        (&[0x61, 0x20], "60"),
        (&[0x30, 0x31, 0xab, 0xcd], "3d"),
        (&[0x30, 0xab, 0xcd, 0x31], "01"),
    ] {
        assert_eq!(chars(&[protocol]), expected, "{protocol:02x?}");
    }
}

#[test]
fn ciphers_and_extensions_hash_sorted_signature_algorithms_as_sent() {
    let base = ja4(&hello(0x0303, &SPEC_CIPHERS, &spec_extensions()));
    let mut ciphers = SPEC_CIPHERS;
    ciphers.reverse();
    let mut extensions = spec_extensions();
    extensions.reverse();
    assert_eq!(ja4(&hello(0x0303, &ciphers, &extensions)), base);
    let mut signatures = SPEC_SIGNATURES;
    signatures.reverse();
    let reordered: Vec<_> = spec_extensions()
        .into_iter()
        .map(
            |(kind, data)| {
                if kind == EXT_SIGNATURE_ALGORITHMS { signature_algorithms(&signatures) } else { (kind, data) }
            },
        )
        .collect();
    let changed = ja4(&hello(0x0303, &SPEC_CIPHERS, &reordered));
    assert_eq!(changed[..24], base[..24]);
    assert_ne!(changed[24..], base[24..]);
}

#[test]
fn versions_counts_and_empty_lists() {
    // No supported_versions: the hello's own version; an unknown one is 00.
    assert!(ja4(&hello(0x0301, &[0x002f], &[(0x0017, Vec::new())])).starts_with("t10i0101"));
    assert!(ja4(&hello(0x0305, &[0x002f], &[(0x0017, Vec::new())])).starts_with("t00i"));
    // Neither ciphers nor extensions: both hashes are zeros.
    assert_eq!(ja4(&hello(0x0303, &[], &[])), "t12i000000_000000000000_000000000000");
    // Only SNI and ALPN: counted, but nothing left to hash.
    let only = ja4(&hello(0x0303, &[0x1301], &[sni("a"), alpn(&[b"h2"])]));
    assert_eq!((&only[..11], &only[24..]), ("t12d0102h2_", "000000000000"));
    let many: Vec<u16> = (1..=120).collect();
    assert!(ja4(&hello(0x0303, &many, &[])).starts_with("t12i9900"));
}

#[test]
fn a_hello_spread_over_records_is_joined() {
    let (hex_text, expected) = VECTORS[0];
    let one = records(hex_text);
    let body = &one[RECORD_HEADER + HANDSHAKE_HEADER..];
    for most in [1, 7, 100, 300] {
        let spread = split(body, most);
        assert_eq!(progress(&spread), Progress::Settled, "records of {most}");
        assert_eq!(ja4(&spread), expected, "records of {most}");
    }
}

#[test]
fn every_truncation_asks_for_more_and_has_no_fingerprint() {
    for (hex_text, _) in VECTORS {
        let whole = records(hex_text);
        for end in 0..whole.len() {
            let start = &whole[..end];
            match progress(start) {
                Progress::More(n) => assert!(n >= 1 && end + n <= whole.len(), "{end}: {n}"),
                Progress::Settled => panic!("settled at {end} of {}", whole.len()),
            }
            assert_eq!(fingerprint(start), None, "{end}");
        }
    }
    // Bytes after the hello (a client's next record) change nothing.
    let (hex_text, expected) = VECTORS[1];
    let mut more = records(hex_text);
    more.extend_from_slice(&[20, 3, 3, 0, 1, 1]);
    assert_eq!(ja4(&more), expected);
}

#[test]
fn what_is_not_a_client_hello_is_settled_without_one() {
    for start in [
        &b"GET / HTTP/1.1\r\n"[..],
        // An alert, a ServerHello, SSL 2, an empty record.
        &[21, 3, 3, 0, 2, 2, 40],
        &[22, 3, 3, 0, 4, 2, 0, 0, 0],
        &[0x80, 0x2e, 1, 0, 2],
        &[22, 3, 1, 0, 0],
    ] {
        assert_eq!(progress(start), Progress::Settled, "{start:?}");
        assert_eq!(fingerprint(start), None, "{start:?}");
    }
    // A message announced bigger than a capture holds is settled at once.
    assert_eq!(progress(&[22, 3, 1, 0x40, 0, 1, 0x00, 0x40, 0x00]), Progress::Settled);
    assert_eq!(progress(&[22, 3, 1, 0x40, 0x01]), Progress::Settled);
    // A hello whose lengths disagree with its record is refused, not read past.
    let mut lying = records(VECTORS[1].0);
    lying[RECORD_HEADER + HANDSHAKE_HEADER + 2 + 32] = 200;
    assert_eq!(fingerprint(&lying), None);
}

#[test]
fn the_text_form_is_checked() {
    let text = "t13d1516h2_8daaf6152771_e5627efa2ab1";
    let parsed: Ja4 = text.parse().unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(parsed.to_string(), text);
    assert_eq!(format!("{parsed:?}"), format!("Ja4({text})"));
    for bad in [
        "",
        "t13d1516h2_8daaf6152771_e5627efa2ab",
        "x13d1516h2_8daaf6152771_e5627efa2ab1",
        "t14d1516h2_8daaf6152771_e5627efa2ab1",
        "t13x1516h2_8daaf6152771_e5627efa2ab1",
        "t13d15a6h2_8daaf6152771_e5627efa2ab1",
        "t13d1516h2-8daaf6152771_e5627efa2ab1",
        "t13d1516h2_8DAAF6152771_e5627efa2ab1",
        "t13d1516h/_8daaf6152771_e5627efa2ab1",
        "t13d1516h2_8daaf6152771_e5627efa2ab1 ",
    ] {
        assert!(bad.parse::<Ja4>().is_err(), "{bad:?}");
    }
    for (hex_text, expected) in VECTORS {
        assert_eq!(fingerprint(&records(hex_text)).map(|ja4| ja4.as_str().parse::<Ja4>()), Some(expected.parse()));
    }
}
