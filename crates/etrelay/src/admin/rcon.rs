//! rcon to the game server, straight over UDP: `FF FF FF FF rcon <password> <command>`, answered
//! by `FF FF FF FF print\n<text>`.
//!
//! ET 2.60b runs at most one rcon per 500 ms (from anyone) and silently drops the others, so a
//! command is sent again when no answer came, and two commands of this client are kept 600 ms
//! apart. ioquake3 (and ET: Legacy with `sv_protect 1`) allows a burst of 10 per source IP,
//! then one a second: the few commands of a registration stay well within it.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::error::AdminError;
use crate::secret::Secret;

const OOB: &[u8] = b"\xff\xff\xff\xff";
const PRINT: &[u8] = b"print\n";

/// How to pace and retry commands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// Sends of one command before giving up.
    pub(crate) attempts: u32,
    /// Wait for an answer after each send.
    pub(crate) wait: Duration,
    /// Least time between two sends (ET 2.60b drops an rcon within 500 ms of the last one).
    pub(crate) gap: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            attempts: 3,
            wait: Duration::from_secs(1),
            gap: Duration::from_millis(600),
        }
    }
}

/// An rcon client of one game server, from one ephemeral UDP socket.
#[derive(Debug)]
pub(crate) struct Rcon {
    socket: UdpSocket,
    addr: SocketAddr,
    password: Secret,
    timing: Timing,
    last_sent: Option<Instant>,
}

impl Rcon {
    /// Binds an ephemeral socket of `addr`'s family, connected to `addr` (so only its answers
    /// come in).
    pub(crate) async fn connect(
        addr: SocketAddr,
        password: String,
        timing: Timing,
    ) -> Result<Self, AdminError> {
        let io = |source| AdminError::RconIo { addr, source };
        let local: SocketAddr = if addr.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(local).await.map_err(io)?;
        socket.connect(addr).await.map_err(io)?;
        Ok(Self {
            socket,
            addr,
            password: Secret::new(password),
            timing,
            last_sent: None,
        })
    }

    /// Runs `command` on the game server and returns the text of its first `print` answer.
    pub(crate) async fn run(&mut self, command: &str) -> Result<String, AdminError> {
        let packet = packet(self.password.expose(), command);
        self.drain();
        let mut refused = false;
        let mut buf = vec![0u8; 65_536];
        for _ in 0..self.timing.attempts {
            if let Some(last) = self.last_sent {
                tokio::time::sleep_until(last + self.timing.gap).await;
            }
            self.last_sent = Some(Instant::now());
            let deadline = Instant::now() + self.timing.wait;
            match self.socket.send(&packet).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    // An ICMP port unreachable from an earlier send.
                    refused = true;
                    tokio::time::sleep_until(deadline).await;
                    continue;
                }
                Err(source) => {
                    return Err(AdminError::RconIo {
                        addr: self.addr,
                        source,
                    });
                }
            }
            loop {
                let received = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf)).await;
                match received {
                    Err(_elapsed) => break,
                    Ok(Ok(n)) => {
                        if let Some(text) = print_text(&buf[..n]) {
                            return self.check(text);
                        }
                        // Not an answer to rcon: keep waiting.
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        refused = true;
                        tokio::time::sleep_until(deadline).await;
                        break;
                    }
                    Ok(Err(source)) => {
                        return Err(AdminError::RconIo {
                            addr: self.addr,
                            source,
                        });
                    }
                }
            }
        }
        Err(AdminError::RconNoReply {
            addr: self.addr,
            attempts: self.timing.attempts,
            refused,
        })
    }

    fn check(&self, text: String) -> Result<String, AdminError> {
        if text.starts_with("Bad rconpassword") {
            return Err(AdminError::RconRefused { addr: self.addr });
        }
        if text.starts_with("No rconpassword set") {
            return Err(AdminError::RconNoPassword { addr: self.addr });
        }
        Ok(text)
    }

    /// Drops answers still queued (a late one to an earlier command).
    fn drain(&self) {
        let mut buf = [0u8; 2048];
        while self.socket.try_recv(&mut buf).is_ok() {}
    }
}

/// The datagram of one rcon command.
pub(crate) fn packet(password: &str, command: &str) -> Vec<u8> {
    let mut packet = Vec::with_capacity(OOB.len() + 6 + password.len() + command.len());
    packet.extend_from_slice(OOB);
    packet.extend_from_slice(b"rcon ");
    packet.extend_from_slice(password.as_bytes());
    packet.push(b' ');
    packet.extend_from_slice(command.as_bytes());
    packet
}

