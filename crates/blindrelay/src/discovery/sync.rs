//! Reconciliation: range-based set reconciliation (Negentropy) of this node's whole view
//! against what a peer passes on, then the missing descriptors fetched by id.
//!
//! The initiator reconciles every descriptor it holds (so what it holds but has not reached
//! yet is not fetched again); the responder answers from the descriptors of identities it
//! reached (what it would pass on), statelessly: each round is answered from a snapshot of the
//! moment. A session ends after [`MAX_ROUNDS`] rounds, [`MAX_SESSION_BYTES`] or
//! [`SESSION_TIME`], whichever first; what it found missing is fetched [`GET_CHUNK`] ids at a
//! time, at most [`MAX_NEED`]. Items both sides hold confirm the initiator's entries rooted
//! elsewhere than the responder (`super::eclipse`).
//!
//! Sessions start: at start, with up to `start_syncs` sources from distinct roots (the
//! operator's first, then the peer store's, then any reached peer); with an operator's source
//! as soon as it is fetched anew (a `--peer` or seed added); then one every interval for the
//! first [`super::SYNC_INTERVALS`], and one every `sync_every` after, with a reached peer at
//! random, or, when eclipse detection is not content, with one under another root (the
//! operator's first).

use hashbrown::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use negentropy::{Id, Negentropy};
use rand::Rng;

use super::items::Snapshot;
use super::view::{Entry, View};
use super::wire::descriptor_len;
use super::{Discovery, EclipseState, Failed, Msg, Now, Purpose, Signed, Source};
use crate::proto::NodeId;
use crate::proto::descriptor::Descriptor;

/// Rounds of one reconciliation at most.
pub const MAX_ROUNDS: u32 = 12;
/// Bytes of one reconciliation's rounds at most (both ways).
pub const MAX_SESSION_BYTES: usize = 4 << 20;
/// One reconciliation and its fetches end within this.
pub const SESSION_TIME: Duration = Duration::from_secs(60);
/// Largest round message (Negentropy's frame limit).
pub const FRAME: u64 = 128 * 1024;
/// Ids asked for in one request at most.
pub const GET_CHUNK: usize = 1024;
/// Ids fetched after one reconciliation at most.
pub const MAX_NEED: usize = 100_000;
/// Bytes of descriptors in one answer at most.
pub const MAX_ANSWER: usize = 512 * 1024;
/// Reconciliations in flight at most.
const MAX_SESSIONS: usize = 4;

/// One reconciliation as the initiator.
struct Session {
    peer: NodeId,
    root: u32,
    neg: Negentropy<'static, Snapshot>,
    mine: Snapshot,
    have: HashSet<NodeId>,
    need: Vec<NodeId>,
    rounds: u32,
    bytes: usize,
    deadline: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("rounds", &self.rounds)
            .field("need", &self.need.len())
            .finish_non_exhaustive()
    }
}

/// The reconciliations.
#[derive(Debug, Default)]
pub struct Syncs {
    sessions: HashMap<u64, Session>,
    next_sid: u64,
    next_periodic: Option<Instant>,
    /// Periodic reconciliations started.
    periodic: u32,
    started: bool,
    last_ok: Option<u64>,
    roots: HashSet<u32>,
}

impl Syncs {
    /// The heap its sessions take, estimated (snapshots counted whole, shared or not).
    pub fn heap_bytes(&self) -> usize {
        self.sessions
            .values()
            .map(|s| s.mine.all().len() * 8 + s.have.capacity() * 41 + s.need.capacity() * 32)
            .sum::<usize>()
            + self.sessions.capacity() * 200
    }
}

impl Syncs {
    /// True once the first reconciliations started.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Distinct roots this node completed a reconciliation with.
    pub fn roots_synced(&self) -> usize {
        self.roots.len()
    }

    /// When a reconciliation last completed.
    pub fn last_ok(&self) -> Option<u64> {
        self.last_ok
    }
}

/// The responder's round: `round` reconciled against what this node passes on. A malformed
/// round gets an empty answer.
pub fn respond(view: &mut View, round: &[u8]) -> Vec<u8> {
    let snap = view.passable();
    Negentropy::owned(snap, FRAME)
        .and_then(|mut neg| neg.reconcile(round))
        .unwrap_or_default()
}

/// The descriptors of `ids` this node passes on, at most [`MAX_ANSWER`] bytes.
pub fn serve(view: &View, ids: &[NodeId]) -> Vec<Descriptor> {
    let mut bytes = 0;
    let mut out = Vec::new();
    for id in ids.iter().take(GET_CHUNK) {
        let Some(e) = view.get(id).filter(|e| e.reached().is_some()) else {
            continue;
        };
        bytes += descriptor_len(&e.s.d);
        if bytes > MAX_ANSWER {
            break;
        }
        out.push(e.s.d.clone());
    }
    out
}

