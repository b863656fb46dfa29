//! A scripted Wolfenstein: Enemy Territory 2.60b-style game server.
//!
//! [`FakeEtServer`] answers the connectionless queries the way an ET 2.60b
//! server does (`et-protocol.md` §3-4), without any game behind it:
//!
//! * packets are classified with [`q3model::dispatch`]`(Engine::Et260, ..)`;
//! * `getinfo [<challenge>]` gets `infoResponse\n` + the ET 2.60b keys
//!   (`challenge, protocol, hostname, serverload, mapname, clients,
//!   sv_maxclients, gametype, pure, [minPing], [maxPing], [game],
//!   sv_allowAnonymous, friendlyFire, maxlives, needpass, gamename,
//!   g_antilag, weaprestrict, balancedteams`);
//! * `getstatus [<challenge>]` gets `statusResponse\n` + serverinfo (with
//!   `\challenge\<c>` appended only when a challenge was given) + `\n` + one
//!   `<score> <ping> "<name>"\n` line per player;
//! * a challenge that fails ET 2.60b's `SV_VerifyChallenge` (longer than 64
//!   chars, or containing `\ / % ; "` or a byte < 32 or > 126) gets no reply;
//! * `getchallenge` gets `challengeResponse <random positive int>`, remembered for the asking
//!   address (the last [`MAX_CHALLENGES`]);
//! * a plaintext `CONNECT "<userinfo>"` gets `connectResponse` only when its `challenge` is one
//!   given to that same address (else `print\nNo or bad challenge for address.\n`), and then
//!   makes the sender a connected client with the userinfo's `qport`; a Huffman-compressed
//!   `connect` (which the fake cannot read) gets `connectResponse` unchecked;
//! * an in-game packet is routed as ET 2.60b and ioquake3 do (`et-protocol.md` §4b): to the
//!   connected client with the same **IP and qport**; when its port differs, the client is
//!   re-pointed to the new port ("fixing up a translated port"); the client then gets one
//!   in-game packet back (the sequence number it sent, then `snap`), which is the fake's
//!   in-game stream. In-game packets of no connected client are recorded only;
//! * `rcon <password> <command>` honours ET 2.60b's global 500 ms gap between
//!   rcon packets (a packet inside the gap is dropped silently, good password
//!   or not); a bad password gets `print\nBad rconpassword.\n`; a good one
//!   executes the command text and answers `print\n<output>`;
//! * no query rate limiting (ET 2.60b has none);
//! * replies carry no trailing NUL;
//! * everything else (disconnect, PunkBuster, unknown, in-game packets) is
//!   recorded and not answered.
//!
//! Supported rcon commands: `sets <key> <value...>` (adds or replaces a
//! serverinfo cvar, an empty value removes it), `status`, `serverinfo`.
//! Any other command is recorded as executed and answered with a bare
//! `print\n`, like ET 2.60b's game module, which turns unknown console
//! commands into a `server:` chat message and prints nothing.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::q3model::{self, Dispatch, Engine};

/// ET 2.60b's minimum gap between two accepted rcon packets (global).
const RCON_GAP: Duration = Duration::from_millis(500);
/// ET 2.60b `SV_VerifyChallenge` maximum length.
const MAX_CHALLENGE: usize = 64;
/// Challenges remembered (ET 2.60b keeps `MAX_CHALLENGES` 1024).
pub const MAX_CHALLENGES: usize = 1024;

/// Initial settings of a [`FakeEtServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeEtConfig {
    /// `sv_hostname` (the `hostname` key of infoResponse).
    pub hostname: String,
    /// `mapname`.
    pub mapname: String,
    /// `sv_maxclients`.
    pub max_clients: u32,
    /// `rconpassword`; an empty password refuses every rcon.
    pub rcon_password: String,
    /// Players as `(score, ping, name)`, listed in statusResponse and counted
    /// in the `clients` key.
    pub players: Vec<(i32, i32, String)>,
}

impl Default for FakeEtConfig {
    fn default() -> Self {
        FakeEtConfig {
            hostname: "fake-et".to_string(),
            mapname: "oasis".to_string(),
            max_clients: 20,
            rcon_password: "secret".to_string(),
            players: Vec::new(),
        }
    }
}

