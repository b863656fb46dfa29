//! The self-loop check (design step 6). A frame whose authenticated previous hop is this node itself is
//! refused (`self_loop`) before its layer is opened: nothing a node sends may come back to it
//! as its own previous hop. It needs no key, so the sequencer runs it before the layer is
//! opened (the expiry is sealed inside the layer).

use crate::proto::NodeId;
use crate::reason::Reason;

/// Refuses a frame from `prev` at node `me` when the two are the same node.
///
/// # Errors
/// `self_loop`.
pub fn check(prev: &NodeId, me: &NodeId) -> Result<(), Reason> {
    if prev == me {
        return Err(Reason::SelfLoop);
    }
    Ok(())
}