impl Discovery {
    /// Starts the reconciliations due: the first ones at start, then one per `sync_every`.
    pub(super) fn start_syncs(&mut self, now: Now) {
        if self.sync.sessions.len() >= MAX_SESSIONS {
            return;
        }
        if !self.sync.started {
            let partners = self.start_partners();
            if partners.is_empty() {
                return;
            }
            self.sync.started = true;
            for s in partners {
                self.begin(s, now);
            }
            self.sync.next_periodic = Some(now.at + self.cfg.interval);
            return;
        }
        if self.sync.next_periodic.is_some_and(|t| now.at < t) {
            return;
        }
        // A node just started reconciles every interval at first, then every `sync_every`.
        self.sync.periodic += 1;
        let gap = if self.sync.periodic < super::SYNC_INTERVALS {
            self.cfg.interval
        } else {
            self.cfg.sync_every
        };
        self.sync.next_periodic = Some(now.at + gap);
        if let Some(s) = self.periodic_partner() {
            self.begin(s, now);
        }
    }

    /// Up to `start_syncs` sources from distinct roots: the operator's, then the store's, then
    /// any reached peer.
    fn start_partners(&mut self) -> Vec<Arc<Signed>> {
        let mut ranked: Vec<(usize, u32, Arc<Signed>, u32)> = self
            .view
            .iter()
            .filter(|e| e.healthy())
            .map(|e| {
                let o = self.view.origin(e);
                let rank = if o.is_operator() { 0 } else { o.class() + 1 };
                (rank, self.rng.random(), Arc::clone(&e.s), self.view.root(e))
            })
            .collect();
        ranked.sort_unstable_by_key(|r| (r.0, r.1));
        let mut roots = HashSet::new();
        let mut out = Vec::new();
        for (_, _, s, root) in ranked {
            if out.len() >= self.cfg.start_syncs {
                break;
            }
            if roots.insert(root) {
                out.push(s);
            }
        }
        out
    }

    /// A reached peer at random; when eclipse detection is not content, one under another
    /// root than the largest (the operator's first).
    fn periodic_partner(&mut self) -> Option<Arc<Signed>> {
        let eclipse = self.eclipse();
        if eclipse.state != EclipseState::Ok {
            let top = self.view.roots().top;
            let mut other: Vec<(bool, u32, &Entry)> = self
                .view
                .iter()
                .filter(|e| e.healthy() && Some(self.view.root(e)) != top)
                .map(|e| (!self.view.origin(e).is_operator(), 0, e))
                .collect();
            for o in &mut other {
                o.1 = self.rng.random();
            }
            if let Some((_, _, e)) = other.into_iter().min_by_key(|o| (o.0, o.1)) {
                return Some(Arc::clone(&e.s));
            }
        }
        self.random_reached().or_else(|| self.any_reached())
    }

    /// A reached, healthy peer at random (from what this node passes on).
    pub(super) fn random_reached(&mut self) -> Option<Arc<Signed>> {
        let mut snap = self.view.passable_as_merged();
        if snap.all().is_empty() {
            snap = self.view.passable();
        }
        let all = snap.all();
        if all.is_empty() {
            return None;
        }
        for _ in 0..8 {
            let s = &all[self.rng.random_range(0..all.len())];
            if self.view.get(&s.d.node_id).is_some_and(Entry::healthy) {
                return Some(Arc::clone(s));
            }
        }
        None
    }

    /// A reconciliation partner when no healthy one is at hand (a node whose few peers each
    /// failed an exchange): a reached peer tried again, once per period, so one lost exchange
    /// never cuts a node off; an answer clears its failures.
    fn any_reached(&mut self) -> Option<Arc<Signed>> {
        let snap = self.view.passable();
        let all = snap.all();
        (!all.is_empty()).then(|| Arc::clone(&all[self.rng.random_range(0..all.len())]))
    }

    /// Starts a reconciliation with `peer`.
    pub(super) fn begin(&mut self, peer: Arc<Signed>, now: Now) {
        let id = peer.d.node_id;
        if self.sync.sessions.values().any(|s| s.peer == id) {
            return;
        }
        let root = self.view.get(&id).map(|e| self.view.root(e));
        let mine = self.view.all();
        let Ok(mut neg) = Negentropy::owned(mine.clone(), FRAME) else {
            return;
        };
        let Ok(round) = neg.initiate() else {
            return;
        };
        let sid = self.sync.next_sid;
        self.sync.next_sid += 1;
        let session = Session {
            peer: id,
            root: root.unwrap_or(0),
            neg,
            mine,
            have: HashSet::new(),
            need: Vec::new(),
            rounds: 1,
            bytes: round.len(),
            deadline: now.at + SESSION_TIME,
        };
        self.sync.sessions.insert(sid, session);
        let own = self.own.as_ref().map(|o| o.d.clone());
        self.request(peer, Msg::Sync { own, round }, Purpose::Sync(sid), now);
    }

