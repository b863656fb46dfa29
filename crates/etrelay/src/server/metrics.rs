//! Counters of one relayed server. Aggregates only: no address, no payload.

use guard::counters::{Counter, Kind, PromText};

/// Why a packet from a client was not relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
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
    /// A source IP holds its cap of half-open (or established) sessions.
    IpCap,
    /// A prefix (/24, /64) holds its cap of half-open sessions.
    PrefixCap,
    /// The server's half-open cap is reached and nothing could be recycled.
    HalfOpenCap,
    /// An in-game packet whose qport another session holds (or not its session's own).
    QportConflict,
    /// A `getchallenge` over its source IP's limit.
    JoinLimit,
    /// A `getchallenge` the fair queue had no room for, or that waited too long.
    JoinQueue,
    /// A `connect` or `PB_` packet from an address without a session.
    NoSession,
    /// An in-game packet too short to carry a qport.
    Malformed,
    /// The process's queued-bytes budget is spent.
    QueuedBytes,
    /// A query over the answer (reflection) budget of its source prefix or of the server.
    Reflection,
    /// A query from a master's address over that master's own bucket.
    MasterLimit,
    /// A `connect` whose challenge is not one the relay gave its address (forged, or older
    /// than two challenge periods).
    BadCookie,
    /// An in-game packet without the client's challenge in its checksum (a forged one).
    Forged,
    /// A `getchallenge` over the relay's answers to its address, or to everyone.
    ChallengeLimit,
    /// A `connect` over its session's limit.
    ConnectLimit,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 25] = [
        DropReason::Rcon,
        DropReason::Filter,
        DropReason::BadChallenge,
        DropReason::Limiter,
        DropReason::Ban,
        DropReason::QueueFull,
        DropReason::SessionCap,
        DropReason::Oversize,
        DropReason::CacheBusy,
        DropReason::Upstream,
        DropReason::IpCap,
        DropReason::PrefixCap,
        DropReason::HalfOpenCap,
        DropReason::QportConflict,
        DropReason::JoinLimit,
        DropReason::JoinQueue,
        DropReason::NoSession,
        DropReason::Malformed,
        DropReason::QueuedBytes,
        DropReason::Reflection,
        DropReason::MasterLimit,
        DropReason::BadCookie,
        DropReason::Forged,
        DropReason::ChallengeLimit,
        DropReason::ConnectLimit,
    ];

    /// The reason's label.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Rcon => "rcon",
            DropReason::Filter => "filter",
            DropReason::BadChallenge => "bad_challenge",
            DropReason::Limiter => "limiter",
            DropReason::Ban => "ban",
            DropReason::QueueFull => "queue_full",
            DropReason::SessionCap => "session_cap",
            DropReason::Oversize => "oversize",
            DropReason::CacheBusy => "cache_busy",
            DropReason::Upstream => "upstream",
            DropReason::IpCap => "ip_cap",
            DropReason::PrefixCap => "prefix_cap",
            DropReason::HalfOpenCap => "half_open_cap",
            DropReason::QportConflict => "qport_conflict",
            DropReason::JoinLimit => "join_limit",
            DropReason::JoinQueue => "join_queue",
            DropReason::NoSession => "no_session",
            DropReason::Malformed => "malformed",
            DropReason::QueuedBytes => "queued_bytes",
            DropReason::Reflection => "reflection",
            DropReason::MasterLimit => "master_limit",
            DropReason::BadCookie => "bad_cookie",
            DropReason::Forged => "forged",
            DropReason::ChallengeLimit => "challenge_limit",
            DropReason::ConnectLimit => "connect_limit",
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

