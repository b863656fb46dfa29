//! Scripted master servers: the party that decides whether a game server is
//! listed in the in-game browser (`et-protocol.md` §3 "Master side" and §5).
//!
//! Two styles:
//!
//! * [`MasterStyle::Classic`] behaves like dpmaster 2.2: a heartbeat
//!   `heartbeat <tag>` (exact, case-sensitive prefix) from a game server is
//!   answered with `getinfo <challenge>` to the heartbeat's source address;
//!   the server is listed only if a valid `infoResponse` with that challenge
//!   comes back **from the same ip:port within 2 s**.
//! * [`MasterStyle::EtMaster`] behaves like etmaster.net as seen in the
//!   etrelay design notes: the heartbeat is answered with
//!   `getChallenge <10 digits>`; a `challengeResponse <n>` from the same
//!   address is answered with `getInfo <10-char challenge>`, and the matching
//!   `infoResponse` must come back from the same address; the whole exchange
//!   must finish within 2 s of the heartbeat.
//!
//! Accepted heartbeat tags: `EnemyTerritory-1` (game `et`) and `QuakeArena-1`
//! (game `Quake3Arena`). `ETFlatline-1` and `WolfFlatline-1` are recorded and
//! otherwise ignored (the server stays listed). Any other tag is recorded and
//! rejected.
//!
//! infoResponse checks (both styles): `challenge` equal to the one sent,
//! `protocol` present and numeric, `sv_maxclients` present and non-zero,
//! `clients` present, `gametype` without spaces if present, `gamename` equal
//! to the heartbeat's game if present. A failed check is recorded in
//! [`FakeMaster::rejections`]; the challenge stays valid until its 2 s run out
//! (like dpmaster, a later correct answer still counts), and an expired
//! challenge is recorded as a rejection too.
//!
//! Both styles answer `getservers <protocol> [keywords...]` with
//! `getserversResponse` followed by one binary record per listed server whose
//! infoResponse `protocol` equals the requested one (`\` + 4 address bytes +
//! 2 port bytes, big-endian), then `\EOT\0\0\0`; at most 1400 bytes per
//! datagram, EOT only in the last one. Keywords (`empty`, `full`, ...) are
//! ignored: every matching listed server is sent. `getserversExt <game>
//! <protocol>` is answered the same way with `getserversExtResponse`
//! (IPv4 records only).
//!
//! Listing never expires during a test (dpmaster keeps an entry 15 min).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::Rng;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::info;
use crate::udp::oob;

/// How long a server has to complete the challenge (dpmaster
/// `TIMEOUT_CHALLENGE`).
const CHALLENGE_WINDOW: Duration = Duration::from_secs(2);
/// dpmaster's maximum `getservers` reply datagram.
const MAX_REPLY: usize = 1400;
/// The usual master port, tried first.
const MASTER_PORT: u16 = 27950;

/// Which master behaviour to script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MasterStyle {
    /// dpmaster-like: `heartbeat` -> `getinfo <challenge>` -> `infoResponse`.
    Classic,
    /// etmaster.net-like: `heartbeat` -> `getChallenge` ->
    /// `challengeResponse` -> `getInfo <challenge>` -> `infoResponse`.
    EtMaster,
}

/// Where a server is in the registration exchange.
#[derive(Debug, Clone)]
enum Stage {
    /// EtMaster: `getChallenge` sent, waiting for `challengeResponse`.
    AwaitChallengeResponse,
    /// `getinfo`/`getInfo` sent with this challenge.
    AwaitInfo { challenge: String },
}

#[derive(Debug, Clone)]
struct Pending {
    game: &'static str,
    deadline: Instant,
    stage: Stage,
}

#[derive(Debug, Clone)]
struct Listed {
    addr: SocketAddr,
    protocol: u32,
}

#[derive(Debug, Default)]
struct State {
    heartbeats: Vec<(SocketAddr, String)>,
    listed: Vec<Listed>,
    rejections: Vec<(SocketAddr, String)>,
    pending: HashMap<SocketAddr, Pending>,
}

