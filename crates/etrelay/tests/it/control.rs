//! The multi-server daemon (a real process) and its control API: registration with proof,
//! sessions, bans, takeover, races, restarts after kill -9, metrics, and bad input.

use crate::common;

use std::time::Duration;

use common::daemon::{Daemon, TOKEN, new_key, ports};
use common::*;
use etrelay::proof::fingerprint;
use etrelay_testkit::player::Dialect;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, udp, unique_ip};
use reqwest::Method;
use serde_json::json;

const S: Duration = Duration::from_secs(1);

/// A scripted ET server showing the proof of `key`.
fn proven_server(key: &str) -> FakeEtServer {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    et.set_cvar("etrelay_proof", &fingerprint(key));
    et
}

fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[tokio::test]
async fn register_relay_ban_unban_leave() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(3), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["port"], 27960);
    assert_eq!(body["upstream"], et.addr().to_string());
    let public = d.public(27960);

    // The server's own view, with its key.
    let (status, me) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(me["port"], 27960);
    assert_eq!(me["relaying"], true);

    // A player connects through the public port.
    let joined = joined(public, 4321, Dialect::Et).await;
    let (_, sessions) = d.call(Method::GET, "/sessions", &key, None).await;
    let list = sessions["sessions"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["client"], joined.local_addr().unwrap().to_string());
    let player = client_on(ip_of(&joined)).await;
    // The port the game server sees the player as.
    let seen = et
        .received()
        .iter()
        .find(|r| r.packet.ends_with(b"getchallenge"))
        .unwrap()
        .from;
    assert_eq!(list[0]["upstream_port"], seen.port());

    // A ban cuts the player off at once.
    let ip = player.local_addr().unwrap().ip().to_string();
    let (status, ban) = d
        .call(
            Method::PUT,
            &format!("/bans/{ip}"),
            &key,
            Some(json!({"reason": "wallhack", "duration_secs": 3600})),
        )
        .await;
    assert_eq!(status, 200, "{ban}");
    assert_eq!(ban["reason"], "wallhack");
    assert!(ban["expires_at"].as_u64().unwrap() > ban["since"].as_u64().unwrap());
    let (_, sessions) = d.call(Method::GET, "/sessions", &key, None).await;
    assert!(sessions["sessions"].as_array().unwrap().is_empty());
    assert!(
        ask(&player, public, &udp::oob(b"getchallenge"))
            .await
            .is_empty()
    );
    assert!(
        ask(&player, public, &udp::oob(b"getinfo x"))
            .await
            .is_empty()
    );
    let (_, bans) = d.call(Method::GET, "/bans", &key, None).await;
    assert_eq!(bans["bans"][0]["ip"], ip);
    assert!(dir.path().join("state/bans-27960.db").exists());

    // Unban: back in.
    let (status, _) = d
        .call(Method::DELETE, &format!("/bans/{ip}"), &key, None)
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        ask(&player, public, &udp::oob(b"getchallenge")).await.len(),
        1
    );
    let (status, body) = d
        .call(Method::DELETE, &format!("/bans/{ip}"), &key, None)
        .await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));

    // Leave: the key is forgotten and the port freed for another server.
    let (status, _) = d.call(Method::DELETE, "/server", &key, None).await;
    assert_eq!(status, 204);
    let (status, body) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("unauthorized"))
    );
    assert!(
        ask(&player, public, &udp::oob(b"getchallenge"))
            .await
            .is_empty()
    );
    assert!(!dir.path().join("state/bans-27960.db").exists());
    let other_key = new_key();
    let other = proven_server(&other_key);
    let (status, body) = d.register(&other_key, other.addr(), Some(27960)).await;
    assert_eq!(status, 201, "{body}");
    d.stop().await;
}

#[tokio::test]
async fn proof_is_required() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(2), &[]).await;
    let key = new_key();
    // No cvar at all.
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("proof_failed"))
    );
    // Another key's fingerprint.
    et.set_cvar("etrelay_proof", &fingerprint(&new_key()));
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("proof_failed"))
    );
    // A server that does not answer.
    et.set_cvar("etrelay_proof", &fingerprint(&key));
    et.set_answering(false);
    let (status, body) = d.register(&key, et.addr(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("proof_failed"))
    );
    // Nothing was registered.
    let (status, _) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(status, 401);
    et.set_answering(true);
    let (status, _) = d.register(&key, et.addr(), None).await;
    assert_eq!(status, 201);
    d.stop().await;
}

