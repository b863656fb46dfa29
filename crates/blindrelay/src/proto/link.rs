//! The framed link (`docs/blindrelay-protocol.md`, "Framed links"): what two nodes speak over a
//! mutual TLS link whose client offered [`ALPN`] and whose server chose it, in place of one
//! HTTP/1.1 request per frame. Many frames travel on one TLS session, each with an id, and
//! their answers come back in any order, each naming its frame's id: a hop writes whatever is
//! ready in one go, so a busy link carries several frames per system call and wake-up.
//!
//! - A request: `len` (u32 BE, the frame's length), `id` (u32 BE, the client's), then the frame:
//!   the same bytes as the body of `POST /v2/relay` (`crate::proto::frame`).
//! - An answer: `len` (u32 BE, the body's length), `id` (u32 BE, the request's), `status` (u16
//!   BE, what the HTTP answer's status would be), then the body: the same bytes as the HTTP
//!   answer's body, padded to [`crate::proto::answer::ANSWER_LEN`] as there.
//!
//! Nothing else is ever sent. A frame over [`MAX_FRAME`], an answer over [`MAX_ANSWER`] or an
//! answer's status out of 100..=599 is a broken link: it is closed.

use super::frame::MAX_FRAME;

/// The TLS application protocol (ALPN) of the framed link.
pub const ALPN: &[u8] = b"blindrelay/1";
/// Bytes before a request's frame: its length and id.
pub const REQUEST_HEAD: usize = 8;
/// Bytes before an answer's body: its length, the request's id and the status.
pub const ANSWER_HEAD: usize = 10;
/// The longest answer body a node reads from a next hop, on a framed link or over HTTP.
pub const MAX_ANSWER: usize = 16 * 1024;

/// A request's head, read: the request's id and its frame's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    /// The client's id for it, named again by its answer.
    pub id: u32,
    /// The frame's length: over [`MAX_FRAME`] is refused (`envelope_too_large`).
    pub len: usize,
}

impl RequestHead {
    /// The head of a request of `frame_len` bytes under `id`.
    pub fn encode(id: u32, frame_len: usize) -> [u8; REQUEST_HEAD] {
        let len = u32::try_from(frame_len).unwrap_or(u32::MAX);
        let mut head = [0u8; REQUEST_HEAD];
        head[..4].copy_from_slice(&len.to_be_bytes());
        head[4..].copy_from_slice(&id.to_be_bytes());
        head
    }

    /// The head `bytes` says.
    pub fn decode(bytes: &[u8; REQUEST_HEAD]) -> RequestHead {
        let [a, b, c, d, e, f, g, h] = *bytes;
        RequestHead {
            len: u32::from_be_bytes([a, b, c, d]) as usize,
            id: u32::from_be_bytes([e, f, g, h]),
        }
    }

    /// Whether the frame is one a node would read at all (at most [`MAX_FRAME`]).
    pub fn fits(&self) -> bool {
        self.len <= MAX_FRAME
    }
}

/// An answer's head, read: the request's id, the status and the body's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerHead {
    /// The id of the request it answers.
    pub id: u32,
    /// The status the HTTP answer would have had.
    pub status: u16,
    /// The body's length.
    pub len: usize,
}

/// A malformed answer head: the link is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// A body over [`MAX_ANSWER`].
    #[error("answer too long")]
    TooLong,
    /// A status out of 100..=599.
    #[error("answer status out of range")]
    BadStatus,
}

impl AnswerHead {
    /// The head of an answer to `id` with `status` and a body of `body_len` bytes.
    pub fn encode(id: u32, status: u16, body_len: usize) -> [u8; ANSWER_HEAD] {
        let len = u32::try_from(body_len).unwrap_or(u32::MAX);
        let mut head = [0u8; ANSWER_HEAD];
        head[..4].copy_from_slice(&len.to_be_bytes());
        head[4..8].copy_from_slice(&id.to_be_bytes());
        head[8..].copy_from_slice(&status.to_be_bytes());
        head
    }

    /// The head `bytes` says.
    ///
    /// # Errors
    /// [`AnswerError`]: the link is broken.
    pub fn decode(bytes: &[u8; ANSWER_HEAD]) -> Result<AnswerHead, AnswerError> {
        let [a, b, c, d, e, f, g, h, i, j] = *bytes;
        let head = AnswerHead {
            len: u32::from_be_bytes([a, b, c, d]) as usize,
            id: u32::from_be_bytes([e, f, g, h]),
            status: u16::from_be_bytes([i, j]),
        };
        if head.len > MAX_ANSWER {
            return Err(AnswerError::TooLong);
        }
        if !(100..=599).contains(&head.status) {
            return Err(AnswerError::BadStatus);
        }
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn heads_are_as_the_protocol_doc_says() {
        assert_eq!(
            RequestHead::encode(0x0102_0304, 2610),
            [0, 0, 0x0a, 0x32, 1, 2, 3, 4]
        );
        assert_eq!(
            AnswerHead::encode(7, 429, 512),
            [0, 0, 2, 0, 0, 0, 0, 7, 0x01, 0xad]
        );
        let too_long = RequestHead::decode(&RequestHead::encode(1, MAX_FRAME + 1));
        assert!(!too_long.fits());
        assert!(RequestHead::decode(&RequestHead::encode(1, MAX_FRAME)).fits());
        assert_eq!(
            AnswerHead::decode(&AnswerHead::encode(1, 200, MAX_ANSWER + 1)),
            Err(AnswerError::TooLong)
        );
        for status in [0, 99, 600, u16::MAX] {
            assert_eq!(
                AnswerHead::decode(&AnswerHead::encode(1, status, 0)),
                Err(AnswerError::BadStatus)
            );
        }
    }

    proptest! {
        #[test]
        fn heads_round_trip(id in any::<u32>(), len in 0usize..=MAX_FRAME, status in 100u16..=599) {
            prop_assert_eq!(
                RequestHead::decode(&RequestHead::encode(id, len)),
                RequestHead { id, len }
            );
            let body = len % (MAX_ANSWER + 1);
            prop_assert_eq!(
                AnswerHead::decode(&AnswerHead::encode(id, status, body)),
                Ok(AnswerHead { id, status, len: body })
            );
        }

        #[test]
        fn any_answer_head_decodes_or_is_refused(bytes in any::<[u8; ANSWER_HEAD]>()) {
            if let Ok(head) = AnswerHead::decode(&bytes) {
                prop_assert!(head.len <= MAX_ANSWER);
                prop_assert_eq!(AnswerHead::encode(head.id, head.status, head.len), bytes);
            }
        }
    }
}
