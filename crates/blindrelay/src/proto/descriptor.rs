//! Node descriptors (`GET /v1/descriptor`) and the endpoint address policy.
//!
//! ```json
//! {"node_id": "<64 hex>", "onion_key": "<64 hex>", "endpoint": "https://192.0.2.10:7001",
//!  "issued_at": 1764450000, "expires_at": 1764453600, "protocol": 2, "signature": "<128 hex>"}
//! ```
//!
//! Signed bytes: `blindrelay/descriptor/v1` ‖ node_id(32) ‖ onion_key(32) ‖ u16 len(endpoint) ‖
//! endpoint (UTF-8) ‖ issued_at u64 ‖ expires_at u64 ‖ protocol u8, all big-endian; a
//! descriptor without `protocol` (a v1 node) is signed without its byte and still verifies, but
//! is not routable ([`PROTOCOL`]). Valid when the signature verifies under `node_id` and
//! `issued_at − 120 s ≤ now < expires_at`.
//!
//! An endpoint is `https://IPv4:PORT` or `https://[IPv6]:PORT`, optionally followed by `/`. Whether
//! a private address is acceptable is the caller's policy: [`parse_endpoint`] parses,
//! [`is_public`] classifies, [`endpoint_ip_is_public`] does both.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::{NodeId, Prefix};

/// How long a descriptor is valid after it is issued, in seconds, by default
/// (`--descriptor-lifetime`): three hours, signed again after half of it, so a network of
/// 10 000 nodes carries about two fresh descriptors a second in all (each node's share of
/// them under 1 KiB/s, `crate::discovery`).
pub const DESCRIPTOR_TTL: u64 = 3 * 3600;
/// How far a descriptor's `issued_at` may be ahead of the verifier's clock, in seconds.
pub const DESCRIPTOR_MAX_SKEW: u64 = 120;
/// Longest validity a descriptor may claim (`expires_at − issued_at`): twice what a node signs,
/// so a descriptor is refetched and its node's key rotation seen within hours, not never.
pub const MAX_DESCRIPTOR_LIFETIME: u64 = 2 * DESCRIPTOR_TTL;
/// Longest endpoint, in bytes.
pub const MAX_ENDPOINT_LEN: usize = 255;

const SIGN_DOMAIN: &[u8] = b"blindrelay/descriptor/v1";

/// Signatures checked together by [`Descriptor::verify_many`].
pub const BATCH: usize = 64;

/// The protocol version a node signs into its descriptor: only peers announcing it are
/// routable. `0` is a descriptor without the field (a v1 node).
pub const PROTOCOL: u8 = 2;

fn is_unstated(p: &u8) -> bool {
    *p == 0
}

/// A node's signed, expiring self-description. The JSON form carries byte fields as lowercase hex
/// and rejects unknown fields.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// The node's identity, which signs the descriptor.
    #[serde(with = "hex_array")]
    pub node_id: NodeId,
    /// The node's current X25519 onion public key.
    #[serde(with = "hex_array")]
    pub onion_key: [u8; 32],
    /// Where to `POST` frames (`/v2/relay` under it): `https://IP:PORT`.
    pub endpoint: String,
    /// Unix seconds at which the node signed this descriptor.
    pub issued_at: u64,
    /// Unix seconds from which this descriptor is no longer valid.
    pub expires_at: u64,
    /// The wire protocol the node speaks, signed: [`PROTOCOL`]; `0` (absent) for a v1 node.
    #[serde(default, skip_serializing_if = "is_unstated")]
    pub protocol: u8,
    /// Ed25519 signature by `node_id`.
    #[serde(with = "hex_array")]
    pub signature: [u8; 64],
}

