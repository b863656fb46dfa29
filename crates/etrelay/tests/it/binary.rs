//! The real `etrelay` binary: start, logs, flatline on SIGTERM/SIGINT and on server loss,
//! `--help`, bad arguments, upstreams refused at start-up. Each process is stopped by PID when the test ends, pass or fail.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, FakeMaster, MasterStyle, udp, unique_ip};
use tokio::process::Child;

const S: Duration = Duration::from_secs(1);
const BIN: &str = env!("CARGO_BIN_EXE_etrelay");

/// A running `etrelay` process and what it has logged so far.
struct Proc {
    child: Child,
    addr: SocketAddr,
    log: Log,
}

impl Proc {
    /// Starts the binary with `args` and waits for the line that names the public address.
    /// Every test's game server is on loopback: `--allow-loopback-upstream` is added.
    async fn start(args: &[&str]) -> Proc {
        let args: Vec<String> = std::iter::once("--allow-loopback-upstream")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        let (child, log, addr) = spawn_etrelay(&args, relaying_address, 10 * S).await;
        Proc { child, addr, log }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    async fn wait_exit(&mut self) -> std::process::ExitStatus {
        within(10 * S, "etrelay exit", self.child.wait())
            .await
            .unwrap()
    }

    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// A `getinfo` through the relay gets the server's `infoResponse` (`when`: for the message).
    async fn answers_getinfo(&self, when: &str) {
        let client = udp::bind(unique_ip()).await.unwrap();
        let answers = udp::exchange(&client, self.addr, &udp::oob(b"getinfo xyz"), S, 5 * S).await;
        assert!(
            answers
                .iter()
                .any(|(_, a)| a.starts_with(b"\xff\xff\xff\xffinfoResponse")),
            "no answer {when}: {answers:?}"
        );
    }
}

fn listen() -> String {
    format!("{}:0", unique_ip())
}

#[tokio::test]
async fn sigterm_sends_the_flatline_and_exits_zero() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::EtMaster).unwrap();
    let (l, m, u) = (listen(), master.addr().to_string(), et.addr().to_string());
    let mut p = Proc::start(&["--listen", &l, "--masters", &m, &u]).await;
    assert!(
        master.wait_listed(p.addr, 10 * S).await,
        "{:?}",
        master.rejections()
    );
    p.signal("-TERM");
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![p.addr]
    );
    assert!(p.wait_exit().await.success());
    assert!(p.logged("stopping signal=SIGTERM"), "{}", p.log_text());
}

#[tokio::test]
async fn sigint_sends_the_flatline_too() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let (l, m, u) = (listen(), master.addr().to_string(), et.addr().to_string());
    let mut p = Proc::start(&["--listen", &l, "--masters", &m, &u]).await;
    assert_eq!(
        master.wait_heartbeats("EnemyTerritory-1", 1, 10 * S).await,
        vec![p.addr]
    );
    p.signal("-INT");
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![p.addr]
    );
    assert!(p.wait_exit().await.success());
}

/// SIGHUP reloads (the masters' names resolved again, logged) and never stops the relay: it
/// goes on answering, and SIGTERM still ends it with its flatline.
#[tokio::test]
async fn sighup_reloads_and_the_relay_goes_on() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let (l, m, u) = (listen(), master.addr().to_string(), et.addr().to_string());
    let mut p = Proc::start(&["--listen", &l, "--masters", &m, &u]).await;
    assert!(master.wait_listed(p.addr, 10 * S).await);
    for _ in 0..2 {
        p.signal("-HUP");
    }
    let end = std::time::Instant::now() + 10 * S;
    while !p.logged("reload: masters") {
        assert!(std::time::Instant::now() < end, "{}", p.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(p.logged("SIGHUP: reloading"), "{}", p.log_text());
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "SIGHUP stopped the relay"
    );
    p.answers_getinfo("after the reload").await;
    p.signal("-TERM");
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![p.addr]
    );
    assert!(p.wait_exit().await.success());
}

/// Time on a CPU of process `pid`'s main thread (the runtime's), from `/proc/PID/schedstat`.
fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    Duration::from_nanos(text.split_whitespace().next().unwrap().parse().unwrap())
}

/// The share of the wall clock process `pid` spends on a CPU over `over`, with no traffic.
async fn busy_share(pid: u32, over: Duration) -> f64 {
    let (cpu, t) = (cpu_time(pid), std::time::Instant::now());
    tokio::time::sleep(over).await;
    (cpu_time(pid) - cpu).as_secs_f64() / t.elapsed().as_secs_f64()
}

