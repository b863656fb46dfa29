//! What the operator relies on, on real processes on loopback: the operator API needs the
//! cookie from the state dir, a node that has run refuses to start on lost state, and the
//! status report is pushed only when asked. Every loop is bounded in count and time.

use crate::common;

use common::{Doc, Net, ReportSink, counter, http};
use serde_json::Value;

/// The operator API serves nothing, the inbox's plaintext least of all, to a local
/// process without the cookie; the cookie file is the owner's only and the CLI reads it from
/// the state dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_api_needs_the_cookie_from_the_state_dir() {
    use std::os::unix::fs::PermissionsExt;
    let net = Net::start(2, &["--probe-interval", "0s"]).await;
    let secret = format!("SECRET-{}", common::hex(&common::random_bytes(8)));
    let (ok, _, err) = net.send(0, 1, 1, secret.as_bytes()).await;
    assert!(ok, "{err}");
    let cookie = net.node(1).state_dir.join("operator.cookie");
    let mode = std::fs::metadata(&cookie)
        .expect("cookie")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let op = net.node(1).operator.clone();
    for path in ["/v1/inbox", "/v1/inbox/1", "/v1/status", "/metrics"] {
        let r = http().get(format!("{op}{path}")).send().await.expect(path);
        assert_eq!(r.status().as_u16(), 401, "{path}");
        let text = r.text().await.unwrap_or_default();
        assert!(
            text.contains("unauthorized") && !text.contains(&secret),
            "{text}"
        );
    }
    let r = http()
        .post(format!("{op}/v1/send?to={}&hops=1", net.node(0).id))
        .bearer_auth("00".repeat(32))
        .body("x")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 401);
    // The CLI reads the cookie from the state dir.
    let ids = net.inbox_ids(1).await;
    assert_eq!(net.inbox_read(1, ids[0]).await, secret.as_bytes());
    // A wrong cookie file: refused.
    let wrong = net.dir().join("wrong.cookie");
    std::fs::write(&wrong, "00".repeat(32)).unwrap();
    let out = net
        .cli(&[
            "inbox",
            "--operator",
            &op,
            "--cookie-file",
            &wrong.display().to_string(),
        ])
        .await;
    assert!(!out.ok && !out.out().contains(&secret), "{}", out.out());
}

/// A node that has run before refuses to start on a lost `inbox.db` or `replay.db`
/// (empty or missing) with an error naming the file, unless the operator accepts the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_has_run_refuses_to_start_on_lost_state() {
    let mut net = Net::start(2, &["--probe-interval", "0s"]).await;
    let (ok, _, err) = net.send(0, 1, 1, b"kept across restarts").await;
    assert!(ok, "{err}");
    let dir = net.node(1).state_dir.clone();
    // A plain restart keeps everything.
    net.restart(1).await;
    assert_eq!(net.inbox_ids(1).await.len(), 1);

    // inbox.db truncated to 0 bytes.
    net.kill9(1).await;
    std::fs::File::create(dir.join("inbox.db")).expect("truncate");
    let out = net.run_to_exit(1).await;
    assert!(!out.ok, "started on a lost inbox: {}", out.stderr);
    assert!(
        out.stderr.contains("inbox.db is empty") && out.stderr.contains("--accept-lost-state"),
        "{}",
        out.stderr
    );
    net.restart_with(1, &["--accept-lost-state"]).await;
    let warned = |net: &Net, file: &str| {
        net.node(1)
            .lines()
            .iter()
            .any(|l| l.contains("WARN") && l.contains(file) && l.contains("accept-lost-state"))
    };
    assert!(warned(&net, "inbox.db"), "{:?}", net.node(1).lines());
    assert!(net.inbox_ids(1).await.is_empty());

    // replay.db deleted (with its write-ahead log).
    net.kill9(1).await;
    for f in ["replay.db", "replay.db-wal", "replay.db-shm"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let out = net.run_to_exit(1).await;
    assert!(!out.ok, "started on a lost replay registry: {}", out.stderr);
    assert!(
        out.stderr.contains("replay.db is missing"),
        "{}",
        out.stderr
    );
    net.restart_with(1, &["--accept-lost-state"]).await;
    assert!(warned(&net, "replay.db"), "{:?}", net.node(1).lines());

    // Accepted once, the state is whole again: a plain start works and messages flow.
    net.restart(1).await;
    let (ok, _, err) = net.send(0, 1, 1, b"after the loss").await;
    assert!(ok, "{err}");
}