/// Why a descriptor is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// The endpoint is longer than [`MAX_ENDPOINT_LEN`] bytes.
    #[error("descriptor endpoint too long")]
    EndpointTooLong,
    /// `issued_at` is more than [`DESCRIPTOR_MAX_SKEW`] seconds ahead of `now`.
    #[error("descriptor not yet valid")]
    NotYetValid,
    /// `now` is at or past `expires_at`.
    #[error("descriptor expired")]
    Expired,
    /// `expires_at − issued_at` is over [`MAX_DESCRIPTOR_LIFETIME`].
    #[error("descriptor lifetime too long")]
    LifetimeTooLong,
    /// `node_id` is not a usable Ed25519 key, or the signature does not verify under it.
    #[error("descriptor signature invalid")]
    BadSignature,
    /// The onion key is a small-order X25519 point (layers sealed to it would be readable by
    /// anyone) or a point of the twist (no key pair makes one; its node could open nothing).
    #[error("descriptor onion key unusable")]
    WeakOnionKey,
}

impl Descriptor {
    /// Signs a descriptor valid from `issued_at` for `ttl` seconds (normally [`DESCRIPTOR_TTL`]).
    ///
    /// An endpoint over [`MAX_ENDPOINT_LEN`] bytes still signs, but never verifies.
    pub fn sign(
        key: &SigningKey,
        onion_key: [u8; 32],
        endpoint: impl Into<String>,
        issued_at: u64,
        ttl: u64,
    ) -> Descriptor {
        let mut descriptor = Descriptor {
            node_id: key.verifying_key().to_bytes(),
            onion_key,
            endpoint: endpoint.into(),
            issued_at,
            expires_at: issued_at.saturating_add(ttl),
            protocol: PROTOCOL,
            signature: [0; 64],
        };
        descriptor.signature = key.sign(&descriptor.signing_bytes()).to_bytes();
        descriptor
    }

    /// What the node signs.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let endpoint = self.endpoint.as_bytes();
        let mut out = Vec::with_capacity(SIGN_DOMAIN.len() + 32 + 32 + 2 + endpoint.len() + 16);
        out.extend_from_slice(SIGN_DOMAIN);
        out.extend_from_slice(&self.node_id);
        out.extend_from_slice(&self.onion_key);
        // Saturating: an over-long endpoint is rejected by `verify` before this matters.
        let len = u16::try_from(endpoint.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(endpoint);
        out.extend_from_slice(&self.issued_at.to_be_bytes());
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        if self.protocol != 0 {
            out.push(self.protocol);
        }
        out
    }

    /// Checks the endpoint length, the validity window `issued_at − 120 ≤ now < expires_at`, the
    /// signature under `node_id`, and that the onion key is usable. The endpoint's address
    /// policy is separate: see [`endpoint_ip_is_public`].
    ///
    /// # Errors
    /// The first [`DescriptorError`] that applies, in that order.
    pub fn verify(&self, now: u64) -> Result<(), DescriptorError> {
        if self.endpoint.len() > MAX_ENDPOINT_LEN {
            return Err(DescriptorError::EndpointTooLong);
        }
        self.window(now)?;
        let key =
            VerifyingKey::from_bytes(&self.node_id).map_err(|_| DescriptorError::BadSignature)?;
        if key.is_weak() {
            return Err(DescriptorError::BadSignature);
        }
        key.verify_strict(
            &self.signing_bytes(),
            &Signature::from_bytes(&self.signature),
        )
        .map_err(|_| DescriptorError::BadSignature)?;
        if !onion_key_is_usable(&self.onion_key) {
            return Err(DescriptorError::WeakOnionKey);
        }
        Ok(())
    }

    /// [`Descriptor::verify`] of many at once: every check but the signatures one by one, the
    /// signatures in batches of [`BATCH`] (`ed25519_dalek::verify_batch`, about half the cost
    /// of one check each); a batch that fails is checked one by one, so a bad signature costs
    /// its batch twice and refuses only itself. True for each that verifies.
    pub fn verify_many(ds: &[&Descriptor], now: u64) -> Vec<bool> {
        let mut ok = vec![false; ds.len()];
        let mut pending: Vec<(usize, VerifyingKey, Vec<u8>)> = Vec::new();
        for (i, d) in ds.iter().enumerate() {
            let Some(key) = d.precheck(now) else {
                continue;
            };
            pending.push((i, key, d.signing_bytes()));
        }
        for chunk in pending.chunks(BATCH) {
            let messages: Vec<&[u8]> = chunk.iter().map(|(_, _, m)| m.as_slice()).collect();
            let sigs: Vec<Signature> = chunk
                .iter()
                .map(|(i, _, _)| Signature::from_bytes(&ds[*i].signature))
                .collect();
            let keys: Vec<VerifyingKey> = chunk.iter().map(|(_, k, _)| *k).collect();
            if ed25519_dalek::verify_batch(&messages, &sigs, &keys).is_ok() {
                chunk.iter().for_each(|(i, _, _)| ok[*i] = true);
                continue;
            }
            for ((i, key, m), sig) in chunk.iter().zip(&sigs) {
                ok[*i] = key.verify_strict(m, sig).is_ok();
            }
        }
        ok
    }

