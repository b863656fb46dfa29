//! A deliberately literal model of how Quake 3 engine servers read a
//! connectionless ("out of band") packet.
//!
//! This module is a reference oracle: it follows the steps described in
//! `et-protocol.md` §1-2 one by one, byte by byte, the way the C code walks a
//! `char *`. Speed is irrelevant here; every branch is written so that it can
//! be compared with the prose of the research note. The relay's own, optimised
//! classifier is expected to agree with [`dispatch`] on every input.
//!
//! Three engines are modelled, all as x86 builds (where `char` is signed, so a
//! byte `>= 0x80` compares as a negative number):
//!
//! * [`Engine::Et260`]: the id / Splash Damage ET 2.60b GPL source;
//! * [`Engine::EtLegacy`]: current ET: Legacy;
//! * [`Engine::Ioq3`]: ioquake3, the engine Debian's OpenArena server runs.
//!
//! The pipeline on the server is:
//!
//! 1. detect the `FF FF FF FF` marker ([`dispatch`]);
//! 2. the case-sensitive `connect` special case (Huffman from offset 12);
//! 3. [`read_string_line`] (`MSG_ReadStringLine`);
//! 4. [`tokenize`] (`Cmd_TokenizeString`);
//! 5. compare `argv[0]` case-insensitively with the known commands.

/// One of the three modelled Quake 3 engine servers (x86 builds, signed `char`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// Wolfenstein: Enemy Territory 2.60b (GPL source release).
    Et260,
    /// ET: Legacy (current).
    EtLegacy,
    /// ioquake3 (Debian's OpenArena server).
    Ioq3,
}

/// All modelled engines, for table-driven tests.
pub const ENGINES: [Engine; 3] = [Engine::Et260, Engine::EtLegacy, Engine::Ioq3];

/// What the server does with a datagram, as decided by `SV_PacketEvent` and
/// `SV_ConnectionlessPacket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// `getstatus`: answered with a `statusResponse`.
    GetStatus,
    /// `getinfo`: answered with an `infoResponse`.
    GetInfo,
    /// `getchallenge`: answered with a `challengeResponse`.
    GetChallenge,
    /// `connect` with a plaintext userinfo (argv0 matched case-insensitively,
    /// but bytes 4..11 were not exactly `connect`).
    Connect,
    /// Bytes 4..11 are exactly `connect`: the server Huffman-decompresses the
    /// packet from offset 12 before reading it. (What it then dispatches to
    /// depends on byte 11 and the decompressed text; for a real client it is
    /// `connect`. The model does not decompress.)
    HuffmanConnect,
    /// `rcon`: remote console command.
    Rcon,
    /// `disconnect`: accepted and silently ignored by the server.
    Disconnect,
    /// `ipAuthorize` (ET 2.60b and ioquake3 only).
    IpAuthorize,
    /// `updateResponse` (ET: Legacy only).
    UpdateResponse,
    /// No command matched, but the raw bytes 4..7 are `PB_` (PunkBuster).
    PunkBuster,
    /// A connectionless packet whose command is unknown: dropped.
    Ignored,
    /// Shorter than 4 bytes or not starting with `FF FF FF FF`: a netchan
    /// (in-game) packet.
    NotConnectionless,
}

/// `MAX_STRING_CHARS` (1024) minus the terminating NUL.
const MAX_LINE: usize = 1023;

/// Models `MSG_ReadStringLine` on the bytes that follow the `FF FF FF FF`
/// marker.
///
/// Reads until `\0`, `\n` or the end of the payload; every `%` becomes `.`;
/// on [`Engine::Ioq3`] every byte > 127 also becomes `.` (ET: Legacy only
/// strips high bytes when `msg->strip` is set, which never happens for OOB
/// packets; ET 2.60b never does). At most 1023 bytes are kept (the rest of the
/// line is consumed and discarded).
pub fn read_string_line(engine: Engine, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &byte in payload {
        // `c == -1 || c == 0 || c == '\n'`: end of data, NUL or newline.
        if byte == 0 || byte == b'\n' {
            break;
        }
        let mut c = byte;
        // "translate all fmt spec to avoid crash bugs"
        if c == b'%' {
            c = b'.';
        }
        // ioquake3: "don't allow higher ascii values"
        if engine == Engine::Ioq3 && c > 127 {
            c = b'.';
        }
        // The buffer is full: keep reading (the bytes are consumed) but do
        // not store them.
        if out.len() >= MAX_LINE {
            continue;
        }
        out.push(c);
    }
    out
}

