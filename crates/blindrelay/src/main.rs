//! `blindrelay`: the node and its operator's commands.

#![deny(clippy::unwrap_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use blindrelay::cli::{Cli, Command, RunArgs, SeedsError};
use blindrelay::client::{Client, ClientError};
use blindrelay::clock::Clock;
use blindrelay::daemon::{self, RunError};
use blindrelay::node::NodeError;
use blindrelay::peers::cache::SeedListError;
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// Libraries whose logs could name addresses or URLs: silenced, whatever `RUST_LOG` says.
const QUIET: &str = "hyper=off,hyper_util=off,reqwest=off,rustls=off,tokio_rustls=off,h2=off,axum=off,tower=off,tower_http=off,rusqlite=off";

/// Why a command failed; printed after `blindrelay: ` and the exit status is 1.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// The async runtime cannot start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    /// `init`.
    #[error(transparent)]
    Init(#[from] NodeError),
    /// `seeds`.
    #[error(transparent)]
    SeedList(#[from] SeedListError),
    /// `send`, `inbox`, `status`.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `run --seeds`.
    #[error(transparent)]
    Seeds(#[from] SeedsError),
    /// `run`: the node could not start, or stopped serving.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `run`: a listener's address cannot be bound (the address is not printed).
    #[error("cannot bind the {what} listener (--{flag}): {kind}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Its flag.
        flag: &'static str,
        /// What the system said.
        kind: std::io::ErrorKind,
    },
}

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
    let ran = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(Error::Runtime)
        .and_then(|rt| rt.block_on(run(cli.command)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blindrelay: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Command) -> Result<(), Error> {
    match cmd {
        Command::Init {
            state_dir,
            endpoint,
        } => {
            let now = Clock::System.unix();
            let id = blindrelay::node::init(&state_dir, &endpoint, now)?;
            let _ = writeln!(std::io::stdout().lock(), "{}", hex::encode(id));
            Ok(())
        }
        Command::Run(args) => run_node(*args).await,
        Command::Seeds { state_dir, max } => {
            let list = blindrelay::peers::cache::seed_list(&state_dir, usize::from(max))?;
            let _ = write!(std::io::stdout().lock(), "{list}");
            Ok(())
        }
        Command::Send { op, to, hops, file } => {
            let client = Client::new(&op.operator, &op.cookie_path())?;
            Ok(client.send(&to, hops, &file).await?)
        }
        Command::Inbox {
            op,
            read,
            delete,
            take,
            json,
        } => {
            let client = Client::new(&op.operator, &op.cookie_path())?;
            Ok(match (delete, take) {
                (Some(id), _) => client.inbox_delete(id).await,
                (None, true) => client.inbox_take().await,
                (None, false) => client.inbox(read, json).await,
            }?)
        }
        Command::Status { op, json } => {
            let client = Client::new(&op.operator, &op.cookie_path())?;
            Ok(client.status(json).await?)
        }
    }
}

async fn run_node(args: RunArgs) -> Result<(), Error> {
    if !args.operator.ip().is_loopback() {
        tracing::warn!("the operator API is not on a loopback address");
    }
    let mut config = args.run_config();
    config.peers.extend(args.seed_peers()?);
    let node = daemon::build(config)?;
    let public = bind(args.listen, "relay", "listen").await?;
    let operator = bind(args.operator, "operator", "operator").await?;
    Ok(daemon::serve(node, public, operator, shutdown()).await?)
}

/// The listener on `addr` (`--flag`).
async fn bind(
    addr: SocketAddr,
    what: &'static str,
    flag: &'static str,
) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Bind {
            what,
            flag,
            kind: e.kind(),
        })
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