/// `--busy-polling`: the relay answers, its thread stays on a CPU with no traffic at all (a
/// relay without the flag sleeps), and SIGTERM still ends it with its flatline.
#[tokio::test]
async fn busy_polling_keeps_a_cpu_answers_and_stops_on_sigterm() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let (m, u) = (master.addr().to_string(), et.addr().to_string());
    let (l, plain_l) = (listen(), listen());
    let mut p = Proc::start(&["--busy-polling", "--listen", &l, "--masters", &m, &u]).await;
    let plain = Proc::start(&["--listen", &plain_l, "--masters", "", &u]).await;
    assert!(
        p.logged("busy polling: one CPU kept busy"),
        "{}",
        p.log_text()
    );
    assert!(master.wait_listed(p.addr, 10 * S).await);
    p.answers_getinfo("while polling").await;
    let over = Duration::from_millis(500);
    let pid = |p: &Proc| p.child.id().expect("running");
    // Loose bounds: the tests share the machine's CPUs with each other.
    let busy = busy_share(pid(&p), over).await;
    assert!(busy > 0.2, "on a CPU {:.0} % of the time", busy * 100.0);
    let idle = busy_share(pid(&plain), over).await;
    assert!(idle < 0.05, "without the flag: {:.1} %", idle * 100.0);
    p.signal("-TERM");
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![p.addr]
    );
    assert!(p.wait_exit().await.success());
}

#[tokio::test]
async fn flatline_when_the_server_goes_away() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::Classic).unwrap();
    let (l, m, u) = (listen(), master.addr().to_string(), et.addr().to_string());
    let mut p = Proc::start(&[
        "--listen",
        &l,
        "--masters",
        &m,
        "--heartbeat-interval",
        "300ms",
        "--probe-timeout",
        "300ms",
        &u,
    ])
    .await;
    assert_eq!(
        master.wait_heartbeats("EnemyTerritory-1", 1, 10 * S).await,
        vec![p.addr]
    );
    et.stop().await;
    assert_eq!(
        master.wait_heartbeats("ETFlatline-1", 1, 5 * S).await,
        vec![p.addr]
    );
    assert!(
        eventually(5 * S, || p.logged("stopped answering")).await,
        "{}",
        p.log_text()
    );
    p.signal("-TERM");
    assert!(p.wait_exit().await.success());
}

#[tokio::test]
async fn debug_logs_read_as_in_the_design() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let master = FakeMaster::start(unique_ip(), MasterStyle::EtMaster).unwrap();
    let (l, m, u) = (listen(), master.addr().to_string(), et.addr().to_string());
    let mut p = Proc::start(&["--debug", "--listen", &l, "--masters", &m, &u]).await;
    assert!(master.wait_listed(p.addr, 10 * S).await);
    let c = client().await;
    assert_eq!(ask(&c, p.addr, &udp::oob(b"getstatus")).await.len(), 1);
    c.send_to(&udp::oob(b"rcon secret status"), p.addr)
        .await
        .unwrap();
    let me = c.local_addr().unwrap();
    let ma = master.addr();
    // The etmaster-style master's getChallenge gets the relay's own challenge: no session. Its
    // length varies with the challenge's digits (a MAC, 1 to 10 of them): checked below.
    let response = format!("to client client={ma} command=challengeResponse bytes=");
    let want = [
        format!("sent to a master packet=heartbeat EnemyTerritory-1 master={ma} addr={ma}"),
        format!("from client client={ma} command=getChallenge bytes="),
        response.clone(),
        format!("from client client={ma} command=getInfo bytes="),
        format!("to client client={ma} command=infoResponse bytes="),
        format!("from client client={me} command=getstatus bytes=13"),
        format!("to client client={me} command=statusResponse bytes="),
        format!("dropped client={me} reason=rcon"),
    ];
    for w in &want {
        assert!(
            eventually(5 * S, || p.logged(w)).await,
            "missing {w:?} in:\n{}",
            p.log_text()
        );
    }
    let text = p.log_text();
    let line = text
        .lines()
        .find(|l| l.contains(&response))
        .unwrap_or_default();
    let len = line.split_once(&response).map(|(_, rest)| rest);
    let len = len.and_then(|rest| rest.strip_suffix(" from=the relay's challenge"));
    assert!(
        len.and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| (23..=32).contains(&n)),
        "{line}"
    );
    p.signal("-TERM");
    assert!(p.wait_exit().await.success());
    assert!(!p.logged("session opened"), "{}", p.log_text());
}

