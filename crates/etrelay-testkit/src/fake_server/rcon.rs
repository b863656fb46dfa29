//! ET 2.60b's rcon: the global gap between rcon packets, the password, and the few commands
//! the fake runs.

use tokio::time::Instant;

use super::{RCON_GAP, State, reply};
use crate::q3model::{self, Engine};

/// `SVC_RemoteCommand` of ET 2.60b.
pub(super) fn rcon(st: &mut State, packet: &[u8], args: &[Vec<u8>]) -> Option<Vec<u8>> {
    let now = Instant::now();
    if let Some(last) = st.last_rcon
        && now < last + RCON_GAP
    {
        return None;
    }
    st.last_rcon = Some(now);

    let password = args.get(1).map(Vec::as_slice).unwrap_or(b"");
    if st.rcon_password.is_empty() || password != st.rcon_password.as_bytes() {
        return reply("print\nBad rconpassword.\n");
    }

    // The command text is re-read from the raw line (`Cmd_Cmd()`): skip 4
    // raw chars ("rcon"), spaces, one word (the password), spaces.
    let line = q3model::read_string_line(Engine::Et260, &packet[4..]);
    let mut i = 4.min(line.len());
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    while i < line.len() && line[i] != b' ' {
        i += 1;
    }
    while i < line.len() && line[i] == b' ' {
        i += 1;
    }
    let command = &line[i..];
    let text = String::from_utf8_lossy(command).into_owned();
    if !text.is_empty() {
        st.rcon_executed.push(text);
    }
    let output = execute(st, command);
    reply(&format!("print\n{output}"))
}

/// Runs one console command, returns its printed output.
fn execute(st: &mut State, command: &[u8]) -> String {
    let argv: Vec<String> = q3model::tokenize(Engine::Et260, command)
        .into_iter()
        .map(|t| String::from_utf8_lossy(&t).into_owned())
        .collect();
    let Some(name) = argv.first() else {
        return String::new();
    };
    match name.to_ascii_lowercase().as_str() {
        "sets" => {
            if argv.len() < 3 {
                return "usage: sets <variable> <value>\n".to_string();
            }
            let key = &argv[1];
            let value = argv[2..].join(" ");
            if [key.as_str(), value.as_str()]
                .iter()
                .any(|s| s.contains(['\\', ';', '"']))
            {
                return "Can't use keys or values with a \\, ; or \"\n".to_string();
            }
            st.set_cvar(key, &value);
            String::new()
        }
        "status" => {
            let mut out = format!("map: {}\n", st.cvar_or("mapname", ""));
            out.push_str(
                "num score ping name            lastmsg address               qport rate\n",
            );
            out.push_str(
                "--- ----- ---- --------------- ------- --------------------- ----- -----\n",
            );
            for (num, (score, ping, pname)) in st.players.iter().enumerate() {
                out.push_str(&format!(
                    "{num:>3} {score:>5} {ping:>4} {pname:<15} {:>7} {:<21} {:>5} {:>5}\n",
                    0, "bot", 0, 25000
                ));
            }
            out.push('\n');
            out
        }
        "serverinfo" => {
            let mut out = String::from("Server info settings:\n");
            for (k, v) in &st.cvars {
                out.push_str(&format!("{k:<20}{v}\n"));
            }
            out
        }
        _ => String::new(),
    }
}
