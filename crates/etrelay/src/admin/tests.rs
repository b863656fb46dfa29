//! Whole commands against a stand-in game server (UDP) and control API (TCP), on 127.0.0.1.

use std::sync::{Arc, Mutex};

use clap::Parser;
use tokio::net::UdpSocket;

use super::client::tests::{one_shot, one_shot_with, response};
use super::register::register;
use super::*;

const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// printf '%s' $KEY | sha256sum, first 32 hex digits.
const FINGERPRINT: &str = "a8ae6e6ee929abea3afcfc5258c8ccd6";
const TOKEN: &str = "relay-token-0123456789abcdefghijklmnop";

fn fast() -> Timing {
    Timing {
        attempts: 3,
        wait: Duration::from_millis(300),
        gap: Duration::ZERO,
    }
}

/// A game server stand-in answering every rcon with an empty `print`, recording the datagrams.
async fn game_server() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&got);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            seen.lock().unwrap().push(buf[..n].to_vec());
            let _ = socket.send_to(b"\xff\xff\xff\xffprint\n", from).await;
        }
    });
    (addr, got)
}

struct Files {
    _dir: tempfile::TempDir,
    key: PathBuf,
    token: PathBuf,
    password: PathBuf,
}

fn files(key: Option<&str>) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("key");
    if let Some(key) = key {
        std::fs::write(&key_path, format!("{key}\n")).unwrap();
    }
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let password = dir.path().join("rcon");
    std::fs::write(&password, "secret\n").unwrap();
    Files {
        key: key_path,
        token,
        password,
        _dir: dir,
    }
}

fn register_args(control: ControlUrl, rcon: SocketAddr, f: &Files, json: bool) -> RegisterArgs {
    RegisterArgs {
        control,
        token_file: f.token.clone(),
        upstream: "10.0.0.2:27960".parse().unwrap(),
        port: Some(27961),
        rcon: rcon.to_string(),
        rcon_password_file: f.password.clone(),
        key_file: f.key.clone(),
        json,
    }
}

const SERVER: &str = r#"{"port":27961,"public":"0.0.0.0:27961","upstream":"10.0.0.2:27960","registered_at":1764450000,"probe":{"state":"up","last_probe_at":1764450300,"last_answer_at":null},"sessions":3}"#;

fn proof_packet() -> Vec<u8> {
    let mut packet = b"\xff\xff\xff\xff".to_vec();
    packet.extend_from_slice(format!("rcon secret sets etrelay_proof {FINGERPRINT}").as_bytes());
    packet
}

const CLEAR: &[u8] = b"\xff\xff\xff\xffrcon secret sets etrelay_proof \"\"";

#[tokio::test]
async fn register_sets_the_proof_registers_then_clears() {
    let (rcon_addr, rcon_got) = game_server().await;
    let at_put = Arc::new(Mutex::new(Vec::new()));
    let (snapshot, seen) = (Arc::clone(&at_put), Arc::clone(&rcon_got));
    let (url, http) = one_shot_with(response("201 Created", SERVER), move || {
        *snapshot.lock().unwrap() = seen.lock().unwrap().clone();
    })
    .await;
    let f = files(Some(KEY));

    let out = register(&register_args(url, rcon_addr, &f, false), fast())
        .await
        .unwrap();
    assert_eq!(out, "registered 10.0.0.2:27960 on port 27961 (new)\n");

    let request = http.await.unwrap();
    assert_eq!(request.method, "PUT");
    assert_eq!(request.path, "/server");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        request.json(),
        json!({"key": KEY, "upstream": "10.0.0.2:27960", "port": 27961})
    );
    // The proof was up while the relay looked, and cleared afterwards.
    assert_eq!(*at_put.lock().unwrap(), vec![proof_packet()]);
    assert_eq!(
        *rcon_got.lock().unwrap(),
        vec![proof_packet(), CLEAR.to_vec()]
    );
}

