use std::net::Ipv4Addr;

use super::*;
use crate::clock::wall_now;

const S: Duration = Duration::from_secs(1);

fn ban(last: u8, expires: Option<SystemTime>, since: SystemTime) -> Ban {
    Ban {
        ip: Ipv4Addr::new(192, 0, 2, last).into(),
        reason: String::new(),
        since,
        expires,
    }
}

#[test]
fn bans_expire_and_permanent_ones_stay() {
    let (sys, t0) = (wall_now(), Instant::now());
    let mut t = BanTable::default();
    let a = ban(1, Some(sys + 5 * S), sys);
    let b = ban(2, None, sys);
    t.insert(a.clone(), sys, t0).unwrap();
    t.insert(b.clone(), sys, t0).unwrap();
    assert!(t.is_banned(a.ip, t0));
    let later = t0 + 5 * S;
    assert!(!t.is_banned(a.ip, later));
    assert!(t.is_banned(b.ip, later + Duration::from_secs(1 << 30)));
    assert_eq!(t.purge(later), 1);
    assert_eq!(t.entries.len(), 1);
    assert_eq!(t.list(later), vec![b]);
}

#[test]
fn full_table_refuses_new_addresses_but_replaces() {
    let (sys, t0) = (wall_now(), Instant::now());
    let mut t = BanTable::with_limit(1);
    t.insert(ban(1, None, sys), sys, t0).unwrap();
    assert_eq!(t.insert(ban(2, None, sys), sys, t0), Err(TableFull));
    let mut again = ban(1, None, sys);
    again.reason = "z".into();
    t.insert(again.clone(), sys, t0).unwrap();
    assert_eq!(t.list(t0), vec![again]);
}

#[test]
fn expired_bans_make_room() {
    let (sys, t0) = (wall_now(), Instant::now());
    let mut t = BanTable::with_limit(1);
    let first = ban(1, Some(sys + S), sys);
    t.insert(first.clone(), sys, t0).unwrap();
    assert!(t.insert(ban(2, None, sys), sys, t0 + S).is_ok());
    assert!(!t.remove(first.ip, t0));
}

#[test]
fn lifted_bans_and_listing_order() {
    let (sys, t0) = (wall_now(), Instant::now());
    let mut t = BanTable::default();
    let older = ban(9, None, sys - S);
    let newer = ban(1, None, sys);
    t.insert(newer.clone(), sys, t0).unwrap();
    t.insert(older.clone(), sys, t0).unwrap();
    assert_eq!(t.list(t0), vec![older.clone(), newer.clone()]);
    assert!(t.remove(older.ip, t0));
    assert!(!t.remove(older.ip, t0));
    assert!(!t.is_banned(older.ip, t0));
    assert!(t.is_banned(newer.ip, t0));
}

#[test]
fn new_bans_are_checked() {
    let now = wall_now();
    let ip: IpAddr = "::ffff:192.0.2.5".parse().unwrap();
    let b = Ban::new(ip, "x".into(), Some(60), now).unwrap();
    assert_eq!(b.ip, IpAddr::from(Ipv4Addr::new(192, 0, 2, 5)));
    assert_eq!((b.since, b.expires), (now, Some(now + 60 * S)));
    assert!(!b.expired(now) && b.expired(now + 60 * S));
    let v6: IpAddr = "2001:db8::7".parse().unwrap();
    assert_eq!(Ban::new(v6, String::new(), None, now).unwrap().ip, v6);
    assert_eq!(
        Ban::new(ip, "r".repeat(MAX_REASON + 1), None, now),
        Err(BanError::ReasonTooLong)
    );
    assert!(Ban::new(ip, "r".repeat(MAX_REASON), None, now).is_ok());
    assert_eq!(
        Ban::new(ip, String::new(), Some(0), now),
        Err(BanError::NoDuration)
    );
    assert_eq!(
        Ban::new(ip, String::new(), Some(MAX_BAN_SECS + 1), now),
        Err(BanError::TooLong)
    );
    assert!(Ban::new(ip, String::new(), Some(MAX_BAN_SECS), now).is_ok());
}

#[test]
fn the_file_keeps_dates_in_unix_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let p = path(dir.path(), 27960);
    assert!(p.ends_with("bans-27960.json"));
    assert!(load(&p).unwrap().is_empty(), "no file: no bans");
    let bans = vec![
        ban(1, Some(clock::from_unix(2_000)), clock::from_unix(1_000)),
        ban(2, None, clock::from_unix(1_500)),
    ];
    save(&p, &bans).unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains("\"expires_at\": 2000"), "{text}");
    assert_eq!(load(&p).unwrap(), bans);
    std::fs::write(&p, "{\"bans\": [{\"ip\": \"192.0.2.1\"}]}").unwrap();
    assert!(load(&p).is_err());
}

/// No datagram comes from the unspecified, a multicast or the broadcast address: a ban of one is
/// refused, in either spelling of an IPv4 address.
#[test]
fn addresses_no_datagram_comes_from_cannot_be_banned() {
    let now = wall_now();
    for ip in [
        "0.0.0.0",
        "::",
        "::ffff:0.0.0.0",
        "255.255.255.255",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "::ffff:224.0.0.1",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let err = Ban::new(ip, String::new(), None, now).unwrap_err();
        assert!(matches!(err, BanError::NotASource { .. }), "{ip}: {err}");
        assert!(err.to_string().contains("nothing to ban"), "{ip}: {err}");
    }
    for ip in [
        "192.0.2.1",
        "::ffff:192.0.2.1",
        "2001:db8::1",
        "10.255.255.255",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        assert!(Ban::new(ip, String::new(), None, now).is_ok(), "{ip}");
    }
}
