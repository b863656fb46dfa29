//! # blindrelay
//!
//! A node that forwards onion-encrypted envelopes for other nodes without ever seeing who talks
//! to whom, behind an abuse guard.
//!
//! # Layout
//!
//! A relay request's path: [`api`] (HTTP or a framed link) → [`pipeline`]'s way in (one for both
//! transports) → its stages in the order they run, each refusing with a [`reason::Reason`] →
//! [`forward`] (with retries) or [`terminal`] → [`replay`] records the answer → [`api`]
//! answers. The daemon owns the node's handle, [`relay::Relay`]; the
//! listeners, the status document and the report take it.
//!
//! - [`proto`]: the wire formats without I/O: frames, onion layers,
//!   delivery receipts, descriptors, the relay answer, the probe payload.
//! - [`reason`]: why a request is refused: wire string, HTTP status, counter, scored or not.
//! - [`sources`]: who a request comes from (address blocks, known peers) and the bounded
//!   per-source tables and fair shares the relay listener divides its capacity with.
//! - [`relay`]: the node's handle: context, pipeline, stores, the relay listener's connections.
//! - [`context`]: what inbound and outbound work share: keys, peers, clock, counters, peer
//!   health, the crypto gate, the links.
//! - [`pipeline`]: the admission pipeline, one file per design step (each a function of its
//!   input and the time), run in order by its `mod.rs`.
//! - [`forward`]: posting to the next hop and the retry policy.
//! - [`links`]: node-to-node TLS 1.3, pinned to the peer's identity key, and the links' HTTP
//!   clients (their limits passed in).
//! - [`outbound`]: every request to a next hop waits its turn under the next hop's
//!   previous-hop rate, in a bounded queue.
//! - [`terminal`]: the terminal hop: the inbox and receipt signing.
//! - [`replay`]: the route replay registry (SQLite or memory).
//! - [`sqlite`]: the durable SQLite file both stores open, and its error.
//! - [`stores`]: which stores a state dir holds; a node that has run before refuses to start
//!   on a lost one.
//! - [`send`]: the client side: choose a route, send, verify the receipt.
//! - [`probe`]: synthetic single-hop and two-hop probes.
//! - [`alerts`]: log lines for attacks (handshake floods, strangers refused, quarantines,
//!   share cuts, backpressure), at most one a minute per kind.
//! - [`report`]: the optional periodic push of the status document to the operator's URL.
//! - [`node`]: identity, onion keys, descriptor.
//! - [`peers`]: known peers' descriptors, verified once when accepted.
//! - [`gossip`]: discovery by gossip of signed descriptors, bounded against Sybils.
//! - [`health`]: per-peer health without who-talks-to-whom.
//! - [`counters`]: the aggregate counters.
//! - [`status`]: evidence quality, proof scope, the status document, the Prometheus text.
//! - [`clock`]: time: one clock, tokio's (paused in tests); Unix dates read in one place.
//! - [`api`]: the two listeners and their one error type.
//! - [`daemon`]: `blindrelay run`: its config, its stores opened, the descriptor limit fitted,
//!   the node built and served, its tasks tracked and upkept.
//! - [`cli`]: the command line's flags; [`client`]: the operator's commands (`send`, `inbox`,
//!   `status`) against the operator API.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// An enum whose variants have stable names (written once, here): `ALL`, `as_str`, `Display`
/// (padded like a string) and serde as those names. Used for the status document's states, so
/// the server and the operator client share one typed vocabulary.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($text),*].len()] = [$($name::$variant,)*];

            /// The stable name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == text)
                    .ok_or_else(|| serde::de::Error::unknown_variant(&text, &[$($text),*]))
            }
        }
    };
}

pub mod alerts;
pub mod api;
pub mod blocks;
pub mod cli;
pub mod client;
pub mod clock;
pub mod context;
pub mod counters;
pub mod daemon;
pub mod discovery;
pub mod forward;
pub mod gossip;
pub mod health;
pub mod links;
pub mod node;
pub mod outbound;
pub mod peers;
pub mod pipeline;
pub mod probe;
pub mod proto;
pub mod reason;
pub mod relay;
pub mod replay;
pub mod report;
pub mod send;
pub mod sources;
pub mod sqlite;
pub mod status;
pub mod stores;
pub mod terminal;
