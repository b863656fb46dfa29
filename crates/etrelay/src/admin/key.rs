//! The server key (its file and fingerprint), and the other secrets the admin tool reads from
//! files: the relay token and the rcon password.

use std::io;
use std::path::Path;

use rand::RngCore as _;

use super::error::AdminError;
use crate::proof::MIN_KEY as MIN_KEY_LEN;
pub(crate) use crate::proof::fingerprint;

/// Random bytes of a new key (written as twice as many hex characters).
const KEY_BYTES: usize = 32;

/// Reads the key from `path`, or creates it there (mode 0600) when the file does not exist.
///
/// Returns the key and whether it was just created.
pub(crate) fn load_or_create(path: &Path) -> Result<(String, bool), AdminError> {
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok((check_key(path, &text)?, false)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(AdminError::ReadFile {
                path: path.to_owned(),
                source,
            });
        }
    }
    let key = new_key();
    match write_new(path, &key) {
        Ok(()) => Ok((key, true)),
        // Another run created it in between: use that one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok((load(path)?, false)),
        Err(source) => Err(AdminError::CreateKey {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Reads the key from `path`, which must exist.
pub(crate) fn load(path: &Path) -> Result<String, AdminError> {
    match std::fs::read_to_string(path) {
        Ok(text) => check_key(path, &text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(AdminError::NoKey {
            path: path.to_owned(),
        }),
        Err(source) => Err(AdminError::ReadFile {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Reads the relay token from `path` (trimmed).
pub(crate) fn read_token(path: &Path) -> Result<String, AdminError> {
    let text = read(path)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(bad_file(path, "the relay token file is empty"));
    }
    if !is_header_safe(token) {
        return Err(bad_file(
            path,
            "the relay token must be printable ASCII with no spaces",
        ));
    }
    Ok(token.to_owned())
}

/// Reads the rcon password from `path` (trimmed). One with whitespace, `"` or control
/// characters is refused: it could not travel as the single word `rcon <password> …` needs.
pub(crate) fn read_rcon_password(path: &Path) -> Result<String, AdminError> {
    let text = read(path)?;
    let password = text.trim();
    if password.is_empty() {
        return Err(bad_file(path, "the rcon password file is empty"));
    }
    if password
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '"')
    {
        return Err(bad_file(
            path,
            "the rcon password must not contain spaces, `\"` or control characters (rcon would not pass it as one word)",
        ));
    }
    Ok(password.to_owned())
}

fn check_key(path: &Path, text: &str) -> Result<String, AdminError> {
    let key = text.trim();
    if key.chars().count() < MIN_KEY_LEN {
        return Err(bad_file(
            path,
            "the key is shorter than 32 characters: fix the file, or delete it to get a new key (then register again)",
        ));
    }
    if !is_header_safe(key) {
        return Err(bad_file(
            path,
            "the key must be printable ASCII with no spaces: fix the file, or delete it to get a new key (then register again)",
        ));
    }
    Ok(key.to_owned())
}

fn new_key() -> String {
    let mut bytes = [0u8; KEY_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Writes a new key file (mode 0600, never over an existing one), durably.
fn write_new(path: &Path, key: &str) -> io::Result<()> {
    guard::statefile::create_new_private(path, format!("{key}\n").as_bytes())
}

fn read(path: &Path) -> Result<String, AdminError> {
    std::fs::read_to_string(path).map_err(|source| AdminError::ReadFile {
        path: path.to_owned(),
        source,
    })
}

fn bad_file(path: &Path, reason: &str) -> AdminError {
    AdminError::BadFile {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Visible ASCII only: fits an `Authorization` header as is.
fn is_header_safe(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn creates_a_new_key_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let (key, created) = load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(key.len(), 64);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), key);
    }

    #[test]
    fn reuses_an_existing_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let (first, created) = load_or_create(&path).unwrap();
        assert!(created);
        let (second, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(first, second);
        assert_eq!(load(&path).unwrap(), first);

        // A key written by hand, with surrounding whitespace, is used as is (trimmed).
        let other = dir.path().join("other");
        std::fs::write(&other, "  my-own-key-that-is-long-enough-1234567\n").unwrap();
        let (key, created) = load_or_create(&other).unwrap();
        assert!(!created);
        assert_eq!(key, "my-own-key-that-is-long-enough-1234567");
    }

    #[test]
    fn two_keys_differ() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = load_or_create(&dir.path().join("a")).unwrap();
        let (b, _) = load_or_create(&dir.path().join("b")).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn refuses_a_short_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, format!("{}\n", "a".repeat(31))).unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert!(matches!(err, AdminError::BadFile { .. }), "{err:?}");
        assert!(err.to_string().contains("shorter than 32"), "{err}");
        let err = load(&path).unwrap_err();
        assert!(matches!(err, AdminError::BadFile { .. }), "{err:?}");
        // The short key was not replaced.
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().trim(),
            "a".repeat(31)
        );

        // Exactly 32 is fine.
        std::fs::write(&path, "b".repeat(32)).unwrap();
        assert_eq!(load(&path).unwrap(), "b".repeat(32));
    }

    #[test]
    fn refuses_a_key_with_spaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "0123456789abcdef 0123456789abcdef").unwrap();
        assert!(matches!(load(&path), Err(AdminError::BadFile { .. })));
    }

    #[test]
    fn missing_key_file_for_key_routes() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(err, AdminError::NoKey { .. }), "{err:?}");
        assert!(err.to_string().contains("etrelay admin register"), "{err}");
    }

    #[test]
    fn key_in_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_or_create(&dir.path().join("no/such/dir/key")).unwrap_err();
        assert!(matches!(err, AdminError::CreateKey { .. }), "{err:?}");
    }

    #[test]
    fn fingerprint_of_a_known_key() {
        // printf '%s' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef | sha256sum
        // a8ae6e6ee929abea3afcfc5258c8ccd6f85273e0d4626d26c7279f3250f77c8e
        let key = "0123456789abcdef".repeat(4);
        assert_eq!(fingerprint(&key), "a8ae6e6ee929abea3afcfc5258c8ccd6");
    }

    #[test]
    fn token_and_password_files() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "  the-relay-token-0123456789abcdefghij\n").unwrap();
        assert_eq!(
            read_token(&token).unwrap(),
            "the-relay-token-0123456789abcdefghij"
        );
        std::fs::write(&token, "\n").unwrap();
        assert!(matches!(
            read_token(&token),
            Err(AdminError::BadFile { .. })
        ));
        assert!(matches!(
            read_token(&dir.path().join("missing")),
            Err(AdminError::ReadFile { .. })
        ));

        let pass = dir.path().join("rcon");
        std::fs::write(&pass, "s3cret\n").unwrap();
        assert_eq!(read_rcon_password(&pass).unwrap(), "s3cret");
        for bad in ["two words", "quo\"te", "tab\there", "", "  \n"] {
            std::fs::write(&pass, bad).unwrap();
            assert!(
                matches!(read_rcon_password(&pass), Err(AdminError::BadFile { .. })),
                "{bad:?} accepted"
            );
        }
    }
}
