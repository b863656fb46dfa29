//! The command line: `blindrelay init | run | send | inbox | status`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::replay::ReplayStore;

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
        #[arg(long, default_value_t = 3)]
        hops: usize,
        /// The message file, or `-` for standard input.
        #[arg(default_value = "-")]
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
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub operator: SocketAddr,
    /// A peer's URL to fetch its descriptor from (repeat for each peer).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// Accept next hops whose endpoint is a private or loopback address (test networks).
    #[arg(long)]
    pub allow_private_endpoints: bool,
    /// Where route reservations are kept: `sqlite` survives restarts, `memory` does not.
    #[arg(long, value_enum, default_value = "sqlite")]
    pub replay_store: ReplayStore,
    /// Relay requests admitted per minute, process-wide (the request gate's window).
    #[arg(long, default_value_t = 1200)]
    pub admission_per_minute: u32,
    /// Relay requests in flight at most.
    #[arg(long, default_value_t = crate::pipeline::MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Crypto slots (default: half the CPU threads rounded up, at least 4, at most 8).
    #[arg(long)]
    pub crypto_slots: Option<usize>,
    /// Time between synthetic probe rounds (humantime, `0s` disables them).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub probe_interval: std::time::Duration,
}
