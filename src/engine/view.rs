//! A per-process view of one lock directory, shared by every waiter in the process, so that a
//! waiter woken by its predecessor's deletion can usually decide without listing the directory
//! again (Curator lists it on every wake-up: O(N²) names read to drain N waiters).
//!
//! # Why this is safe
//! The view holds lock nodes that are *possibly alive*: nodes seen in some waiter's listing,
//! minus nodes *known to be deleted* (a `NodeDeleted` event or a `NoNode` reply). The invariant:
//!
//! > every lock node that is alive and has a lower sequence number than a waiter that merged
//! > its listing into the view is in the view.
//!
//! - Sequence numbers only grow: a node created after our create has a higher sequence number
//!   than ours. So the nodes below ours all existed before our create, and our listing — sent
//!   after our create on the same session, which the server answers in order — contains every
//!   one of them that was still alive. Merging that listing puts them all in the view.
//! - A node is removed from the view only when ZooKeeper told us it is gone, and deletion is
//!   final (names carry a sequence number and are never reused).
//! - Merging only the range of sequence numbers above what earlier merges covered keeps the
//!   invariant: a node below an earlier merger's sequence number was in that merger's listing.
//!
//! So the nodes the view has below ours are a *superset* of the nodes alive below ours on the
//! server. A driver decides from that superset, and every driver is monotone (`driver.rs`: if it
//! grants with a set of nodes ahead, it grants with any subset), so a grant from the view is a
//! grant from the truth — whatever the driver reads: the nearest node (a mutex), the n-th (a
//! semaphore), or the nearest *writer* past any number of readers (a read lock). For a mutex: if
//! the view has nothing alive below our node, nothing alive is below it on the server. Stale
//! entries (deleted without our noticing) only make the view larger than the truth, which is
//! safe; a waiter that watches one gets `NoNode` and removes it, so each stale entry costs one
//! read, once per process.
//!
//! The view holds every kind of node of the recipe's queue (a read/write lock's readers and
//! writers alike): the invariant is about sequence numbers, not kinds.
//!
//! # Nodes created beside another
//! The first bullet above is false for one kind of node: a *downgraded read* of a read/write lock
//! (Curator ≥ 5.5, CURATOR-621, and ours) is created as a plain `EPHEMERAL` node named with the
//! sequence number of its creator's write node — `_c_<uuid>-__READ__<s>` beside
//! `_c_<uuid'>-__WRIT__<s>` — so it can appear below a waiter that has already listed. The one
//! fact such nodes obey (assumption B; ours create theirs in a `multi` behind a check of the write
//! node, Curator's while its thread holds the write lock):
//!
//! > a node created beside another, with sequence number `s`, is created while the write node
//! > with sequence number `s` — created by the server, before every node with a higher one —
//! > exists.
//!
//! Curator checks nothing at the server: it creates the read while its *thread* believes it holds
//! the write lock. After its session expired (Curator survives an expiry with a new handle) or an
//! operator deleted its write node, that belief is stale, and Curator ≥ 5.5 can create
//! `__READ__<s>` with `W_s` gone. Such a read is unprotected in Curator itself (its own writers are
//! granted beside it just as ours are): the write lock it was downgraded from had been lost, which
//! Curator's holder was told (`LOST`) — B holds for every read created under a write lock that is
//! still held.
//!
//! Queues that admit such nodes (a driver's `admits_nodes_beside`; never a mutex's) change two
//! things, and the invariant becomes: *every lock node that is alive, has a lower sequence number
//! than a waiter that merged its listing, and was alive when that listing was taken, is in the
//! view* (a node the server numbered below the merger was created before its listing: alive now,
//! alive then — the invariant above).
//!
//! 1. Merges insert every listed node below the merger, not only the range above what earlier
//!    merges covered: a node created beside another after an earlier merger listed is still put
//!    in by any later listing that shows it. (A listing answered before a deletion that another
//!    waiter recorded first may put that node back: the view stays a superset, at the price of
//!    one `NoNode` read. A listing is sorted anyway, O(n log n); merging it is of the same order.)
//! 2. Only a read is ever created beside another, and a read blocks writers only. A reader's
//!    grant from the view is therefore still a grant from the truth. A writer whose latest
//!    listing showed a write node ahead of it confirms a grant from the view with a new listing
//!    and decides from that listing (a driver's `confirm_grant`).
//!
//! Why that suffices. Let writer `w` be granted at instant G, from the view or from a listing,
//! and let L be the latest listing it took (answered after its create; a confirming listing is
//! the latest). Suppose a node `x` below `w` is alive at G.
//! - `x` was created by the server: before `w`'s create, so alive at L, so in L, so in the view
//!   (and still there: only a deletion removes it) — `w` was not granted. Contradiction.
//! - `x` was created beside the write node `W_s`, `s < w`, before L: alive at L, so in L (and
//!   merged by (1)) — contradiction as above.
//! - `x` was created beside `W_s` after L: by assumption B, `W_s` was alive then, and it was
//!   created before `w` (`s < w`), so it was alive at L, a write node ahead of `w` in L. Then `w`
//!   did not decide from the view without confirming — and a grant from a confirming listing
//!   L' = L needs L to show nothing ahead. Contradiction.
//!
//! A writer of ours queued between a Curator 5.5+ write node and its downgrade thus waits for
//! the downgraded read, as Curator's own writers do; the cost is one listing per write handoff
//! that passed a write node, in read/write locks only.
//!
//! One caveat: the view is shared by the sessions of a process, which may be connected to
//! different servers of an ensemble. A deletion recorded by one session is a fact, but another
//! session's server may not have applied it yet — nor an earlier deletion of that session's own
//! node by an operator. Such a waiter can then be granted with a node already deleted; its hold
//! reports `Lost(NodeDeleted)` as soon as its server catches up (README, "Limits").
//!
//! # Near turns
//! A queued waiter watches its own node as well as its predecessor, so that a deletion of its
//! node is seen before its predecessor's (`engine/mod.rs`, `wait_for_turn`). A waiter deep in the
//! queue has no use for that watch until its turn comes near, and it costs a request and about
//! 0.75 KB of memory (issue 24): it is set once the node the waiter waits for is among the first
//! [`NEAR`] nodes of the view ([`DirView::near`]). Each deletion recorded in the view wakes the
//! waiters that became near, so a mutex waiter in a queue drained through this process sets its
//! watch about two handoffs before its turn. The view only decides *when* the watch is set; a
//! grant is never decided by it: a waiter granted before its watch is confirmed reads its node
//! first. That read is the cost where "near" comes late or not at all: a reader waiting for a
//! writer with three or more nodes ahead of it (granted together when the writer goes), a queue
//! whose head this process does not see go (stale entries), a fast handoff outrunning the
//! watch's reply. A waiter deep in the queue whose node someone deletes finds out when its turn
//! comes near (its watch's reply, or that read), and queues again then — not at once, as when
//! every waiter watched its own node; Curator's waiters do not watch theirs at all.
//!
//! Views are keyed by the directory's path *as the server names it* (the client's chroot
//! included), creation zxid and creation time (from the stat of the listing), so a directory that
//! was deleted and re-created never shares a view, nor do two directories created in one `multi`
//! (same zxid, same time) that two clients of the process reach under different chroots as the
//! same path (review I: keyed by the path under the chroot, a waiter in one chroot skipped the
//! holder of the other's lock, its merge range covered by the first's listing, and was granted
//! beside it). The same path on another ensemble shares a view only if its directory has the same
//! creation zxid and millisecond — one ensemble's data restored into another (README, "Limits").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};

