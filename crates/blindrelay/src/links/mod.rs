//! Node-to-node links: TLS 1.3 (rustls, the `ring` provider), authenticated to the peer's
//! identity key, no web PKI.
//!
//! - **Server**: each node presents a self-signed certificate made at start (rcgen) whose
//!   key *is* its Ed25519 identity key (the node id). Nothing else in the certificate is
//!   read by anyone.
//! - **Client**: one `reqwest::Client` per pinned node id, whose [`PinnedKey`] verifier
//!   accepts exactly that id: the certificate's Ed25519 key must equal it, and the TLS 1.3
//!   `CertificateVerify` signature (over the handshake transcript) must verify with it. A
//!   peer holding another key is refused at the handshake, counted (`identity_changes` in
//!   the status document) and logged at `warn` with 8-hex prefixes, at most once a minute
//!   ([`Refusals`]). A bare `--peer URL`
//!   (trust on first use) fetches with an unpinned client that requires an Ed25519 key and a
//!   valid handshake signature, and the descriptor's node id must equal the TLS key
//!   ([`peer_key`]).
//! - **Both ways** (mutual TLS): a node's client presents the same kind of certificate, whose
//!   key is its own identity, and the server checks the client's `CertificateVerify` with that
//!   key ([`LinkPeer`]): the link names the client's node id, proven by the handshake. A relay
//!   request's previous hop *is* the link's client, so frames carry no id and no signature of
//!   their own (`crate::proto::frame`). The server asks every client for a certificate but
//!   lets one without it connect (a descriptor fetch by a tool); such a link cannot post a
//!   frame.
//! - Peer URLs and descriptor endpoints are `https://IP:PORT`; `http://` is refused.
//! - **Framed links** ([`framed`], `crate::proto::link`): a node offers `blindrelay/1` by
//!   ALPN next to `http/1.1`, and its frames to a next hop that chose it travel on one link,
//!   many at once; a next hop that chose HTTP gets one request per frame, as before. Everything
//!   else (descriptors, gossip, tools) is HTTP.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use guard::throttle::Throttle;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tracing::warn;

use self::framed::Framed;
pub use self::framed::Posted;
use crate::clock::Instant;
use crate::proto::{NodeId, Prefix, link};

pub mod framed;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo; the 32-byte key follows.
const ED25519_SPKI: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// The DER prefix of a PKCS#8 v1 Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Why the TLS identity could not be made.
#[derive(Debug, thiserror::Error)]
#[error("TLS identity: {0}")]
pub struct LinkError(String);

/// Installs `ring` as the process's default rustls provider (once; later calls do nothing).
/// reqwest needs one to build any client, also the plain-HTTP ones of the operator API.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pkcs8(key: &SigningKey) -> Vec<u8> {
    let mut der = ED25519_PKCS8.to_vec();
    der.extend_from_slice(key.as_bytes());
    der
}

/// The Ed25519 key of a certificate made by a node (the first Ed25519 SubjectPublicKeyInfo
/// in it). Whatever else the certificate says is ignored: the handshake signature is checked
/// with this key, so only its holder can have presented it.
pub fn peer_key(cert: &[u8]) -> Option<NodeId> {
    let at = cert
        .windows(ED25519_SPKI.len())
        .position(|w| w == ED25519_SPKI)?;
    cert.get(at + ED25519_SPKI.len()..at + ED25519_SPKI.len() + 32)?
        .try_into()
        .ok()
}

/// The node's link certificate: self-signed, its key the identity key `key`.
fn identity(
    key: &SigningKey,
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), LinkError> {
    let e = |e: &dyn fmt::Display| LinkError(e.to_string());
    let der = pkcs8(key);
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
        &PrivatePkcs8KeyDer::from(der.clone()),
        &rcgen::PKCS_ED25519,
    )
    .map_err(|x| e(&x))?;
    let params =
        rcgen::CertificateParams::new(vec!["blindrelay".to_string()]).map_err(|x| e(&x))?;
    let cert = params.self_signed(&pair).map_err(|x| e(&x))?;
    Ok((
        cert.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der)),
    ))
}

