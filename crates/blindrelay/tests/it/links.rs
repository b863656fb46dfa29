//! Node-to-node links over TLS pinned to the peer's identity key, on real processes.

use crate::common;

use std::time::{Duration, Instant};

use common::{Doc, Net, POLL, WAIT, counter};
use serde_json::Value;

fn identity_changes(status: &Value) -> u64 {
    status.runtime()["peers"]["identity_changes"]
        .as_u64()
        .expect("identity_changes")
}
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A node whose `--peer` pins one id at a URL where another real node answers refuses the
/// link at the TLS handshake: counted (`identity_changes`), logged, never routed to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_tls_key_is_not_the_pinned_id_is_refused() {
    let mut net = Net::start(2, &[]).await;
    let before = identity_changes(&net.status(0).await);
    // Node 1 answers at its URL with its own identity; node 0 now expects another one there.
    let other = common::hex(&[7u8; 32]);
    let spec = format!("{other}@{}", net.node(1).endpoint);
    net.restart_with(0, &["--peer", &spec]).await;
    let needle = "TLS key is not the node id pinned to it";
    let end = Instant::now() + WAIT;
    while net.node(0).count(needle) == 0 {
        assert!(
            Instant::now() < end,
            "no refusal logged:\n{}",
            net.node(0).lines().join("\n")
        );
        tokio::time::sleep(POLL).await;
    }
    let status = net.status(0).await;
    assert!(identity_changes(&status) > before, "{status}");
    // The refusal names prefixes only, never the URL.
    let line = net
        .node(0)
        .lines()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap();
    assert!(
        line.contains(&other[..8]) && !line.contains(&net.node(1).endpoint),
        "{line}"
    );
    // The honest pin to node 1 still holds: it stays routable.
    net.wait_routable(0, 1).await;
}

/// A bare `--peer URL` is trusted on first use; when another node answers at that address
/// later, the next fetch's handshake meets another key: refused, counted and logged at `warn`
/// (prefixes only) within one `--peer-refresh`, and the line is not repeated at every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_swapped_behind_a_bare_peer_url_is_caught_within_one_refresh() {
    const REFRESH: Duration = Duration::from_secs(1);
    // Scheduling slack on a loaded two-core machine: one fetch and one handshake.
    const SLACK: Duration = Duration::from_secs(2);
    let mut net = Net::start_bootstrapped(2, &["--gossip-interval", "0s"], |_| vec![]).await;
    let url = net.node(1).endpoint.clone();
    let first = net.node(1).id.clone();
    net.restart_with(0, &["--peer", &url, "--peer-refresh", "1s"])
        .await;
    let needle = "TLS key is not the node id pinned to it";
    assert_eq!(net.node(0).count(needle), 0);
    let before = identity_changes(&net.status(0).await);
    net.swap_identity(1).await;
    let swapped = Instant::now();
    let second = net.node(1).id.clone();
    assert_ne!(first, second);
    while net.node(0).count(needle) == 0 {
        assert!(
            swapped.elapsed() < REFRESH + SLACK,
            "not caught within {REFRESH:?} + {SLACK:?}:\n{}",
            net.node(0).lines().join("\n")
        );
        tokio::time::sleep(POLL).await;
    }
    let caught = swapped.elapsed();
    assert!(identity_changes(&net.status(0).await) > before);
    let line = net
        .node(0)
        .lines()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap();
    assert!(
        line.contains(&first[..8])
            && line.contains(&second[..8])
            && !line.contains(&first)
            && !line.contains(&url),
        "{line}"
    );
    // Retries meet the same key four times a second: counted, one line a minute at most.
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        tokio::time::sleep(POLL).await;
    }
    let status = net.status(0).await;
    assert!(identity_changes(&status) > before + 2, "{status}");
    assert_eq!(net.node(0).count(needle), 1, "caught after {caught:?}");
}