use zookeeper_client as zk;

use crate::engine::driver::{Decision, LockDriver};
use crate::engine::naming::{LockChild, Queue};
// Every update of the view is a single map operation: a panic cannot leave a half-done change.
use crate::sync::lock;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ViewKey {
    dir: String,
    queue: Queue,
    dir_czxid: i64,
    dir_ctime: i64,
}

/// The shared view of one lock directory instance.
#[derive(Debug)]
pub(crate) struct DirView {
    key: ViewKey,
    state: Mutex<ViewState>,
}

#[derive(Debug)]
struct ViewState {
    /// Possibly alive lock nodes, in queue order (sequence, then name: a non-sequential child
    /// named like a lock node may share a sequence number with a real one).
    alive: BTreeSet<LockChild>,
    /// Listings merged so far cover every node with a sequence number up to this.
    covered_upto: i64,
    /// Waiters to wake once their turn is near ([`DirView::near`]), by the sequence numbers of the
    /// node each waits for and of its own.
    near: BTreeMap<(i64, i64), Waker>,
}

/// How near the head of the view the node a waiter waits for must be before the waiter watches
/// its own node (module docs, *Near turns*): among the first three, so that a mutex waiter's
/// watch is set two handoffs before its turn. (With the first two — one handoff — 5 to 15 of
/// 1,000 grants in `tests/drain.rs`'s fast drain came before the watch's reply and read the node
/// first; with three, none.)
pub(crate) const NEAR: usize = 3;

impl ViewState {
    /// The greatest sequence number of a node that is near the head: among the first [`NEAR`].
    fn near_upto(&self) -> i64 {
        self.alive.iter().nth(NEAR - 1).map_or(i64::MAX, |child| child.sequence)
    }
}

