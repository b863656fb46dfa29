//! The running node's handle: what `blindrelay run` builds and owns, and what the listeners,
//! the status document, the metrics and the report take. It holds the shared context, the
//! inbound pipeline (which only admits and processes), the stores and the relay listener's
//! connection table; none of those reaches the others through the pipeline.

use std::sync::Arc;

use crate::context::Context;
use crate::pipeline::Pipeline;
use crate::replay::ReplayRegistry;
use crate::sources::CountTable;
use crate::terminal::Terminal;

/// A node: its context, pipeline, stores and relay connections.
#[derive(Debug)]
pub struct Relay {
    pipeline: Arc<Pipeline>,
    replay: Arc<ReplayRegistry>,
    terminal: Terminal,
    connections: CountTable,
}

impl Relay {
    /// The node whose requests `pipeline` processes over `replay` and `terminal` (the same
    /// stores the pipeline was built with), its relay listener's open `connections` counted.
    pub fn new(
        pipeline: Pipeline,
        replay: Arc<ReplayRegistry>,
        terminal: Terminal,
        connections: CountTable,
    ) -> Self {
        Relay {
            pipeline: Arc::new(pipeline),
            replay,
            terminal,
            connections,
        }
    }

    /// The shared context: keys, peers, clock, counters, peer health.
    pub fn ctx(&self) -> &Arc<Context> {
        self.pipeline.ctx()
    }

    /// The inbound pipeline.
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The replay registry.
    pub fn replay(&self) -> &Arc<ReplayRegistry> {
        &self.replay
    }

    /// The terminal: the inbox and its shares.
    pub fn terminal(&self) -> &Terminal {
        &self.terminal
    }

    /// The relay listener's open connections.
    pub fn connections(&self) -> &CountTable {
        &self.connections
    }
}
