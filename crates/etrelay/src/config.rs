//! What one relayed server needs to run, with the design's defaults.
//!
//! The command line ([`crate::cli`]) builds these; tests build them directly. Every duration is
//! a [`Duration`] from here on. Each default is written once: a duration's default as the text
//! the command line shows and parses (`SESSION_TIMEOUT_TEXT`), and its [`Duration`]
//! (`SESSION_TIMEOUT`) read from that text at compile time.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Idle time after which a session closes (no packet either way).
pub const SESSION_TIMEOUT: Duration = duration(SESSION_TIMEOUT_TEXT);
/// [`SESSION_TIMEOUT`] as written.
pub const SESSION_TIMEOUT_TEXT: &str = "2m";
/// Packets a session holds for the game server before it drops more.
pub const SESSION_QUEUE: usize = 64;
/// Largest datagram a client may send, whatever `--game`: `MAX_PACKETLEN` of ioquake3, ET 2.60b
/// and ET: Legacy. Their clients never send more (a message over 1 300 bytes goes in
/// fragments); their servers refuse only from `MAX_MSGLEN` on (16 384 bytes for ioquake3,
/// 32 768 for ET), so anything between is junk the relay keeps off the tunnel.
pub const MAX_PACKET: usize = 1_400;
/// Largest datagram read from the game server (a `statusResponse` can exceed 16 KiB).
pub const MAX_ANSWER: usize = 65_535;
/// `getchallenge` the relay answers itself a second at most, all sources together.
pub const CHALLENGE_ANSWERS: u32 = 50_000;
/// Sessions open at once, all servers together (one socket each).
pub const MAX_SESSIONS: usize = 2048;
/// `getstatus`/`getinfo` a source IP may send at once…
pub const QUERY_BURST: u32 = 5;
/// …then one per this interval.
pub const QUERY_INTERVAL: Duration = duration(QUERY_INTERVAL_TEXT);
/// [`QUERY_INTERVAL`] as written.
pub const QUERY_INTERVAL_TEXT: &str = "1s";
/// Source IPs the query limiter remembers at most.
pub const MAX_QUERY_SOURCES: usize = 65_536;
/// A source idle this long (and whose bucket refilled) is forgotten.
pub const QUERY_FORGET: Duration = duration(QUERY_FORGET_TEXT);
/// [`QUERY_FORGET`] as written.
pub const QUERY_FORGET_TEXT: &str = "60s";
/// `getinfo`/`getstatus` answered per source prefix at most per [`ANSWER_WINDOW`]…
pub const ANSWERS_PER_PREFIX: u32 = 3;
/// …and in all (ET: Legacy's `SV_CheckDRDoS`: 3 per /24 and 48 in all per 2 s).
pub const ANSWERS_GLOBAL: u32 = 48;
/// The window of the answer budget.
pub const ANSWER_WINDOW: Duration = duration(ANSWER_WINDOW_TEXT);
/// [`ANSWER_WINDOW`] as written.
pub const ANSWER_WINDOW_TEXT: &str = "2s";
/// IPv4 sources share their answer budget by this prefix length…
pub const ANSWER_PREFIX_V4: u8 = 24;
/// …and IPv6 sources by this one.
pub const ANSWER_PREFIX_V6: u8 = 64;
/// Source prefixes the answer budget remembers at most.
pub const MAX_ANSWER_PREFIXES: usize = 65_536;
/// Age of a cached `infoResponse`/`statusResponse` past which the relay asks the server again.
pub const CACHE_MAX_AGE: Duration = duration(CACHE_MAX_AGE_TEXT);
/// [`CACHE_MAX_AGE`] as written.
pub const CACHE_MAX_AGE_TEXT: &str = "1s";
/// Time between the starts of two heartbeat rounds (a fixed period).
pub const HEARTBEAT_INTERVAL: Duration = duration(HEARTBEAT_INTERVAL_TEXT);
/// [`HEARTBEAT_INTERVAL`] as written.
pub const HEARTBEAT_INTERVAL_TEXT: &str = "5m";
/// Probes of the game server before it is declared down…
pub const PROBE_ATTEMPTS: u32 = 3;
/// …each waiting this long for the answer.
pub const PROBE_TIMEOUT: Duration = duration(PROBE_TIMEOUT_TEXT);
/// [`PROBE_TIMEOUT`] as written.
pub const PROBE_TIMEOUT_TEXT: &str = "3s";
/// A session the game server has not yet shown to be a real client (half-open) closes after
/// this long without a packet either way.
pub const HALF_OPEN_TIMEOUT: Duration = duration(HALF_OPEN_TIMEOUT_TEXT);
/// [`HALF_OPEN_TIMEOUT`] as written.
pub const HALF_OPEN_TIMEOUT_TEXT: &str = "10s";
/// Half-open sessions one server holds; at the cap the oldest is recycled.
pub const HALF_OPEN_PER_SERVER: usize = 256;
/// Half-open sessions one source IP may hold on one server.
pub const HALF_OPEN_PER_IP: usize = 4;
/// Half-open sessions one prefix (IPv4 /24, IPv6 /64) may hold on one server.
pub const HALF_OPEN_PER_PREFIX: usize = 16;
/// Established sessions one server holds; never evicted for newcomers.
pub const SESSIONS_PER_SERVER: usize = 1024;
/// Established sessions one source IP may hold on one server.
pub const SESSIONS_PER_IP: usize = 16;
/// Bytes queued towards the game servers, all sessions of all servers together.
pub const MAX_QUEUED_BYTES: usize = 16 << 20;
/// An established session's address may move to a new port of the same IP (a NAT that
/// rebinds) once its client has been silent this long.
pub const REBIND_QUIET: Duration = duration(REBIND_QUIET_TEXT);
/// [`REBIND_QUIET`] as written.
pub const REBIND_QUIET_TEXT: &str = "1s";
/// `getchallenge` a source IP may send at once…
pub const JOIN_SOURCE_BURST: u32 = 4;
/// …then one per this interval.
pub const JOIN_SOURCE_INTERVAL: Duration = duration(JOIN_SOURCE_INTERVAL_TEXT);
/// [`JOIN_SOURCE_INTERVAL`] as written.
pub const JOIN_SOURCE_INTERVAL_TEXT: &str = "2s";
/// `--game q3` (ioquake3: 10 at once, then 1/s per source IP, the relay's included): requests
/// the relay sends the game server at once (`getchallenge` and cache refreshes together)…
pub const UPSTREAM_BURST_Q3: u32 = 8;
/// …then one per this interval.
pub const UPSTREAM_INTERVAL_Q3: Duration = duration(UPSTREAM_INTERVAL_Q3_TEXT);
/// [`UPSTREAM_INTERVAL_Q3`] as written.
pub const UPSTREAM_INTERVAL_Q3_TEXT: &str = "1s";
/// `--game et` (ET 2.60b, and ET: Legacy without `sv_protect`, limit nothing): the same, at once…
pub const UPSTREAM_BURST_ET: u32 = 64;
/// …then one per this interval.
pub const UPSTREAM_INTERVAL_ET: Duration = duration(UPSTREAM_INTERVAL_ET_TEXT);
/// [`UPSTREAM_INTERVAL_ET`] as written.
pub const UPSTREAM_INTERVAL_ET_TEXT: &str = "10ms";