type Registry = Mutex<HashMap<ViewKey, Weak<DirView>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl DirView {
    /// The process's view of the directory `dir` whose stat a listing returned.
    pub(crate) fn of(dir: &str, queue: Queue, dir_stat: &zk::Stat) -> Arc<DirView> {
        let key = ViewKey { dir: dir.to_owned(), queue, dir_czxid: dir_stat.czxid, dir_ctime: dir_stat.ctime };
        let mut views = lock(registry());
        if let Some(view) = views.get(&key).and_then(Weak::upgrade) {
            return view;
        }
        let view = Arc::new(DirView {
            key: key.clone(),
            state: Mutex::new(ViewState { alive: BTreeSet::new(), covered_upto: i64::MIN, near: BTreeMap::new() }),
        });
        views.insert(key, Arc::downgrade(&view));
        view
    }

    /// Merges a listing taken after the create of our node `ours` (lock nodes in queue order).
    /// With `beside` (a queue that admits nodes created beside another), every listed node up to
    /// ours is merged, not only those above the range earlier merges covered (module docs).
    pub(crate) fn merge(&self, listing: &[LockChild], ours: i64, beside: bool) {
        let mut state = lock(&self.state);
        let from = if beside { 0 } else { listing.partition_point(|child| child.sequence <= state.covered_upto) };
        let to = listing.partition_point(|child| child.sequence <= ours);
        for child in listing.get(from..to).unwrap_or_default() {
            state.alive.insert(child.clone());
        }
        state.covered_upto = state.covered_upto.max(ours);
    }

    /// Lets `driver` decide for our node `ours` from the possibly alive nodes ahead of it;
    /// `None` if our node is known to be gone.
    pub(crate) fn decide(&self, driver: &dyn LockDriver, ours: &LockChild) -> Option<Decision> {
        let state = lock(&self.state);
        if !state.alive.contains(ours) {
            return None;
        }
        Some(driver.decide(ours.kind, &mut state.alive.range(..ours).rev()))
    }

    /// Records that `child` is gone, and wakes the waiters whose turn it made near.
    pub(crate) fn deleted(&self, child: &LockChild) {
        let mut woken = Vec::new();
        {
            let mut state = lock(&self.state);
            state.alive.remove(child);
            let upto = state.near_upto();
            while let Some(entry) = state.near.first_entry() {
                if entry.key().0 > upto {
                    break;
                }
                woken.push(entry.remove());
            }
        }
        // Woken outside the lock: a waker may run its task at once.
        woken.into_iter().for_each(Waker::wake);
    }

    /// Resolves once the node with sequence number `waited_for` is among the first [`NEAR`] nodes
    /// of the view (at once if it is): then the waiter of our node `ours` sets its own-node
    /// watch (module docs, *Near turns*). Cancel safe; dropped, it leaves nothing in the view.
    pub(crate) fn near(&self, waited_for: i64, ours: i64) -> Near<'_> {
        Near { view: self, key: (waited_for, ours), registered: false }
    }
}

/// The future of [`DirView::near`].
pub(crate) struct Near<'v> {
    view: &'v DirView,
    key: (i64, i64),
    /// Whether our waker is in the view's `near` map.
    registered: bool,
}

impl Future for Near<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let key = self.key;
        let mut state = lock(&self.view.state);
        if self.registered {
            return match state.near.get_mut(&key) {
                // Taken out by `deleted`: near.
                None => {
                    drop(state);
                    self.registered = false;
                    Poll::Ready(())
                },
                Some(waker) => {
                    waker.clone_from(cx.waker());
                    Poll::Pending
                },
            };
        }
        if key.0 <= state.near_upto() {
            return Poll::Ready(());
        }
        state.near.insert(key, cx.waker().clone());
        drop(state);
        self.registered = true;
        Poll::Pending
    }
}

impl Drop for Near<'_> {
    fn drop(&mut self) {
        if self.registered {
            lock(&self.view.state).near.remove(&self.key);
        }
    }
}

impl Drop for DirView {
    fn drop(&mut self) {
        let mut views = lock(registry());
        if views.get(&self.key).is_some_and(|view| view.strong_count() == 0) {
            views.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::driver::StandardDriver;

    fn child(sequence: i64) -> LockChild {
        LockChild { name: format!("_c_x-lock-{sequence:010}").into(), sequence, kind: 0 }
    }

    fn stat(czxid: i64) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: 0,
            pzxid: 0,
            ctime: 7,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children: 0,
        }
    }

    #[test]
    fn views_are_shared_per_directory_instance() {
        let a = DirView::of("/view-test/a", &["lock-"], &stat(1));
        let b = DirView::of("/view-test/a", &["lock-"], &stat(1));
        let c = DirView::of("/view-test/a", &["lock-"], &stat(2));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        drop((a, b, c));
        assert!(!lock(registry()).keys().any(|key| key.dir == "/view-test/a"));
    }

