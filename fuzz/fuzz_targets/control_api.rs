//! The etrelay control API's request bodies (`PUT /server`, `PUT /bans/{ip}`) through the code
//! the handlers run: JSON parsing, the checks on the key, the upstream, the address, the reason
//! and the duration.
//!
//! Oracle: a bad request gets a 4xx and a JSON error `{"error": <code>, "message": <text>}`; an
//! accepted ban has a bounded reason and duration and survives the state file's round trip.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use etrelay::bans::{Ban, BanRecord, MAX_BAN_SECS, MAX_REASON};
use etrelay::control::fuzzing::{Answer, put_ban, put_server};
use etrelay::proof::MIN_KEY;
use libfuzzer_sys::fuzz_target;

fn check_error(a: &Answer) {
    assert!(
        (400..500).contains(&a.status),
        "status {} for a bad request",
        a.status
    );
    assert!(a.body["error"].is_string() && a.body["message"].is_string());
}

fuzz_target!(|data: &[u8]| {
    // [selector][ip length][ip][body]
    let [sel, n, rest @ ..] = data else { return };
    let is_json = match sel & 3 {
        0 => None,
        1 => Some(true),
        _ => Some(false),
    };
    let n = usize::from(*n).min(rest.len());
    let (ip, body) = rest.split_at(n);
    if sel & 4 == 0 {
        match put_server(is_json, body) {
            Ok(upstream) => {
                let v: serde_json::Value = serde_json::from_slice(body).expect("accepted JSON");
                assert!(
                    v["key"]
                        .as_str()
                        .is_some_and(|k| k.chars().count() >= MIN_KEY)
                );
                let given: std::net::SocketAddr = v["upstream"]
                    .as_str()
                    .and_then(|u| u.parse().ok())
                    .expect("an ip:port");
                assert_eq!(upstream.port(), given.port());
            }
            Err(a) => check_error(&a),
        }
    } else {
        let ip = String::from_utf8_lossy(ip);
        let now = UNIX_EPOCH + Duration::from_secs(1_764_450_000);
        match put_ban(&ip, is_json, body, now) {
            Ok(json) => {
                let reason = json["reason"].as_str().expect("a reason");
                assert!(reason.len() <= MAX_REASON);
                if let Some(e) = json["expires_at"].as_u64() {
                    let since = json["since"].as_u64().expect("since");
                    assert!(e > since && e - since <= MAX_BAN_SECS);
                }
                // The state file's round trip keeps the ban as it is.
                let record: BanRecord = serde_json::from_value(json.clone()).expect("a record");
                let ban = Ban::from(record);
                let again = serde_json::to_value(BanRecord::from(&ban)).expect("serializes");
                assert_eq!(again, json);
                assert!(!ban.expired(now));
            }
            Err(a) => check_error(&a),
        }
    }
});