/// The node id a link's client proved it holds (mutual TLS), if it presented a certificate:
/// an extension of every request on the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkPeer(pub Option<NodeId>);

impl LinkPeer {
    /// The client's node id on a server-side TLS connection, from the certificate its
    /// handshake was checked against ([`ClientKey`]).
    pub fn of(conn: &rustls::ServerConnection) -> LinkPeer {
        LinkPeer(
            conn.peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|c| peer_key(c)),
        )
    }
}

/// The server side of a link that speaks HTTP only (tools and tests acting as a node; a node
/// serves [`node_server_config`]).
pub fn server_config(key: &SigningKey) -> Result<Arc<rustls::ServerConfig>, LinkError> {
    server_config_with(key, vec![HTTP1.to_vec()])
}

/// The server side of this node's links: the framed link (`blindrelay/1`) for a client that
/// offers it, HTTP/1.1 for any other.
pub fn node_server_config(key: &SigningKey) -> Result<Arc<rustls::ServerConfig>, LinkError> {
    server_config_with(key, vec![link::ALPN.to_vec(), HTTP1.to_vec()])
}

/// The ALPN name of HTTP/1.1.
const HTTP1: &[u8] = b"http/1.1";

fn server_config_with(
    key: &SigningKey,
    alpn: Vec<Vec<u8>>,
) -> Result<Arc<rustls::ServerConfig>, LinkError> {
    let e = |e: &dyn fmt::Display| LinkError(e.to_string());
    let (cert, private) = identity(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|x| e(&x))?
        .with_client_cert_verifier(Arc::new(ClientKey))
        .with_single_cert(vec![cert], private)
        .map_err(|x| e(&x))?;
    // The server's order decides: the framed link when both sides offer it.
    config.alpn_protocols = alpn;
    // No tickets, no session cache: every link's handshake is a full one, checked against the
    // pinned key, and the server never writes while the client's first request is on its way
    // (a ticket sent after the handshake would cut that request's records in two on the wire).
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// At most one `warn` line a minute for identity refusals: a swapped identity behind a URL is
/// met at every retry (four a second) and at every send to it.
pub const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(60);

/// Identities refused (a TLS key or a descriptor naming another node than the pinned one):
/// counted (`identity_changes` in the status document), and logged at most once per
/// [`REFUSAL_WARN_EVERY`] with the count of those left out.
#[derive(Debug)]
pub struct Refusals {
    count: AtomicU64,
    warned: Mutex<Throttle>,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            count: AtomicU64::new(0),
            warned: Mutex::new(Throttle::new(REFUSAL_WARN_EVERY)),
        }
    }
}

impl Refusals {
    /// One refusal: `Some(left_out)` when its line may be written now.
    pub fn refuse(&self) -> Option<u64> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .event(crate::clock::now().into_std())
    }

    /// Refusals so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Accepts exactly `expected` (or, unpinned, any Ed25519 key whose handshake signature
/// verifies).
struct PinnedKey {
    expected: Option<NodeId>,
    refusals: Arc<Refusals>,
}

