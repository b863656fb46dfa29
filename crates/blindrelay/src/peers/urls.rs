//! `--peer` URLs: parsing them, pinning each to one identity, fetching their descriptors and
//! keeping them fresh (see the parent module's docs).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{FETCH_TIMEOUT, MAX_DESCRIPTOR_BODY, Peers, RETRY};
use crate::links::{self, Links};
use crate::proto::descriptor::Descriptor;
use crate::proto::{NodeId, Prefix};

/// One `--peer`: a URL, and the node id it must answer with (`ID@URL`), if pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// The node id pinned on the command line.
    pub pinned: Option<NodeId>,
    /// The base URL its descriptor is fetched from.
    pub url: String,
}

/// Why a `--peer` (or a seed line) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPeer {
    /// What comes before `@` is not 64 hex.
    #[error("the id before @ must be a node id (64 hex)")]
    Id,
    /// No URL.
    #[error("empty peer URL")]
    Empty,
    /// Not `https://`.
    #[error("a peer URL must be https:// (links are TLS pinned to the node id)")]
    NotHttps,
}

impl PeerSpec {
    /// Parses `ID@URL` (64 hex, then the URL) or a bare `URL` (trust on first use).
    ///
    /// # Errors
    /// [`BadPeer`], for clap, when the id is not 64 hex or the URL is empty or not https.
    pub fn parse(s: &str) -> Result<PeerSpec, BadPeer> {
        let (pinned, url) = match s.split_once('@') {
            Some((id, url)) if !id.contains('/') => {
                let id = crate::proto::from_hex::<32>(id).ok_or(BadPeer::Id)?;
                (Some(id), url)
            }
            _ => (None, s),
        };
        if url.is_empty() {
            return Err(BadPeer::Empty);
        }
        if !url.starts_with("https://") {
            return Err(BadPeer::NotHttps);
        }
        Ok(PeerSpec {
            pinned,
            url: url.trim_end_matches('/').to_string(),
        })
    }
}

/// What a URL's pinned identity says about a descriptor fetched from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pin {
    /// The identity it is pinned to.
    Matches,
    /// First use: pin it now.
    First,
    /// Another identity: refused.
    Changed,
}

impl Peers {
    /// True when a `--peer` URL is pinned to `id`.
    pub fn is_pinned(&self, id: &NodeId) -> bool {
        self.urls().iter().any(|s| s.pinned.as_ref() == Some(id))
    }

    /// Pins `id` to the `--peer` `url` if nothing pins it yet (the peer store's pin of a URL
    /// trusted on first use, read back at start).
    pub fn restore_pin(&self, url: &str, id: NodeId) {
        let mut urls = self.urls.lock().unwrap_or_else(|p| p.into_inner());
        for spec in urls
            .iter_mut()
            .filter(|s| s.url == url && s.pinned.is_none())
        {
            spec.pinned = Some(id);
        }
    }

    /// Checks `id` against the identity pinned to `--peer` number `i`; pins it on first use.
    fn pin(&self, i: usize, id: &NodeId) -> Pin {
        let mut urls = self.urls.lock().unwrap_or_else(|p| p.into_inner());
        let Some(spec) = urls.get_mut(i) else {
            return Pin::Changed;
        };
        match spec.pinned {
            Some(p) if p == *id => Pin::Matches,
            Some(_) => Pin::Changed,
            None => {
                spec.pinned = Some(*id);
                Pin::First
            }
        }
    }

    /// Fetches every `--peer` URL (a new handshake with its pinned key whenever the old
    /// connection is gone); refuses a descriptor of another identity than the one pinned to its
    /// URL.
    async fn refresh(&self, links: &Links) -> bool {
        let mut complete = true;
        for (i, spec) in self.urls().into_iter().enumerate() {
            let http = links.client(spec.pinned.as_ref());
            let Some((d, tls_key)) = fetch(&http, &spec.url).await else {
                complete = false;
                continue;
            };
            let id = d.node_id;
            if tls_key != Some(id) {
                if let Some(left_out) = self.identity_changes.refuse() {
                    warn!(
                        got = %Prefix(&id),
                        left_out,
                        "a peer's descriptor names another identity than its TLS key; refused"
                    );
                }
                complete = false;
                continue;
            }
            if d.verify(self.clock.unix()).is_err() {
                complete = false;
                continue;
            }
            match self.pin(i, &id) {
                Pin::Matches => {}
                Pin::First => info!(
                    peer = %Prefix(&id),
                    "peer identity trusted on first use (pin it with --peer ID@URL)"
                ),
                Pin::Changed => {
                    if let Some(left_out) = self.identity_changes.refuse() {
                        warn!(
                            expected = %spec.pinned.as_ref().map_or_else(String::new, |p| Prefix(p).to_string()),
                            got = %Prefix(&id),
                            left_out,
                            "a peer URL answered with another identity than the one pinned to it; refused"
                        );
                    }
                    complete = false;
                    continue;
                }
            }
            if self.insert(d) {
                debug!(peer = %Prefix(&id), "peer descriptor stored");
            } else if !self.holds(&id) {
                complete = false;
            }
        }
        complete
    }

    /// Keeps the table fresh until `cancel`.
    pub async fn run(self: Arc<Self>, http: Links, cancel: CancellationToken) {
        let mut announced = false;
        loop {
            let complete = self.refresh(&http).await;
            let first = !self.tried.swap(true, Ordering::AcqRel);
            let fetched = complete && !self.fetched.swap(true, Ordering::AcqRel);
            if first || fetched {
                self.fetched_notify.notify_waiters();
            }
            let n = self.urls().len();
            if complete && !announced && n > 0 {
                info!(peers = n, "descriptors of all peers fetched");
                announced = true;
            }
            let wait = if complete { self.refresh } else { RETRY };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Fetches a descriptor: the body read chunk by chunk, dropped as soon as it passes
/// [`MAX_DESCRIPTOR_BODY`] (declared or not), all within [`FETCH_TIMEOUT`].
async fn fetch(http: &reqwest::Client, url: &str) -> Option<(Descriptor, Option<NodeId>)> {
    let read = async {
        let mut resp = http.get(format!("{url}/v1/descriptor")).send().await.ok()?;
        let tls_key = resp
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|t| t.peer_certificate())
            .and_then(links::peer_key);
        if !resp.status().is_success()
            || resp
                .content_length()
                .is_some_and(|n| n > MAX_DESCRIPTOR_BODY as u64)
        {
            return None;
        }
        let mut body = Vec::with_capacity(MAX_DESCRIPTOR_BODY);
        while let Some(chunk) = resp.chunk().await.ok()? {
            if body.len() + chunk.len() > MAX_DESCRIPTOR_BODY {
                return None;
            }
            body.extend_from_slice(&chunk);
        }
        Some((serde_json::from_slice(&body).ok()?, tls_key))
    };
    tokio::time::timeout(FETCH_TIMEOUT, read).await.ok()?
}
