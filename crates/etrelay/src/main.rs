//! `etrelay`: parse the command line, bind the public socket, run until SIGTERM/SIGINT.

#![deny(clippy::unwrap_used)]

use std::process::ExitCode;

use clap::Parser;
use etrelay::cli::Cli;
use guard::admission::Gate;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = if cli.debug {
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let config = cli.server_config()?;
    let public = UdpSocket::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot bind {}: {e}", cli.listen))?;
    let root = CancellationToken::new();
    let server =
        etrelay::server::ServerHandle::start(config, public, Gate::new(cli.max_sessions), &root)
            .map_err(|e| format!("cannot start: {e}"))?;
    let signal = shutdown_signal().await;
    info!("{signal}: stopping");
    server.stop().await;
    Ok(())
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
