//! The relay is no reflector: `getstatus`/`getinfo` from 30 000 spoofed sources, each on its
//! own /24 (the worst case for a per-prefix budget), get at most the global answer budget,
//! cached or not. Figures are printed as `FIGURE …` lines (`scripts/bench-attack`).

use crate::common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use etrelay::config::{ANSWER_WINDOW, ANSWERS_GLOBAL};
use etrelay_testkit::{FakeEtConfig, FakeEtServer, unique_ip};

const SOURCES: u32 = 30_000;
/// The flood is spread over this long, so it spans several windows of the budget.
const SPREAD: Duration = Duration::from_secs(5);

async fn flood(cache_max_age: Duration, label: &str) {
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let mut cfg = config(et.addr());
    cfg.cache_max_age = cache_max_age;
    let relay = start(cfg).await;
    let m = relay.handle.metrics();
    let start = Instant::now();
    let mut sent = 0u32;
    for i in 0..SOURCES {
        // 127.A.B.1: every source on its own /24.
        let ip = Ipv4Addr::new(127, 100 + (i >> 8) as u8, i as u8, 1);
        let Ok(s) = std::net::UdpSocket::bind((ip, 0)) else {
            continue;
        };
        let q: &[u8] = if i % 2 == 0 {
            b"\xff\xff\xff\xffgetstatus x"
        } else {
            b"\xff\xff\xff\xffgetinfo x"
        };
        if s.send_to(q, relay.addr).is_ok() {
            sent += 1;
        }
        if i % 64 == 0 {
            // Pace the flood over SPREAD (and let the relay read).
            let due = start + SPREAD.mul_f64(f64::from(i) / f64::from(SOURCES));
            tokio::time::sleep_until(due.into()).await;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "flood took too long"
        );
    }
    assert!(sent >= SOURCES * 99 / 100, "{sent} sent");
    assert!(
        eventually(Duration::from_secs(20), || m.client_packets.get()
            >= u64::from(sent) * 9 / 10)
        .await,
        "only {} arrived",
        m.client_packets.get()
    );
    // The budget is charged when a query is admitted: an answer still on its way counts in a
    // window already counted here.
    let secs = start.elapsed().as_secs_f64();
    let (answers, out, inb) = (
        m.reply_packets.get(),
        m.reply_bytes.get(),
        m.client_bytes.get(),
    );
    let windows = (secs / ANSWER_WINDOW.as_secs_f64()).floor() as u64 + 1;
    let budget = u64::from(ANSWERS_GLOBAL) * windows;
    println!(
        "FIGURE reflection ({label}): {} queries from {SOURCES} sources in {secs:.2} s; {answers} \
         answers ({:.1}/s; budget {budget} for {windows} windows); {out} B out / {inb} B in = \
         {:.4}; mean answer {} B",
        m.client_packets.get(),
        answers as f64 / secs,
        out as f64 / inb.max(1) as f64,
        out.checked_div(answers).unwrap_or(0)
    );
    assert!(answers >= 1, "honest traffic is still answered");
    assert!(answers <= budget, "{answers} answers over {budget}");
    assert!(out < inb, "more bytes out ({out}) than in ({inb})");
    relay.handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_queries_from_30_000_sources_get_the_global_budget_at_most_cached() {
    let _flood = common::one_flood_at_a_time().await;
    flood(etrelay::config::CACHE_MAX_AGE, "cache on").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_queries_from_30_000_sources_get_the_global_budget_at_most_uncached() {
    let _flood = common::one_flood_at_a_time().await;
    // Cache off: queries go to the game server through sessions; the budget still applies.
    flood(Duration::ZERO, "cache off").await;
}
