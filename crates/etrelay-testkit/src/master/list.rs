//! The server list: `getservers` and `getserversExt` answered with the listed servers, and
//! how a client reads the answer.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::{MAX_REPLY, State};
use crate::udp::oob;

/// The `getservers` reply datagrams.
pub(super) fn getservers(
    st: &State,
    from: SocketAddr,
    header: &str,
    protocol: Option<u32>,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let records: Vec<[u8; 7]> = st
        .listed
        .iter()
        .filter(|l| Some(l.protocol) == protocol)
        .filter_map(|l| match l.addr.ip() {
            IpAddr::V4(ip) => {
                let mut r = [0u8; 7];
                r[0] = b'\\';
                r[1..5].copy_from_slice(&ip.octets());
                r[5..7].copy_from_slice(&l.addr.port().to_be_bytes());
                Some(r)
            }
            IpAddr::V6(_) => None,
        })
        .collect();
    let start = || oob(header.as_bytes());
    let mut out = Vec::new();
    let mut packet = start();
    for record in records {
        if packet.len() + record.len() > MAX_REPLY {
            out.push((from, std::mem::replace(&mut packet, start())));
        }
        packet.extend_from_slice(&record);
    }
    if packet.len() + 7 > MAX_REPLY {
        out.push((from, std::mem::replace(&mut packet, start())));
    }
    packet.extend_from_slice(b"\\EOT\0\0\0");
    out.push((from, packet));
    out
}

/// Parses `getserversResponse` / `getserversExtResponse` datagrams (IPv4
/// records) into addresses; stops at `\EOT`. Useful to check a master's
/// answer in tests.
pub fn parse_getservers_response(packet: &[u8]) -> Vec<SocketAddr> {
    let body = packet
        .strip_prefix(b"\xff\xff\xff\xffgetserversResponse")
        .or_else(|| packet.strip_prefix(b"\xff\xff\xff\xffgetserversExtResponse"))
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 7 <= body.len() && body[i] == b'\\' {
        let record = &body[i + 1..i + 7];
        if record.starts_with(b"EOT") {
            break;
        }
        let ip = Ipv4Addr::new(record[0], record[1], record[2], record[3]);
        let port = u16::from_be_bytes([record[4], record[5]]);
        out.push(SocketAddr::from((ip, port)));
        i += 7;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::Listed;

    #[test]
    fn getservers_packing() {
        let mut st = State::default();
        for i in 0..300u32 {
            st.listed.push(Listed {
                addr: SocketAddr::from((Ipv4Addr::new(127, 0, 0, 10), 27960 + i as u16)),
                protocol: 84,
            });
        }
        st.listed.push(Listed {
            addr: SocketAddr::from((Ipv4Addr::new(127, 0, 0, 11), 27960)),
            protocol: 71,
        });
        let from = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let out = getservers(&st, from, "getserversResponse", Some(84));
        assert!(out.len() >= 2);
        let mut all = Vec::new();
        for (i, (_, p)) in out.iter().enumerate() {
            assert!(p.len() <= MAX_REPLY);
            assert_eq!(p.ends_with(b"\\EOT\0\0\0"), i == out.len() - 1);
            all.extend(parse_getservers_response(p));
        }
        assert_eq!(all.len(), 300);
        assert_eq!(
            all[0],
            SocketAddr::from((Ipv4Addr::new(127, 0, 0, 10), 27960))
        );
        let none = getservers(&st, from, "getserversResponse", Some(85));
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].1, b"\xff\xff\xff\xffgetserversResponse\\EOT\0\0\0");
    }
}