#[tokio::test]
async fn register_creates_the_key_and_reports_a_takeover() {
    let (rcon_addr, rcon_got) = game_server().await;
    let (url, http) = one_shot(response("200 OK", SERVER)).await;
    let f = files(None);
    let mut args = register_args(url, rcon_addr, &f, false);
    args.port = None;

    let out = register(&args, fast()).await.unwrap();
    assert_eq!(
        out,
        "registered 10.0.0.2:27960 on port 27961 (taken over)\n"
    );

    let key = std::fs::read_to_string(&f.key).unwrap().trim().to_owned();
    assert_eq!(key.len(), 64);
    let request = http.await.unwrap();
    // No `port`: the relay picks one.
    assert_eq!(
        request.json(),
        json!({"key": key, "upstream": "10.0.0.2:27960"})
    );
    let proof = format!("rcon secret sets etrelay_proof {}", key::fingerprint(&key));
    let got = rcon_got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert_eq!(&got[0][4..], proof.as_bytes());
    assert_eq!(got[1], CLEAR);
}

#[tokio::test]
async fn register_json_prints_the_answer() {
    let (rcon_addr, _) = game_server().await;
    let (url, http) = one_shot(response("201 Created", SERVER)).await;
    let f = files(Some(KEY));
    let out = register(&register_args(url, rcon_addr, &f, true), fast())
        .await
        .unwrap();
    http.await.unwrap();
    let parsed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed, serde_json::from_str::<Value>(SERVER).unwrap());
    assert!(out.contains("\n  \"port\": 27961"), "not pretty: {out}");
}

#[tokio::test]
async fn register_clears_the_proof_when_the_relay_refuses() {
    let (rcon_addr, rcon_got) = game_server().await;
    let (url, http) = one_shot(response(
        "403 Forbidden",
        r#"{"error":"proof_failed","message":"no answer from 10.0.0.2:27960"}"#,
    ))
    .await;
    let f = files(Some(KEY));
    let err = register(&register_args(url, rcon_addr, &f, false), fast())
        .await
        .unwrap_err();
    http.await.unwrap();
    assert!(
        err.to_string()
            .starts_with("the relay could not see the proof on the game server"),
        "{err}"
    );
    assert_eq!(
        *rcon_got.lock().unwrap(),
        vec![proof_packet(), CLEAR.to_vec()]
    );
}

#[tokio::test]
async fn register_stops_when_rcon_is_refused() {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let rcon_addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((_, from)) = socket.recv_from(&mut buf).await {
            let _ = socket
                .send_to(b"\xff\xff\xff\xffprint\nBad rconpassword.\n", from)
                .await;
        }
    });
    // No control API at all: it must not be reached.
    let url: ControlUrl = "http://127.0.0.1:9".parse().unwrap();
    let f = files(Some(KEY));
    let err = register(&register_args(url, rcon_addr, &f, false), fast())
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::RconRefused { .. }), "{err:?}");
}

#[tokio::test]
async fn register_refuses_a_bad_rcon_password_file() {
    let f = files(Some(KEY));
    std::fs::write(&f.password, "has space").unwrap();
    let url: ControlUrl = "http://127.0.0.1:9".parse().unwrap();
    let err = register(
        &register_args(url, "127.0.0.1:9".parse().unwrap(), &f, false),
        fast(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::BadFile { .. }), "{err:?}");
}

fn server_args(control: ControlUrl, f: &Files, json: bool) -> ServerArgs {
    ServerArgs {
        control,
        key_file: f.key.clone(),
        json,
        again: Again::default(),
    }
}

