//! The way in, one for both transports (`POST /v2/relay` and a framed link's frame), in the order
//! it runs ([`Pipeline::take_in`]):
//!
//! 1. the source's cheap budget ([`super::gate`]), before a byte of the body is read;
//! 2. the declared length (an HTTP `Content-Length`, a link frame's head): over the largest frame
//!    is `envelope_too_large`, blamed on the link's client;
//! 3. the body, read within its deadline ([`body_deadline`]): a slow one is `request_timeout`;
//! 4. the frame's framing and previous hop ([`super::authenticate`]);
//! 5. admission by the request gate: a token of the rate and an in-flight slot
//!    ([`Pipeline::admit`]).
//!
//! A refusal before the body is read closes the connection (or the link) once it is answered: no
//! further request is read from it. A refusal of a body read is an answer like any other. Every
//! refusal is counted here, once.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use tracing::{Instrument, debug_span};

use super::{Admitted, Pipeline, authenticate};
use crate::forward;
use crate::proto::NodeId;
use crate::proto::frame::MAX_FRAME;
use crate::reason::Reason;
use crate::sources::Source;

/// A relay body may take this long…
pub const BODY_BASE: Duration = Duration::from_secs(2);
/// …plus its length at this rate (bytes per second).
pub const BODY_MIN_RATE: u64 = 64 * 1024;

/// How long a body of `len` bytes may take to arrive.
pub fn body_deadline(len: u64) -> Duration {
    BODY_BASE + Duration::from_millis(len.saturating_mul(1000) / BODY_MIN_RATE)
}

/// A request refused on its way in (counted).
#[derive(Debug)]
pub enum Refused {
    /// Before its body was read (the cheap budget, the declared length, the body's deadline):
    /// the connection or link is closed once this is answered.
    Unread(Reason),
    /// Its body read and judged (framing, admission): an answer like any other.
    Read(Reason),
    /// The transport broke while the body was read: nothing to answer.
    Broken(io::Error),
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Longer than it may be (HTTP: over the largest frame, or cut short).
    TooLarge,
    /// The transport broke.
    Broken(io::Error),
}

impl Pipeline {
    /// The source of a request from `ip`, now.
    pub fn classify(&self, ip: IpAddr) -> Source {
        self.sources.classify(ip, self.ctx.clock.instant())
    }

    /// Takes a request in from `ip` on the link of `link` (none: its client presented no
    /// identity): the cheap budget, the `declared` length (none: unknown, at most the largest
    /// frame), `body` read within its deadline, the framing and admission. Never waits but for
    /// the body.
    ///
    /// # Errors
    /// See [`Refused`].
    pub async fn take_in<B: AsRef<[u8]>>(
        &self,
        ip: IpAddr,
        link: Option<NodeId>,
        declared: Option<u64>,
        body: impl Future<Output = Result<B, BodyError>>,
    ) -> Result<Admitted, Refused> {
        let source = self.classify(ip);
        let span = debug_span!("relay_in", known = source.key().is_known());
        self.take_in_from(source, link, declared, body)
            .instrument(span)
            .await
    }

    async fn take_in_from<B: AsRef<[u8]>>(
        &self,
        source: Source,
        link: Option<NodeId>,
        declared: Option<u64>,
        body: impl Future<Output = Result<B, BodyError>>,
    ) -> Result<Admitted, Refused> {
        let source = &source;
        self.cheap(source).map_err(Refused::Unread)?;
        if declared.is_some_and(|n| n > MAX_FRAME as u64) {
            let r = self.refuse_from(source, link, Reason::EnvelopeTooLarge);
            return Err(Refused::Unread(r));
        }
        let deadline = body_deadline(declared.unwrap_or(MAX_FRAME as u64));
        let body = match tokio::time::timeout(deadline, body).await {
            Ok(Ok(body)) => body,
            Ok(Err(BodyError::TooLarge)) => {
                let r = self.refuse_from(source, link, Reason::EnvelopeTooLarge);
                return Err(Refused::Unread(r));
            }
            Ok(Err(BodyError::Broken(e))) => return Err(Refused::Broken(e)),
            Err(_) => {
                let r = self.refuse(source, link, Reason::RequestTimeout);
                return Err(Refused::Unread(r));
            }
        };
        self.admit(source, link, body.as_ref())
            .map_err(Refused::Read)
    }

    /// The source's cheap budget, before its body is read. Never waits.
    ///
    /// # Errors
    /// `source_limited` (already counted).
    pub fn cheap(&self, source: &Source) -> Result<(), Reason> {
        self.gate
            .cheap(source.key(), self.ctx.clock.instant())
            .map_err(|r| self.refuse(source, None, r))
    }

    /// The framing of the `body` read from the link's client `link`, then admission by the
    /// request gate. Never waits.
    ///
    /// # Errors
    /// `invalid_previous_hop`, `v1_not_accepted`, `malformed_envelope`, `source_limited` or
    /// `backpressure` (already counted; a malformed frame blamed on `link`).
    pub fn admit(
        &self,
        source: &Source,
        link: Option<NodeId>,
        body: &[u8],
    ) -> Result<Admitted, Reason> {
        let frame =
            authenticate::frame(body, link).map_err(|r| self.refuse_from(source, link, r))?;
        let slot = self
            .gate
            .admit(source.key(), self.ctx.clock.instant())
            .map_err(|r| self.refuse(source, link, r))?;
        let now = self.ctx.clock.now();
        Ok(Admitted {
            _slot: slot,
            answer_by: now + forward::HOP_DEADLINE,
            deadline: now + forward::LATE_DEADLINE,
            frame,
            source: *source,
        })
    }

    /// Counts a refusal `r` of a request from `source` on `link`'s link and returns it.
    pub fn refuse(&self, source: &Source, link: Option<NodeId>, r: Reason) -> Reason {
        self.settle(source, link, &Err(r));
        r
    }

    /// [`Pipeline::refuse`] of what the link's client `link` sent (a body too large, a frame
    /// that is not one), blamed on it ([`Reason::blame`]).
    pub fn refuse_from(&self, source: &Source, link: Option<NodeId>, r: Reason) -> Reason {
        self.refused(link, r, self.ctx.clock.instant());
        self.refuse(source, link, r)
    }
}
