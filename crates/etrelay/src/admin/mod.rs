//! `etrelay admin …`: the tool an ET server's admin runs next to the game server, a client of
//! the relay's control API (docs/etrelay-api.md).
//!
//! - `register` makes the relay relay this game server: it proves it holds the server's
//!   console (rcon `sets etrelay_proof <fingerprint>`), hands the relay its key with the relay
//!   token, then clears the proof.
//! - `status`, `sessions`, `bans`, `ban`, `unban`, `leave` then use the key alone. When the
//!   relay does not know the key (401: it lost its state, say), the first five register again
//!   by themselves and retry once, if given the means; otherwise they say exactly what to run.
//!
//! Layout:
//! - `key`: the key file and its fingerprint, and the other secrets read from files.
//! - `rcon`: rcon to the game server over UDP.
//! - `register`: registering (with proof), and registering again by itself when a key route
//!   answers 401 and the command was given the means (`--token-file`, `--upstream`, `--rcon`,
//!   `--rcon-password-file`).
//! - `client`: the HTTP client of the control API.
//! - `api`: the API's answers, as this tool shows them.
//! - `table`: human output.
//! - `error`: [`AdminError`], what the user is told.

mod api;
mod client;
mod error;
mod key;
mod rcon;
mod register;
mod table;

use std::io::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

pub use self::client::ControlUrl;
use self::client::{Client, Route};
pub use self::error::AdminError;
use self::rcon::Timing;
pub use self::register::Again;

/// `etrelay admin …` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Register this game server with the relay (or take it over with a new key).
    ///
    /// Creates the key file if it does not exist, shows the key's fingerprint in the game
    /// server's `etrelay_proof` cvar through rcon, sends `PUT /server` with the relay token,
    /// then clears the cvar again.
    Register(RegisterArgs),
    /// Show the registration and whether the game server answered the relay's last probe.
    Status(ServerArgs),
    /// List the open sessions: each player's real address and the port the game server sees.
    Sessions(ServerArgs),
    /// List the bans.
    Bans(ServerArgs),
    /// Ban an IP address: cuts its sessions at once and drops its packets.
    Ban(BanArgs),
    /// Lift the ban of an IP address.
    Unban(UnbanArgs),
    /// Leave the relay: flatline to the masters, free the port, drop sessions and bans.
    Leave(ServerArgs),
}

/// Flags of `etrelay admin register`.
#[derive(Debug, clap::Args)]
pub struct RegisterArgs {
    /// The relay's control API, `http://ip:port` (plain HTTP, on the tunnel).
    #[arg(long, value_name = "URL")]
    pub control: ControlUrl,

    /// File holding the relay token (the relay's `--token-file`).
    #[arg(long, value_name = "FILE")]
    pub token_file: PathBuf,

    /// The game server's address as the relay reaches it, a literal `ip:port`.
    #[arg(long, value_name = "ADDR")]
    pub upstream: SocketAddr,

    /// Public port to ask for, one of the relay's `--ports` (default: the first free one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,

    /// The game server's address for rcon from this machine, `ip:port` or `host:port`.
    #[arg(long, value_name = "ADDR")]
    pub rcon: String,

    /// File holding the game server's rcon password (`rconpassword`).
    #[arg(long, value_name = "FILE")]
    pub rcon_password_file: PathBuf,

    /// File holding this server's key; created (mode 0600, 64 random hex characters) if it
    /// does not exist. Keep it: the other commands need it.
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,

    /// Print the API's JSON answer instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Flags of the commands that use the server's key.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The relay's control API, `http://ip:port` (plain HTTP, on the tunnel).
    #[arg(long, value_name = "URL")]
    pub control: ControlUrl,

    /// File holding this server's key (written by `etrelay admin register`).
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,

    /// Print the API's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,

    #[command(
        flatten,
        next_help_heading = "Registering again when the relay does not know the key"
    )]
    pub again: Again,
}

/// Flags of `etrelay admin ban`.
#[derive(Debug, clap::Args)]
pub struct BanArgs {
    /// The IP address to ban (IPv4 or IPv6).
    #[arg(value_name = "IP")]
    pub ip: IpAddr,

    /// Why, kept with the ban and shown by `bans`.
    #[arg(long, value_name = "R")]
    pub reason: Option<String>,

    /// How long (humantime: `30m`, `1h`, `7days`); default: for good.
    #[arg(long, value_name = "DURATION", value_parser = parse_ban_duration, allow_hyphen_values = true)]
    pub duration: Option<Duration>,

    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `etrelay admin unban`.
#[derive(Debug, clap::Args)]
pub struct UnbanArgs {
    /// The IP address whose ban to lift.
    #[arg(value_name = "IP")]
    pub ip: IpAddr,

