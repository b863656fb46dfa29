//! Phase 6, an eclipse with real processes, as `tests/it/discovery_attacks.rs` builds it: a liar (a
//! node of its own network, no `--peer`), Sybils whose only `--peer` is the liar, and a
//! victim whose only `--peer` is the liar; then the victim started again with a seed list
//! (`blindrelay seeds`) signed by an honest node, its `--peer` still the liar, once its peer
//! store holds the attackers. Three trials.

use std::time::Duration;

use blindrelay::clock;
use rand::seq::IndexedRandom;
use serde_json::Value;
use tokio::process::Command;

use crate::net::{Net, disc, peers, peers_n};
use crate::phases::{answering, latest, median, secs, short};
use crate::{Figures, Flags, Result};

/// Sybils beside the liar.
const SYBILS: usize = 4;
/// Eclipses and rescues, each with attackers and a victim of its own (the rescue's time
/// varies from run to run: its median is compared).
const TRIALS: usize = 3;
/// Longest wait for the attackers' network and the victim's verdict (a node whose only peer
/// failed one exchange waits for the `--peer` refresh, 60 s, to try it again).
const WAIT: Duration = Duration::from_secs(90);
/// Longest wait for the seed list to bring the honest network.
const RESCUE: Duration = Duration::from_secs(120);

/// What a status says of eclipse: the verdict and its figures.
fn verdict(s: &Value) -> String {
    let d = &peers(s)["discovery"];
    format!(
        "{} (roots {}, top root {} %, unconfirmed {} %, roots reconciled with {})",
        d["eclipse"],
        d["roots"],
        d["top_root_percent"],
        d["unconfirmed_percent"],
        d["roots_synced"]
    )
}

/// A status's exchanges, those answered busy and those failed, in parentheses.
fn counts(s: &Value) -> String {
    format!(
        " ({} exchanges, {} answered busy, {} failed)",
        disc(s, "exchanges"),
        disc(s, "exchanges_busy"),
        disc(s, "exchanges_failed")
    )
}

/// The eclipse verdict of a status.
fn eclipse(s: &Value) -> &str {
    peers(s)["discovery"]["eclipse"].as_str().unwrap_or("")
}