    /// Every check of [`Descriptor::verify`] but the signature's; the key to check it with.
    fn precheck(&self, now: u64) -> Option<VerifyingKey> {
        if self.endpoint.len() > MAX_ENDPOINT_LEN || self.window(now).is_err() {
            return None;
        }
        let key = VerifyingKey::from_bytes(&self.node_id).ok()?;
        if key.is_weak() || !onion_key_is_usable(&self.onion_key) {
            return None;
        }
        Some(key)
    }

    /// Whether `now` is inside the validity window, `issued_at − 120 ≤ now < expires_at`: all
    /// a descriptor that [`Descriptor::verify`] accepted earlier still needs to be used.
    pub fn is_current(&self, now: u64) -> bool {
        self.window(now).is_ok()
    }

    fn window(&self, now: u64) -> Result<(), DescriptorError> {
        if self.expires_at.saturating_sub(self.issued_at) > MAX_DESCRIPTOR_LIFETIME {
            return Err(DescriptorError::LifetimeTooLong);
        }
        if self.issued_at.saturating_sub(DESCRIPTOR_MAX_SKEW) > now {
            return Err(DescriptorError::NotYetValid);
        }
        if now >= self.expires_at {
            return Err(DescriptorError::Expired);
        }
        Ok(())
    }
}

/// Prints the node's prefix and the validity window; never the endpoint or keys.
impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("node_id", &Prefix(&self.node_id))
            .field("issued_at", &self.issued_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Whether `onion_key` is usable: a point of the curve (not of its twist, which no X25519 key
/// pair makes), and not a small-order one, whose shared secret would be the same for every
/// sender (anyone could open a layer sealed to it).
pub fn onion_key_is_usable(onion_key: &[u8; 32]) -> bool {
    // X25519 clamps every scalar to a multiple of the cofactor 8, so the product is the identity
    // for every small-order point and for no other point of the curve. A point of the twist
    // has no product a sender could share with the node (`sphinx::keys::Cleared`).
    crate::proto::sphinx::keys::Cleared::new(onion_key).is_some_and(|k| !k.is_small_order())
}

/// Serde for fixed-size byte arrays as hex strings (lowercase out, either case in).
mod hex_array {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&hex::encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        deserializer: D,
    ) -> Result<[u8; N], D::Error> {
        let s = String::deserialize(deserializer)?;
        crate::proto::from_hex(&s)
            .ok_or_else(|| D::Error::custom(format_args!("expected {} hex digits", N * 2)))
    }
}

/// Why an endpoint URL is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The scheme is not `https://`.
    #[error("endpoint is not https (links are TLS)")]
    NotHttp,
    /// The host is not an IP literal (DNS names are not accepted).
    #[error("endpoint host is not an IP address")]
    NotAnIp,
    /// Userinfo, a missing or invalid port, or a path other than `/`, a query or a fragment.
    #[error("endpoint malformed")]
    Malformed,
    /// The address is not publicly routable (see [`is_public`]).
    #[error("endpoint address is not public")]
    NotPublic,
}