/// A scripted master server on a UDP socket; see the module docs.
///
/// Dropping it aborts its task.
#[derive(Debug)]
pub struct FakeMaster {
    addr: SocketAddr,
    style: MasterStyle,
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<u64>>,
    task: Option<JoinHandle<()>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeMaster {
    /// Binds `ip:27950` (or `ip:0` if that port is taken) and spawns the
    /// master task on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(ip: Ipv4Addr, style: MasterStyle) -> io::Result<FakeMaster> {
        let std_socket = std::net::UdpSocket::bind(SocketAddr::from((ip, MASTER_PORT)))
            .or_else(|_| std::net::UdpSocket::bind(SocketAddr::from((ip, 0))))?;
        std_socket.set_nonblocking(true)?;
        let socket = UdpSocket::from_std(std_socket)?;
        let addr = socket.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (changes, _) = watch::channel(0u64);
        let changes = Arc::new(changes);
        let task = tokio::spawn(run(socket, style, Arc::clone(&state), Arc::clone(&changes)));
        Ok(FakeMaster {
            addr,
            style,
            state,
            changes,
            task: Some(task),
        })
    }

    /// The master's address (where heartbeats go).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The style this master was started with.
    pub fn style(&self) -> MasterStyle {
        self.style
    }

    /// Every well-formed heartbeat received, as `(source, tag)`, in order
    /// (flatlines and unknown tags included).
    pub fn heartbeats(&self) -> Vec<(SocketAddr, String)> {
        lock(&self.state).heartbeats.clone()
    }

    /// The servers currently listed (what `getservers` would return, all
    /// protocols).
    pub fn listed(&self) -> Vec<SocketAddr> {
        lock(&self.state).listed.iter().map(|l| l.addr).collect()
    }

    /// Every rejection so far, as `(source, reason)`.
    pub fn rejections(&self) -> Vec<(SocketAddr, String)> {
        lock(&self.state).rejections.clone()
    }

    /// Waits until `server` is listed, at most `timeout`. Event-driven: wakes
    /// on every state change of the master.
    pub async fn wait_listed(&self, server: SocketAddr, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        loop {
            if self.listed().contains(&server) {
                return true;
            }
            match timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the task is gone.
                _ => return self.listed().contains(&server),
            }
        }
    }

    /// Waits until `n` heartbeats with tag `tag` have been received, at most
    /// `timeout`; returns the sources of the first `n` of them (fewer on
    /// timeout). Event-driven like [`FakeMaster::wait_listed`].
    pub async fn wait_heartbeats(&self, tag: &str, n: usize, timeout: Duration) -> Vec<SocketAddr> {
        let deadline = Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        let matching = || -> Vec<SocketAddr> {
            lock(&self.state)
                .heartbeats
                .iter()
                .filter(|(_, t)| t == tag)
                .map(|(a, _)| *a)
                .take(n)
                .collect()
        };
        loop {
            let found = matching();
            if found.len() >= n {
                return found;
            }
            match timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return matching(),
            }
        }
    }
}

impl Drop for FakeMaster {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The master's loop: datagrams, and the expiry of pending challenges.
async fn run(
    socket: UdpSocket,
    style: MasterStyle,
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<u64>>,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let next_expiry = lock(&state).pending.values().map(|p| p.deadline).min();
        let outgoing = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok((len, from)) => handle(&mut lock(&state), style, from, &buf[..len]),
                Err(_) => Vec::new(),
            },
            _ = sleep_until(next_expiry.unwrap_or_else(Instant::now)), if next_expiry.is_some() => {
                expire(&mut lock(&state));
                Vec::new()
            }
        };
        changes.send_modify(|v| *v = v.wrapping_add(1));
        for (to, packet) in outgoing {
            let _ = socket.send_to(&packet, to).await;
        }
    }
}

/// Drops the challenges whose window has passed, recording a rejection.
fn expire(st: &mut State) {
    let now = Instant::now();
    let expired: Vec<SocketAddr> = st
        .pending
        .iter()
        .filter(|(_, p)| p.deadline <= now)
        .map(|(a, _)| *a)
        .collect();
    for addr in expired {
        if let Some(p) = st.pending.remove(&addr) {
            let what = match p.stage {
                Stage::AwaitChallengeResponse => "no challengeResponse",
                Stage::AwaitInfo { .. } => "no valid infoResponse",
            };
            st.rejections.push((
                addr,
                format!("{what} within {CHALLENGE_WINDOW:?} of the heartbeat"),
            ));
        }
    }
}

/// The game a heartbeat tag advertises, if the master accepts it.
fn game_for_tag(tag: &str) -> Option<&'static str> {
    match tag {
        "EnemyTerritory-1" => Some("et"),
        "QuakeArena-1" => Some("Quake3Arena"),
        _ => None,
    }
}

