//! The framed link (`blindrelay/1`, `proto::link`) on real node processes: many frames in
//! flight on one link, each answered as `POST /v2/relay` would be; the link's bounds (a frame
//! too long, a frame too slow, an idle link); a next hop that speaks only HTTP; a broken link
//! failing its frames at once.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blindrelay::links::{LinkLimits, Links, Posted};
use blindrelay::proto::Descriptor;
use blindrelay::proto::frame::{MAX_FRAME, frame_len};
use blindrelay::proto::link::{ALPN, ANSWER_HEAD, AnswerHead, RequestHead};
use blindrelay::proto::receipt;
use blindrelay::proto::sphinx::SizeClass;
use common::{Net, counter, craft, random_bytes, unix_now};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A framed-link client presenting `key` (a node's client side, as the test's).
fn links(key: &SigningKey) -> Links {
    blindrelay::links::install_provider();
    let limits = LinkLimits {
        idle_per_peer: 1,
        clients: 16,
    };
    Links::new(None, Arc::default(), limits, Some(key))
}

async fn descriptor(net: &Net, i: usize) -> Descriptor {
    serde_json::from_value(net.get_json(i, "/v1/descriptor").await).expect("a descriptor")
}

fn deadline(secs: u64) -> blindrelay::clock::Instant {
    blindrelay::clock::now() + Duration::from_secs(secs)
}

/// Posts `frame` to `to` over the framed link of `links`: status and JSON.
async fn post(links: &Links, to: &Descriptor, frame: &[u8]) -> (u16, Value) {
    let url = format!("{}/v2/relay", to.endpoint);
    match links
        .post_framed(&to.node_id, &url, frame, deadline(15))
        .await
    {
        Posted::Answer(status, body) => {
            assert_eq!(body.len(), 512, "every answer padded to one length");
            (status, serde_json::from_slice(&body).expect("JSON"))
        }
        other => panic!("no answer: {other:?}"),
    }
}

/// Twelve deliveries and four junk frames in flight at once on one link: each answer is its
/// own frame's (every receipt opens with its own sender's key), the junk is refused as over
/// HTTP, and the node made one TLS session for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_in_flight_on_one_link_each_get_their_own_answer() {
    // The test's client is a stranger to the entry node: its share of the admission rate is
    // raised, and so are the forwards in flight to one next hop (all twelve go to node 1),
    // which this does not test.
    let flags = [
        "--probe-interval",
        "0s",
        "--gossip-interval",
        "0s",
        "--admission-per-minute",
        "60000",
        "--per-next-hop",
        "32",
    ];
    let net = Net::start(3, &flags).await;
    let ds = [
        descriptor(&net, 0).await,
        descriptor(&net, 1).await,
        descriptor(&net, 2).await,
    ];
    let path: Vec<&Descriptor> = ds.iter().collect();
    let client = links(&SigningKey::from_bytes(&rand::random()));
    let before = counter(&net.status(0).await, "tls_handshakes");
    let mut posts = Vec::new();
    for i in 0..16u8 {
        let (frame, key, id) = if i % 4 == 3 {
            (random_bytes(frame_len(SizeClass::Small)), None, None)
        } else {
            let w = craft(
                &path,
                &[i; 100],
                false,
                blindrelay::send::wrap::expiry(unix_now()),
            );
            (w.frame, Some(w.receipt_key), Some(w.message_id))
        };
        let (client, to) = (client.clone(), ds[0].clone());
        posts.push(tokio::spawn(async move {
            // A stranger's share of the crypto slots is small: a busy answer is retried, as
            // the forwarder does.
            let mut got = post(&client, &to, &frame).await;
            for _ in 0..500 {
                if got.0 != 429 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                got = post(&client, &to, &frame).await;
            }
            (got, key, id, i)
        }));
    }
    for p in posts {
        let ((status, answer), key, id, i) = p.await.expect("joined");
        match (key, id) {
            (Some(key), Some(id)) => {
                assert_eq!(status, 200, "frame {i}: {answer}");
                let sealed =
                    hex::decode(answer["receipt"].as_str().expect("a receipt")).expect("hex");
                let r = receipt::open(&sealed, &key).expect("its own receipt");
                r.verify(
                    &id,
                    &receipt::commitment(&[i; 100]),
                    &ds[2].node_id,
                    unix_now(),
                )
                .expect("verifies");
            }
            _ => assert_eq!(
                (status, answer["error"].as_str()),
                (400, Some("malformed_envelope")),
                "frame {i}"
            ),
        }
    }
    assert_eq!(net.inbox_ids(2).await.len(), 12);
    let handshakes = counter(&net.status(0).await, "tls_handshakes") - before;
    assert_eq!(handshakes, 1, "one link for every frame");
}

/// A hand-made framed-link client presenting a fresh identity: the raw protocol.
async fn raw_link(to: &str) -> TlsStream<TcpStream> {
    let key = SigningKey::from_bytes(&rand::random());
    let mut config = blindrelay::links::unpinned_config_as(&key).expect("tls");
    config.alpn_protocols = vec![ALPN.to_vec()];
    let addr: SocketAddr = to.trim_start_matches("https://").parse().expect("address");
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(ALPN));
    tls
}

/// The next answer on a raw link: its head and JSON.
async fn read_answer(link: &mut TlsStream<TcpStream>) -> (AnswerHead, Value) {
    let mut head = [0u8; ANSWER_HEAD];
    link.read_exact(&mut head).await.expect("an answer head");
    let head = AnswerHead::decode(&head).expect("a well-formed head");
    let mut body = vec![0u8; head.len];
    link.read_exact(&mut body).await.expect("its body");
    (head, serde_json::from_slice(&body).expect("JSON"))
}

