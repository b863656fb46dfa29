//! The operator's commands, `blindrelay send | inbox | status`: an HTTP client of the local
//! node's operator API. Answers are read into the server's own types ([`Sent`], [`InboxList`],
//! [`Document`], [`ErrorBody`]), never indexed by string.
//!
//! Errors never carry reqwest's text: it holds the URL (the operator endpoint, and for `send`
//! the terminal's full id), which must not be printed.

use crate::api::cookie::Cookie;
use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::de::DeserializeOwned;

use crate::api::{Deleted, InboxList, Sent};
use crate::health::Bucket;
use crate::proto::answer::ErrorBody;
use crate::status::{Document, Evidence};

/// The `send` file that means standard input.
pub const STDIN: &str = "-";

/// The status document as the client reads it: counters by name.
type Status = Document<BTreeMap<String, Option<u64>>>;

/// Prints a line to standard output; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `blindrelay send`: sends `file` ([`STDIN`]: standard input) to `to` over `hops` hops; `Ok`
/// only on a verified delivery.
///
/// # Errors
/// What went wrong, in words for the operator.
pub async fn send(operator: &str, to: &str, hops: usize, file: &str) -> Result<(), String> {
    let mut payload = Vec::new();
    if file == STDIN {
        std::io::stdin()
            .read_to_end(&mut payload)
            .map_err(|e| format!("stdin: {e}"))?;
    } else {
        payload = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    }
    let url = format!("{}/v1/send?to={to}&hops={hops}", base(operator));
    let resp = http()
        .post(url)
        .body(payload)
        .send()
        .await
        .map_err(operator_error)?;
    if resp.status().is_success() {
        let sent: Sent = resp.json().await.map_err(operator_error)?;
        if sent.delivered {
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
            return Ok(());
        }
        return Err("not delivered: unknown error".into());
    }
    let err: ErrorBody<'static> = resp.json().await.map_err(operator_error)?;
    Err(format!(
        "not delivered: {}",
        err.message.as_deref().unwrap_or(&err.error)
    ))
}

/// `blindrelay inbox`: the listing (a table, or JSON), or with `read` one item's raw bytes.
///
/// # Errors
/// What went wrong, in words for the operator.
pub async fn inbox(operator: &str, read: Option<u64>, json: bool) -> Result<(), String> {
    let base = base(operator);
    if let Some(id) = read {
        let resp = http()
            .get(format!("{base}/v1/inbox/{id}"))
            .send()
            .await
            .map_err(operator_error)?;
        if !resp.status().is_success() {
            return Err(format!("no message {id}"));
        }
        let bytes = resp.bytes().await.map_err(operator_error)?;
        return std::io::stdout()
            .write_all(&bytes)
            .map_err(|e| e.to_string());
    }
    let url = format!("{base}/v1/inbox");
    if json {
        return print_json(&url).await;
    }
    let list: InboxList = get_json(&url).await?;
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
pub async fn inbox_delete(operator: &str, id: u64) -> Result<(), String> {
    let resp = http()
        .delete(format!("{}/v1/inbox/{id}", base(operator)))
        .send()
        .await
        .map_err(operator_error)?;
    if !resp.status().is_success() {
        return Err(format!("no message {id}"));
    }
    let d: Deleted = resp.json().await.map_err(operator_error)?;
    say!("deleted message {} ({} bytes)", d.deleted, d.size);
    Ok(())
}

/// `blindrelay inbox --take`: the oldest message's bytes to standard output, then deleted.
///
/// # Errors
/// The inbox is empty, or what went wrong.
pub async fn inbox_take(operator: &str) -> Result<(), String> {
    let base = base(operator);
    let list: InboxList = get_json(&format!("{base}/v1/inbox")).await?;
    let Some(first) = list.items.first() else {
        return Err("inbox empty".into());
    };
    let resp = http()
        .get(format!("{base}/v1/inbox/{}", first.id))
        .send()
        .await
        .map_err(operator_error)?;
    if !resp.status().is_success() {
        return Err(format!("no message {}", first.id));
    }
    let bytes = resp.bytes().await.map_err(operator_error)?;
    std::io::stdout()
        .write_all(&bytes)
        .and_then(|()| std::io::stdout().flush())
        .map_err(|e| e.to_string())?;
    let resp = http()
        .delete(format!("{base}/v1/inbox/{}", first.id))
        .send()
        .await
        .map_err(operator_error)?;
    if !resp.status().is_success() {
        return Err(format!("message {} printed but not deleted", first.id));
    }
    Ok(())
}

/// `blindrelay status`: the status document as tables, or as JSON.
///
/// # Errors
/// What went wrong, in words for the operator.
pub async fn status(operator: &str, json: bool) -> Result<(), String> {
    let url = format!("{}/v1/status", base(operator));
    if json {
        return print_json(&url).await;
    }
    render_status(&get_json::<Status>(&url).await?);
    Ok(())
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

fn base(operator: &str) -> &str {
    operator.trim_end_matches('/')
}

/// An operator API failure, classified, without reqwest's text.
fn operator_error(e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_decode() {
        "answered something that is not JSON"
    } else {
        "request failed"
    };
    format!("operator API: {what}")
}

/// The operator cookie every request of this process carries.
static COOKIE: std::sync::OnceLock<Cookie> = std::sync::OnceLock::new();

/// Reads the operator cookie at `path` for every request that follows.
///
/// # Errors
/// The file cannot be read or holds no cookie.
pub fn use_cookie(path: &std::path::Path) -> Result<(), String> {
    let cookie = Cookie::read(path)?;
    let _ = COOKIE.set(cookie);
    Ok(())
}

fn http() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(v) = COOKIE
        .get()
        .and_then(|c| reqwest::header::HeaderValue::from_str(&c.header()).ok())
    {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    crate::links::install_provider();
    reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap_or_default()
}

async fn get_json<T: DeserializeOwned>(url: &str) -> Result<T, String> {
    let resp = http().get(url).send().await.map_err(operator_error)?;
    resp.json().await.map_err(operator_error)
}

/// Prints the JSON the node answered, pretty.
async fn print_json(url: &str) -> Result<(), String> {
    let v: serde_json::Value = get_json(url).await?;
    say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    Ok(())
}