#[tokio::test]
async fn status_shows_the_server() {
    let (url, http) = one_shot(response("200 OK", SERVER)).await;
    let f = files(Some(KEY));
    let out = status(&server_args(url, &f, false)).await.unwrap();
    let request = http.await.unwrap();
    assert_eq!(request.method, "GET");
    assert_eq!(request.path, "/server");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(
        out,
        "upstream    10.0.0.2:27960\n\
         port        27961 (public 0.0.0.0:27961)\n\
         registered  2025-11-29 21:00:00 UTC\n\
         probe       up (last probe 2025-11-29 21:05:00 UTC, last answer never)\n\
         sessions    3\n"
    );
}

#[tokio::test]
async fn status_says_since_when_the_server_is_under_a_flood() {
    let body = SERVER.replace(
        r#""sessions":3}"#,
        r#""sessions":3,"proven_sources":41,"under_flood_since":1764450000,"floods":[{"kind":"reflection","since":1764450000,"dropped":75496},{"kind":"limiter","since":1764450010,"dropped":12}]}"#,
    );
    let (url, _http) = one_shot(response("200 OK", &body)).await;
    let f = files(Some(KEY));
    let out = status(&server_args(url, &f, false)).await.unwrap();
    assert!(out.contains("proven sources  41\n"), "{out}");
    assert!(
        out.contains(
            "pressure        under a query flood since 2025-11-29 21:00:00 UTC (reflection 75496 dropped, limiter 12 dropped)\n"
        ),
        "{out}"
    );
    let calm = SERVER.replace(r#""sessions":3}"#, r#""sessions":3,"floods":[]}"#);
    let (url, _http) = one_shot(response("200 OK", &calm)).await;
    let out = status(&server_args(url, &f, false)).await.unwrap();
    assert!(out.ends_with("\npressure    none\n"), "{out}");
}

#[tokio::test]
async fn sessions_table() {
    let body = r#"{"sessions":[{"client":"203.0.113.7:45488","upstream_port":51234,"opened_at":1764450000,"last_seen_at":1764450042,"packets_up":1200,"bytes_up":96000,"packets_down":800,"bytes_down":640000}]}"#;
    let (url, http) = one_shot(response("200 OK", body)).await;
    let f = files(Some(KEY));
    let out = sessions(&server_args(url, &f, false)).await.unwrap();
    assert_eq!(http.await.unwrap().path, "/sessions");
    assert_eq!(
        out,
        "CLIENT             SEEN AS  OPENED               LAST SEEN            PKTS UP/DOWN  BYTES UP/DOWN\n\
         203.0.113.7:45488  51234    2025-11-29 21:00:00  2025-11-29 21:00:42  1200/800      93.8 KiB/625.0 KiB\n"
    );

    let (url, http) = one_shot(response("200 OK", r#"{"sessions":[]}"#)).await;
    let out = sessions(&server_args(url, &f, false)).await.unwrap();
    http.await.unwrap();
    assert_eq!(out, "no sessions\n");
}

#[tokio::test]
async fn bans_table_and_json() {
    let body = r#"{"bans":[{"ip":"203.0.113.7","reason":"aimbot","since":1764450000,"expires_at":1764453600},{"ip":"2001:db8::1","reason":null,"since":0,"expires_at":null}]}"#;
    let (url, http) = one_shot(response("200 OK", body)).await;
    let f = files(Some(KEY));
    let out = bans(&server_args(url, &f, false)).await.unwrap();
    assert_eq!(http.await.unwrap().path, "/bans");
    assert_eq!(
        out,
        "IP           REASON  SINCE                EXPIRES\n\
         203.0.113.7  aimbot  2025-11-29 21:00:00  2025-11-29 22:00:00\n\
         2001:db8::1  -       1970-01-01 00:00:00  never\n"
    );

    let (url, http) = one_shot(response("200 OK", body)).await;
    let out = bans(&server_args(url, &f, true)).await.unwrap();
    http.await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        serde_json::from_str::<Value>(body).unwrap()
    );
}

/// A reason set through the API can hold anything: `bans` shows NUL, escape sequences and a
/// right-to-left override escaped, never raw to the terminal.
#[tokio::test]
async fn bans_shows_a_hostile_reason_escaped() {
    let body = r#"{"bans":[{"ip":"203.0.113.7","reason":"a\u0000b\u001b[2J\u202eexe.txt","since":0,"expires_at":null}]}"#;
    let (url, http) = one_shot(response("200 OK", body)).await;
    let f = files(Some(KEY));
    let out = bans(&server_args(url, &f, false)).await.unwrap();
    http.await.unwrap();
    assert!(out.contains(r"a\0b\u{1b}[2J\u{202e}exe.txt"), "{out}");
    assert!(!out.contains(['\0', '\u{1b}', '\u{202e}']), "{out:?}");
}

#[tokio::test]
async fn ban_sends_reason_and_duration() {
    let answer =
        r#"{"ip":"203.0.113.7","reason":"aimbot","since":1764450000,"expires_at":1764453600}"#;
    let (url, http) = one_shot(response("200 OK", answer)).await;
    let f = files(Some(KEY));
    let args = BanArgs {
        ip: "203.0.113.7".parse().unwrap(),
        reason: Some("aimbot".into()),
        duration: Some(Duration::from_secs(3600)),
        server: server_args(url, &f, false),
    };
    let out = ban(&args).await.unwrap();
    assert_eq!(
        out,
        "banned 203.0.113.7 until 2025-11-29 22:00:00 UTC: aimbot\n"
    );
    let request = http.await.unwrap();
    assert_eq!(request.method, "PUT");
    assert_eq!(request.path, "/bans/203.0.113.7");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(
        request.json(),
        json!({"reason": "aimbot", "duration_secs": 3600})
    );
}

#[tokio::test]
async fn permanent_ban_of_an_ipv6_address() {
    let answer = r#"{"ip":"2001:db8::1","reason":null,"since":1764450000,"expires_at":null}"#;
    let (url, http) = one_shot(response("200 OK", answer)).await;
    let f = files(Some(KEY));
    let args = BanArgs {
        ip: "2001:db8::1".parse().unwrap(),
        reason: None,
        duration: None,
        server: server_args(url, &f, false),
    };
    assert_eq!(ban(&args).await.unwrap(), "banned 2001:db8::1 for good\n");
    let request = http.await.unwrap();
    assert_eq!(request.path, "/bans/2001:db8::1");
    assert_eq!(request.json(), json!({}));
}

#[test]
fn ban_durations() {
    assert_eq!(duration_secs(Duration::from_secs(3600)).unwrap(), 3600);
    assert_eq!(duration_secs(Duration::from_millis(1500)).unwrap(), 2);
    assert!(matches!(
        duration_secs(Duration::ZERO),
        Err(AdminError::BadArgument(_))
    ));
}

#[tokio::test]
async fn unban_and_its_not_found() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response("204 No Content", "")).await;
    let args = UnbanArgs {
        ip: "203.0.113.7".parse().unwrap(),
        server: server_args(url, &f, false),
    };
    assert_eq!(unban(&args).await.unwrap(), "unbanned 203.0.113.7\n");
    let request = http.await.unwrap();
    assert_eq!(request.method, "DELETE");
    assert_eq!(request.path, "/bans/203.0.113.7");

    let (url, http) = one_shot(response(
        "404 Not Found",
        r#"{"error":"not_found","message":"no such ban"}"#,
    ))
    .await;
    let args = UnbanArgs {
        ip: "203.0.113.7".parse().unwrap(),
        server: server_args(url, &f, false),
    };
    let err = unban(&args).await.unwrap_err();
    http.await.unwrap();
    assert_eq!(err.to_string(), "203.0.113.7 is not banned");
}

