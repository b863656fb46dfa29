//! What the fake answers each datagram: queries, `getchallenge`, `connect`, in-game packets
//! (rcon: [`super::rcon`]).

use std::net::SocketAddr;

use super::rcon::rcon;
use super::{MAX_CHALLENGE, MAX_CHALLENGES, Received, State, reply};
use crate::q3model::{self, Dispatch, Engine};

/// `SV_VerifyChallenge` of ET 2.60b: may this challenge be answered?
fn challenge_ok(challenge: &[u8]) -> bool {
    challenge.len() <= MAX_CHALLENGE
        && challenge
            .iter()
            .all(|&c| (32..=126).contains(&c) && !b"\\/%;\"".contains(&c))
}

pub(super) fn handle(st: &mut State, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
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
