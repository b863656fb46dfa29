//! A keyed store of rate-limit state with a hard key cap.
//!
//! [`KeyedLimiter`] keeps one state per key (a source IP, a node id) for a [`Rule`] that decides
//! what one event does to that state. It holds at most `max_keys` keys, in a table allocated
//! once when the store is made and never resized ([`KeyedLimiter::slots`] is constant).
//!
//! # Forgetting
//! A key is forgotten when the rule says its state is [`Rule::at_rest`]: it carries no memory,
//! so a fresh state would decide exactly the same (a token bucket that refilled; a window that
//! ended with no penalty running). [`KeyedLimiter::sweep`] drops those that have also been idle
//! for `forget`, and the owner calls it now and then.
//!
//! # Policy at the cap
//! When a new key arrives and the map is full, the store first drops every at-rest entry
//! (whatever its idle time: dropping it loses nothing). If none could be dropped, the new key is
//! **refused** ([`Full`]) and the caller treats it as over the limit. Entries that still hold
//! memory (a drained bucket, an active penalty) are never evicted to make room, so a flood of
//! fresh spoofed keys can neither grow memory nor flush the state that limits a real abuser; at
//! worst it makes *new* keys wait until the flood's own entries come to rest. That full sweep
//! runs at most once per `sweep_gap`, so a flood at the cap costs one hash lookup per event.

use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::fixedmap::FixedMap;

/// What one event does to one key's state.
pub trait Rule {
    /// Per-key state.
    type State;
    /// The rule's answer for one event.
    type Verdict;

    /// The state of a key never seen before.
    fn fresh(&self, now: Instant) -> Self::State;
    /// Charges one event to `state` and says what to do with it.
    fn check(&self, state: &mut Self::State, now: Instant) -> Self::Verdict;
    /// True when `state` carries no memory: forgetting it changes no future decision.
    fn at_rest(&self, state: &Self::State, now: Instant) -> bool;
}

/// Bounds of a [`KeyedLimiter`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most keys remembered at once.
    pub max_keys: usize,
    /// A key at rest and idle this long is forgotten by [`KeyedLimiter::sweep`].
    pub forget: Duration,
    /// Shortest time between two full sweeps forced by a full map.
    pub sweep_gap: Duration,
}

/// The map is full of keys that still carry memory: the new key is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

#[derive(Debug)]
struct Entry<S> {
    state: S,
    last_seen: Instant,
}

/// A bounded map from key to rule state. See the module docs for the policy.
#[derive(Debug)]
pub struct KeyedLimiter<K, R: Rule> {
    rule: R,
    limits: Limits,
    entries: FixedMap<K, Entry<R::State>>,
    /// When a full map last forced a sweep.
    last_forced_sweep: Option<Instant>,
    /// Where the next [`KeyedLimiter::sweep_part`] starts.
    cursor: usize,
}

impl<K: Hash + Eq + Clone, R: Rule> KeyedLimiter<K, R> {
    /// A store for `rule` within `limits`; allocates all of its memory now.
    pub fn new(rule: R, limits: Limits) -> Self {
        KeyedLimiter {
            rule,
            limits,
            entries: FixedMap::new(limits.max_keys),
            last_forced_sweep: None,
            cursor: 0,
        }
    }

