//! The cached answer's `challenge` rewrite: parse a server's `infoResponse`/`statusResponse`,
//! render it for an asker, and read it back.
//!
//! Oracle: the rendered answer carries exactly the asker's challenge (`%` read as `.`) or none,
//! keeps every other pair and everything after the info string, and parsing it again gives the
//! same template.
#![no_main]

use etrelay::et::OOB;
use etrelay::et::classify::valid_challenge;
use etrelay::et::info::{INFO_RESPONSE, STATUS_RESPONSE, Template, find_key, info_string};
use libfuzzer_sys::fuzz_target;

fn check(packet: &[u8], header: &[u8], challenge: Option<&[u8]>) {
    let Some((template, _echoed)) = Template::parse(packet, header) else {
        assert!(info_string(packet, header).is_none());
        return;
    };
    let info = info_string(packet, header).expect("parse accepted it");
    let rest = &packet[4 + header.len() + info.len()..];

    let mut bare = Vec::new();
    template.render(None, &mut bare);
    assert!(bare.starts_with(&OOB) && bare[4..].starts_with(header));
    assert!(
        bare.ends_with(rest),
        "the bytes after the info string are kept"
    );
    let bare_info = info_string(&bare, header).expect("renders an answer");
    assert_eq!(find_key(bare_info, b"challenge"), None);

    let mut out = Vec::new();
    template.render(challenge, &mut out);
    let out_info = info_string(&out, header).expect("renders an answer");
    let got = find_key(out_info, b"challenge").map(|r| out_info[r].to_vec());
    let want = challenge.map(|c| {
        c.iter()
            .map(|&b| if b == b'%' { b'.' } else { b })
            .collect::<Vec<u8>>()
    });
    assert_eq!(got, want);
    // Every other key still reads the same.
    for key in [
        &b"hostname"[..],
        b"sv_hostname",
        b"clients",
        b"protocol",
        b"",
    ] {
        let before = find_key(info, key).map(|r| info[r].to_vec());
        let after = find_key(out_info, key).map(|r| out_info[r].to_vec());
        if !key.eq_ignore_ascii_case(b"challenge") {
            assert_eq!(before, after, "{:?}", String::from_utf8_lossy(key));
        }
    }
    // Parsing the rendered answer gives back the asker's challenge and the same template.
    let (again, echoed) = Template::parse(&out, header).expect("renders an answer");
    assert_eq!(echoed, want);
    let mut bare_again = Vec::new();
    again.render(None, &mut bare_again);
    assert_eq!(bare_again, bare);
}

fuzz_target!(|data: &[u8]| {
    // [selector][challenge length][challenge][server answer after the marker]
    let [sel, n, rest @ ..] = data else { return };
    let n = usize::from(*n).min(rest.len());
    let (challenge, answer) = rest.split_at(n);
    let challenge = (sel & 1 == 1 && valid_challenge(challenge)).then_some(challenge);
    let header = if sel & 2 == 0 {
        INFO_RESPONSE
    } else {
        STATUS_RESPONSE
    };
    let mut packet = Vec::with_capacity(answer.len() + 4);
    if sel & 4 == 0 {
        packet.extend_from_slice(&OOB);
    }
    packet.extend_from_slice(answer);
    check(&packet, header, challenge);
});
