//! The command line: `blindrelay init | run | send | inbox | status`. Every default comes from
//! the constant the code uses.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::api::serve;
use crate::clock::Clock;
use crate::context::{self, ContextConfig};
use crate::daemon::{self, DiscoveryConfig, RelayConfig, RunConfig, StoresConfig};
use crate::outbound::{self, HopRate, QueueLimits};
use crate::peers::PeerSpec;
use crate::pipeline::gate::{self, GateConfig};
use crate::replay::{self, ReplayStore};
use crate::report;
use crate::sources::{self, CountLimits, Grouping};
use crate::{client, forward, probe, send, terminal};

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
        #[arg(long, env = "BLINDRELAY_STATE_DIR")]
        state_dir: PathBuf,
        /// The public URL peers reach this node at, `https://IP:PORT`.
        #[arg(long, env = "BLINDRELAY_ENDPOINT")]
        endpoint: String,
    },
    /// Run the node.
    Run(Box<RunArgs>),
    /// Print a seed list (for `run --seeds`) of the peers the node reached, one per /16, known
    /// longest first, signed with its identity key. Read from the state dir (`peers.json`);
    /// the node may be running.
    Seeds {
        /// The node's state dir.
        #[arg(long, env = "BLINDRELAY_STATE_DIR")]
        state_dir: PathBuf,
        /// Peers listed at most.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=256))]
        max: u16,
    },
    /// Send a message through an onion route of known peers to a node; exit 0 only on a
    /// verified delivery.
    Send {
        /// The local node's operator API and its cookie.
        #[command(flatten)]
        op: OperatorArgs,
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
    /// List the messages delivered to the local node, print one, delete one, or take the
    /// oldest (print it, then delete it).
    Inbox {
        /// The local node's operator API and its cookie.
        #[command(flatten)]
        op: OperatorArgs,
        /// Print the message with this id (raw bytes to standard output).
        #[arg(long, conflicts_with_all = ["delete", "take"])]
        read: Option<u64>,
        /// Delete the message with this id.
        #[arg(long, conflicts_with = "take")]
        delete: Option<u64>,
        /// Print the oldest message (raw bytes), then delete it; exit 1 when the inbox is empty.
        #[arg(long)]
        take: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print the node's counters.
    Status {
        /// The local node's operator API and its cookie.
        #[command(flatten)]
        op: OperatorArgs,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// How the operator's commands reach the local node: its operator API and the cookie that
/// authenticates them (`api::cookie`).
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// The local node's operator API, `http://127.0.0.1:PORT`.
    #[arg(long, default_value_t = format!("http://{DEFAULT_OPERATOR}"))]
    pub operator: String,
    /// The node's state dir: the cookie is read from its `operator.cookie`.
    #[arg(
        long,
        env = "BLINDRELAY_STATE_DIR",
        required_unless_present = "cookie_file"
    )]
    pub state_dir: Option<PathBuf>,
    /// The cookie file, if not in the state dir.
    #[arg(long)]
    pub cookie_file: Option<PathBuf>,
}

impl OperatorArgs {
    /// The cookie file to read.
    pub fn cookie_path(&self) -> PathBuf {
        match (&self.cookie_file, &self.state_dir) {
            (Some(f), _) => f.clone(),
            (None, Some(d)) => d.join(crate::api::cookie::COOKIE_FILE),
            (None, None) => PathBuf::from(crate::api::cookie::COOKIE_FILE),
        }
    }
}

