//! The ET handshake: the benchmark's clients join as real clients do, and the sink and the echo
//! server answer it as an ET server does.
//!
//! A client sends `getchallenge`, gets `challengeResponse <n>`, sends the plaintext
//! `CONNECT "\challenge\<n>\qport\<q>\protocol\84\name\b<q>"` (the spelling every engine reads
//! as plain text) and gets `connectResponse`; its in-game packets then carry qport `q` in bytes
//! 4..6. Through etrelay's default the `challengeResponse` is the relay's own (a stateless
//! challenge C), and the relay asks the game server for its own challenge S from the session's
//! socket, sends the `connect` on rewritten with S, and from the `connectResponse` on translates
//! every in-game packet (ET's XOR scheme: client → server from byte 18 on, server → client from
//! byte 8 on, each byte XORed with `(C ^ S) & 0xff`). Through nginx, directly, or through an
//! etrelay that relays the challenge (`--server-challenges`, or a build from before the relay
//! gave its own), the server's answers go to the client as they are: the server side here
//! answers whoever asks, so the same handshake works on every path.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// The connectionless marker.
const OOB: [u8; 4] = [0xFF; 4];
/// A client sends its `getchallenge` or `connect` again after this long without an answer (a
/// real client: 3 s; etrelay takes a session's `connect` at once 4 times, then once a second).
const RETRY: Duration = Duration::from_secs(1);
/// How long [`join`] waits in all.
const WITHIN: Duration = Duration::from_secs(6);

/// A game server's answer to the connectionless packet `d`, from whoever sent it: to a
/// `getchallenge`, `challengeResponse <n>` (a fresh positive number each time); to a `connect`
/// in any spelling (etrelay's own, Huffman-compressed after `connect `, or a client's plaintext
/// `CONNECT "…"`), `connectResponse`. `None` for anything else.
pub(crate) fn server_answer(d: &[u8]) -> Option<Vec<u8>> {
    let body = d.strip_prefix(&OOB)?;
    let word = |w: &[u8]| body.len() >= w.len() && body[..w.len()].eq_ignore_ascii_case(w);
    let mut out = OOB.to_vec();
    if word(b"getchallenge") {
        let n = rand::random::<u32>() & 0x7fff_ffff;
        out.extend_from_slice(format!("challengeResponse {}", n.max(1)).as_bytes());
    } else if word(b"connect ") {
        out.extend_from_slice(b"connectResponse");
    } else {
        return None;
    }
    Some(out)
}

/// Where a client is in its handshake.
#[derive(Clone, Copy, PartialEq)]
enum Stage {
    /// Waiting for `challengeResponse`.
    Ask,
    /// Waiting for `connectResponse` to the `connect` holding this challenge.
    Connect(i64),
    Done,
}

/// The plaintext `CONNECT` of the client announcing `qport`, with `challenge`.
fn connect_packet(challenge: i64, qport: u16) -> Vec<u8> {
    let mut p = OOB.to_vec();
    p.extend_from_slice(
        format!(
            "CONNECT \"\\challenge\\{challenge}\\qport\\{qport}\\protocol\\84\\name\\b{qport}\""
        )
        .as_bytes(),
    );
    p
}

/// What a client makes of a connectionless answer `d` at `stage`: its next stage.
fn on_answer(stage: Stage, d: &[u8]) -> Stage {
    let Some(body) = d.strip_prefix(&OOB) else {
        return stage;
    };
    let text = String::from_utf8_lossy(body);
    let mut words = text.split_whitespace();
    match (stage, words.next()) {
        (Stage::Ask, Some("challengeResponse")) => words
            .next()
            .and_then(|n| n.parse::<i64>().ok())
            .map_or(stage, Stage::Connect),
        (Stage::Connect(_), Some("connectResponse")) => Stage::Done,
        _ => stage,
    }
}

/// Joins every client of `clients` (a socket and the qport it announces; its in-game packets
/// must carry the same) to the game server behind `target`, all at once, each sending again
/// every [`RETRY`] until it is in or [`WITHIN`] has passed. Each socket is left connected to
/// `target` (as the runs use it) and blocking. Returns how many got their `connectResponse`.
pub(crate) fn join(clients: &[(&UdpSocket, u16)], target: SocketAddr) -> usize {
    let mut buf = [0u8; 2048];
    for (s, _) in clients {
        s.connect(target).expect("connect a client socket");
        s.set_nonblocking(true).expect("non-blocking");
        // What earlier runs left in its buffer.
        while s.recv(&mut buf).is_ok() {}
    }
    let start = Instant::now();
    let mut stages = vec![Stage::Ask; clients.len()];
    let mut next = vec![start; clients.len()];
    let mut left = clients.len();
    while left > 0 && start.elapsed() < WITHIN {
        let now = Instant::now();
        for (k, (s, qport)) in clients.iter().enumerate() {
            let packet = match stages[k] {
                Stage::Done => continue,
                _ if next[k] > now => continue,
                Stage::Ask => [&OOB[..], b"getchallenge"].concat(),
                Stage::Connect(c) => connect_packet(c, *qport),
            };
            let _ = s.send(&packet);
            next[k] = now + RETRY;
        }
        std::thread::sleep(Duration::from_millis(2));
        for (k, (s, _)) in clients.iter().enumerate() {
            while stages[k] != Stage::Done
                && let Ok(n) = s.recv(&mut buf)
            {
                let was = stages[k];
                stages[k] = on_answer(was, &buf[..n]);
                if stages[k] == Stage::Done {
                    left -= 1;
                } else if stages[k] != was {
                    next[k] = Instant::now();
                }
            }
        }
    }
    for (s, _) in clients {
        s.set_nonblocking(false).expect("blocking");
    }
    clients.len() - left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_side_answers_each_step() {
        let a = server_answer(b"\xff\xff\xff\xffgetchallenge").unwrap();
        let Stage::Connect(n) = on_answer(Stage::Ask, &a) else {
            panic!("no challenge in {a:?}");
        };
        assert!(n > 0);
        let c = connect_packet(n, 7);
        assert!(String::from_utf8_lossy(&c).ends_with("\\qport\\7\\protocol\\84\\name\\b7\""));
        let r = server_answer(&c).unwrap();
        assert!(on_answer(Stage::Connect(n), &r) == Stage::Done);
        assert!(server_answer(b"\xff\xff\xff\xffconnect \x01\x02").is_some());
        assert!(server_answer(b"\xff\xff\xff\xffgetstatus").is_none());
        assert!(server_answer(b"getchallenge").is_none());
    }
}