#[tokio::test]
async fn a_taken_port_is_refused_and_takeover_moves_ownership() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(3), &[]).await;
    let (ka, kb) = (new_key(), new_key());
    let (a, b) = (proven_server(&ka), proven_server(&kb));
    assert_eq!(d.register(&ka, a.addr(), Some(27961)).await.0, 201);
    let (status, body) = d.register(&kb, b.addr(), Some(27961)).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("port_taken")));
    // The first one is untouched.
    let (status, me) = d.call(Method::GET, "/server", &ka, None).await;
    assert_eq!(
        (status, me["upstream"].as_str()),
        (200, Some(a.addr().to_string().as_str()))
    );
    assert_eq!(d.call(Method::GET, "/server", &kb, None).await.0, 401);

    // A ban, then a takeover of server A by a new key on the same port.
    let player = client().await;
    let ip = player.local_addr().unwrap().ip().to_string();
    assert_eq!(
        d.call(Method::PUT, &format!("/bans/{ip}"), &ka, None)
            .await
            .0,
        200
    );
    let ka2 = new_key();
    a.set_cvar("etrelay_proof", &fingerprint(&ka2));
    let (status, body) = d.register(&ka2, a.addr(), None).await;
    assert_eq!(
        (status, body["port"].as_u64()),
        (200, Some(27961)),
        "{body}"
    );
    assert_eq!(
        d.call(Method::GET, "/server", &ka, None).await.0,
        401,
        "the former key is refused"
    );
    let (status, bans) = d.call(Method::GET, "/bans", &ka2, None).await;
    assert_eq!(status, 200);
    assert_eq!(bans["bans"][0]["ip"], ip, "bans go on");
    d.stop().await;
}

#[tokio::test]
async fn takeover_on_another_port_frees_the_former_one_with_a_flatline() {
    let dir = state_dir();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let m = master.addr().to_string();
    let d = Daemon::start(&dir.path().join("state"), &ports(3), &["--masters", &m]).await;
    let k1 = new_key();
    let et = proven_server(&k1);
    assert_eq!(d.register(&k1, et.addr(), Some(27960)).await.0, 201);
    assert!(master.wait_listed(d.public(27960), 10 * S).await);
    assert_eq!(
        d.call(
            Method::PUT,
            "/bans/192.0.2.7",
            &k1,
            Some(json!({"reason": "x"}))
        )
        .await
        .0,
        200
    );
    let k2 = new_key();
    et.set_cvar("etrelay_proof", &fingerprint(&k2));
    let (status, body) = d.register(&k2, et.addr(), Some(27962)).await;
    assert_eq!(
        (status, body["port"].as_u64()),
        (200, Some(27962)),
        "{body}"
    );
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![d.public(27960)]
    );
    assert!(master.wait_listed(d.public(27962), 10 * S).await);
    let (_, bans) = d.call(Method::GET, "/bans", &k2, None).await;
    assert_eq!(
        bans["bans"][0]["ip"], "192.0.2.7",
        "bans move with the server"
    );
    // Port 27960 is free again.
    let k3 = new_key();
    let other = proven_server(&k3);
    assert_eq!(d.register(&k3, other.addr(), None).await.1["port"], 27960);
    d.stop().await;
}

#[tokio::test]
async fn two_tools_racing_for_one_port_one_wins() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(2), &[]).await;
    let (ka, kb) = (new_key(), new_key());
    let (a, b) = (proven_server(&ka), proven_server(&kb));
    let (ra, rb) = tokio::join!(
        d.register(&ka, a.addr(), Some(27961)),
        d.register(&kb, b.addr(), Some(27961))
    );
    let mut statuses = [ra.0, rb.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409], "{ra:?} {rb:?}");
    let winner = if ra.0 == 201 { &ka } else { &kb };
    let loser = if ra.0 == 201 { &kb } else { &ka };
    assert_eq!(d.call(Method::GET, "/server", winner, None).await.0, 200);
    assert_eq!(d.call(Method::GET, "/server", loser, None).await.0, 401);
    let saved = std::fs::read_to_string(dir.path().join("state/servers.json")).unwrap();
    assert_eq!(saved.matches("\"port\"").count(), 1, "{saved}");
    d.stop().await;
}