impl fmt::Debug for PinnedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedKey")
            .field("pinned", &self.expected.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerCertVerifier for PinnedKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(got) = peer_key(end_entity) else {
            if let Some(left_out) = self.refusals.refuse() {
                warn!(
                    left_out,
                    "a peer's TLS certificate carries no Ed25519 key; refused"
                );
            }
            return Err(rustls::Error::General("no Ed25519 key".into()));
        };
        match &self.expected {
            Some(want) if *want != got => {
                if let Some(left_out) = self.refusals.refuse() {
                    warn!(
                        expected = %Prefix(want),
                        got = %Prefix(&got),
                        left_out,
                        "a peer's TLS key is not the node id pinned to it; refused"
                    );
                }
                Err(rustls::Error::General(
                    "TLS key is not the pinned node id".into(),
                ))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(message, self.expected.or_else(|| peer_key(cert)), dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

/// The server's check of a link's client: a certificate is asked for but not required (a tool
/// may fetch a descriptor without one); one presented must carry an Ed25519 key, and the
/// client's TLS 1.3 `CertificateVerify` must verify with that key: [`LinkPeer`] is then a key
/// the client holds.
#[derive(Debug)]
struct ClientKey;

impl ClientCertVerifier for ClientKey {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        peer_key(end_entity)
            .map(|_| ClientCertVerified::assertion())
            .ok_or_else(|| rustls::Error::General("no Ed25519 key".into()))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        handshake_signature(message, peer_key(cert), dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

/// A TLS 1.3 handshake signature `dss` over `message` checked with `key` (strictly: no weak
/// key, no malleable signature).
fn handshake_signature(
    message: &[u8],
    key: Option<NodeId>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let bad = || rustls::Error::General("bad handshake signature".into());
    if dss.scheme != SignatureScheme::ED25519 {
        return Err(bad());
    }
    let key = VerifyingKey::from_bytes(&key.ok_or_else(bad)?).map_err(|_| bad())?;
    let sig = Signature::from_slice(dss.signature()).map_err(|_| bad())?;
    key.verify_strict(message, &sig).map_err(|_| bad())?;
    Ok(HandshakeSignatureValid::assertion())
}

/// The client TLS configuration that accepts exactly `expected` (see [`PinnedKey`]) and, with
/// `me`, presents this node's identity.
fn client_config(
    expected: Option<NodeId>,
    refusals: Arc<Refusals>,
    me: Option<&(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> rustls::ClientConfig {
    client_config_with(expected, refusals, me, vec![HTTP1.to_vec()])
}

/// [`client_config`] offering `alpn`.
fn client_config_with(
    expected: Option<NodeId>,
    refusals: Arc<Refusals>,
    me: Option<&(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    alpn: Vec<Vec<u8>>,
) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("invariant: the ring provider supports TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedKey { expected, refusals }));
    let mut config = match me {
        Some((cert, key)) => builder
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())
            .expect("invariant: an Ed25519 key of our own certificate is usable"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn;
    config
}

/// A client configuration that accepts any node (any Ed25519 key whose handshake signature
/// verifies) and presents no identity: for a client that does not know which node it reaches
/// and posts no frame (tests, tools).
pub fn unpinned_config() -> rustls::ClientConfig {
    client_config(None, Arc::default(), None)
}

/// [`unpinned_config`] presenting `key`'s identity: the previous hop of every frame it posts
/// (tests, tools acting as a node).
///
/// # Errors
/// [`LinkError`] when the certificate cannot be made.
pub fn unpinned_config_as(key: &SigningKey) -> Result<rustls::ClientConfig, LinkError> {
    Ok(client_config(None, Arc::default(), Some(&identity(key)?)))
}

/// Connect timeout to a peer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pinned clients (one per peer talked to lately, each with its pooled connections) kept at
/// most.
pub const MAX_CLIENTS: usize = 1024;
/// Whole-request timeout of a link's client (each request is also bounded by its deadline).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The bounds of a node's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkLimits {
    /// Idle connections kept per peer: at least the requests one next hop may have in flight
    /// (`--per-next-hop`), so a busy link never closes a connection only to handshake again.
    pub idle_per_peer: usize,
    /// Pinned clients kept at most (one per peer the node talks to, and one unpinned): past
    /// it, the table starts again.
    pub clients: usize,
}

/// The client side of this node's links: a pinned client per peer id, made on first use,
/// each presenting this node's identity.
#[derive(Clone)]
pub struct Links {
    bind: Option<IpAddr>,
    limits: LinkLimits,
    clients: Arc<Mutex<HashMap<Option<NodeId>, reqwest::Client>>>,
    framed: Arc<Framed>,
    refusals: Arc<Refusals>,
    me: Option<Arc<(CertificateDer<'static>, PrivateKeyDer<'static>)>>,
}

/// Counts only.
impl fmt::Debug for Links {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Links")
            .field("refusals", &self.refusals())
            .finish_non_exhaustive()
    }
}

impl Links {
    /// Clients whose connections are made from `bind` when given, within `limits`,
    /// presenting `me`'s identity (none: they cannot post frames); TLS identity refusals are
    /// added to `refusals`.
    pub fn new(
        bind: Option<IpAddr>,
        refusals: Arc<Refusals>,
        limits: LinkLimits,
        me: Option<&SigningKey>,
    ) -> Self {
        Links {
            bind,
            limits: LinkLimits {
                idle_per_peer: limits.idle_per_peer.max(1),
                clients: limits.clients.max(1),
            },
            clients: Arc::new(Mutex::new(HashMap::new())),
            framed: Arc::new(Framed::new(bind, limits.clients)),
            refusals,
            me: me.and_then(|k| identity(k).ok()).map(Arc::new),
        }
    }

    /// Posts `frame` to `next_hop` at `url` (its `/v2/relay`) over its framed link, answered
    /// by `deadline` ([`framed`]): [`Posted::UseHttp`] when the next hop does not speak it (or
    /// this node presents no identity, or the URL is not a relay URL), then [`Links::client`]'s
    /// HTTP it is.
    pub async fn post_framed(
        &self,
        next_hop: &NodeId,
        url: &str,
        frame: &[u8],
        deadline: Instant,
    ) -> Posted {
        let (Some(endpoint), Some(me)) = (framed::endpoint_of(url), self.me.as_deref()) else {
            return Posted::UseHttp;
        };
        let tls = || {
            Arc::new(client_config_with(
                Some(*next_hop),
                Arc::clone(&self.refusals),
                Some(me),
                vec![link::ALPN.to_vec(), HTTP1.to_vec()],
            ))
        };
        self.framed
            .post(next_hop, endpoint, tls, frame, deadline)
            .await
    }

    /// Handshakes refused because the peer's TLS key was not the expected one.
    pub fn refusals(&self) -> u64 {
        self.refusals.count()
    }

    /// The client that talks only to `pinned` (to any Ed25519 key when `None`); connections
    /// are reused while the client lives. The table is bounded: past [`LinkLimits::clients`]
    /// one pinned client (an arbitrary one) makes room.
    pub fn client(&self, pinned: Option<&NodeId>) -> reqwest::Client {
        let mut map = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = pinned.copied();
        if let Some(c) = map.get(&key) {
            return c.clone();
        }
        if map.len() >= self.limits.clients
            && let Some(k) = map.keys().find(|k| k.is_some()).copied()
        {
            // One client makes room (its idle connections closed): the others keep theirs.
            map.remove(&k);
        }
        let c = http_client(
            self.bind,
            client_config(key, Arc::clone(&self.refusals), self.me.as_deref()),
            self.limits.idle_per_peer,
        );
        map.insert(key, c.clone());
        c
    }
}

/// An HTTP client for peers: no proxy, no redirects, bounded timeouts; connections made from
/// `bind` when given; up to `idle` idle connections kept per host; `tls` the link's pinned TLS
/// configuration.
fn http_client(bind: Option<IpAddr>, tls: rustls::ClientConfig, idle: usize) -> reqwest::Client {
    install_provider();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .tls_info(true)
        .https_only(true)
        .no_proxy()
        .local_address(bind)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(idle)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_carries_the_identity_key() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let config = server_config(&key).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8(&key)),
            &rcgen::PKCS_ED25519,
        )
        .unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".to_string()])
            .unwrap()
            .self_signed(&pair)
            .unwrap();
        assert_eq!(peer_key(cert.der()), Some(key.verifying_key().to_bytes()));
        assert_eq!(peer_key(&[0; 64]), None);
    }
}