    /// Charges one event for `key`.
    ///
    /// # Errors
    /// [`Full`] when `key` is new and the map holds `max_keys` keys that still carry memory.
    pub fn check(&mut self, key: &K, now: Instant) -> Result<R::Verdict, Full> {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.last_seen = now;
            return Ok(self.rule.check(&mut entry.state, now));
        }
        if self.entries.len() >= self.limits.max_keys && !self.make_room(now) {
            return Err(Full);
        }
        let mut state = self.rule.fresh(now);
        let verdict = self.rule.check(&mut state, now);
        let entry = Entry {
            state,
            last_seen: now,
        };
        // Room was checked above.
        self.entries
            .insert_new(key.clone(), entry)
            .map_err(|_| Full)?;
        Ok(verdict)
    }

    /// Changes the state of a remembered `key` outside of [`KeyedLimiter::check`] (a penalty
    /// scored after the event was admitted). `None` when the key is not remembered.
    pub fn update<T>(
        &mut self,
        key: &K,
        now: Instant,
        f: impl FnOnce(&R, &mut R::State) -> T,
    ) -> Option<T> {
        let entry = self.entries.get_mut(key)?;
        entry.last_seen = now;
        Some(f(&self.rule, &mut entry.state))
    }

    /// As [`KeyedLimiter::update`], a key not remembered yet first given fresh state (when
    /// there is room, as [`KeyedLimiter::check`] makes it).
    ///
    /// # Errors
    /// [`Full`] when `key` is new and no room can be made.
    pub fn upsert<T>(
        &mut self,
        key: &K,
        now: Instant,
        f: impl FnOnce(&R, &mut R::State) -> T,
    ) -> Result<T, Full> {
        if self.entries.get(key).is_none() {
            if self.entries.len() >= self.limits.max_keys && !self.make_room(now) {
                return Err(Full);
            }
            let entry = Entry {
                state: self.rule.fresh(now),
                last_seen: now,
            };
            self.entries
                .insert_new(key.clone(), entry)
                .map_err(|_| Full)?;
        }
        self.update(key, now, f).ok_or(Full)
    }

    /// The state of `key`, if remembered.
    pub fn get(&self, key: &K) -> Option<&R::State> {
        self.entries.get(key).map(|e| &e.state)
    }

    /// Drops every key at rest and idle for `forget`. Returns how many were dropped.
    pub fn sweep(&mut self, now: Instant) -> usize {
        self.sweep_part(now, 1)
    }

    /// [`KeyedLimiter::sweep`] over one `parts`-th of the table's slots, from where the last
    /// call stopped: `parts` calls sweep the whole table, each costing that share of a full
    /// sweep's time (a full sweep of a large table is a stall of a millisecond or more for its
    /// owner's loop). Returns how many keys were dropped.
    pub fn sweep_part(&mut self, now: Instant, parts: usize) -> usize {
        let before = self.entries.len();
        let (rule, forget) = (&self.rule, self.limits.forget);
        let count = self.entries.slots().div_ceil(parts.max(1));
        self.cursor = self.entries.retain_slots(self.cursor, count, |_, e| {
            !(now.saturating_duration_since(e.last_seen) >= forget && rule.at_rest(&e.state, now))
        });
        before - self.entries.len()
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// Slots of the table: fixed when the store is made (twice `max_keys`, rounded up to a
    /// power of two), never changed.
    pub fn slots(&self) -> usize {
        self.entries.slots()
    }

    /// The rule.
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// Iterates over remembered keys and states.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &R::State)> {
        self.entries.iter().map(|(k, e)| (k, &e.state))
    }

    /// The map is full: drop the entries at rest, at most once per `sweep_gap`.
    fn make_room(&mut self, now: Instant) -> bool {
        let due = self
            .last_forced_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= self.limits.sweep_gap);
        if due {
            self.last_forced_sweep = Some(now);
            let rule = &self.rule;
            self.entries.retain(|_, e| !rule.at_rest(&e.state, now));
        }
        self.entries.len() < self.limits.max_keys
    }
}

/// A token bucket: `burst` events at once, then one every `interval`.
///
/// Kept as the time at which the bucket will be full again (the GCRA form), so the state is
/// one `Instant` and the bucket is at rest once that time has passed.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    interval: Duration,
    /// How far ahead of `now` the full-again time may be: `interval × (burst − 1)`.
    tolerance: Duration,
}

impl TokenBucket {
    /// A bucket of `burst` tokens (at least 1) refilled one per `interval`.
    pub fn new(burst: u32, interval: Duration) -> Self {
        TokenBucket {
            interval,
            tolerance: interval.saturating_mul(burst.max(1) - 1),
        }
    }
}

impl Rule for TokenBucket {
    /// When the bucket is full again.
    type State = Instant;
    /// `true`: allowed.
    type Verdict = bool;

    fn fresh(&self, now: Instant) -> Instant {
        now
    }

    fn check(&self, full_at: &mut Instant, now: Instant) -> bool {
        let start = (*full_at).max(now);
        if start.saturating_duration_since(now) > self.tolerance {
            return false;
        }
        *full_at = start + self.interval;
        true
    }

