//! The operator API's authentication, as Tor's control port does it: at every start the node
//! writes a fresh random secret to [`COOKIE_FILE`] in its state dir, readable by its owner only
//! (mode 0600), and every operator request must carry it (`Authorization: Bearer <hex>`). Any
//! local process that cannot read the state dir gets 401 `unauthorized` and nothing else; the
//! CLI reads the file from `--state-dir` (or `--cookie-file`).

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// The cookie's file name in the state dir.
pub const COOKIE_FILE: &str = "operator.cookie";
/// Random bytes in a cookie (hex in the file and the header).
pub const COOKIE_BYTES: usize = 32;

/// Why the operator cookie cannot be read (the file from `--state-dir` or `--cookie-file`).
#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    /// The file cannot be read.
    #[error(
        "cannot read the operator cookie {}: {kind} (is the node running, and is \
         --state-dir or --cookie-file right?)",
        file.display()
    )]
    Read {
        /// The cookie file.
        file: PathBuf,
        /// What the file system said.
        kind: std::io::ErrorKind,
    },
    /// The file holds something else.
    #[error("{} does not hold an operator cookie", .0.display())]
    NotACookie(PathBuf),
}

/// The operator API's secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Cookie(Arc<str>);

/// Never prints the secret.
impl fmt::Debug for Cookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cookie(..)")
    }
}

impl Cookie {
    /// A fresh random cookie, written to `dir`/[`COOKIE_FILE`] with mode 0600 (a temporary file
    /// renamed over the old one, so a reader never sees half of it).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn create(dir: &Path) -> std::io::Result<Cookie> {
        let secret = hex::encode(rand::random::<[u8; COOKIE_BYTES]>());
        let tmp = dir.join(format!("{COOKIE_FILE}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(secret.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(COOKIE_FILE))?;
        Ok(Cookie(secret.into()))
    }

    /// Reads a cookie file.
    ///
    /// # Errors
    /// [`CookieError`]: the file cannot be read or does not hold a cookie.
    pub fn read(path: &Path) -> Result<Cookie, CookieError> {
        let text = std::fs::read_to_string(path).map_err(|e| CookieError::Read {
            file: path.to_owned(),
            kind: e.kind(),
        })?;
        let text = text.trim();
        if text.len() != 2 * COOKIE_BYTES || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CookieError::NotACookie(path.to_owned()));
        }
        Ok(Cookie(text.into()))
    }

    /// The secret, as sent.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The `Authorization` header value.
    pub fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `offered` is this cookie, in time independent of where they differ.
    fn matches(&self, offered: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        offered.len() == mine.len()
            && offered
                .iter()
                .zip(mine)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The middleware: a request without the cookie gets 401 `unauthorized`, nothing else.
pub async fn require(State(cookie): State<Cookie>, req: Request, next: Next) -> Response {
    let offered = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    match offered {
        Some(o) if cookie.matches(o) => next.run(req).await,
        _ => ApiError::Unauthorized.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_the_owners_only_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let c = Cookie::create(dir.path()).unwrap();
        let path = dir.path().join(COOKIE_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Cookie::read(&path).unwrap(), c);
        assert!(c.matches(c.secret().as_bytes()));
        assert!(!c.matches(b"nope"));
        let again = Cookie::create(dir.path()).unwrap();
        assert_ne!(again, c, "fresh at every start");
        assert!(!format!("{c:?}").contains(c.secret()));
        std::fs::write(&path, "not a cookie").unwrap();
        let err = Cookie::read(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        let gone = dir.path().join("gone");
        let err = Cookie::read(&gone).unwrap_err().to_string();
        assert!(err.contains(&gone.display().to_string()), "{err}");
    }
}