guard::counter_set! {
    /// Counters of one server. Each counter's doc comment is its Prometheus help text.
    pub struct ServerMetrics {
        prefix: "etrelay_",
        /// The counters of one server at one moment.
        snapshot: ServerSnapshot,
        counters: {
            /// Datagrams received from clients.
            client_packets: Counter,
            /// Bytes received from clients.
            client_bytes: Counter,
            /// Datagrams sent to the game server (sessions and cache refreshes; probes not
            /// counted).
            upstream_packets: Counter,
            /// Bytes sent to the game server.
            upstream_bytes: Counter,
            /// Datagrams received from the game server (sessions and the cache socket).
            server_packets: Counter,
            /// Bytes received from the game server.
            server_bytes: Counter,
            /// Datagrams sent to clients from the public socket (relayed or cached answers).
            reply_packets: Counter,
            /// Bytes sent to clients.
            reply_bytes: Counter,
            /// Datagrams that could not be sent to clients.
            reply_errors: Counter,
            /// Queries answered from the cache.
            cache_hits: Counter,
            /// Queries the cache sent to the game server.
            cache_refreshes: Counter,
            /// Cache queries the game server answered.
            cache_refresh_answers: Counter,
            /// Sessions opened.
            sessions_opened: Counter,
            /// Sessions open now.
            sessions_open: Gauge,
            /// Half-open sessions now (the game server has not shown a real client yet).
            sessions_half_open: Gauge,
            /// Established sessions now.
            sessions_established: Gauge,
            /// Half-open sessions recycled for a newcomer at the server's half-open cap.
            sessions_recycled: Counter,
            /// Sessions moved to a new port of their IP (a NAT that rebound).
            sessions_rebound: Counter,
            /// Sessions refused, or cut at promotion, by a cap (also counted as drops).
            sessions_refused: Counter,
            /// getchallenge waiting in the fair queue now.
            joins_queued: Gauge,
            /// getchallenge the relay answered with its own challenge.
            challenges_answered: Counter,
            /// connect with the relay's challenge, checked and kept for the server's.
            connects_checked: Counter,
            /// getchallenge the relay sent the game server for a checked connect.
            challenges_asked: Counter,
            /// Clients the game server let in with a challenge the relay translates.
            connects_translated: Counter,
            /// Sessions of the relay's last run taken up again, translated as they were.
            sessions_carried: Counter,
            /// 1 while the relay gives its own challenges (the server's protocol is one it
            /// translates), 0 while getchallenge goes to the game server.
            relay_challenges: Gauge,
            /// Heartbeats sent to masters (one per master).
            heartbeats: Counter,
            /// Flatlines sent to masters (one per master).
            flatlines: Counter,
            /// Heartbeats and flatlines not sent to a master: its name did not resolve (in
            /// time, or to an address of the public socket's family), or the send failed.
            heartbeat_errors: Counter,
            /// Writes of the server's state file (the proven sources) that failed; each is
            /// tried again a minute later.
            state_write_failures: Counter,
            /// Game server state: 0 unknown, 1 up, 2 down.
            probe_state: Gauge,
            /// Source IPs the query limiter remembers.
            query_sources: Gauge,
            /// Slots of the query limiter's fixed table (its memory, fixed at start).
            query_slots: Gauge,
            /// Queries from the masters' addresses, let through on their own lane.
            master_queries: Counter,
            /// Queries from proven sources, let through on their own budget.
            proven_queries: Counter,
            /// getchallenge from proven sources, let through ahead of the fair queue.
            proven_joins: Counter,
            /// Sources that proved their address (a join the game server answered),
            /// remembered now.
            proven_sources: Gauge,
            /// Unix time the oldest flood going on began (drops of the answer budget, the
            /// per-IP limit, the getchallenge gate or the half-open caps); 0 with none.
            flood_since: Gauge,
            /// 1 while the relay loop sends to the game server through io_uring (a batch over
            /// all sessions' sockets in one system call), 0 while it sends one socket at a time.
            upstream_io_uring: Gauge,
        },
        /// Client datagrams dropped, by [`DropReason`] (one labelled family).
        drops: [Counter; DropReason::ALL.len()],
    }
}

impl ServerMetrics {
    /// Counts a drop.
    #[inline]
    pub fn drop(&self, reason: DropReason) {
        self.drops[reason as usize].inc();
    }

    /// Drops counted for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].get()
    }

    /// Appends the samples of `servers` (labelled with their public port) to a document: each
    /// family once, with one sample per server.
    pub fn render_all(servers: &[(u16, &ServerMetrics)], out: &mut PromText) {
        let ports: Vec<String> = servers.iter().map(|(p, _)| p.to_string()).collect();
        let labels: Vec<[(&str, &str); 1]> = ports.iter().map(|p| [("port", p.as_str())]).collect();
        let sets: Vec<(&[(&str, &str)], &ServerMetrics)> = labels
            .iter()
            .zip(servers)
            .map(|(l, (_, m))| (&l[..], *m))
            .collect();
        out.counter_sets(&sets);
        out.family(
            "etrelay_dropped_packets_total",
            Kind::Counter,
            "Client datagrams dropped, by reason.",
        );
        for ((_, m), port) in servers.iter().zip(&ports) {
            for r in DropReason::ALL {
                out.sample(
                    "etrelay_dropped_packets_total",
                    &[("port", port), ("reason", r.name())],
                    m.drops(r),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_once_with_a_sample_per_server() {
        let (a, b) = (ServerMetrics::default(), ServerMetrics::default());
        a.client_packets.add(3);
        b.drop(DropReason::Rcon);
        let mut out = PromText::new();
        ServerMetrics::render_all(&[(27960, &a), (27961, &b)], &mut out);
        let text = out.finish();
        assert_eq!(
            text.matches("# TYPE etrelay_client_packets_total counter")
                .count(),
            1
        );
        assert!(text.contains("etrelay_client_packets_total{port=\"27960\"} 3\n"));
        assert!(text.contains("etrelay_client_packets_total{port=\"27961\"} 0\n"));
        assert!(text.contains("etrelay_dropped_packets_total{port=\"27961\",reason=\"rcon\"} 1\n"));
    }
}