/// The text of a `print` datagram, or `None` for anything else.
fn print_text(datagram: &[u8]) -> Option<String> {
    let text = datagram.strip_prefix(OOB)?.strip_prefix(PRINT)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn fast() -> Timing {
        Timing {
            attempts: 3,
            wait: Duration::from_millis(300),
            gap: Duration::from_millis(0),
        }
    }

    /// A game server stand-in on 127.0.0.1: answers each datagram with `answer(index)` (or
    /// not, for `None`) and records what it got.
    async fn responder(
        answer: impl Fn(usize) -> Option<&'static [u8]> + Send + 'static,
    ) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&got);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            let mut index = 0;
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                seen.lock().unwrap().push(buf[..n].to_vec());
                if let Some(reply) = answer(index) {
                    let _ = socket.send_to(reply, from).await;
                }
                index += 1;
            }
        });
        (addr, got)
    }

    #[tokio::test]
    async fn accepted_with_the_right_password_and_exact_bytes() {
        let (addr, got) = responder(|_| Some(b"\xff\xff\xff\xffprint\n")).await;
        let mut rcon = Rcon::connect(addr, "secret".into(), fast()).await.unwrap();
        let text = rcon
            .run("sets etrelay_proof a8ae6e6ee929abea3afcfc5258c8ccd6")
            .await
            .unwrap();
        assert_eq!(text, "");
        rcon.run("sets etrelay_proof \"\"").await.unwrap();
        let got = got.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                b"\xff\xff\xff\xffrcon secret sets etrelay_proof a8ae6e6ee929abea3afcfc5258c8ccd6"
                    .to_vec(),
                b"\xff\xff\xff\xffrcon secret sets etrelay_proof \"\"".to_vec(),
            ]
        );
    }

    #[tokio::test]
    async fn bad_password_is_an_error() {
        let (addr, got) = responder(|_| Some(b"\xff\xff\xff\xffprint\nBad rconpassword.\n")).await;
        let mut rcon = Rcon::connect(addr, "wrong".into(), fast()).await.unwrap();
        let err = rcon.run("sets etrelay_proof x").await.unwrap_err();
        assert!(matches!(err, AdminError::RconRefused { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("the game server refused the rcon password"),
            "{err}"
        );
        // Not retried: the answer is final.
        assert_eq!(got.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn no_rcon_password_set_is_an_error() {
        let (addr, _) =
            responder(|_| Some(b"\xff\xff\xff\xffprint\nNo rconpassword set on the server.\n"))
                .await;
        let mut rcon = Rcon::connect(addr, "any".into(), fast()).await.unwrap();
        let err = rcon.run("status").await.unwrap_err();
        assert!(matches!(err, AdminError::RconNoPassword { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn silence_then_an_answer_is_retried() {
        // The first send falls in ET 2.60b's 500 ms gap: no answer.
        let (addr, got) = responder(|i| (i > 0).then_some(b"\xff\xff\xff\xffprint\n")).await;
        let mut rcon = Rcon::connect(addr, "secret".into(), fast()).await.unwrap();
        rcon.run("sets etrelay_proof \"\"").await.unwrap();
        let got = got.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], got[1]);
        assert_eq!(
            got[0],
            b"\xff\xff\xff\xffrcon secret sets etrelay_proof \"\""
        );
    }

    #[tokio::test]
    async fn ignores_what_is_not_a_print() {
        let (addr, _) = responder(|i| {
            Some(if i == 0 {
                b"\xff\xff\xff\xffdisconnect"
            } else {
                b"\xff\xff\xff\xffprint\nok\n"
            })
        })
        .await;
        let mut rcon = Rcon::connect(addr, "secret".into(), fast()).await.unwrap();
        assert_eq!(rcon.run("status").await.unwrap(), "ok\n");
    }

    #[tokio::test]
    async fn gives_up_after_the_attempts() {
        let (addr, got) = responder(|_| None).await;
        let mut rcon = Rcon::connect(addr, "secret".into(), fast()).await.unwrap();
        let err = rcon.run("status").await.unwrap_err();
        assert!(
            matches!(err, AdminError::RconNoReply { attempts: 3, .. }),
            "{err:?}"
        );
        assert_eq!(got.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn nothing_listening_is_reported() {
        // Bind then drop a socket: its port is (almost certainly) closed for the test.
        let addr = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        let mut rcon = Rcon::connect(addr, "secret".into(), fast()).await.unwrap();
        let err = rcon.run("status").await.unwrap_err();
        assert!(matches!(err, AdminError::RconNoReply { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn keeps_the_gap_between_commands() {
        let (addr, _) = responder(|_| Some(b"\xff\xff\xff\xffprint\n")).await;
        let timing = Timing {
            gap: Duration::from_millis(200),
            ..fast()
        };
        let mut rcon = Rcon::connect(addr, "secret".into(), timing).await.unwrap();
        let start = Instant::now();
        rcon.run("a").await.unwrap();
        rcon.run("b").await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(200));
    }

    #[test]
    fn print_text_parsing() {
        assert_eq!(
            print_text(b"\xff\xff\xff\xffprint\nhello").as_deref(),
            Some("hello")
        );
        assert_eq!(print_text(b"\xff\xff\xff\xffprint"), None);
        assert_eq!(print_text(b"print\nhello"), None);
    }
}
