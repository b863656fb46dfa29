//! What the fake answers each datagram: queries, `getchallenge`, `connect`, in-game packets
//! (rcon: [`super::rcon`]; the engine's join and netchan: [`super::engine`]).

use std::net::SocketAddr;

use super::engine::{self, Client, MAX_CLIENTS};
use super::rcon::rcon;
use super::{Handshake, MAX_CHALLENGE, MAX_CHALLENGES, Received, State, reply};
use crate::q3model::{self, Dispatch, Engine};

/// `SV_VerifyChallenge` of ET 2.60b: may this challenge be answered?
fn challenge_ok(challenge: &[u8]) -> bool {
    challenge.len() <= MAX_CHALLENGE
        && challenge
            .iter()
            .all(|&c| (32..=126).contains(&c) && !b"\\/%;\"".contains(&c))
}

/// Records `packet` and returns the datagrams to send back to `from`.
pub(super) fn handle(st: &mut State, from: SocketAddr, packet: &[u8]) -> Vec<Vec<u8>> {
    let dispatch = q3model::dispatch(Engine::Et260, packet);
    tracing::debug!(%from, ?dispatch, len = packet.len(), "fake ET server received");
    st.received.push(Received {
        from,
        packet: packet.to_vec(),
        dispatch,
    });
    if !st.answering {
        return Vec::new();
    }
    let engine = st.handshake == Handshake::Engine;
    match dispatch {
        Dispatch::Connect | Dispatch::HuffmanConnect if engine => {
            engine::connect(st, from, packet).into_iter().collect()
        }
        Dispatch::NotConnectionless => in_game(st, from, packet),
        _ => query(st, from, packet, dispatch).into_iter().collect(),
    }
}

/// The connectionless packets (and the scripted join).
fn query(st: &mut State, from: SocketAddr, packet: &[u8], dispatch: Dispatch) -> Option<Vec<u8>> {
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
        Dispatch::HuffmanConnect => huffman_connect(st, from, packet),
        Dispatch::Rcon => rcon(st, packet, &args),
        _ => None,
    }
}

/// A Huffman-compressed `connect`: read as the server reads it and checked as a plaintext one
/// when it decompresses to a userinfo with a challenge; one that does not (a test's junk) still
/// gets `connectResponse` unchecked, as the scripted join always did.
fn huffman_connect(st: &mut State, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
    let text = crate::huffman::server_view(packet, 32_768);
    let line = q3model::read_string_line(Engine::Et260, text.get(4..).unwrap_or_default());
    let args = q3model::tokenize(Engine::Et260, &line);
    let userinfo = args
        .get(1)
        .filter(|u| crate::info::get(&crate::info::parse(u), "challenge").is_some());
    match userinfo {
        Some(u) => connect(st, from, &u.clone()),
        None => reply("connectResponse"),
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
    engine::retire(st, |c| c.addr == from);
    if st.clients.len() < MAX_CLIENTS {
        st.clients.push(Client {
            addr: from,
            qport,
            session: None,
        });
    }
    reply("connectResponse")
}

/// An in-game packet: routed by IP and qport, the port fixed up, then answered: one
/// `<sequence>snap` packet (scripted), or the client's netchan (engine).
fn in_game(st: &mut State, from: SocketAddr, packet: &[u8]) -> Vec<Vec<u8>> {
    let (Some(&low), Some(&high)) = (packet.get(4), packet.get(5)) else {
        return Vec::new();
    };
    let qport = u16::from_le_bytes([low, high]);
    let Some(client) = st
        .clients
        .iter_mut()
        .find(|c| c.addr.ip() == from.ip() && c.qport == qport)
    else {
        return Vec::new();
    };
    if client.addr != from {
        tracing::debug!("fake ET server: fixing up a translated port");
        client.addr = from;
        st.fixups += 1;
    }
    match client.session.as_mut() {
        Some(session) => engine::in_game(session, packet),
        None => {
            let mut out = packet[..4].to_vec();
            out.extend_from_slice(b"snap");
            vec![out]
        }
    }
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
