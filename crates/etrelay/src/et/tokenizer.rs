//! How the servers read the first words of a connectionless packet.
//!
//! This mirrors, step by step, what ET 2.60b, ET: Legacy and ioquake3 do with the bytes after
//! the `FF FF FF FF` marker (see `docs/etrelay-filter.md` for the sources):
//!
//! 1. `MSG_ReadStringLine`: the line ends at `\0`, `\n` or the end of the packet and keeps at
//!    most 1023 bytes; `%` becomes `.`; ioquake3 also turns every byte > 127 into `.`.
//! 2. `Cmd_TokenizeString`: whitespace is every byte `<= ' '`; on x86 builds of ET 2.60b and
//!    ET: Legacy (signed `char`) bytes >= 0x80 are whitespace too while skipping to a token, ET
//!    2.60b also ends a token at such a byte; `//` ends parsing (ET keeps it when the byte before
//!    is `:`), `/* … */` is skipped and `/*` ends a token, `"…"` is one token and a `"` ends an
//!    unquoted token.
//!
//! Tokens are returned as ranges into the packet (the byte mapping of step 1 is one byte for one
//! byte, so ranges stay valid); nothing is allocated. Only the first two tokens are ever needed:
//! the command, and for queries the `challenge`.

use std::ops::Range;

/// Longest line `MSG_ReadStringLine` keeps (`MAX_STRING_CHARS - 1`).
pub const MAX_LINE: usize = 1023;

/// A way some server build reads the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// ET 2.60b on x86: high bytes separate tokens.
    Et260,
    /// ET: Legacy on x86: high bytes are skipped before a token, kept inside one.
    EtLegacy,
    /// ioquake3: high bytes became `.`.
    Ioq3,
    /// Any of these built where `char` is unsigned (ARM): high bytes are ordinary.
    UnsignedChar,
}

/// Every engine the relay must agree with.
pub const ENGINES: [Engine; 4] = [
    Engine::Et260,
    Engine::EtLegacy,
    Engine::Ioq3,
    Engine::UnsignedChar,
];

impl Engine {
    /// The byte as this engine sees it after `MSG_ReadStringLine`.
    #[inline]
    pub fn map(self, b: u8) -> u8 {
        match b {
            b'%' => b'.',
            0x80.. if self == Engine::Ioq3 => b'.',
            _ => b,
        }
    }

    /// Skipped before a token (`*text <= ' '` on this build's `char`).
    #[inline]
    fn is_space(self, b: u8) -> bool {
        b <= b' ' || (b >= 0x80 && matches!(self, Engine::Et260 | Engine::EtLegacy))
    }

    /// Ends an unquoted token by itself.
    #[inline]
    fn ends_token(self, b: u8) -> bool {
        b <= b' ' || (b >= 0x80 && self == Engine::Et260)
    }

    /// `//` at `i` ends parsing (or the token). ET keeps it after a `:` (`http://`).
    #[inline]
    fn is_line_comment(self, line: &[u8], i: usize) -> bool {
        let starts = line.get(i) == Some(&b'/') && line.get(i + 1) == Some(&b'/');
        match self {
            Engine::Ioq3 => starts,
            _ => starts && (i == 0 || line[i - 1] != b':'),
        }
    }
}

/// The line the server tokenizes: the packet body after the marker, up to `\0`/`\n`, at most
/// [`MAX_LINE`] bytes. `body` excludes the 4-byte marker.
#[inline]
pub fn line(body: &[u8]) -> &[u8] {
    let end = body
        .iter()
        .position(|&b| b == 0 || b == b'\n')
        .unwrap_or(body.len());
    &body[..end.min(MAX_LINE)]
}

/// The first two tokens of `line` as `engine` reads them (ranges into `line`).
pub fn first_tokens(engine: Engine, line: &[u8]) -> [Option<Range<usize>>; 2] {
    tokens(engine, line)
}