    /// A round's answer: the peer's own descriptor learned, the next round sent, or the
    /// session done and its missing descriptors fetched.
    pub(super) fn sync_answered(
        &mut self,
        sid: u64,
        reply: Result<&Msg, Failed>,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) {
        let Some(mut session) = self.sync.sessions.remove(&sid) else {
            return;
        };
        let round = match reply {
            Ok(Msg::SyncReply { round, .. }) => round,
            _ => {
                self.session_failed(&session.peer, reply, now);
                return;
            }
        };
        let peer = session.peer;
        for s in checked.into_iter().filter(|s| s.d.node_id == peer) {
            let _ = self.learn(s, Source::Peer(peer), now);
        }
        self.view.reached(&peer, now.unix);
        session.bytes += round.len();
        let (mut have, mut need): (Vec<Id>, Vec<Id>) = (Vec::new(), Vec::new());
        // An empty round is a responder that could not read ours: nothing was reconciled.
        let next = if round.is_empty() {
            Err(negentropy::Error::ProtocolVersionNotFound)
        } else {
            session.neg.reconcile_with_ids(round, &mut have, &mut need)
        };
        session.have.extend(have.iter().map(|i| **i));
        for id in need {
            if session.need.len() < MAX_NEED && self.view.get(&id).is_none() {
                session.need.push(*id);
            }
        }
        match next {
            Ok(Some(next))
                if session.rounds < MAX_ROUNDS
                    && session.bytes + next.len() <= MAX_SESSION_BYTES
                    && now.at < session.deadline =>
            {
                session.rounds += 1;
                session.bytes += next.len();
                let to = self.view.get(&peer).map(|e| Arc::clone(&e.s));
                if let Some(to) = to {
                    let msg = Msg::Sync {
                        own: None,
                        round: next,
                    };
                    self.sync.sessions.insert(sid, session);
                    self.request(to, msg, Purpose::Sync(sid), now);
                }
            }
            Ok(None) => {
                self.reconciled(&session, now);
                self.fetch(sid, session, now);
            }
            // Cut short (bounds) or garbled: what was found is still fetched.
            _ => self.fetch(sid, session, now),
        }
    }

    /// A session with `peer` ended by a failed exchange: counted against the peer, or, if it
    /// answered busy, nothing counted and the next reconciliation brought forward to within
    /// [`super::probes::BUSY_RETRY`] (with jitter).
    fn session_failed(&mut self, peer: &NodeId, reply: Result<&Msg, Failed>, now: Now) {
        if !matches!(reply, Err(Failed::Busy)) {
            self.view.failed(peer);
            return;
        }
        let soon = now.at + self.jittered(super::probes::BUSY_RETRY.min(self.cfg.interval));
        if self.sync.next_periodic.is_none_or(|t| t > soon) {
            self.sync.next_periodic = Some(soon);
        }
    }

    /// A completed reconciliation: the entries both sides hold confirmed by the peer's root.
    fn reconciled(&mut self, session: &Session, now: Now) {
        self.stats.syncs += 1;
        self.sync.last_ok = Some(now.unix);
        self.sync.roots.insert(session.root);
        let common = session
            .mine
            .all()
            .iter()
            .map(|s| &s.d.node_id)
            .filter(|id| !session.have.contains(*id));
        self.view.confirm(common, session.root);
    }

    /// Asks for the next chunk of what the session found missing.
    fn fetch(&mut self, sid: u64, mut session: Session, now: Now) {
        if session.need.is_empty() || now.at >= session.deadline {
            return;
        }
        let take = session.need.len().min(GET_CHUNK);
        let ids: Vec<NodeId> = session.need.drain(..take).collect();
        let Some(to) = self.view.get(&session.peer).map(|e| Arc::clone(&e.s)) else {
            return;
        };
        self.sync.sessions.insert(sid, session);
        self.request(to, Msg::Get(ids), Purpose::Get(sid), now);
    }

    /// A chunk of descriptors: kept as the peer's, then the next chunk asked for.
    pub(super) fn get_answered(
        &mut self,
        sid: u64,
        reply: Result<&Msg, Failed>,
        checked: Vec<Arc<Signed>>,
        now: Now,
    ) {
        let Some(session) = self.sync.sessions.remove(&sid) else {
            return;
        };
        if reply.is_err() {
            self.session_failed(&session.peer, reply, now);
            return;
        }
        let peer = session.peer;
        for s in checked {
            let _ = self.learn(s, Source::Peer(peer), now);
        }
        self.fetch(sid, session, now);
    }
}
