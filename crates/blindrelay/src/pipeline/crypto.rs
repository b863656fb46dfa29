//! Step 2, crypto admission: a free slot of the shared crypto gate for the signature check and
//! the onion layer, or `backpressure` at once (no queue). Inbound requests may take every slot
//! but one, so the node's own route building and receipt checking always find one
//! ([`crate::context`]).

use guard::admission::Permit;

use crate::context::Context;
use crate::reason::Reason;

/// A crypto slot for an inbound request.
///
/// # Errors
/// `backpressure` when only the outbound slot (or none) is free.
pub(super) fn admit(ctx: &Context) -> Result<Permit, Reason> {
    ctx.crypto
        .try_acquire_below(ctx.crypto.limit().saturating_sub(1))
        .ok_or(Reason::Backpressure)
}