/// dpmaster's `BuildChallenge`: 8 to 11 chars from ASCII 33..=126 minus
/// `\ ; " % /`.
fn classic_challenge() -> String {
    let mut rng = rand::rng();
    let len = rng.random_range(8..=11);
    let mut s = String::with_capacity(len);
    while s.len() < len {
        let c = rng.random_range(33u8..=126);
        if !b"\\;\"%/".contains(&c) {
            s.push(c as char);
        }
    }
    s
}

/// `n` random decimal digits.
fn digits(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect()
}

/// `n` random alphanumeric chars.
fn alnum(n: usize) -> String {
    const SET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(SET[rng.random_range(0..SET.len())]))
        .collect()
}

/// Handles one datagram; returns the datagrams to send.
fn handle(
    st: &mut State,
    style: MasterStyle,
    from: SocketAddr,
    packet: &[u8],
) -> Vec<(SocketAddr, Vec<u8>)> {
    let Some(payload) = packet.strip_prefix(b"\xff\xff\xff\xff") else {
        st.rejections
            .push((from, "not a connectionless packet".to_string()));
        return Vec::new();
    };
    if let Some(rest) = payload.strip_prefix(b"heartbeat ") {
        return heartbeat(st, style, from, rest);
    }
    if let Some(body) = payload.strip_prefix(b"infoResponse\n") {
        info_response(st, from, body);
        return Vec::new();
    }
    if payload.starts_with(b"challengeResponse") {
        return challenge_response(st, style, from, payload);
    }
    let line = payload
        .split(|&b| b == b'\n' || b == 0)
        .next()
        .unwrap_or_default();
    let words: Vec<&[u8]> = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    match words.first().copied() {
        Some(b"getservers") => {
            let protocol = words.get(1).and_then(|p| parse_u32(p));
            getservers(st, from, "getserversResponse", protocol)
        }
        Some(b"getserversExt") => {
            let protocol = words.get(2).and_then(|p| parse_u32(p));
            getservers(st, from, "getserversExtResponse", protocol)
        }
        _ => {
            let first = String::from_utf8_lossy(words.first().copied().unwrap_or_default());
            st.rejections
                .push((from, format!("unknown or ignored packet: {first:?}")));
            Vec::new()
        }
    }
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn heartbeat(
    st: &mut State,
    style: MasterStyle,
    from: SocketAddr,
    rest: &[u8],
) -> Vec<(SocketAddr, Vec<u8>)> {
    // `sscanf("%63s")`: skip whitespace, then up to 63 non-whitespace chars.
    let tag: Vec<u8> = rest
        .iter()
        .copied()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| !b.is_ascii_whitespace() && *b != 0)
        .take(63)
        .collect();
    let tag = String::from_utf8_lossy(&tag).into_owned();
    if tag.is_empty() {
        st.rejections
            .push((from, "heartbeat without a tag".to_string()));
        return Vec::new();
    }
    tracing::debug!(%from, %tag, "fake master received heartbeat");
    st.heartbeats.push((from, tag.clone()));
    if tag == "ETFlatline-1" || tag == "WolfFlatline-1" {
        return Vec::new(); // ignored: could be spoofed
    }
    let Some(game) = game_for_tag(&tag) else {
        st.rejections
            .push((from, format!("unknown heartbeat tag {tag:?}")));
        return Vec::new();
    };
    let deadline = Instant::now() + CHALLENGE_WINDOW;
    let (stage, request) = match style {
        MasterStyle::Classic => {
            let challenge = classic_challenge();
            let request = format!("getinfo {challenge}");
            (Stage::AwaitInfo { challenge }, request)
        }
        MasterStyle::EtMaster => (
            Stage::AwaitChallengeResponse,
            format!("getChallenge {}", digits(10)),
        ),
    };
    st.pending.insert(
        from,
        Pending {
            game,
            deadline,
            stage,
        },
    );
    vec![(from, oob(request.as_bytes()))]
}

