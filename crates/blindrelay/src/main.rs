//! `blindrelay`: the node and its operator's commands.

#![deny(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::ExitCode;

use blindrelay::cli::{Cli, Command, RunArgs};
use blindrelay::clock::Clock;
use blindrelay::daemon::{self, RunConfig};
use blindrelay::pipeline::RelayConfig;
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Prints a line to standard output; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// Libraries whose logs could name addresses or URLs: silenced, whatever `RUST_LOG` says.
const QUIET: &str =
    "hyper=off,hyper_util=off,reqwest=off,h2=off,axum=off,tower=off,tower_http=off,rusqlite=off";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let user = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let filter = EnvFilter::try_new(format!("{user},{QUIET}"))
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{QUIET}")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("blindrelay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blindrelay: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Init {
            state_dir,
            endpoint,
        } => {
            let now = Clock::System.unix();
            let id =
                blindrelay::node::init(&state_dir, &endpoint, now).map_err(|e| e.to_string())?;
            say!("{}", hex::encode(id));
            Ok(())
        }
        Command::Run(args) => run_node(args).await,
        Command::Send {
            operator,
            to,
            hops,
            file,
        } => {
            let mut payload = Vec::new();
            if file == "-" {
                std::io::stdin()
                    .read_to_end(&mut payload)
                    .map_err(|e| format!("stdin: {e}"))?;
            } else {
                payload = std::fs::read(&file).map_err(|e| format!("{file}: {e}"))?;
            }
            let url = format!(
                "{}/v1/send?to={to}&hops={hops}",
                operator.trim_end_matches('/')
            );
            let resp = http()
                .post(url)
                .body(payload)
                .send()
                .await
                .map_err(operator_error)?;
            let ok = resp.status().is_success();
            let v: serde_json::Value = resp.json().await.map_err(operator_error)?;
            if ok && v["delivered"] == true {
                let hops = v["hops"].as_u64().unwrap_or(0);
                say!(
                    "delivered to {} over {hops} hop{}, receipt verified",
                    v["terminal"].as_str().unwrap_or("?"),
                    if hops == 1 { "" } else { "s" }
                );
                Ok(())
            } else {
                Err(format!(
                    "not delivered: {}",
                    v["message"]
                        .as_str()
                        .or(v["error"].as_str())
                        .unwrap_or("unknown error")
                ))
            }
        }
        Command::Inbox {
            operator,
            read,
            json,
        } => {
            let base = operator.trim_end_matches('/');
            if let Some(id) = read {
                let resp = http()
                    .get(format!("{base}/v1/inbox/{id}"))
                    .send()
                    .await
                    .map_err(operator_error)?;
                if !resp.status().is_success() {
                    return Err(format!("no message {id}"));
                }
                let bytes = resp.bytes().await.map_err(operator_error)?;
                std::io::stdout()
                    .write_all(&bytes)
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            let v: serde_json::Value = get_json(&format!("{base}/v1/inbox")).await?;
            if json {
                say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                let items = v["items"].as_array().cloned().unwrap_or_default();
                if items.is_empty() {
                    say!("inbox empty");
                }
                say!("{:>6}  {:>12}  {:>8}", "ID", "RECEIVED", "BYTES");
                for it in items {
                    say!(
                        "{:>6}  {:>12}  {:>8}",
                        it["id"],
                        it["received_at"],
                        it["size"]
                    );
                }
            }
            Ok(())
        }
        Command::Status { operator, json } => {
            let v = get_json(&format!("{}/v1/status", operator.trim_end_matches('/'))).await?;
            if json {
                say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                render_status(&v);
            }
            Ok(())
        }
    }
}

