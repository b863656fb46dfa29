//! The terminal hop: what this node does with a frame addressed to it as the last hop.

mod inbox;

pub use inbox::{INBOX_MAX_BYTES, INBOX_MAX_ITEMS, Inbox, InboxError, InboxItem};
