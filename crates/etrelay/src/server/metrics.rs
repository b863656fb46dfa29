//! Counters of one relayed server. Aggregates only: no address, no payload.

use guard::counters::{Counter, Gauge, Kind, PromText};

/// Why a packet from a client was not relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Some server build would run it as rcon.
    Rcon,
    /// Not a command clients may send.
    Filter,
    /// A query with a challenge no server would echo.
    BadChallenge,
    /// Over the per-IP query limit (or the limiter is full of other sources).
    Limiter,
    /// From a banned address.
    Ban,
    /// The session's queue towards the game server is full.
    QueueFull,
    /// No session could be opened: `MAX_SESSIONS` reached.
    SessionCap,
    /// Larger than the relay's largest datagram.
    Oversize,
    /// The query cache has no answer and cannot ask the server now.
    CacheBusy,
    /// The upstream socket could not be opened or written.
    Upstream,
}

impl Drop {
    /// Every reason, in counter order.
    pub const ALL: [Drop; 10] = [
        Drop::Rcon,
        Drop::Filter,
        Drop::BadChallenge,
        Drop::Limiter,
        Drop::Ban,
        Drop::QueueFull,
        Drop::SessionCap,
        Drop::Oversize,
        Drop::CacheBusy,
        Drop::Upstream,
    ];

    /// The reason's label.
    pub fn name(self) -> &'static str {
        match self {
            Drop::Rcon => "rcon",
            Drop::Filter => "filter",
            Drop::BadChallenge => "bad_challenge",
            Drop::Limiter => "limiter",
            Drop::Ban => "ban",
            Drop::QueueFull => "queue_full",
            Drop::SessionCap => "session_cap",
            Drop::Oversize => "oversize",
            Drop::CacheBusy => "cache_busy",
            Drop::Upstream => "upstream",
        }
    }
}

/// State of the game server as the last probe saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeState {
    /// Not probed yet.
    Unknown = 0,
    /// Answered the last probe.
    Up = 1,
    /// Did not answer the last probe.
    Down = 2,
}

/// Counters of one server.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Datagrams from clients on the public socket.
    pub client_packets: Counter,
    /// Their bytes.
    pub client_bytes: Counter,
    /// Datagrams sent to the game server (sessions and cache refreshes; probes not counted).
    pub upstream_packets: Counter,
    /// Their bytes.
    pub upstream_bytes: Counter,
    /// Datagrams received from the game server (sessions and the cache socket).
    pub server_packets: Counter,
    /// Their bytes.
    pub server_bytes: Counter,
    /// Datagrams sent to clients from the public socket (relayed or cached answers).
    pub reply_packets: Counter,
    /// Their bytes.
    pub reply_bytes: Counter,
    /// Client datagrams dropped, by [`Drop`] reason.
    pub drops: [Counter; Drop::ALL.len()],
    /// Queries answered from the cache.
    pub cache_hits: Counter,
    /// Queries the cache sent to the game server.
    pub cache_refreshes: Counter,
    /// Of those, the ones the game server answered.
    pub cache_refresh_answers: Counter,
    /// Sessions opened since start.
    pub sessions_opened: Counter,
    /// Sessions open now.
    pub sessions_open: Gauge,
    /// Heartbeats sent (one per master).
    pub heartbeats: Counter,
    /// Flatlines sent (one per master).
    pub flatlines: Counter,
    /// [`ProbeState`] as a number.
    pub probe_state: Gauge,
    /// Server answers that could not be sent back to their client.
    pub reply_errors: Counter,
    /// Source IPs the query limiter remembers now.
    pub query_sources: Gauge,
    /// Slots of the query limiter's table (fixed at start: the limiter's memory).
    pub query_slots: Gauge,
}

impl ServerMetrics {
    /// Counts a drop.
    #[inline]
    pub fn drop(&self, reason: Drop) {
        self.drops[reason as usize].inc();
    }

    /// Drops counted for `reason`.
    pub fn drops(&self, reason: Drop) -> u64 {
        self.drops[reason as usize].get()
    }

    /// Appends this server's samples, labelled with its public `port`, to a document.
    pub fn render(&self, port: &str, out: &mut PromText) {
        let l = [("port", port)];
        let mut one = |name: &str, kind, help: &str, v: u64| {
            out.family(name, kind, help).sample(name, &l, v);
        };
        use Kind::{Counter as C, Gauge as G};
        one(
            "etrelay_client_packets_total",
            C,
            "Datagrams received from clients.",
            self.client_packets.get(),
        );
        one(
            "etrelay_client_bytes_total",
            C,
            "Bytes received from clients.",
            self.client_bytes.get(),
        );
        one(
            "etrelay_upstream_packets_total",
            C,
            "Datagrams sent to the game server.",
            self.upstream_packets.get(),
        );
        one(
            "etrelay_upstream_bytes_total",
            C,
            "Bytes sent to the game server.",
            self.upstream_bytes.get(),
        );
        one(
            "etrelay_server_packets_total",
            C,
            "Datagrams received from the game server.",
            self.server_packets.get(),
        );
        one(
            "etrelay_server_bytes_total",
            C,
            "Bytes received from the game server.",
            self.server_bytes.get(),
        );
        one(
            "etrelay_reply_packets_total",
            C,
            "Datagrams sent to clients.",
            self.reply_packets.get(),
        );
        one(
            "etrelay_reply_bytes_total",
            C,
            "Bytes sent to clients.",
            self.reply_bytes.get(),
        );
        one(
            "etrelay_cache_hits_total",
            C,
            "Queries answered from the cache.",
            self.cache_hits.get(),
        );
        one(
            "etrelay_cache_refreshes_total",
            C,
            "Queries the cache sent to the game server.",
            self.cache_refreshes.get(),
        );
        one(
            "etrelay_cache_refresh_answers_total",
            C,
            "Cache queries the game server answered.",
            self.cache_refresh_answers.get(),
        );
        one(
            "etrelay_sessions_opened_total",
            C,
            "Sessions opened.",
            self.sessions_opened.get(),
        );
        one(
            "etrelay_sessions_open",
            G,
            "Sessions open now.",
            self.sessions_open.get(),
        );
        one(
            "etrelay_heartbeats_total",
            C,
            "Heartbeats sent to masters.",
            self.heartbeats.get(),
        );
        one(
            "etrelay_flatlines_total",
            C,
            "Flatlines sent to masters.",
            self.flatlines.get(),
        );
        one(
            "etrelay_query_sources",
            G,
            "Source IPs the query limiter remembers.",
            self.query_sources.get(),
        );
        one(
            "etrelay_probe_state",
            G,
            "Game server state: 0 unknown, 1 up, 2 down.",
            self.probe_state.get(),
        );
        out.family(
            "etrelay_dropped_packets_total",
            C,
            "Client datagrams dropped, by reason.",
        );
        for r in Drop::ALL {
            out.sample(
                "etrelay_dropped_packets_total",
                &[("port", port), ("reason", r.name())],
                self.drops(r),
            );
        }
    }
}
