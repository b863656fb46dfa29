//! The command line: `etrelay [OPTIONS] <UPSTREAM>` relays one server;
//! `etrelay --ports … --control … --token-file …` relays the servers registered through the
//! control API; `etrelay admin …` is the admin tool's side.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use crate::config::{
    self, BadMaster, ChallengeConfig, DEFAULT_MASTERS, Game, JoinLimits, QueryLimits,
    ReflectionLimits, ServerConfig, SessionCaps, SessionLimits,
};
use crate::control::listen::{self, ListenLimits};
use crate::daemon::{DaemonConfig, PortsError};
use crate::registry::RegistryConfig;
use crate::secret::Secret;
use crate::single::SingleConfig;

/// `--state-dir` with `--ports` when none is given.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/etrelay";

/// UDP relay for Wolfenstein: Enemy Territory (Quake 3 engine) servers behind NAT.
///
/// Owns the public port, proxies players, server browsers and masters to the game server (one
/// upstream socket per client), drops what clients have no business sending (rcon in every
/// spelling a server would run), limits and caches getstatus/getinfo, and sends the master
/// heartbeats itself so the masters list the relay's address.
///
/// One server: `etrelay [OPTIONS] <UPSTREAM>`. Several: `etrelay --ports 27960-27969 --control
/// 10.0.0.1:8080 --token-file /etc/etrelay/token`, then each game server's admin registers it
/// with `etrelay admin register`.
#[derive(Debug, Parser)]
#[command(
    name = "etrelay",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// `admin`: the game server admin's tool.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Running the relay.
    #[command(flatten)]
    pub run: RunArgs,
}

