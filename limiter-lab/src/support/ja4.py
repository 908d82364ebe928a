#!/usr/bin/env python3
"""JA4 (TLS client) fingerprints of the ClientHellos in a classic pcap file.

Written from FoxIO's JA4 specification (technical_details/JA4.md, BSD-3), apart
from limiter's own parser, so that the tests compare two implementations of the
spec rather than one with itself. Standard library only.

    ja4.py FILE.pcap [PORT]   one line per TCP stream to PORT: its JA4
    ja4.py --hex FILE.pcap    the ClientHello records, in hex, then their JA4
"""

import hashlib
import struct
import sys

GREASE = {0x0A0A + 0x1010 * i for i in range(16)}
VERSIONS = {
    0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3",
    0x0002: "s2", 0xFEFF: "d1", 0xFEFD: "d2", 0xFEFC: "d3",
}


def packets(path):
    """(link type, frame bytes) of each record of a classic pcap file."""
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise SystemExit(f"{path}: not a classic pcap file")
    link = struct.unpack(end + "I", data[20:24])[0]
    at = 24
    while at + 16 <= len(data):
        caplen = struct.unpack(end + "I", data[at + 8:at + 12])[0]
        yield link, data[at + 16:at + 16 + caplen]
        at += 16 + caplen


def tcp_segments(path):
    """((src, sport, dst, dport), seq, payload) of each TCP segment."""
    for link, frame in packets(path):
        if link == 0:  # BSD loopback: the address family, in the writer's order
            family = max(frame[0], frame[3])
            ethertype, at = (0x0800 if family == 2 else 0x86DD), 4
        elif link == 1:  # Ethernet
            ethertype, at = struct.unpack(">H", frame[12:14])[0], 14
            while ethertype in (0x8100, 0x88A8):
                ethertype, at = struct.unpack(">H", frame[at + 2:at + 4])[0], at + 4
        elif link == 113:  # Linux cooked capture
            ethertype, at = struct.unpack(">H", frame[14:16])[0], 16
        elif link == 276:  # Linux cooked capture v2
            ethertype, at = struct.unpack(">H", frame[0:2])[0], 20
        else:
            continue
        if ethertype == 0x0800:
            header = (frame[at] & 0x0F) * 4
            proto, total = frame[at + 9], struct.unpack(">H", frame[at + 2:at + 4])[0]
            src, dst = frame[at + 12:at + 16], frame[at + 16:at + 20]
            l4, end = at + header, at + total
        elif ethertype == 0x86DD:
            proto, length = frame[at + 6], struct.unpack(">H", frame[at + 4:at + 6])[0]
            src, dst = frame[at + 8:at + 24], frame[at + 24:at + 40]
            l4, end = at + 40, at + 40 + length
        else:
            continue
        if proto != 6:
            continue
        sport, dport, seq = struct.unpack(">HHI", frame[l4:l4 + 8])
        offset = (frame[l4 + 12] >> 4) * 4
        yield (src, sport, dst, dport), seq, frame[l4 + offset:end]


def streams(path):
    """Each TCP stream's bytes in order, by its first segment's place in the file."""
    segments = {}
    for flow, seq, payload in tcp_segments(path):
        if payload:
            segments.setdefault(flow, {}).setdefault(seq, payload)
    for flow, by_seq in segments.items():
        data, expected = b"", None
        for seq in sorted(by_seq):
            payload = by_seq[seq]
            if expected is not None and seq < expected:
                payload = payload[expected - seq:]
            data += payload
            expected = seq + len(by_seq[seq]) if expected is None else max(expected, seq + len(by_seq[seq]))
        yield flow, data


def client_hello(stream):
    """The records holding the stream's first handshake message, if a ClientHello,
    and the message's body."""
    message, at = b"", 0
    while at + 5 <= len(stream) and stream[at] == 22:
        length = struct.unpack(">H", stream[at + 3:at + 5])[0]
        message += stream[at + 5:at + 5 + length]
        at += 5 + length
        if len(message) >= 4:
            need = 4 + int.from_bytes(message[1:4], "big")
            if len(message) >= need:
                return (stream[:at], message[4:need]) if message[0] == 1 else None
    return None


def u16s(data):
    return [struct.unpack(">H", data[i:i + 2])[0] for i in range(0, len(data) - 1, 2)]


def hash12(text):
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def ja4(body, quic=False):
    legacy_version = struct.unpack(">H", body[0:2])[0]
    at = 2 + 32
    at += 1 + body[at]  # session id
    cipher_bytes = struct.unpack(">H", body[at:at + 2])[0]
    ciphers = [c for c in u16s(body[at + 2:at + 2 + cipher_bytes]) if c not in GREASE]
    at += 2 + cipher_bytes
    at += 1 + body[at]  # compression methods
    extensions, alpn, sigalgs, supported = [], None, [], []
    if at + 2 <= len(body):
        end = at + 2 + struct.unpack(">H", body[at:at + 2])[0]
        at += 2
        while at + 4 <= end:
            kind, length = struct.unpack(">HH", body[at:at + 4])
            data = body[at + 4:at + 4 + length]
            at += 4 + length
            if kind in GREASE:
                continue
            extensions.append(kind)
            if kind == 0x0010 and len(data) >= 3:
                alpn = data[3:3 + data[2]]
            elif kind == 0x000D and len(data) >= 2:
                sigalgs = [s for s in u16s(data[2:2 + struct.unpack(">H", data[0:2])[0]]) if s not in GREASE]
            elif kind == 0x002B and len(data) >= 1:
                supported = [v for v in u16s(data[1:1 + data[0]]) if v not in GREASE]
    version = VERSIONS.get(max(supported) if supported else legacy_version, "00")
    sni = "d" if 0x0000 in extensions else "i"
    if not alpn:
        alpn_chars = "00"
    elif chr(alpn[0]).isalnum() and chr(alpn[-1]).isalnum() and alpn[0] < 128 and alpn[-1] < 128:
        alpn_chars = chr(alpn[0]) + chr(alpn[-1])
    else:
        hexed = alpn.hex()
        alpn_chars = hexed[0] + hexed[-1]
    a = f"{'q' if quic else 't'}{version}{sni}{min(len(ciphers), 99):02d}{min(len(extensions), 99):02d}{alpn_chars}"
    b = hash12(",".join(f"{c:04x}" for c in sorted(ciphers))) if ciphers else "000000000000"
    kept = sorted(e for e in extensions if e not in (0x0000, 0x0010))
    c_text = ",".join(f"{e:04x}" for e in kept)
    if sigalgs:
        c_text += "_" + ",".join(f"{s:04x}" for s in sigalgs)
    c = hash12(c_text) if kept else "000000000000"
    return f"{a}_{b}_{c}"


def main(args):
    show_hex = args[:1] == ["--hex"]
    args = args[1:] if show_hex else args
    port = int(args[1]) if len(args) > 1 else None
    for (_, _, _, dport), stream in streams(args[0]):
        if port is not None and dport != port:
            continue
        found = client_hello(stream)
        if found is None:
            continue
        records, body = found
        if show_hex:
            print(records.hex(), end=" ")
        print(ja4(body))


if __name__ == "__main__":
    main(sys.argv[1:])
