//! A synthetic probe's terminal payload: `blindrelay/probe/v1` ‖ 16 random bytes. A terminal
//! answers it like a delivery (a signed receipt sealed to the prober) but stores nothing; middle
//! hops cannot tell it from a message.

/// Start of every probe payload.
pub const PROBE_MAGIC: &[u8] = b"blindrelay/probe/v1";

/// True when a terminal payload is a probe.
pub fn is_probe(payload: &[u8]) -> bool {
    payload.starts_with(PROBE_MAGIC)
}

/// A fresh probe payload.
pub fn payload() -> Vec<u8> {
    let mut p = PROBE_MAGIC.to_vec();
    p.extend_from_slice(&rand::random::<[u8; 16]>());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_recognised_and_differ() {
        let (a, b) = (payload(), payload());
        assert!(is_probe(&a) && is_probe(&b));
        assert_ne!(a, b);
        assert!(!is_probe(b"a message"));
    }
}