/// Every way a store can be damaged but emptied (that is "lost", above) is refused at start
/// with the file's name, what it holds and the remedy: garbage, a truncated file, another
/// store's file, a database of something else. With `--accept-lost-state` the file is set
/// aside (`<name>.damaged-<time>`) and the node starts on an empty one, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_is_named_with_its_remedy_and_set_aside_only_when_asked() {
    let mut net = Net::start(2, &["--probe-interval", "0s", "--gossip-interval", "0s"]).await;
    let (ok, _, err) = net.send(0, 1, 1, b"something to keep").await;
    assert!(ok, "{err}");
    let dir = net.node(1).state_dir.clone();
    net.kill9(1).await;
    let replay = std::fs::read(dir.join("replay.db")).expect("replay.db");
    let foreign = dir.join("foreign.db");
    {
        let conn = rusqlite::Connection::open(&foreign).expect("a database of something else");
        conn.execute_batch("CREATE TABLE recipes (name TEXT); INSERT INTO recipes VALUES ('x');")
            .expect("a table");
    }
    let foreign = std::fs::read(&foreign).expect("foreign.db");
    let damage: [(&str, &str, Vec<u8>); 4] = [
        (
            "garbage",
            "inbox.db",
            b"this is not a database at all".repeat(200),
        ),
        (
            "truncated",
            "replay.db",
            replay[..replay.len().min(3000) / 2].to_vec(),
        ),
        ("another store's file", "inbox.db", replay.clone()),
        ("a database of something else", "replay.db", foreign),
    ];
    for (what, file, bytes) in damage {
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(dir.join(format!("{file}{suffix}")));
        }
        std::fs::write(dir.join(file), &bytes).expect("damage");
        let out = net.run_to_exit(1).await;
        assert!(
            !out.ok,
            "{what}: started on a damaged {file}: {}",
            out.stderr
        );
        for needle in [
            file,
            "cannot be used",
            "Restore it from a backup",
            "--accept-lost-state",
        ] {
            assert!(
                out.stderr.contains(needle),
                "{what}: no {needle:?} in {}",
                out.stderr
            );
        }
        net.restart_with(1, &["--accept-lost-state"]).await;
        let set_aside = net
            .node(1)
            .lines()
            .into_iter()
            .any(|l| l.contains("WARN") && l.contains(file) && l.contains("set aside as"));
        assert!(set_aside, "{what}: {:?}", net.node(1).lines());
        let kept = std::fs::read_dir(&dir)
            .expect("state dir")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{file}.damaged-"))
            })
            .count();
        assert!(kept >= 1, "{what}: the damaged file is kept aside");
        net.kill9(1).await;
    }
    // The state is whole again: a plain start works and messages flow.
    net.restart(1).await;
    let (ok, _, err) = net.send(0, 1, 1, b"after the damage").await;
    assert!(ok, "{err}");
}

