//! The relay's own challenges: a keyed MAC of the client's address and a coarse time, so a
//! `getchallenge` costs one small answer and no state, and only the address it was sent to can
//! `connect` with it.
//!
//! As OpenJK's stateless challenges (`network-anchors.md`): the value is a positive 31-bit
//! number, its top bit the parity of the time period it was made in and the rest 30 bits of
//! SipHash-1-3 (a random key per server, drawn at start) of the address (IP and port) and the
//! period. [`Cookies::check`] takes the current and the previous period, so a challenge is good
//! for between [`PERIOD`] and twice that: a client retrying every 3 s has ample time, a
//! forged one needs 2^30 tries on average. Time is tokio's clock, counted from the server's
//! start. No I/O, nothing stored per client.

use std::hash::Hasher;
use std::net::SocketAddr;
use std::time::Duration;

use siphasher::sip::SipHasher13;

use crate::clock::Instant;

/// A period of the challenges: good for at least this long, at most twice.
pub(super) const PERIOD: Duration = Duration::from_secs(16);

/// Makes and checks the relay's challenges for one server.
#[derive(Debug)]
pub(super) struct Cookies {
    key: (u64, u64),
    epoch: Instant,
}

impl Cookies {
    /// Challenges under a fresh random key, periods counted from `epoch`.
    pub(super) fn new(epoch: Instant) -> Self {
        Cookies {
            key: (rand::random(), rand::random()),
            epoch,
        }
    }

    fn period(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch).as_millis() / PERIOD.as_millis()) as u64
    }

    fn mac(&self, addr: SocketAddr, period: u64) -> i32 {
        let mut h = SipHasher13::new_with_keys(self.key.0, self.key.1);
        match addr.ip().to_canonical() {
            std::net::IpAddr::V4(a) => h.write(&a.octets()),
            std::net::IpAddr::V6(a) => h.write(&a.octets()),
        }
        h.write_u16(addr.port());
        h.write_u64(period);
        let parity = (period & 1) << 30;
        // Never 0: the value a `connect` without a challenge reads as.
        let value = (h.finish() & 0x3fff_ffff).max(1) | parity;
        value as i32
    }

    /// The challenge for `addr` at `now`.
    pub(super) fn issue(&self, addr: SocketAddr, now: Instant) -> i32 {
        self.mac(addr, self.period(now))
    }

    /// Whether `value` is a challenge this server gave `addr` in this period or the last.
    pub(super) fn check(&self, addr: SocketAddr, value: i32, now: Instant) -> bool {
        let Ok(v) = u32::try_from(value) else {
            return false;
        };
        let current = self.period(now);
        let period = if u64::from(v >> 30 & 1) == current & 1 {
            current
        } else if current > 0 {
            current - 1
        } else {
            return false;
        };
        self.mac(addr, period) == value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_challenge_is_good_for_its_address_for_one_to_two_periods() {
        let cookies = Cookies::new(Instant::now());
        let a: SocketAddr = "192.0.2.1:27960".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:27961".parse().unwrap();
        let c = cookies.issue(a, Instant::now());
        assert!(c > 0);
        assert!(cookies.check(a, c, Instant::now()));
        assert!(!cookies.check(b, c, Instant::now()), "another port");
        assert!(!cookies.check(a, c ^ 1, Instant::now()));
        assert!(!cookies.check(a, -c, Instant::now()));
        tokio::time::advance(PERIOD).await;
        assert!(cookies.check(a, c, Instant::now()), "the previous period");
        assert_ne!(cookies.issue(a, Instant::now()), c);
        tokio::time::advance(PERIOD).await;
        assert!(!cookies.check(a, c, Instant::now()), "two periods on");
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:27960".parse().unwrap();
        let now = Instant::now();
        assert_eq!(cookies.issue(mapped, now), cookies.issue(a, now));
    }

    #[test]
    fn another_key_gives_other_challenges() {
        let now = Instant::now();
        let a: SocketAddr = "192.0.2.1:27960".parse().unwrap();
        let (x, y) = (Cookies::new(now), Cookies::new(now));
        assert_ne!(x.issue(a, now), y.issue(a, now));
    }
}
