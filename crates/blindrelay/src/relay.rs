//! The running node's handle: what `blindrelay run` builds and owns, and what the listeners,
//! the status document, the metrics and the report take. It holds the shared context, the
//! inbound pipeline (which only admits and processes), the stores and the relay listener's
//! connection table; none of those reaches the others through the pipeline.

use std::sync::Arc;

use crate::context::Context;
use crate::pipeline::gate::GateConfig;
use crate::pipeline::{Pipeline, Stores};
use crate::replay::ReplayRegistry;
use crate::sources::{CountTable, Grouping};
use crate::terminal::Terminal;

/// A node: its context, pipeline, stores and relay connections.
#[derive(Debug)]
pub struct Relay {
    pipeline: Arc<Pipeline>,
    stores: Arc<Stores>,
    connections: CountTable,
}

impl Relay {
    /// The node over `ctx`: a pipeline with the request gate's `gate` settings and sources
    /// grouped by `grouping` over `stores`, its relay listener's open `connections` counted.
    pub fn new(
        ctx: Arc<Context>,
        gate: GateConfig,
        grouping: Grouping,
        stores: Stores,
        connections: CountTable,
    ) -> Self {
        let stores = Arc::new(stores);
        let pipeline = Pipeline::new(ctx, gate, grouping, Arc::clone(&stores));
        Relay {
            pipeline: Arc::new(pipeline),
            stores,
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
        &self.stores.replay
    }

    /// The terminal: the inbox and its shares.
    pub fn terminal(&self) -> &Terminal {
        &self.stores.terminal
    }

    /// The relay listener's open connections.
    pub fn connections(&self) -> &CountTable {
        &self.connections
    }
}
