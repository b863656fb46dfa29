//! Info strings in the servers' answers, and the per-asker `challenge` rewrite.
//!
//! `infoResponse\n\k\v\k\v…` and `statusResponse\n\k\v…\n<player lines>` carry the asker's
//! challenge as the `challenge` key of the info string. The relay caches one answer per kind
//! with that key cut out ([`Template`]) and writes each asker's own challenge back in
//! ([`Template::render`]), or none when the asker sent none, as the server would.

use std::ops::Range;

/// The header of each answer, after the `FF FF FF FF` marker.
pub const INFO_RESPONSE: &[u8] = b"infoResponse\n";
/// See [`INFO_RESPONSE`].
pub const STATUS_RESPONSE: &[u8] = b"statusResponse\n";

/// An answer with its `challenge` pair removed, ready to be rendered for any asker.
#[derive(Debug, Clone, Default)]
pub struct Template {
    /// The whole packet without the challenge pair.
    bytes: Vec<u8>,
    /// Where the info string ends in `bytes`: the asker's pair goes there.
    insert_at: usize,
}

/// The info string of a server answer (whole datagram, marker included) whose header is
/// `header`: the bytes after the header up to the first newline. `None` when the packet is not
/// such an answer.
pub fn info_string<'a>(packet: &'a [u8], header: &[u8]) -> Option<&'a [u8]> {
    let body = packet.strip_prefix(&super::OOB[..])?.strip_prefix(header)?;
    let end = body.iter().position(|&b| b == b'\n').unwrap_or(body.len());
    Some(&body[..end])
}

/// The value of `key` (ASCII case-insensitive, as `Info_ValueForKey`) in `info`, as a range.
pub fn find_key(info: &[u8], key: &[u8]) -> Option<Range<usize>> {
    pairs(info)
        .find(|(k, _)| info[k.clone()].eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// The `(key, value)` ranges of an info string `\k\v\k\v…`.
fn pairs(info: &[u8]) -> impl Iterator<Item = (Range<usize>, Range<usize>)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if info.get(i) == Some(&b'\\') {
            i += 1;
        }
        if i >= info.len() {
            return None;
        }
        let k_end = info[i..]
            .iter()
            .position(|&b| b == b'\\')
            .map_or(info.len(), |p| i + p);
        let v_start = (k_end + 1).min(info.len());
        let v_end = info[v_start..]
            .iter()
            .position(|&b| b == b'\\')
            .map_or(info.len(), |p| v_start + p);
        let pair = (i..k_end, v_start..v_end);
        i = v_end;
        Some(pair)
    })
}

impl Template {
    /// Parses a server answer (whole datagram, marker included) whose header is `header`.
    /// Returns the template and the challenge the server echoed, if any; `None` when the packet
    /// is not such an answer.
    pub fn parse(packet: &[u8], header: &[u8]) -> Option<(Template, Option<Vec<u8>>)> {
        let info = info_string(packet, header)?;
        let start = 4 + header.len();
        let info_len = info.len();
        let body = &packet[start..];
        let mut bytes = Vec::with_capacity(packet.len());
        bytes.extend_from_slice(&packet[..start]);
        let mut echoed = None;
        for (k, v) in pairs(info) {
            if info[k.clone()].eq_ignore_ascii_case(b"challenge") {
                echoed = Some(info[v].to_vec());
                continue;
            }
            bytes.push(b'\\');
            bytes.extend_from_slice(&info[k]);
            bytes.push(b'\\');
            bytes.extend_from_slice(&info[v]);
        }
        let insert_at = bytes.len();
        bytes.extend_from_slice(&body[info_len..]);
        Some((Template { bytes, insert_at }, echoed))
    }

    /// Writes the answer for an asker into `out` (cleared first): with `\challenge\<c>` at the
    /// end of the info string, or without it when `challenge` is `None`. A `%` in the challenge
    /// is written as `.`, as the server reads it.
    pub fn render(&self, challenge: Option<&[u8]>, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.bytes[..self.insert_at]);
        if let Some(c) = challenge {
            out.extend_from_slice(b"\\challenge\\");
            out.extend(c.iter().map(|&b| if b == b'%' { b'.' } else { b }));
        }
        out.extend_from_slice(&self.bytes[self.insert_at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_response_round_trip() {
        let pkt = b"\xff\xff\xff\xffinfoResponse\n\\voip\\opus\\challenge\\xyz123\\clients\\0\\hostname\\t";
        let (t, echoed) = Template::parse(pkt, INFO_RESPONSE).unwrap();
        assert_eq!(echoed.as_deref(), Some(&b"xyz123"[..]));
        let mut out = Vec::new();
        t.render(Some(b"ABC"), &mut out);
        assert_eq!(
            out,
            b"\xff\xff\xff\xffinfoResponse\n\\voip\\opus\\clients\\0\\hostname\\t\\challenge\\ABC"
        );
        t.render(None, &mut out);
        assert_eq!(
            out,
            b"\xff\xff\xff\xffinfoResponse\n\\voip\\opus\\clients\\0\\hostname\\t"
        );
        assert_eq!(
            find_key(&out[17..], b"HOSTNAME").map(|r| &out[17..][r]),
            Some(&b"t"[..])
        );
    }

    #[test]
    fn status_response_keeps_players() {
        let pkt =
            b"\xff\xff\xff\xffstatusResponse\n\\challenge\\abc\\sv_hostname\\x\n0 0 \"Sarge\"\n";
        let (t, echoed) = Template::parse(pkt, STATUS_RESPONSE).unwrap();
        assert_eq!(echoed.as_deref(), Some(&b"abc"[..]));
        let mut out = Vec::new();
        t.render(Some(b"q%q"), &mut out);
        assert_eq!(
            out,
            b"\xff\xff\xff\xffstatusResponse\n\\sv_hostname\\x\\challenge\\q.q\n0 0 \"Sarge\"\n"
        );
    }

    #[test]
    fn not_an_answer() {
        assert!(Template::parse(b"\xff\xff\xff\xffprint\nhi", INFO_RESPONSE).is_none());
        assert!(Template::parse(b"infoResponse\n", INFO_RESPONSE).is_none());
        let (t, e) = Template::parse(b"\xff\xff\xff\xffinfoResponse\n", INFO_RESPONSE).unwrap();
        assert!(e.is_none());
        let mut out = Vec::new();
        t.render(None, &mut out);
        assert_eq!(out.len(), 17);
    }
}