/// One datagram received by a [`FakeEtServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Source address.
    pub from: SocketAddr,
    /// The whole datagram, marker included.
    pub packet: Vec<u8>,
    /// How ET 2.60b classifies it.
    pub dispatch: Dispatch,
}

/// Mutable state shared between the handle and the task.
#[derive(Debug)]
struct State {
    /// Serverinfo cvars, in insertion order (ET 2.60b appends).
    cvars: Vec<(String, String)>,
    players: Vec<(i32, i32, String)>,
    rcon_password: String,
    received: Vec<Received>,
    rcon_executed: Vec<String>,
    answering: bool,
    last_rcon: Option<Instant>,
    /// Challenges given, oldest first.
    challenges: std::collections::VecDeque<(SocketAddr, i32)>,
    /// Connected clients: address and qport.
    clients: Vec<(SocketAddr, u16)>,
    /// Times a client was re-pointed to a new port.
    fixups: usize,
}

impl State {
    fn cvar(&self, key: &str) -> Option<&str> {
        self.cvars
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    fn cvar_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.cvar(key).unwrap_or(default)
    }

    fn cvar_int(&self, key: &str) -> i64 {
        self.cvar(key)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|f| f as i64)
            .unwrap_or(0)
    }

    /// Sets a serverinfo cvar: replaced in place if present, appended
    /// otherwise, removed when `value` is empty.
    fn set_cvar(&mut self, key: &str, value: &str) {
        let pos = self
            .cvars
            .iter()
            .position(|(k, _)| k.eq_ignore_ascii_case(key));
        match (pos, value.is_empty()) {
            (Some(i), true) => {
                self.cvars.remove(i);
            }
            (Some(i), false) => self.cvars[i].1 = value.to_string(),
            (None, true) => {}
            (None, false) => self.cvars.push((key.to_string(), value.to_string())),
        }
    }

    fn serverinfo(&self) -> String {
        crate::info::build(&self.cvars)
    }
}

/// A scripted ET 2.60b-style server on a UDP socket; see the module docs.
///
/// Dropping it aborts its task (the socket closes with it).
#[derive(Debug)]
pub struct FakeEtServer {
    addr: SocketAddr,
    socket: Arc<UdpSocket>,
    state: Arc<Mutex<State>>,
    task: Option<JoinHandle<()>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave the state inconsistent in
    // a way that matters for a test double.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeEtServer {
    /// Binds `ip:0` and spawns the server task on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(ip: Ipv4Addr, config: FakeEtConfig) -> io::Result<FakeEtServer> {
        let std_socket = std::net::UdpSocket::bind(SocketAddr::from((ip, 0)))?;
        std_socket.set_nonblocking(true)?;
        let socket = Arc::new(UdpSocket::from_std(std_socket)?);
        let addr = socket.local_addr()?;

        let cvars: Vec<(String, String)> = [
            ("sv_hostname", config.hostname.as_str()),
            ("mapname", config.mapname.as_str()),
            ("protocol", "84"),
            ("version", "ET 2.60b linux-i386 May  8 2006"),
            ("sv_maxclients", &config.max_clients.to_string()),
            ("sv_privateClients", "0"),
            ("g_gametype", "4"),
            ("gamename", "etmain"),
            ("sv_allowAnonymous", "0"),
            ("sv_floodProtect", "1"),
            ("sv_maxRate", "13000"),
            ("sv_minPing", "0"),
            ("sv_maxPing", "0"),
            ("g_needpass", "0"),
            ("g_friendlyFire", "1"),
            ("g_maxlives", "0"),
            ("g_antilag", "1"),
            ("g_heavyWeaponRestriction", "100"),
            ("g_balancedteams", "1"),
            ("timelimit", "30"),
            ("sv_pure", "1"),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();

        let state = Arc::new(Mutex::new(State {
            cvars,
            players: config.players,
            rcon_password: config.rcon_password,
            received: Vec::new(),
            rcon_executed: Vec::new(),
            answering: true,
            last_rcon: None,
            challenges: std::collections::VecDeque::new(),
            clients: Vec::new(),
            fixups: 0,
        }));
        let task = tokio::spawn(serve(Arc::clone(&socket), Arc::clone(&state)));
        Ok(FakeEtServer {
            addr,
            socket,
            state,
            task: Some(task),
        })
    }