impl Cli {
    /// [`Cli`] from `args` (the program's name first) and the environment. A conflict caused by an `ETRELAY_*` variable rather than by a flag typed names the
    /// variable: an operator who never typed `--control` cannot make sense of "'[UPSTREAM]'
    /// cannot be used with '--control'" when `ETRELAY_CONTROL` is set in an environment file.
    ///
    /// # Errors
    /// clap's error, for the caller to print and exit with (`clap::Error::exit`).
    pub fn parse_args(
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Result<Cli, clap::Error> {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut command = Cli::command();
        let err = match command.try_get_matches_from_mut(&args) {
            Ok(mut matches) => return Cli::from_arg_matches_mut(&mut matches),
            Err(e) if e.kind() == ErrorKind::ArgumentConflict => e,
            Err(e) => return Err(e),
        };
        let context = |kind| match err.get(kind) {
            Some(ContextValue::String(s)) => vec![s.clone()],
            Some(ContextValue::Strings(s)) => s.clone(),
            _ => Vec::new(),
        };
        let (invalid, prior) = (
            context(ContextKind::InvalidArg),
            context(ContextKind::PriorArg),
        );
        let typed = |long: &str| {
            args.iter().skip(1).any(|a| {
                a.to_str().is_some_and(|a| {
                    a.strip_prefix("--")
                        .is_some_and(|a| a == long || a.starts_with(&format!("{long}=")))
                })
            })
        };
        let from_env: Vec<String> = command
            .get_arguments()
            .filter_map(|arg| {
                let (var, long) = (arg.get_env()?.to_str()?, arg.get_long()?);
                let value = std::env::var_os(var).filter(|v| !v.is_empty())?;
                let named = invalid.iter().chain(&prior).any(|a| {
                    a.strip_prefix("--")
                        .is_some_and(|a| a.split(' ').next() == Some(long))
                });
                (named && !typed(long)).then(|| {
                    format!(
                        "--{long} was not typed: it comes from {var}={} in the environment \
                         (an environment file?)",
                        value.to_string_lossy()
                    )
                })
            })
            .collect();
        if from_env.is_empty() {
            return Err(err);
        }
        Err(command.error(
            ErrorKind::ArgumentConflict,
            format!(
                "'{}' cannot be used with '{}': {}. Unset it to relay one server: it belongs \
                 with --ports alone, in the several-servers unit's own environment file \
                 (/etc/default/etrelay-multi with the Debian package)",
                invalid.join("', '"),
                prior.join("', '"),
                from_env.join("; ")
            ),
        ))
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The tool a game server's admin runs next to the server: register it with a relay (with
    /// proof of console access), see its sessions, ban and unban, leave.
    #[command(subcommand)]
    Admin(crate::admin::AdminCommand),
}

/// A list of ports, `27960-27969,27975`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(pub Vec<u16>);

fn parse_ports(s: &str) -> Result<Ports, PortsError> {
    crate::daemon::parse_ports(s).map(Ports)
}

/// Why the command line asks for nothing that can run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither an upstream nor `--ports`.
    #[error("give the game server to relay, or --ports for several")]
    NoMode,
    /// `--ports` without `--control`.
    #[error("--ports needs --control")]
    NoControl,
    /// The token file cannot be read, or the token is short.
    #[error(transparent)]
    Token(#[from] crate::daemon::TokenError),
    /// No token file and no `ETRELAY_TOKEN`.
    #[error("--ports needs the relay token: --token-file or ETRELAY_TOKEN")]
    NoToken,
    /// A malformed master.
    #[error(transparent)]
    Master(#[from] BadMaster),
    /// The upstream cannot be resolved.
    #[error("upstream {upstream:?}: {source}")]
    Resolve {
        /// The upstream as given.
        upstream: String,
        /// Why.
        source: std::io::Error,
    },
    /// The upstream resolves to no address.
    #[error("upstream {0:?} has no address")]
    NoAddress(String),
}

/// How to run: one server, or the registry of several.
#[derive(Debug)]
pub enum Mode {
    /// `etrelay <UPSTREAM>`: one server on `--listen`.
    Single(SingleConfig),
    /// `etrelay --ports …`: servers registered through the control API.
    Multi(DaemonConfig),
}

/// The relay's flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// One server: the game server to relay, `ip:port` (or `host:port`, resolved once at start).
    #[arg(required_unless_present = "ports", conflicts_with_all = ["ports", "control", "token_file"])]
    pub upstream: Option<String>,

    /// Address of the public socket clients and masters reach (one-server mode).
    #[arg(long, env = "ETRELAY_LISTEN", default_value = "0.0.0.0:27960")]
    pub listen: SocketAddr,

    /// Several servers: the public ports registered servers may have, e.g.
    /// `27960-27969,27975`; free ones are given out in this order.
    #[arg(long, value_parser = parse_ports, requires = "control")]
    pub ports: Option<Ports>,

    /// Address of the control API (the front host's tunnel address, never a public one). If it
    /// cannot be bound yet, the relay tries again every 10 s.
    #[arg(long, env = "ETRELAY_CONTROL")]
    pub control: Option<SocketAddr>,

    /// File holding the relay token (at least 32 characters) that admin tools need to register
    /// a server. The token can come from `ETRELAY_TOKEN` instead.
    #[arg(long)]
    pub token_file: Option<PathBuf>,

    /// Where registered servers, their bans and their proven sources are kept
    /// (`servers.json`, `bans-<port>.db`, `proven-<port>.json`); default `/var/lib/etrelay`
    /// with `--ports`. With one upstream, the proven sources are kept here only when it is
    /// given (else in memory).
    #[arg(long, env = "ETRELAY_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Address the public ports of registered servers bind on.
    #[arg(long, env = "ETRELAY_BIND", default_value = "0.0.0.0")]
    pub bind: IpAddr,

    /// Connections to the control API at once; more are closed at once.
    #[arg(long, default_value_t = listen::MAX_CONNS, value_parser = clap::value_parser!(u32).range(1..=4096).map(|v| v as usize))]
    pub control_max_conns: usize,

    /// Connections to the control API from one address at once; more are closed at once.
    #[arg(long, default_value_t = listen::MAX_CONNS_PER_IP, value_parser = clap::value_parser!(u32).range(1..=4096).map(|v| v as usize))]
    pub control_conns_per_ip: usize,

    /// Accept upstreams on loopback addresses (127.0.0.0/8, ::1). For tests and demos that run
    /// everything on one host: a real game server is never the relay's own host.
    #[arg(long)]
    pub allow_loopback_upstream: bool,

    /// Masters to heartbeat, comma-separated `host:port`, resolved on every heartbeat.
    /// An empty value disables heartbeats.
    #[arg(long, env = "ETRELAY_MASTERS", default_value = DEFAULT_MASTERS)]
    pub masters: String,

    /// Master protocol: `et` heartbeats `EnemyTerritory-1` and flatlines `ETFlatline-1`;
    /// `q3` heartbeats `QuakeArena-1` (OpenArena and other Quake 3 engine servers), no flatline.
    #[arg(long, value_enum, env = "ETRELAY_GAME", default_value_t = config::GAME)]
    pub game: Game,

    /// Time between two heartbeat rounds, start to start (humantime: `5m`, `30s`, `2s`).
    #[arg(long, env = "ETRELAY_HEARTBEAT_INTERVAL", default_value = config::HEARTBEAT_INTERVAL_TEXT, value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,

    /// Wait for each of the 3 probes (`getinfo` before heartbeats, `getstatus` for a
    /// registration's proof) before the game server counts as not answering.
    #[arg(long, default_value = config::PROBE_TIMEOUT_TEXT, value_parser = humantime::parse_duration)]
    pub probe_timeout: Duration,

    /// A session closes after this long without a packet either way.
    #[arg(long, default_value = config::SESSION_TIMEOUT_TEXT, value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,

    /// Packets a session holds for the game server; a full queue drops the packet.
    #[arg(long, default_value_t = config::SESSION_QUEUE, value_parser = clap::value_parser!(u32).range(1..=65_536).map(|v| v as usize))]
    pub session_queue: usize,

    /// Sessions open at once (one socket each), all servers together; no new session past it.
    #[arg(long, default_value_t = config::MAX_SESSIONS)]
    pub max_sessions: usize,

    /// A session the game server has not yet shown to be a real client (half-open) closes
    /// after this long without a packet either way.
    #[arg(long, default_value = config::HALF_OPEN_TIMEOUT_TEXT, value_parser = humantime::parse_duration)]
    pub half_open_timeout: Duration,

    /// Half-open sessions per server; at the cap the oldest is recycled for a newcomer.
    #[arg(long, default_value_t = config::HALF_OPEN_PER_SERVER, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub half_open_per_server: usize,

    /// Half-open sessions one source IP may hold per server; refused past it.
    #[arg(long, default_value_t = config::HALF_OPEN_PER_IP, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub half_open_per_ip: usize,

    /// Half-open sessions one /24 (IPv4) or /64 (IPv6) may hold per server; refused past it.
    #[arg(long, default_value_t = config::HALF_OPEN_PER_PREFIX, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub half_open_per_prefix: usize,

    /// Established sessions per server (never evicted for newcomers); refused past it.
    #[arg(long, default_value_t = config::SESSIONS_PER_SERVER, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub sessions_per_server: usize,

    /// Established sessions one source IP may hold per server; refused past it.
    #[arg(long, default_value_t = config::SESSIONS_PER_IP, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub sessions_per_ip: usize,

    /// Bytes queued towards the game servers, all sessions together; a packet past it is
    /// dropped.
    #[arg(long, default_value_t = config::MAX_QUEUED_BYTES, value_parser = clap::value_parser!(u32).range(65_536..).map(|v| v as usize))]
    pub max_queued_bytes: usize,

    /// An established session moves to a new port of its IP (a NAT that rebound) when in-game
    /// packets with its qport come from there after its client was silent this long.
    #[arg(long, default_value = config::REBIND_QUIET_TEXT, value_parser = humantime::parse_duration)]
    pub rebind_quiet: Duration,

    /// getchallenge a source IP may send at once…
    #[arg(long, default_value_t = config::JOIN_SOURCE_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub join_source_burst: u32,

    /// …then one per this interval.
    #[arg(long, default_value = config::JOIN_SOURCE_INTERVAL_TEXT, value_parser = humantime::parse_duration)]
    pub join_source_interval: Duration,

    /// Requests the game server limits per source IP (getchallenge and cache refreshes) the
    /// relay sends at once. Default: 8 with `--game q3` (under ioquake3's 10), 64 with
    /// `--game et`. Use the q3 values for ET: Legacy with `sv_protect 1`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub upstream_burst: Option<u32>,

    /// …then one per this interval. Default: 1s with `--game q3`, 10ms with `--game et`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub upstream_interval: Option<Duration>,

    /// One server: serve the counters (Prometheus text) at `GET /metrics` on this address.
    /// Keep it off public addresses.
    #[arg(long, conflicts_with = "ports")]
    pub metrics: Option<SocketAddr>,

    /// Largest datagram a client may send, in bytes; larger ones are dropped (and counted, and
    /// a flood of them logged). The default, 1400, is the engines' `MAX_PACKETLEN`: no Quake 3
    /// engine client (ioquake3, ET 2.60b, ET: Legacy) sends more.
    #[arg(long, env = "ETRELAY_MAX_PACKET", default_value_t = config::MAX_PACKET, value_parser = clap::value_parser!(u32).range(16..=65_535).map(|v| v as usize))]
    pub max_packet: usize,

    /// Let the game server give the challenges, as without the relay: every getchallenge goes
    /// to it through the fair join gate and nothing is translated. By default the relay answers
    /// getchallenge itself (no server challenge spent, no session opened, for a spoofed one)
    /// and translates the challenge of every client it lets in, for the protocols it knows
    /// (ioquake3's 71, ET's 82 to 84).
    #[arg(long, env = "ETRELAY_SERVER_CHALLENGES")]
    pub server_challenges: bool,

    /// getchallenge the relay answers itself per second at most, all sources together.
    #[arg(long, default_value_t = config::CHALLENGE_ANSWERS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub challenge_answers: u32,

    /// Send to the game server one socket at a time (`sendmmsg`), not a whole batch over all
    /// sessions' sockets with one `io_uring` call. Without this flag io_uring is used where the
    /// kernel allows it, and the relay falls back by itself where it does not.
    #[arg(long, env = "ETRELAY_NO_IO_URING")]
    pub no_io_uring: bool,

    /// getstatus/getinfo a source IP may send at once…
    #[arg(long, default_value_t = config::QUERY_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub query_burst: u32,

    /// …then one per this interval.
    #[arg(long, default_value = config::QUERY_INTERVAL_TEXT, value_parser = humantime::parse_duration)]
    pub query_interval: Duration,

    /// Source IPs the query limiter remembers at most. At the cap, sources whose bucket has
    /// refilled make room; if none has, new sources are refused until one does.
    #[arg(long, default_value_t = config::MAX_QUERY_SOURCES, value_parser = clap::value_parser!(u32).range(1..=16_777_216).map(|v| v as usize))]
    pub query_sources: usize,

    /// A source idle this long is forgotten.
    #[arg(long, default_value = config::QUERY_FORGET_TEXT, value_parser = humantime::parse_duration)]
    pub query_forget: Duration,

    /// getinfo/getstatus are answered from the server's last answer while it is younger than
    /// this; `0s` disables the cache (queries then go to the server like any packet).
    #[arg(long, default_value = config::CACHE_MAX_AGE_TEXT, value_parser = humantime::parse_duration)]
    pub cache_max_age: Duration,

    /// getstatus/getinfo answered per source prefix (see --answer-prefix-v4/-v6) per
    /// --answer-window at most, from the cache or not.
    #[arg(long, default_value_t = config::ANSWERS_PER_PREFIX, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub answers_per_prefix: u32,

    /// getstatus/getinfo answered in all per --answer-window at most: bounds what any number
    /// of spoofed sources can make the relay send.
    #[arg(long, default_value_t = config::ANSWERS_GLOBAL, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub answers_global: u32,

    /// The window of the answer budget.
    #[arg(long, default_value = config::ANSWER_WINDOW_TEXT, value_parser = humantime::parse_duration)]
    pub answer_window: Duration,

    /// IPv4 sources share an answer budget per prefix of this length.
    #[arg(long, default_value_t = config::ANSWER_PREFIX_V4, value_parser = clap::value_parser!(u8).range(8..=32))]
    pub answer_prefix_v4: u8,

    /// IPv6 sources share an answer budget per prefix of this length.
    #[arg(long, default_value_t = config::ANSWER_PREFIX_V6, value_parser = clap::value_parser!(u8).range(16..=128))]
    pub answer_prefix_v6: u8,

    /// Never sleep waiting for datagrams: the relay keeps one CPU busy all the time, idle or
    /// not, and answers without the wake-up a sleeping thread needs (on a virtual machine,
    /// most of the time the relay adds to a round trip). Off unless asked for.
    #[arg(long, env = "ETRELAY_BUSY_POLLING")]
    pub busy_polling: bool,

    /// Log every session and connectionless packet (overridden by `RUST_LOG`).
    #[arg(long)]
    pub debug: bool,
}

impl RunArgs {
    /// What this command line asks for.
    ///
    /// # Errors
    /// [`CliError`]: an upstream that does not resolve, a malformed master, or a missing or
    /// short relay token.
    pub fn mode(&self) -> Result<Mode, CliError> {
        match (&self.upstream, &self.ports) {
            (Some(u), _) => Ok(Mode::Single(SingleConfig {
                server: ServerConfig {
                    proven_file: self
                        .state_dir
                        .as_ref()
                        .map(|d| d.join(format!("proven-{}.json", self.listen.port()))),
                    carry_file: self
                        .state_dir
                        .as_ref()
                        .map(|d| crate::server::carry_path(d, self.listen.port())),
                    ..self.server_config(resolve(u)?)?
                },
                listen: self.listen,
                max_sessions: self.max_sessions,
                max_queued_bytes: self.max_queued_bytes,
                metrics: self.metrics,
                allow_loopback: self.allow_loopback_upstream,
            })),
            (None, Some(ports)) => {
                let control = self.control.ok_or(CliError::NoControl)?;
                let token = self.token()?;
                // Each server's upstream comes with its registration.
                let template = self.server_config(SocketAddr::from(([127, 0, 0, 1], 27960)))?;
                Ok(Mode::Multi(DaemonConfig {
                    registry: RegistryConfig {
                        ports: ports.0.clone(),
                        bind: self.bind,
                        state_dir: self
                            .state_dir
                            .clone()
                            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
                        template,
                        control: Some(control),
                        allow_loopback: self.allow_loopback_upstream,
                    },
                    control,
                    listen: ListenLimits::new(
                        self.control_max_conns,
                        self.control_conns_per_ip,
                        self.probe_timeout * config::PROBE_ATTEMPTS,
                    ),
                    token,
                    token_file: self.token_file.clone(),
                    max_sessions: self.max_sessions,
                    max_queued_bytes: self.max_queued_bytes,
                    proof_timeout: self.probe_timeout,
                }))
            }
            (None, None) => Err(CliError::NoMode),
        }
    }

    fn token(&self) -> Result<Secret, CliError> {
        let read = match &self.token_file {
            Some(path) => crate::daemon::read_token_file(path),
            None => crate::daemon::checked_token(
                std::env::var("ETRELAY_TOKEN")
                    .map_err(|_| CliError::NoToken)?
                    .trim()
                    .to_string(),
            ),
        };
        Ok(read?)
    }

    /// The settings of a server relaying `upstream`.
    ///
    /// # Errors
    /// [`BadMaster`] for a malformed master.
    pub fn server_config(&self, upstream: SocketAddr) -> Result<ServerConfig, BadMaster> {
        let masters = config::parse_masters(&self.masters);
        for m in &masters {
            config::check_master(m)?;
        }
        Ok(ServerConfig {
            upstream,
            game: self.game,
            masters,
            heartbeat_interval: self.heartbeat_interval,
            probe_timeout: self.probe_timeout,
            session: SessionLimits {
                timeout: self.session_timeout,
                queue: self.session_queue,
                max_packet: self.max_packet,
                io_uring: !self.no_io_uring,
            },
            query: QueryLimits {
                burst: self.query_burst,
                interval: self.query_interval,
                max_sources: self.query_sources,
                forget: self.query_forget,
            },
            cache_max_age: self.cache_max_age,
            caps: SessionCaps {
                half_open_timeout: self.half_open_timeout,
                half_open_per_server: self.half_open_per_server,
                half_open_per_ip: self.half_open_per_ip,
                half_open_per_prefix: self.half_open_per_prefix,
                established_per_server: self.sessions_per_server,
                established_per_ip: self.sessions_per_ip,
                rebind_quiet: self.rebind_quiet,
            },
            joins: {
                let d = JoinLimits::for_game(self.game);
                JoinLimits {
                    source_burst: self.join_source_burst,
                    source_interval: self.join_source_interval,
                    upstream_burst: self.upstream_burst.unwrap_or(d.upstream_burst),
                    upstream_interval: self.upstream_interval.unwrap_or(d.upstream_interval),
                }
            },
            reflection: ReflectionLimits {
                per_prefix: self.answers_per_prefix,
                global: self.answers_global,
                window: self.answer_window,
                v4_prefix: self.answer_prefix_v4,
                v6_prefix: self.answer_prefix_v6,
                max_prefixes: config::MAX_ANSWER_PREFIXES,
            },
            proven_file: None,
            challenges: ChallengeConfig {
                server: self.server_challenges,
                answers_per_second: self.challenge_answers,
            },
            carry_file: None,
        })
    }
}

fn resolve(s: &str) -> Result<SocketAddr, CliError> {
    s.to_socket_addrs()
        .map_err(|source| CliError::Resolve {
            upstream: s.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| CliError::NoAddress(s.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A conflict typed on the command line is clap's own error (the environment case, which
    /// names the variable: `tests/binary.rs`).
    #[test]
    fn a_typed_conflict_is_clap_s_error() {
        let typed = ["etrelay", "--control", "10.0.0.1:8080", "127.0.0.1:27960"];
        let err = Cli::parse_args(typed).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ArgumentConflict);
        assert!(!err.to_string().contains("ETRELAY_CONTROL"), "{err}");
        assert!(Cli::parse_args(["etrelay", "127.0.0.1:27960"]).is_ok());
    }

    #[test]
    fn defaults_are_the_design_constants() {
        let cli = Cli::try_parse_from(["etrelay", "127.0.0.1:27960"])
            .unwrap()
            .run;
        let Mode::Single(SingleConfig { server: c, .. }) = cli.mode().unwrap() else {
            panic!("single")
        };
        assert_eq!(cli.listen, "0.0.0.0:27960".parse().unwrap());
        assert_eq!(
            c.masters,
            vec!["etmaster.idsoftware.com:27950", "etmaster.net:27950"]
        );
        assert_eq!(c.heartbeat_interval, config::HEARTBEAT_INTERVAL);
        assert_eq!(c.session.timeout, config::SESSION_TIMEOUT);
        assert_eq!(c.session.queue, 64);
        assert_eq!(c.session.max_packet, 1_400);
        assert!(!c.challenges.server);
        assert_eq!(cli.max_sessions, 2048);
        assert_eq!(c.query.burst, 5);
        assert_eq!(c.query.max_sources, 65_536);
        assert_eq!(c.query.forget, Duration::from_secs(60));
        assert_eq!(c.cache_max_age, Duration::from_secs(1));
        assert_eq!(c.game, Game::Et);
        assert_eq!(c.caps.half_open_per_server, config::HALF_OPEN_PER_SERVER);
        assert_eq!(c.caps.half_open_timeout, config::HALF_OPEN_TIMEOUT);
        assert_eq!(c.joins.upstream_burst, config::UPSTREAM_BURST_ET);
        let q3 = Cli::try_parse_from(["etrelay", "--game", "q3", "127.0.0.1:1"])
            .unwrap()
            .run
            .server_config("127.0.0.1:1".parse().unwrap())
            .unwrap();
        assert_eq!(q3.joins.upstream_burst, config::UPSTREAM_BURST_Q3);
        assert_eq!(q3.joins.upstream_interval, config::UPSTREAM_INTERVAL_Q3);
    }

    #[test]
    fn flags() {
        let cli = Cli::try_parse_from([
            "etrelay",
            "--masters",
            "",
            "--game",
            "q3",
            "--heartbeat-interval",
            "2s",
            "127.0.0.1:1",
        ])
        .unwrap()
        .run;
        let Mode::Single(SingleConfig { server: c, .. }) = cli.mode().unwrap() else {
            panic!("single")
        };
        assert!(c.masters.is_empty());
        assert_eq!(c.game, Game::Q3);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
        assert!(
            Cli::try_parse_from(["etrelay", "--masters", "nohost", "127.0.0.1:1"])
                .unwrap()
                .run
                .mode()
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["etrelay", "--heartbeat-interval", "soon", "127.0.0.1:1"])
                .is_err()
        );
    }

    #[test]
    fn several_servers_mode() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t".repeat(32)).unwrap();
        let t = token.to_str().unwrap();
        let args = [
            "etrelay",
            "--ports",
            "27960-27961",
            "--control",
            "127.0.0.1:8080",
            "--token-file",
            t,
        ];
        let cli = Cli::try_parse_from(args).unwrap().run;
        let Mode::Multi(d) = cli.mode().unwrap() else {
            panic!("multi")
        };
        assert_eq!(d.registry.ports, vec![27960, 27961]);
        assert_eq!(d.registry.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(d.registry.bind, IpAddr::from([0, 0, 0, 0]));
        // A short token is refused.
        std::fs::write(&token, "short").unwrap();
        assert!(Cli::try_parse_from(args).unwrap().run.mode().is_err());
        // --ports needs --control; one server and --ports do not mix.
        assert!(Cli::try_parse_from(["etrelay", "--ports", "27960"]).is_err());
        assert!(
            Cli::try_parse_from([
                "etrelay",
                "--ports",
                "27960",
                "--control",
                "127.0.0.1:1",
                "127.0.0.1:2"
            ])
            .is_err()
        );
        assert!(Cli::try_parse_from(["etrelay"]).is_err());
        // The admin tool is a subcommand.
        assert!(
            Cli::try_parse_from([
                "etrelay",
                "admin",
                "status",
                "--control",
                "http://127.0.0.1:1",
                "--key-file",
                t
            ])
            .is_ok()
        );
    }
}
