//! Signature checks of the descriptors a message carries, in batches, outside the machine:
//! the daemon runs them on a crypto slot, the simulator once per distinct descriptor.

use std::sync::Arc;

use super::Signed;
use crate::proto::descriptor::Descriptor;

/// The descriptors among `ds` that verify at `now` (those `worth` says to check; all when
/// it is shorter), each with its endpoint's address. One with an endpoint that does not
/// parse is refused: no one could reach it.
pub fn check(ds: &[Descriptor], worth: &[bool], now: u64) -> Vec<Arc<Signed>> {
    let picked: Vec<&Descriptor> = ds
        .iter()
        .enumerate()
        .filter(|(i, _)| worth.get(*i).copied().unwrap_or(true))
        .map(|(_, d)| d)
        .collect();
    let ok = Descriptor::verify_many(&picked, now);
    picked
        .into_iter()
        .zip(ok)
        .filter(|(_, ok)| *ok)
        .map(|(d, _)| Signed::trusted(d.clone()))
        .filter(|s| s.ip.is_some())
        .map(Arc::new)
        .collect()
}

/// The descriptors a message carries (a sync's own, a list), borrowed.
pub fn carried(msg: &super::Msg) -> &[Descriptor] {
    match msg {
        super::Msg::Sync { own, .. }
        | super::Msg::SyncReply { own, .. }
        | super::Msg::Hello { own, .. } => own.as_ref().map_or(&[], std::slice::from_ref),
        super::Msg::Descriptors(ds) => ds,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000;

    #[test]
    fn a_batch_keeps_the_good_and_refuses_only_the_bad() {
        let mut ds: Vec<Descriptor> = (1..=70u8)
            .map(|i| {
                crate::proto::descriptor::for_test([i; 32], format!("https://192.0.2.{i}:7001"), T0)
            })
            .collect();
        ds[5].issued_at += 1; // signature no longer matches
        ds[66].endpoint = "https://192.0.2.250:7001".into();
        let kept = check(&ds, &[], T0);
        assert_eq!(kept.len(), 68);
        assert!(kept.iter().all(|s| s.d != ds[5] && s.d != ds[66]));
        let worth: Vec<bool> = (0..70).map(|i| i < 10).collect();
        assert_eq!(check(&ds, &worth, T0).len(), 9, "only those worth checking");
        assert!(check(&ds, &[], T0 + 100_000).is_empty(), "expired");
    }
}
