//! Why an admin command failed: [`AdminError`], one line for the user each.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why an admin command failed. Its `Display` is one line for the user.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The key file could not be created.
    #[error("cannot create the key file {}: {source}", path.display())]
    CreateKey {
        /// The key file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A command that needs the key found no key file.
    #[error("no key file at {}: run `etrelay admin register` first", path.display())]
    NoKey {
        /// The key file.
        path: PathBuf,
    },
    /// A key, token or password file holds something unusable.
    #[error("{}: {reason}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A flag's value is unusable.
    #[error("{0}")]
    BadArgument(String),
    /// The `--rcon` host name did not resolve.
    #[error("cannot resolve --rcon {addr}: {reason}")]
    RconResolve {
        /// As given.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The game server answered `Bad rconpassword.`.
    #[error(
        "the game server refused the rcon password (rcon to {addr}): check --rcon-password-file"
    )]
    RconRefused {
        /// The game server's rcon address.
        addr: SocketAddr,
    },
    /// The game server has no `rconpassword`.
    #[error("the game server at {addr} has no rcon password set: set `rconpassword` in its config")]
    RconNoPassword {
        /// The game server's rcon address.
        addr: SocketAddr,
    },
    /// No `print` answer to rcon.
    #[error(
        "no rcon answer from the game server at {addr} after {attempts} attempts{}: check --rcon (the game server's address and port from this machine)",
        if *refused { " (connection refused: nothing listens there)" } else { "" }
    )]
    RconNoReply {
        /// The game server's rcon address.
        addr: SocketAddr,
        /// Sends made.
        attempts: u32,
        /// An ICMP port unreachable came back.
        refused: bool,
    },
    /// The rcon socket failed.
    #[error("rcon to {addr}: {source}")]
    RconIo {
        /// The game server's rcon address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// No connection to the control API.
    #[error("cannot reach the control API at {url}: {reason}")]
    Unreachable {
        /// The control URL.
        url: String,
        /// Why (`Connection refused (os error 111)`).
        reason: String,
    },
    /// The control API did not answer in time.
    #[error("the control API at {url} did not answer within {secs} s")]
    Timeout {
        /// The control URL.
        url: String,
        /// The request timeout.
        secs: u64,
    },
    /// Another HTTP failure.
    #[error("request to the control API at {url} failed: {reason}")]
    Http {
        /// The control URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The control API answered with an error.
    #[error("{text}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The API's error code (`unauthorized`, `proof_failed`, …), empty if none came.
        code: String,
        /// The API's message.
        message: String,
        /// What it means for the user.
        text: String,
    },
    /// A key route answered 401 and the command cannot register again by itself.
    #[error(
        "the relay does not know this key (not registered, left, taken over by another key, or the relay lost its state): run `{run}` (or give this command --token-file, --upstream, --rcon and --rcon-password-file: it then registers again by itself)"
    )]
    KeyUnknown {
        /// The registration to run, as far as this command knows it.
        run: String,
    },
    /// A success answer this tool cannot read.
    #[error("unexpected answer from the control API at {url}: {reason}")]
    BadResponse {
        /// The control URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Standard output could not be written.
    #[error("cannot write the output: {0}")]
    Output(io::Error),
}
