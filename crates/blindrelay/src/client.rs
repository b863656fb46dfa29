//! The operator's commands, `blindrelay send | inbox | status`: an HTTP client of the local
//! node's operator API. Answers are read into the server's own types ([`Sent`], [`InboxList`],
//! [`Document`], [`ErrorBody`]), never indexed by string.
//!
//! One [`Client`] per command: its HTTP client is built once, with the cookie and the timeout,
//! and used for every request. Errors never carry reqwest's text: it holds the URL (the
//! operator endpoint, and for `send` the terminal's full id), which must not be printed; they
//! name the flag instead.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::api::cookie::{Cookie, CookieError};
use crate::api::{Deleted, InboxList, Sent};
use crate::health::Bucket;
use crate::proto::answer::ErrorBody;
use crate::status::{Document, Evidence};

/// The `send` file that means standard input.
pub const STDIN: &str = "-";
/// How long one request to the operator API may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The status document as the client reads it: counters by name.
type Status = Document<BTreeMap<String, Option<u64>>>;

/// Prints a line to standard output; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// Why an operator's command failed, naming the flag or file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The operator cookie (`--state-dir`, `--cookie-file`).
    #[error(transparent)]
    Cookie(#[from] CookieError),
    /// The HTTP client could not be built.
    #[error("cannot make the HTTP client for --operator: {0}")]
    Build(&'static str),
    /// The message file (or standard input) cannot be read.
    #[error("the message file {file}: {kind}")]
    Message {
        /// The file as given (`-`: standard input).
        file: String,
        /// What the file system said.
        kind: std::io::ErrorKind,
    },
    /// The operator API did not answer as it should.
    #[error("operator API (--operator): {0}")]
    Operator(&'static str),
    /// The node answered, but did not deliver.
    #[error("not delivered: {0}")]
    NotDelivered(String),
    /// `inbox --read`, `--delete`: no message with this id.
    #[error("no message {0}")]
    NoMessage(u64),
    /// `inbox --take` on an empty inbox.
    #[error("inbox empty")]
    InboxEmpty,
    /// `inbox --take`: printed, but the delete failed.
    #[error("message {0} printed but not deleted")]
    NotDeleted(u64),
    /// Standard output cannot be written.
    #[error("standard output: {0}")]
    Output(std::io::ErrorKind),
}

/// An operator API failure, classified, without reqwest's text.
impl From<reqwest::Error> for ClientError {
    fn from(e: reqwest::Error) -> Self {
        ClientError::Operator(if e.is_timeout() {
            "timed out"
        } else if e.is_connect() {
            "cannot connect"
        } else if e.is_decode() {
            "answered something that is not JSON"
        } else {
            "request failed"
        })
    }
}

/// The local node's operator API, as one command uses it.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client of the operator API at `operator` (`--operator`), authenticated by the cookie
    /// read from `cookie`.
    ///
    /// # Errors
    /// The cookie cannot be read, or the HTTP client cannot be built.
    pub fn new(operator: &str, cookie: &Path) -> Result<Client, ClientError> {
        let cookie = Cookie::read(cookie)?;
        let auth = reqwest::header::HeaderValue::from_str(&cookie.header())
            .map_err(|_| ClientError::Build("the cookie is not a header value"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, auth);
        crate::links::install_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .default_headers(headers)
            .timeout(TIMEOUT)
            .build()
            .map_err(|_| ClientError::Build("no TLS backend or resolver"))?;
        Ok(Client {
            http,
            base: operator.trim_end_matches('/').to_string(),
        })
    }

    /// `blindrelay send`: sends `file` ([`STDIN`]: standard input) to `to` over `hops` hops;
    /// `Ok` only on a verified delivery.
    ///
    /// # Errors
    /// What went wrong, in words for the operator.
    pub async fn send(&self, to: &str, hops: usize, file: &str) -> Result<(), ClientError> {
        let unreadable = |e: std::io::Error| ClientError::Message {
            file: file.to_string(),
            kind: e.kind(),
        };
        let mut payload = Vec::new();
        if file == STDIN {
            std::io::stdin()
                .read_to_end(&mut payload)
                .map_err(unreadable)?;
        } else {
            payload = std::fs::read(file).map_err(unreadable)?;
        }
        let url = format!("{}/v1/send?to={to}&hops={hops}", self.base);
        let resp = self.http.post(url).body(payload).send().await?;
        if !resp.status().is_success() {
            let err: ErrorBody<'static> = resp.json().await?;
            let why = err.message.as_deref().unwrap_or(&err.error);
            return Err(ClientError::NotDelivered(why.to_string()));
        }
        let sent: Sent = resp.json().await?;
        if !sent.delivered {
            return Err(ClientError::NotDelivered("unknown error".into()));
        }
        let d = sent.delivery;
        let again = match d.routes {
            0 | 1 => String::new(),
            n => format!(" (route {n}: the ones before it failed; stored once)"),
        };
        say!(
            "delivered to {} over {} hop{}, receipt verified{again}",
            d.terminal,
            d.hops,
            if d.hops == 1 { "" } else { "s" }
        );
        Ok(())
    }

    /// `blindrelay inbox`: the listing (a table, or JSON), or with `read` one item's raw bytes.
    ///
    /// # Errors
    /// What went wrong, in words for the operator.
    pub async fn inbox(&self, read: Option<u64>, json: bool) -> Result<(), ClientError> {
        if let Some(id) = read {
            let bytes = self.message(id).await?;
            return std::io::stdout()
                .write_all(&bytes)
                .map_err(|e| ClientError::Output(e.kind()));
        }
        if json {
            return self.print_json("/v1/inbox").await;
        }
        let list: InboxList = self.get_json("/v1/inbox").await?;
        if list.items.is_empty() {
            say!("inbox empty");
        }
        say!("{:>6}  {:>12}  {:>8}", "ID", "RECEIVED", "BYTES");
        for it in list.items {
            say!("{:>6}  {:>12}  {:>8}", it.id, it.received_at, it.size);
        }
        Ok(())
    }

    /// `blindrelay inbox --delete ID`.
    ///
    /// # Errors
    /// What went wrong, in words for the operator.
    pub async fn inbox_delete(&self, id: u64) -> Result<(), ClientError> {
        let resp = self.delete(id).await?;
        if !resp.status().is_success() {
            return Err(ClientError::NoMessage(id));
        }
        let d: Deleted = resp.json().await?;
        say!("deleted message {} ({} bytes)", d.deleted, d.size);
        Ok(())
    }

    /// `blindrelay inbox --take`: the oldest message's bytes to standard output, then deleted.
    ///
    /// # Errors
    /// The inbox is empty, or what went wrong.
    pub async fn inbox_take(&self) -> Result<(), ClientError> {
        let list: InboxList = self.get_json("/v1/inbox").await?;
        let Some(first) = list.items.first() else {
            return Err(ClientError::InboxEmpty);
        };
        let bytes = self.message(first.id).await?;
        std::io::stdout()
            .write_all(&bytes)
            .and_then(|()| std::io::stdout().flush())
            .map_err(|e| ClientError::Output(e.kind()))?;
        if !self.delete(first.id).await?.status().is_success() {
            return Err(ClientError::NotDeleted(first.id));
        }
        Ok(())
    }

    /// `blindrelay status`: the status document as tables, or as JSON.
    ///
    /// # Errors
    /// What went wrong, in words for the operator.
    pub async fn status(&self, json: bool) -> Result<(), ClientError> {
        if json {
            return self.print_json("/v1/status").await;
        }
        render_status(&self.get_json::<Status>("/v1/status").await?);
        Ok(())
    }

    /// Inbox message `id`'s bytes.
    async fn message(&self, id: u64) -> Result<axum::body::Bytes, ClientError> {
        let url = format!("{}/v1/inbox/{id}", self.base);
        let resp = self.http.get(url).send().await?;
        if !resp.status().is_success() {
            return Err(ClientError::NoMessage(id));
        }
        Ok(resp.bytes().await?)
    }

    /// Deletes inbox message `id`.
    async fn delete(&self, id: u64) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}/v1/inbox/{id}", self.base);
        Ok(self.http.delete(url).send().await?)
    }

    /// The JSON answer to `GET` of `path`.
    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.http.get(format!("{}{path}", self.base)).send().await?;
        Ok(resp.json().await?)
    }

    /// Prints the JSON the node answered to `GET` of `path`, pretty.
    async fn print_json(&self, path: &str) -> Result<(), ClientError> {
        let v: serde_json::Value = self.get_json(path).await?;
        say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        Ok(())
    }
}