fn challenge_response(
    st: &mut State,
    style: MasterStyle,
    from: SocketAddr,
    payload: &[u8],
) -> Vec<(SocketAddr, Vec<u8>)> {
    if style != MasterStyle::EtMaster {
        st.rejections
            .push((from, "unexpected challengeResponse".to_string()));
        return Vec::new();
    }
    let Some(pending) = st.pending.get_mut(&from) else {
        st.rejections
            .push((from, "challengeResponse from unknown server".to_string()));
        return Vec::new();
    };
    if !matches!(pending.stage, Stage::AwaitChallengeResponse) {
        st.rejections
            .push((from, "challengeResponse not expected now".to_string()));
        return Vec::new();
    }
    let text = String::from_utf8_lossy(payload);
    let number = text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse::<i64>().ok());
    if number.is_none() {
        st.rejections
            .push((from, format!("malformed challengeResponse {text:?}")));
        return Vec::new();
    }
    if Instant::now() > pending.deadline {
        return Vec::new(); // the expiry timer records it
    }
    let challenge = alnum(10);
    let request = format!("getInfo {challenge}");
    pending.stage = Stage::AwaitInfo { challenge };
    vec![(from, oob(request.as_bytes()))]
}

fn info_response(st: &mut State, from: SocketAddr, body: &[u8]) {
    let Some(pending) = st.pending.get(&from).cloned() else {
        st.rejections
            .push((from, "infoResponse from unknown server".to_string()));
        return;
    };
    let Stage::AwaitInfo { challenge } = &pending.stage else {
        st.rejections
            .push((from, "infoResponse before challengeResponse".to_string()));
        return;
    };
    if Instant::now() > pending.deadline {
        return; // the expiry timer records it
    }
    match validate(&info::parse(body), challenge, pending.game) {
        Ok(protocol) => {
            tracing::debug!(%from, protocol, "fake master lists server");
            st.pending.remove(&from);
            st.listed.retain(|l| l.addr != from);
            st.listed.push(Listed {
                addr: from,
                protocol,
            });
        }
        Err(reason) => st.rejections.push((from, reason)),
    }
}

/// The infoResponse checks; `Ok(protocol)` when the server may be listed.
fn validate(pairs: &[(String, String)], challenge: &str, game: &str) -> Result<u32, String> {
    match info::get(pairs, "challenge") {
        Some(c) if c == challenge => {}
        Some(c) => return Err(format!("wrong challenge {c:?} (sent {challenge:?})")),
        None => return Err("no challenge in infoResponse".to_string()),
    }
    let protocol = match info::get(pairs, "protocol") {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p
            .parse::<u32>()
            .map_err(|_| format!("protocol {p:?} out of range"))?,
        Some(p) => return Err(format!("protocol {p:?} is not numeric")),
        None => return Err("no protocol in infoResponse".to_string()),
    };
    match info::get(pairs, "sv_maxclients").map(|m| m.trim().parse::<i64>()) {
        Some(Ok(n)) if n != 0 => {}
        Some(_) => return Err("sv_maxclients is zero or not a number".to_string()),
        None => return Err("no sv_maxclients in infoResponse".to_string()),
    }
    if info::get(pairs, "clients").is_none() {
        return Err("no clients in infoResponse".to_string());
    }
    if let Some(gametype) = info::get(pairs, "gametype")
        && gametype.contains(' ')
    {
        return Err(format!("gametype {gametype:?} contains spaces"));
    }
    if let Some(gamename) = info::get(pairs, "gamename")
        && gamename != game
    {
        return Err(format!(
            "game name {gamename:?} is different from the one advertised by the heartbeat ({game:?})"
        ));
    }
    Ok(protocol)
}

/// The `getservers` reply datagrams.
fn getservers(
    st: &State,
    from: SocketAddr,
    header: &str,
    protocol: Option<u32>,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let records: Vec<[u8; 7]> = st
        .listed
        .iter()
        .filter(|l| Some(l.protocol) == protocol)
        .filter_map(|l| match l.addr.ip() {
            IpAddr::V4(ip) => {
                let mut r = [0u8; 7];
                r[0] = b'\\';
                r[1..5].copy_from_slice(&ip.octets());
                r[5..7].copy_from_slice(&l.addr.port().to_be_bytes());
                Some(r)
            }
            IpAddr::V6(_) => None,
        })
        .collect();
    let start = || oob(header.as_bytes());
    let mut out = Vec::new();
    let mut packet = start();
    for record in records {
        if packet.len() + record.len() > MAX_REPLY {
            out.push((from, std::mem::replace(&mut packet, start())));
        }
        packet.extend_from_slice(&record);
    }
    if packet.len() + 7 > MAX_REPLY {
        out.push((from, std::mem::replace(&mut packet, start())));
    }
    packet.extend_from_slice(b"\\EOT\0\0\0");
    out.push((from, packet));
    out
}

