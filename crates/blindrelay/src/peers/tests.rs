//! The peer table over the discovery machine.

use ed25519_dalek::SigningKey;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::links::Links;

const T0: u64 = 1_800_000_000;

fn onion_key() -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([5u8; 32])).to_bytes()
}

#[test]
fn a_descriptor_is_verified_once_then_used_while_current() {
    let clock = Clock::starting_at(T0);
    let peers = Peers::new(vec![], true, clock, [0; 32]);
    let key = SigningKey::from_bytes(&[1; 32]);
    let id = key.verifying_key().to_bytes();
    let d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
    let mut forged = d.clone();
    forged.issued_at += 1;
    assert!(
        !peers.insert(forged),
        "a bad signature is refused when accepted"
    );
    assert_eq!(peers.descriptor(&id, T0), Err(PeerError::Unknown));
    assert!(peers.insert(d.clone()));
    assert_eq!(peers.descriptor(&id, T0 + 3599), Ok(d));
    assert_eq!(
        peers.route(&id, T0).as_deref(),
        Ok("https://127.0.0.9:7001/v2/relay")
    );
    assert_eq!(peers.descriptor(&id, T0 + 3600), Err(PeerError::Expired));
    assert!(peers.routable(T0 + 3600).is_empty());
    assert!(!format!("{peers:?}").contains("127.0.0.9"));
}

/// A peer that changes its onion key mid-traffic: its newer descriptor replaces the held
/// one at once, an older one (a replayed fetch) never brings the former key back, and once
/// the newer one expires the peer is not routable until it is fetched again.
#[tokio::test(start_paused = true)]
async fn a_newer_descriptor_with_another_onion_key_replaces_the_held_one() {
    let clock = Clock::starting_at(T0);
    let peers = Peers::new(vec![], true, clock, [0; 32]);
    let key = SigningKey::from_bytes(&[3; 32]);
    let id = key.verifying_key().to_bytes();
    let other_key =
        x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([6u8; 32])).to_bytes();
    let old = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
    assert!(peers.insert(old.clone()));
    tokio::time::advance(std::time::Duration::from_secs(60)).await;
    let new = Descriptor::sign(&key, other_key, "https://127.0.0.9:7001", T0 + 60, 3600);
    assert!(peers.insert(new.clone()));
    assert_eq!(
        peers.descriptor(&id, T0 + 60).map(|d| d.onion_key),
        Ok(other_key)
    );
    assert!(!peers.insert(old), "an older descriptor does not come back");
    assert_eq!(peers.descriptor(&id, T0 + 61), Ok(new));
    assert_eq!(peers.descriptor(&id, T0 + 3660), Err(PeerError::Expired));
    assert!(peers.routable(T0 + 3660).is_empty());
}

#[test]
fn a_peer_without_protocol_2_is_known_but_not_routable() {
    use ed25519_dalek::Signer;
    let clock = Clock::starting_at(T0);
    let peers = Peers::new(vec![], true, clock, [0; 32]);
    let key = SigningKey::from_bytes(&[3; 32]);
    let mut d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
    d.protocol = 0;
    d.signature = key.sign(&d.signing_bytes()).to_bytes();
    assert!(peers.insert(d.clone()), "a v1 descriptor still verifies");
    assert_eq!(peers.descriptor(&d.node_id, T0), Ok(d.clone()));
    assert_eq!(peers.route(&d.node_id, T0), Err(PeerError::OldProtocol));
    assert!(peers.routable(T0).is_empty());
    let v2 = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0 + 1, 3600);
    assert!(peers.insert(v2));
    assert_eq!(peers.routable(T0 + 1).len(), 1);
}

#[test]
fn private_endpoints_only_when_allowed() {
    let clock = Clock::starting_at(T0);
    let strict = Peers::new(vec![], false, clock, [0; 32]);
    let key = SigningKey::from_bytes(&[2; 32]);
    let d = Descriptor::sign(&key, onion_key(), "https://127.0.0.9:7001", T0, 3600);
    assert!(strict.insert(d.clone()));
    assert_eq!(strict.descriptor(&d.node_id, T0), Err(PeerError::Endpoint));
}

/// Links with no identity of their own: enough to fetch (or fail to).
fn links() -> Links {
    Links::new(
        None,
        Arc::default(),
        crate::links::LinkLimits {
            idle_per_peer: 1,
            clients: 1,
        },
        None,
    )
}

#[tokio::test]
async fn a_dead_peer_ends_the_first_round_without_holding_discovery_back() {
    // A loopback port nothing listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spec = PeerSpec::parse(&format!("https://127.0.0.1:{port}")).unwrap();
    let peers = Arc::new(Peers::new(
        vec![spec],
        true,
        Clock::starting_at(T0),
        [0; 32],
    ));
    let links = links();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(Arc::clone(&peers).run(links, cancel.clone()));
    assert!(peers.tried(READY_WAIT).await, "the refusal ends the round");
    assert!(!peers.is_fetched(), "not every --peer answered");
    cancel.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ready_waits_for_the_first_complete_fetch_round_bounded() {
    let peers = Arc::new(Peers::new(vec![], true, Clock::starting_at(T0), [0; 32]));
    assert!(!peers.fetched(Duration::from_secs(1)).await, "bounded");
    let links = links();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(Arc::clone(&peers).run(links, cancel.clone()));
    assert!(
        peers.fetched(Duration::from_secs(1)).await,
        "no --peer: ready at once"
    );
    cancel.cancel();
    run.await.unwrap();
}
