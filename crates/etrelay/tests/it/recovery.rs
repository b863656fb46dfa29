//! The daemon recovers by itself (real processes, real ports): a public port another process
//! held at start is bound again once freed, without a restart, or at once when its server
//! registers again on it; moving off such a port carries its bans; one key owns one server.

use crate::common;

use std::net::{Ipv4Addr, UdpSocket as StdUdp};
use std::path::Path;
use std::time::{Duration, Instant};

use common::daemon::{BIN, Daemon, new_key, ports};
use common::*;
use etrelay::config::BIND_RETRY;
use etrelay::proof::fingerprint;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, udp, unique_ip};
use reqwest::Method;
use serde_json::json;

const S: Duration = Duration::from_secs(1);

fn proven_server(key: &str) -> FakeEtServer {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_cvar("etrelay_proof", &fingerprint(key));
    et
}

/// A server registered on 27960 with one banned client; the relay is then restarted while
/// another process holds 27960. Returns the relay, the squatter, the key, the game server, the
/// banned client and an honest one.
struct Held {
    d: Daemon,
    squatter: Option<StdUdp>,
    key: String,
    et: FakeEtServer,
    banned: tokio::net::UdpSocket,
    honest: tokio::net::UdpSocket,
}

async fn restarted_with_the_port_held(ip: Ipv4Addr, state: &Path) -> Held {
    let d = Daemon::start_on(ip, state, &ports(2), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), Some(27960)).await.0, 201);
    let (banned, honest) = (client().await, client().await);
    let bip = banned.local_addr().unwrap().ip().to_string();
    let path = format!("/bans/{bip}");
    let ban = Some(json!({"reason": "cheat"}));
    assert_eq!(d.call(Method::PUT, &path, &key, ban).await.0, 200);
    d.stop().await;

    let squatter = StdUdp::bind((ip, 27960)).unwrap();
    let d = Daemon::start_on(ip, state, &ports(2), &[]).await;
    let (status, me) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(me["relaying"], false, "{me}");
    assert_eq!(me["bind"]["state"], "retrying", "{me}");
    assert_eq!(me["bind"]["attempts"], 1, "{me}");
    let err = me["bind"]["last_error"].as_str().unwrap();
    assert!(err.contains("in use"), "{me}");
    let (next, last) = (
        &me["bind"]["next_attempt_at"],
        &me["bind"]["last_attempt_at"],
    );
    assert_eq!(
        next.as_u64().unwrap() - last.as_u64().unwrap(),
        BIND_RETRY.as_secs()
    );
    let (status, body) = d.call(Method::GET, "/sessions", &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("not_relaying"))
    );
    Held {
        d,
        squatter: Some(squatter),
        key,
        et,
        banned,
        honest,
    }
}

/// The relay answers `honest` and not `banned` on `port`.
async fn relays_with_its_ban(h: &Held, port: u16) {
    let public = h.d.public(port);
    let r = ask(&h.honest, public, &udp::oob(b"getchallenge")).await;
    assert_eq!(r.len(), 1, "{}", h.d.log_text());
    let r = ask(&h.banned, public, &udp::oob(b"getchallenge")).await;
    assert!(r.is_empty(), "the ban survived");
}

#[tokio::test]
async fn a_port_held_at_start_is_bound_once_freed_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let h = restarted_with_the_port_held(unique_ip(), &state).await;
    assert!(h.d.logged("the port is tried again"), "{}", h.d.log_text());

    // `etrelay admin status` says what is happening.
    let key_file = dir.path().join("server.key");
    std::fs::write(&key_file, &h.key).unwrap();
    let out = tokio::process::Command::new(BIN)
        .args([
            "admin",
            "status",
            "--control",
            &h.d.control.to_string(),
            "--key-file",
        ])
        .arg(&key_file)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("not relayed: cannot bind port 27960"),
        "{text}"
    );
    assert!(text.contains("retrying: 1 failed attempt(s)"), "{text}");

    let mut h = h;
    drop(h.squatter.take());
    let freed = Instant::now();
    wait_for_line(
        &h.d.log,
        |l| l.contains("port bound after").then_some(()),
        BIND_RETRY + 5 * S,
        "the port bound again",
    )
    .await;
    let took = freed.elapsed();
    relays_with_its_ban(&h, 27960).await;
    let (_, me) = h.d.call(Method::GET, "/server", &h.key, None).await;
    assert_eq!(
        (&me["relaying"], &me["bind"]["state"]),
        (&json!(true), &json!("bound"))
    );
    println!(
        "FIGURE bind retry: port freed -> relayed in {} ms (retry period {} s)",
        took.as_millis(),
        BIND_RETRY.as_secs()
    );
    h.d.stop().await;
}

