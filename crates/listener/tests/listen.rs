//! The shared listener against real sockets on 127.0.0.1: caps in all and per source, the
//! header deadline (new and idle connections), the connection deadline, the wrap step, stop.
//! Deadlines are measured on tokio's paused clock: the clock is paused once nothing but a timer
//! can move the test on (before that, a paused clock would jump over a timer while a request
//! is still on its way through the loopback).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use listener::{
    Admit, Closed, Config, Hooks, Key, Limits, Listener, Refusal, Refused, Table, Wrap,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const S: Duration = Duration::from_secs(1);

fn config() -> Config {
    Config {
        header_timeout: 60 * S,
        conn_deadline: None,
        keep_alive: true,
        max_head: listener::MIN_HEAD,
        grace: S,
        accept_backoff: Duration::from_millis(10),
    }
}

/// What the hooks saw: a refusal, or a close by the name of its kind.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Refused(Refusal),
    Closed(&'static str),
}

#[derive(Debug, Clone)]
struct Record(mpsc::UnboundedSender<Event>);

impl Hooks for Record {
    fn refused(&self, r: &Refused) {
        let _ = self.0.send(Event::Refused(r.why));
    }
    fn closed(&self, _peer: SocketAddr, how: &Closed) {
        let kind = match how {
            Closed::Done => "done",
            Closed::HeaderTimeout => "header timeout",
            Closed::WrapTimeout => "wrap timeout",
            Closed::WrapFailed(_) => "wrap failed",
            Closed::Deadline => "deadline",
            Closed::Http(_) => "http",
            Closed::Stopped => "stopped",
            Closed::Own(_) => "own",
        };
        assert_eq!(
            how.timed_out(),
            matches!(kind, "header timeout" | "wrap timeout")
        );
        let _ = self.0.send(Event::Closed(kind));
    }
}

/// `/ok`; `/peer` (the peer's address); `/hang`, which tells `started` and never answers.
fn router(started: Arc<Notify>) -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/name",
            get(
                |axum::Extension(Name(n)): axum::Extension<Name>| async move {
                    char::from(n).to_string()
                },
            ),
        )
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
        )
        .route(
            "/hang",
            get(move || async move {
                started.notify_one();
                std::future::pending::<()>().await;
            }),
        )
}

struct Running {
    addr: SocketAddr,
    events: mpsc::UnboundedReceiver<Event>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    started: Arc<Notify>,
}

async fn start<A: Admit>(listener: Listener<A>) -> Running {
    start_wrapped(listener, listener::Plain).await
}

async fn start_wrapped<A: Admit, W: Wrap>(listener: Listener<A>, wrap: W) -> Running {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let started = Arc::new(Notify::new());
    let task = tokio::spawn(listener.with_hooks(Record(tx)).serve_wrapped(
        tcp,
        router(Arc::clone(&started)),
        wrap,
        cancel.clone(),
    ));
    Running {
        addr,
        events,
        cancel,
        task,
        started,
    }
}

impl Running {
    async fn next(&mut self) -> Event {
        self.events.recv().await.expect("an event")
    }
}

/// Sends `GET path` on `s` and reads the answer's body (a kept-alive connection stays open).
async fn get_on(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the answer: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("a content length")
            .parse()
            .unwrap();
        if body.len() >= len {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            return body.to_string();
        }
    }
}

/// A connection the listener admitted and answered once, kept open.
async fn admitted(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_on(&mut s, "/ok").await, "ok");
    s
}

/// True once `s` is closed by the other end (end of stream or reset).
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn total_cap_refuses_at_once_and_frees_with_the_connection() {
    let limits = Limits {
        total: 2,
        per_source: 10,
        reserved: 0,
    };
    let mut r = start(Listener::per_ip(config(), limits)).await;
    let a = admitted(r.addr).await;
    let _b = admitted(r.addr).await;
    let mut c = TcpStream::connect(r.addr).await.unwrap();
    assert!(closed(&mut c).await);
    assert_eq!(r.next().await, Event::Refused(Refusal::Total));
    drop(a);
    assert_eq!(r.next().await, Event::Closed("done"));
    let mut d = admitted(r.addr).await;
    assert_eq!(get_on(&mut d, "/peer").await, "127.0.0.1");
}

#[tokio::test]
async fn per_source_cap_counts_under_the_callers_key() {
    /// Every address in one block, as blindrelay groups unknown sources.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Block;
    impl Key for Block {}

    let limits = Limits {
        total: 10,
        per_source: 2,
        reserved: 0,
    };
    let table = Table::new(limits);
    let mut r = start(Listener::by_source(config(), table.clone(), |_| Block)).await;
    let _a = admitted(r.addr).await;
    let _b = admitted(r.addr).await;
    assert_eq!((table.held(), table.sources()), (2, 1));
    let mut c = TcpStream::connect(r.addr).await.unwrap();
    assert!(closed(&mut c).await);
    assert_eq!(r.next().await, Event::Refused(Refusal::Source));
    assert_eq!(table.held(), 2);
}