/// A TCP connection that starts a TLS handshake and never finishes it is closed within the
/// header timeout and counted as timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_tls_handshake_is_closed_within_the_header_timeout() {
    let net = Net::start(1, &["--header-timeout", "1s"]).await;
    let addr = net
        .node(0)
        .endpoint
        .trim_start_matches("https://")
        .to_string();
    let before = counter(&net.status(0).await, "connections_timed_out");
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    // The first bytes of a ClientHello record, then silence.
    conn.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .expect("write");
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the half-open handshake was not closed within 5 s"
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "closed too early: {took:?}"
    );
    let end = Instant::now() + WAIT;
    while counter(&net.status(0).await, "connections_timed_out") <= before {
        assert!(
            Instant::now() < end,
            "the timed-out handshake was not counted"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Relay traffic and descriptor fetches between two nodes go over TLS: a recording proxy on
/// the link sees no HTTP method or path, no node id in hex, no payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_observer_sees_no_plaintext() {
    let (net, taps) = Net::start_tapped(2, &[]).await;
    let marker = b"LINK-PAYLOAD-MARKER-0123456789-abcdefghij";
    let (ok, out, err) = net.send(0, 1, 1, marker).await;
    assert!(ok, "send failed: {out} {err}");
    let (ok, out, err) = net.send(1, 0, 1, marker).await;
    assert!(ok, "send failed: {out} {err}");
    for (i, tap) in taps.iter().enumerate() {
        let wire = tap.bytes();
        assert!(wire.len() > 1000, "tap {i} saw only {} bytes", wire.len());
        // TLS application data records, and nothing in clear.
        assert!(
            wire.windows(3).any(|w| w == [0x17, 0x03, 0x03]),
            "tap {i}: no TLS record"
        );
        let mut clear: Vec<Vec<u8>> = vec![
            b"POST".to_vec(),
            b"GET ".to_vec(),
            b"HTTP/1.1".to_vec(),
            b"/v1/relay".to_vec(),
            b"/v2/relay".to_vec(),
            b"/v1/descriptor".to_vec(),
            marker.to_vec(),
        ];
        for n in net.nodes() {
            clear.push(n.id.as_bytes().to_vec());
            clear.push(n.prefix().as_bytes().to_vec());
        }
        for c in &clear {
            assert!(
                !wire.windows(c.len()).any(|w| w == c.as_slice()),
                "tap {i} saw {:?} in clear",
                String::from_utf8_lossy(c)
            );
        }
    }
}

/// A client certificate that names `claimed` (another node's id) on a key `signer` holds: what
/// an impostor can make without the claimed node's secret.
fn impostor_config(claimed: &[u8; 32], signer: &ed25519_dalek::SigningKey) -> rustls::ClientConfig {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    // PKCS#8 v1 of an Ed25519 seed, and the certificate made on it.
    let mut pkcs8 = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    pkcs8.extend_from_slice(signer.as_bytes());
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
        &PrivatePkcs8KeyDer::from(pkcs8.clone()),
        &rcgen::PKCS_ED25519,
    )
    .expect("key pair");
    let cert = rcgen::CertificateParams::new(vec!["blindrelay".into()])
        .expect("params")
        .self_signed(&pair)
        .expect("certificate");
    // The claimed id put where the signer's key was.
    let own = signer.verifying_key().to_bytes();
    let mut der = cert.der().to_vec();
    let at = der
        .windows(32)
        .position(|w| w == own)
        .expect("the key in it");
    der[at..at + 32].copy_from_slice(claimed);
    let provider = rustls::crypto::ring::default_provider();
    let key = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8)))
        .expect("signing key");
    let certified = std::sync::Arc::new(rustls::sign::CertifiedKey::new(
        vec![CertificateDer::from(der)],
        key,
    ));
    #[derive(Debug)]
    struct Offer(std::sync::Arc<rustls::sign::CertifiedKey>);
    impl rustls::client::ResolvesClientCert for Offer {
        fn resolve(
            &self,
            _hints: &[&[u8]],
            _schemes: &[rustls::SignatureScheme],
        ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
            Some(std::sync::Arc::clone(&self.0))
        }
        fn has_certs(&self) -> bool {
            true
        }
    }
    let mut config = blindrelay::links::unpinned_config();
    config.client_auth_cert_resolver = std::sync::Arc::new(Offer(certified));
    config
}

/// A frame needs a link that proves its previous hop: a client with no certificate reads a
/// descriptor but posts no frame (`invalid_previous_hop`, charged to nobody), one that names
/// another node's id without its key is refused at the handshake, and a client proving its own
/// identity is the previous hop of what it posts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_needs_a_link_that_proves_its_previous_hop() {
    let net = Net::start(2, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let d1: blindrelay::proto::Descriptor =
        serde_json::from_value(net.get_json(1, "/v1/descriptor").await).expect("descriptor");
    let frame = |text: &[u8]| {
        let expires = blindrelay::send::wrap::expiry(common::unix_now());
        common::craft(&[&d1], text, false, expires).frame
    };
    let anonymous = common::http_anonymous();
    let r = anonymous
        .get(format!("{}/v1/descriptor", d1.endpoint))
        .send()
        .await
        .expect("a descriptor with no client certificate");
    assert_eq!(r.status(), 200);
    let (status, why) = common::post(&anonymous, &d1.endpoint, frame(b"anonymous")).await;
    assert_eq!((status, why.as_str()), (400, "invalid_previous_hop"));
    // Node 0's id on a key node 0 does not hold.
    let claimed: [u8; 32] = blindrelay::proto::from_hex(&net.node(0).id).expect("id");
    let impostor = reqwest::Client::builder()
        .use_preconfigured_tls(impostor_config(
            &claimed,
            &ed25519_dalek::SigningKey::from_bytes(&rand::random()),
        ))
        .build()
        .expect("client");
    let r = impostor
        .post(format!("{}/v2/relay", d1.endpoint))
        .body(frame(b"in node 0's name"))
        .send()
        .await;
    assert!(r.is_err(), "an impostor's handshake went through: {r:?}");
    let (status, why) = common::post(&common::http(), &d1.endpoint, frame(b"mine")).await;
    assert_eq!((status, why.as_str()), (200, "delivered"));
    let s = net.status(1).await;
    assert_eq!(
        counter(&s, "received"),
        2,
        "the impostor reached no handler: {s}"
    );
    assert_eq!(counter(&s, "terminal"), 1, "{s}");
    assert_eq!(counter(&s, "invalid_previous_hop"), 1, "{s}");
    assert_eq!(counter(&s, "quarantine_started"), 0, "{s}");
    let named = common::peer_rows(&s)
        .iter()
        .find(|r| r["node"] == net.node(0).prefix())
        .cloned()
        .expect("node 0's row (a --peer of node 1)");
    assert_eq!(
        (named["last_contact"].as_str(), &named["reasons"]),
        (Some("never"), &serde_json::json!({})),
        "nothing noted against the node the impostor named: {named}"
    );
}