    /// The server's address (the one it answers from).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every datagram received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// How many received datagrams were classified as `d`.
    pub fn count(&self, d: Dispatch) -> usize {
        lock(&self.state)
            .received
            .iter()
            .filter(|r| r.dispatch == d)
            .count()
    }

    /// The command texts executed by rcon with the right password, in order.
    pub fn rcon_executed(&self) -> Vec<String> {
        lock(&self.state).rcon_executed.clone()
    }

    /// Sets a serverinfo cvar (as `sets` would); an empty value removes it.
    pub fn set_cvar(&self, key: &str, value: &str) {
        lock(&self.state).set_cvar(key, value);
    }

    /// The value of a serverinfo cvar (key compared case-insensitively).
    pub fn cvar(&self, key: &str) -> Option<String> {
        lock(&self.state).cvar(key).map(str::to_string)
    }

    /// `false`: keep receiving and recording, but never reply (a dead or
    /// hung server). `true` (the default): reply normally.
    pub fn set_answering(&self, answering: bool) {
        lock(&self.state).answering = answering;
    }

    /// Connected clients (address as last seen, qport).
    pub fn clients(&self) -> Vec<(SocketAddr, u16)> {
        lock(&self.state).clients.clone()
    }

    /// Times a client was re-pointed to a new port by an in-game packet with its qport.
    pub fn fixups(&self) -> usize {
        lock(&self.state).fixups
    }

    /// In-game packets received with `qport`.
    pub fn game_packets_with_qport(&self, qport: u16) -> usize {
        lock(&self.state)
            .received
            .iter()
            .filter(|r| {
                r.dispatch == Dispatch::NotConnectionless
                    && r.packet.get(4..6) == Some(&qport.to_le_bytes()[..])
            })
            .count()
    }

    /// Replaces the player list `(score, ping, name)`.
    pub fn set_players(&self, players: Vec<(i32, i32, String)>) {
        lock(&self.state).players = players;
    }

    /// Sends `bytes` as-is from the server's own socket (for heartbeats).
    pub async fn send_from_own_socket(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.socket.send_to(bytes, to).await.map(|_| ())
    }

    /// Sends `FF FF FF FF heartbeat <tag>\n` from the server's own socket,
    /// like ET 2.60b does (`EnemyTerritory-1`, or `ETFlatline-1` at shutdown).
    pub async fn heartbeat(&self, master: SocketAddr, tag: &str) -> io::Result<()> {
        let packet = crate::udp::oob(format!("heartbeat {tag}\n").as_bytes());
        self.send_from_own_socket(master, &packet).await
    }