/// Time between two attempts to bind an address that could not be bound: the control API's
/// (the tunnel may come up after the relay) and a registered server's public port (another
/// process may hold it for a while).
pub const BIND_RETRY: Duration = Duration::from_secs(10);
/// At most one warning per this period about an address that still cannot be bound.
pub const BIND_WARN_PERIOD: Duration = Duration::from_secs(300);

/// The master protocol spoken by default.
pub const GAME: Game = Game::Et;
/// The masters ET 2.60b and ET: Legacy clients browse.
pub const DEFAULT_MASTERS: &str = "etmaster.idsoftware.com:27950,etmaster.net:27950";

/// Reads a default duration at compile time: digits, then `ms`, `s` or `m` (a subset of what
/// `humantime` reads, which the command line uses; a test checks both agree). Anything else
/// stops the build.
const fn duration(text: &str) -> Duration {
    let b = text.as_bytes();
    let mut i = 0;
    let mut n: u64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        n = n * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    if i == 0 {
        panic!("a default duration starts with digits");
    }
    match b.len() - i {
        1 if b[i] == b's' => Duration::from_secs(n),
        1 if b[i] == b'm' => Duration::from_secs(n * 60),
        2 if b[i] == b'm' && b[i + 1] == b's' => Duration::from_millis(n),
        _ => panic!("a default duration's unit is ms, s or m"),
    }
}