#[tokio::test]
async fn reserved_share_is_for_trusted_sources_only() {
    /// The first connection is a trusted source's, the others not.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Who(bool);
    impl Key for Who {
        fn reserved(&self) -> bool {
            self.0
        }
    }
    let limits = Limits {
        total: 2,
        per_source: 2,
        reserved: 1,
    };
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let listener = Listener::by_source(config(), Table::new(limits), move |_| {
        Who(seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 2)
    });
    let mut r = start(listener).await;
    let _a = admitted(r.addr).await;
    let mut b = TcpStream::connect(r.addr).await.unwrap();
    assert!(closed(&mut b).await, "the last place is reserved");
    assert_eq!(r.next().await, Event::Refused(Refusal::Total));
    let _trusted = admitted(r.addr).await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_head_is_closed_at_the_header_deadline() {
    let config = Config {
        header_timeout: 5 * S,
        ..config()
    };
    let mut r = start(Listener::per_ip(config, limits())).await;
    let t0 = Instant::now();
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /ok HTTP/1.1\r\n").await.unwrap();
    assert!(closed(&mut s).await);
    assert_about(t0.elapsed(), 5 * S, 5 * S);
    assert_eq!(r.next().await, Event::Closed("header timeout"));
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_at_the_header_deadline() {
    let config = Config {
        header_timeout: 5 * S,
        ..config()
    };
    let mut r = start(Listener::per_ip(config, limits())).await;
    let mut s = admitted(r.addr).await;
    tokio::time::pause();
    let t0 = Instant::now();
    assert!(closed(&mut s).await);
    // The timer started as the answer went out, a moment before the clock was paused.
    assert_about(t0.elapsed(), 5 * S - Duration::from_millis(100), 5 * S);
    assert_eq!(r.next().await, Event::Closed("header timeout"));
}

#[tokio::test]
async fn no_connection_outlives_its_deadline() {
    let config = Config {
        header_timeout: 5 * S,
        conn_deadline: Some(30 * S),
        ..config()
    };
    let mut r = start(Listener::per_ip(config, limits())).await;
    let t0 = Instant::now();
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    r.started.notified().await;
    tokio::time::pause();
    assert!(closed(&mut s).await);
    assert_about(t0.elapsed(), 30 * S - Duration::from_millis(100), 30 * S);
    assert_eq!(r.next().await, Event::Closed("deadline"));
}

/// A handshake that waits for one byte from the peer (`H`, then the name it gives), then
/// speaks HTTP on the stream; every request carries the name.
#[derive(Debug)]
struct Hello;

/// What [`Hello`] learned of a connection.
#[derive(Debug, Clone)]
struct Name(u8);

impl Wrap for Hello {
    type Stream = TcpStream;
    type Info = Name;
    async fn wrap(&self, mut tcp: TcpStream) -> io::Result<(TcpStream, Name)> {
        let mut b = [0u8; 2];
        tcp.read_exact(&mut b).await?;
        if b[0] == b'H' {
            Ok((tcp, Name(b[1])))
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidData, "no hello"))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_wrap_step_is_bounded_by_the_header_deadline() {
    let config = Config {
        header_timeout: 5 * S,
        ..config()
    };
    let table = Table::new(limits());
    let listener = Listener::by_source(config, table.clone(), |p| p.ip());
    let mut r = start_wrapped(listener, Hello).await;

    let mut ok = TcpStream::connect(r.addr).await.unwrap();
    ok.write_all(b"Hz").await.unwrap();
    assert_eq!(get_on(&mut ok, "/ok").await, "ok");
    assert_eq!(
        get_on(&mut ok, "/name").await,
        "z",
        "what the wrap step learned"
    );
    drop(ok);
    assert_eq!(r.next().await, Event::Closed("done"));

    let mut wrong = TcpStream::connect(r.addr).await.unwrap();
    wrong.write_all(b"Xz").await.unwrap();
    assert!(closed(&mut wrong).await);
    assert_eq!(r.next().await, Event::Closed("wrap failed"));

    let t0 = Instant::now();
    let mut silent = TcpStream::connect(r.addr).await.unwrap();
    assert!(closed(&mut silent).await);
    assert_about(t0.elapsed(), 5 * S, 5 * S);
    assert_eq!(r.next().await, Event::Closed("wrap timeout"));
    assert_eq!(table.held(), 0);
}

#[tokio::test]
async fn stop_closes_idle_connections_and_drops_the_rest_after_the_grace() {
    let table = Table::new(limits());
    let listener = Listener::by_source(config(), table.clone(), |p| p.ip());
    let mut r = start(listener).await;
    let mut idle = admitted(r.addr).await;
    let mut busy = TcpStream::connect(r.addr).await.unwrap();
    busy.write_all(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    r.started.notified().await;
    assert_eq!(table.held(), 2);

    tokio::time::pause();
    let t0 = Instant::now();
    r.cancel.cancel();
    r.task.await.unwrap();
    // The grace, then every connection dropped.
    assert_about(t0.elapsed(), S, S);
    assert_eq!(table.held(), 0);
    assert!(closed(&mut idle).await);
    assert!(closed(&mut busy).await);
    let mut ends = vec![];
    while let Ok(e) = r.events.try_recv() {
        ends.push(e);
    }
    assert_eq!(
        ends,
        [Event::Closed("done"), Event::Closed("stopped")],
        "the idle one closed at once, the busy one at the end of the grace"
    );
    assert!(
        TcpStream::connect(r.addr).await.is_err(),
        "the listener is closed"
    );
}

/// `took` within `[from, to]`, plus tokio's timer granularity (1 ms).
fn assert_about(took: Duration, from: Duration, to: Duration) {
    let slack = Duration::from_millis(5);
    assert!(
        took >= from && took <= to + slack,
        "{took:?}, not in {from:?}..={to:?}"
    );
}

fn limits() -> Limits {
    Limits {
        total: 16,
        per_source: 16,
        reserved: 0,
    }
}
