//! The relay's tokenizer (first two words, as ranges, nothing allocated) against the literal
//! model of `MSG_ReadStringLine` + `Cmd_TokenizeString`, engine by engine.
#![no_main]

use etrelay::et::tokenizer::{Engine as RelayEngine, MAX_LINE, first_tokens, line};
use etrelay_testkit::q3model::{self, ENGINES, Engine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let l = line(body);
    assert!(l.len() <= MAX_LINE);
    assert!(!l.contains(&0) && !l.contains(&b'\n'));
    for e in ENGINES {
        let re = match e {
            Engine::Et260 => RelayEngine::Et260,
            Engine::EtLegacy => RelayEngine::EtLegacy,
            Engine::Ioq3 => RelayEngine::Ioq3,
        };
        let model = q3model::tokenize(e, &q3model::read_string_line(e, body));
        let relay: Vec<Vec<u8>> = first_tokens(re, l)
            .into_iter()
            .flatten()
            .map(|r| l[r].iter().map(|&b| re.map(b)).collect())
            .collect();
        let want: Vec<Vec<u8>> = model.into_iter().take(2).collect();
        assert_eq!(relay, want, "{e:?}");
    }
    // The unsigned-`char` build reads a line without high bytes like every other build.
    if l.iter().all(|&b| b < 0x80) {
        let a = first_tokens(RelayEngine::UnsignedChar, l);
        assert_eq!(a, first_tokens(RelayEngine::EtLegacy, l));
    }
});