/// `blindrelay seeds` of node `h`, written to a file: its path, how many seeds it lists, and
/// how many of them are live nodes.
async fn seed_list(net: &Net, h: usize) -> Result<(String, usize, usize)> {
    let out = Command::new(net.bin())
        .arg("seeds")
        .arg("--state-dir")
        .arg(&net.nodes[h].dir)
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await??;
    if !out.status.success() {
        return Err(format!("seeds: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8(out.stdout)?;
    let file = net.root().join("seeds.txt");
    std::fs::write(&file, &text)?;
    let seeds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('@').map(|(id, _)| id))
        .collect();
    let live = seeds
        .iter()
        .filter(|id| net.live().iter().any(|i| net.nodes[*i].id == **id))
        .count();
    Ok((file.display().to_string(), seeds.len(), live))
}

/// Waits (at most [`WAIT`]) until the peer store in `dir` holds `n` peers.
async fn stored(dir: &std::path::Path, n: usize) -> Result<()> {
    let file = dir.join(blindrelay::peers::cache::FILE);
    let t0 = clock::now();
    loop {
        let held = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["peers"].as_array().map(Vec::len))
            .unwrap_or(0);
        if held >= n {
            return Ok(());
        }
        if clock::elapsed(t0) >= WAIT {
            return Err(format!("the victim's peer store holds {held} peers, not {n}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the liar and its Sybils, and waits until the liar routes to every Sybil: the victim,
/// not started, and that time.
async fn attackers(net: &mut Net) -> Result<(usize, Duration)> {
    let made = net.init(SYBILS + 2).await?;
    let (liar, victim) = (made.start, made.end - 1);
    net.spawn(liar, &[])?;
    answering(net, liar, WAIT).await?;
    let crew: Vec<usize> = (liar..victim).collect();
    for &s in &crew[1..] {
        net.nodes[s].args = vec!["--peer".into(), net.nodes[liar].spec()];
        net.spawn(s, &[])?;
    }
    let t0 = clock::now();
    let formed = net
        .until(&crew[..1], t0, t0 + WAIT, |s| {
            peers_n(s, "routable") >= SYBILS as u64
        })
        .await;
    let Some(took) = latest(&formed) else {
        return Err(short(net, &crew[..1], &formed, "routing to its Sybils").await);
    };
    net.nodes[victim].args = vec!["--peer".into(), net.nodes[liar].spec()];
    Ok((victim, took))
}

/// Phase 6: the eclipse, then the seed list's rescue, [`TRIALS`] times over (a fresh liar,
/// Sybils and victim each time, the last trial's stopped: its victim passed the honest network
/// on to its liar); the rescue compared is the median trial's.
pub(crate) async fn run(net: &mut Net, f: Flags, got: &mut Figures) -> Result<()> {
    let honest = net.live();
    let mut rescues = Vec::new();
    for trial in 1..=TRIALS {
        let (crew, rescued) = trial_once(net, f, &honest, trial).await?;
        rescues.push(rescued);
        net.kill(&crew).await;
    }
    let times: Vec<f64> = rescues.iter().flatten().map(|t| secs(*t)).collect();
    if times.len() == TRIALS {
        got.rescue = Some(median(times.clone()));
    }
    let shown: Vec<String> = times.iter().map(|t| format!("{t:.1} s")).collect();
    println!(
        "   the seed list's rescue over {TRIALS} trials: {} (median {})",
        shown.join(", "),
        got.rescue.map_or(
            "NOT measured: a trial did not end".to_string(),
            |t| format!("{t:.1} s")
        )
    );
    Ok(())
}

/// One trial: its liar, Sybils and victim (to stop after), and the rescue's time.
async fn trial_once(
    net: &mut Net,
    f: Flags,
    honest: &[usize],
    trial: usize,
) -> Result<(Vec<usize>, Option<Duration>)> {
    let (victim, crew_took) = attackers(net).await?;
    let all: Vec<usize> = (victim - SYBILS - 1..=victim).collect();
    let crew = (SYBILS + 1) as u64;
    let t0 = clock::now();
    net.spawn(victim, &[])?;
    let seen = net
        .until(&[victim], t0, t0 + WAIT, |s| {
            peers_n(s, "routable") >= crew && eclipse(s) == "one_source"
        })
        .await;
    let Some((t, s)) = seen[0].clone() else {
        let s = net.status(victim).await.unwrap_or_default();
        return Err(format!(
            "the victim did not say one_source within {WAIT:?}: {}",
            peers(&s)
        )
        .into());
    };
    let head = if trial == 1 { "6." } else { "  " };
    println!(
        "{head} eclipse, trial {trial}: a liar and {SYBILS} Sybils that know only it (the liar \
         routed to them {:.1} s after they started), a victim whose only --peer is the liar: \
         after {:.1} s the victim routes to {}, holds {} identities ({} honest); it says {}",
        secs(crew_took),
        secs(t),
        peers_n(&s, "routable"),
        peers_n(&s, "known"),
        peers_n(&s, "known").saturating_sub(crew),
        verdict(&s)
    );
    // An eclipsed node that ran a while has its attackers in its peer store (written every few
    // seconds): its restart brings them back, and the rescue is the honest network's.
    stored(&net.nodes[victim].dir, crew as usize).await?;
    let h = *honest.choose(&mut rand::rng()).ok_or("no honest node")?;
    let (file, listed, live) = seed_list(net, h).await?;
    net.kill(&[victim]).await;
    let t0 = clock::now();
    net.spawn(victim, &["--seeds".into(), file])?;
    let want = honest.len() as u64 + crew;
    let routed = net
        .until(&[victim], t0, t0 + RESCUE, |s| {
            peers_n(s, "routable") >= want
        })
        .await;
    let rescued = routed[0].as_ref().map(|(t, _)| *t);
    let ok = net
        .until(&[victim], t0, t0 + RESCUE, |s| eclipse(s) == "ok")
        .await;
    let last = net.status(victim).await.unwrap_or_default();
    let tried = routed[0].as_ref().map_or(String::new(), |(_, s)| counts(s));
    println!(
        "   started again with a seed list from an honest node ({listed} seeds, {live} of them \
         alive; its --peer still the liar): routes to every one of the {} live honest nodes \
         after {}{tried}; says \"ok\" after {}; now routes to {}, says {}",
        honest.len(),
        rescued.map_or(format!("NOT within {RESCUE:?}"), |t| format!(
            "{:.1} s ({:.1} intervals)",
            secs(t),
            f.intervals(t)
        )),
        ok[0]
            .as_ref()
            .map_or(format!("NOT within {RESCUE:?}"), |(t, _)| format!(
                "{:.1} s",
                secs(*t)
            )),
        peers_n(&last, "routable"),
        verdict(&last)
    );
    Ok((all, rescued))
}