    #[test]
    fn nodes_sharing_a_sequence_number_are_both_kept() {
        let view = DirView::of("/view-test/c", &["lock-"], &stat(1));
        let mutex = StandardDriver { queue: &["lock-"], kind: 0, max_leases: 1 };
        let real = LockChild { name: "_c_a-lock-0000000042".into(), sequence: 42, kind: 0 };
        let copy = LockChild { name: "lock-0000000042".into(), sequence: 42, kind: 0 };
        let ours = child(43);
        view.merge(&[real.clone(), copy.clone(), ours.clone()], 43, false);
        assert_eq!(view.decide(&mutex, &real), Some(Decision::Acquired));
        view.deleted(&copy);
        assert_eq!(view.decide(&mutex, &ours), Some(Decision::WaitFor(real.clone())));
    }

    #[test]
    fn merge_covers_ranges_once_and_deletions_stick() {
        let view = DirView::of("/view-test/b", &["lock-"], &stat(1));
        let mutex = StandardDriver { queue: &["lock-"], kind: 0, max_leases: 1 };
        view.merge(&[child(1), child(2), child(3)], 3, false);
        assert_eq!(view.decide(&mutex, &child(3)), Some(Decision::WaitFor(child(2))));
        view.deleted(&child(1));
        // A later listing still showing node 1 (taken before its deletion) does not revive it.
        view.merge(&[child(1), child(2), child(3), child(5)], 5, false);
        assert_eq!(view.decide(&mutex, &child(2)), Some(Decision::Acquired));
        view.deleted(&child(3));
        assert_eq!(view.decide(&mutex, &child(5)), Some(Decision::WaitFor(child(2))));
        view.deleted(&child(2));
        assert_eq!(view.decide(&mutex, &child(5)), Some(Decision::Acquired));
        // Our own node known deleted: no decision.
        assert_eq!(view.decide(&mutex, &child(3)), None);
    }

    #[test]
    fn a_node_created_beside_another_is_merged_below_the_covered_range() {
        let view = DirView::of("/view-test/d", &["lock-"], &stat(1));
        let mutex = StandardDriver { queue: &["lock-"], kind: 0, max_leases: 1 };
        view.merge(&[child(1), child(4)], 4, true);
        view.deleted(&child(1));
        // Created beside node 1 after the first merge (sequence 1, below the covered range).
        let beside = LockChild { name: "_c_y-lock-0000000001".into(), sequence: 1, kind: 0 };
        view.merge(&[beside.clone(), child(4), child(6)], 6, false);
        assert_eq!(view.decide(&mutex, &child(4)), Some(Decision::Acquired), "a mutex's merge skips covered ranges");
        view.merge(&[beside.clone(), child(4), child(6)], 6, true);
        assert_eq!(view.decide(&mutex, &child(4)), Some(Decision::WaitFor(beside)));
    }

    struct Flag(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn poll_near(near: &mut Near<'_>, flag: &Arc<Flag>) -> Poll<()> {
        let waker = Waker::from(flag.clone());
        Pin::new(near).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_waiter_is_woken_once_the_node_it_waits_for_is_near_the_head() {
        let view = DirView::of("/view-test/e", &["lock-"], &stat(1));
        let near = NEAR as i64;
        let queue: Vec<LockChild> = (1..=near + 3).map(child).collect();
        view.merge(&queue, near + 3, false);
        let flag = Arc::new(Flag(false.into()));
        let woken = || flag.0.load(std::sync::atomic::Ordering::SeqCst);
        // Waiting for the NEAR-th node: near at once.
        assert!(poll_near(&mut view.near(near, near + 1), &flag).is_ready());
        // Waiting for the one two places further: not yet, and woken only by the deletion that
        // brings it among the first NEAR.
        let mut later = view.near(near + 2, near + 3);
        assert!(poll_near(&mut later, &flag).is_pending());
        view.deleted(&child(1));
        assert!(!woken(), "woken while the node it waits for is not among the first NEAR");
        assert!(poll_near(&mut later, &flag).is_pending());
        view.deleted(&child(2));
        assert!(woken(), "not woken once the node it waits for is among the first NEAR");
        assert!(poll_near(&mut later, &flag).is_ready());
        // A waiter dropped before its turn came near leaves nothing behind.
        let mut dropped = view.near(i64::MAX - 1, i64::MAX);
        assert!(poll_near(&mut dropped, &flag).is_pending());
        assert_eq!(lock(&view.state).near.len(), 1);
        drop(dropped);
        assert!(lock(&view.state).near.is_empty());
    }
}
