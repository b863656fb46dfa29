//! The server console's `status`, sent on an [`OpenArena`]'s console and read back from its log:
//! which clients the server has, with their ping (how it sees them acking) and address.

use std::io;
use std::time::{Duration, Instant};

use crate::openarena::{OpenArena, tail};

/// How often the server's log is read again.
const POLL: Duration = Duration::from_millis(10);

/// A client's ping in the server's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ping {
    /// Milliseconds, averaged over the acks of the last 32 snapshots; 999 when none was acked.
    Ms(u32),
    /// `CON`: connected, not yet in game.
    Connecting,
    /// `ZMB`: disconnected, its slot not yet free.
    Zombie,
}

/// One client row of the server console's `status` (ioquake3's `SV_Status_f`):
///
/// ```text
/// map: oa_dm1
/// cl score ping name            address                                 rate
/// -- ----- ---- --------------- --------------------------------------- -----
///  0     0    0 relaytest       ^7127.77.0.2                              99999
/// ```
///
/// The name is padded to 16 visible characters, the address is printed after `^7` and without
/// its port. Older builds had `lastmsg` and `qport` columns; this one does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRow {
    /// Client slot (`cl`).
    pub slot: u32,
    /// Score.
    pub score: i32,
    /// Ping, or the state that stands for it.
    pub ping: Ping,
    /// Name as the server keeps it (colour codes included).
    pub name: String,
    /// Address the server sees, without port (`NET_AdrToString`: `bot` for bots).
    pub address: String,
    /// The client's `rate`.
    pub rate: u32,
}

impl StatusRow {
    /// Whether the server saw acks from this client within its last 32 snapshots (about 1.6 s
    /// at 20 snapshots per second): in game, with a ping under 999.
    pub fn acking(&self) -> bool {
        matches!(self.ping, Ping::Ms(ms) if ms < 999)
    }
}

/// The first word of `s` (after leading blanks) and what follows it.
fn word(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    let end = s.find(char::is_whitespace).unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], &s[end..]))
}

/// One row of `status`, see [`StatusRow`].
fn parse_row(line: &str) -> Option<StatusRow> {
    let (slot, rest) = word(line)?;
    let (score, rest) = word(rest)?;
    let (ping, rest) = word(rest)?;
    let ping = match ping {
        "CON" => Ping::Connecting,
        "ZMB" => Ping::Zombie,
        ms => Ping::Ms(ms.parse().ok()?),
    };
    // "<name><blanks>^7<address><blanks> <rate>": read from the right, names may hold blanks.
    let (rest, rate) = rest.trim_end().rsplit_once(char::is_whitespace)?;
    let (name, address) = rest.trim_end().rsplit_once(char::is_whitespace)?;
    Some(StatusRow {
        slot: slot.parse().ok()?,
        score: score.parse().ok()?,
        ping,
        name: name.trim().to_string(),
        address: address.strip_prefix("^7")?.to_string(),
        rate: rate.parse().ok()?,
    })
}

/// The rows of the first complete `status` output in `text` (console output: the `map:` line,
/// the header, the rule, rows, an empty line); `None` until all of it is there.
pub fn parse_status(text: &str) -> Option<Vec<StatusRow>> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("map: "));
    lines.next()?;
    lines
        .next()
        .filter(|l| l.starts_with("cl score ping name"))?;
    lines.next().filter(|l| l.starts_with("-- -----"))?;
    let mut rows = Vec::new();
    for line in lines {
        if line.trim().is_empty() {
            return Some(rows);
        }
        rows.push(parse_row(line)?);
    }
    None
}

/// Sends `status` on the server's console and returns its rows, read from the server's log
/// (at most `limit`).
///
/// # Errors
///
/// A closed console, or `TimedOut` with the tail of the server's log.
pub async fn server_status(server: &OpenArena, limit: Duration) -> io::Result<Vec<StatusRow>> {
    let from = server.log().len();
    server.console("status")?;
    let deadline = Instant::now() + limit;
    loop {
        let log = server.log();
        let start = (0..=from.min(log.len()))
            .rev()
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(0);
        if let Some(rows) = parse_status(&log[start..]) {
            return Ok(rows);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no status output within {limit:?}; log:\n{}",
                    tail(&log, 20)
                ),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "junk\nmap: oa_dm1\n\
        cl score ping name            address                                 rate \n\
        -- ----- ---- --------------- --------------------------------------- -----\n \
        0     0    0 relaytest       ^7127.77.0.2                              99999\n \
        1    -3  999 two words       ^7127.1.2.3                               25000\n\
        12     5 CON a^1very^7longname^7 ^7bot                                      0\n \
        3     0  ZMB x               ^7loopback                                 5000\n\nnext\n";

    #[test]
    fn parses_status_rows() {
        let rows = parse_status(STATUS).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows[0],
            StatusRow {
                slot: 0,
                score: 0,
                ping: Ping::Ms(0),
                name: "relaytest".into(),
                address: "127.77.0.2".into(),
                rate: 99999,
            }
        );
        assert!(rows[0].acking());
        assert_eq!((rows[1].score, rows[1].ping), (-3, Ping::Ms(999)));
        assert_eq!(rows[1].name, "two words");
        assert!(!rows[1].acking());
        assert_eq!(rows[2].name, "a^1very^7longname^7");
        assert_eq!((rows[2].slot, rows[2].ping), (12, Ping::Connecting));
        assert_eq!(rows[2].address, "bot");
        assert_eq!(
            (rows[3].ping, rows[3].address.as_str()),
            (Ping::Zombie, "loopback")
        );
    }

    #[test]
    fn incomplete_status_is_none() {
        let cut = STATUS.find("\n\nnext").unwrap();
        assert_eq!(parse_status(&STATUS[..cut + 1]), None);
        assert_eq!(parse_status("map: x\ncl score ping name\n"), None);
        let empty = "map: x\ncl score ping name  address rate\n-- ----- ----\n\n";
        assert_eq!(parse_status(empty), Some(vec![]));
    }
}