/// Parses `https://IPv4:PORT` or `https://[IPv6]:PORT`, with an optional trailing `/`.
///
/// # Errors
/// [`EndpointError::NotHttp`], [`EndpointError::NotAnIp`] or [`EndpointError::Malformed`].
pub fn parse_endpoint(url: &str) -> Result<SocketAddr, EndpointError> {
    let rest = url.strip_prefix("https://").ok_or(EndpointError::NotHttp)?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if !(tail.is_empty() || tail == "/") || authority.contains('@') {
        return Err(EndpointError::Malformed);
    }
    let (ip, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']').ok_or(EndpointError::Malformed)?;
            let ip = host
                .parse::<Ipv6Addr>()
                .map_err(|_| EndpointError::NotAnIp)?;
            (IpAddr::V6(ip), after.strip_prefix(':'))
        }
        None => {
            let (host, port) = match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let ip = host
                .parse::<Ipv4Addr>()
                .map_err(|_| EndpointError::NotAnIp)?;
            (IpAddr::V4(ip), port)
        }
    };
    let port = port
        .filter(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != 0)
        .ok_or(EndpointError::Malformed)?;
    Ok(SocketAddr::new(ip, port))
}

/// Whether `ip` is publicly routable.
///
/// IPv4 rejects 0/8, 10/8, 100.64/10, 127/8, 169.254/16, 172.16/12, 192.0.0/24, 192.0.2/24,
/// 192.168/16, 198.18/15, 198.51.100/24, 203.0.113/24 and everything from 224/4 up. IPv6 accepts
/// only global unicast 2000::/3, minus documentation 2001:db8::/32; IPv4-mapped addresses
/// (`::ffff:a.b.c.d`) and 6to4 addresses (2002::/16) are judged by the IPv4 address they carry.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            if s[0] & 0xe000 != 0x2000 {
                return false;
            }
            if s[0] == 0x2001 && s[1] == 0x0db8 {
                return false;
            }
            if s[0] == 0x2002 {
                let [a, b] = s[1].to_be_bytes();
                let [c, d] = s[2].to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a, b, c, d));
            }
            true
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let reserved = a == 0
        || a == 10
        || (a == 100 && b & 0xc0 == 64)
        || a == 127
        || (a == 169 && b == 254)
        || (a == 172 && b & 0xf0 == 16)
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 0 && c == 2)
        || (a == 192 && b == 168)
        || (a == 198 && b & 0xfe == 18)
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || a >= 224;
    !reserved
}

/// [`parse_endpoint`], then [`is_public`].
///
/// # Errors
/// Those of [`parse_endpoint`], and [`EndpointError::NotPublic`].
pub fn endpoint_ip_is_public(url: &str) -> Result<SocketAddr, EndpointError> {
    let addr = parse_endpoint(url)?;
    if is_public(addr.ip()) {
        Ok(addr)
    } else {
        Err(EndpointError::NotPublic)
    }
}

