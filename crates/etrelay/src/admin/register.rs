//! Registering a game server with the relay: the proof through rcon, `PUT /server` with the
//! relay token, the proof cleared again. `etrelay admin register` does it on request; the key
//! commands do it by themselves when the relay answers 401 and they were given the means
//! ([`Again`]).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Client, ControlUrl, Reply, Route};
use super::error::AdminError;
use super::rcon::{Rcon, Timing};
use super::{RegisterArgs, ServerArgs, key, note, pretty, table, warn};

/// What a key command needs to register again by itself: `register`'s flags but the key file
/// and control URL, which the command has already. All four, or it explains what to run.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Again {
    /// File holding the relay token: with --upstream, --rcon and --rcon-password-file, the
    /// command registers again by itself when the relay does not know the key, then retries.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The game server's address as the relay reaches it (for registering again).
    #[arg(long, value_name = "ADDR")]
    pub upstream: Option<SocketAddr>,

    /// Public port to ask for when registering again (default: the first free one).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,

    /// The game server's address for rcon from this machine (for registering again).
    #[arg(long, value_name = "ADDR")]
    pub rcon: Option<String>,

    /// File holding the game server's rcon password (for registering again).
    #[arg(long, value_name = "FILE")]
    pub rcon_password_file: Option<PathBuf>,
}

/// Everything one registration needs.
struct Means<'a> {
    control: &'a ControlUrl,
    token_file: &'a Path,
    upstream: SocketAddr,
    port: Option<u16>,
    rcon: &'a str,
    rcon_password_file: &'a Path,
}

/// `etrelay admin register`.
pub(super) async fn register(args: &RegisterArgs, timing: Timing) -> Result<String, AdminError> {
    let (key, created) = key::load_or_create(&args.key_file)?;
    let means = Means {
        control: &args.control,
        token_file: &args.token_file,
        upstream: args.upstream,
        port: args.port,
        rcon: &args.rcon,
        rcon_password_file: &args.rcon_password_file,
    };
    let reply = match register_key(&key, &means, timing).await {
        Ok(reply) => reply,
        Err(e) => {
            // The relay did not take it: a key it never saw is no identity, leave none behind.
            if created && let Err(rm) = std::fs::remove_file(&args.key_file) {
                warn(&format!(
                    "could not remove the new key {} ({rm}): delete it by hand",
                    args.key_file.display()
                ));
            }
            return Err(e);
        }
    };
    if created {
        note(&format!(
            "created a new key in {} (keep it: it is this server's identity on the relay)",
            args.key_file.display()
        ));
    }
    if args.json {
        return Ok(pretty(reply.body.as_ref()));
    }
    Ok(format!("{}\n", registered(&reply, args.upstream)))
}

/// `registered 10.0.0.2:27960 on port 27960 (new)`, and why it is not relayed yet if it is not.
fn registered(reply: &Reply, upstream: SocketAddr) -> String {
    let body = reply.body.clone().unwrap_or(Value::Null);
    let upstream = body
        .get("upstream")
        .and_then(Value::as_str)
        .map_or_else(|| upstream.to_string(), table::clean);
    let how = match reply.status {
        StatusCode::CREATED => " (new)",
        StatusCode::OK => " (taken over)",
        _ => "",
    };
    let mut out = match body.get("port").and_then(Value::as_u64) {
        Some(port) => format!("registered {upstream} on port {port}{how}"),
        None => format!("registered {upstream}{how}"),
    };
    if body.get("relaying") == Some(&Value::Bool(false)) {
        let why = body.get("error").and_then(Value::as_str).unwrap_or("?");
        let _ = write!(
            out,
            "; not relayed yet: {} (the relay tries the port again by itself)",
            table::clean(why)
        );
    }
    out
}

/// Shows the key's fingerprint through rcon, sends `PUT /server`, clears the fingerprint.
async fn register_key(key: &str, means: &Means<'_>, timing: Timing) -> Result<Reply, AdminError> {
    let token = key::read_token(means.token_file)?;
    let password = key::read_rcon_password(means.rcon_password_file)?;
    let fingerprint = key::fingerprint(key);
    let client = Client::new(means.control)?;
    let rcon_addr = resolve(means.rcon).await?;

    let mut rcon = Rcon::connect(rcon_addr, password, timing).await?;
    rcon.run(&format!("sets etrelay_proof {fingerprint}"))
        .await?;

    let mut body = json!({"key": key, "upstream": means.upstream.to_string()});
    if let Some(port) = means.port {
        body["port"] = json!(port);
    }
    let result = client
        .call(
            Method::PUT,
            "/server",
            &token,
            Some(&body),
            Route::Register { port: means.port },
        )
        .await;

    // Whatever the relay said: an empty cvar leaves serverinfo.
    if let Err(e) = rcon.run("sets etrelay_proof \"\"").await {
        warn(&format!(
            "could not clear etrelay_proof on the game server ({e}): clear it with `sets etrelay_proof \"\"` on its console"
        ));
    }
    result
}

/// `--rcon`: a literal address, or a host name resolved once.
async fn resolve(addr: &str) -> Result<SocketAddr, AdminError> {
    if let Ok(addr) = addr.parse() {
        return Ok(addr);
    }
    let error = |reason: String| AdminError::RconResolve {
        addr: addr.to_owned(),
        reason,
    };
    let mut found = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| error(e.to_string()))?;
    found.next().ok_or_else(|| error("no address found".into()))
}

/// True for the relay's 401 on a key route: it does not know the key.
pub(super) fn unknown_key(e: &AdminError) -> bool {
    matches!(e, AdminError::Api { status: 401, code, .. } if code == "unauthorized")
}

/// The relay does not know the key: registers again with the means `args` has, saying so on
/// stderr; or, without them, fails with the exact command to run.
pub(super) async fn again(args: &ServerArgs, key: &str, timing: Timing) -> Result<(), AdminError> {
    let a = &args.again;
    let (Some(token_file), Some(upstream), Some(rcon), Some(rcon_password_file)) = (
        a.token_file.as_deref(),
        a.upstream,
        a.rcon.as_deref(),
        a.rcon_password_file.as_deref(),
    ) else {
        return Err(AdminError::KeyUnknown {
            run: command_to_run(args),
        });
    };
    note(&format!(
        "the relay does not know this key (it lost its state, or the server left or was taken over): registering again as {upstream}"
    ));
    let means = Means {
        control: &args.control,
        token_file,
        upstream,
        port: a.port,
        rcon,
        rcon_password_file,
    };
    let reply = register_key(key, &means, timing).await?;
    note(&format!(
        "{}; trying the command again",
        registered(&reply, upstream)
    ));
    Ok(())
}

/// `etrelay admin register …` with what `args` knows, and a placeholder for the rest.
fn command_to_run(args: &ServerArgs) -> String {
    let a = &args.again;
    let or = |v: Option<String>, placeholder: &str| v.unwrap_or_else(|| placeholder.to_owned());
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let mut run = format!(
        "etrelay admin register --control {} --key-file {} --token-file {} --upstream {} --rcon {} --rcon-password-file {}",
        args.control,
        args.key_file.display(),
        or(path(&a.token_file), "<RELAY_TOKEN_FILE>"),
        or(a.upstream.map(|u| u.to_string()), "<IP:PORT>"),
        or(a.rcon.clone(), "<ADDR>"),
        or(path(&a.rcon_password_file), "<RCON_PASSWORD_FILE>"),
    );
    if let Some(port) = a.port {
        let _ = write!(run, " --port {port}");
    }
    table::clean(&run)
}
