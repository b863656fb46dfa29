use tokio_util::sync::CancellationToken;

use super::*;
use crate::server::budget::Budget;

fn caps() -> SessionCaps {
    SessionCaps {
        half_open_per_server: 4,
        half_open_per_ip: 2,
        half_open_per_prefix: 3,
        established_per_server: 2,
        established_per_ip: 1,
        ..SessionCaps::default()
    }
}

fn addr(a: u8, b: u8, port: u16) -> SocketAddr {
    SocketAddr::from(([10, a, b, 1], port))
}

fn session(id: u64, client: SocketAddr) -> Arc<Session> {
    Arc::new(Session::new(
        id,
        client,
        client,
        0,
        8,
        Budget::new(1, 1 << 20),
        CancellationToken::new(),
    ))
}

/// Admits and inserts a session for `client`; returns it and the one recycled, if any.
fn open(
    t: &mut Table,
    id: u64,
    client: SocketAddr,
) -> Result<(Arc<Session>, Option<u64>), DropReason> {
    let victim = t.admit(client.ip())?;
    let s = session(id, client);
    t.insert(Arc::clone(&s));
    Ok((s, victim.map(|v| v.id)))
}

#[test]
fn per_ip_and_per_prefix_caps_refuse() {
    let mut t = Table::new(caps());
    open(&mut t, 1, addr(1, 1, 1)).unwrap();
    open(&mut t, 2, addr(1, 1, 2)).unwrap();
    assert_eq!(
        open(&mut t, 3, addr(1, 1, 3)).unwrap_err(),
        DropReason::IpCap
    );
    // Another IP of the same /24: the prefix cap (3) refuses the fourth.
    let other = SocketAddr::from(([10, 1, 1, 2], 1));
    open(&mut t, 4, other).unwrap();
    let third = SocketAddr::from(([10, 1, 1, 3], 1));
    assert_eq!(open(&mut t, 5, third).unwrap_err(), DropReason::PrefixCap);
    assert_eq!(t.half_open(), 3);
}

#[test]
fn at_the_server_cap_the_oldest_unanswered_is_recycled_first() {
    let mut t = Table::new(caps());
    let (a, _) = open(&mut t, 1, addr(1, 0, 1)).unwrap();
    open(&mut t, 2, addr(2, 0, 1)).unwrap();
    open(&mut t, 3, addr(3, 0, 1)).unwrap();
    open(&mut t, 4, addr(4, 0, 1)).unwrap();
    // The oldest was answered by the server: the oldest unanswered (2) goes first.
    t.answered(&a);
    assert_eq!(open(&mut t, 5, addr(5, 0, 1)).unwrap().1, Some(2));
    assert_eq!(open(&mut t, 6, addr(6, 0, 1)).unwrap().1, Some(3));
    assert_eq!(open(&mut t, 7, addr(7, 0, 1)).unwrap().1, Some(4));
    assert_eq!(open(&mut t, 8, addr(8, 0, 1)).unwrap().1, Some(5));
    assert_eq!(t.half_open(), 4);
    assert!(
        t.get(&addr(1, 0, 1)).is_some(),
        "answered, kept while others remain"
    );
}

#[test]
fn established_sessions_are_never_recycled_and_have_their_caps() {
    let mut t = Table::new(caps());
    let (a, _) = open(&mut t, 1, addr(1, 0, 1)).unwrap();
    let (b, _) = open(&mut t, 2, addr(2, 0, 1)).unwrap();
    let (c, _) = open(&mut t, 3, addr(3, 0, 1)).unwrap();
    t.promote(&a).unwrap();
    t.promote(&b).unwrap();
    assert_eq!(t.promote(&c), Err(DropReason::SessionCap), "two per server");
    assert_eq!((t.established(), t.half_open()), (2, 1));
    for i in 0..20u8 {
        let r = open(&mut t, 10 + u64::from(i), addr(100 + i, 0, 1)).unwrap();
        assert_ne!(r.1, Some(1));
        assert_ne!(r.1, Some(2));
    }
    assert!(t.get(&addr(1, 0, 1)).is_some() && t.get(&addr(2, 0, 1)).is_some());
    // Per IP: one established.
    let mut t = Table::new(caps());
    let (a, _) = open(&mut t, 1, addr(1, 0, 1)).unwrap();
    let (b, _) = open(&mut t, 2, addr(1, 0, 2)).unwrap();
    t.promote(&a).unwrap();
    assert_eq!(t.promote(&b), Err(DropReason::IpCap));
    assert!(t.remove(&b));
    assert!(!t.remove(&b), "removed once");
    assert!(t.remove(&a));
    assert_eq!((t.len(), t.half_open(), t.established()), (0, 0, 0));
    assert!(t.ips.is_empty() && t.prefixes.is_empty());
}

#[test]
fn qports_are_pinned_to_one_session() {
    let mut t = Table::new(caps());
    let (a, _) = open(&mut t, 1, addr(1, 0, 1)).unwrap();
    let (b, _) = open(&mut t, 2, addr(2, 0, 1)).unwrap();
    t.promote(&a).unwrap();
    assert_eq!(t.check_qport(&a, 7), Ok(()));
    assert_eq!(t.check_qport(&a, 7), Ok(()));
    assert_eq!(
        t.check_qport(&a, 8),
        Err(DropReason::QportConflict),
        "one qport per session"
    );
    assert_eq!(
        t.check_qport(&b, 7),
        Err(DropReason::QportConflict),
        "another's qport"
    );
    // A half-open session's qport is taken over by an established one.
    assert_eq!(t.check_qport(&b, 9), Ok(()));
    let (c, _) = open(&mut t, 3, addr(3, 0, 1)).unwrap();
    t.promote(&c).unwrap();
    assert_eq!(t.check_qport(&c, 9), Ok(()));
    assert_eq!(t.check_qport(&b, 9), Err(DropReason::QportConflict));
    assert_eq!(t.qport_holder(9).map(|s| s.id), Some(3));
    // A session gone frees its qport.
    t.remove(&a);
    assert!(t.qport_holder(7).is_none());
}

#[test]
fn a_rebind_moves_the_session_within_its_ip() {
    let mut t = Table::new(caps());
    let (a, _) = open(&mut t, 1, addr(1, 0, 1)).unwrap();
    t.promote(&a).unwrap();
    t.rebind(&a, addr(1, 0, 2));
    assert!(t.get(&addr(1, 0, 1)).is_none());
    assert_eq!(t.get(&addr(1, 0, 2)).map(|s| s.id), Some(1));
    t.rebind(&a, addr(2, 0, 2));
    assert_eq!(a.client(), addr(1, 0, 2), "never to another IP");
    assert!(t.remove(&a));
    assert!(t.ips.is_empty());
}

#[test]
fn stale_recycling_entries_stay_bounded() {
    let mut t = Table::new(caps());
    for i in 0..10_000u64 {
        let (s, _) = open(&mut t, i, addr((i % 200) as u8, (i / 200) as u8, 1)).unwrap();
        t.answered(&s);
        t.remove(&s);
    }
    assert!(t.unanswered.len() <= 2 * 4 + 64 + 1);
    assert!(t.answered.len() <= 2 * 4 + 64 + 1);
}