    #[command(flatten)]
    pub server: ServerArgs,
}

/// Runs one admin command and prints its result to stdout (warnings to stderr).
///
/// # Errors
///
/// Whatever stopped the command, as one line for the user (see [`AdminError`]); the caller
/// prints it and exits with a failure status.
pub async fn run(cmd: AdminCommand) -> Result<(), AdminError> {
    let out = execute(cmd, Timing::default()).await?;
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(AdminError::Output)
}

/// Runs one command, and returns what to print.
async fn execute(cmd: AdminCommand, timing: Timing) -> Result<String, AdminError> {
    match cmd {
        AdminCommand::Register(args) => register::register(&args, timing).await,
        AdminCommand::Status(args) => status(&args).await,
        AdminCommand::Sessions(args) => sessions(&args).await,
        AdminCommand::Bans(args) => bans(&args).await,
        AdminCommand::Ban(args) => ban(&args).await,
        AdminCommand::Unban(args) => unban(&args).await,
        AdminCommand::Leave(args) => leave(&args).await,
    }
}

fn warn(text: &str) {
    let _ = writeln!(io::stderr(), "warning: {text}");
}

fn note(text: &str) {
    let _ = writeln!(io::stderr(), "{text}");
}

/// A request with the server's key. A 401 (the relay does not know the key) registers again
/// and retries once when `args` has the means ([`register::Again`]); `leave` does not.
async fn key_call(
    args: &ServerArgs,
    method: Method,
    path: &str,
    body: Option<&Value>,
    route: Route,
) -> Result<Option<Value>, AdminError> {
    let key = key::load(&args.key_file)?;
    let client = Client::new(&args.control)?;
    let leaving = method == Method::DELETE && path == "/server";
    match client.call(method.clone(), path, &key, body, route).await {
        Err(e) if register::unknown_key(&e) && !leaving => {
            register::again(args, &key, Timing::default()).await?;
            let reply = client.call(method, path, &key, body, route).await?;
            Ok(reply.body)
        }
        r => Ok(r?.body),
    }
}

/// The JSON answer, pretty; nothing for an empty answer.
fn pretty(body: Option<&Value>) -> String {
    match body {
        Some(body) => {
            let text = serde_json::to_string_pretty(body)
                .expect("invariant: a serde_json::Value always serializes");
            format!("{text}\n")
        }
        None => String::new(),
    }
}

/// Reads an answer into the type shown.
fn parse<T: serde::de::DeserializeOwned>(
    args: &ServerArgs,
    body: Option<Value>,
) -> Result<T, AdminError> {
    serde_json::from_value(body.unwrap_or(Value::Null)).map_err(|e| AdminError::BadResponse {
        url: args.control.to_string(),
        reason: e.to_string(),
    })
}

fn time_or_never(secs: Option<i64>) -> String {
    secs.map_or_else(|| "never".into(), table::utc)
}

async fn status(args: &ServerArgs) -> Result<String, AdminError> {
    let body = key_call(args, Method::GET, "/server", None, Route::Key).await?;
    if args.json {
        return Ok(pretty(body.as_ref()));
    }
    let server: api::Server = parse(args, body)?;
    let probe = &server.probe;
    let utc =
        |t: Option<i64>| t.map_or_else(|| "never".into(), |t| format!("{} UTC", table::utc(t)));
    let mut fields = vec![
        ("upstream", table::clean(&server.upstream)),
        (
            "port",
            match &server.public {
                Some(public) => format!("{} (public {})", server.port, table::clean(public)),
                None => format!(
                    "{} (not relayed: {})",
                    server.port,
                    table::clean(server.error.as_deref().unwrap_or("unknown reason"))
                ),
            },
        ),
    ];
    if let Some(bind) = server.bind.as_ref().filter(|b| b.state == "retrying") {
        fields.push((
            "bind",
            format!(
                "retrying: {} failed attempt(s), last: {}; next attempt {}",
                bind.attempts,
                table::clean(bind.last_error.as_deref().unwrap_or("?")),
                utc(bind.next_attempt_at)
            ),
        ));
    }
    fields.extend([
        ("registered", utc(Some(server.registered_at))),
        (
            "probe",
            format!(
                "{} (last probe {}, last answer {})",
                table::clean(&probe.state),
                utc(probe.last_probe_at),
                utc(probe.last_answer_at)
            ),
        ),
        ("sessions", server.sessions.to_string()),
    ]);
    if let Some(n) = server.proven_sources {
        fields.push(("proven sources", n.to_string()));
    }
    if let Some(floods) = &server.floods {
        fields.push(("pressure", pressure(floods)));
    }
    Ok(table::fields(&fields))
}

/// "none", or since when each flood goes on and what it dropped.
fn pressure(floods: &[api::Flood]) -> String {
    let Some(since) = floods.iter().map(|f| f.since).min() else {
        return "none".into();
    };
    let mut kinds: Vec<&str> = floods
        .iter()
        .map(|f| match f.kind.as_str() {
            "reflection" | "limiter" => "query",
            "joins" => "join",
            "half_open" => "session",
            _ => "other",
        })
        .collect();
    kinds.dedup();
    let what: Vec<String> = floods
        .iter()
        .map(|f| format!("{} {} dropped", table::clean(&f.kind), f.dropped))
        .collect();
    format!(
        "under a {} flood since {} UTC ({})",
        kinds.join(" and "),
        table::utc(since),
        what.join(", ")
    )
}

async fn sessions(args: &ServerArgs) -> Result<String, AdminError> {
    let body = key_call(args, Method::GET, "/sessions", None, Route::Key).await?;
    if args.json {
        return Ok(pretty(body.as_ref()));
    }
    let list: api::Sessions = parse(args, body)?;
    if list.sessions.is_empty() {
        return Ok("no sessions\n".into());
    }
    let rows: Vec<Vec<String>> = list
        .sessions
        .iter()
        .map(|s| {
            vec![
                table::clean(&s.client),
                s.upstream_port.to_string(),
                table::utc(s.opened_at),
                table::utc(s.last_seen_at),
                format!("{}/{}", s.packets_up, s.packets_down),
                format!(
                    "{}/{}",
                    table::bytes(s.bytes_up),
                    table::bytes(s.bytes_down)
                ),
            ]
        })
        .collect();
    Ok(table::render(
        &[
            "CLIENT",
            "SEEN AS",
            "OPENED",
            "LAST SEEN",
            "PKTS UP/DOWN",
            "BYTES UP/DOWN",
        ],
        &rows,
    ))
}

async fn bans(args: &ServerArgs) -> Result<String, AdminError> {
    let body = key_call(args, Method::GET, "/bans", None, Route::Key).await?;
    if args.json {
        return Ok(pretty(body.as_ref()));
    }
    let list: api::Bans = parse(args, body)?;
    if list.bans.is_empty() {
        return Ok("no bans\n".into());
    }
    let rows: Vec<Vec<String>> = list
        .bans
        .iter()
        .map(|b| {
            vec![
                table::clean(&b.ip),
                reason_cell(b.reason.as_deref()),
                table::utc(b.since),
                time_or_never(b.expires_at),
            ]
        })
        .collect();
    Ok(table::render(&["IP", "REASON", "SINCE", "EXPIRES"], &rows))
}

fn reason_cell(reason: Option<&str>) -> String {
    match reason {
        Some(r) if !r.is_empty() => table::clean(r),
        _ => "-".into(),
    }
}

async fn ban(args: &BanArgs) -> Result<String, AdminError> {
    let mut body = json!({});
    if let Some(reason) = &args.reason {
        body["reason"] = json!(reason);
    }
    if let Some(duration) = args.duration {
        body["duration_secs"] = json!(duration_secs(duration)?);
    }
    let path = format!("/bans/{}", args.ip);
    let reply = key_call(
        &args.server,
        Method::PUT,
        &path,
        Some(&body),
        Route::Ban { ip: args.ip },
    )
    .await?;
    if args.server.json {
        return Ok(pretty(reply.as_ref()));
    }
    let ban: api::Ban = parse(&args.server, reply)?;
    let until = match ban.expires_at {
        Some(t) => format!("until {} UTC", table::utc(t)),
        None => "for good".into(),
    };
    let reason = match ban.reason.as_deref() {
        Some(r) if !r.is_empty() => format!(": {}", table::clean(r)),
        _ => String::new(),
    };
    Ok(format!(
        "banned {} {until}{reason}\n",
        table::clean(&ban.ip)
    ))
}

/// `--duration`: a humantime duration. A leading `-` reaches the parser (the flag takes hyphen
/// values) so that `-5m` gets its own error instead of clap's "unexpected argument '-5'".
fn parse_ban_duration(s: &str) -> Result<Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!("a duration cannot be negative: {s}"));
    }
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// Whole seconds, a started second counting as one; at least 1.
fn duration_secs(duration: Duration) -> Result<u64, AdminError> {
    let secs = duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0));
    if secs == 0 {
        return Err(AdminError::BadArgument(
            "--duration must be at least 1s (leave it out to ban for good)".into(),
        ));
    }
    Ok(secs)
}

async fn unban(args: &UnbanArgs) -> Result<String, AdminError> {
    let path = format!("/bans/{}", args.ip);
    let reply = key_call(
        &args.server,
        Method::DELETE,
        &path,
        None,
        Route::Unban { ip: args.ip },
    )
    .await?;
    if args.server.json {
        return Ok(pretty(reply.as_ref()));
    }
    Ok(format!("unbanned {}\n", args.ip))
}

async fn leave(args: &ServerArgs) -> Result<String, AdminError> {
    let reply = key_call(args, Method::DELETE, "/server", None, Route::Key).await?;
    if args.json {
        return Ok(pretty(reply.as_ref()));
    }
    Ok("left the relay: its port is freed, its sessions and bans dropped\n".into())
}

#[cfg(test)]
mod tests;
