//! Step 2, crypto admission: a free slot of the shared crypto gate for the signature check and
//! the onion layer, waiting for one at most the crypto wait (`--crypto-wait`, milliseconds),
//! then `backpressure`. Inbound requests may take every slot but one, so the node's own route
//! building and receipt checking always find one ([`crate::context`]).

use crate::context::{Context, CryptoSlot};
use crate::reason::Reason;

/// A crypto slot for an inbound request.
///
/// # Errors
/// `backpressure` when only the outbound slot (or none) came free within the wait.
pub(super) async fn admit(ctx: &Context) -> Result<CryptoSlot, Reason> {
    ctx.crypto_slot(ctx.crypto.limit().saturating_sub(1), ctx.crypto_wait)
        .await
        .ok_or(Reason::Backpressure)
}