/// `MAX_STRING_TOKENS` for the engine.
fn max_tokens(engine: Engine) -> usize {
    match engine {
        Engine::Et260 | Engine::EtLegacy => 256,
        Engine::Ioq3 => 1024,
    }
}

/// The byte at `i`, or 0 (the C string terminator) past the end.
fn at(text: &[u8], i: usize) -> u8 {
    text.get(i).copied().unwrap_or(0)
}

/// `*text <= ' '` while skipping whitespace before a token.
///
/// On the ET engines `char` is signed, so a byte `>= 0x80` is negative and
/// therefore "whitespace". On ioquake3 such bytes never reach the tokenizer
/// through [`dispatch`] / [`argv`] (they became `.` in [`read_string_line`]).
///
/// Reading where the research note is silent: when [`tokenize`] is called
/// directly with high bytes for [`Engine::Ioq3`], they are compared the same
/// signed way as on ET 2.60b (ioq3's loop is the same `*text <= ' '` /
/// `*text > ' '` on a signed `char` on x86): whitespace before a token, end
/// of an unquoted token. Treating them as non-whitespace before a token but
/// as a token terminator would make the C loop emit empty tokens forever.
fn is_space_before_token(_engine: Engine, c: u8) -> bool {
    c <= b' ' || c >= 0x80
}

/// `*text > ' '`: may this byte continue an unquoted token?
///
/// * ET 2.60b: `while (*text > ' ')` on a signed `char` ends the token at a
///   byte `>= 0x80`.
/// * ET: Legacy walks UTF-8, so a high byte stays inside the token.
/// * ioquake3 has the same loop as ET 2.60b (and normally never sees high
///   bytes, see [`read_string_line`]).
fn continues_token(engine: Engine, c: u8) -> bool {
    match engine {
        Engine::Et260 | Engine::Ioq3 => c > b' ' && c < 0x80,
        Engine::EtLegacy => c > b' ',
    }
}

/// Does a `//` at `i` count as a comment?
///
/// ioquake3: always. ET 2.60b and ET: Legacy: unless the previous char is `:`
/// (so that `http://host` survives); a `//` at the very start of the string
/// always counts. This exception applies both where a token would start and
/// inside an unquoted token (it is written the same way in both loops of the
/// ET source), which is what keeps `http://x` as one token on ET.
fn is_line_comment(engine: Engine, text: &[u8], i: usize) -> bool {
    if at(text, i) != b'/' || at(text, i + 1) != b'/' {
        return false;
    }
    match engine {
        Engine::Ioq3 => true,
        Engine::Et260 | Engine::EtLegacy => i == 0 || text[i - 1] != b':',
    }
}

/// Is there a `/*` at `i`?
fn is_block_comment_start(text: &[u8], i: usize) -> bool {
    at(text, i) == b'/' && at(text, i + 1) == b'*'
}