/// The relay refuses a ban of `0.0.0.0`: the tool says why and what to give instead.
#[tokio::test]
async fn ban_of_the_unspecified_address_is_explained() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response(
        "422 Unprocessable Entity",
        r#"{"error":"not_a_source","message":"0.0.0.0 is the unspecified address: no datagram comes from it, there is nothing to ban"}"#,
    ))
    .await;
    let args = BanArgs {
        ip: "0.0.0.0".parse().unwrap(),
        reason: None,
        duration: None,
        server: server_args(url, &f, false),
    };
    let err = ban(&args).await.unwrap_err();
    http.await.unwrap();
    let text = err.to_string();
    assert!(text.starts_with("0.0.0.0 cannot be banned: "), "{text}");
    assert!(
        text.contains("(relay: 0.0.0.0 is the unspecified address"),
        "{text}"
    );
}

#[tokio::test]
async fn leave_deletes_the_server() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response("204 No Content", "")).await;
    let out = leave(&server_args(url, &f, false)).await.unwrap();
    assert!(out.starts_with("left the relay"), "{out}");
    let request = http.await.unwrap();
    assert_eq!(request.method, "DELETE");
    assert_eq!(request.path, "/server");

    let (url, http) = one_shot(response("204 No Content", "")).await;
    assert_eq!(leave(&server_args(url, &f, true)).await.unwrap(), "");
    http.await.unwrap();
}

