//! What the relays' processes spent on a CPU, from `/proc`.

/// What a process's threads spent on a CPU, from `/proc/*/task/*/schedstat`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sched {
    /// Time on a CPU, ns.
    pub(crate) ns: u64,
    /// Times a thread was put on a CPU: its wake-ups, and its preemptions.
    pub(crate) runs: u64,
}

impl Sched {
    /// What was spent between `before` and `self`.
    pub(crate) fn since(self, before: Sched) -> Sched {
        Sched {
            ns: self.ns.saturating_sub(before.ns),
            runs: self.runs.saturating_sub(before.runs),
        }
    }

    /// Both together.
    pub(crate) fn add(self, other: Sched) -> Sched {
        Sched {
            ns: self.ns + other.ns,
            runs: self.runs + other.runs,
        }
    }
}

/// [`Sched`] of process `pid`'s threads and of its children's (nginx's worker); zero where it
/// cannot be read.
pub(crate) fn sched(pid: u32) -> Sched {
    let threads = |pid: u32| -> Sched {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Sched::default();
        };
        dir.flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .map(|s| {
                let mut f = s.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
                let ns = f.next().unwrap_or(0);
                Sched {
                    ns,
                    runs: f.nth(1).unwrap_or(0),
                }
            })
            .fold(Sched::default(), Sched::add)
    };
    let children: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    children
        .into_iter()
        .map(threads)
        .fold(threads(pid), Sched::add)
}

/// Clock ticks process `pid` and its children (nginx's worker) spent in user space and in the
/// kernel, from `/proc/*/stat`; (0, 0) where it cannot be read.
pub(crate) fn user_and_kernel_ticks(pid: u32) -> (u64, u64) {
    let of = |pid: u32| -> (u64, u64) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return (0, 0);
        };
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (tick(11), tick(12))
    };
    let children: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    std::iter::once(pid)
        .chain(children)
        .map(of)
        .fold((0, 0), |(u, k), (a, b)| (u + a, k + b))
}

/// Prints each relay's user-space share of its CPU since `before` (ticks of each, in the order
/// of `relays`): how much of it is its own code, what no change in user space could save.
pub(crate) fn print_user_share(relays: &[(&str, u32)], before: &[(u64, u64)]) {
    println!();
    for ((name, pid), (u0, k0)) in relays.iter().zip(before) {
        let (u, k) = user_and_kernel_ticks(*pid);
        let (user, kernel) = (u.saturating_sub(*u0), k.saturating_sub(*k0));
        let share = user as f64 / (user + kernel).max(1) as f64;
        println!(
            "{name} over these runs: {user} ticks in user space, {kernel} in the kernel: user space {:.1} % of its CPU (all of it saved would be at most {:.2} × the throughput).",
            100.0 * share,
            1.0 / (1.0 - share).max(f64::EPSILON)
        );
    }
}
