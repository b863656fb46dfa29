//! Public ports that could not be bound: tried again every [`BIND_RETRY`] by the writer task,
//! and at once when the server is registered again on the same port.
//!
//! A registered server whose port another process holds when the relay starts stays
//! registered, with its ban store open, and gets a [`BindRetry`]: the writer binds the port
//! again once it is due, and when that works starts the server with the bans of its store, as
//! if it had been bound at start. Every attempt is shown in `GET /server` (`bind`); failures
//! are logged at most once per [`BIND_WARN_PERIOD`], success once.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::net::UdpSocket;
use tracing::{info, warn};

use super::{Inner, Registered, RegistryError, blocking};
use crate::clock::{Instant, wall_now};
use crate::config::{BIND_RETRY, BIND_WARN_PERIOD};

/// A public port that could not be bound, and when it is tried next.
#[derive(Debug, Clone)]
pub struct BindRetry {
    /// Attempts that failed so far (the one at start included).
    pub attempts: u32,
    /// Why the last one failed.
    pub last_error: String,
    /// When the last one was made.
    pub last_attempt: SystemTime,
    /// When the next one is due (wall clock, for the API).
    pub next_attempt: SystemTime,
    /// When the next one is due (the clock decisions read).
    due: Instant,
}

impl BindRetry {
    /// One more failed attempt (after `prev`, if any) with `error`, made now.
    pub(super) fn failed(prev: Option<&BindRetry>, error: String) -> BindRetry {
        let (now_sys, now) = (wall_now(), Instant::now());
        BindRetry {
            attempts: prev.map_or(0, |p| p.attempts).saturating_add(1),
            last_error: error,
            last_attempt: now_sys,
            next_attempt: now_sys + BIND_RETRY,
            due: now + BIND_RETRY,
        }
    }
}

/// Binds `entry`'s port and starts it with the bans of its store. On success the entry is
/// relayed, its error and retry cleared.
///
/// # Errors
/// [`RegistryError::Bind`] when the port is still held; the ban store could not be read; the
/// relay is stopping. The entry is unchanged.
pub(super) async fn bind_and_start(
    inner: &Inner,
    entry: &mut Registered,
) -> Result<(), RegistryError> {
    let port = entry.port;
    let Some(store) = entry.store.clone() else {
        return Err(RegistryError::NotRelaying(
            "its ban store could not be opened".into(),
        ));
    };
    let public = UdpSocket::bind((inner.config.bind, port))
        .await
        .map_err(|source| RegistryError::Bind { port, source })?;
    // Each ban goes into the server's table as it is read: none is held twice.
    let handle = inner.start_held_on(public, entry.upstream)?;
    let filling = Arc::clone(&handle);
    let loaded = blocking(move || {
        let mut restore = super::Restore::new(port, wall_now());
        Ok(store.each(wall_now(), |ban| restore.ban(&filling, ban))?)
    })
    .await;
    if let Err(e) = loaded {
        handle.stop().await;
        return Err(e);
    }
    handle.release();
    entry.handle = Some(handle);
    entry.error = None;
    entry.bind = None;
    Ok(())
}

/// Records a failed attempt on `entry`: the error shown, the next attempt scheduled, a
/// warning when one is due.
pub(super) fn record_failure(entry: &mut Registered, e: &RegistryError) {
    let retry = BindRetry::failed(entry.bind.as_ref(), e.to_string());
    let every = (BIND_WARN_PERIOD.as_secs() / BIND_RETRY.as_secs().max(1)).max(1);
    if retry.attempts > 1 && u64::from(retry.attempts) % every == 0 {
        warn!(
            upstream = %entry.upstream,
            port = entry.port,
            error = %e,
            attempts = retry.attempts,
            retry_secs = BIND_RETRY.as_secs(),
            "server's port not bound, trying again"
        );
    }
    entry.error = Some(e.to_string());
    entry.bind = Some(retry);
}

/// When the writer next has a port to try, if any.
pub(super) fn next_due(inner: &Inner) -> Option<Instant> {
    if inner.stopping.is_cancelled() {
        return None;
    }
    inner
        .lock()
        .values()
        .filter_map(|r| r.bind.as_ref().map(|b| b.due))
        .min()
}

/// Tries every port that is due (by the writer task: no other change runs meanwhile).
pub(super) async fn retry_due(inner: &Arc<Inner>) {
    let now = Instant::now();
    let due: Vec<Registered> = inner
        .lock()
        .values()
        .filter(|r| r.bind.as_ref().is_some_and(|b| b.due <= now))
        .cloned()
        .collect();
    for mut entry in due {
        if inner.stopping.is_cancelled() {
            return;
        }
        let failed = entry.bind.as_ref().map_or(0, |b| b.attempts);
        match bind_and_start(inner, &mut entry).await {
            Ok(()) => info!(
                upstream = %entry.upstream,
                port = entry.port,
                failed,
                "server's port bound after failed attempts, relayed"
            ),
            Err(e) => record_failure(&mut entry, &e),
        }
        inner.lock().insert(entry.port, entry);
    }
}
