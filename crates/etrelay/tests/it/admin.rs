//! The admin tool against a real OpenArena server (real rcon and `sets`) behind the real
//! daemon: register with proof, quakestat through the public port, sessions mapping a real
//! client, a ban cutting it off, unban, leave.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::daemon::{BIN, Daemon, ports};
use common::*;
use etrelay_testkit::player::Dialect;
use etrelay_testkit::{OpenArena, qstat, udp, unique_ip};

/// Runs `etrelay admin <args>`; returns success, stdout and stderr.
async fn admin(args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(BIN)
            .arg("admin")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("admin command within 30 s")
    .expect("run etrelay admin");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn register_openarena_then_sessions_ban_unban_leave() {
    OpenArena::require();
    qstat::require();
    let oa = OpenArena::start(unique_ip(), "secret").expect("start OpenArena");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let d = Daemon::start(&state, &ports(2), &["--game", "q3"]).await;
    let token_file = state.with_extension("token");
    let pw_file = dir.path().join("rcon.pw");
    std::fs::write(&pw_file, "secret\n").unwrap();
    let key_file = dir.path().join("server.key");
    let control = format!("http://{}", d.control);
    let (oa_addr, ctl, kf) = (oa.addr().to_string(), control.as_str(), s(&key_file));
    let common = ["--control", ctl, "--key-file", kf.as_str()];

    // Register: the key is created, the proof shown through real rcon, then cleared.
    let (ok, out, err) = admin(&[
        "register",
        "--control",
        ctl,
        "--token-file",
        &s(&token_file),
        "--upstream",
        &oa_addr,
        "--rcon",
        &oa_addr,
        "--rcon-password-file",
        &s(&pw_file),
        "--key-file",
        &kf,
    ])
    .await;
    assert!(ok, "register failed: {out}{err}\n{}", d.log_text());
    assert!(out.contains("(new)"), "{out}");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(key.len() >= 32);
    let checker = client().await;
    let status = ask(&checker, oa.addr(), &udp::oob(b"getstatus c")).await;
    assert_eq!(
        info_value(&status[0].1, "etrelay_proof"),
        None,
        "the proof was cleared"
    );

    // A real browser through the public port.
    let public = d.public(27960);
    let v = qstat::query_json("q3s", public).await.unwrap();
    assert_eq!(v["status"], "online", "{v}");
    assert_eq!(v["name"], "etrelay-test");

    // A client's session, mapped to the port the server sees.
    let probe = client().await;
    let r = ask(&probe, public, &udp::oob(b"getchallenge 123 Quake3Arena")).await;
    assert_eq!(r.len(), 1, "{}", d.log_text());
    assert!(r[0].1.starts_with(b"\xff\xff\xff\xffchallengeResponse "));
    let joined = joined(public, 4321, Dialect::openarena()).await;
    let player = client_on(ip_of(&joined)).await;
    let (ok, out, err) = admin(&[
        "sessions", "--json", common[0], common[1], common[2], common[3],
    ])
    .await;
    assert!(ok, "{err}");
    let sessions: serde_json::Value = serde_json::from_str(&out).unwrap();
    let me = joined.local_addr().unwrap().to_string();
    assert!(
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["client"] == me),
        "{out}"
    );
    let (ok, table, _) = admin(&["sessions", common[0], common[1], common[2], common[3]]).await;
    assert!(ok && table.contains(&me), "{table}");

    // A ban cuts the client off; unban lets it back.
    let ip = player.local_addr().unwrap().ip().to_string();
    let (ok, out, err) = admin(&[
        "ban",
        &ip,
        "--reason",
        "aimbot",
        "--duration",
        "1h",
        common[0],
        common[1],
        common[2],
        common[3],
    ])
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        ask(&player, public, &udp::oob(b"getchallenge 124 Quake3Arena"))
            .await
            .is_empty()
    );
    let (ok, out, _) = admin(&["bans", common[0], common[1], common[2], common[3]]).await;
    assert!(ok && out.contains(&ip) && out.contains("aimbot"), "{out}");
    let (ok, _, err) = admin(&["unban", &ip, common[0], common[1], common[2], common[3]]).await;
    assert!(ok, "{err}");
    assert_eq!(
        ask(&player, public, &udp::oob(b"getchallenge 125 Quake3Arena"))
            .await
            .len(),
        1
    );

    // Status, then leave: the key is refused afterwards, with a clear message.
    let (ok, out, _) = admin(&["status", common[0], common[1], common[2], common[3]]).await;
    assert!(ok && out.contains("27960"), "{out}");
    let (ok, _, err) = admin(&["leave", common[0], common[1], common[2], common[3]]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = admin(&["status", common[0], common[1], common[2], common[3]]).await;
    assert!(!ok);
    assert!(err.contains("register"), "{err}");
    assert!(
        ask(&player, public, &udp::oob(b"getchallenge 126 Quake3Arena"))
            .await
            .is_empty()
    );
    d.stop().await;
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn a_wrong_rcon_password_or_relay_token_registers_nothing_and_leaves_no_key() {
    OpenArena::require();
    let oa = OpenArena::start(unique_ip(), "secret").expect("start OpenArena");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let d = Daemon::start(&state, &ports(1), &["--game", "q3"]).await;
    let pw_file = dir.path().join("rcon.pw");
    std::fs::write(&pw_file, "wrong").unwrap();
    let oa_addr = oa.addr().to_string();
    let (ok, _, err) = admin(&[
        "register",
        "--control",
        &format!("http://{}", d.control),
        "--token-file",
        &s(&state.with_extension("token")),
        "--upstream",
        &oa_addr,
        "--rcon",
        &oa_addr,
        "--rcon-password-file",
        &s(&pw_file),
        "--key-file",
        &s(&dir.path().join("k")),
    ])
    .await;
    assert!(!ok);
    assert!(err.contains("rcon password"), "{err}");
    assert!(
        !dir.path().join("k").exists(),
        "a key the relay never took is not left behind"
    );
    // The right password but a wrong relay token: refused, and again no key left.
    std::fs::write(&pw_file, "secret").unwrap();
    let wrong_token = dir.path().join("wrong.token");
    std::fs::write(&wrong_token, "x".repeat(40)).unwrap();
    let (ok, _, err) = admin(&[
        "register",
        "--control",
        &format!("http://{}", d.control),
        "--token-file",
        &s(&wrong_token),
        "--upstream",
        &oa_addr,
        "--rcon",
        &oa_addr,
        "--rcon-password-file",
        &s(&pw_file),
        "--key-file",
        &s(&dir.path().join("k")),
    ])
    .await;
    assert!(!ok);
    assert!(err.contains("401") || err.contains("token"), "{err}");
    assert!(!dir.path().join("k").exists(), "{err}");
    assert!(
        !state.join("servers.json").exists()
            || !std::fs::read_to_string(state.join("servers.json"))
                .unwrap()
                .contains("port\"")
    );
    d.stop().await;
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn after_the_relay_lost_its_state_admin_registers_again_by_itself() {
    OpenArena::require();
    qstat::require();
    let oa = OpenArena::start(unique_ip(), "secret").expect("start OpenArena");
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &ports(2), &["--game", "q3"]).await;
    let token_file = s(&state.with_extension("token"));
    let pw_file = dir.path().join("rcon.pw");
    std::fs::write(&pw_file, "secret\n").unwrap();
    let (pw, kf, oa_addr) = (
        s(&pw_file),
        s(&dir.path().join("server.key")),
        oa.addr().to_string(),
    );
    let means = [
        "--token-file",
        token_file.as_str(),
        "--upstream",
        oa_addr.as_str(),
        "--rcon",
        oa_addr.as_str(),
        "--rcon-password-file",
        pw.as_str(),
        "--port",
        "27961",
    ];
    let ctl = format!("http://{}", d.control);
    let mut register = vec!["register", "--control", &ctl, "--key-file", &kf];
    register.extend_from_slice(&means);
    let (ok, out, err) = admin(&register).await;
    assert!(ok && out.contains("on port 27961 (new)"), "{out}{err}");

    // The relay loses its state (a new front host, a wiped state directory).
    d.kill9().await;
    std::fs::remove_dir_all(&state).unwrap();
    let d = Daemon::start_on(ip, &state, &ports(2), &["--game", "q3"]).await;
    let ctl = format!("http://{}", d.control);

    // Without the means: the exact command to run.
    let (ok, _, err) = admin(&["status", "--control", &ctl, "--key-file", &kf]).await;
    assert!(!ok);
    let want = format!(
        "run `etrelay admin register --control {ctl} --key-file {kf} --token-file <RELAY_TOKEN_FILE>"
    );
    assert!(err.contains(&want), "{err}");

    // With them: registers again (a new registration, fresh proof), then the command runs.
    let mut status = vec!["status", "--control", &ctl, "--key-file", &kf];
    status.extend_from_slice(&means);
    let started = std::time::Instant::now();
    let (ok, out, err) = admin(&status).await;
    let took = started.elapsed();
    assert!(ok, "{out}{err}\n{}", d.log_text());
    println!(
        "FIGURE admin status on a relay that lost its state: {} ms, registering again included",
        took.as_millis()
    );
    assert!(err.contains("registering again"), "{err}");
    assert!(
        err.contains("on port 27961 (new); trying the command again"),
        "{err}"
    );
    assert!(out.contains("27961 (public"), "{out}");
    // Relayed again: a real browser through the public port, and the proof cleared.
    let v = qstat::query_json("q3s", d.public(27961)).await.unwrap();
    assert_eq!(v["status"], "online", "{v}");
    let checker = client().await;
    let r = ask(&checker, oa.addr(), &udp::oob(b"getstatus c")).await;
    assert_eq!(info_value(&r[0].1, "etrelay_proof"), None);
    // Known again: the next command does not register.
    let mut bans = vec!["bans", "--control", &ctl, "--key-file", &kf];
    bans.extend_from_slice(&means);
    let (ok, out, err) = admin(&bans).await;
    assert!(ok && out.contains("no bans"), "{out}{err}");
    assert!(!err.contains("registering again"), "{err}");
    d.stop().await;
}
