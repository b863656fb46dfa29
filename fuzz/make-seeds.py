#!/usr/bin/env python3
"""Writes the committed seed corpora (fuzz/seeds/<target>/) from the protocols' real packets and
test vectors: the ET packets of the filter's tests and docs/et-protocol notes, the blindrelay
vectors of docs/blindrelay-protocol.md. Run from anywhere; it rewrites the seeds."""
import json, os, shutil, struct
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives import serialization

HERE = os.path.dirname(os.path.abspath(__file__))
OOB = b"\xff" * 4
RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def write(target, seeds):
    d = os.path.join(HERE, "seeds", target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for i, s in enumerate(seeds):
        with open(os.path.join(d, f"seed-{i:02}"), "wb") as f:
            f.write(s)


# ET: what clients, browsers, masters and attackers send (the marker is added by the target
# too, so some seeds leave it out).
et = [
    OOB + b"getinfo xyz",
    OOB + b"getstatus abc",
    OOB + b"getchallenge 12345 Quake3Arena",
    OOB + b"connect \x12\x34\xf0binary",
    OOB + b"CONNECT \"\\name\\x\"",
    OOB + b"PB_SV_Ping",
    OOB + b"rcon secret status",
    OOB + b"/**/rcon secret",
    OOB + b"\x80rcon secret",
    OOB + b"/*/ rcon */getinfo",
    OOB + b"getinfo http://x",
    b"getinfo \"a b\"",
    b"\x01\x00\x00\x00\x12\x00\x34",
]
write("et_classify", et)
write("et_tokenizer", [p[4:] if p.startswith(OOB) else p for p in et])

info = b"infoResponse\n\\voip\\opus\\challenge\\xyz123\\clients\\0\\hostname\\t"
status = b"statusResponse\n\\challenge\\abc\\sv_hostname\\x\n0 0 \"Sarge\"\n"
write("et_info", [
    bytes([1, 3]) + b"ABC" + info,
    bytes([0, 0]) + info,
    bytes([3, 3]) + b"q%q" + status,
    bytes([3, 0]) + b"statusResponse\n",
    bytes([1, 5]) + b"a b c" + b"infoResponse\n\\\\\\x\\",
])

key = "k" * 40
write("control_api", [
    bytes([1, 0]) + json.dumps({"key": key, "upstream": "127.0.0.1:27960"}).encode(),
    bytes([0, 0]) + json.dumps({"key": key, "upstream": "[::1]:27960", "port": 27961}).encode(),
    bytes([2, 0]) + b"{\"key\":\"short\",\"upstream\":\"x\"}",
    bytes([5, 9]) + b"192.0.2.1" + json.dumps({"reason": "aimbot", "duration_secs": 3600}).encode(),
    bytes([4, 15]) + b"::ffff:10.0.0.1",
    bytes([5, 7]) + b"2001:db8" + b"{\"reason\":\"x\",\"duration_secs\":0,\"extra\":1}",
])

# blindrelay: the v2 frame (a class-0 frame around a packet, a v1 envelope, broken framings)
# and the receipt test vector of docs/blindrelay-protocol.md.
frame0 = bytes([2, 0]) + b"\x07" * 2608 + b"\x11" * 32 + b"\x22" * 64
write("frame", [frame0, frame0[:-1], b"BRE1" + b"\0" * 162, bytes([2, 9]) + b"\0" * 2704, b"\x03"])

receipt = bytes.fromhex(
    "111111111111111111111111111111111338effea3040ac007b8837e3717764e5d82aafcf29f7430d73bf70f"
    "7d68be34a09aa5f47a6759802ff955f8dc2d2a14a5c99d23be97f864127ff9383455a4f000000000692b5ed0"
    "cf40be5c057ca95929f8c9eb288bdd67a2cbb692d334413718a3bcfdadaf6ab2054511f9c460bacea8319224"
    "c8b496082661a5bccc0083a8dd8d839fc0f0c401")
write("receipt", [bytes([0, 7, 1]) + receipt, bytes([1, 3, 0]) + b"hello", bytes([0, 0, 0]) + receipt[:100]])

# Sphinx: packets the target builds itself ([sel][flip at, 2 bytes][flip][payload]), and raw
# bytes.
write("sphinx", [
    bytes([1, 0, 0, 0]) + b"hello",
    bytes([3, 0, 0, 0]) + b"\x66" * 100,
    bytes([5, 0, 0, 0]) + b"two hops",
    bytes([0x29, 2, 0x22, 1]) + b"probe, changed",
    bytes([0, 0, 0, 0]) + b"\x09" * 600,
])

# A descriptor signed like a node signs it (Ed25519 seed 0x22.., onion secret 0x33..).
sk = Ed25519PrivateKey.from_private_bytes(b"\x22" * 32)
node_id = sk.public_key().public_bytes(*RAW)
onion_key = X25519PrivateKey.from_private_bytes(b"\x33" * 32).public_key().public_bytes(*RAW)
endpoint = "http://192.0.2.10:7001"
issued, expires = 1764450000, 1764453600
signed = (b"blindrelay/descriptor/v1" + node_id + onion_key + struct.pack(">H", len(endpoint))
          + endpoint.encode() + struct.pack(">QQ", issued, expires))
desc = {"node_id": node_id.hex(), "onion_key": onion_key.hex(), "endpoint": endpoint,
        "issued_at": issued, "expires_at": expires, "signature": sk.sign(signed).hex()}
write("descriptor", [
    b"\x00" + json.dumps(desc).encode(),
    b"\x00" + json.dumps(dict(desc, endpoint="http://[2001:4860::1]:443/")).encode(),
    b"\x01" + b"http://203.0.113.7:8080",
    b"\x02" + b"http://[::ffff:8.8.8.8]:1",
])

# Replay: [store and share][op route digest step]...
def ops(*xs):
    return bytes(b for x in xs for b in x)
write("replay", [
    bytes([1]) + ops((0, 1, 1, 1), (2, 1, 1, 1), (0, 1, 1, 1), (0, 1, 2, 1), (3, 0, 0, 0)),
    bytes([0x65]) + ops(*[(0, r, 0x70, 0) for r in range(10)], (3, 0, 0, 250)),
    bytes([1]) + ops((0, 2, 2, 0), (7, 0, 0, 5), (0, 2, 2, 0), (2, 2, 2, 0), (3, 0, 0, 210)),
    bytes([0x14]) + ops((0, 3, 0x80, 0), (0, 4, 0x80, 0), (0x31, 5, 0, 0), (3, 0, 0, 199)),
])
