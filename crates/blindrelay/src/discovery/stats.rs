//! Discovery's own counters ([`Stats`]): what the status document and the simulator print.

use super::Msg;

/// Discovery's own counters (no id, no address).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Message bytes sent (requests and answers).
    pub bytes_sent: u64,
    /// Message bytes received.
    pub bytes_received: u64,
    /// Exchanges this node started.
    pub exchanges: u64,
    /// Of those, failed ([`Failed::Down`](super::Failed::Down)).
    pub exchanges_failed: u64,
    /// Of those, answered busy or not sent for want of room ([`Failed::Busy`](super::Failed::Busy)).
    pub exchanges_busy: u64,
    /// Of those, not sent for want of room ([`Config::max_exchanges`](super::Config::max_exchanges) in flight).
    pub exchanges_deferred: u64,
    /// Reconciliations completed.
    pub syncs: u64,
    /// Descriptors kept (new identities and newer descriptors).
    pub learned: u64,
    /// Descriptors not kept because a bound refused them.
    pub refused: u64,
    /// Identities reached for the first time.
    pub reached: u64,
    /// Identities forgotten after every probe failed.
    pub forgotten: u64,
    /// Lapsed peers that answered again.
    pub revived: u64,
    /// Pushes (inventories) sent.
    pub pushes: u64,
    /// Requests from strangers or over a budget, answered with nothing.
    pub turned_away: u64,
    /// Message bytes both ways by kind ([`Msg::kind`]'s order: sync, sync reply, get,
    /// descriptors, inventory, want, ack, hello).
    pub bytes_by_kind: [u64; 8],
}

impl Stats {
    /// Counts `msg` one way.
    pub(super) fn count(&mut self, msg: &Msg, sent: bool) {
        let n = msg.encoded_len() as u64;
        if sent {
            self.bytes_sent += n;
        } else {
            self.bytes_received += n;
        }
        self.bytes_by_kind[msg.kind_index()] += n;
    }
}
