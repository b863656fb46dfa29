//! Human output: aligned tables, UTC times and byte counts.

use std::fmt::Write as _;

/// Columns are separated by this many spaces.
const GAP: usize = 2;

/// A table: a header line, then one line per row, each column as wide as its widest cell.
/// No trailing spaces.
pub(crate) fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(width) => *width = (*width).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str(&" ".repeat(GAP));
            }
            line.push_str(cell);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.chars().count());
            line.push_str(&" ".repeat(pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `name  value` lines, the values aligned.
pub(crate) fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let pad = width - k.chars().count() + GAP;
        let _ = writeln!(out, "{k}{}{v}", " ".repeat(pad));
    }
    out
}

/// The last second RFC 3339 (and `humantime`) can write: 9999-12-31 23:59:59 UTC.
const LAST_RFC3339_SECOND: u64 = 253_402_300_799;

/// Unix seconds as UTC `YYYY-MM-DD HH:MM:SS`; a time before 1970 or after 9999, which no relay
/// sends, as the seconds themselves (`-1 (Unix seconds)`).
pub(crate) fn utc(secs: i64) -> String {
    match u64::try_from(secs) {
        Ok(s) if s <= LAST_RFC3339_SECOND => {
            let t = crate::clock::from_unix(s);
            // `2025-11-29T21:00:00Z` → `2025-11-29 21:00:00`.
            humantime::format_rfc3339_seconds(t)
                .to_string()
                .replacen('T', " ", 1)
                .trim_end_matches('Z')
                .to_string()
        }
        _ => format!("{secs} (Unix seconds)"),
    }
}

/// A byte count with a binary unit: `512 B`, `93.8 KiB`, `1.2 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    #[allow(clippy::cast_precision_loss)] // one decimal shown
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Text from the relay made safe for a terminal, escaped as Rust escapes a string for debug
/// output: control characters (`\0`, `\n`, ESC as `\u{1b}`), bidirectional overrides and
/// other invisible format characters (`\u{202e}`) and a leading combining mark are written as
/// escapes, a backslash as `\\` (so an escape shown is never the text itself); quotes and
/// every printable character stay as they are.
pub(crate) fn clean(s: &str) -> String {
    let escaped = s.escape_debug().to_string();
    let mut out = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        // Every backslash here starts an escape: keep it, except before a quote.
        match chars.next() {
            Some(q @ ('"' | '\'')) => out.push(q),
            Some(next) => {
                out.push('\\');
                out.push(next);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        // date -u -d @1764450000 '+%F %T'
        assert_eq!(utc(1_764_450_000), "2025-11-29 21:00:00");
        // date -u -d @951782400: a leap day of a year divisible by 400
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc(4_102_444_799), "2099-12-31 23:59:59");
        // Before 1970 and after 9999 (no relay sends them): the seconds as they came.
        assert_eq!(utc(-1), "-1 (Unix seconds)");
        assert_eq!(utc(253_402_300_799), "9999-12-31 23:59:59");
        assert_eq!(utc(253_402_300_800), "253402300800 (Unix seconds)");
        assert_eq!(utc(86_399), "1970-01-01 23:59:59");
        // 2024-03-01 follows 2024-02-29.
        assert_eq!(utc(1_709_164_800), "2024-02-29 00:00:00");
        assert_eq!(utc(1_709_251_200), "2024-03-01 00:00:00");
        // 2100 is not a leap year.
        assert_eq!(utc(4_107_542_400), "2100-03-01 00:00:00");
    }

    /// Year, month and day of the date `utc` writes for midnight `days` after 1970-01-01.
    fn date(days: i64) -> (i64, i64, i64) {
        let text = utc(days * 86_400);
        let mut parts = text[..10].split('-').map(|p| p.parse::<i64>().unwrap());
        let ymd = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        assert_eq!(&text[10..], " 00:00:00", "{text}");
        ymd
    }

    #[test]
    fn every_day_follows_the_previous_one() {
        // From 1970 to 2100, each day is the next of the one before.
        let mut prev = date(0);
        assert_eq!(prev, (1970, 1, 1));
        for days in 1..47_500 {
            let (y, m, d) = date(days);
            let (py, pm, pd) = prev;
            let next_day = y == py && m == pm && d == pd + 1;
            let next_month = y == py && m == pm + 1 && d == 1;
            let next_year = y == py + 1 && m == 1 && d == 1 && pm == 12 && pd == 31;
            assert!(
                next_day || next_month || next_year,
                "{prev:?} -> {y}-{m}-{d}"
            );
            prev = (y, m, d);
        }
    }

    #[test]
    fn tables_align() {
        let out = render(
            &["IP", "REASON", "EXPIRES"],
            &[
                vec!["203.0.113.7".into(), "aimbot".into(), "never".into()],
                vec![
                    "2001:db8::1".into(),
                    "".into(),
                    "2025-11-29 21:00:00".into(),
                ],
            ],
        );
        assert_eq!(
            out,
            "IP           REASON  EXPIRES\n\
             203.0.113.7  aimbot  never\n\
             2001:db8::1          2025-11-29 21:00:00\n"
        );
    }

    #[test]
    fn field_lines() {
        let out = fields(&[
            ("port", "27960".into()),
            ("upstream", "10.0.0.2:27960".into()),
        ]);
        assert_eq!(out, "port      27960\nupstream  10.0.0.2:27960\n");
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(96_000), "93.8 KiB");
        assert_eq!(bytes(640_000), "625.0 KiB");
        assert_eq!(bytes(5 * 1024 * 1024 * 1024), "5.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn escapes_control_and_bidi_characters() {
        assert_eq!(clean("ok\n\x1b[31mred"), "ok\\n\\u{1b}[31mred");
        assert_eq!(clean("a\0b"), "a\\0b");
        // A right-to-left override, a zero-width space and a byte-order mark: escaped.
        assert_eq!(
            clean("cheat\u{202e}txt.exe\u{200b}\u{feff}"),
            "cheat\\u{202e}txt.exe\\u{200b}\\u{feff}"
        );
        // Quotes, other scripts and accents stay; a backslash is doubled.
        assert_eq!(clean("it's \"wallhack\""), "it's \"wallhack\"");
        assert_eq!(clean("tri\u{0301}che Ж 中"), "tri\u{0301}che Ж 中");
        assert_eq!(clean("a\\u{202e}"), "a\\\\u{202e}");
    }
}
