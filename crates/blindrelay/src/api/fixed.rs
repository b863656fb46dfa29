//! Every answer to a relay request (accepted, replayed, refused) as one length on the link: the
//! body padded to [`crate::proto::answer::ANSWER_LEN`] bytes, the same headers, and a status line of one width, so a
//! link observer cannot tell the outcome from the TLS record's length.
//!
//! The status line carries the canonical reason phrase padded with spaces, and every answer a
//! `connection` header: `keep-alive`, or `close` after a refusal whose connection is closed (its
//! phrase is longer by the difference). The response head is then the same length for every
//! answer (`date` and `content-length` are fixed-width).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::proto::answer::pad;

/// The reason phrase's width on a kept-alive answer: more than the longest canonical phrase of
/// a relay answer's status (`Insufficient Storage`, 20).
const PHRASE_WIDTH: usize = 24;
const KEEP_ALIVE: &str = "keep-alive";
const CLOSE: &str = "close";

/// The answer `status` with `body` (the JSON the replay registry keeps), padded; `closes` when
/// the connection is closed after it.
pub(super) fn relay_response(status: StatusCode, body: &[u8], closes: bool) -> Response {
    let connection = if closes { CLOSE } else { KEEP_ALIVE };
    let mut resp = (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CONNECTION, HeaderValue::from_static(connection)),
        ],
        pad(body),
    )
        .into_response();
    resp.extensions_mut().insert(phrase(status, closes));
    resp
}

/// The status's canonical phrase, padded so that phrase and `connection` value have one width.
fn phrase(status: StatusCode, closes: bool) -> hyper::ext::ReasonPhrase {
    let width = PHRASE_WIDTH + KEEP_ALIVE.len()
        - if closes {
            CLOSE.len()
        } else {
            KEEP_ALIVE.len()
        };
    let mut text = status
        .canonical_reason()
        .unwrap_or("Answer")
        .as_bytes()
        .to_vec();
    text.resize(width.max(text.len()), b' ');
    hyper::ext::ReasonPhrase::try_from(text)
        .unwrap_or_else(|_| hyper::ext::ReasonPhrase::from_static(b"Answer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::answer::ANSWER_LEN;
    use crate::reason::Reason;

    /// The response head's variable part: status line and `connection` header.
    fn head_len(resp: &Response) -> usize {
        let phrase = resp
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .expect("a phrase");
        let connection = resp.headers()[header::CONNECTION].len();
        phrase.as_bytes().len() + connection
    }

    #[tokio::test]
    async fn every_relay_answer_has_one_head_and_body_length() {
        let mut lens = Vec::new();
        for (status, closes) in Reason::ALL
            .iter()
            .map(|r| (r.status(), false))
            .chain(Reason::ALL.iter().map(|r| (r.status(), true)))
            .chain([(200, false)])
        {
            let status = StatusCode::from_u16(status).unwrap();
            let resp = relay_response(status, br#"{"error":"x"}"#, closes);
            let head = head_len(&resp);
            let body = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
            lens.push((head, body.len()));
        }
        assert!(
            lens.iter().all(|l| *l == (PHRASE_WIDTH + 10, ANSWER_LEN)),
            "{lens:?}"
        );
    }
}
