//! The registration exchange: a heartbeat, the challenge (and, etmaster-style, its
//! `challengeResponse`), the `infoResponse` and its checks; which datagram goes where.

use std::net::SocketAddr;

use rand::Rng;
use tokio::time::Instant;

use super::list::getservers;
use super::{CHALLENGE_WINDOW, Listed, MasterStyle, Pending, Stage, State};
use crate::info;
use crate::udp::oob;

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
pub(super) fn handle(
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
    st.challenges += 1;
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
    st.answered += 1;
    st.challenges += 1;
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
            st.answered += 1;
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
}
