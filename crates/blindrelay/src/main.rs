//! `blindrelay`: the node and its operator's commands.

#![deny(clippy::unwrap_used)]

use std::io::Write;
use std::process::ExitCode;

use blindrelay::cli::{Cli, Command, RunArgs};
use blindrelay::clock::Clock;
use blindrelay::{client, daemon};
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Libraries whose logs could name addresses or URLs: silenced, whatever `RUST_LOG` says.
const QUIET: &str = "hyper=off,hyper_util=off,reqwest=off,rustls=off,tokio_rustls=off,h2=off,axum=off,tower=off,tower_http=off,rusqlite=off";

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
    let workers = match &cli.command {
        Command::Run(args) => args.workers.map(usize::from),
        _ => None,
    }
    .unwrap_or_else(blindrelay::context::default_runtime_workers);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
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
            let _ = writeln!(std::io::stdout().lock(), "{}", hex::encode(id));
            Ok(())
        }
        Command::Run(args) => run_node(*args).await,
        Command::Seeds { state_dir, max } => {
            let list = blindrelay::peers::cache::seed_list(&state_dir, usize::from(max))
                .map_err(|e| e.to_string())?;
            let _ = write!(std::io::stdout().lock(), "{list}");
            Ok(())
        }
        Command::Send { op, to, hops, file } => {
            client::use_cookie(&op.cookie_path())?;
            client::send(&op.operator, &to, hops, &file).await
        }
        Command::Inbox {
            op,
            read,
            delete,
            take,
            json,
        } => {
            client::use_cookie(&op.cookie_path())?;
            match (delete, take) {
                (Some(id), _) => client::inbox_delete(&op.operator, id).await,
                (None, true) => client::inbox_take(&op.operator).await,
                (None, false) => client::inbox(&op.operator, read, json).await,
            }
        }
        Command::Status { op, json } => {
            client::use_cookie(&op.cookie_path())?;
            client::status(&op.operator, json).await
        }
    }
}

async fn run_node(args: RunArgs) -> Result<(), String> {
    if !args.operator.ip().is_loopback() {
        tracing::warn!("the operator API is not on a loopback address");
    }
    let mut config = args.run_config();
    config.peers.extend(args.seed_peers()?);
    let node = daemon::build(config).map_err(|e| e.to_string())?;
    let public = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot bind the relay listener: {}", e.kind()))?;
    let operator = tokio::net::TcpListener::bind(args.operator)
        .await
        .map_err(|e| format!("cannot bind the operator listener: {}", e.kind()))?;
    daemon::serve(node, public, operator, shutdown()).await;
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