/// `blindrelay run` flags.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The node's state dir (from `blindrelay init`).
    #[arg(long, env = "BLINDRELAY_STATE_DIR")]
    pub state_dir: PathBuf,
    /// The public relay listener.
    #[arg(long, env = "BLINDRELAY_LISTEN")]
    pub listen: SocketAddr,
    /// The operator API listener (send, inbox, status). Keep it on loopback.
    #[arg(long, env = "BLINDRELAY_OPERATOR", default_value_t = DEFAULT_OPERATOR)]
    pub operator: SocketAddr,
    /// A peer: `ID@URL` pins the node id (64 hex) its URL must answer with; a bare `URL` trusts
    /// the first identity it answers with and refuses any other after (repeat for each peer).
    #[arg(long = "peer", env = "BLINDRELAY_PEERS", value_delimiter = ',', value_parser = PeerSpec::parse)]
    pub peers: Vec<PeerSpec>,
    /// A seed list (`blindrelay seeds`): more sources than the `--peer`s, pinned, the whole
    /// list signed. A list that does not verify refuses the start.
    #[arg(long, env = "BLINDRELAY_SEEDS")]
    pub seeds: Option<PathBuf>,
    /// Refuse a `--seeds` list signed by any other node id (64 hex) than this.
    #[arg(long, env = "BLINDRELAY_SEEDS_SIGNER", value_parser = parse_id)]
    pub seeds_signer: Option<crate::proto::NodeId>,
    /// How long this node's descriptor is valid (humantime, 60 s to 3 h); it is signed again
    /// at half of it. Peers forget a node whose descriptor lapsed, and greet it again now and
    /// then.
    #[arg(long, env = "BLINDRELAY_DESCRIPTOR_LIFETIME", default_value_t = humantime::Duration::from(std::time::Duration::from_secs(crate::proto::descriptor::DESCRIPTOR_TTL)), value_parser = parse_lifetime)]
    pub descriptor_lifetime: humantime::Duration,
    /// Accept next hops whose endpoint is a private or loopback address (test networks).
    #[arg(long)]
    pub allow_private_endpoints: bool,
    /// Let two hops of one route share a /16 (IPv4) or /32 (IPv6) block: only for a private
    /// network whose nodes all do (it gives up the bound on one block's share of routes).
    #[arg(long)]
    pub same_subnet_paths: bool,
    /// Where route reservations are kept: `sqlite` survives restarts, `memory` does not.
    #[arg(long, env = "BLINDRELAY_REPLAY_STORE", value_enum, default_value_t = ReplayStore::Sqlite)]
    pub replay_store: ReplayStore,
    /// Relay requests admitted per minute, process-wide (the request gate's rate, shared
    /// fairly per source).
    #[arg(long, env = "BLINDRELAY_ADMISSION_PER_MINUTE", default_value_t = gate::DEFAULT_PER_WINDOW)]
    pub admission_per_minute: u32,
    /// Percent of the admission rate only known peers (descriptor endpoints, verified previous
    /// hops) may use.
    #[arg(long, env = "BLINDRELAY_KNOWN_SHARE", default_value_t = gate::KNOWN_SHARE_PERCENT, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub known_share: u8,
    /// Relay requests in flight at most.
    #[arg(long, env = "BLINDRELAY_MAX_IN_FLIGHT", default_value_t = gate::MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Relay requests one source (address block) may have in flight.
    #[arg(long, env = "BLINDRELAY_IN_FLIGHT_PER_SOURCE", default_value_t = gate::IN_FLIGHT_PER_SOURCE)]
    pub in_flight_per_source: usize,
    /// The cheap budget: relay requests per second one source may start, before anything is
    /// read (burst: twice that).
    #[arg(long, env = "BLINDRELAY_CHEAP_PER_SECOND", default_value_t = gate::CHEAP_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..))]
    pub cheap_per_second: u32,
    /// IPv4 sources are grouped by this prefix length.
    #[arg(long, default_value_t = sources::DEFAULT_V4_PREFIX, value_parser = clap::value_parser!(u8).range(0..=32))]
    pub source_prefix_v4: u8,
    /// IPv6 sources are grouped by this prefix length.
    #[arg(long, default_value_t = sources::DEFAULT_V6_PREFIX, value_parser = clap::value_parser!(u8).range(0..=128))]
    pub source_prefix_v6: u8,
    /// A request head must arrive within this (also the idle timeout between requests).
    #[arg(long, env = "BLINDRELAY_HEADER_TIMEOUT", default_value_t = humantime::Duration::from(serve::HEADER_TIMEOUT))]
    pub header_timeout: humantime::Duration,
    /// Open connections per listener at most.
    #[arg(long, env = "BLINDRELAY_MAX_CONNECTIONS", default_value_t = serve::CONNECTIONS)]
    pub max_connections: usize,
    /// Open connections one source may hold.
    #[arg(long, env = "BLINDRELAY_CONNECTIONS_PER_SOURCE", default_value_t = serve::CONNECTIONS_PER_SOURCE)]
    pub connections_per_source: usize,
    /// Crypto slots (default: half the CPU threads rounded up, at least 4, at most 8; never
    /// fewer than 2).
    #[arg(long, env = "BLINDRELAY_CRYPTO_SLOTS")]
    pub crypto_slots: Option<usize>,
    /// The async runtime's worker threads, which read, refuse and answer requests (default:
    /// half the CPU threads rounded down, at least 1: the half the crypto slots leave).
    #[arg(long, env = "BLINDRELAY_WORKERS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub workers: Option<u16>,
    /// How long this node's own send (`POST /v1/send`, probes) may wait for a crypto slot before
    /// it is refused (`backpressure`). Relay requests from other nodes never wait: they get a
    /// slot at once or `backpressure` at once.
    #[arg(long, env = "BLINDRELAY_CRYPTO_WAIT", default_value_t = humantime::Duration::from(context::DEFAULT_CRYPTO_WAIT))]
    pub crypto_wait: humantime::Duration,
    /// Measuring only, not for a node in service: the cryptography runs on the runtime's
    /// workers instead of the crypto slots' blocking threads, so the slots never run out and a
    /// saturated node queues requests instead of refusing them at once (`backpressure`). What
    /// taking it off the reactor costs is measured with it (BENCHMARKS.md).
    #[arg(long, hide = true)]
    pub crypto_on_reactor: bool,
    /// Relay requests in flight to one next hop at most.
    #[arg(long, env = "BLINDRELAY_PER_NEXT_HOP", default_value_t = forward::PER_NEXT_HOP)]
    pub per_next_hop: usize,
    /// Requests one previous hop may send per window (more start a quarantine). The pacer
    /// assumes every peer runs the same limit and paces this node's requests to each next hop
    /// under it.
    #[arg(long, env = "BLINDRELAY_PREVIOUS_HOP_LIMIT", default_value_t = outbound::RATE_LIMIT, value_parser = clap::value_parser!(u32).range(1..))]
    pub previous_hop_limit: u32,
    /// The previous-hop limit's window (fixed windows), enforced and assumed of peers.
    #[arg(long, env = "BLINDRELAY_PREVIOUS_HOP_WINDOW", default_value_t = humantime::Duration::from(outbound::RATE_WINDOW))]
    pub previous_hop_window: humantime::Duration,
    /// Requests waiting for their turn to one next hop at most (more are refused:
    /// `next_hop_queue_full`).
    #[arg(long, env = "BLINDRELAY_NEXT_HOP_QUEUE", default_value_t = outbound::QUEUE_ENTRIES)]
    pub next_hop_queue: usize,
    /// Bytes of requests waiting for their turn to one next hop at most.
    #[arg(long, env = "BLINDRELAY_NEXT_HOP_QUEUE_BYTES", default_value_t = outbound::QUEUE_BYTES)]
    pub next_hop_queue_bytes: usize,
    /// Requests waiting for their turn over all next hops at most.
    #[arg(long, env = "BLINDRELAY_OUTBOUND_QUEUE", default_value_t = outbound::QUEUE_TOTAL_ENTRIES)]
    pub outbound_queue: usize,
    /// Bytes of requests waiting for their turn over all next hops at most.
    #[arg(long, env = "BLINDRELAY_OUTBOUND_QUEUE_BYTES", default_value_t = outbound::QUEUE_TOTAL_BYTES)]
    pub outbound_queue_bytes: usize,
    /// Inbox items at most.
    #[arg(long, env = "BLINDRELAY_INBOX_MAX_ITEMS", default_value_t = terminal::INBOX_MAX_ITEMS)]
    pub inbox_max_items: usize,
    /// Inbox payload bytes at most.
    #[arg(long, env = "BLINDRELAY_INBOX_MAX_BYTES", default_value_t = terminal::INBOX_MAX_BYTES)]
    pub inbox_max_bytes: u64,
    /// Delivered messages are deleted after this long (`0s`: kept until deleted).
    #[arg(long, env = "BLINDRELAY_INBOX_RETENTION", default_value_t = humantime::Duration::from(terminal::DEFAULT_RETENTION))]
    pub inbox_retention: humantime::Duration,
    /// Percent of the inbox (items and bytes) one source may hold.
    #[arg(long, env = "BLINDRELAY_INBOX_SHARE", default_value_t = terminal::INBOX_SOURCE_SHARE_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub inbox_share: u8,
    /// Live routes the replay registry holds at most.
    #[arg(long, env = "BLINDRELAY_REPLAY_CAPACITY", default_value_t = replay::CAPACITY)]
    pub replay_capacity: usize,
    /// Percent of the replay registry one source may hold.
    #[arg(long, env = "BLINDRELAY_REPLAY_SHARE", default_value_t = daemon::REPLAY_SOURCE_SHARE_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub replay_share: u8,
    /// Time between synthetic probe rounds (humantime, `0s` disables them).
    #[arg(long, env = "BLINDRELAY_PROBE_INTERVAL", default_value_t = humantime::Duration::from(probe::DEFAULT_INTERVAL))]
    pub probe_interval: humantime::Duration,
    /// Time between two fetches of every `--peer` URL's descriptor (humantime): an identity
    /// swapped behind a URL is caught within it.
    #[arg(long, env = "BLINDRELAY_PEER_REFRESH", default_value_t = humantime::Duration::from(crate::peers::ROUND))]
    pub peer_refresh: humantime::Duration,
    /// The discovery interval (humantime, `0s` disables discovery): a reconciliation of the
    /// node's descriptors with a peer every 5 of these (every one at first), pushes of what is
    /// new every twelfth of one, peers whose descriptors lapsed greeted again at most 2 apart.
    #[arg(long, env = "BLINDRELAY_GOSSIP_INTERVAL", default_value_t = humantime::Duration::from(crate::gossip::DEFAULT_INTERVAL))]
    pub gossip_interval: humantime::Duration,
    /// Start even when `replay.db` or `inbox.db`, opened by an earlier run, is missing or empty
    /// (earlier routes may then run again; delivered messages are gone). Logged as a warning.
    #[arg(long)]
    pub accept_lost_state: bool,
    /// Push the status document (the design's report) to this `http://` URL, at start and then
    /// every `--report-interval`. Off unless given.
    #[arg(long, env = "BLINDRELAY_REPORT_URL", value_parser = report::parse_url)]
    pub report_url: Option<String>,
    /// Time between status reports (at least 1 s).
    #[arg(long, env = "BLINDRELAY_REPORT_INTERVAL", default_value_t = humantime::Duration::from(report::DEFAULT_INTERVAL))]
    pub report_interval: humantime::Duration,
    /// How long one status report may take.
    #[arg(long, env = "BLINDRELAY_REPORT_TIMEOUT", default_value_t = humantime::Duration::from(report::DEFAULT_TIMEOUT))]
    pub report_timeout: humantime::Duration,
}

