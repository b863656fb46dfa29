//! A message sent again over another route, in process: the terminal stores it once whichever
//! routes carry it and answers every copy with the first copy's receipt; and a route whose
//! answer was lost after the terminal stored the message is tried again by the sender, which
//! verifies the delivery from the copy's answer.

use blindrelay::proto::descriptor::Descriptor;
use blindrelay::proto::receipt::{self, ReceiptError};
use blindrelay::send::Hop;
use blindrelay::send::wrap::{Wrapped, expiry, wrap_message};
use ed25519_dalek::SigningKey;
use tokio::net::TcpListener;

use crate::common::inproc::*;

fn hop(n: &Node) -> Hop {
    Hop {
        node_id: *n.ctx.node.id(),
        onion_key: n.ctx.node.onion_public(),
    }
}

/// The receipt in `reply`, opened with `w`'s key and checked against `payload` at `t`.
fn receipt_of(
    reply: &Reply,
    w: &Wrapped,
    payload: &[u8],
    t: &Node,
) -> Result<receipt::Receipt, ReceiptError> {
    let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let sealed = hex::decode(v["receipt"].as_str().expect("a receipt")).unwrap();
    let r = receipt::open(&sealed, &w.receipt_key)?;
    let now = t.ctx.clock.unix();
    r.verify(
        &w.message_id,
        &receipt::commitment(payload),
        t.ctx.node.id(),
        now,
    )?;
    Ok(r)
}

#[tokio::test(start_paused = true)]
async fn a_message_over_two_routes_is_stored_once_and_both_copies_get_its_receipt() {
    let clock = clock();
    let (b, t) = (node(&clock, |_| {}).await, node(&clock, |_| {}).await);
    introduce(&b, &t);
    let sender = SigningKey::from_bytes(&rand::random());
    let (message, payload) = (rand::random(), b"one message, two routes");
    let exp = expiry(clock.unix());
    let via_b = wrap_message(&[hop(&b), hop(&t)], payload, false, message, exp).unwrap();
    let direct = wrap_message(&[hop(&t)], payload, false, message, exp).unwrap();
    let first = submit(&b, Posted::by(&sender, via_b.frame.clone())).await;
    assert_eq!(first.status, 200, "{}", reason(&first));
    let again = submit(&t, Posted::by(&sender, direct.frame.clone())).await;
    assert_eq!(again.status, 200, "{}", reason(&again));
    let (r1, r2) = (
        receipt_of(&first, &via_b, payload, &t).expect("the first copy's receipt"),
        receipt_of(&again, &direct, payload, &t).expect("the second copy's receipt"),
    );
    assert_eq!(r1, r2, "the copy is answered with the first copy's receipt");
    assert_ne!(first.body, again.body, "sealed afresh for each copy");
    assert_eq!(t.relay.terminal().inbox().len(), 1);
    let c = t.ctx.counters.snapshot();
    assert_eq!((c.terminal, c.duplicate_message), (1, 1));
    // The same id for another payload: nothing stored, and the receipt names the first one.
    let other = wrap_message(&[hop(&t)], b"another", false, message, exp).unwrap();
    let reply = submit(&t, Posted::by(&sender, other.frame.clone())).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        receipt_of(&reply, &other, b"another", &t),
        Err(ReceiptError::WrongPayload)
    );
    assert_eq!(t.relay.terminal().inbox().len(), 1);
}

/// Node `f`'s link behind a proxy that passes every request on to `f` on a link of `client`'s
/// (so the route runs to the terminal), then loses `f`'s answer: the previous hop gets `502
/// forward_failed` with no failure report.
async fn lossy(f: &Node, client: &SigningKey) -> Descriptor {
    let listener = TcpListener::bind((fresh_ip(), 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = format!("https://{}/v2/relay", f.addr);
    let http = tls_http_as(client);
    let app = axum::Router::new().route(
        "/v2/relay",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (upstream, http) = (upstream.clone(), http.clone());
            async move {
                let _ = http.post(upstream).body(body).send().await;
                (
                    axum::http::StatusCode::BAD_GATEWAY,
                    r#"{"error":"forward_failed"}"#,
                )
            }
        }),
    );
    serve_tls(listener, app, f.ctx.node.signing_key());
    Descriptor::sign(
        f.ctx.node.signing_key(),
        f.ctx.node.onion_public(),
        format!("https://{addr}"),
        f.ctx.clock.unix(),
        3600,
    )
}

#[tokio::test(start_paused = true)]
async fn a_route_whose_answer_is_lost_is_tried_again_and_the_message_stored_once() {
    let clock = clock();
    let a = node(&clock, |_| {}).await;
    let (f, b, t) = (
        node(&clock, |_| {}).await,
        node(&clock, |_| {}).await,
        node(&clock, |_| {}).await,
    );
    for (x, y) in [(&a, &b), (&a, &t), (&b, &t), (&f, &t)] {
        introduce(x, y);
    }
    assert!(
        a.ctx
            .peers
            .insert(lossy(&f, a.ctx.node.signing_key()).await)
    );
    // A's middle is f or b, a block each: until a send went through f first.
    let mut sends = 0;
    let mut rerouted = 0;
    while rerouted == 0 {
        assert!(
            sends < 40,
            "no route through the lossy middle in {sends} sends"
        );
        sends += 1;
        let payload = format!("message {sends}").into_bytes();
        let d = blindrelay::send::send(&a.ctx, *t.ctx.node.id(), 2, payload)
            .await
            .expect("delivered");
        if d.routes > 1 {
            assert_eq!(d.routes, 2);
            rerouted += 1;
        }
    }
    assert_eq!(
        t.relay.terminal().inbox().len(),
        sends,
        "each message stored once"
    );
    let c = t.ctx.counters.snapshot();
    assert_eq!((c.terminal, c.duplicate_message), (sends as u64, 1));
    let s = a.ctx.counters.snapshot();
    assert_eq!(
        (s.verified_client_onion_deliveries, s.send_rerouted),
        (sends as u64, 1)
    );
}