/// The status document as readable tables.
fn render_status(v: &serde_json::Value) {
    let q = &v["quality"];
    let t = |x: &serde_json::Value| x.as_str().unwrap_or("?").to_string();
    say!(
        "node {}   status {}   proof scope {}   real relay ready {}",
        t(&v["node"]),
        t(&q["status"]),
        t(&q["proof_scope"]),
        q["real_relay_ready"]
    );
    say!("  why:  {}", t(&q["reason"]));
    say!("  next: {}", t(&q["next_action"]));
    say!("");
    say!(
        "{:<28} {:>8} {:>12} {:>6}",
        "EVIDENCE",
        "TOTAL",
        "LAST",
        "FRESH"
    );
    for k in [
        "relay_acceptance",
        "synthetic_probes",
        "synthetic_two_hop_probes",
        "client_delivery_receipts",
    ] {
        let e = &q[k];
        let last = e["last_at"]
            .as_u64()
            .map_or("never".to_string(), |x| x.to_string());
        say!("{:<28} {:>8} {:>12} {:>6}", k, e["total"], last, e["fresh"]);
    }
    say!("");
    say!("COUNTERS");
    if let Some(c) = v["counters"].as_object() {
        for (k, val) in c.iter().filter(|(k, _)| !k.starts_with("last_")) {
            say!("  {k:<34} {val}");
        }
    }
    let h = &v["peer_health"];
    say!("");
    say!(
        "PEERS  {} known: {} healthy, {} degraded, {} failing, {} quarantined, {} unknown",
        h["total_peers"],
        h["healthy"],
        h["degraded"],
        h["failing"],
        h["quarantined"],
        h["unknown"]
    );
    say!(
        "{:<10} {:<12} {:<10} {:<8} {:<8} {:>6} {:>6} {:>10}  REASONS",
        "NODE",
        "HEALTH",
        "DESCRIPTOR",
        "CONTACT",
        "ROUTE OK",
        "OK",
        "FAIL",
        "QUARANTINE"
    );
    for r in h["rows"].as_array().cloned().unwrap_or_default() {
        let reasons = r["reasons"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, n)| format!("{k}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        say!(
            "{:<10} {:<12} {:<10} {:<8} {:<8} {:>6} {:>6} {:>10}  {}",
            t(&r["node"]),
            t(&r["health"]),
            t(&r["descriptor"]),
            t(&r["last_contact"]),
            t(&r["last_route_success"]),
            r["route_successes"],
            r["route_failures"],
            r["quarantine_remaining_secs"],
            reasons
        );
    }
}

/// An operator API failure, without reqwest's text: it holds the URL (an endpoint, and for
/// `send` the terminal's full id), which must not be printed.
fn operator_error(e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_decode() {
        "answered something that is not JSON"
    } else {
        "request failed"
    };
    format!("operator API: {what}")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap_or_default()
}

async fn get_json(url: &str) -> Result<serde_json::Value, String> {
    let resp = http().get(url).send().await.map_err(operator_error)?;
    resp.json().await.map_err(operator_error)
}

async fn run_node(args: RunArgs) -> Result<(), String> {
    if !args.operator.ip().is_loopback() {
        tracing::warn!("the operator API is not on a loopback address");
    }
    let mut relay = RelayConfig::new(args.allow_private_endpoints);
    relay.window_limit = args.admission_per_minute;
    relay.max_in_flight = args.max_in_flight;
    relay.probe_interval = args.probe_interval;
    if let Some(n) = args.crypto_slots {
        relay.crypto_slots = n.max(2);
    }
    let relay = daemon::build(RunConfig {
        state_dir: args.state_dir,
        peers: args.peers,
        replay_store: args.replay_store,
        relay,
        clock: Clock::System,
    })
    .map_err(|e| e.to_string())?;
    let public = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot bind the relay listener: {}", e.kind()))?;
    let operator = tokio::net::TcpListener::bind(args.operator)
        .await
        .map_err(|e| format!("cannot bind the operator listener: {}", e.kind()))?;
    daemon::serve(relay, public, operator, shutdown()).await;
    Ok(())
}

async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