#[tokio::test]
async fn servers_and_bans_survive_kill_9_and_a_wiped_state_forgets_keys() {
    let dir = state_dir();
    let state = dir.path().join("state");
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), Some(27961)).await.0, 201);
    let (banned, ok) = (client().await, client().await);
    let bip = banned.local_addr().unwrap().ip().to_string();
    assert_eq!(
        d.call(
            Method::PUT,
            &format!("/bans/{bip}"),
            &key,
            Some(json!({"reason": "cheat"}))
        )
        .await
        .0,
        200
    );
    d.kill9().await;

    // Restarted on the same state: relayed again, with its bans.
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let (status, me) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!((status, me["port"].as_u64()), (200, Some(27961)));
    let public = d.public(27961);
    assert_eq!(ask(&ok, public, &udp::oob(b"getchallenge")).await.len(), 1);
    assert!(
        ask(&banned, public, &udp::oob(b"getchallenge"))
            .await
            .is_empty()
    );
    let (_, bans) = d.call(Method::GET, "/bans", &key, None).await;
    assert_eq!(bans["bans"][0]["reason"], "cheat");
    d.kill9().await;

    // A relay that lost its state knows no key.
    std::fs::remove_dir_all(&state).unwrap();
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let (status, body) = d.call(Method::GET, "/server", &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("unauthorized"))
    );
    assert!(
        ask(&ok, public, &udp::oob(b"getchallenge"))
            .await
            .is_empty()
    );
    d.stop().await;
}