#[tokio::test]
async fn registering_again_on_the_same_port_binds_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = restarted_with_the_port_held(unique_ip(), &dir.path().join("state")).await;
    // Still held: the registration (a takeover) is saved, the port tried again and still
    // refused.
    let k2 = new_key();
    h.et.set_cvar("etrelay_proof", &fingerprint(&k2));
    let (status, body) = h.d.register(&k2, h.et.addr(), None).await;
    assert_eq!((status, &body["relaying"]), (200, &json!(false)), "{body}");
    assert_eq!(body["bind"]["attempts"], 2, "{body}");
    // Freed: registering again binds it at once, well before the next retry.
    drop(h.squatter.take());
    let freed = Instant::now();
    let k3 = new_key();
    h.et.set_cvar("etrelay_proof", &fingerprint(&k3));
    let (status, body) = h.d.register(&k3, h.et.addr(), None).await;
    let took = freed.elapsed();
    assert_eq!((status, &body["relaying"]), (200, &json!(true)), "{body}");
    assert_eq!(body["bind"]["state"], "bound", "{body}");
    assert!(took < BIND_RETRY, "{took:?}");
    assert!(
        h.d.logged("port bound at its registration"),
        "{}",
        h.d.log_text()
    );
    assert!(!h.d.logged("port bound after"), "{}", h.d.log_text());
    h.key = k3;
    relays_with_its_ban(&h, 27960).await;
    println!(
        "FIGURE bind at re-registration: port freed -> relayed in {} ms (proof included)",
        took.as_millis()
    );
    h.d.stop().await;
}

#[tokio::test]
async fn moving_off_a_port_that_could_not_be_bound_carries_its_bans() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut h = restarted_with_the_port_held(unique_ip(), &state).await;
    let k2 = new_key();
    h.et.set_cvar("etrelay_proof", &fingerprint(&k2));
    let (status, body) = h.d.register(&k2, h.et.addr(), Some(27961)).await;
    assert_eq!(
        (status, body["port"].as_u64(), &body["relaying"]),
        (200, Some(27961), &json!(true)),
        "{body}"
    );
    let (_, bans) = h.d.call(Method::GET, "/bans", &k2, None).await;
    assert_eq!(bans["bans"][0]["reason"], "cheat", "{bans}");
    relays_with_its_ban(&h, 27961).await;
    assert!(
        !state.join("bans-27960.db").exists(),
        "the former store is removed"
    );
    // Nothing tries 27960 any more.
    drop(h.squatter.take());
    h.d.stop().await;
}

#[tokio::test]
async fn a_key_owns_one_server() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let d = Daemon::start(&state, &ports(3), &[]).await;
    let key = new_key();
    let (a, b) = (proven_server(&key), proven_server(&key));
    assert_eq!(d.register(&key, a.addr(), None).await.0, 201);
    let before = std::fs::read_to_string(state.join("servers.json")).unwrap();
    let (status, body) = d.register(&key, b.addr(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("key_in_use")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("27960"),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("servers.json")).unwrap(),
        before,
        "nothing changed"
    );
    // Its own server again with the same key: a takeover, allowed.
    assert_eq!(d.register(&key, a.addr(), None).await.0, 200);
    // With a key of its own, the second server registers.
    let k2 = new_key();
    b.set_cvar("etrelay_proof", &fingerprint(&k2));
    assert_eq!(d.register(&k2, b.addr(), None).await.0, 201);
    let (_, me) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(me["upstream"], a.addr().to_string());
    let (_, me) = d.call(Method::GET, "/server", &k2, None).await;
    assert_eq!(me["upstream"], b.addr().to_string());
    d.stop().await;
}
