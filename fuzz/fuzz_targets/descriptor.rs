//! Node descriptors as fetched from a peer (`GET /v1/descriptor`, JSON), and endpoint URLs.
//!
//! Oracle: decoding and verifying never panic; a decoded descriptor serializes back to JSON
//! that decodes to itself; a descriptor that verifies stops verifying when any signed field
//! changes; an endpoint that parses prints back to an address that parses to the same.
#![no_main]

use blindrelay::proto::{
    Descriptor, DescriptorError, endpoint_ip_is_public, is_public, parse_endpoint,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [sel, rest @ ..] = data else { return };
    let now = 1_764_450_000 + u64::from(*sel) * 60;
    if let Ok(d) = serde_json::from_slice::<Descriptor>(rest) {
        let json = serde_json::to_vec(&d).expect("serializes");
        let back: Descriptor = serde_json::from_slice(&json).expect("decodes its own JSON");
        assert_eq!(back, d);
        for t in [now, d.issued_at, d.expires_at.saturating_sub(1)] {
            if d.verify(t).is_ok() {
                assert!(d.is_current(t));
                let mut other = d.clone();
                other.expires_at = other.expires_at.wrapping_sub(1);
                let v = other.verify(t);
                assert!(v.is_err(), "a changed descriptor verified");
                let mut other = d.clone();
                other.endpoint.push('/');
                assert!(matches!(
                    other.verify(t),
                    Err(DescriptorError::BadSignature | DescriptorError::EndpointTooLong)
                ));
            }
        }
        let _ = endpoint_ip_is_public(&d.endpoint);
    }
    let url = String::from_utf8_lossy(rest);
    if let Ok(addr) = parse_endpoint(&url) {
        assert_ne!(addr.port(), 0);
        let printed = format!("https://{addr}");
        assert_eq!(parse_endpoint(&printed), Ok(addr));
        assert_eq!(endpoint_ip_is_public(&url).is_ok(), is_public(addr.ip()),);
    }
});