/// The status document as readable tables.
fn render_status(doc: &Status) {
    render_summary(doc);
    render_evidence(doc);
    render_peers(doc);
}

/// The node's status, why, what to do, its stores and admission.
fn render_summary(doc: &Status) {
    let ps = doc.peer_store();
    let (q, s) = (&ps.blind_relay_quality, &ps.runtime);
    say!(
        "node {}   status {}   proof scope {}   real relay ready {}",
        doc.node,
        q.status,
        q.proof_scope,
        q.real_relay_ready
    );
    say!("  why:  {}", q.reason);
    say!("  next: {}", q.next_action);
    say!(
        "  inbox {}/{} items, {}/{} bytes{}   replay {}/{} routes{}",
        s.inbox.items,
        s.inbox.max_items,
        s.inbox.bytes,
        s.inbox.max_bytes,
        if s.inbox.full { " FULL" } else { "" },
        s.replay.live_routes,
        s.replay.capacity,
        if s.replay.full { " FULL" } else { "" },
    );
    say!(
        "  admission {} in flight, {} connections, {} sources",
        s.admission.in_flight,
        s.admission.connections,
        s.admission.sources
    );
}

/// The evidence of relaying, then the counters.
fn render_evidence(doc: &Status) {
    let ps = doc.peer_store();
    let (q, s) = (&ps.blind_relay_quality, &ps.runtime);
    say!("");
    say!(
        "{:<28} {:>8} {:>12} {:>6}",
        "EVIDENCE",
        "TOTAL",
        "LAST",
        "FRESH"
    );
    let evidence: [(&str, &Evidence); 4] = [
        ("relay_acceptance", &q.relay_acceptance),
        ("synthetic_probes", &q.synthetic_probes),
        ("synthetic_two_hop_probes", &q.synthetic_two_hop_probes),
        ("client_delivery_receipts", &q.client_delivery_receipts),
    ];
    for (k, e) in evidence {
        let last = e.last_at.map_or("never".to_string(), |x| x.to_string());
        say!("{:<28} {:>8} {:>12} {:>6}", k, e.total, last, e.fresh);
    }
    say!("");
    say!("COUNTERS");
    for (k, val) in s
        .blind_relay
        .iter()
        .filter(|(k, _)| !k.starts_with("last_"))
    {
        say!("  {k:<34} {}", val.unwrap_or(0));
    }
}