/// Whether the server closed `link` (nothing more to read) within `within`.
async fn closed_within(link: &mut TlsStream<TcpStream>, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, link.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A frame longer than any is refused before it is read, a frame that does not arrive within
/// its deadline is refused when it ends, and a link with nothing to do is closed at the header
/// timeout: each as over HTTP (`413 envelope_too_large`, `408 request_timeout`, counted as timed
/// out), the link closed after the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_is_bounded_as_a_connection_is() {
    let net = Net::start(1, &["--header-timeout", "1s", "--probe-interval", "0s"]).await;
    let endpoint = &net.node(0).endpoint;

    let mut link = raw_link(endpoint).await;
    link.write_all(&RequestHead::encode(5, MAX_FRAME + 1))
        .await
        .unwrap();
    let (head, answer) = read_answer(&mut link).await;
    assert_eq!((head.id, head.status), (5, 413), "{answer}");
    assert_eq!(answer["error"], "envelope_too_large");
    assert!(closed_within(&mut link, Duration::from_secs(2)).await);

    // Half a frame, then nothing: refused at its body deadline (2 s and a bit for 2 610 bytes).
    let mut link = raw_link(endpoint).await;
    let len = frame_len(SizeClass::Small);
    link.write_all(&RequestHead::encode(9, len)).await.unwrap();
    link.write_all(&random_bytes(len / 2)).await.unwrap();
    link.flush().await.unwrap();
    let started = Instant::now();
    let (head, answer) = read_answer(&mut link).await;
    assert_eq!((head.id, head.status), (9, 408), "{answer}");
    assert_eq!(answer["error"], "request_timeout");
    // (The node's deadline started when it read the head, just before this clock.)
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    assert!(closed_within(&mut link, Duration::from_secs(2)).await);

    // Idle: closed at the header timeout, counted as timed out.
    let timed_out = counter(&net.status(0).await, "connections_timed_out");
    let mut link = raw_link(endpoint).await;
    let started = Instant::now();
    assert!(closed_within(&mut link, Duration::from_secs(5)).await);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let end = Instant::now() + common::WAIT;
    while counter(&net.status(0).await, "connections_timed_out") == timed_out {
        assert!(Instant::now() < end, "the idle link was not counted");
        tokio::time::sleep(common::POLL).await;
    }
}

/// A TLS server on a fresh loopback address with `config`, whose every connection `serve`s.
async fn fake_next_hop<F, Fut>(config: Arc<rustls::ServerConfig>, serve: F) -> String
where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = common::fresh_listener(common::RELAY_PORT).await;
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, serve) = (acceptor.clone(), Arc::clone(&serve));
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    serve(tls).await;
                }
            });
        }
    });
    format!("https://{addr}/v2/relay")
}

/// A next hop that chooses HTTP is reached over HTTP (`UseHttp`), and one that breaks its link
/// (a malformed answer, or the stream cut) fails every frame on it at once, not at the
/// frame's deadline: the forwarder's retries take it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_only_and_broken_next_hops() {
    let key = SigningKey::from_bytes(&rand::random());
    let id = key.verifying_key().to_bytes();
    let client = links(&SigningKey::from_bytes(&rand::random()));
    let frame = random_bytes(frame_len(SizeClass::Small));

    let http_only = blindrelay::links::server_config(&key).expect("tls");
    let url = fake_next_hop(http_only, |_tls| async {}).await;
    let got = client.post_framed(&id, &url, &frame, deadline(10)).await;
    assert!(matches!(got, Posted::UseHttp), "{got:?}");

    for answer in [
        // A status no answer has.
        AnswerHead::encode(0, 0, 0).to_vec(),
        // Longer than any answer.
        AnswerHead::encode(0, 200, 1 << 20).to_vec(),
        // Nothing: the stream ends.
        Vec::new(),
    ] {
        let framed = blindrelay::links::node_server_config(&key).expect("tls");
        let url = fake_next_hop(framed, move |mut tls| {
            let answer = answer.clone();
            async move {
                let mut head = [0u8; 8];
                if tls.read_exact(&mut head).await.is_ok() {
                    let _ = tls.write_all(&answer).await;
                    let _ = tls.shutdown().await;
                }
            }
        })
        .await;
        let client = links(&SigningKey::from_bytes(&rand::random()));
        let started = Instant::now();
        let got = client.post_framed(&id, &url, &frame, deadline(10)).await;
        assert!(matches!(got, Posted::Failed("request")), "{got:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}

/// A next hop that accepts connections and never answers the handshake: the requests waiting
/// for its link fail with the one try to make it (within the connect timeout), not one after
/// another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_a_link_fail_with_its_one_try() {
    let listener = common::fresh_listener(common::RELAY_PORT).await;
    let url = format!("https://{}/v2/relay", listener.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            open.push(tcp);
        }
    });
    let client = links(&SigningKey::from_bytes(&rand::random()));
    let id = [9u8; 32];
    let started = Instant::now();
    let posts: Vec<_> = (0..4)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let frame = random_bytes(frame_len(SizeClass::Small));
                client.post_framed(&id, &url, &frame, deadline(20)).await
            })
        })
        .collect();
    for p in posts {
        let got = p.await.expect("joined");
        assert!(matches!(got, Posted::Failed("connect")), "{got:?}");
    }
    let took = started.elapsed();
    assert!(
        took < blindrelay::links::CONNECT_TIMEOUT * 2,
        "{took:?}: each waited for a try of its own"
    );
    held.abort();
}
