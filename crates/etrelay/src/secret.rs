//! Secrets that must never reach a log: the relay token, server keys, rcon passwords (and the
//! relay token's hash). [`Secret`]'s `Debug` shows that a value is there, never the value.

use std::fmt;

use serde::Deserialize;

/// A secret value; `{:?}` prints `Secret(***)`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret<T = String>(T);

impl<T> Secret<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Secret(value)
    }

    /// The value itself, for the one place that uses it.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_value() {
        let s = Secret::new("hunter2".to_string());
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(format!("{:?}", Some(&s)), "Some(Secret(***))");
        assert_eq!(s.expose(), "hunter2");
        let parsed: Secret = serde_json::from_str("\"k\"").unwrap();
        assert_eq!(parsed.expose(), "k");
    }
}