/// With `--report-url`, the node pushes the status document in the design's layout
/// to the operator's URL (a loopback listener the test runs), at start and every interval;
/// without it, nothing is pushed. A URL that does not answer is counted and logged once, not
/// retried in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_report_is_pushed_in_the_design_layout_only_when_asked() {
    let sink = ReportSink::start().await;
    let mut net = Net::start(2, &["--probe-interval", "0s"]).await;
    let p1 = net.node(1).prefix().to_string();
    net.restart_with(1, &["--report-url", &sink.url, "--report-interval", "1s"])
        .await;
    let from1 = |v: &Value| v["node"] == p1.as_str();
    let first = sink.wait_for("from node 1", from1).await;
    let ps = &first["system_stats"]["discovery_status"]["peer_store"];
    assert!(ps["runtime"]["blind_relay"]["received"].is_u64(), "{first}");
    assert!(
        ps["runtime"]["blind_relay"]["duplicate_route"].is_u64(),
        "{first}"
    );
    assert!(ps["blind_relay_quality"]["status"].is_string(), "{first}");
    assert!(
        ps["blind_relay_quality"]["proof_scope"].is_string(),
        "{first}"
    );
    assert!(ps["peer_health_summary"]["rows"].is_array(), "{first}");
    assert!(ps["runtime"]["replay"]["capacity"].is_u64(), "{first}");
    // Periodic: a delivery to node 1 shows up in a later push.
    let (ok, _, err) = net.send(0, 1, 1, b"counted, not shown").await;
    assert!(ok, "{err}");
    sink.wait_for("with the delivery", |v| {
        from1(v) && v.counters()["terminal"].as_u64() == Some(1)
    })
    .await;
    // A push is counted once the sink's answer is read, a moment after the sink has the body.
    let s1 = net
        .wait_status(1, common::WAIT, "2 reports sent", |s| {
            counter(s, "report_sent") >= 2
        })
        .await;
    assert!(counter(&s1, "report_sent") >= 2, "{s1}");
    assert_eq!(counter(&s1, "report_failed"), 0, "{s1}");
    // Off by default: node 0 never pushed, and counted nothing.
    let p0 = net.node(0).prefix().to_string();
    assert!(sink.bodies().iter().all(|v| v["node"] != p0.as_str()));
    let s0 = net.status(0).await;
    assert_eq!(
        counter(&s0, "report_sent") + counter(&s0, "report_failed"),
        0
    );
    // A URL nobody answers at: failures counted, one log line, one attempt per interval.
    let dead = format!("http://{}:9/report", common::fresh_ip());
    net.restart_with(0, &["--report-url", &dead, "--report-interval", "1s"])
        .await;
    let started = std::time::Instant::now();
    loop {
        let s0 = net.status(0).await;
        if counter(&s0, "report_failed") >= 2 {
            break;
        }
        assert!(started.elapsed() < common::WAIT, "no failed report: {s0}");
        tokio::time::sleep(common::POLL).await;
    }
    let elapsed = started.elapsed().as_secs() + 2;
    let failed = counter(&net.status(0).await, "report_failed");
    assert!(failed <= elapsed, "{failed} failures in about {elapsed} s");
    assert_eq!(net.node(0).count("status report push failed"), 1);
    assert!(!net.node(0).lines().iter().any(|l| l.contains(":9/report")));
}

/// `blindrelay` with `args` and `env`, run to its exit: (exit status 0, stderr).
fn run_bin(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(common::BIN)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run blindrelay");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A node that cannot serve exits non-zero and says which file: here its identity key (the
/// links' TLS identity), damaged.
#[test]
fn a_node_whose_identity_cannot_serve_exits_non_zero_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("node");
    let state_arg = state.display().to_string();
    let endpoint = format!("https://{}:{}", common::fresh_ip(), common::RELAY_PORT);
    let (ok, err) = run_bin(
        &["init", "--state-dir", &state_arg, "--endpoint", &endpoint],
        &[],
    );
    assert!(ok, "{err}");
    let key = state.join("identity.key");
    std::fs::write(&key, b"not a key").unwrap();
    let listen = format!("{}:0", common::fresh_ip());
    let (ok, err) = run_bin(
        &["run", "--state-dir", &state_arg, "--listen", &listen],
        &[],
    );
    assert!(!ok, "served on a damaged identity: {err}");
    assert!(
        err.contains(&key.display().to_string()) && err.starts_with("blindrelay: "),
        "{err}"
    );
}

/// `BLINDRELAY_STATE_DIR` is taken when `--state-dir` is not given, and `--state-dir` wins
/// over it.
#[test]
fn an_environment_variable_is_taken_and_the_flag_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let (from_env, from_flag) = (dir.path().join("env"), dir.path().join("flag"));
    let env = [("BLINDRELAY_STATE_DIR", from_env.to_str().unwrap())];
    let listen = format!("{}:0", common::fresh_ip());
    let (ok, err) = run_bin(&["run", "--listen", &listen], &env);
    assert!(
        !ok && err.contains(&from_env.display().to_string()),
        "{err}"
    );
    assert!(err.contains("blindrelay init"), "{err}");
    let flag = from_flag.display().to_string();
    let (ok, err) = run_bin(&["run", "--listen", &listen, "--state-dir", &flag], &env);
    assert!(!ok && err.contains(&flag), "{err}");
    assert!(!err.contains(&from_env.display().to_string()), "{err}");
}
