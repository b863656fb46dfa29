//! A synthetic probe's terminal payload: `blindrelay/probe/v1` ‖ 16 random bytes.
//!
//! The payload does not make a probe: a terminal knows a probe by its layer's kind
//! ([`super::onion::build_probe`], kind `0x03` inside the authenticated plaintext), so a
//! message whose payload happens to start with these bytes is stored like any other. A
//! terminal answers a probe like a delivery (a signed receipt sealed to the prober) but stores
//! nothing; middle hops cannot tell it from a message.

/// Start of every probe payload (a label for people reading a capture of their own probe; the
/// terminal does not look at it).
pub const PROBE_LABEL: &[u8] = b"blindrelay/probe/v1";

/// A fresh probe payload.
pub fn payload() -> Vec<u8> {
    let mut p = PROBE_LABEL.to_vec();
    p.extend_from_slice(&rand::random::<[u8; 16]>());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_payloads_differ() {
        let (a, b) = (payload(), payload());
        assert!(a.starts_with(PROBE_LABEL));
        assert_ne!(a, b);
    }
}