/// Which game's master protocol the relay speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Game {
    /// Enemy Territory: `heartbeat EnemyTerritory-1`, `heartbeat ETFlatline-1` when it stops.
    Et,
    /// Quake 3 engines such as OpenArena: `heartbeat QuakeArena-1`, no flatline.
    Q3,
}

impl Game {
    /// The heartbeat packet (marker included).
    pub fn heartbeat(self) -> &'static [u8] {
        match self {
            Game::Et => b"\xff\xff\xff\xffheartbeat EnemyTerritory-1\n",
            Game::Q3 => b"\xff\xff\xff\xffheartbeat QuakeArena-1\n",
        }
    }

    /// The flatline packet, if the game has one.
    pub fn flatline(self) -> Option<&'static [u8]> {
        match self {
            Game::Et => Some(b"\xff\xff\xff\xffheartbeat ETFlatline-1\n"),
            Game::Q3 => None,
        }
    }
}

/// One relayed server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The game server: `ip:port`.
    pub upstream: SocketAddr,
    /// Master protocol flavour.
    pub game: Game,
    /// Masters as `host:port`, resolved on every heartbeat. Empty: no heartbeats.
    pub masters: Vec<String>,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
    /// Wait for each probe answer.
    pub probe_timeout: Duration,
    /// Session limits.
    pub session: SessionLimits,
    /// Query limiter bounds.
    pub query: QueryLimits,
    /// Age past which the cache asks the server again. Zero: no cache, queries go through.
    pub cache_max_age: Duration,
    /// Caps on sessions: half-open and established, per IP, per prefix, per server.
    pub caps: SessionCaps,
    /// `getchallenge` per source and the pace of requests the game server limits.
    pub joins: JoinLimits,
    /// How many queries are answered, per source prefix and in all.
    pub reflection: ReflectionLimits,
    /// Where the sources that proved their address are kept (`server::proven`); `None`: in
    /// memory only.
    pub proven_file: Option<PathBuf>,
    /// Who gives the challenges (`server::challenges`).
    pub challenges: ChallengeConfig,
    /// Where the translated sessions are kept across a restart (`server::carry`); `None`: not
    /// kept.
    pub carry_file: Option<PathBuf>,
}

/// Who gives the challenges a client connects with.
#[derive(Debug, Clone, Copy)]
pub struct ChallengeConfig {
    /// `--server-challenges`: the game server, as without the relay (the relay then translates
    /// nothing); else the relay, when the server's protocol is one it translates.
    pub server: bool,
    /// `getchallenge` the relay answers a second at most, all sources together.
    pub answers_per_second: u32,
}

impl Default for ChallengeConfig {
    fn default() -> Self {
        ChallengeConfig {
            server: false,
            answers_per_second: CHALLENGE_ANSWERS,
        }
    }
}

