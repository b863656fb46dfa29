//! The command line: `etrelay [OPTIONS] <UPSTREAM>`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::Parser;
use clap::builder::TypedValueParser as _;

use crate::config::{self, DEFAULT_MASTERS, Game, QueryLimits, ServerConfig, SessionLimits};

/// UDP relay for Wolfenstein: Enemy Territory (Quake 3 engine) servers behind NAT.
///
/// Owns the public port, proxies players, server browsers and masters to the game server (one
/// upstream socket per client), drops what clients have no business sending (rcon in every
/// spelling a server would run), limits and caches getstatus/getinfo, and sends the master
/// heartbeats itself so the masters list the relay's address.
#[derive(Debug, Parser)]
#[command(name = "etrelay", version, about, long_about)]
pub struct Cli {
    /// The game server to relay, `ip:port` (or `host:port`, resolved once at start).
    pub upstream: String,

    /// Address of the public socket clients and masters reach.
    #[arg(long, env = "ETRELAY_LISTEN", default_value = "0.0.0.0:27960")]
    pub listen: SocketAddr,

    /// Masters to heartbeat, comma-separated `host:port`, resolved on every heartbeat.
    /// An empty value disables heartbeats.
    #[arg(long, env = "ETRELAY_MASTERS", default_value = DEFAULT_MASTERS)]
    pub masters: String,

    /// Master protocol: `et` heartbeats `EnemyTerritory-1` and flatlines `ETFlatline-1`;
    /// `q3` heartbeats `QuakeArena-1` (OpenArena and other Quake 3 engine servers), no flatline.
    #[arg(long, value_enum, env = "ETRELAY_GAME", default_value = "et")]
    pub game: Game,

    /// Time between two heartbeats (humantime: `5m`, `30s`, `2s`).
    #[arg(long, env = "ETRELAY_HEARTBEAT_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,

    /// Wait for each of the 3 probes (`getinfo`) before the game server counts as down.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub probe_timeout: Duration,

    /// A session closes after this long without a packet either way.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,

    /// Packets a session holds for the game server; a full queue drops the packet.
    #[arg(long, default_value_t = config::SESSION_QUEUE, value_parser = clap::value_parser!(u32).range(1..=65_536).map(|v| v as usize))]
    pub session_queue: usize,

    /// Sessions open at once (one socket each); no new session past it.
    #[arg(long, default_value_t = config::MAX_SESSIONS)]
    pub max_sessions: usize,

    /// Largest datagram relayed, in bytes; larger ones are dropped.
    #[arg(long, default_value_t = config::MAX_PACKET, value_parser = clap::value_parser!(u32).range(16..=65_535).map(|v| v as usize))]
    pub max_packet: usize,

    /// getstatus/getinfo a source IP may send at once…
    #[arg(long, default_value_t = config::QUERY_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub query_burst: u32,

    /// …then one per this interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub query_interval: Duration,

    /// Source IPs the query limiter remembers at most. At the cap, sources whose bucket has
    /// refilled make room; if none has, new sources are refused until one does.
    #[arg(long, default_value_t = config::MAX_QUERY_SOURCES, value_parser = clap::value_parser!(u32).range(1..=16_777_216).map(|v| v as usize))]
    pub query_sources: usize,

    /// A source idle this long is forgotten.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub query_forget: Duration,

    /// getinfo/getstatus are answered from the server's last answer while it is younger than
    /// this; `0s` disables the cache (queries then go to the server like any packet).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub cache_max_age: Duration,

    /// Log every session and connectionless packet (overridden by `RUST_LOG`).
    #[arg(long)]
    pub debug: bool,
}

impl Cli {
    /// The server configuration this command line asks for.
    ///
    /// # Errors
    /// A message for an upstream that does not resolve or a malformed master.
    pub fn server_config(&self) -> Result<ServerConfig, String> {
        let upstream = resolve(&self.upstream)?;
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
            },
            query: QueryLimits {
                burst: self.query_burst,
                interval: self.query_interval,
                max_sources: self.query_sources,
                forget: self.query_forget,
            },
            cache_max_age: self.cache_max_age,
        })
    }
}

fn resolve(s: &str) -> Result<SocketAddr, String> {
    s.to_socket_addrs()
        .map_err(|e| format!("upstream {s:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("upstream {s:?} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_design_constants() {
        let cli = Cli::try_parse_from(["etrelay", "127.0.0.1:27960"]).unwrap();
        let c = cli.server_config().unwrap();
        assert_eq!(cli.listen, "0.0.0.0:27960".parse().unwrap());
        assert_eq!(
            c.masters,
            vec!["etmaster.idsoftware.com:27950", "etmaster.net:27950"]
        );
        assert_eq!(c.heartbeat_interval, config::HEARTBEAT_INTERVAL);
        assert_eq!(c.session.timeout, config::SESSION_TIMEOUT);
        assert_eq!(c.session.queue, 64);
        assert_eq!(c.session.max_packet, 65_535);
        assert_eq!(cli.max_sessions, 2048);
        assert_eq!(c.query.burst, 5);
        assert_eq!(c.query.max_sources, 65_536);
        assert_eq!(c.query.forget, Duration::from_secs(60));
        assert_eq!(c.cache_max_age, Duration::from_secs(1));
        assert_eq!(c.game, Game::Et);
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
        .unwrap();
        let c = cli.server_config().unwrap();
        assert!(c.masters.is_empty());
        assert_eq!(c.game, Game::Q3);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
        assert!(
            Cli::try_parse_from(["etrelay", "--masters", "nohost", "127.0.0.1:1"])
                .unwrap()
                .server_config()
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["etrelay", "--heartbeat-interval", "soon", "127.0.0.1:1"])
                .is_err()
        );
    }
}