    /// Stops the task and waits until it is gone.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for FakeEtServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The receive loop: one datagram at a time, the reply computed under the
/// lock and sent after it is released.
async fn serve(socket: Arc<UdpSocket>, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let (len, from) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            // ICMP errors and the like: keep serving.
            Err(_) => continue,
        };
        let packet = &buf[..len];
        let reply = handle(&mut lock(&state), from, packet);
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// `SV_VerifyChallenge` of ET 2.60b: may this challenge be answered?
fn challenge_ok(challenge: &[u8]) -> bool {
    challenge.len() <= MAX_CHALLENGE
        && challenge
            .iter()
            .all(|&c| (32..=126).contains(&c) && !b"\\/%;\"".contains(&c))
}

/// Formats an OOB reply: marker + text, no trailing NUL.
fn reply(text: &str) -> Option<Vec<u8>> {
    Some(crate::udp::oob(text.as_bytes()))
}

fn handle(st: &mut State, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let dispatch = q3model::dispatch(Engine::Et260, packet);
    tracing::debug!(%from, ?dispatch, len = packet.len(), "fake ET server received");
    st.received.push(Received {
        from,
        packet: packet.to_vec(),
        dispatch,
    });
    if !st.answering {
        return None;
    }
    let args = q3model::argv(Engine::Et260, packet);
    let arg = |i: usize| args.get(i).map(Vec::as_slice).unwrap_or(b"");
    match dispatch {
        Dispatch::GetInfo => {
            let challenge = arg(1);
            if !challenge_ok(challenge) {
                return None;
            }
            reply(&format!(
                "infoResponse\n{}",
                info_string(st, &String::from_utf8_lossy(challenge))
            ))
        }
        Dispatch::GetStatus => {
            let challenge = arg(1);
            if !challenge_ok(challenge) {
                return None;
            }
            let mut info = st.serverinfo();
            if !challenge.is_empty() {
                info.push_str("\\challenge\\");
                info.push_str(&String::from_utf8_lossy(challenge));
            }
            let mut text = format!("statusResponse\n{info}\n");
            for (score, ping, name) in &st.players {
                text.push_str(&format!("{score} {ping} \"{name}\"\n"));
            }
            reply(&text)
        }
        Dispatch::GetChallenge => {
            let n = rand::random_range(1..=i32::MAX);
            if st.challenges.len() >= MAX_CHALLENGES {
                st.challenges.pop_front();
            }
            st.challenges.push_back((from, n));
            reply(&format!("challengeResponse {n}"))
        }
        Dispatch::Connect => connect(st, from, arg(1)),
        Dispatch::HuffmanConnect => reply("connectResponse"),
        Dispatch::NotConnectionless => in_game(st, from, packet),
        Dispatch::Rcon => rcon(st, packet, &args),
        _ => None,
    }
}

/// A plaintext `connect`: its challenge must be one given to `from`.
fn connect(st: &mut State, from: SocketAddr, userinfo: &[u8]) -> Option<Vec<u8>> {
    let pairs = crate::info::parse(userinfo);
    let num = |k: &str| crate::info::get(&pairs, k).and_then(|v| v.trim().parse::<i64>().ok());
    let (challenge, qport) = (num("challenge"), num("qport"));
    let given = st
        .challenges
        .iter()
        .any(|(a, c)| *a == from && Some(i64::from(*c)) == challenge);
    let Some(qport) = qport.filter(|_| given).and_then(|q| u16::try_from(q).ok()) else {
        return reply("print\nNo or bad challenge for address.\n");
    };
    st.clients.retain(|(a, _)| *a != from);
    if st.clients.len() < 64 {
        st.clients.push((from, qport));
    }
    reply("connectResponse")
}

/// An in-game packet: routed by IP and qport, the port fixed up, answered with one packet.
fn in_game(st: &mut State, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let qport = u16::from_le_bytes([*packet.get(4)?, *packet.get(5)?]);
    let client = st
        .clients
        .iter_mut()
        .find(|(a, q)| a.ip() == from.ip() && *q == qport)?;
    if client.0 != from {
        tracing::debug!("fake ET server: fixing up a translated port");
        client.0 = from;
        st.fixups += 1;
    }
    let mut out = packet[..4].to_vec();
    out.extend_from_slice(b"snap");
    Some(out)
}

/// ET 2.60b `SVC_Info` key list, in order.
fn info_string(st: &State, challenge: &str) -> String {
    let max = (st.cvar_int("sv_maxclients") - st.cvar_int("sv_privateClients")).max(0);
    let nonzero = |key: &str| -> String {
        match st.cvar_int(key) {
            0 => String::new(),
            n => n.to_string(),
        }
    };
    let maxlives = if st.cvar_int("g_maxlives") != 0 {
        "1"
    } else {
        "0"
    };
    let pairs: Vec<(&str, String)> = vec![
        ("challenge", challenge.to_string()),
        ("protocol", st.cvar_or("protocol", "84").to_string()),
        ("hostname", st.cvar_or("sv_hostname", "").to_string()),
        ("serverload", "0".to_string()),
        ("mapname", st.cvar_or("mapname", "").to_string()),
        ("clients", st.players.len().to_string()),
        ("sv_maxclients", max.to_string()),
        ("gametype", st.cvar_or("g_gametype", "4").to_string()),
        ("pure", st.cvar_or("sv_pure", "1").to_string()),
        ("minPing", nonzero("sv_minPing")),
        ("maxPing", nonzero("sv_maxPing")),
        ("game", st.cvar_or("fs_game", "").to_string()),
        (
            "sv_allowAnonymous",
            st.cvar_or("sv_allowAnonymous", "0").to_string(),
        ),
        (
            "friendlyFire",
            st.cvar_or("g_friendlyFire", "0").to_string(),
        ),
        ("maxlives", maxlives.to_string()),
        ("needpass", st.cvar_or("g_needpass", "0").to_string()),
        ("gamename", "et".to_string()),
        ("g_antilag", st.cvar_or("g_antilag", "0").to_string()),
        (
            "weaprestrict",
            st.cvar_or("g_heavyWeaponRestriction", "100").to_string(),
        ),
        (
            "balancedteams",
            st.cvar_or("g_balancedteams", "0").to_string(),
        ),
    ];
    crate::info::build(&pairs)
}

/// `SVC_RemoteCommand` of ET 2.60b.
fn rcon(st: &mut State, packet: &[u8], args: &[Vec<u8>]) -> Option<Vec<u8>> {
    let now = Instant::now();
    if let Some(last) = st.last_rcon
        && now < last + RCON_GAP
    {
        return None;
    }
    st.last_rcon = Some(now);

    let password = args.get(1).map(Vec::as_slice).unwrap_or(b"");
    if st.rcon_password.is_empty() || password != st.rcon_password.as_bytes() {
        return reply("print\nBad rconpassword.\n");
    }

    // The command text is re-read from the raw line (`Cmd_Cmd()`): skip 4
    // raw chars ("rcon"), spaces, one word (the password), spaces.
    let line = q3model::read_string_line(Engine::Et260, &packet[4..]);
    let mut i = 4.min(line.len());
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    while i < line.len() && line[i] != b' ' {
        i += 1;
    }
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    let command = &line[i..];
    let text = String::from_utf8_lossy(command).into_owned();
    if !text.is_empty() {
        st.rcon_executed.push(text);
    }
    let output = execute(st, command);
    reply(&format!("print\n{output}"))
}

/// Runs one console command, returns its printed output.
fn execute(st: &mut State, command: &[u8]) -> String {
    let argv: Vec<String> = q3model::tokenize(Engine::Et260, command)
        .into_iter()
        .map(|t| String::from_utf8_lossy(&t).into_owned())
        .collect();
    let Some(name) = argv.first() else {
        return String::new();
    };
    match name.to_ascii_lowercase().as_str() {
        "sets" => {
            if argv.len() < 3 {
                return "usage: sets <variable> <value>\n".to_string();
            }
            let key = &argv[1];
            let value = argv[2..].join(" ");
            if [key.as_str(), value.as_str()]
                .iter()
                .any(|s| s.contains(['\\', ';', '"']))
            {
                return "Can't use keys or values with a \\, ; or \"\n".to_string();
            }
            st.set_cvar(key, &value);
            String::new()
        }
        "status" => {
            let mut out = format!("map: {}\n", st.cvar_or("mapname", ""));
            out.push_str(
                "num score ping name            lastmsg address               qport rate\n",
            );
            out.push_str(
                "--- ----- ---- --------------- ------- --------------------- ----- -----\n",
            );
            for (num, (score, ping, pname)) in st.players.iter().enumerate() {
                out.push_str(&format!(
                    "{num:>3} {score:>5} {ping:>4} {pname:<15} {:>7} {:<21} {:>5} {:>5}\n",
                    0, "bot", 0, 25000
                ));
            }
            out.push('\n');
            out
        }
        "serverinfo" => {
            let mut out = String::from("Server info settings:\n");
            for (k, v) in &st.cvars {
                out.push_str(&format!("{k:<20}{v}\n"));
            }
            out
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_challenge() {
        assert!(challenge_ok(b""));
        assert!(challenge_ok(b"*=Q^6}azH"));
        assert!(challenge_ok(&[b'a'; 64]));
        assert!(!challenge_ok(&[b'a'; 65]));
        for bad in [
            &b"a\\b"[..],
            b"a/b",
            b"a%b",
            b"a;b",
            b"a\"b",
            b"a\x1fb",
            b"a\x7fb",
            b"\xe9",
        ] {
            assert!(!challenge_ok(bad), "{bad:?}");
        }
    }
}
