//! How the relay loop sweeps the limiters' tables (the query limiter, the join gate's
//! per-source limiter, the answer budget's prefixes): a share of each table at every tick.

/// Each tick of the relay loop (every 250 ms) sweeps this share of every limiter's table (only
/// of a table that holds entries; each also sweeps itself whole when full, at most every
/// `sweep_gap` of its limits): a whole table once a second. A whole sweep scans every slot
/// (131 072 for the query limiter's 65 536 sources: ~1 ms), a stall of the relay loop; a
/// quarter stalls it a quarter as long.
pub(super) const SWEEP_PARTS: usize = 4;
