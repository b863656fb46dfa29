//! The literal model (`q3model`, Engine::Ioq3) against the real ioquake3
//! server of Debian's `openarena-server`, and quakestat against it.
//!
//! Ignored unless asked for (`--include-ignored`, as `scripts/test` does): they need
//! `openarena-server` (and `qstat`), and fail saying so without them.
//!
//! Rate limits of the real server (et-protocol.md §4): per source IP, burst
//! 10 then 1/s; global for getinfo/getstatus/getchallenge, burst 10 then one
//! per 100 ms. Every payload here is sent from its own fresh source IP, and
//! payloads are spaced by at least 150 ms, so neither bucket ever empties.

use std::net::SocketAddr;
use std::time::Duration;

use etrelay_testkit::udp::{bind, exchange, oob};
use etrelay_testkit::{Dispatch, Engine, OpenArena, info, q3model, qstat, unique_ip};

/// A reply counts if it arrives within this time.
const ANSWER_WAIT: Duration = Duration::from_millis(300);
/// Quiet period after the last reply: also the minimum spacing of queries.
const QUIET: Duration = Duration::from_millis(150);

fn start() -> OpenArena {
    OpenArena::require();
    OpenArena::start(unique_ip(), "secret").expect("start openarena-server")
}

/// Sends one OOB payload from a fresh source address; the replies.
async fn ask(server: SocketAddr, payload: &[u8]) -> Vec<Vec<u8>> {
    let sock = bind(unique_ip()).await.unwrap();
    exchange(&sock, server, &oob(payload), QUIET, ANSWER_WAIT)
        .await
        .into_iter()
        .filter(|(from, _)| *from == server)
        .map(|(_, bytes)| bytes)
        .collect()
}

