//! `etrelay`: parse the command line, then run one server ([`etrelay::single`]), the registry
//! of several ([`etrelay::daemon`]), or an admin command ([`etrelay::admin`]).

#![deny(clippy::unwrap_used)]

use std::fmt::Display;
use std::process::ExitCode;

use etrelay::cli::{Cli, Command, Mode};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("etrelay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Admin(cmd)) = cli.command {
        return match runtime.block_on(etrelay::admin::run(cmd)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("etrelay admin: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logs(cli.run.debug);
    let busy_polling = cli.run.busy_polling;
    // Started within the runtime, stopped with the relay.
    let polling = move || {
        busy_polling.then(|| {
            info!("busy polling: one CPU kept busy, datagrams read without a wake-up");
            etrelay::busy_poll::start()
        })
    };
    match cli.run.mode() {
        Ok(Mode::Single(config)) => exit(runtime.block_on(async {
            let _polling = polling();
            etrelay::single::run(config, stopping(), reloads()).await
        })),
        Ok(Mode::Multi(config)) => exit(runtime.block_on(async {
            let _polling = polling();
            etrelay::daemon::run(config, stopping(), reloads()).await
        })),
        Err(e) => exit(Err(e)),
    }
}

/// A count of the SIGHUPs received, each logged: the relay reloads on every change and never
/// exits for one. Must be called within the runtime; from then on SIGHUP no longer kills the
/// process.
fn reloads() -> tokio::sync::watch::Receiver<u64> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    info!("SIGHUP: reloading");
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        Err(e) => error!(error = %e, "cannot watch SIGHUP"),
    }
    rx
}

/// Logs to stderr: `info`, `info,etrelay=debug` with `--debug`, or `RUST_LOG`.
fn init_logs(debug: bool) {
    let default = if debug { "info,etrelay=debug" } else { "info" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The exit code of a run; an error is logged.
fn exit(result: Result<(), impl Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "stopped on an error");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM or SIGINT, once it is logged.
async fn stopping() {
    let signal = shutdown_signal().await;
    info!(signal = %signal, "stopping");
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot watch SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