/// Caps on one server's sessions (the process-wide ones are in [`crate::server::Budget`]).
#[derive(Debug, Clone, Copy)]
pub struct SessionCaps {
    /// Idle time before a half-open session closes.
    pub half_open_timeout: Duration,
    /// Half-open sessions of the server; at the cap the oldest is recycled.
    pub half_open_per_server: usize,
    /// Half-open sessions per source IP; refused past it.
    pub half_open_per_ip: usize,
    /// Half-open sessions per /24 (IPv4) or /64 (IPv6); refused past it.
    pub half_open_per_prefix: usize,
    /// Established sessions of the server; refused past it.
    pub established_per_server: usize,
    /// Established sessions per source IP; refused past it.
    pub established_per_ip: usize,
    /// Client silence after which a session may move to a new port of its IP.
    pub rebind_quiet: Duration,
}

impl Default for SessionCaps {
    fn default() -> Self {
        SessionCaps {
            half_open_timeout: HALF_OPEN_TIMEOUT,
            half_open_per_server: HALF_OPEN_PER_SERVER,
            half_open_per_ip: HALF_OPEN_PER_IP,
            half_open_per_prefix: HALF_OPEN_PER_PREFIX,
            established_per_server: SESSIONS_PER_SERVER,
            established_per_ip: SESSIONS_PER_IP,
            rebind_quiet: REBIND_QUIET,
        }
    }
}

/// `getchallenge` limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct JoinLimits {
    /// `getchallenge` a source IP may send at once…
    pub source_burst: u32,
    /// …then one per this interval.
    pub source_interval: Duration,
    /// Requests the game server limits (`getchallenge`, cache refreshes) sent at once…
    pub upstream_burst: u32,
    /// …then one per this interval.
    pub upstream_interval: Duration,
}

impl JoinLimits {
    /// The defaults for `game`: under ioquake3's own per-IP limit for `q3`.
    pub fn for_game(game: Game) -> Self {
        let (upstream_burst, upstream_interval) = match game {
            Game::Q3 => (UPSTREAM_BURST_Q3, UPSTREAM_INTERVAL_Q3),
            Game::Et => (UPSTREAM_BURST_ET, UPSTREAM_INTERVAL_ET),
        };
        JoinLimits {
            source_burst: JOIN_SOURCE_BURST,
            source_interval: JOIN_SOURCE_INTERVAL,
            upstream_burst,
            upstream_interval,
        }
    }
}

/// The answer budget of one server (`server::reflection`).
#[derive(Debug, Clone, Copy)]
pub struct ReflectionLimits {
    /// Answers per source prefix per `window` at most.
    pub per_prefix: u32,
    /// Answers in all per `window` at most.
    pub global: u32,
    /// The window.
    pub window: Duration,
    /// IPv4 prefix length sources are counted by.
    pub v4_prefix: u8,
    /// IPv6 prefix length sources are counted by.
    pub v6_prefix: u8,
    /// Prefixes remembered at most.
    pub max_prefixes: usize,
}

impl Default for ReflectionLimits {
    fn default() -> Self {
        ReflectionLimits {
            per_prefix: ANSWERS_PER_PREFIX,
            global: ANSWERS_GLOBAL,
            window: ANSWER_WINDOW,
            v4_prefix: ANSWER_PREFIX_V4,
            v6_prefix: ANSWER_PREFIX_V6,
            max_prefixes: MAX_ANSWER_PREFIXES,
        }
    }
}

/// Session limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Idle time before a session closes.
    pub timeout: Duration,
    /// Packets queued towards the game server per session.
    pub queue: usize,
    /// Largest datagram a client may send; larger ones are dropped.
    pub max_packet: usize,
    /// Send a batch's datagrams to the game server, over all its sessions' sockets, with one
    /// `io_uring` system call where the kernel allows it.
    pub io_uring: bool,
}

