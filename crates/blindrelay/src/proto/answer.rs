//! A hop's answer to `POST /v1/relay` (JSON), as in `docs/blindrelay-protocol.md`:
//!
//! - accepted, 200: `{"outcome": "delivered" | "forwarded", "receipt": "<hex of the sealed receipt>"}`;
//! - refused: `{"error": "<reason>"}` with the reason's status.
//!
//! The error shape `{"error", "message"}` is also every error body of the operator API; relay
//! refusals carry no message.
//!
//! On the link every answer's body is [`ANSWER_LEN`] bytes: the JSON, then spaces ([`pad`]; JSON
//! allows whitespace after the value), so an accepted answer, a replayed one and every refusal
//! look alike to a link observer.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The length of every relay answer's body on the link: more than the longest answer (an
/// accepted one: 420 bytes with the hex of a sealed receipt; a refusal: at most 35).
pub const ANSWER_LEN: usize = 512;

/// `body` followed by spaces up to [`ANSWER_LEN`] bytes (a body already that long or longer,
/// which no answer of this protocol is, is returned as it is). Still the same JSON.
pub fn pad(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ANSWER_LEN.max(body.len()));
    out.extend_from_slice(body);
    out.resize(ANSWER_LEN.max(body.len()), b' ');
    out
}

/// What an accepting hop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// This hop was the terminal: stored (or, for a probe, answered).
    Delivered,
    /// This hop forwarded and the next hop accepted.
    Forwarded,
}

/// A 200 answer: the outcome and the terminal's sealed receipt, passed back hop by hop.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// What the answering hop did.
    pub outcome: Outcome,
    /// Hex of the sealed receipt, opaque to every hop but the sender.
    pub receipt: String,
}

impl Accepted {
    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("invariant: an enum and a string serialize")
    }
}

/// Prints the outcome and the receipt's length only.
impl fmt::Debug for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accepted")
            .field("outcome", &self.outcome)
            .field("receipt_len", &self.receipt.len())
            .finish()
    }
}

/// An error body: a stable code, and for the operator API a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody<'a> {
    /// The stable code (a relay refusal's reason).
    pub error: Cow<'a, str>,
    /// What went wrong, in words (never on relay refusals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Cow<'a, str>>,
    /// A relay refusal of a hop that could not pass the packet on: the hex of its failure
    /// report for the sender (`crate::proto::sphinx::report`), opaque to every hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Cow<'a, str>>,
}

impl<'a> ErrorBody<'a> {
    /// A body with a code only: a relay refusal.
    pub fn code(error: &'a str) -> Self {
        ErrorBody {
            error: Cow::Borrowed(error),
            message: None,
            report: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("invariant: strings serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_answer_is_the_same_json_at_one_length() {
        let sealed = "ab".repeat(24 + crate::proto::receipt::RECEIPT_LEN + 16);
        for outcome in [Outcome::Delivered, Outcome::Forwarded] {
            let a = Accepted {
                outcome,
                receipt: sealed.clone(),
            };
            let padded = pad(&a.to_json());
            assert_eq!(padded.len(), ANSWER_LEN);
            assert_eq!(serde_json::from_slice::<Accepted>(&padded).unwrap(), a);
        }
        for r in crate::reason::Reason::ALL {
            let padded = pad(&ErrorBody::code(r.as_str()).to_json());
            assert_eq!(padded.len(), ANSWER_LEN);
            let e: ErrorBody<'_> = serde_json::from_slice(&padded).unwrap();
            assert_eq!(e.error, r.as_str());
        }
        assert_eq!(pad(&[b'x'; 600]).len(), 600);
    }

    #[test]
    fn the_documented_shapes() {
        let a = Accepted {
            outcome: Outcome::Forwarded,
            receipt: "ab".into(),
        };
        assert_eq!(a.to_json(), br#"{"outcome":"forwarded","receipt":"ab"}"#);
        assert_eq!(serde_json::from_slice::<Accepted>(&a.to_json()).unwrap(), a);
        assert!(
            serde_json::from_slice::<Accepted>(br#"{"outcome":"other","receipt":""}"#).is_err()
        );
        assert_eq!(
            ErrorBody::code("route_loop").to_json(),
            br#"{"error":"route_loop"}"#
        );
        let e = ErrorBody {
            error: "not_found".into(),
            message: Some("no such item".into()),
            report: None,
        };
        assert_eq!(
            e.to_json(),
            br#"{"error":"not_found","message":"no such item"}"#
        );
        assert_eq!(
            serde_json::from_slice::<ErrorBody>(&e.to_json()).unwrap(),
            e
        );
    }
}