    fn at_rest(&self, full_at: &Instant, now: Instant) -> bool {
        *full_at <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    fn limits(max_keys: usize) -> Limits {
        Limits {
            max_keys,
            forget: Duration::from_secs(60),
            sweep_gap: Duration::from_millis(100),
        }
    }

    #[test]
    fn bucket_burst_then_rate() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(5, S), limits(8));
        let allowed = (0..8).filter(|_| l.check(&1u32, t0) == Ok(true)).count();
        assert_eq!(allowed, 5);
        assert_eq!(l.check(&1, t0 + Duration::from_millis(999)), Ok(false));
        assert_eq!(l.check(&1, t0 + S), Ok(true));
        assert_eq!(l.check(&1, t0 + S), Ok(false));
        assert_eq!(l.check(&1, t0 + 2 * S), Ok(true));
        // Another key has its own bucket.
        assert_eq!(l.check(&2, t0), Ok(true));
    }

    #[test]
    fn upsert_gives_a_new_key_fresh_state_within_the_bound() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(5, Duration::from_secs(100)), limits(2));
        assert_eq!(l.update(&1u32, t0, |_, _| ()), None, "update needs the key");
        assert_eq!(l.upsert(&1u32, t0, |r, s| r.check(s, t0)), Ok(true));
        assert!(l.get(&1).is_some());
        assert_eq!(l.upsert(&2, t0, |r, s| r.check(s, t0)), Ok(true));
        // Both hold a used bucket (not at rest): no room for a third.
        assert_eq!(l.upsert(&3, t0, |_, _| ()), Err(Full));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn refilled_bucket_is_at_rest() {
        let t0 = Instant::now();
        let b = TokenBucket::new(5, S);
        let mut st = b.fresh(t0);
        assert!(b.at_rest(&st, t0));
        assert!(b.check(&mut st, t0));
        assert!(!b.at_rest(&st, t0));
        assert!(b.at_rest(&st, t0 + S));
    }

    #[test]
    fn sweep_forgets_idle_keys_at_rest_only() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(2, Duration::from_secs(100)), limits(8));
        l.check(&1u32, t0).unwrap();
        // Key 2 drained: not at rest for 200 s.
        l.check(&2u32, t0).unwrap();
        l.check(&2u32, t0).unwrap();
        let later = t0 + Duration::from_secs(150);
        assert_eq!(l.sweep(later), 1);
        assert!(l.get(&1).is_none());
        assert!(l.get(&2).is_some());
        assert_eq!(l.sweep(t0 + Duration::from_secs(260)), 1);
        assert!(l.is_empty());
    }

    #[test]
    fn a_sweep_in_parts_forgets_what_a_full_sweep_does() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(2, Duration::from_secs(100)), limits(64));
        for k in 0..64u32 {
            l.check(&k, t0).unwrap();
            if k % 2 == 1 {
                l.check(&k, t0).unwrap(); // drained: not at rest for 200 s
            }
        }
        let soon = t0 + Duration::from_secs(30);
        let none: usize = (0..4).map(|_| l.sweep_part(soon, 4)).sum();
        assert_eq!(none, 0, "nothing idle for `forget` yet");
        let later = t0 + Duration::from_secs(450);
        // Every key is at rest at `later`: two rounds of four parts forget them all.
        let dropped: usize = (0..8).map(|_| l.sweep_part(later, 4)).sum();
        assert_eq!(dropped, 64);
        assert!(l.is_empty());
        // One part looks at a quarter of the slots.
        for k in 0..64u32 {
            l.check(&k, later).unwrap();
        }
        let much_later = later + Duration::from_secs(1000);
        let first = l.sweep_part(much_later, 4);
        assert!(first > 0 && first < 64, "{first}");
    }

    #[test]
    fn at_cap_new_keys_are_refused_and_drained_state_survives() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(1, S), limits(4));
        for k in 0..4u32 {
            assert_eq!(l.check(&k, t0), Ok(true));
        }
        // Every bucket drained: nothing can be evicted, the newcomer is refused.
        assert_eq!(l.check(&99, t0), Err(Full));
        assert_eq!(l.len(), 4);
        // Known keys are still judged by their own state.
        assert_eq!(l.check(&0, t0), Ok(false));
        // Once the old buckets refill they make room (after the sweep gap).
        assert_eq!(l.check(&99, t0 + S), Ok(true));
        assert!(l.get(&99).is_some());
    }

    #[test]
    fn forced_sweeps_are_spaced() {
        let t0 = Instant::now();
        let mut l = KeyedLimiter::new(TokenBucket::new(1, Duration::from_millis(10)), limits(2));
        l.check(&0u32, t0).unwrap();
        l.check(&1u32, t0).unwrap();
        assert_eq!(l.check(&2, t0), Err(Full)); // sweep ran, nothing at rest
        // 20 ms later the buckets are at rest, but the gap (100 ms) has not passed.
        assert_eq!(l.check(&2, t0 + Duration::from_millis(20)), Err(Full));
        assert_eq!(l.check(&2, t0 + Duration::from_millis(100)), Ok(true));
    }

    proptest! {
        /// Whatever the sequence of keys and times, the store never holds more than its cap
        /// and its table keeps its size.
        #[test]
        fn bounded_under_any_sequence(events in proptest::collection::vec((0u32..64, 0u64..50), 1..400)) {
            let t0 = Instant::now();
            let mut l = KeyedLimiter::new(TokenBucket::new(3, Duration::from_millis(20)), limits(16));
            let slots = l.slots();
            let mut t = t0;
            for (key, dt) in events {
                t += Duration::from_millis(dt);
                let _ = l.check(&key, t);
                if dt > 40 { l.sweep(t); }
                prop_assert!(l.len() <= 16);
                prop_assert_eq!(l.slots(), slots);
            }
        }
    }
}