/// The challenge key the server should echo for these tokens: ioq3 drops a
/// challenge over 128 chars, and `Info_SetValueForKey` refuses `\ ; "` and
/// writes nothing for an empty value.
fn expected_challenge(args: &[Vec<u8>]) -> Option<String> {
    let c = args.get(1)?;
    if c.is_empty() || c.iter().any(|b| b"\\;\"".contains(b)) {
        return None;
    }
    Some(String::from_utf8_lossy(c).into_owned())
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn model_matches_the_real_ioq3_server() {
    let oa = start();
    let server = oa.addr();

    use Dispatch::*;
    // (payload after FF FF FF FF, what the model must say on Ioq3)
    let corpus: &[(&[u8], Dispatch)] = &[
        // Rows of the table in et-protocol.md §2.
        (b"GETINFO a1", GetInfo),
        (b"GetStatus a2", GetStatus),
        (b"  getinfo a3", GetInfo),
        (b"\"getinfo\" a4", GetInfo),
        (b"/* c */getinfo a5", GetInfo),
        (b"\tgetinfo\ta8", GetInfo),
        (b"\x01getinfo cc", GetInfo),
        (b"//getinfo a6", Ignored),
        (b"\x80getinfo", Ignored),
        (b"get\"info\" q", Ignored),
        (b"getinfo%s", Ignored),
        (b"getinfo\n a7", GetInfo),
        (b"getinfo\x00junk", GetInfo),
        (b"getinfo a;b", GetInfo),
        (b"RCON secret sets viaUpper 1", Rcon),
        (b"/**/rcon secret sets viaComment 1", Rcon),
        (b"\"rcon\" secret sets viaQuote 1", Rcon),
        (b"\x07rcon secret sets viaControl 1", Rcon),
        // More tokenizer corners.
        (b"rcon secret sets viaLower 2", Rcon),
        (b"rcon wrong sets viaWrong 1", Rcon),
        (b"\x80rcon secret sets viaHigh 1", Ignored),
        (b"getinfo http://x", GetInfo),
        (b"getinfo \"a b\"", GetInfo),
        (b"getinfo /*x*/ y", GetInfo),
        (b"getinfo/*c*/z", GetInfo),
        (b"getinfo //z", GetInfo),
        (b"getinfo\ra9", GetInfo),
        (b"getinfo\x80 q", Ignored),
        (b"xgetinfo a", Ignored),
        (b"/*never closed getinfo", Ignored),
        (b"getstatus", GetStatus),
        (b"getchallenge 12345 Quake3Arena", GetChallenge),
        (b"disconnect", Disconnect),
        (b"PB_SV junk", PunkBuster),
    ];

    let mut mismatches = Vec::new();
    for (payload, want) in corpus {
        let packet = oob(payload);
        let shown = String::from_utf8_lossy(payload).into_owned();
        let model = q3model::dispatch(Engine::Ioq3, &packet);
        assert_eq!(model, *want, "model on {shown:?}");

        let replies = ask(server, payload).await;
        eprintln!(
            "{shown:?}: model {model:?}, argv {:?}, replies {:?}",
            q3model::argv(Engine::Ioq3, &packet)
                .iter()
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .collect::<Vec<_>>(),
            replies
                .iter()
                .map(|r| String::from_utf8_lossy(&r[4..r.len().min(60)]).into_owned())
                .collect::<Vec<_>>()
        );
        let expect_answer = matches!(model, GetInfo | GetStatus | GetChallenge | Rcon);
        if replies.is_empty() == expect_answer {
            mismatches.push(format!(
                "{shown:?}: model {model:?}, server {}",
                if replies.is_empty() {
                    "silent"
                } else {
                    "answered"
                }
            ));
            continue;
        }
        let Some(reply) = replies.first() else {
            continue;
        };
        let args = q3model::argv(Engine::Ioq3, &packet);
        // The reply type and, for queries, the challenge the server read.
        match model {
            GetInfo => {
                let pairs = info::info_response(reply).expect("infoResponse");
                let got = info::get(&pairs, "challenge").map(str::to_owned);
                if got != expected_challenge(&args) {
                    mismatches.push(format!("{shown:?}: challenge {got:?}, model argv {args:?}"));
                }
            }
            GetStatus => {
                let status = info::status_response(reply).expect("statusResponse");
                let got = info::get(&status.info, "challenge").map(str::to_owned);
                if got != expected_challenge(&args) {
                    mismatches.push(format!("{shown:?}: challenge {got:?}, model argv {args:?}"));
                }
            }
            GetChallenge => assert!(reply.starts_with(b"\xff\xff\xff\xffchallengeResponse ")),
            Rcon => assert!(reply.starts_with(b"\xff\xff\xff\xffprint\n"), "{reply:?}"),
            _ => {}
        }
    }
    assert!(
        mismatches.is_empty(),
        "model and server disagree:\n{}\nserver log:\n{}",
        mismatches.join("\n"),
        oa.log()
    );

    // Which rcon spellings were executed: only those whose command text
    // (4 raw chars, then one word, skipped) starts with `sets`.
    let replies = ask(server, b"getstatus check").await;
    let status = info::status_response(&replies[0]).expect("statusResponse");
    let get = |k: &str| info::get(&status.info, k);
    assert_eq!(get("challenge"), Some("check"));
    assert_eq!(get("viaUpper"), Some("1"));
    assert_eq!(get("viaLower"), Some("2"));
    for never in [
        "viaComment",
        "viaQuote",
        "viaControl",
        "viaWrong",
        "viaHigh",
    ] {
        assert_eq!(get(never), None, "{never}");
    }
}

#[ignore = "needs openarena-server (apt): the real ioquake3 server"]
#[tokio::test]
async fn rcon_replies_and_console() {
    let oa = start();
    let server = oa.addr();

    // The bypass spellings are accepted as rcon with a valid password: the
    // command walker then executes "secret ..." (an unknown command).
    let replies = ask(server, b"/**/rcon secret sets x 1").await;
    let text = String::from_utf8_lossy(&replies[0][4..]).into_owned();
    assert!(
        text.starts_with("print\n") && text.contains("secret"),
        "{text:?}"
    );
    assert_eq!(
        ask(server, b"rcon secret sets relaytest hello").await,
        vec![oob(b"print\n")]
    );
    assert_eq!(
        ask(server, b"rcon wrong status").await,
        vec![oob(b"print\nBad rconpassword.\n")]
    );

    // Console commands through stdin; the server reads them once per frame.
    oa.console("sets fromconsole yes").unwrap();
    oa.console("addbot sarge 1").unwrap();
    let mut seen = None;
    for _ in 0..20 {
        let replies = ask(server, b"getstatus").await;
        if let Some(status) = replies.first().and_then(|r| info::status_response(r))
            && info::get(&status.info, "fromconsole") == Some("yes")
            && !status.players.is_empty()
        {
            seen = Some(status);
            break;
        }
    }
    let status = seen.unwrap_or_else(|| panic!("console commands not seen; log:\n{}", oa.log()));
    assert_eq!(info::get(&status.info, "relaytest"), Some("hello"));
    assert_eq!(status.players[0].2, "Sarge");
    assert!(oa.log().contains("sets fromconsole yes") || oa.log().contains("Sarge"));
    assert!(oa.pid() > 0);
}

#[ignore = "needs openarena-server and qstat (apt): the real server and quakestat"]
#[tokio::test]
async fn quakestat_json_shape() {
    qstat::require();
    let oa = start();
    let v = qstat::query_json("q3s", oa.addr()).await.unwrap();
    assert_eq!(v["status"], "online", "{v:#}");
    assert_eq!(v["protocol"], "q3s");
    assert_eq!(v["address"], oa.addr().to_string());
    assert_eq!(v["hostname"], oa.addr().to_string());
    assert_eq!(v["name"], "etrelay-test");
    assert_eq!(v["map"], "oa_dm1");
    assert_eq!(v["maxplayers"], 8);
    assert_eq!(v["rules"]["protocol"], "71");
    assert_eq!(v["rules"]["gamename"], "Quake3Arena");
    assert!(v["players"].is_array());

    let text = qstat::quakestat(&["-q3s", &oa.addr().to_string()])
        .await
        .unwrap();
    assert!(text.contains("etrelay-test"), "{text}");

    // Nobody listens here.
    let dead = SocketAddr::from((unique_ip(), 27960));
    let v = qstat::query_json("woets", dead).await.unwrap();
    assert_ne!(v["status"], "online", "{v:#}");
}
