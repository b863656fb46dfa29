//! Info strings (`\key\value\key\value`) and the replies that carry them.
//!
//! Helpers for tests that look into `infoResponse` / `statusResponse` packets.

/// Parses an info string `\k1\v1\k2\v2...` into its pairs, in order.
///
/// A leading `\` is optional. A trailing key without a value gets an empty
/// value. Bytes are decoded lossily as UTF-8.
pub fn parse(info: &[u8]) -> Vec<(String, String)> {
    let body = info.strip_prefix(b"\\").unwrap_or(info);
    if body.is_empty() {
        return Vec::new();
    }
    let parts: Vec<&[u8]> = body.split(|&b| b == b'\\').collect();
    parts
        .chunks(2)
        .map(|pair| {
            let key = String::from_utf8_lossy(pair[0]).into_owned();
            let value = pair
                .get(1)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            (key, value)
        })
        .collect()
}

/// The value of `key` in a parsed info string (exact, case-sensitive match of
/// the key, first occurrence).
pub fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Builds an info string `\k\v...` from pairs, skipping empty values (the
/// engines never write an empty value).
pub fn build<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if v.as_ref().is_empty() {
            continue;
        }
        out.push('\\');
        out.push_str(k.as_ref());
        out.push('\\');
        out.push_str(v.as_ref());
    }
    out
}

/// If `packet` is `FF FF FF FF infoResponse\n<info>`, the parsed info string.
pub fn info_response(packet: &[u8]) -> Option<Vec<(String, String)>> {
    let body = packet.strip_prefix(b"\xff\xff\xff\xffinfoResponse\n")?;
    Some(parse(body))
}

/// A parsed `statusResponse`: the serverinfo pairs and the player lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Serverinfo pairs, in the order they were sent.
    pub info: Vec<(String, String)>,
    /// One `(score, ping, name)` per player line.
    pub players: Vec<(i32, i32, String)>,
}

/// If `packet` is `FF FF FF FF statusResponse\n<info>\n<players>`, parses it.
///
/// Player lines are `<score> <ping> "<name>"`; malformed lines are skipped.
pub fn status_response(packet: &[u8]) -> Option<Status> {
    let body = packet.strip_prefix(b"\xff\xff\xff\xffstatusResponse\n")?;
    let mut lines = body.split(|&b| b == b'\n');
    let info = parse(lines.next().unwrap_or_default());
    let mut players = Vec::new();
    for line in lines {
        let line = String::from_utf8_lossy(line);
        let mut it = line.splitn(3, ' ');
        let (Some(score), Some(ping), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let (Ok(score), Ok(ping)) = (score.parse(), ping.parse()) else {
            continue;
        };
        let name = name.trim_matches('"').to_string();
        players.push((score, ping, name));
    }
    Some(Status { info, players })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let s = build(&[("a", "1"), ("empty", ""), ("b", "two words")]);
        assert_eq!(s, "\\a\\1\\b\\two words");
        let p = parse(s.as_bytes());
        assert_eq!(get(&p, "a"), Some("1"));
        assert_eq!(get(&p, "b"), Some("two words"));
        assert_eq!(get(&p, "empty"), None);
        assert!(parse(b"").is_empty());
    }

    #[test]
    fn status() {
        let st =
            status_response(b"\xff\xff\xff\xffstatusResponse\n\\a\\1\n3 50 \"Bob\"\n0 0 \"x y\"\n")
                .unwrap();
        assert_eq!(get(&st.info, "a"), Some("1"));
        assert_eq!(
            st.players,
            vec![(3, 50, "Bob".into()), (0, 0, "x y".into())]
        );
    }
}
