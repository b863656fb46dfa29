//! The client's output file read as it grows, each line with the time it was first seen: what
//! the runner's waits look at, and where its timings come from.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Instant;

/// A growing log file, read by appended bytes.
#[derive(Debug)]
pub(super) struct LogWatch {
    /// The file.
    path: PathBuf,
    /// Bytes read so far.
    read: u64,
    /// The last line, not ended yet.
    partial: Vec<u8>,
    /// The complete lines, each with the time a poll first saw it.
    lines: Vec<(Instant, String)>,
}

impl LogWatch {
    /// Watches `path` (which must exist), from its start.
    pub(super) fn new(path: PathBuf) -> LogWatch {
        LogWatch {
            path,
            read: 0,
            partial: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// Reads what was appended since the last call.
    pub(super) fn poll(&mut self) -> io::Result<()> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.read))?;
        let mut fresh = Vec::new();
        self.read += file.read_to_end(&mut fresh)? as u64;
        let now = Instant::now();
        for &b in &fresh {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.lines.push((now, line));
                self.partial.clear();
            } else {
                self.partial.push(b);
            }
        }
        Ok(())
    }

    /// The complete lines read so far.
    pub(super) fn lines(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.lines.iter().map(|(_, l)| l.as_str())
    }

    /// The first line `matches` accepts: its index and the time it was first seen.
    pub(super) fn first(&self, matches: impl Fn(&str) -> bool) -> Option<(usize, Instant)> {
        let i = self.lines.iter().position(|(_, l)| matches(l))?;
        Some((i, self.lines[i].0))
    }

    /// The last `n` lines, each cut at about 200 bytes (the GL extension list is one line).
    pub(super) fn tail(&self, n: usize) -> String {
        let skip = self.lines.len().saturating_sub(n);
        let cut = |l: &str| match (200..l.len()).find(|&i| l.is_char_boundary(i)) {
            Some(i) => format!("{}...", &l[..i]),
            None => l.to_string(),
        };
        self.lines()
            .skip(skip)
            .map(cut)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_as_they_come() {
        let dir = crate::openarena::fresh_dir().unwrap();
        let path = dir.join("log");
        std::fs::write(&path, "one\ntw").unwrap();
        let mut watch = LogWatch::new(path.clone());
        watch.poll().unwrap();
        assert_eq!(watch.lines().collect::<Vec<_>>(), ["one"]);
        std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
        watch.poll().unwrap();
        assert_eq!(watch.lines().collect::<Vec<_>>(), ["one", "two", "three"]);
        assert_eq!(watch.first(|l| l.starts_with('t')).map(|(i, _)| i), Some(1));
        assert_eq!(watch.tail(2), "two\nthree");
        std::fs::write(&path, "x".repeat(300) + "\n").unwrap();
        let mut long = LogWatch::new(path.clone());
        long.poll().unwrap();
        assert_eq!(long.tail(1), "x".repeat(200) + "...");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
