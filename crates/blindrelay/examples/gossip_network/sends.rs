//! Sends over 3 hops through the operator API (`POST /v1/send`), a few at a time, then every
//! terminal's inbox read back: what was delivered, rerouted, refused, and stored how often.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use blindrelay::clock;
use rand::seq::IndexedRandom;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::Result;
use crate::net::{Net, OPERATOR_PORT};
use crate::phases::{median, met, secs};

/// Sends in flight at once.
const SENDS_AT_ONCE: usize = 8;
/// Longest wait for one send's answer (the daemon gives up on a send after 30 s).
const SEND_WAIT: Duration = Duration::from_secs(60);

/// What a batch of sends did.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    tried: usize,
    ok: usize,
    rerouted: usize,
    /// Why the others failed: the API's error code and words, with how many.
    failures: BTreeMap<String, usize>,
    times: Vec<f64>,
    /// Inbox items of this batch.
    stored: usize,
    /// Messages stored more than once.
    twice: usize,
    /// Stored, the sender told of no delivery.
    unreported: usize,
    /// Reported delivered, not found in the terminal's inbox.
    missing: usize,
}

impl Sent {
    /// Share delivered, percent.
    pub(crate) fn percent(&self) -> f64 {
        100.0 * self.ok as f64 / self.tried.max(1) as f64
    }

    /// The batch in one line, against a `target` share delivered (percent).
    pub(crate) fn line(&self, target: f64) -> String {
        let failures: Vec<String> = self
            .failures
            .iter()
            .map(|(why, n)| format!("{n} × {why}"))
            .collect();
        let max = self.times.iter().copied().fold(0.0, f64::max);
        format!(
            "{}/{} delivered ({:.1} %; target ≥ {target} %: {}), {} over more than one \
             route; failed: {}; send time median {:.2} s, max {:.2} s; inboxes: {} items of this \
             batch, {} stored twice, {} stored with no delivery reported, {} reported and not \
             found",
            self.ok,
            self.tried,
            self.percent(),
            met(self.percent() >= target),
            self.rerouted,
            if failures.is_empty() {
                "none".to_string()
            } else {
                failures.join(", ")
            },
            median(self.times.clone()),
            max,
            self.stored,
            self.twice,
            self.unreported,
            self.missing
        )
    }
}

/// One send's outcome: the routes it took, or the API's error.
type Outcome = std::result::Result<usize, String>;

/// `POST /v1/send?to=…&hops=3` on `from`'s operator API.
async fn send_one(http: reqwest::Client, url: String, cookie: String, body: String) -> Outcome {
    let resp = http
        .post(url)
        .bearer_auth(cookie.trim())
        .body(body)
        .timeout(SEND_WAIT)
        .send()
        .await
        .map_err(|e| format!("no answer ({e})"))?;
    let ok = resp.status().is_success();
    let v: Value = resp.json().await.map_err(|_| "not JSON".to_string())?;
    if ok {
        return Ok(v["routes"].as_u64().unwrap_or(1) as usize);
    }
    let code = v["error"].as_str().unwrap_or("?");
    let words = v["message"].as_str().unwrap_or("");
    // The words name hops and prefixes: keep what says why.
    let why = words.split(':').next_back().unwrap_or(words).trim();
    Err(format!("{code} ({why})"))
}

/// `count` sends over 3 hops between random pairs of `among`, [`SENDS_AT_ONCE`] at a time,
/// each message `bench {tag} {k}`; then every terminal's inbox read back.
pub(crate) async fn sends(net: &Net, among: &[usize], count: usize, tag: &str) -> Result<Sent> {
    let gate = Arc::new(Semaphore::new(SENDS_AT_ONCE));
    let mut tasks = JoinSet::new();
    let mut to_of = HashMap::new();
    for k in 0..count {
        let pair: Vec<usize> = among
            .choose_multiple(&mut rand::rng(), 2)
            .copied()
            .collect();
        let (from, to) = (&net.nodes[pair[0]], &net.nodes[pair[1]]);
        to_of.insert(k, pair[1]);
        let url = format!(
            "http://{}:{OPERATOR_PORT}/v1/send?to={}&hops=3",
            from.ip, to.id
        );
        let cookie = std::fs::read_to_string(from.dir.join("operator.cookie"))?;
        let (http, gate, body) = (
            net.http().clone(),
            Arc::clone(&gate),
            format!("bench {tag} {k}"),
        );
        tasks.spawn(async move {
            let _turn = gate.acquire_owned().await;
            let t = clock::now();
            let outcome = send_one(http, url, cookie, body).await;
            (k, outcome, secs(clock::elapsed(t)))
        });
    }
    let mut sent = Sent {
        tried: count,
        ..Sent::default()
    };
    let mut delivered = HashSet::new();
    while let Some(r) = tasks.join_next().await {
        let (k, outcome, t) = r?;
        sent.times.push(t);
        match outcome {
            Ok(routes) => {
                sent.ok += 1;
                sent.rerouted += usize::from(routes > 1);
                delivered.insert(k);
            }
            Err(why) => *sent.failures.entry(why).or_default() += 1,
        }
    }
    let terminals: HashSet<usize> = to_of.values().copied().collect();
    let mut stored: HashMap<usize, usize> = HashMap::new();
    for t in terminals {
        for k in inbox_batch(net, t, tag).await? {
            *stored.entry(k).or_default() += 1;
        }
    }
    sent.stored = stored.values().sum();
    sent.twice = stored.values().filter(|n| **n > 1).count();
    sent.unreported = stored.keys().filter(|k| !delivered.contains(k)).count();
    sent.missing = delivered.iter().filter(|k| !stored.contains_key(k)).count();
    Ok(sent)
}

/// The `k` of every message `bench {tag} {k}` in node `i`'s inbox (each item read back).
async fn inbox_batch(net: &Net, i: usize, tag: &str) -> Result<Vec<usize>> {
    let node = &net.nodes[i];
    let cookie = std::fs::read_to_string(node.dir.join("operator.cookie"))?;
    let base = format!("http://{}:{OPERATOR_PORT}/v1/inbox", node.ip);
    let get = |url: String| net.http().get(url).bearer_auth(cookie.trim()).send();
    let list: Value = get(base.clone()).await?.error_for_status()?.json().await?;
    let prefix = format!("bench {tag} ");
    let mut out = Vec::new();
    for item in list["items"].as_array().map_or(&[][..], Vec::as_slice) {
        let Some(id) = item["id"].as_u64() else {
            continue;
        };
        let body = get(format!("{base}/{id}"))
            .await?
            .error_for_status()?
            .text()
            .await?;
        if let Some(k) = body.strip_prefix(&prefix).and_then(|k| k.parse().ok()) {
            out.push(k);
        }
    }
    Ok(out)
}
