//! Where things are in the status document (the design's layout), for tests reading it as JSON.

use serde_json::Value;

/// The design's places in a `GET /v1/status` document.
pub trait Doc {
    /// `system_stats.discovery_status.peer_store`.
    fn peer_store(&self) -> &Value;
    /// `….peer_store.runtime`: the counters and the node's stores.
    fn runtime(&self) -> &Value {
        &self.peer_store()["runtime"]
    }
    /// `….peer_store.runtime.blind_relay`: the counters.
    fn counters(&self) -> &Value {
        &self.runtime()["blind_relay"]
    }
    /// `….peer_store.blind_relay_quality`.
    fn quality(&self) -> &Value {
        &self.peer_store()["blind_relay_quality"]
    }
    /// `….peer_store.peer_health_summary`.
    fn health(&self) -> &Value {
        &self.peer_store()["peer_health_summary"]
    }
}

impl Doc for Value {
    fn peer_store(&self) -> &Value {
        &self["system_stats"]["discovery_status"]["peer_store"]
    }
}
