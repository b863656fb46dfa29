//! The client's in-game netchan after a join: patterned messages out, the server's in, counted
//! ([`crate::netchan::session`]).
//!
//! Only datagrams from the server's address feed the netchan (a real client drops "sequenced
//! packets without connection" from anywhere else); connectionless ones are skipped.

use std::io;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use super::Player;
use crate::netchan::session::{Counts, Outcome, Session};

impl Player {
    /// The netchan session set up by the last successful join.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// What the session counted so far (all zero before a join).
    pub fn netchan_counts(&self) -> Counts {
        self.session
            .as_ref()
            .map(Session::counts)
            .unwrap_or_default()
    }

    fn joined(&mut self) -> io::Result<&mut Session> {
        self.session
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "join first"))
    }

    /// Sends the session's next message (fragmented when 1 300 bytes or more); returns how
    /// many datagrams it took.
    ///
    /// # Errors
    /// Not joined yet, or a send failed.
    pub async fn send_message(&mut self) -> io::Result<usize> {
        let datagrams = self.joined()?.next_datagrams();
        for d in &datagrams {
            self.sock.send_to(d, self.server).await?;
        }
        Ok(datagrams.len())
    }

    /// Sends `datagram` as it is to the server (to send crafted in-game packets).
    ///
    /// # Errors
    /// The send failed.
    pub async fn send_datagram(&mut self, datagram: &[u8]) -> io::Result<()> {
        self.sock.send_to(datagram, self.server).await.map(|_| ())
    }

    /// Receives one datagram before `deadline` and feeds it to the session; `None` at the
    /// deadline (or without a session).
    async fn receive_one(&mut self, deadline: Instant) -> Option<Outcome> {
        loop {
            let r = timeout_at(deadline, self.sock.recv_from(&mut self.buf)).await;
            let Ok(Ok((n, from))) = r else {
                // A receive error (ICMP) is skipped; the deadline ends the wait.
                if r.is_err() {
                    return None;
                }
                continue;
            };
            let data = &self.buf[..n];
            if from != self.server || data.starts_with(&[0xFF; 4]) {
                continue;
            }
            return Some(self.session.as_mut()?.receive(data));
        }
    }

    /// Feeds every in-game datagram that arrives within `wait` to the session; returns the
    /// counts then.
    pub async fn recv_messages(&mut self, wait: Duration) -> Counts {
        let deadline = Instant::now() + wait;
        while self.receive_one(deadline).await.is_some() {}
        self.netchan_counts()
    }

    /// Receives until the session has accepted `target` messages in all (decoded or not) or
    /// `within` has passed; whether it got there.
    pub async fn wait_messages(&mut self, target: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.netchan_counts().messages_received < target {
            if self.receive_one(deadline).await.is_none() {
                return false;
            }
        }
        true
    }

    /// Plays `rounds` rounds: one message sent, then up to `per_round` for one more server
    /// message (a server that answers each message, like [`crate::FakeEtServer`] in its engine
    /// handshake, keeps the two in step). Returns the counts at the end.
    ///
    /// # Errors
    /// Not joined yet, or a send failed.
    pub async fn play(&mut self, rounds: usize, per_round: Duration) -> io::Result<Counts> {
        for _ in 0..rounds {
            let target = self.netchan_counts().messages_received + 1;
            self.send_message().await?;
            self.wait_messages(target, per_round).await;
        }
        Ok(self.netchan_counts())
    }
}