/// A `--seeds-signer` that is not a node id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a node id is 64 hex digits")]
pub struct BadNodeId;

/// A node id: 64 hex.
fn parse_id(s: &str) -> Result<crate::proto::NodeId, BadNodeId> {
    crate::proto::from_hex::<32>(s).ok_or(BadNodeId)
}

/// A `--descriptor-lifetime` out of its bounds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BadLifetime {
    /// Not a duration.
    #[error("{0}")]
    Duration(#[from] humantime::DurationError),
    /// Outside 60 s to the maximum.
    #[error("between 60 s and {0} s")]
    Bounds(u64),
}

/// A descriptor lifetime: 60 s to the default (the previous onion key is kept that long
/// after a rotation, `node::ONION_GRACE`).
fn parse_lifetime(s: &str) -> Result<humantime::Duration, BadLifetime> {
    let d: humantime::Duration = s.parse()?;
    let secs = std::time::Duration::from(d).as_secs();
    let max = crate::proto::descriptor::DESCRIPTOR_TTL;
    if (60..=max).contains(&secs) {
        Ok(d)
    } else {
        Err(BadLifetime::Bounds(max))
    }
}

/// Why the `--seeds` list was refused: it names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum SeedsError {
    /// The file cannot be read.
    #[error("--seeds {}: {kind}", file.display())]
    Read {
        /// The file given.
        file: PathBuf,
        /// What the file system said.
        kind: std::io::ErrorKind,
    },
    /// The file is larger than a seed list may be.
    #[error("--seeds {}: larger than a seed list may be", .0.display())]
    TooLarge(PathBuf),
    /// The list does not verify.
    #[error("--seeds {}: {why}", file.display())]
    Invalid {
        /// The file given.
        file: PathBuf,
        /// Why it does not verify.
        why: crate::peers::seeds::SeedError,
    },
}