/// Models `Cmd_TokenizeString` on one line (as returned by
/// [`read_string_line`]).
///
/// The line is first truncated to 1023 bytes, as the research note describes
/// (the `cmd_cmd` copy). Reading where the note is silent: the C loop walks
/// the caller's text rather than that copy, but every line that reaches it
/// through `MSG_ReadStringLine` is at most 1023 bytes long, so the truncation
/// only matters for direct calls with longer input. Like the C code, the line
/// is a C string: an embedded `\0` ends it (this cannot happen for a line
/// produced by [`read_string_line`]).
///
/// Rules, from `et-protocol.md` §2:
///
/// * at most 256 tokens (ET) or 1024 (ioq3); the cap is checked before each
///   token, so the tokens after the cap are simply not produced;
/// * whitespace before a token: any byte `<= 0x20`, plus (signed `char`)
///   any byte `>= 0x80`;
/// * `//` where a token would start ends parsing (see the `:` exception on
///   ET); a `/* ... */` is skipped there, and an unterminated `/*` ends
///   parsing. Literal reading of the C loop: the search for `*/` starts at the
///   `/` of `/*`, so `/*/` is already a complete comment;
/// * `"..."` is one token, without escapes, possibly empty; an unterminated
///   quote still yields its token and ends parsing;
/// * an unquoted token ends at whitespace (see [`Engine`] differences on high
///   bytes), at a `"`, at a `//` comment, or at `/*`.
pub fn tokenize(engine: Engine, line: &[u8]) -> Vec<Vec<u8>> {
    // `Q_strncpyz(cmd_cmd, text_in, ...)` plus C-string semantics.
    let mut text: &[u8] = &line[..line.len().min(MAX_LINE)];
    if let Some(nul) = text.iter().position(|&b| b == 0) {
        text = &text[..nul];
    }

    let mut tokens: Vec<Vec<u8>> = Vec::new();
    let mut i = 0usize;
    loop {
        if tokens.len() == max_tokens(engine) {
            return tokens; // "this is usually something malicious"
        }

        // Skip whitespace and comments until a token starts.
        loop {
            while at(text, i) != 0 && is_space_before_token(engine, at(text, i)) {
                i += 1;
            }
            if at(text, i) == 0 {
                return tokens; // all tokens parsed
            }
            if is_line_comment(engine, text, i) {
                return tokens; // the rest of the line is a comment
            }
            if is_block_comment_start(text, i) {
                // Scan from the `/` itself for `*/`.
                while at(text, i) != 0 && !(at(text, i) == b'*' && at(text, i + 1) == b'/') {
                    i += 1;
                }
                if at(text, i) == 0 {
                    return tokens; // unterminated comment
                }
                i += 2;
            } else {
                break; // ready to parse a token
            }
        }

        // Quoted token.
        if at(text, i) == b'"' {
            i += 1;
            let mut token = Vec::new();
            while at(text, i) != 0 && at(text, i) != b'"' {
                token.push(text[i]);
                i += 1;
            }
            tokens.push(token);
            if at(text, i) == 0 {
                return tokens; // unterminated quote
            }
            i += 1; // closing quote
            continue;
        }

        // Unquoted token.
        let mut token = Vec::new();
        while continues_token(engine, at(text, i)) {
            if at(text, i) == b'"' {
                break;
            }
            if is_line_comment(engine, text, i) {
                break;
            }
            if is_block_comment_start(text, i) {
                break;
            }
            token.push(text[i]);
            i += 1;
        }
        tokens.push(token);
        if at(text, i) == 0 {
            return tokens;
        }
    }
}

/// The commands `SV_ConnectionlessPacket` knows, per engine.
fn command_for(engine: Engine, argv0: &[u8]) -> Option<Dispatch> {
    let is = |name: &str| argv0.eq_ignore_ascii_case(name.as_bytes());
    if is("getstatus") {
        Some(Dispatch::GetStatus)
    } else if is("getinfo") {
        Some(Dispatch::GetInfo)
    } else if is("getchallenge") {
        Some(Dispatch::GetChallenge)
    } else if is("connect") {
        Some(Dispatch::Connect)
    } else if is("rcon") {
        Some(Dispatch::Rcon)
    } else if is("disconnect") {
        Some(Dispatch::Disconnect)
    } else if is("ipAuthorize") && matches!(engine, Engine::Et260 | Engine::Ioq3) {
        Some(Dispatch::IpAuthorize)
    } else if is("updateResponse") && engine == Engine::EtLegacy {
        Some(Dispatch::UpdateResponse)
    } else {
        None
    }
}

/// Is this whole datagram a connectionless packet (`FF FF FF FF` prefix)?
fn is_connectionless(packet: &[u8]) -> bool {
    packet.len() >= 4 && packet[..4] == [0xFF; 4]
}