/// Parses `getserversResponse` / `getserversExtResponse` datagrams (IPv4
/// records) into addresses; stops at `\EOT`. Useful to check a master's
/// answer in tests.
pub fn parse_getservers_response(packet: &[u8]) -> Vec<SocketAddr> {
    let body = packet
        .strip_prefix(b"\xff\xff\xff\xffgetserversResponse")
        .or_else(|| packet.strip_prefix(b"\xff\xff\xff\xffgetserversExtResponse"))
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 7 <= body.len() && body[i] == b'\\' {
        let record = &body[i + 1..i + 7];
        if record.starts_with(b"EOT") {
            break;
        }
        let ip = Ipv4Addr::new(record[0], record[1], record[2], record[3]);
        let port = u16::from_be_bytes([record[4], record[5]]);
        out.push(SocketAddr::from((ip, port)));
        i += 7;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_well_formed() {
        for _ in 0..200 {
            let c = classic_challenge();
            assert!((8..=11).contains(&c.len()));
            assert!(
                c.bytes()
                    .all(|b| (33..=126).contains(&b) && !b"\\;\"%/".contains(&b))
            );
        }
        assert_eq!(digits(10).len(), 10);
        assert_eq!(alnum(10).len(), 10);
    }

    #[test]
    fn validation() {
        let p = |s: &str| info::parse(s.as_bytes());
        let good = "\\challenge\\abc\\protocol\\84\\sv_maxclients\\20\\clients\\0\\gamename\\et\\gametype\\4";
        assert_eq!(validate(&p(good), "abc", "et"), Ok(84));
        assert!(validate(&p(good), "abd", "et").is_err());
        assert!(validate(&p(good), "abc", "Quake3Arena").is_err());
        assert!(
            validate(
                &p("\\challenge\\abc\\sv_maxclients\\20\\clients\\0"),
                "abc",
                "et"
            )
            .is_err()
        );
        assert!(
            validate(
                &p("\\challenge\\abc\\protocol\\x\\sv_maxclients\\20\\clients\\0"),
                "abc",
                "et"
            )
            .is_err()
        );
        assert!(
            validate(
                &p("\\challenge\\abc\\protocol\\84\\sv_maxclients\\0\\clients\\0"),
                "abc",
                "et"
            )
            .is_err()
        );
        assert!(
            validate(
                &p("\\challenge\\abc\\protocol\\84\\sv_maxclients\\8"),
                "abc",
                "et"
            )
            .is_err()
        );
        assert!(
            validate(
                &p("\\challenge\\abc\\protocol\\84\\sv_maxclients\\8\\clients\\0\\gametype\\a b"),
                "abc",
                "et"
            )
            .is_err()
        );
        // gamename is optional for the known tags.
        assert_eq!(
            validate(
                &p("\\challenge\\abc\\protocol\\71\\sv_maxclients\\8\\clients\\0"),
                "abc",
                "et"
            ),
            Ok(71)
        );
    }

    #[test]
    fn getservers_packing() {
        let mut st = State::default();
        for i in 0..300u32 {
            st.listed.push(Listed {
                addr: SocketAddr::from((Ipv4Addr::new(127, 0, 0, 10), 27960 + i as u16)),
                protocol: 84,
            });
        }
        st.listed.push(Listed {
            addr: SocketAddr::from((Ipv4Addr::new(127, 0, 0, 11), 27960)),
            protocol: 71,
        });
        let from = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let out = getservers(&st, from, "getserversResponse", Some(84));
        assert!(out.len() >= 2);
        let mut all = Vec::new();
        for (i, (_, p)) in out.iter().enumerate() {
            assert!(p.len() <= MAX_REPLY);
            assert_eq!(p.ends_with(b"\\EOT\0\0\0"), i == out.len() - 1);
            all.extend(parse_getservers_response(p));
        }
        assert_eq!(all.len(), 300);
        assert_eq!(
            all[0],
            SocketAddr::from((Ipv4Addr::new(127, 0, 0, 10), 27960))
        );
        let none = getservers(&st, from, "getserversResponse", Some(85));
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].1, b"\xff\xff\xff\xffgetserversResponse\\EOT\0\0\0");
    }
}
