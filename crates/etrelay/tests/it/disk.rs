//! The state dir full or read-only (issue 15), on a small tmpfs this test mounts (and unmounts,
//! pass or fail) itself: the caller gets a JSON error (507 `state_disk_full`, 500
//! `state_write_failed` with the OS's reason), nothing changes, relaying goes on, every state
//! file stays whole, and writes work again once there is space (or the file system is writable
//! again). Needs root (for `mount`): `#[ignore]`d; asked for without root, it fails saying so.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::daemon::{Daemon, new_key, ports};
use common::{ask, client};
use etrelay::proof::fingerprint;
use etrelay_testkit::{FakeEtConfig, FakeEtServer, udp, unique_ip};
use reqwest::Method;
use serde_json::{Value, json};

/// Size of the state tmpfs.
const TMPFS_SIZE: &str = "512k";
/// Bans tried at most before the disk must be full.
const MAX_BANS: u32 = 400;

/// A tmpfs mounted on a directory of its own; unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Tmpfs {
                dir: dir.to_path_buf(),
            },
            Ok(o) => panic!(
                "this test mounts a {size} tmpfs as the state dir and needs root for it: \
                 `mount -t tmpfs` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!("this test needs `mount` (util-linux) and root: {e}"),
        }
    }

    fn remount(&self, mode: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,{mode}")])
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount {mode}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Fills the file system holding `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = [0u8; 4096];
    // Bounded: the tmpfs is far smaller than this.
    for _ in 0..4096 {
        if f.write_all(&chunk).and_then(|()| f.sync_all()).is_err() {
            return path;
        }
    }
    panic!("the state tmpfs never filled up");
}

/// Every state file is whole: `servers.json` parses, the ban stores pass SQLite's integrity
/// check.
fn whole(state: &Path) {
    let text = std::fs::read_to_string(state.join("servers.json")).expect("servers.json");
    serde_json::from_str::<Value>(&text).expect("servers.json is whole JSON");
    for entry in std::fs::read_dir(state).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("bans-") && name.ends_with(".db") {
            let conn = rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("ban store opens");
            let check: String = conn
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .expect("integrity check");
            assert_eq!(check, "ok", "{name}");
        }
    }
}

async fn ban(d: &Daemon, key: &str, ip: &str) -> (u16, Value) {
    d.call(
        Method::PUT,
        &format!("/bans/{ip}"),
        key,
        Some(json!({"reason": "disk test"})),
    )
    .await
}

/// One round trip through the public port.
async fn relays(d: &Daemon, port: u16) {
    let c = client().await;
    let got = ask(&c, d.public(port), &udp::oob(b"getchallenge")).await;
    assert_eq!(got.len(), 1, "relaying goes on");
}

#[ignore = "needs root: it mounts a small tmpfs as the state dir"]
#[tokio::test]
async fn a_full_or_read_only_state_dir_is_a_clear_error_and_relaying_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let fs = Tmpfs::mount(&state, TMPFS_SIZE);
    let ip = unique_ip();
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let et = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let key = new_key();
    et.set_cvar("etrelay_proof", &fingerprint(&key));
    let (status, me) = d.register(&key, et.addr(), Some(27960)).await;
    assert_eq!(status, 201, "{me}");
    let mut acked = vec!["192.0.2.1".to_string()];
    assert_eq!(ban(&d, &key, &acked[0]).await.0, 200);

    // Full: bans until one is refused, with 507 and nothing changed.
    let filler = fill(&state);
    let mut refused = None;
    for i in 0..MAX_BANS {
        let ip = format!("198.51.{}.{}", 100 + i / 250, i % 250 + 1);
        let (status, body) = ban(&d, &key, &ip).await;
        match status {
            200 => acked.push(ip),
            _ => {
                refused = Some((ip, status, body));
                break;
            }
        }
    }
    let (lost_ip, status, body) = refused.expect("a ban is refused on a full disk");
    assert_eq!(
        (status, body["error"].as_str()),
        (507, Some("state_disk_full")),
        "{body}"
    );
    println!("FIGURE disk full: {status} {body}");
    let other = FakeEtServer::start(unique_ip(), FakeEtConfig::default()).unwrap();
    let k2 = new_key();
    other.set_cvar("etrelay_proof", &fingerprint(&k2));
    let (status, body) = d.register(&k2, other.addr(), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (507, Some("state_disk_full"))
    );
    assert_eq!(d.call(Method::GET, "/server", &k2, None).await.0, 401);
    let now = d.banned(&key).await;
    assert!(!now.contains(&lost_ip), "a refused ban changes nothing");
    assert_eq!(now.len(), acked.len());
    relays(&d, 27960).await;
    whole(&state);

    // Space again: writes work.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(ban(&d, &key, &lost_ip).await.0, 200);
    acked.push(lost_ip);
    assert_eq!(d.register(&k2, other.addr(), None).await.0, 201);

    // Read-only (as the kernel leaves a file system after errors; a tmpfs with open files
    // cannot be made read-only, so the relay is restarted onto it): the relay starts and
    // relays, writes get 500 with the reason, nothing changes.
    d.stop().await;
    fs.remount("ro");
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    relays(&d, 27960).await;
    let (status, body) = ban(&d, &key, "203.0.113.9").await;
    println!("FIGURE read-only: {status} {body}");
    assert_eq!(
        (status, body["error"].as_str()),
        (500, Some("state_write_failed")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("readonly"),
        "{body}"
    );
    let (status, body) = d.call(Method::DELETE, "/server", &k2, None).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(d.call(Method::GET, "/server", &k2, None).await.0, 200);
    assert_eq!(d.banned(&key).await.len(), acked.len());
    // Writable again: the ban stores opened read-only stay so until a restart.
    fs.remount("rw");
    d.stop().await;
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let (status, body) = ban(&d, &key, "203.0.113.9").await;
    assert_eq!(status, 200, "{body}");
    acked.push("203.0.113.9".into());

    // Every acknowledged ban is on disk.
    d.stop().await;
    whole(&state);
    let d = Daemon::start_on(ip, &state, &ports(2), &[]).await;
    let mut now = d.banned(&key).await;
    now.sort();
    acked.sort();
    assert_eq!(now, acked);
    relays(&d, 27960).await;
    d.stop().await;
    drop(fs);
}