#[tokio::test]
async fn key_routes_need_the_key_file() {
    let f = files(None);
    let url: ControlUrl = "http://127.0.0.1:9".parse().unwrap();
    let err = status(&server_args(url, &f, false)).await.unwrap_err();
    assert!(matches!(err, AdminError::NoKey { .. }), "{err:?}");
}

#[tokio::test]
async fn unknown_key_message() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response(
        "401 Unauthorized",
        r#"{"error":"unauthorized","message":"unknown key"}"#,
    ))
    .await;
    let err = bans(&server_args(url.clone(), &f, false))
        .await
        .unwrap_err();
    http.await.unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "the relay does not know this key (not registered, left, taken over by another key, or the relay lost its state): run `etrelay admin register --control {url} --key-file {} --token-file <RELAY_TOKEN_FILE> --upstream <IP:PORT> --rcon <ADDR> --rcon-password-file <RCON_PASSWORD_FILE>` (or give this command --token-file, --upstream, --rcon and --rcon-password-file: it then registers again by itself)",
            f.key.display()
        )
    );
}

/// The subcommands as the `etrelay admin` command line will parse them.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: AdminCommand,
}

#[test]
fn command_line() {
    use clap::CommandFactory as _;
    Cli::command().debug_assert();

    let cli = Cli::try_parse_from([
        "admin",
        "register",
        "--control",
        "10.8.0.1:8080",
        "--token-file",
        "/etc/etrelay/token",
        "--upstream",
        "10.8.0.2:27960",
        "--port",
        "27961",
        "--rcon",
        "127.0.0.1:27960",
        "--rcon-password-file",
        "/etc/etrelay/rcon",
        "--key-file",
        "/var/lib/etrelay/key",
    ])
    .unwrap();
    let AdminCommand::Register(args) = cli.cmd else {
        panic!("not register: {cli:?}");
    };
    assert_eq!(args.control.to_string(), "http://10.8.0.1:8080");
    assert_eq!(args.port, Some(27961));
    assert!(!args.json);

    let cli = Cli::try_parse_from([
        "admin",
        "ban",
        "203.0.113.7",
        "--reason",
        "aimbot",
        "--duration",
        "1h",
        "--control",
        "http://10.8.0.1:8080",
        "--key-file",
        "k",
        "--json",
    ])
    .unwrap();
    let AdminCommand::Ban(args) = cli.cmd else {
        panic!("not ban: {cli:?}");
    };
    assert_eq!(args.duration, Some(Duration::from_secs(3600)));
    assert!(args.server.json);

    // A negative duration is named as such, not taken for a flag.
    for negative in ["-5m", "-1"] {
        let Err(e) = Cli::try_parse_from([
            "admin",
            "ban",
            "203.0.113.7",
            "--duration",
            negative,
            "--control",
            "h:1",
            "--key-file",
            "k",
        ]) else {
            panic!("--duration {negative} accepted");
        };
        let text = e.to_string();
        assert!(
            text.contains(&format!("a duration cannot be negative: {negative}")),
            "{text}"
        );
    }

    for bad in [
        vec![
            "admin",
            "ban",
            "not-an-ip",
            "--control",
            "h:1",
            "--key-file",
            "k",
        ],
        vec![
            "admin",
            "status",
            "--control",
            "https://h:1",
            "--key-file",
            "k",
        ],
        vec!["admin", "status", "--key-file", "k"],
        vec![
            "admin",
            "register",
            "--control",
            "h:1",
            "--token-file",
            "t",
            "--upstream",
            "example.org:27960",
            "--rcon",
            "h:1",
            "--rcon-password-file",
            "p",
            "--key-file",
            "k",
        ],
        vec![
            "admin",
            "register",
            "--control",
            "h:1",
            "--token-file",
            "t",
            "--upstream",
            "10.0.0.2:27960",
            "--port",
            "0",
            "--rcon",
            "h:1",
            "--rcon-password-file",
            "p",
            "--key-file",
            "k",
        ],
    ] {
        assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?} accepted");
    }
}

