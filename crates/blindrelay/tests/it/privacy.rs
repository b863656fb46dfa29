//! Nothing a node or the CLI prints names who talks to whom: with every node logging at
//! `trace`, a delivery, a failed send and a malformed request leave no full node id, no
//! endpoint or address, no payload and no payload hash in any log, CLI output, status, inbox
//! listing or error body, with gossip running every second. Only 8-hex id prefixes may appear.

use crate::common;

use std::time::Duration;

use common::{
    CliOutput, Doc, Net, OPERATOR_PORT, RELAY_PORT, ReportSink, fresh_ip, hex, http_from,
    random_bytes, run_cli,
};
use sha2::{Digest, Sha256};

/// A piece of output and where it came from.
struct Seen {
    what: String,
    text: String,
}

fn cli_text(what: &str, out: &CliOutput, seen: &mut Vec<Seen>) {
    seen.push(Seen {
        what: format!("{what} stdout"),
        text: out.out(),
    });
    seen.push(Seen {
        what: format!("{what} stderr"),
        text: out.stderr.clone(),
    });
}

async fn body(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_printed_or_served_links_sender_terminal_or_payload() {
    // Every node also pushes its status report (`--report-url`) to a listener of the test.
    let sink = ReportSink::start().await;
    let mut net = Net::start_with(
        3,
        &[
            "--report-url",
            &sink.url,
            "--report-interval",
            "1s",
            "--gossip-interval",
            "1s",
        ],
        Some("trace"),
    )
    .await;
    let mut seen: Vec<Seen> = Vec::new();
    // Every node has gossiped (its gossip's log lines are scanned with the rest), bounded.
    for i in 0..3 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while net.status(i).await.runtime()["peers"]["last_gossip_at"].is_null() {
            assert!(
                std::time::Instant::now() < deadline,
                "node {i} never gossiped"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let payload = format!("PRIVATE-PAYLOAD-{}", hex(&random_bytes(16)));
    let file = net.dir().join("private.txt");
    std::fs::write(&file, &payload).unwrap();
    let file = file.display().to_string();
    let (op0, op1, op2) = (
        net.node(0).operator.clone(),
        net.node(1).operator.clone(),
        net.node(2).operator.clone(),
    );
    let to2 = net.node(2).id.clone();

    // The delivery, over 2 hops (node 1 the middle).
    let sent = net
        .cli(&[
            "send",
            "--operator",
            &op0,
            "--to",
            &to2,
            "--hops",
            "2",
            &file,
        ])
        .await;
    assert!(sent.ok, "send failed: {}", sent.stderr);
    assert!(sent.out().contains("receipt verified"));
    cli_text("send", &sent, &mut seen);

    // A failing send: a node nobody knows.
    let stranger = hex(&random_bytes(32));
    let failed = net
        .cli(&[
            "send",
            "--operator",
            &op0,
            "--to",
            &stranger,
            "--hops",
            "2",
            &file,
        ])
        .await;
    assert!(!failed.ok);
    cli_text("failed send", &failed, &mut seen);

    // The other CLI views.
    for (what, args) in [
        ("inbox 2", vec!["inbox", "--operator", &op2]),
        ("inbox 2 json", vec!["inbox", "--operator", &op2, "--json"]),
        ("status 0", vec!["status", "--operator", &op0]),
        (
            "status 1 json",
            vec!["status", "--operator", &op1, "--json"],
        ),
        (
            "inbox --read missing",
            vec!["inbox", "--operator", &op2, "--read", "999"],
        ),
    ] {
        let out = net.cli(&args).await;
        cli_text(what, &out, &mut seen);
    }

    // Direct requests from a client address of its own.
    let client_ip = fresh_ip();
    let client = http_from(client_ip);
    let relay1 = &net.node(1).endpoint;
    let mut v1 = b"BRE1".to_vec();
    v1.extend(random_bytes(150));
    let mut malformed = vec![0x02, 0x00];
    malformed.extend(random_bytes(150));
    for (what, path, bytes, reason) in [
        (
            "v1 POST /v2/relay",
            "/v2/relay",
            v1.clone(),
            "v1_not_accepted",
        ),
        ("v1 POST /v1/relay", "/v1/relay", v1, "v1_not_accepted"),
        (
            "malformed POST /v2/relay",
            "/v2/relay",
            malformed,
            "malformed_envelope",
        ),
        (
            "garbage POST /v2/relay",
            "/v2/relay",
            b"not an envelope at all".to_vec(),
            "malformed_envelope",
        ),
    ] {
        let (status, text) = body(
            client
                .post(format!("{relay1}{path}"))
                .header("content-type", "application/octet-stream")
                .body(bytes)
                .send()
                .await
                .expect("relay request"),
        )
        .await;
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains(reason), "{what}: {text}");
        seen.push(Seen {
            what: what.into(),
            text,
        });
    }
    // A handshake flood and a stranger's junk from the client's address: the alert lines they
    // raise are read with the rest of the log below, and must name no address (bounded: a
    // round whose connections a tick boundary split is repeated).
    let alerted = |net: &Net| {
        let log = net.node(1).lines().join("\n");
        log.contains("handshake flood") && log.contains("strangers refused")
    };
    let mut junk = 0;
    for round in 0.. {
        assert!(round < 4, "no alert lines after {round} rounds");
        let handshakes: Vec<_> = (0..2 * blindrelay::alerts::HANDSHAKE_FLOOD)
            .map(|_| {
                let url = format!("{relay1}/v1/nothing");
                tokio::spawn(async move { http_from(client_ip).get(url).send().await.is_ok() })
            })
            .collect();
        for _ in 0..2 * blindrelay::alerts::STRANGERS_REFUSED {
            let r = client
                .post(format!("{relay1}/v2/relay"))
                .header("content-type", "application/octet-stream")
                .body(b"not an envelope at all".to_vec())
                .send()
                .await;
            assert!(r.is_ok_and(|r| r.status().is_client_error()));
            junk += 1;
        }
        for h in handshakes {
            h.await.expect("handshake task");
        }
        // The watcher looks once a tick.
        let end = std::time::Instant::now() + 2 * blindrelay::alerts::TICK;
        while !alerted(&net) && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if alerted(&net) {
            break;
        }
    }
    for (what, req) in [
        (
            "operator send unknown",
            net.op_http(0)
                .post(format!("{op0}/v1/send?to={stranger}&hops=2"))
                .body(payload.clone()),
        ),
        (
            "operator send too many hops",
            net.op_http(0)
                .post(format!("{op0}/v1/send?to={to2}&hops=3"))
                .body(payload.clone()),
        ),
        ("public 404", client.get(format!("{relay1}/v1/nothing"))),
        (
            "operator 404",
            net.op_http(1).get(format!("{op1}/v1/nothing")),
        ),
        (
            "inbox item 404",
            net.op_http(2).get(format!("{op2}/v1/inbox/999")),
        ),
        (
            "operator without cookie",
            client.get(format!("{op1}/v1/status")),
        ),
    ] {
        let (status, text) = body(req.send().await.expect(what)).await;
        assert!(status >= 400, "{what}: {status} {text}");
        seen.push(Seen {
            what: what.into(),
            text,
        });
    }

    // Status and inbox listings of every node, and the metrics text where it is served.
    for i in 0..3 {
        let op = &net.node(i).operator;
        let (_, text) = body(
            net.op_http(i)
                .get(format!("{op}/metrics"))
                .send()
                .await
                .expect("metrics"),
        )
        .await;
        seen.push(Seen {
            what: format!("metrics {i}"),
            text,
        });
        seen.push(Seen {
            what: format!("status {i}"),
            text: net.status(i).await.to_string(),
        });
        seen.push(Seen {
            what: format!("inbox listing {i}"),
            text: net.inbox(i).await.to_string(),
        });
    }
    // The delivery did happen and the refusal was counted, so the logs had something to say.
    assert_eq!(net.inbox(2).await["items"].as_array().unwrap().len(), 1);
    let s1 = net.status(1).await;
    assert_eq!(s1.counters()["forwarded"], 1);
    // The two v1 envelopes and the junk of the alert rounds (wrong lengths all).
    assert_eq!(s1.counters()["malformed_envelope"], 2 + junk);

    // The reports pushed after the traffic, and every other one received.
    let p1 = net.node(1).prefix().to_string();
    sink.wait_for("after the forward", |v| {
        v["node"] == p1.as_str() && v.counters()["malformed_envelope"] == 2 + junk
    })
    .await;
    for (k, v) in sink.bodies().iter().enumerate() {
        seen.push(Seen {
            what: format!("pushed report {k}"),
            text: v.to_string(),
        });
    }

    // Every node's whole output, read to the end.
    net.stop_all().await;
    for (i, n) in net.nodes().iter().enumerate() {
        let lines = n.lines();
        assert!(
            lines.iter().any(|l| l.contains("node ready")),
            "node {i} log is empty"
        );
        seen.push(Seen {
            what: format!("node {i} log"),
            text: lines.join("\n"),
        });
    }
    assert!(
        net.node(1).count("malformed_envelope") >= 1,
        "the refusal was not logged at trace"
    );
    assert!(net.node(1).count("forwarding") >= 1);

    // What must appear nowhere.
    let mut forbidden: Vec<(String, String)> = Vec::new();
    for (i, n) in net.nodes().iter().enumerate() {
        forbidden.push((format!("node {i} id"), n.id.clone()));
        forbidden.push((
            format!("node {i} relay endpoint"),
            format!("{}:{RELAY_PORT}", n.ip),
        ));
        forbidden.push((
            format!("node {i} operator endpoint"),
            format!("{}:{OPERATOR_PORT}", n.ip),
        ));
        forbidden.push((format!("node {i} address"), n.ip.to_string()));
    }
    forbidden.push(("unknown terminal id".into(), stranger.clone()));
    forbidden.push(("payload".into(), payload.clone()));
    forbidden.push(("payload hex".into(), hex(payload.as_bytes())));
    forbidden.push((
        "payload SHA-256".into(),
        hex(&Sha256::digest(payload.as_bytes())),
    ));
    let mut h = Sha256::new();
    h.update(b"blindrelay/payload/v1");
    h.update(payload.as_bytes());
    let commitment = hex(&h.finalize());
    assert_eq!(
        commitment,
        hex(&blindrelay::proto::commitment(payload.as_bytes())),
        "the commitment is computed as the protocol says"
    );
    forbidden.push(("payload commitment".into(), commitment));
    forbidden.push(("client address".into(), client_ip.to_string()));
    forbidden.push(("report URL".into(), sink.url.clone()));
    forbidden.push(("report receiver address".into(), sink.ip.to_string()));
    forbidden.push(("CLI source address".into(), "127.0.0.1".into()));

    let mut leaks = Vec::new();
    for s in &seen {
        for (name, needle) in &forbidden {
            if s.text
                .to_ascii_lowercase()
                .contains(&needle.to_ascii_lowercase())
            {
                let line = s
                    .text
                    .lines()
                    .find(|l| {
                        l.to_ascii_lowercase()
                            .contains(&needle.to_ascii_lowercase())
                    })
                    .unwrap_or("");
                leaks.push(format!("{} shows the {name}: {line}", s.what));
            }
        }
    }
    assert!(leaks.is_empty(), "leaks:\n{}", leaks.join("\n"));

    // The 8-hex prefixes are what identifies nodes.
    assert!(sent.out().contains(net.node(2).prefix()));
    let log0 = net.node(0).lines().join("\n");
    assert!(
        log0.contains(&format!("terminal={}", net.node(2).prefix())),
        "{log0}"
    );
}

/// The CLI's own error when the operator API does not answer must not echo the URL it built
/// (the operator endpoint) or the full `--to` id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_do_not_echo_the_operator_url_or_the_terminal_id() {
    let ip = fresh_ip(); // nothing listens there
    let operator = format!("http://{ip}:{OPERATOR_PORT}");
    let to = hex(&random_bytes(32));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("msg");
    std::fs::write(&file, b"x").unwrap();
    let file = file.display().to_string();
    let cookie = dir.path().join("operator.cookie");
    std::fs::write(&cookie, "ab".repeat(32)).unwrap();
    let cookie = cookie.display().to_string();
    let runs = [
        run_cli(
            &[
                "send",
                "--operator",
                &operator,
                "--cookie-file",
                &cookie,
                "--to",
                &to,
                "--hops",
                "2",
                &file,
            ],
            None,
        )
        .await,
        run_cli(
            &["status", "--operator", &operator, "--cookie-file", &cookie],
            None,
        )
        .await,
        run_cli(
            &["inbox", "--operator", &operator, "--cookie-file", &cookie],
            None,
        )
        .await,
        run_cli(
            &[
                "inbox",
                "--operator",
                &operator,
                "--cookie-file",
                &cookie,
                "--read",
                "1",
            ],
            None,
        )
        .await,
    ];
    let mut leaks = Vec::new();
    for out in &runs {
        assert!(!out.ok);
        let text = format!("{}{}", out.out(), out.stderr);
        if text.contains(&to) || text.contains(&ip.to_string()) {
            leaks.push(text.trim().to_string());
        }
    }
    assert!(leaks.is_empty(), "leaks:\n{}", leaks.join("\n"));
}