#[tokio::test]
async fn metrics_need_the_relay_token_and_hold_aggregates_only() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(2), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), None).await.0, 201);
    let player = client().await;
    player
        .send_to(&udp::oob(b"rcon secret quit"), d.public(27960))
        .await
        .unwrap();
    assert_eq!(
        ask(&player, d.public(27960), &udp::oob(b"getchallenge"))
            .await
            .len(),
        1
    );
    // A session: a client that joined.
    let _joined = joined(d.public(27960), 4321, Dialect::Et).await;
    assert_eq!(
        d.http.get(d.url("/metrics")).send().await.unwrap().status(),
        401
    );
    assert_eq!(
        d.http
            .get(d.url("/metrics"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let text = d
        .http
        .get(d.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("etrelay_servers_registered 1\n"), "{text}");
    assert!(
        text.contains("etrelay_dropped_packets_total{port=\"27960\",reason=\"rcon\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("etrelay_sessions_open{port=\"27960\"} 1\n"),
        "{text}"
    );
    let pip = player.local_addr().unwrap().ip().to_string();
    assert!(
        !text.contains(&pip) && !text.contains(&et.addr().ip().to_string()),
        "an address in the metrics"
    );
    d.stop().await;
}

#[tokio::test]
async fn the_control_address_is_bound_again_until_it_works() {
    let dir = state_dir();
    let ip = unique_ip();
    // Something else holds the control address for now.
    let squatter = std::net::TcpListener::bind((ip, 0)).unwrap();
    let addr = squatter.local_addr().unwrap();
    let state = dir.path().join("state");
    let launch = Daemon::launch(ip, &state, &ports(1), &addr.to_string(), &[]);
    // The daemon keeps relaying meanwhile; once the address is free, the API comes up (the
    // retry period is 10 s).
    wait_for_line(
        &launch.log,
        |l| l.contains("cannot bind").then_some(()),
        10 * S,
        "the first bind failure",
    )
    .await;
    drop(squatter);
    let d = launch.ready(20 * S).await;
    assert_eq!(d.control, addr);
    assert!(d.logged("cannot bind"), "{}", d.log_text());
    d.stop().await;
}

#[tokio::test]
async fn a_short_or_missing_token_stops_the_start() {
    let dir = state_dir();
    let token = dir.path().join("token");
    std::fs::write(&token, "too-short").unwrap();
    let t = token.display().to_string();
    let s = dir.path().display().to_string();
    for args in [
        vec![
            "--ports",
            "27960",
            "--control",
            "127.0.0.1:0",
            "--token-file",
            &t,
            "--state-dir",
            &s,
            "--masters",
            "",
        ],
        vec![
            "--ports",
            "27960",
            "--control",
            "127.0.0.1:0",
            "--state-dir",
            &s,
            "--masters",
            "",
        ],
    ] {
        let out = std::process::Command::new(common::daemon::BIN)
            .args(&args)
            .env_remove("ETRELAY_TOKEN")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("token"), "{err}");
    }
}

#[tokio::test]
async fn ipv6_bans_and_bans_that_expire() {
    let dir = state_dir();
    let d = Daemon::start(&dir.path().join("state"), &ports(1), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), None).await.0, 201);
    let (status, ban) = d
        .call(
            Method::PUT,
            "/bans/2001:db8::7",
            &key,
            Some(json!({"reason": "v6"})),
        )
        .await;
    assert_eq!((status, ban["ip"].as_str()), (200, Some("2001:db8::7")));
    assert_eq!(ban["expires_at"], serde_json::Value::Null);
    // An IPv4-mapped address is the IPv4 address.
    let (status, ban) = d
        .call(Method::PUT, "/bans/::ffff:192.0.2.5", &key, None)
        .await;
    assert_eq!((status, ban["ip"].as_str()), (200, Some("192.0.2.5")));

    // A one-second ban of a real client lets it back by itself.
    let player = client().await;
    let ip = player.local_addr().unwrap().ip().to_string();
    let public = d.public(27960);
    assert_eq!(
        d.call(
            Method::PUT,
            &format!("/bans/{ip}"),
            &key,
            Some(json!({"duration_secs": 1}))
        )
        .await
        .0,
        200
    );
    assert!(
        ask(&player, public, &udp::oob(b"getchallenge"))
            .await
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        ask(&player, public, &udp::oob(b"getchallenge")).await.len(),
        1
    );
    let (_, bans) = d.call(Method::GET, "/bans", &key, None).await;
    let listed: Vec<_> = bans["bans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["ip"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed.len(), 2, "the expired ban is forgotten: {listed:?}");
    assert!(!listed.contains(&ip));
    d.stop().await;
}

#[tokio::test]
async fn kill_9_in_the_middle_of_writes_leaves_a_whole_state() {
    let dir = state_dir();
    let state = dir.path().join("state");
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &ports(1), &[]).await;
    let key = new_key();
    let et = proven_server(&key);
    assert_eq!(d.register(&key, et.addr(), None).await.0, 201);
    // Bans one after another, and a kill -9 somewhere in the middle of them (once some are
    // done).
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = {
        let (http, url, key) = (d.http.clone(), d.url(""), key.clone());
        let answered = std::sync::Arc::clone(&answered);
        tokio::spawn(async move {
            let mut done = 0u32;
            for i in 0..400u32 {
                let ok = http
                    .put(format!("{url}/bans/198.51.100.{}", i % 250))
                    .bearer_auth(&key)
                    .json(&json!({"reason": format!("r{i}")}))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                if !ok {
                    break;
                }
                done += 1;
                answered.store(done, std::sync::atomic::Ordering::Relaxed);
            }
            done
        })
    };
    assert!(
        eventually(30 * S, || answered
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 20)
        .await,
        "the bans are being written"
    );
    d.kill9().await;
    let done = writer.await.unwrap();
    assert!(
        done > 0 && done < 400,
        "the kill came in the middle ({done} bans done)"
    );
    // servers.json is whole JSON (the ban store is SQLite's to keep whole), and the relay
    // starts on it with the server and its bans.
    {
        let f = state.join("servers.json");
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{} is broken: {text}",
            f.display()
        );
    }
    let d = Daemon::start_on(ip, &state, &ports(1), &[]).await;
    let (status, bans) = d.call(Method::GET, "/bans", &key, None).await;
    assert_eq!(status, 200);
    let n = bans["bans"].as_array().unwrap().len() as u32;
    // Every ban answered 200 was saved before the answer; at most the one in flight is extra.
    assert!(
        n >= done.min(250) && n <= (done + 1).min(250),
        "{n} bans after {done} answered"
    );
    d.stop().await;
}

/// SIGHUP reads the token file again: the new token is taken, the old one refused, and the
/// daemon goes on (a short token in the file keeps the one in use, with a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_token_file_again() {
    let dir = state_dir();
    let state = dir.path().join("state");
    let d = Daemon::start(&state, &ports(1), &[]).await;
    let hup = || {
        let pid = d.child.id().expect("running").to_string();
        assert!(
            std::process::Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    let wait_log = |needle: &'static str| {
        let d = &d;
        async move {
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while !d.logged(needle) {
                assert!(std::time::Instant::now() < end, "{}", d.log_text());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let new = "another-relay-token-0123456789abcdef-0123";
    let token_file = state.with_extension("token");
    std::fs::write(&token_file, "short").unwrap();
    hup();
    wait_log("the relay token in use is kept").await;
    assert_eq!(d.call(Method::GET, "/metrics", TOKEN, None).await.0, 200);
    std::fs::write(&token_file, new).unwrap();
    hup();
    wait_log("reload: new relay token").await;
    assert_eq!(d.call(Method::GET, "/metrics", TOKEN, None).await.0, 401);
    assert_eq!(d.call(Method::GET, "/metrics", new, None).await.0, 200);
}
