//! The design's periodic report: the status document (`crate::status::Document`, the same
//! bytes `GET /v1/status` serves, in the design's `system_stats.discovery_status.peer_store`
//! layout) pushed to an operator-configured URL.
//!
//! Off unless `--report-url` is given. One `POST` (JSON) at start and then every
//! `--report-interval` ([`DEFAULT_INTERVAL`], at least [`MIN_INTERVAL`]), each bounded by
//! `--report-timeout` ([`DEFAULT_TIMEOUT`]); redirects are not followed. A failed push is
//! counted (`report_failed`) and logged at most once per [`LOG_EVERY`] (with the number left
//! out), never retried before the next tick: ticks missed while a push hangs are skipped, not
//! caught up. The log names neither the URL nor the error's text (which would name it), only
//! its kind. The document holds aggregates only (`docs/blindrelay-status.md`), so the push
//! follows the same privacy rules as the status.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::forward::kind;
use crate::relay::Relay;
use crate::status;

/// Time between pushes unless told otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest interval taken: a smaller one is raised to this.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long one push may take unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// A failing push is logged at most once per this.
pub const LOG_EVERY: Duration = Duration::from_secs(600);

/// Where and how often to push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportConfig {
    /// The operator's URL (`http://…`).
    pub url: String,
    /// Time between pushes.
    pub interval: Duration,
    /// One push's deadline.
    pub timeout: Duration,
}

/// A `--report-url` that is not a plain `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--report-url must be an http:// URL")]
pub struct BadUrl;

/// Checks a `--report-url` value (clap's parser).
///
/// # Errors
/// [`BadUrl`] unless it is `http://HOST[:PORT][/PATH]`.
pub fn parse_url(s: &str) -> Result<String, BadUrl> {
    let rest = s.strip_prefix("http://").ok_or(BadUrl)?;
    if rest.is_empty() || rest.starts_with('/') || s.chars().any(char::is_whitespace) {
        return Err(BadUrl);
    }
    reqwest::Url::parse(s).map_err(|_| BadUrl)?;
    Ok(s.to_string())
}

/// Why one push failed, as the log's `why` says it (never the URL).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// The document could not be made.
    #[error("document")]
    Document,
    /// The request failed: its kind (`timeout`, `connect`…).
    #[error("{0}")]
    Request(&'static str),
    /// The collector answered with a status other than 2xx.
    #[error("HTTP {0}")]
    Status(u16),
}

/// One push of the document now: `Ok` on a 2xx answer.
async fn push(relay: &Arc<Relay>, http: &reqwest::Client, url: &str) -> Result<(), PushError> {
    let p = Arc::clone(relay);
    let body = tokio::task::spawn_blocking(move || serde_json::to_vec(&status::document(&p)))
        .await
        .map_err(|_| PushError::Document)?
        .map_err(|_| PushError::Document)?;
    let resp = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| PushError::Request(kind(&e)))?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(PushError::Status(resp.status().as_u16()))
    }
}

/// The report's HTTP client: `config`'s timeouts, no redirects, no proxy.
///
/// # Errors
/// [`NoClient`]: it cannot be built.
pub fn http_client(config: &ReportConfig) -> Result<reqwest::Client, NoClient> {
    crate::links::install_provider();
    reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(config.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|_| NoClient)
}

/// The report's HTTP client cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--report-url: cannot make the HTTP client that pushes the report")]
pub struct NoClient;

/// Pushes the document per `config` with `http` ([`http_client`]) until `cancel`.
pub async fn run(
    relay: Arc<Relay>,
    config: ReportConfig,
    http: reqwest::Client,
    cancel: CancellationToken,
) {
    let mut ticks = tokio::time::interval(config.interval.max(MIN_INTERVAL));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut throttle = guard::throttle::Throttle::new(LOG_EVERY);
    let counters = &relay.ctx().counters;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let outcome = tokio::select! {
            () = cancel.cancelled() => return,
            r = push(&relay, &http, &config.url) => r,
        };
        match outcome {
            Ok(()) => {
                counters.report_sent.inc();
                debug!("status report pushed");
            }
            Err(why) => {
                counters.report_failed.inc();
                if let Some(left_out) = throttle.event(relay.ctx().clock.instant()) {
                    warn!(
                        why = why.to_string(),
                        left_out,
                        failed = counters.report_failed.get(),
                        "status report push failed; next at the next interval"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_urls() {
        assert!(parse_url("http://127.0.0.1:9000/report").is_ok());
        assert!(parse_url("http://[::1]:9000").is_ok());
        for bad in [
            "https://x",
            "ftp://x",
            "http://",
            "http:///x",
            "127.0.0.1:9",
            "http://a b",
        ] {
            assert_eq!(parse_url(bad), Err(BadUrl), "{bad}");
        }
    }
}