impl RunArgs {
    /// The `--seeds` list's peers, verified (none without `--seeds`).
    ///
    /// # Errors
    /// The file cannot be read, or is not a seed list that verifies.
    pub fn seed_peers(&self) -> Result<Vec<PeerSpec>, SeedsError> {
        let Some(path) = &self.seeds else {
            return Ok(Vec::new());
        };
        let read = |e: std::io::Error| SeedsError::Read {
            file: path.clone(),
            kind: e.kind(),
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        if meta.len() > crate::peers::seeds::MAX_FILE {
            return Err(SeedsError::TooLarge(path.clone()));
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let seeds =
            crate::peers::seeds::parse(&text, self.seeds_signer.as_ref()).map_err(|why| {
                SeedsError::Invalid {
                    file: path.clone(),
                    why,
                }
            })?;
        Ok(seeds.peers)
    }

    /// What `daemon::build` needs, on the system clock.
    pub fn run_config(&self) -> RunConfig {
        RunConfig {
            state_dir: self.state_dir.clone(),
            peers: self.peers.clone(),
            replay_store: self.replay_store,
            accept_lost_state: self.accept_lost_state,
            relay: RelayConfig {
                gate: GateConfig {
                    per_minute: self.admission_per_minute,
                    max_in_flight: self.max_in_flight,
                    known_share_percent: self.known_share,
                    cheap_per_second: self.cheap_per_second,
                    in_flight_per_source: self.in_flight_per_source,
                },
                grouping: Grouping {
                    v4_prefix: self.source_prefix_v4,
                    v6_prefix: self.source_prefix_v6,
                },
                listen: self.listen_config(),
                context: self.context_config(),
                stores: StoresConfig {
                    replay_capacity: self.replay_capacity,
                    replay_share_percent: self.replay_share,
                    inbox_max_items: self.inbox_max_items,
                    inbox_max_bytes: self.inbox_max_bytes,
                    inbox_retention: self.inbox_retention.into(),
                    inbox_share_percent: self.inbox_share,
                },
                discovery: DiscoveryConfig {
                    allow_private_endpoints: self.allow_private_endpoints,
                    peer_refresh: self.peer_refresh.into(),
                    probe_interval: self.probe_interval.into(),
                    gossip_interval: self.gossip_interval.into(),
                    descriptor_lifetime: std::time::Duration::from(self.descriptor_lifetime)
                        .as_secs(),
                },
                report: self.report_url.clone().map(|url| report::ReportConfig {
                    url,
                    interval: self.report_interval.into(),
                    timeout: self.report_timeout.into(),
                }),
            },
            clock: Clock::System,
        }
    }

    /// The listeners' limits.
    fn listen_config(&self) -> serve::ListenConfig {
        serve::ListenConfig {
            header_timeout: self.header_timeout.into(),
            connections: CountLimits {
                total: self.max_connections,
                per_source: self.connections_per_source,
                reserved: serve::CONNECTIONS_RESERVED.min(self.max_connections / 2),
            },
        }
    }

    /// The context's settings: crypto slots, next hops, the outbound queue, the bind address.
    fn context_config(&self) -> ContextConfig {
        ContextConfig {
            crypto_slots: self
                .crypto_slots
                .map_or_else(context::default_crypto_slots, |n| n.max(MIN_CRYPTO_SLOTS)),
            crypto_wait: self.crypto_wait.into(),
            crypto_on_reactor: self.crypto_on_reactor,
            per_next_hop: self.per_next_hop,
            hop_rate: HopRate {
                limit: self.previous_hop_limit,
                window: self.previous_hop_window.into(),
            },
            queue: QueueLimits {
                per_hop_entries: self.next_hop_queue,
                per_hop_bytes: self.next_hop_queue_bytes,
                total_entries: self.outbound_queue,
                total_bytes: self.outbound_queue_bytes,
            },
            bind: Some(self.listen.ip()).filter(|ip| !ip.is_unspecified()),
            distinct_blocks: !self.same_subnet_paths,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut argv = vec!["blindrelay", "run", "--state-dir", "/x"];
        if !extra.contains(&"--listen") {
            argv.extend_from_slice(&["--listen", "0.0.0.0:1"]);
        }
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => *args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_the_constants() {
        let args = run_args(&[]);
        assert_eq!(args.operator.to_string(), "127.0.0.1:7070");
        let c = args.run_config();
        let d = RelayConfig::new(false);
        // A tag is kept at most 840 s: the default capacity holds the default rate's tags.
        assert_eq!(
            replay::CAPACITY,
            gate::DEFAULT_PER_WINDOW as usize * 840 / 60
        );
        assert_eq!(
            (
                c.relay.gate.per_minute,
                c.relay.gate.max_in_flight,
                c.relay.context.crypto_slots
            ),
            (
                d.gate.per_minute,
                d.gate.max_in_flight,
                d.context.crypto_slots
            )
        );
        assert_eq!(
            (
                c.relay.gate.known_share_percent,
                c.relay.grouping,
                c.relay.listen,
                c.relay.context.crypto_wait,
                c.relay.context.per_next_hop,
                c.relay.context.hop_rate,
                c.relay.context.queue,
            ),
            (
                d.gate.known_share_percent,
                d.grouping,
                d.listen,
                d.context.crypto_wait,
                d.context.per_next_hop,
                d.context.hop_rate,
                d.context.queue,
            )
        );
        assert_eq!(
            (
                c.relay.stores.inbox_max_items,
                c.relay.stores.inbox_max_bytes,
                c.relay.stores.inbox_retention,
                c.relay.stores.inbox_share_percent,
                c.relay.stores.replay_capacity,
                c.relay.stores.replay_share_percent,
                c.relay.gate.cheap_per_second,
                c.relay.gate.in_flight_per_source,
            ),
            (
                d.stores.inbox_max_items,
                d.stores.inbox_max_bytes,
                d.stores.inbox_retention,
                d.stores.inbox_share_percent,
                d.stores.replay_capacity,
                d.stores.replay_share_percent,
                d.gate.cheap_per_second,
                d.gate.in_flight_per_source,
            )
        );
        assert_eq!(c.relay.context.bind, None, "0.0.0.0 binds nothing");
        assert_eq!(
            c.relay.discovery.probe_interval,
            std::time::Duration::from_secs(300)
        );
        assert_eq!(c.replay_store, ReplayStore::Sqlite);
        let c = run_args(&["--probe-interval", "0s", "--crypto-slots", "1"]).run_config();
        assert_eq!(c.relay.discovery.probe_interval, std::time::Duration::ZERO);
        assert_eq!(c.relay.context.crypto_slots, MIN_CRYPTO_SLOTS);
        match Cli::try_parse_from(["blindrelay", "send", "--state-dir", "d", "--to", "t"])
            .unwrap()
            .command
        {
            Command::Send { hops, file, .. } => assert_eq!((hops, file.as_str()), (3, "-")),
            other => panic!("{other:?}"),
        }
    }

    /// The flags an operator sets in a unit file read `BLINDRELAY_` and their name; the ones
    /// for tests, measuring or a one-off recovery do not.
    #[test]
    fn operator_flags_have_environment_fallbacks_named_like_the_flag() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let run = cli.find_subcommand("run").unwrap();
        let none = [
            "allow-private-endpoints",
            "same-subnet-paths",
            "crypto-on-reactor",
            "accept-lost-state",
            "source-prefix-v4",
            "source-prefix-v6",
        ];
        for arg in run.get_arguments() {
            let Some(flag) = arg.get_long() else { continue };
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            if none.contains(&flag) || flag == "help" {
                assert_eq!(env, None, "--{flag}");
                continue;
            }
            let name = if flag == "peer" { "peers" } else { flag };
            let want = format!("BLINDRELAY_{}", name.replace('-', "_").to_uppercase());
            assert_eq!(env.as_deref(), Some(want.as_str()), "--{flag}");
        }
        for sub in ["init", "seeds", "send", "inbox", "status"] {
            let c = cli.find_subcommand(sub).unwrap();
            let dir = c
                .get_arguments()
                .find(|a| a.get_long() == Some("state-dir"));
            let env = dir.and_then(|a| a.get_env()).unwrap();
            assert_eq!(env, "BLINDRELAY_STATE_DIR", "{sub}");
        }
        let init = cli.find_subcommand("init").unwrap();
        let endpoint = init
            .get_arguments()
            .find(|a| a.get_long() == Some("endpoint"));
        let env = endpoint.and_then(|a| a.get_env()).unwrap();
        assert_eq!(
            env, "BLINDRELAY_ENDPOINT",
            "as the packaged unit's file names it"
        );
    }

    #[test]
    fn the_config_is_built_from_the_flags() {
        let c = run_args(&[
            "--listen",
            "192.0.2.1:7001",
            "--same-subnet-paths",
            "--admission-per-minute",
            "600",
            "--inbox-retention",
            "0s",
            "--report-url",
            "http://127.0.0.1:9/r",
            "--peer",
            "https://192.0.2.2:7001,https://192.0.2.3:7001",
        ])
        .run_config();
        let r = &c.relay;
        assert_eq!(r.context.bind, Some("192.0.2.1".parse().unwrap()));
        assert!(!r.context.distinct_blocks);
        assert_eq!(r.gate.per_minute, 600);
        assert!(r.stores.inbox_retention.is_zero());
        assert_eq!(
            r.report.as_ref().map(|r| r.url.as_str()),
            Some("http://127.0.0.1:9/r")
        );
        assert_eq!(c.peers.len(), 2, "a comma separates peers");
    }
}
