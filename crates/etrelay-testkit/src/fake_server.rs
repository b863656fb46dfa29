//! A scripted Wolfenstein: Enemy Territory 2.60b-style game server.
//!
//! [`FakeEtServer`] answers the connectionless queries the way an ET 2.60b
//! server does (`et-protocol.md` §3-4), without any game behind it:
//!
//! * packets are classified with [`crate::q3model::dispatch`]`(Engine::Et260, ..)`;
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
//! * the join and the in-game stream come in two flavours ([`Handshake`], chosen in
//!   [`FakeEtConfig::handshake`]):
//!   * [`Handshake::Scripted`] (the default): a plaintext `CONNECT "<userinfo>"` gets
//!     `connectResponse` only when its `challenge` is one given to that same address (else
//!     `print\nNo or bad challenge for address.\n`), and then makes the sender a connected
//!     client with the userinfo's `qport`; a Huffman-compressed `connect` gets
//!     `connectResponse` unchecked; a connected client's in-game packet gets one packet back
//!     (the sequence number it sent, then `snap`);
//!   * [`Handshake::Engine`]: ET 2.60b's own checks (`engine`): a `connect` spelled exactly so
//!     is Huffman-decompressed ([`crate::huffman`]), the protocol must be 84 and the challenge
//!     one given to that address, refusals are ET's `print` texts; then a real netchan with
//!     each client ([`crate::netchan`]): fragments, sequence checks, the XOR encoding with the
//!     client's challenge both ways, patterned messages counted as decoded or garbled
//!     ([`FakeEtServer::netchan_counts`]), one server message per client message;
//! * an in-game packet is routed as ET 2.60b and ioquake3 do (`et-protocol.md` §4b): to the
//!   connected client with the same **IP and qport**; when its port differs, the client is
//!   re-pointed to the new port ("fixing up a translated port"). In-game packets of no
//!   connected client are recorded only;
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

use self::answer::handle;
use self::engine::Client;
use crate::netchan::session::Counts;
use crate::q3model::Dispatch;

mod answer;
mod engine;
mod rcon;

pub use self::engine::{CHALLENGE_REFUSAL, PROTOCOL_REFUSAL};

/// ET 2.60b's minimum gap between two accepted rcon packets (global).
const RCON_GAP: Duration = Duration::from_millis(500);
/// ET 2.60b `SV_VerifyChallenge` maximum length.
const MAX_CHALLENGE: usize = 64;
/// Challenges remembered (ET 2.60b keeps `MAX_CHALLENGES` 1024).
pub const MAX_CHALLENGES: usize = 1024;

/// How a [`FakeEtServer`] handles joins and in-game packets (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Handshake {
    /// The scripted behaviour: plaintext connects checked for the challenge only, compressed
    /// ones accepted unread, one `<sequence>snap` packet per in-game packet.
    #[default]
    Scripted,
    /// ET 2.60b's: compressed connects read, protocol and challenge checked, a netchan with
    /// XOR-encoded, fragmented, patterned messages both ways.
    Engine,
}

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
    /// How joins and in-game packets are handled.
    pub handshake: Handshake,
}

impl FakeEtConfig {
    /// The default settings with [`Handshake::Engine`].
    pub fn engine() -> FakeEtConfig {
        FakeEtConfig {
            handshake: Handshake::Engine,
            ..FakeEtConfig::default()
        }
    }
}

impl Default for FakeEtConfig {
    fn default() -> Self {
        FakeEtConfig {
            hostname: "fake-et".to_string(),
            mapname: "oasis".to_string(),
            max_clients: 20,
            rcon_password: "secret".to_string(),
            players: Vec::new(),
            handshake: Handshake::Scripted,
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
    /// Connected clients.
    clients: Vec<Client>,
    /// Times a client was re-pointed to a new port.
    fixups: usize,
    /// How joins and in-game packets are handled.
    handshake: Handshake,
    /// The netchan counts of clients no longer connected.
    retired: Counts,
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
            handshake: config.handshake,
            retired: Counts::default(),
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
        lock(&self.state)
            .clients
            .iter()
            .map(|c| (c.addr, c.qport))
            .collect()
    }

    /// The in-game counts summed over every client, past and present ([`Handshake::Engine`];
    /// all zero otherwise): `messages_received`/`decoded_ok`/`decoded_bad` are the clients'
    /// messages, `messages_sent`/`datagrams_sent` the server's.
    pub fn netchan_counts(&self) -> Counts {
        engine::total_counts(&lock(&self.state))
    }

    /// The in-game counts of the connected client with `qport`, if any.
    pub fn client_counts(&self, qport: u16) -> Option<Counts> {
        lock(&self.state)
            .clients
            .iter()
            .find(|c| c.qport == qport)
            .and_then(|c| c.session.as_ref())
            .map(|s| s.counts())
    }

    /// Sends `messages` more server messages to every connected client (their netchans, in
    /// [`Handshake::Engine`]), on top of the answers to their own messages; returns the
    /// datagrams sent.
    ///
    /// # Errors
    ///
    /// A send failed.
    pub async fn stream(&self, messages: usize) -> io::Result<usize> {
        let datagrams = engine::stream(&mut lock(&self.state), messages);
        for (to, d) in &datagrams {
            self.socket.send_to(d, *to).await?;
        }
        Ok(datagrams.len())
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

/// Formats an OOB reply: marker + text, no trailing NUL.
fn reply(text: &str) -> Option<Vec<u8>> {
    Some(crate::udp::oob(text.as_bytes()))
}

/// The receive loop: one datagram at a time, the replies computed under the
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
        let replies = handle(&mut lock(&state), from, packet);
        for reply in replies {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}
