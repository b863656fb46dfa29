//! The command line: `blindrelay init | run | send | inbox | status`. Every default comes from
//! the constant the code uses.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::clock::Clock;
use crate::context;
use crate::daemon::{RelayConfig, RunConfig};
use crate::pipeline::gate;
use crate::replay::ReplayStore;
use crate::{client, probe, send};

/// The operator listener unless told otherwise: loopback.
pub const DEFAULT_OPERATOR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7070));
/// Fewest crypto slots `--crypto-slots` may set: one inbound, one outbound.
pub const MIN_CRYPTO_SLOTS: usize = 2;

/// A node that forwards onion-encrypted envelopes for other nodes without seeing who talks to
/// whom, behind an abuse guard.
#[derive(Debug, Parser)]
#[command(name = "blindrelay", version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the node's identity (Ed25519) and onion key (X25519) in the state dir; print the
    /// node id.
    Init {
        /// The node's state dir.
        #[arg(long)]
        state_dir: PathBuf,
        /// The public URL peers reach this node at, `http://IP:PORT`.
        #[arg(long)]
        endpoint: String,
    },
    /// Run the node.
    Run(RunArgs),
    /// Send a message through an onion route of known peers to a node; exit 0 only on a
    /// verified delivery.
    Send {
        /// The local node's operator API, `http://127.0.0.1:PORT`.
        #[arg(long)]
        operator: String,
        /// The terminal's node id (64 hex).
        #[arg(long)]
        to: String,
        /// Hops, the terminal included.
        #[arg(long, default_value_t = send::DEFAULT_HOPS)]
        hops: usize,
        /// The message file, or `-` for standard input.
        #[arg(default_value = client::STDIN)]
        file: String,
    },
    /// List the messages delivered to the local node, or print one.
    Inbox {
        /// The local node's operator API.
        #[arg(long)]
        operator: String,
        /// Print the message with this id (raw bytes to standard output).
        #[arg(long)]
        read: Option<u64>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print the node's counters.
    Status {
        /// The local node's operator API.
        #[arg(long)]
        operator: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `blindrelay run` flags.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The node's state dir (from `blindrelay init`).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// The public relay listener.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The operator API listener (send, inbox, status). Keep it on loopback.
    #[arg(long, default_value_t = DEFAULT_OPERATOR)]
    pub operator: SocketAddr,
    /// A peer's URL to fetch its descriptor from (repeat for each peer).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// Accept next hops whose endpoint is a private or loopback address (test networks).
    #[arg(long)]
    pub allow_private_endpoints: bool,
    /// Where route reservations are kept: `sqlite` survives restarts, `memory` does not.
    #[arg(long, value_enum, default_value_t = ReplayStore::Sqlite)]
    pub replay_store: ReplayStore,
    /// Relay requests admitted per minute, process-wide (the request gate's window).
    #[arg(long, default_value_t = gate::DEFAULT_PER_WINDOW)]
    pub admission_per_minute: u32,
    /// Relay requests in flight at most.
    #[arg(long, default_value_t = gate::MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Crypto slots (default: half the CPU threads rounded up, at least 4, at most 8; never
    /// fewer than 2).
    #[arg(long)]
    pub crypto_slots: Option<usize>,
    /// Time between synthetic probe rounds (humantime, `0s` disables them).
    #[arg(long, default_value_t = humantime::Duration::from(probe::DEFAULT_INTERVAL))]
    pub probe_interval: humantime::Duration,
}

impl RunArgs {
    /// What `daemon::build` needs, on the system clock.
    pub fn run_config(&self) -> RunConfig {
        RunConfig {
            state_dir: self.state_dir.clone(),
            peers: self.peers.clone(),
            replay_store: self.replay_store,
            relay: RelayConfig {
                window_limit: self.admission_per_minute,
                max_in_flight: self.max_in_flight,
                crypto_slots: self
                    .crypto_slots
                    .map_or_else(context::default_crypto_slots, |n| n.max(MIN_CRYPTO_SLOTS)),
                allow_private_endpoints: self.allow_private_endpoints,
                probe_interval: self.probe_interval.into(),
            },
            clock: Clock::System,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec![
            "blindrelay",
            "run",
            "--state-dir",
            "/x",
            "--listen",
            "0.0.0.0:1",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_the_constants() {
        let args = run_args(&[]);
        assert_eq!(args.operator.to_string(), "127.0.0.1:7070");
        let c = args.run_config();
        let d = RelayConfig::new(false);
        assert_eq!(
            (
                c.relay.window_limit,
                c.relay.max_in_flight,
                c.relay.crypto_slots
            ),
            (d.window_limit, d.max_in_flight, d.crypto_slots)
        );
        assert_eq!(c.relay.probe_interval, std::time::Duration::from_secs(300));
        assert_eq!(c.replay_store, ReplayStore::Sqlite);
        let c = run_args(&["--probe-interval", "0s", "--crypto-slots", "1"]).run_config();
        assert_eq!(c.relay.probe_interval, std::time::Duration::ZERO);
        assert_eq!(c.relay.crypto_slots, MIN_CRYPTO_SLOTS);
        match Cli::try_parse_from(["blindrelay", "send", "--operator", "u", "--to", "t"])
            .unwrap()
            .command
        {
            Command::Send { hops, file, .. } => assert_eq!((hops, file.as_str()), (3, "-")),
            other => panic!("{other:?}"),
        }
    }
}
