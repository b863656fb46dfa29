//! `etrelay`: parse the command line, then run one server, the registry of several, or an
//! admin command.

#![deny(clippy::unwrap_used)]

use std::process::ExitCode;

use clap::Parser;
use etrelay::cli::{Cli, Command, Mode};
use etrelay::server::{Budget, ServerHandle};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let default = if cli.run.debug {
        "info,etrelay=debug"
    } else {
        "info"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mode = match cli.run.mode() {
        Ok(m) => m,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mode: Mode) -> Result<(), String> {
    match mode {
        Mode::Single {
            config,
            listen,
            max_sessions,
            max_queued_bytes,
            metrics,
        } => {
            let max_sessions = etrelay::fdbudget::fit_sessions(max_sessions, 1, 0)?;
            let public = UdpSocket::bind(listen)
                .await
                .map_err(|e| format!("cannot bind {listen}: {e}"))?;
            let metrics = match metrics {
                Some(addr) => Some(
                    tokio::net::TcpListener::bind(addr)
                        .await
                        .map_err(|e| format!("cannot bind --metrics {addr}: {e}"))?,
                ),
                None => None,
            };
            let root = CancellationToken::new();
            let metrics_stop = CancellationToken::new();
            let budget = Budget::new(max_sessions, max_queued_bytes);
            let server = std::sync::Arc::new(
                ServerHandle::start(config, public, budget.clone(), &root)
                    .map_err(|e| format!("cannot start: {e}"))?,
            );
            let served = metrics.map(|l| {
                tokio::spawn(etrelay::metrics_http::serve(
                    l,
                    std::sync::Arc::clone(&server),
                    budget,
                    metrics_stop.clone(),
                ))
            });
            let signal = shutdown_signal().await;
            info!("{signal}: stopping");
            metrics_stop.cancel();
            if let Some(task) = served {
                let _ = task.await;
            }
            server.stop().await;
            Ok(())
        }
        Mode::Multi(config) => {
            etrelay::daemon::run(config, async {
                let signal = shutdown_signal().await;
                info!("{signal}: stopping");
            })
            .await
        }
    }
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            error!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