#[tokio::test]
async fn unknown_key_without_all_the_means_names_the_command_with_what_it_has() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response(
        "401 Unauthorized",
        r#"{"error":"unauthorized","message":"unknown key"}"#,
    ))
    .await;
    let mut args = server_args(url.clone(), &f, false);
    args.again.token_file = Some("/etc/etrelay/token".into());
    args.again.upstream = Some("10.0.0.2:27960".parse().unwrap());
    args.again.port = Some(27961);
    // No --rcon, no --rcon-password-file: nothing is sent to a game server, one request only.
    let err = status(&args).await.unwrap_err();
    http.await.unwrap();
    let text = err.to_string();
    let want = format!(
        "run `etrelay admin register --control {url} --key-file {} --token-file /etc/etrelay/token --upstream 10.0.0.2:27960 --rcon <ADDR> --rcon-password-file <RCON_PASSWORD_FILE> --port 27961`",
        f.key.display()
    );
    assert!(text.contains(&want), "{text}");
}

#[tokio::test]
async fn leave_never_registers_again() {
    let f = files(Some(KEY));
    let (url, http) = one_shot(response(
        "401 Unauthorized",
        r#"{"error":"unauthorized","message":"unknown key"}"#,
    ))
    .await;
    let mut args = server_args(url, &f, false);
    args.again.token_file = Some(f.token.clone());
    args.again.upstream = Some("10.0.0.2:27960".parse().unwrap());
    args.again.rcon = Some("127.0.0.1:9".into());
    args.again.rcon_password_file = Some(f.password.clone());
    let err = leave(&args).await.unwrap_err();
    http.await.unwrap();
    assert!(
        err.to_string()
            .starts_with("the relay does not know this key"),
        "{err}"
    );
}

#[test]
fn key_commands_take_the_means_to_register_again() {
    let cli = Cli::try_parse_from([
        "admin",
        "unban",
        "203.0.113.7",
        "--control",
        "10.8.0.1:8080",
        "--key-file",
        "k",
        "--token-file",
        "t",
        "--upstream",
        "10.8.0.2:27960",
        "--rcon",
        "127.0.0.1:27960",
        "--rcon-password-file",
        "p",
        "--port",
        "27961",
    ])
    .unwrap();
    let AdminCommand::Unban(args) = cli.cmd else {
        panic!("not unban: {cli:?}");
    };
    let again = &args.server.again;
    assert_eq!(again.port, Some(27961));
    assert_eq!(again.rcon.as_deref(), Some("127.0.0.1:27960"));
    assert!(again.token_file.is_some() && again.rcon_password_file.is_some());
}