/// The first `N` tokens of `line` as `engine` reads them (ranges into `line`).
pub fn tokens<const N: usize>(engine: Engine, line: &[u8]) -> [Option<Range<usize>>; N] {
    let mut out = std::array::from_fn(|_| None);
    let at = |i: usize| engine.map(line[i]);
    let mut i = 0;
    for slot in out.iter_mut() {
        // Skip whitespace and comments up to the next token.
        loop {
            while i < line.len() && engine.is_space(at(i)) {
                i += 1;
            }
            if i >= line.len() {
                return out;
            }
            if engine.is_line_comment(line, i) {
                return out;
            }
            if at(i) == b'/' && line.get(i + 1) == Some(&b'*') {
                // The servers look for `*/` from the `*` of `/*` on, so `/*/` is a whole
                // comment.
                match line[i + 1..].windows(2).position(|w| w == b"*/") {
                    Some(p) => i += 1 + p + 2,
                    None => return out,
                }
            } else {
                break;
            }
        }
        if at(i) == b'"' {
            let start = i + 1;
            let end = line[start..]
                .iter()
                .position(|&b| b == b'"')
                .map_or(line.len(), |p| start + p);
            *slot = Some(start..end);
            if end >= line.len() {
                return out;
            }
            i = end + 1;
            continue;
        }
        let start = i;
        while i < line.len() && !engine.ends_token(at(i)) {
            if at(i) == b'"'
                || engine.is_line_comment(line, i)
                || (at(i) == b'/' && line.get(i + 1) == Some(&b'*'))
            {
                break;
            }
            i += 1;
        }
        *slot = Some(start..i);
    }
    out
}

/// True when the token `range` of `line`, as `engine` maps it, equals `word` ignoring ASCII
/// case (`Q_stricmp`).
#[inline]
pub fn token_eq(engine: Engine, line: &[u8], range: &Range<usize>, word: &[u8]) -> bool {
    range.len() == word.len()
        && line[range.clone()]
            .iter()
            .zip(word)
            .all(|(&b, &w)| engine.map(b).eq_ignore_ascii_case(&w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(engine: Engine, body: &[u8]) -> Vec<Vec<u8>> {
        let l = line(body);
        first_tokens(engine, l)
            .into_iter()
            .flatten()
            .map(|r| l[r].iter().map(|&b| engine.map(b)).collect())
            .collect()
    }

    #[test]
    fn plain_and_odd_spellings() {
        let cases: &[(&[u8], &[&[u8]])] = &[
            (b"getinfo abc", &[b"getinfo", b"abc"]),
            (b"  getinfo a3", &[b"getinfo", b"a3"]),
            (b"\"getinfo\" a4", &[b"getinfo", b"a4"]),
            (b"/* c */getinfo a5", &[b"getinfo", b"a5"]),
            (b"\tgetinfo\ta8", &[b"getinfo", b"a8"]),
            (b"\x01getinfo cc", &[b"getinfo", b"cc"]),
            (b"//getinfo a6", &[]),
            (b"get\"info\" q", &[b"get", b"info"]),
            (b"getinfo%s", &[b"getinfo.s"]),
            (b"getinfo\n a7", &[b"getinfo"]),
            (b"getinfo\x00junk", &[b"getinfo"]),
            (b"/**/rcon pw", &[b"rcon", b"pw"]),
            (b"rcon/* x */pw", &[b"rcon", b"pw"]),
            (b"rcon//pw", &[b"rcon"]),
            (b"/* never closed rcon", &[]),
            (b"/*/rcon pw", &[b"rcon", b"pw"]),
            (b"/*/ rcon */getinfo", &[b"rcon", b"*/getinfo"]),
            (b"\"unterminated", &[b"unterminated"]),
            (b"", &[]),
        ];
        for (body, want) in cases {
            for engine in ENGINES {
                let got = words(engine, body);
                assert_eq!(&got, want, "{engine:?} {:?}", String::from_utf8_lossy(body));
            }
        }
    }

    #[test]
    fn high_bytes_depend_on_the_build() {
        let body = b"\x80rcon pw";
        assert_eq!(words(Engine::Et260, body)[0], b"rcon");
        assert_eq!(words(Engine::EtLegacy, body)[0], b"rcon");
        assert_eq!(words(Engine::Ioq3, body)[0], b".rcon");
        assert_eq!(words(Engine::UnsignedChar, body)[0], b"\x80rcon");
        let body = b"rc\x80on";
        assert_eq!(
            words(Engine::Et260, body),
            vec![b"rc".to_vec(), b"on".to_vec()]
        );
        assert_eq!(words(Engine::EtLegacy, body), vec![b"rc\x80on".to_vec()]);
    }

    #[test]
    fn et_keeps_double_slash_after_colon() {
        assert_eq!(words(Engine::Et260, b"x http://a b")[1], b"http://a");
        assert_eq!(words(Engine::Ioq3, b"x http://a b")[1], b"http:");
    }

    #[test]
    fn line_is_capped() {
        let mut body = vec![b' '; 1020];
        body.extend_from_slice(b"rcon pw");
        let l = line(&body);
        assert_eq!(l.len(), MAX_LINE);
        assert_eq!(words(Engine::Ioq3, &body)[0], b"rco");
    }

    #[test]
    fn case_insensitive_compare() {
        let l = b"RCon x";
        let [a, _] = first_tokens(Engine::Et260, l);
        assert!(token_eq(Engine::Et260, l, &a.unwrap(), b"rcon"));
    }
}