/// Query limiter bounds of one server.
#[derive(Debug, Clone, Copy)]
pub struct QueryLimits {
    /// Queries a source IP may send at once.
    pub burst: u32,
    /// One more query per this interval.
    pub interval: Duration,
    /// Most source IPs remembered.
    pub max_sources: usize,
    /// Idle time after which a source is forgotten.
    pub forget: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            timeout: SESSION_TIMEOUT,
            queue: SESSION_QUEUE,
            max_packet: MAX_PACKET,
            io_uring: true,
        }
    }
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits {
            burst: QUERY_BURST,
            interval: QUERY_INTERVAL,
            max_sources: MAX_QUERY_SOURCES,
            forget: QUERY_FORGET,
        }
    }
}

impl ServerConfig {
    /// The design's defaults for `upstream`, with the default masters.
    pub fn new(upstream: SocketAddr) -> Self {
        ServerConfig {
            upstream,
            game: GAME,
            masters: parse_masters(DEFAULT_MASTERS),
            heartbeat_interval: HEARTBEAT_INTERVAL,
            probe_timeout: PROBE_TIMEOUT,
            session: SessionLimits::default(),
            query: QueryLimits::default(),
            cache_max_age: CACHE_MAX_AGE,
            caps: SessionCaps::default(),
            joins: JoinLimits::for_game(GAME),
            reflection: ReflectionLimits::default(),
            proven_file: None,
            challenges: ChallengeConfig::default(),
            carry_file: None,
        }
    }
}

/// Splits a `--masters` value: comma-separated `host:port`, blanks ignored, empty = none.
pub fn parse_masters(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Checks one master is `host:port` with a numeric port.
///
/// # Errors
/// [`BadMaster`] naming the bad entry.
pub fn check_master(m: &str) -> Result<(), BadMaster> {
    match m.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {
            Ok(())
        }
        _ => Err(BadMaster(m.to_string())),
    }
}

/// A `--masters` entry that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("master {0:?} is not host:port")]
pub struct BadMaster(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_durations_read_as_the_command_line_reads_them() {
        for (text, d) in [
            (SESSION_TIMEOUT_TEXT, SESSION_TIMEOUT),
            (QUERY_INTERVAL_TEXT, QUERY_INTERVAL),
            (QUERY_FORGET_TEXT, QUERY_FORGET),
            (CACHE_MAX_AGE_TEXT, CACHE_MAX_AGE),
            (ANSWER_WINDOW_TEXT, ANSWER_WINDOW),
            (HEARTBEAT_INTERVAL_TEXT, HEARTBEAT_INTERVAL),
            (PROBE_TIMEOUT_TEXT, PROBE_TIMEOUT),
            (HALF_OPEN_TIMEOUT_TEXT, HALF_OPEN_TIMEOUT),
            (REBIND_QUIET_TEXT, REBIND_QUIET),
            (JOIN_SOURCE_INTERVAL_TEXT, JOIN_SOURCE_INTERVAL),
            (UPSTREAM_INTERVAL_Q3_TEXT, UPSTREAM_INTERVAL_Q3),
            (UPSTREAM_INTERVAL_ET_TEXT, UPSTREAM_INTERVAL_ET),
        ] {
            assert_eq!(humantime::parse_duration(text).unwrap(), d, "{text}");
        }
        assert_eq!(duration("250ms"), Duration::from_millis(250));
        assert_eq!(HEARTBEAT_INTERVAL, Duration::from_secs(300));
    }

    #[test]
    fn masters_list() {
        assert!(parse_masters("").is_empty());
        assert!(parse_masters(" , ").is_empty());
        assert_eq!(parse_masters("a:1, b:2"), vec!["a:1", "b:2"]);
        assert!(check_master("etmaster.net:27950").is_ok());
        assert!(check_master("[::1]:27950").is_ok());
        assert!(check_master("etmaster.net").is_err());
        assert!(check_master(":27950").is_err());
        assert!(check_master("a:0").is_err());
    }
}
