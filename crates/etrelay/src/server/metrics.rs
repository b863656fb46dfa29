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

    /// Appends the samples of `servers` (labelled with their public port) to a document: each
    /// family once, with one sample per server.
    pub fn render_all(servers: &[(u16, &ServerMetrics)], out: &mut PromText) {
        use Kind::{Counter as C, Gauge as G};
        type Get = fn(&ServerMetrics) -> u64;
        let families: [(&str, Kind, &str, Get); 19] = [
            (
                "etrelay_client_packets_total",
                C,
                "Datagrams received from clients.",
                |m| m.client_packets.get(),
            ),
            (
                "etrelay_client_bytes_total",
                C,
                "Bytes received from clients.",
                |m| m.client_bytes.get(),
            ),
            (
                "etrelay_upstream_packets_total",
                C,
                "Datagrams sent to the game server.",
                |m| m.upstream_packets.get(),
            ),
            (
                "etrelay_upstream_bytes_total",
                C,
                "Bytes sent to the game server.",
                |m| m.upstream_bytes.get(),
            ),
            (
                "etrelay_server_packets_total",
                C,
                "Datagrams received from the game server.",
                |m| m.server_packets.get(),
            ),
            (
                "etrelay_server_bytes_total",
                C,
                "Bytes received from the game server.",
                |m| m.server_bytes.get(),
            ),
            (
                "etrelay_reply_packets_total",
                C,
                "Datagrams sent to clients.",
                |m| m.reply_packets.get(),
            ),
            (
                "etrelay_reply_bytes_total",
                C,
                "Bytes sent to clients.",
                |m| m.reply_bytes.get(),
            ),
            (
                "etrelay_reply_errors_total",
                C,
                "Datagrams that could not be sent to clients.",
                |m| m.reply_errors.get(),
            ),
            (
                "etrelay_cache_hits_total",
                C,
                "Queries answered from the cache.",
                |m| m.cache_hits.get(),
            ),
            (
                "etrelay_cache_refreshes_total",
                C,
                "Queries the cache sent to the game server.",
                |m| m.cache_refreshes.get(),
            ),
            (
                "etrelay_cache_refresh_answers_total",
                C,
                "Cache queries the game server answered.",
                |m| m.cache_refresh_answers.get(),
            ),
            (
                "etrelay_sessions_opened_total",
                C,
                "Sessions opened.",
                |m| m.sessions_opened.get(),
            ),
            ("etrelay_sessions_open", G, "Sessions open now.", |m| {
                m.sessions_open.get()
            }),
            (
                "etrelay_heartbeats_total",
                C,
                "Heartbeats sent to masters.",
                |m| m.heartbeats.get(),
            ),
            (
                "etrelay_flatlines_total",
                C,
                "Flatlines sent to masters.",
                |m| m.flatlines.get(),
            ),
            (
                "etrelay_probe_state",
                G,
                "Game server state: 0 unknown, 1 up, 2 down.",
                |m| m.probe_state.get(),
            ),
            (
                "etrelay_query_sources",
                G,
                "Source IPs the query limiter remembers.",
                |m| m.query_sources.get(),
            ),
            (
                "etrelay_query_slots",
                G,
                "Slots of the query limiter's fixed table.",
                |m| m.query_slots.get(),
            ),
        ];
        let ports: Vec<String> = servers.iter().map(|(p, _)| p.to_string()).collect();
        for (name, kind, help, get) in families {
            out.family(name, kind, help);
            for ((_, m), port) in servers.iter().zip(&ports) {
                out.sample(name, &[("port", port)], get(m));
            }
        }
        out.family(
            "etrelay_dropped_packets_total",
            C,
            "Client datagrams dropped, by reason.",
        );
        for ((_, m), port) in servers.iter().zip(&ports) {
            for r in Drop::ALL {
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
        b.drop(Drop::Rcon);
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