/// Models what the server does with a whole datagram.
///
/// * fewer than 4 bytes, or not `FF FF FF FF`: [`Dispatch::NotConnectionless`];
/// * bytes 4..11 exactly `connect` (case-sensitive, `Q_strncmp(.., 7)`; byte
///   11 is not checked): [`Dispatch::HuffmanConnect`]. Reading of the doc: the
///   7 bytes must actually be in the datagram (the C code would compare
///   against whatever stale bytes follow a shorter packet in its buffer);
/// * otherwise `argv[0]` of `tokenize(read_string_line(..))`, compared
///   case-insensitively (`Q_stricmp`, ASCII folding) with the engine's
///   commands;
/// * no command matched and raw bytes 4..7 are `PB_`:
///   [`Dispatch::PunkBuster`] (on every engine, as specified for the relay;
///   ioquake3 itself has no PunkBuster handler and just ignores these);
/// * else [`Dispatch::Ignored`] (also when there are no tokens at all).
pub fn dispatch(engine: Engine, packet: &[u8]) -> Dispatch {
    if !is_connectionless(packet) {
        return Dispatch::NotConnectionless;
    }
    if packet.len() >= 11 && &packet[4..11] == b"connect" {
        return Dispatch::HuffmanConnect;
    }
    let tokens = argv(engine, packet);
    if let Some(first) = tokens.first()
        && let Some(command) = command_for(engine, first)
    {
        return command;
    }
    if packet.len() >= 7 && &packet[4..7] == b"PB_" {
        return Dispatch::PunkBuster;
    }
    Dispatch::Ignored
}