/// Peer health: the summary, a warning on identity changes, a row per peer.
fn render_peers(doc: &Status) {
    let ps = doc.peer_store();
    let (h, s) = (&ps.peer_health_summary, &ps.runtime);
    say!("");
    if s.peers.identity_changes > 0 {
        say!(
            "WARNING  {} descriptors refused: a --peer URL answered with another identity than \
             the one pinned to it (see the log)",
            s.peers.identity_changes
        );
    }
    let gossip_at = s
        .peers
        .last_gossip_at
        .map_or("never".to_string(), |t| t.to_string());
    say!(
        "STORE  {} routable, {} in routes; {} from --peer, {} from gossip (last answer \
         {gossip_at}), {} from the peer store",
        s.peers.routable,
        s.peers.in_routes,
        s.peers.bootstrap,
        s.peers.gossip,
        s.peers.cache
    );
    say!(
        "PEERS  {} known: {} healthy, {} degraded, {} failing, {} quarantined, {} unknown",
        h.total_peers,
        h.healthy,
        h.degraded,
        h.failing,
        h.quarantined,
        h.unknown
    );
    say!(
        "{:<10} {:<12} {:<10} {:<10} {:<8} {:<8} {:<8} {:<6} {:>6} {:>6} {:>10}  REASONS",
        "NODE",
        "HEALTH",
        "DESCRIPTOR",
        "SOURCE",
        "GOSSIP",
        "CONTACT",
        "ROUTE OK",
        "ROUTES",
        "OK",
        "FAIL",
        "QUARANTINE"
    );
    for r in &h.rows {
        say!(
            "{:<10} {:<12} {:<10} {:<10} {:<8} {:<8} {:<8} {:<6} {:>6} {:>6} {:>10}  {}{}",
            r.node,
            r.health,
            r.descriptor,
            r.source.as_deref().unwrap_or("-"),
            r.last_gossip,
            r.last_contact,
            r.last_route_success,
            if r.in_routes { "yes" } else { "no" },
            r.route_successes,
            r.route_failures,
            r.quarantine_remaining_secs,
            reasons(&r.reasons),
            if r.share_cut {
                "  (crypto share cut)"
            } else {
                ""
            }
        );
    }
    render_strangers(&h.strangers);
}

/// Every previous hop that is no known peer, on one line (none: no line).
fn render_strangers(st: &crate::health::StrangersRow) {
    if st.identities > 0 {
        say!(
            "STRANGERS  {} identities with no descriptor here ({} quarantined, {} with their \
             share cut), {} refusals, last contact {}  {}",
            st.identities,
            st.quarantined,
            st.share_cut,
            st.refusals,
            st.last_contact,
            reasons(&st.reasons)
        );
    }
}

/// Reason buckets as `name=count`, by name.
fn reasons(r: &std::collections::BTreeMap<Bucket, u64>) -> String {
    let mut by_name: Vec<_> = r.iter().map(|(b, n)| (b.as_str(), n)).collect();
    by_name.sort_unstable();
    by_name
        .iter()
        .map(|(b, n)| format!("{b}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_built_once_with_the_cookie_or_refused_naming_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("operator.cookie");
        let err = Client::new("http://127.0.0.1:7070", &missing).unwrap_err();
        assert!(matches!(err, ClientError::Cookie(_)), "{err:?}");
        assert!(err.to_string().contains(&missing.display().to_string()));
        Cookie::create(dir.path()).unwrap();
        let client = Client::new("http://127.0.0.1:7070/", &missing).unwrap();
        assert_eq!(client.base, "http://127.0.0.1:7070");
    }

    #[test]
    fn operator_errors_name_the_flag_not_the_url() {
        let e = ClientError::Operator("cannot connect").to_string();
        assert_eq!(e, "operator API (--operator): cannot connect");
        let e = ClientError::Message {
            file: "msg.txt".into(),
            kind: std::io::ErrorKind::NotFound,
        };
        assert!(e.to_string().contains("msg.txt"), "{e}");
    }
}
