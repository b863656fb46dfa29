//! Measures the cost of the TLS links (`blindrelay::links`), on loopback only, bounded: a
//! server in this process answering `POST /v1/relay` with a small JSON body, once over TLS with
//! a node identity (the links' server configuration) and once over plain HTTP, and a client
//!
//! 1. opening a new connection for every request (`ROUNDS_NEW` requests): the handshake's cost
//!    (TCP + TLS 1.3 with one Ed25519 signature and one verify) shows as the difference;
//! 2. reusing one kept-alive connection (`ROUNDS_REUSE` requests of a 1 508-byte body, the
//!    size of a v1 three-hop envelope at the entry): the per-request cost of the records.
//!
//! Run with `scripts/bench-links` (release build) or
//! `cargo run --release -p blindrelay --example links`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use tokio::net::TcpListener;

const ROUNDS_NEW: usize = 300;
const ROUNDS_REUSE: usize = 3000;
const BODY: usize = 1508;

fn router() -> axum::Router {
    axum::Router::new().route(
        "/v1/relay",
        axum::routing::post(|b: axum::body::Bytes| async move {
            format!("{{\"outcome\":\"forwarded\",\"len\":{}}}", b.len())
        }),
    )
}

async fn server(tls: Option<tokio_rustls::TlsAcceptor>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper_util::service::TowerToHyperService::new(router());
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(tls) => {
                        if let Ok(s) = tls.accept(stream).await {
                            let io = hyper_util::rt::TokioIo::new(s);
                            let _ = http.serve_connection(io, service).await;
                        }
                    }
                    None => {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = http.serve_connection(io, service).await;
                    }
                }
            });
        }
    });
    Ok(addr)
}

fn client(tls: bool, reuse: bool) -> reqwest::Result<reqwest::Client> {
    blindrelay::links::install_provider();
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(usize::from(reuse));
    if tls {
        b = b.use_preconfigured_tls(blindrelay::links::unpinned_config());
    }
    b.build()
}

/// Mean time per request over `rounds` sequential requests.
async fn run(http: &reqwest::Client, url: &str, rounds: usize) -> reqwest::Result<Duration> {
    let body = vec![0x42u8; BODY];
    // Warm up (and open the kept-alive connection).
    http.post(url)
        .body(body.clone())
        .send()
        .await?
        .bytes()
        .await?;
    let t = Instant::now();
    for _ in 0..rounds {
        let r = http.post(url).body(body.clone()).send().await?;
        r.bytes().await?;
    }
    Ok(t.elapsed() / u32::try_from(rounds).unwrap_or(u32::MAX))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let key = SigningKey::from_bytes(&rand::random());
    let acceptor = tokio_rustls::TlsAcceptor::from(blindrelay::links::server_config(&key)?);
    let tls_addr = server(Some(acceptor)).await?;
    let plain_addr = server(None).await?;
    let tls_url = format!("https://{tls_addr}/v1/relay");
    let plain_url = format!("http://{plain_addr}/v1/relay");

    let new_tls = run(&client(true, false)?, &tls_url, ROUNDS_NEW).await?;
    let new_plain = run(&client(false, false)?, &plain_url, ROUNDS_NEW).await?;
    let reuse_tls = run(&client(true, true)?, &tls_url, ROUNDS_REUSE).await?;
    let reuse_plain = run(&client(false, true)?, &plain_url, ROUNDS_REUSE).await?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "| request ({BODY}-byte body, loopback, sequential) | plain HTTP | TLS 1.3 link | TLS cost |"
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| new connection each ({ROUNDS_NEW} requests) | {:.0} µs | {:.0} µs | {:.0} µs (handshake) |",
        us(new_plain),
        us(new_tls),
        us(new_tls) - us(new_plain)
    );
    println!(
        "| one kept-alive connection ({ROUNDS_REUSE} requests) | {:.0} µs | {:.0} µs | {:.0} µs per request |",
        us(reuse_plain),
        us(reuse_tls),
        us(reuse_tls) - us(reuse_plain)
    );
    Ok(())
}