/// The tokens the server sees for a whole datagram:
/// `tokenize(engine, read_string_line(engine, &packet[4..]))`.
///
/// Empty for a packet that is not connectionless. For a
/// [`Dispatch::HuffmanConnect`] packet this tokenizes the raw (still
/// compressed) bytes, since the model does not decompress.
pub fn argv(engine: Engine, packet: &[u8]) -> Vec<Vec<u8>> {
    if !is_connectionless(packet) {
        return Vec::new();
    }
    tokenize(engine, &read_string_line(engine, &packet[4..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oob(payload: &[u8]) -> Vec<u8> {
        let mut packet = vec![0xFF; 4];
        packet.extend_from_slice(payload);
        packet
    }

    fn toks(engine: Engine, line: &[u8]) -> Vec<String> {
        tokenize(engine, line)
            .into_iter()
            .map(|t| String::from_utf8_lossy(&t).into_owned())
            .collect()
    }

    /// Every row of the "Checked against the OpenArena (IOQ3) server" table,
    /// with the dispatch and the challenge (argv 1) the server used.
    #[test]
    fn openarena_table_ioq3() {
        use Dispatch::*;
        /// (payload after the marker, dispatch, argv 1)
        type Row = (&'static [u8], Dispatch, Option<&'static [u8]>);
        let rows: &[Row] = &[
            (b"GETINFO a1", GetInfo, Some(b"a1")),
            (b"GetStatus a2", GetStatus, Some(b"a2")),
            (b"  getinfo a3", GetInfo, Some(b"a3")),
            (b"\"getinfo\" a4", GetInfo, Some(b"a4")),
            (b"/* c */getinfo a5", GetInfo, Some(b"a5")),
            (b"\tgetinfo\ta8", GetInfo, Some(b"a8")),
            (b"\x01getinfo cc", GetInfo, Some(b"cc")),
            (b"//getinfo a6", Ignored, None),
            (b"\x80getinfo", Ignored, None),
            (b"get\"info\" q", Ignored, Some(b"info")),
            (b"getinfo%s", Ignored, None),
            (b"getinfo\n a7", GetInfo, None),
            (b"getinfo\x00junk", GetInfo, None),
            (b"getinfo a;b", GetInfo, Some(b"a;b")),
            (b"RCON secret sets viaUpper 1", Rcon, Some(b"secret")),
            (b"/**/rcon secret sets x 1", Rcon, Some(b"secret")),
            (b"\"rcon\" secret sets x 1", Rcon, Some(b"secret")),
            (b"\x07rcon secret sets x 1", Rcon, Some(b"secret")),
        ];
        for (payload, want, arg1) in rows {
            let packet = oob(payload);
            assert_eq!(
                dispatch(Engine::Ioq3, &packet),
                *want,
                "payload {:?}",
                String::from_utf8_lossy(payload)
            );
            let args = argv(Engine::Ioq3, &packet);
            assert_eq!(
                args.get(1).map(Vec::as_slice),
                *arg1,
                "argv1 of {:?}",
                String::from_utf8_lossy(payload)
            );
        }
        // The line transformations behind those rows.
        assert_eq!(read_string_line(Engine::Ioq3, b"\x80getinfo"), b".getinfo");
        assert_eq!(read_string_line(Engine::Ioq3, b"getinfo%s"), b"getinfo.s");
        assert_eq!(toks(Engine::Ioq3, b"get\"info\" q"), ["get", "info", "q"]);
    }

    #[test]
    fn high_bytes_differ_between_engines() {
        let packet = oob(b"\x80rcon x");
        assert_eq!(dispatch(Engine::Et260, &packet), Dispatch::Rcon);
        assert_eq!(dispatch(Engine::EtLegacy, &packet), Dispatch::Rcon);
        assert_eq!(dispatch(Engine::Ioq3, &packet), Dispatch::Ignored);

        // ET keeps the high byte in the line; ioq3 turns it into '.'.
        assert_eq!(read_string_line(Engine::Et260, b"a\xffb"), b"a\xffb");
        assert_eq!(read_string_line(Engine::EtLegacy, b"a\xffb"), b"a\xffb");
        assert_eq!(read_string_line(Engine::Ioq3, b"a\xffb"), b"a.b");

        // Inside a token: ET 2.60b splits, ET: Legacy keeps.
        assert_eq!(
            tokenize(Engine::Et260, b"rc\xe9on x"),
            [b"rc".to_vec(), b"on".to_vec(), b"x".to_vec()]
        );
        assert_eq!(
            tokenize(Engine::EtLegacy, b"rc\xe9on x"),
            [b"rc\xe9on".to_vec(), b"x".to_vec()]
        );
        // A trailing high byte ends the token on 2.60b, stays on Legacy.
        assert_eq!(
            dispatch(Engine::Et260, &oob(b"rcon\x80 pw")),
            Dispatch::Rcon
        );
        assert_eq!(
            dispatch(Engine::EtLegacy, &oob(b"rcon\x80 pw")),
            Dispatch::Ignored
        );
        assert_eq!(
            dispatch(Engine::Ioq3, &oob(b"rcon\x80 pw")),
            Dispatch::Ignored
        );
        // Called directly, ioq3 compares high bytes as signed chars too.
        assert_eq!(toks(Engine::Ioq3, b"\x80rcon x"), ["rcon", "x"]);
        assert_eq!(toks(Engine::Ioq3, b"rc\x80on"), ["rc", "on"]);
        // High bytes inside quotes are kept by the ET engines.
        assert_eq!(tokenize(Engine::Et260, b"\"a\xffb\""), [b"a\xffb".to_vec()]);
    }

    #[test]
    fn line_comment_and_colon() {
        assert_eq!(toks(Engine::Et260, b"http://x y"), ["http://x", "y"]);
        assert_eq!(toks(Engine::EtLegacy, b"http://x y"), ["http://x", "y"]);
        assert_eq!(toks(Engine::Ioq3, b"http://x y"), ["http:"]);
        for engine in ENGINES {
            assert!(toks(engine, b"//getinfo").is_empty());
            assert_eq!(toks(engine, b"getinfo //x"), ["getinfo"]);
            assert_eq!(toks(engine, b"getinfo a//x"), ["getinfo", "a"]);
            assert_eq!(
                dispatch(engine, &oob(b"getinfo http://x")),
                Dispatch::GetInfo
            );
        }
    }

    #[test]
    fn block_comments_and_quotes() {
        for engine in ENGINES {
            assert_eq!(toks(engine, b"/**/rcon pw cmd"), ["rcon", "pw", "cmd"]);
            assert_eq!(toks(engine, b"rc/**/on"), ["rc", "on"]);
            assert_eq!(toks(engine, b"a /* b"), ["a"]);
            assert!(toks(engine, b"/* never closed rcon").is_empty());
            // The search for "*/" starts at the '/' of "/*".
            assert_eq!(toks(engine, b"/*/rcon"), ["rcon"]);
            assert_eq!(toks(engine, b"\"a b\" c"), ["a b", "c"]);
            assert_eq!(toks(engine, b"\"\" c"), ["", "c"]);
            assert_eq!(toks(engine, b"a\"b c"), ["a", "b c"]);
            assert_eq!(toks(engine, b"\"unterminated rcon"), ["unterminated rcon"]);
            assert_eq!(toks(engine, b"a\"\\\"b"), ["a", "\\", "b"]);
            assert_eq!(toks(engine, b"\r\x7f\tx"), ["\x7f", "x"]);
        }
    }

    #[test]
    fn token_caps_and_truncation() {
        let many = "a ".repeat(2000);
        assert_eq!(tokenize(Engine::Et260, many.as_bytes()).len(), 256);
        assert_eq!(tokenize(Engine::EtLegacy, many.as_bytes()).len(), 256);
        // 2000 tokens in 4000 bytes, but the line is cut to 1023 bytes first.
        assert_eq!(tokenize(Engine::Ioq3, many.as_bytes()).len(), 512);
        let line = read_string_line(Engine::Ioq3, "x".repeat(5000).as_bytes());
        assert_eq!(line.len(), 1023);
        let packet = oob(format!("getinfo {}", "y".repeat(2000)).as_bytes());
        let args = argv(Engine::Et260, &packet);
        assert_eq!(args[1].len(), 1023 - "getinfo ".len());
    }

    #[test]
    fn connect_special_case() {
        for engine in ENGINES {
            assert_eq!(
                dispatch(engine, &oob(b"connect \x00\x01\xa5garbage")),
                Dispatch::HuffmanConnect
            );
            // Byte 11 is not checked.
            assert_eq!(
                dispatch(engine, &oob(b"connectX")),
                Dispatch::HuffmanConnect
            );
            assert_eq!(dispatch(engine, &oob(b"connect")), Dispatch::HuffmanConnect);
            // Other casings are plaintext connects.
            assert_eq!(
                dispatch(engine, &oob(b"CONNECT \"\\name\\x\"")),
                Dispatch::Connect
            );
            assert_eq!(dispatch(engine, &oob(b" connect x")), Dispatch::Connect);
            assert_eq!(dispatch(engine, &oob(b"conn")), Dispatch::Ignored);
        }
    }

    #[test]
    fn commands_per_engine() {
        use Dispatch::*;
        let cases: &[(&[u8], [Dispatch; 3])] = &[
            (b"getchallenge", [GetChallenge; 3]),
            (b"disconnect", [Disconnect; 3]),
            (b"ipauthorize 1 accept", [IpAuthorize, Ignored, IpAuthorize]),
            (b"updateResponse x", [Ignored, UpdateResponse, Ignored]),
            (b"PB_SV foo", [PunkBuster; 3]),
            (b"pb_sv foo", [Ignored; 3]),
            (b"getinfoX", [Ignored; 3]),
            (b"", [Ignored; 3]),
            (b"   ", [Ignored; 3]),
        ];
        for (payload, wants) in cases {
            for (engine, want) in ENGINES.iter().zip(wants) {
                assert_eq!(
                    dispatch(*engine, &oob(payload)),
                    *want,
                    "{engine:?} {:?}",
                    String::from_utf8_lossy(payload)
                );
            }
        }
        for engine in ENGINES {
            assert_eq!(dispatch(engine, b""), NotConnectionless);
            assert_eq!(dispatch(engine, b"\xff\xff\xff"), NotConnectionless);
            assert_eq!(
                dispatch(engine, b"\xff\xff\xff\xfe getinfo"),
                NotConnectionless
            );
            assert_eq!(dispatch(engine, b"\xff\xff\xff\xff"), Ignored);
            assert!(argv(engine, b"\x01\x00\x00\x00rcon").is_empty());
        }
    }
}