/// A descriptor for tests: the node whose identity and onion keys are made from `seed`, at
/// `endpoint`, issued at `issued_at`, valid an hour.
#[cfg(test)]
pub(crate) fn for_test(seed: [u8; 32], endpoint: impl Into<String>, issued_at: u64) -> Descriptor {
    let onion = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(seed));
    Descriptor::sign(
        &SigningKey::from_bytes(&seed),
        onion.to_bytes(),
        endpoint,
        issued_at,
        3600,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use x25519_dalek::{PublicKey, StaticSecret};

    const NOW: u64 = 1_764_450_000;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[0x22; 32])
    }

    fn onion_key() -> [u8; 32] {
        PublicKey::from(&StaticSecret::from([0x33; 32])).to_bytes()
    }

    fn sample() -> Descriptor {
        Descriptor::sign(
            &key(),
            onion_key(),
            "https://192.0.2.10:7001",
            NOW,
            DESCRIPTOR_TTL,
        )
    }

    #[test]
    fn sign_and_verify() {
        let d = sample();
        assert_eq!(d.node_id, key().verifying_key().to_bytes());
        assert_eq!(d.expires_at, NOW + DESCRIPTOR_TTL);
        assert_eq!(d.verify(NOW), Ok(()));
        assert_eq!(d.verify(NOW - 120), Ok(()));
        assert_eq!(d.verify(NOW + DESCRIPTOR_TTL - 1), Ok(()));
    }

    #[test]
    fn validity_window() {
        let d = sample();
        assert_eq!(
            d.verify(NOW + DESCRIPTOR_TTL),
            Err(DescriptorError::Expired)
        );
        assert_eq!(d.verify(u64::MAX), Err(DescriptorError::Expired));
        assert_eq!(d.verify(NOW - 121), Err(DescriptorError::NotYetValid));
        assert_eq!(d.verify(0), Err(DescriptorError::NotYetValid));
        let zero = Descriptor::sign(&key(), onion_key(), "https://8.8.8.8:1", 0, 0);
        assert_eq!(zero.verify(0), Err(DescriptorError::Expired));
    }

    #[test]
    fn tampering_fails() {
        let d = sample();
        let mut t = d.clone();
        t.endpoint = "https://192.0.2.11:7001".into();
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d.clone();
        t.onion_key[0] ^= 1;
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d.clone();
        t.expires_at += 1;
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d.clone();
        t.issued_at -= 1;
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d.clone();
        t.signature[63] ^= 1;
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d.clone();
        t.node_id = SigningKey::from_bytes(&[0x23; 32])
            .verifying_key()
            .to_bytes();
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
        let mut t = d;
        t.node_id = [0; 32];
        t.node_id[0] = 2; // not a point
        assert_eq!(t.verify(NOW), Err(DescriptorError::BadSignature));
    }

    #[test]
    fn endpoint_length_and_weak_onion_key() {
        let long = format!("https://8.8.8.8:80/{}", "a".repeat(239));
        assert_eq!(long.len(), 258);
        let d = Descriptor::sign(&key(), onion_key(), long, NOW, DESCRIPTOR_TTL);
        assert_eq!(d.verify(NOW), Err(DescriptorError::EndpointTooLong));
        let max = "a".repeat(255);
        let d = Descriptor::sign(&key(), onion_key(), max, NOW, DESCRIPTOR_TTL);
        assert_eq!(d.verify(NOW), Ok(()));
        let d = Descriptor::sign(&key(), [0; 32], "https://8.8.8.8:80", NOW, DESCRIPTOR_TTL);
        assert_eq!(d.verify(NOW), Err(DescriptorError::WeakOnionKey));
        // u = 2 names a point of the twist, not of the curve: no key pair makes it.
        let d = Descriptor::sign(&key(), twist_u(), "https://8.8.8.8:80", NOW, DESCRIPTOR_TTL);
        assert_eq!(d.verify(NOW), Err(DescriptorError::WeakOnionKey));
        assert!(onion_key_is_usable(&onion_key()));
    }

    /// A u-coordinate of the twist (no point of the curve has it).
    fn twist_u() -> [u8; 32] {
        let mut u = [0u8; 32];
        u[0] = 2;
        assert!(crate::proto::sphinx::keys::Cleared::new(&u).is_none());
        u
    }

    #[test]
    fn signing_bytes_layout() {
        let d = sample();
        let mut expected = b"blindrelay/descriptor/v1".to_vec();
        expected.extend_from_slice(&d.node_id);
        expected.extend_from_slice(&d.onion_key);
        expected.extend_from_slice(&[0, 23]);
        expected.extend_from_slice(b"https://192.0.2.10:7001");
        expected.extend_from_slice(&NOW.to_be_bytes());
        expected.extend_from_slice(&(NOW + DESCRIPTOR_TTL).to_be_bytes());
        expected.push(PROTOCOL);
        assert_eq!(d.signing_bytes(), expected);
        // A v1 node's descriptor has no protocol field: signed without its byte, still valid.
        let v1 = Descriptor {
            protocol: 0,
            ..d.clone()
        };
        assert_eq!(v1.signing_bytes(), expected[..expected.len() - 1]);
        let json = serde_json::to_value(&v1).expect("json");
        assert!(json.get("protocol").is_none());
        assert_eq!(serde_json::to_value(&d).expect("json")["protocol"], 2);
    }

    #[test]
    fn json_round_trip() {
        let d = sample();
        let json = serde_json::to_string(&d).expect("serializes");
        let value: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(value["node_id"], hex::encode(d.node_id));
        assert_eq!(value["signature"].as_str().map(str::len), Some(128));
        assert_eq!(value["issued_at"], NOW);
        assert_eq!(value["endpoint"], "https://192.0.2.10:7001");
        let back: Descriptor = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, d);
        assert_eq!(back.verify(NOW), Ok(()));
    }

    #[test]
    fn json_rejects_bad_input() {
        let json = serde_json::to_value(sample()).expect("serializes");
        let mut extra = json.clone();
        extra["extra"] = 1.into();
        assert!(serde_json::from_value::<Descriptor>(extra).is_err());
        let mut short = json.clone();
        short["node_id"] = "abcd".into();
        assert!(serde_json::from_value::<Descriptor>(short).is_err());
        let mut not_hex = json.clone();
        not_hex["onion_key"] = "zz".repeat(32).into();
        assert!(serde_json::from_value::<Descriptor>(not_hex).is_err());
        let mut missing = json;
        missing
            .as_object_mut()
            .expect("object")
            .remove("expires_at");
        assert!(serde_json::from_value::<Descriptor>(missing).is_err());
    }

    #[test]
    fn debug_is_log_safe() {
        let d = sample();
        let text = format!("{d:?}");
        assert!(!text.contains("192.0.2.10"));
        assert!(!text.contains(&hex::encode(d.node_id)));
        assert!(text.contains(&hex::encode(&d.node_id[..4])));
    }

    #[test]
    fn endpoint_policy_table() {
        use EndpointError::*;
        let cases: &[(&str, Result<&str, EndpointError>)] = &[
            // Public.
            ("https://8.8.8.8:80", Ok("8.8.8.8:80")),
            ("https://8.8.8.8:80/", Ok("8.8.8.8:80")),
            ("https://1.1.1.1:65535", Ok("1.1.1.1:65535")),
            ("https://[2606:4700::1]:443", Ok("[2606:4700::1]:443")),
            ("https://[::ffff:8.8.8.8]:80", Ok("[::ffff:8.8.8.8]:80")),
            ("https://100.63.255.255:1", Ok("100.63.255.255:1")),
            ("https://100.128.0.0:1", Ok("100.128.0.0:1")),
            ("https://172.15.255.255:1", Ok("172.15.255.255:1")),
            ("https://172.32.0.0:1", Ok("172.32.0.0:1")),
            ("https://198.17.255.255:1", Ok("198.17.255.255:1")),
            ("https://198.20.0.0:1", Ok("198.20.0.0:1")),
            ("https://192.0.1.1:1", Ok("192.0.1.1:1")),
            ("https://223.255.255.255:1", Ok("223.255.255.255:1")),
            ("https://[2002:808:808::1]:1", Ok("[2002:808:808::1]:1")),
            // Reserved IPv4 ranges, first and last address of each.
            ("https://0.0.0.0:1", Err(NotPublic)),
            ("https://0.255.255.255:1", Err(NotPublic)),
            ("https://10.0.0.0:1", Err(NotPublic)),
            ("https://10.255.255.255:1", Err(NotPublic)),
            ("https://127.0.0.1:1", Err(NotPublic)),
            ("https://127.255.255.255:1", Err(NotPublic)),
            ("https://100.64.0.0:1", Err(NotPublic)),
            ("https://100.127.255.255:1", Err(NotPublic)),
            ("https://169.254.0.0:1", Err(NotPublic)),
            ("https://169.254.255.255:1", Err(NotPublic)),
            ("https://172.16.0.0:1", Err(NotPublic)),
            ("https://172.31.255.255:1", Err(NotPublic)),
            ("https://192.0.0.0:1", Err(NotPublic)),
            ("https://192.0.0.255:1", Err(NotPublic)),
            ("https://192.0.2.1:1", Err(NotPublic)),
            ("https://192.0.2.255:1", Err(NotPublic)),
            ("https://192.168.0.0:1", Err(NotPublic)),
            ("https://192.168.255.255:1", Err(NotPublic)),
            ("https://198.18.0.0:1", Err(NotPublic)),
            ("https://198.19.255.255:1", Err(NotPublic)),
            ("https://198.51.100.0:1", Err(NotPublic)),
            ("https://198.51.100.255:1", Err(NotPublic)),
            ("https://203.0.113.0:1", Err(NotPublic)),
            ("https://203.0.113.255:1", Err(NotPublic)),
            ("https://224.0.0.1:1", Err(NotPublic)),
            ("https://239.255.255.255:1", Err(NotPublic)),
            ("https://240.0.0.1:1", Err(NotPublic)),
            ("https://255.255.255.255:1", Err(NotPublic)),
            // IPv6 outside 2000::/3, documentation, mapped and 6to4 private.
            ("https://[::1]:1", Err(NotPublic)),
            ("https://[::]:1", Err(NotPublic)),
            ("https://[fe80::1]:1", Err(NotPublic)),
            ("https://[fc00::1]:1", Err(NotPublic)),
            ("https://[fd12:3456::1]:1", Err(NotPublic)),
            ("https://[ff02::1]:1", Err(NotPublic)),
            ("https://[64:ff9b::7f00:1]:1", Err(NotPublic)),
            ("https://[2001:db8::1]:1", Err(NotPublic)),
            ("https://[2001:db8:ffff::1]:1", Err(NotPublic)),
            ("https://[::ffff:127.0.0.1]:1", Err(NotPublic)),
            ("https://[::ffff:10.1.2.3]:1", Err(NotPublic)),
            ("https://[2002:7f00:1::1]:1", Err(NotPublic)),
            ("https://[2002:c0a8:101::1]:1", Err(NotPublic)),
            // Scheme.
            ("http://8.8.8.8:443", Err(NotHttp)),
            ("HTTP://8.8.8.8:80", Err(NotHttp)),
            ("ftp://8.8.8.8:21", Err(NotHttp)),
            ("8.8.8.8:80", Err(NotHttp)),
            ("", Err(NotHttp)),
            // Host must be an IP literal.
            ("https://example.com:80", Err(NotAnIp)),
            ("https://localhost:80", Err(NotAnIp)),
            ("https://example.com", Err(NotAnIp)),
            ("https://8.8.8.8.nip.io:80", Err(NotAnIp)),
            ("https://010.0.0.1:80", Err(NotAnIp)),
            ("https://127.1:80", Err(NotAnIp)),
            ("https://2130706433:80", Err(NotAnIp)),
            ("https://::1:80", Err(NotAnIp)),
            ("https://[8.8.8.8]:80", Err(NotAnIp)),
            ("https://[fe80::1%eth0]:80", Err(NotAnIp)),
            ("https://:80", Err(NotAnIp)),
            // Malformed.
            ("https://user@8.8.8.8:80", Err(Malformed)),
            ("https://user:pw@8.8.8.8:80", Err(Malformed)),
            ("https://8.8.8.8", Err(Malformed)),
            ("https://8.8.8.8:", Err(Malformed)),
            ("https://8.8.8.8:0", Err(Malformed)),
            ("https://8.8.8.8:65536", Err(Malformed)),
            ("https://8.8.8.8:+80", Err(Malformed)),
            ("https://8.8.8.8:080080", Err(Malformed)),
            ("https://8.8.8.8:80/path", Err(Malformed)),
            ("https://8.8.8.8:80//", Err(Malformed)),
            ("https://8.8.8.8:80?q", Err(Malformed)),
            ("https://8.8.8.8:80#f", Err(Malformed)),
            ("https://[2606:4700::1]", Err(Malformed)),
            ("https://[2606:4700::1]80", Err(Malformed)),
            ("https://[2606:4700::1:80", Err(Malformed)),
        ];
        for (url, expected) in cases {
            let got = endpoint_ip_is_public(url);
            let expected = expected.map(|s| s.parse::<SocketAddr>().expect("test addr"));
            assert_eq!(got, expected, "{url}");
        }
    }

    #[test]
    fn private_endpoints_still_parse() {
        assert_eq!(
            parse_endpoint("https://127.0.0.1:7001"),
            Ok("127.0.0.1:7001".parse().expect("addr"))
        );
        assert!(!is_public("127.0.0.1".parse().expect("ip")));
        assert!(is_public("8.8.8.8".parse().expect("ip")));
        assert!(!is_public("::ffff:127.0.0.1".parse().expect("ip")));
        assert!(!is_public("2001:db8::1".parse().expect("ip")));
        assert!(is_public("2606:4700::1".parse().expect("ip")));
    }
}
