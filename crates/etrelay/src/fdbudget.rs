//! The file-descriptor budget: the process's `RLIMIT_NOFILE` shared out so that a full control
//! API never stops relaying, and sessions never starve the control API.
//!
//! Each part has its own bound, and the bounds add up to at most the limit:
//!
//! - [`RESERVE`] for standard streams, the control listener, state files and name lookups;
//! - [`PER_SERVER`] per port of `--ports` (public socket, the query cache's socket, a probe's
//!   socket, the relay loop's io_uring ring, the ban store's two connections: database,
//!   journal and shared-memory files);
//! - [`PER_CONTROL_CONN`] per control connection (the connection, and the socket of a
//!   registration's proof);
//! - what is left for sessions (one socket each). When `--max-sessions` does not fit, it is
//!   lowered to what does, with a warning; when nothing is left, the relay does not start.

use std::io;

/// Descriptors kept for the process itself.
pub const RESERVE: usize = 32;
/// Descriptors one relayed server holds, sessions apart.
pub const PER_SERVER: usize = 10;
/// Descriptors one control connection may hold.
pub const PER_CONTROL_CONN: usize = 2;

/// The soft `RLIMIT_NOFILE` of this process (from `/proc/self/limits`); `None` when unlimited.
///
/// # Errors
/// The file cannot be read or does not show the limit.
pub fn open_files_limit() -> io::Result<Option<u64>> {
    let text = std::fs::read_to_string("/proc/self/limits")?;
    parse_limits(&text).ok_or_else(|| io::Error::other("no \"Max open files\" line"))
}

/// The soft limit in the text of `/proc/<pid>/limits`.
fn parse_limits(text: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(None);
    }
    soft.parse().ok().map(Some)
}

/// Sessions that fit in `limit` descriptors beside `servers` servers and `control_conns`
/// control connections; 0 when nothing is left.
pub fn sessions_room(limit: u64, servers: usize, control_conns: usize) -> usize {
    let fixed = RESERVE + servers * PER_SERVER + control_conns * PER_CONTROL_CONN;
    usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(fixed)
}

/// The descriptor limit leaves no room for a single session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the descriptor limit (RLIMIT_NOFILE {limit}) leaves no room for sessions beside {servers} \
     server(s) and {control_conns} control connection(s): raise LimitNOFILE"
)]
pub struct NoRoomForSessions {
    /// The soft `RLIMIT_NOFILE`.
    pub limit: u64,
    /// Servers the limit must hold.
    pub servers: usize,
    /// Control connections the limit must hold.
    pub control_conns: usize,
}

/// `max_sessions`, lowered to what fits in this process's descriptor limit.
///
/// # Errors
/// No room for a single session: [`NoRoomForSessions`] names the limit and what it must hold.
pub fn fit_sessions(
    max_sessions: usize,
    servers: usize,
    control_conns: usize,
) -> Result<usize, NoRoomForSessions> {
    let limit = match open_files_limit() {
        Ok(Some(l)) => l,
        Ok(None) => return Ok(max_sessions),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot read the descriptor limit: --max-sessions kept as given"
            );
            return Ok(max_sessions);
        }
    };
    let room = sessions_room(limit, servers, control_conns);
    if room == 0 {
        return Err(NoRoomForSessions {
            limit,
            servers,
            control_conns,
        });
    }
    if room < max_sessions {
        tracing::warn!(
            rlimit_nofile = limit,
            room,
            max_sessions,
            raise_limitnofile_to = limit + (max_sessions - room) as u64,
            "the descriptor limit leaves room for fewer sessions than --max-sessions: sessions \
             capped at room (raise LimitNOFILE)"
        );
        return Ok(room);
    }
    Ok(max_sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_read_and_shared_out() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             31366                31366                processes \n\
                    Max open files            4096                 524288               files     \n";
        assert_eq!(parse_limits(text), Some(Some(4096)));
        assert_eq!(
            parse_limits(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(None)
        );
        assert_eq!(parse_limits("nothing"), None);
        assert!(open_files_limit().is_ok());
        // The documented default: LimitNOFILE=4096, 10 ports, 64 control connections.
        assert_eq!(sessions_room(4096, 10, 64), 4096 - 32 - 100 - 128);
        assert_eq!(sessions_room(100, 10, 64), 0);
    }
}
