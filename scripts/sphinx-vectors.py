#!/usr/bin/env python3
"""Independent implementation of blindrelay's v2 onion format (docs/blindrelay-protocol.md,
"v2 format"), written from the document with Python's `cryptography` package: builds the
vector route's packet, peels it hop by hop, and prints the values of the "v2 test vectors"
section. crates/blindrelay/src/proto/sphinx/vectors.rs checks the same values from the Rust code.

Usage: scripts/sphinx-vectors.py   (needs python3-cryptography)
"""
import hashlib
import hmac

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives import serialization

MAX_HOPS, SLOT, MAC = 8, 64, 16
BETA = MAX_HOPS * SLOT
STREAM = BETA + SLOT
HEADER = 2 + 32 + BETA + MAC
SALT = b"blindrelay/sphinx/v2"
CAPACITY = [2048, 16384, 65536, 196608]


def x25519(scalar, point):
    return X25519PrivateKey.from_private_bytes(scalar).exchange(X25519PublicKey.from_public_bytes(point))


def public(scalar):
    return X25519PrivateKey.from_private_bytes(scalar).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def hkdf_expand(prk, info, n):
    out, block, i = b"", b"", 1
    while len(out) < n:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:n]


def keys(shared, alpha):
    prk = hmac.new(SALT, shared, hashlib.sha256).digest()
    return {
        "rho": hkdf_expand(prk, b"rho", 32),
        "mu": hkdf_expand(prk, b"mu", 32),
        "blind": hkdf_expand(prk, b"blind" + alpha, 32),
        "tag": hkdf_expand(prk, b"replay", 16),
        "report": hkdf_expand(prk, b"report", 32),
    }


def stream(key, n, nonce=bytes(12)):
    # ChaCha20 (RFC 8439), counter 0: `cryptography` takes counter ‖ nonce, 16 bytes.
    return Cipher(algorithms.ChaCha20(key, bytes(4) + nonce), mode=None).encryptor().update(bytes(n))


def seal_report(key, kind, status=0, reason=b""):
    # kind(1) ‖ status u16 ‖ reason_len(1) ‖ reason ‖ zero bytes, 32 bytes; sealed with nonce 0.
    body = (bytes([kind]) + status.to_bytes(2, "big") + bytes([len(reason)]) + reason).ljust(32, b"\x00")
    return ChaCha20Poly1305(key).encrypt(bytes(12), body, b"")


def mask_report(key, report):
    return xor(report, stream(key, len(report), bytes(11) + b"\x01"))


def xor(a, b):
    return bytes(x ^ y for x, y in zip(a, b))


def build(route, payload, receipt_key, message_id, expires_at, cls, ephemeral):
    n = len(route)
    alpha = public(ephemeral)
    alphas, ks, blinds = [], [], []
    for _, onion_key in route:
        shared = x25519(ephemeral, onion_key)
        for b in blinds:
            shared = x25519(b, shared)
        k = keys(shared, alpha)
        alphas.append(alpha)
        ks.append(k)
        blinds.append(k["blind"])
        alpha = x25519(k["blind"], alpha)
    filler = b""
    for k in ks[:-1]:
        filler = xor(filler + bytes(SLOT), stream(k["rho"], STREAM)[STREAM - len(filler) - SLOT:])
    slot = (b"\x02" + expires_at.to_bytes(8, "big") + b"\x00" + len(payload).to_bytes(4, "big")
            + receipt_key + message_id).ljust(SLOT, b"\x00")
    pad_key = hkdf_expand(hmac.new(SALT, ephemeral, hashlib.sha256).digest(), b"padding", 32)
    head = slot + stream(pad_key, BETA - SLOT - len(filler))
    beta = xor(head, stream(ks[-1]["rho"], len(head))) + filler
    body = payload.ljust(CAPACITY[cls], b"\x00")
    for i in reversed(range(n)):
        aad = bytes([2, cls]) + alphas[i] + beta
        sealed = ChaCha20Poly1305(ks[i]["mu"]).encrypt(bytes(12), body, aad)
        body, tag = sealed[:-MAC], sealed[-MAC:]
        if i == 0:
            return aad + tag + body, [k["report"] for k in ks]
        fwd = (b"\x01" + expires_at.to_bytes(8, "big") + route[i][0] + tag).ljust(SLOT, b"\x00")
        beta = xor(fwd + beta[:BETA - SLOT], stream(ks[i - 1]["rho"], BETA))


def peel(secret, packet):
    alpha = packet[2:34]
    k = keys(x25519(secret, alpha), alpha)
    aad, gamma, body = packet[:HEADER - MAC], packet[HEADER - MAC:HEADER], packet[HEADER:]
    body = ChaCha20Poly1305(k["mu"]).decrypt(bytes(12), body + gamma, aad)
    routing = xor(packet[34:34 + BETA] + bytes(SLOT), stream(k["rho"], STREAM))
    slot = routing[:SLOT]
    if slot[0] == 1:
        nxt = packet[:2] + x25519(k["blind"], alpha) + routing[SLOT:] + slot[41:57] + body
        return k["tag"], nxt
    return k["tag"], body[:int.from_bytes(slot[10:14], "big")]


def main():
    secrets = [bytes([b]) * 32 for b in (0x31, 0x32, 0x33)]
    route = [(bytes([i]) * 32, public(s)) for i, s in zip((0xA1, 0xA2, 0xA3), secrets)]
    for i, (_, k) in enumerate(route):
        print(f"onion key {i}: {k.hex()}")
    packet, report_keys = build(route, b"hello", b"\x55" * 32, b"\x66" * 16, 1764450600, 0,
                                b"\x44" * 32)
    assert len(packet) == HEADER + CAPACITY[0]
    print(f"header 0: {packet[:HEADER].hex()}")
    # The first hop's frame is the packet, posted on the link of the Ed25519 key of seed
    # 01 02 … 20 (its previous hop).
    sender = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    previous_hop = sender.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    bound = packet[:34] + packet[HEADER - MAC:HEADER]
    print(f"frame 0 previous hop: {previous_hop.hex()}")
    digest = hashlib.sha256(b"blindrelay/request/v3" + previous_hop + bound).hexdigest()
    print(f"frame 0 request digest: {digest}")
    for i, s in enumerate(secrets):
        print(f"alpha {i}: {packet[2:34].hex()}")
        print(f"gamma {i}: {packet[HEADER - MAC:HEADER].hex()}")
        print(f"packet {i} sha256: {hashlib.sha256(packet).hexdigest()}")
        tag, packet = peel(s, packet)
        print(f"replay tag {i}: {tag.hex()}")
        print(f"report key {i}: {report_keys[i].hex()}")
    assert packet == b"hello"
    # Hop 1 reports its next hop unreachable, then refused inbox_full (507); hop 0 masks each.
    unreachable = mask_report(report_keys[0], seal_report(report_keys[1], 1))
    print(f"report unreachable: {unreachable.hex()}")
    refused = mask_report(report_keys[0], seal_report(report_keys[1], 2, 507, b"inbox_full"))
    print(f"report refused: {refused.hex()}")


if __name__ == "__main__":
    main()