#[tokio::test]
async fn quiet_without_debug() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let (l, u) = (listen(), et.addr().to_string());
    let mut p = Proc::start(&["--listen", &l, "--masters", "", &u]).await;
    let c = client().await;
    assert_eq!(ask(&c, p.addr, &udp::oob(b"getchallenge")).await.len(), 1);
    assert!(
        eventually(5 * S, || p.logged("answers")).await,
        "server up is logged"
    );
    p.signal("-TERM");
    assert!(p.wait_exit().await.success());
    assert!(!p.logged("session opened"), "{}", p.log_text());
    assert!(!p.logged("from client"));
}

#[test]
fn help_explains_every_flag_with_its_default() {
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for (flag, default) in [
        ("--listen", "0.0.0.0:27960"),
        (
            "--masters",
            "etmaster.idsoftware.com:27950,etmaster.net:27950",
        ),
        ("--game", "et"),
        ("--heartbeat-interval", "5m"),
        ("--probe-timeout", "3s"),
        ("--session-timeout", "2m"),
        ("--session-queue", "64"),
        ("--max-sessions", "2048"),
        ("--max-packet", "1400"),
        ("--challenge-answers", "50000"),
        ("--query-burst", "5"),
        ("--query-interval", "1s"),
        ("--query-sources", "65536"),
        ("--query-forget", "60s"),
        ("--cache-max-age", "1s"),
    ] {
        let at = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} missing"));
        let section = &help[at..];
        let end = section[2..]
            .find("\n      --")
            .map_or(section.len(), |e| e + 2);
        assert!(
            section[..end].contains(&format!("[default: {default}]")),
            "{flag}: {}",
            &section[..end]
        );
    }
    assert!(help.contains("--debug"));
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    for args in [
        vec!["--masters", "nohost", "127.0.0.1:27960"],
        vec!["--masters", "", "not-an-address"],
        vec!["--heartbeat-interval", "soon", "127.0.0.1:27960"],
        vec!["--session-queue", "0", "127.0.0.1:27960"],
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.trim().is_empty(), "{args:?}: no message");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `ETRELAY_CONTROL` left in the environment of a one-server command (a shared environment
/// file): the refusal names the variable and its value, which the operator can find.
#[test]
fn a_conflict_from_the_environment_names_the_variable() {
    let out = std::process::Command::new(BIN)
        .arg("127.0.0.1:27960")
        .env("ETRELAY_CONTROL", "10.0.0.1:8080")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'[UPSTREAM]' cannot be used with '--control")
            && err.contains("it comes from ETRELAY_CONTROL=10.0.0.1:8080 in the environment"),
        "{err}"
    );
}

/// Runs the binary with `args` until it exits (within 10 s): its status and what it wrote to
/// stderr.
async fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("ETRELAY_TOKEN")
        .kill_on_drop(true)
        .output();
    let out = within(10 * S, "etrelay exit", out).await.unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_loopback_upstream_needs_the_flag() {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let (l, u) = (listen(), et.addr().to_string());
    let (status, err) = run_to_exit(&["--listen", &l, "--masters", "", &u]).await;
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("upstream {u} is a loopback address"))
            && err.contains("--allow-loopback-upstream allows it"),
        "{err}"
    );
    assert!(!err.contains("relaying"), "{err}");
    // With the flag (Proc::start gives it) the same command line relays.
    let mut p = Proc::start(&["--listen", &l, "--masters", "", &u]).await;
    assert!(p.logged(&format!("relaying upstream={u} public={}", p.addr)));
    p.signal("-TERM");
    assert!(p.wait_exit().await.success());
}

#[tokio::test]
async fn its_own_address_is_refused_as_upstream() {
    let own = format!("{}:27960", unique_ip());
    let (status, err) = run_to_exit(&[
        "--allow-loopback-upstream",
        "--listen",
        &own,
        "--masters",
        "",
        &own,
    ])
    .await;
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "upstream {own} is one of the relay's own public ports: a loop"
        )),
        "{err}"
    );
    // Bound on every address, any address of the host on its port is itself.
    let (status, err) = run_to_exit(&[
        "--allow-loopback-upstream",
        "--listen",
        "0.0.0.0:27960",
        "--masters",
        "",
        &own,
    ])
    .await;
    assert!(!status.success(), "{err}");
    assert!(err.contains("a loop"), "{err}");
}
