//! Leases: the part of Curator's `InterProcessSemaphoreV2` acquire that runs under its internal
//! lock — create lease nodes in the `leases` directory, wait until it holds at most `max_leases`
//! children, and hand the nodes to the session monitor as holds. The internal lock itself is the
//! recipe's (`recipes/semaphore.rs`): an ordinary engine mutex on `<path>/locks`.
//!
//! # The lease bound
//! > At no instant do more than `max_leases` lease nodes exist that were granted (by us or by
//! > Curator) and are still held.
//!
//! The rule, Curator's: a lease node is granted once a listing of `leases`, taken *after* the
//! node was created, shows at most `max_leases` children — every child, of any name.
//!
//! Proof. Suppose at some instant `t` a set `S` of `max_leases + 1` granted lease nodes exist.
//! Take `x`, the member of `S` whose create came last in the ensemble's total order. Its grant
//! rests on a listing `L` taken after its create, on its own session: the server answering `L`
//! has applied `x`'s create (a session's requests are answered in order), so it has applied every
//! create before it, among them those of all of `S`. None of them was deleted by then: each still
//! exists at `t`, and `t` comes after `x`'s grant, so after `L`; a node deleted before `L` was
//! served cannot exist at `t` (nodes are never re-created under the same name: sequence numbers
//! and GUIDs are fresh). So `L` lists all of `S`: `max_leases + 1` children, and `x` was not
//! granted. Contradiction. ∎
//!
//! The premise is that `L` lists `x` (the code checks that every node of ours is listed: a reply
//! that came over another connection might not be after our create). "Exists at `t`" is about the
//! state the ensemble has committed: a server answers from a prefix of the committed history, so
//! `L` shows no deletion committed after `t`.
//!
//! The proof uses neither the internal lock nor the order of sequence numbers: the lock is for
//! liveness (only its holder has a lease node that is not granted, so waiting nodes do not block
//! each other — as long as the holders of granted leases return them in the end; a Curator
//! `acquire(n)` that holds part of its leases while it queues for the rest can block for ever, as
//! it blocks another Curator's) and for fairness (acquirers are served in the lock's order). A
//! node created by an acquire that is not granted (a cancel, a timeout, an error) only makes
//! others wait longer until it is deleted; it never lets anyone in.
//!
//! The bound is about nodes. A holder learns that its lease is gone — its session expired, its
//! node deleted by someone else — through the session monitor, exactly as a lock holder does, so
//! it is told before ZooKeeper can let another acquirer count one child fewer (`view.rs` and
//! `session/monitor.rs` carry that argument; a lease node is watched like a lock node).
//!
//! # The internal lock
//! The internal lock is an engine mutex whose holders and waiters do not watch their own nodes
//! (`LockInternals::without_own_node_watch`: one request less per acquire). Its grant may then
//! be false: a waiter whose node someone else deleted is granted when its predecessor goes,
//! beside the rightful holder (in one process the shared directory view usually notices the
//! deletion; across processes nothing does). What that costs:
//! - *No lease too many*: the proof above uses no lock.
//! - *No stall*: two holders of the lock may both wait in a full pool, each counting the other's
//!   lease node — for ever, were both to wait there. So a holder waiting in the pool watches its
//!   own lock node (only then: a grant with room in the pool costs no watch), and when it is gone
//!   gives its lease nodes up and queues again (`Error::LockLost` to the recipe, which starts
//!   over). Of any set of holders waiting in the pool, all but the rightful one — whose node
//!   exists — leave it; the rightful one is served as the pool drains, as in Curator.
//!   (`tests/interop/semaphore_interop.rs` has a falsely granted waiter of ours beside a Curator
//!   acquirer; it stalls without this.)
//!
//! # Waiting
//! Only the holder of the internal lock waits here, with one children watch on `leases` — the one
//! watcher of the semaphore, as in Curator — and lists again on each change. Every other acquirer
//! waits in the internal lock's queue, each watching its own predecessor there.

use std::sync::Arc;

use tracing::{debug, Span};
use uuid::Uuid;
use zookeeper_client as zk;

use super::{delay, Grant, LockInternals, LockNode, OnSession, MAX_NODE_LOSSES};
use crate::engine::driver::StandardDriver;
use crate::engine::listing::Listing;
use crate::engine::naming::{self, LEASE_NAME, LEASE_QUEUE};
use crate::error::{session_dead, Error, Result};
use crate::session::cleanup::{retry_unknown, NodePrefix, PendingNode};
use crate::session::client::SessionContext;
use crate::session::watch::{NodeWatch, Watched};
use crate::state::LossReason;

/// What a lease node's create needs of a driver: its name and listing queue.
static LEASE_NODES: StandardDriver = StandardDriver { queue: LEASE_QUEUE, kind: 0, max_leases: 1 };

/// The lease nodes of one attempt, each armed for deletion; dropped (an error, a cancel), they
/// are deleted newest first.
struct PendingLeases(Vec<(PendingNode, LockNode)>);

impl Drop for PendingLeases {
    fn drop(&mut self) {
        while let Some(lease) = self.0.pop() {
            drop(lease);
        }
    }
}

/// How a wait for the count ended.
enum Count {
    /// Granted by a listing with this stat of the directory.
    Granted(zk::Stat),
    /// One of our nodes is no longer listed: someone deleted it.
    NodeGone,
    /// The node of the internal lock we wait under is gone.
    LockGone,
}

impl LockInternals {
    /// Creates `qty` lease nodes in this engine's directory (a semaphore's `leases`) on the
    /// session of `context` — the session holding the semaphore's internal lock, whose node is
    /// `lock_node` — and waits until the directory has at most `max_leases` children; returns them
    /// as holds tracked by the session monitor. Fails with [`Error::SessionLost`] if that session
    /// ends, and with [`Error::LockLost`] if the internal lock's node is deleted while we wait
    /// (then another acquirer may hold it and wait beside us, each counting the other's lease
    /// node: the caller deletes ours and queues again). Either way the caller starts again.
    ///
    /// Cancel safe: dropping the future at any point deletes every node it may have created.
    pub(crate) async fn attempt_leases(
        &self,
        context: &Arc<SessionContext>,
        qty: usize,
        max_leases: usize,
        lock_node: &Arc<str>,
    ) -> Result<Vec<Grant>> {
        let closed = || Error::Closed { path: self.dir.to_string() };
        if context.is_closed() {
            return Err(closed());
        }
        let on_session = OnSession { lock: self, context };
        // As in `attempt`: the close first, and a grant made while the client closes not returned.
        let attempt = tokio::select! {
            biased;
            () = context.closed() => return Err(closed()),
            result = on_session.attempt_leases(qty, max_leases, lock_node) => result,
        };
        match attempt {
            Ok(grants) if context.is_closed() => {
                grants.into_iter().rev().for_each(Grant::give_back);
                Err(closed())
            },
            Ok(grants) if context.client().state().is_terminated() => {
                for grant in grants {
                    grant.context.session.release(&grant.feed);
                }
                Err(Error::SessionLost { path: self.dir.to_string(), state: context.client().state().to_string() })
            },
            result => result,
        }
    }
}

impl OnSession<'_> {
    async fn attempt_leases(&self, qty: usize, max_leases: usize, lock_node: &Arc<str>) -> Result<Vec<Grant>> {
        self.context.session.min_session_timeout(self.lock.min_session_timeout_of());
        let _ticket = self.context.session.begin_acquire()?;
        self.context.cleanup.remember_runtime();
        let mut losses = 0;
        loop {
            let mut leases = PendingLeases(Vec::with_capacity(qty));
            let mut listing = None;
            // One place in the session's window of creates for this round's creates, one after
            // another (`session/monitor.rs`, *A window of creates*); taken before a lock-delay's
            // read, which is sent as it is made. No lock or holder is waited for while it is held
            // (a create may wait up to its patience for another session's listing, sent already).
            let slot = self.context.session.create_slot().await;
            // With a lock-delay, the directory's marks, read in the round trip of our first create
            // (`delay.rs`).
            let before = self.lock.lock_delay_of().map(|_| self.context.client().get_data(&self.lock.dir));
            for _ in 0..qty {
                // A GUID per node, armed before its create is sent.
                let prefix = NodePrefix::new(&self.lock.dir, &naming::protection(&Uuid::new_v4()), LEASE_NAME);
                let mut pending = PendingNode::new(self.context.cleanup.clone(), prefix.clone());
                let (node, pipelined) = self.create(&prefix, &LEASE_NODES, &mut pending).await?;
                let pipelined = self.listing_to_come(&node, pipelined).await;
                if leases.0.is_empty() {
                    Span::current().record("sequence", node.sequence);
                }
                leases.0.push((pending, node));
                // Only the listing sent after the last create shows every node of ours.
                listing = pipelined;
            }
            drop(slot);
            let before: delay::Before = match before {
                Some(read) => Some(Box::new(read.await)),
                None => None,
            };
            if self.lock.lock_delay_of().is_some() {
                // Until handed to the application, our lease nodes end no hold (`delay.rs`).
                let counted = listing.as_ref().map(|listing| listing.dir_stat);
                let mark = counted.and_then(|counted| delay::give_up_mark(&counted, delay::marks_before(&before)));
                leases.0.iter_mut().for_each(|(pending, _)| pending.give_up_with_mark(mark));
            }
            match self.wait_for_count(&leases.0, max_leases, listing, lock_node).await? {
                Count::Granted(counted) => {
                    if let Some(delay) = self.lock.lock_delay_of() {
                        // The deciding listing was taken on our session after our creates: it
                        // counts the deletion of every lease that made room for ours.
                        let verdict = delay::verdict(&counted, delay::marks_before(&before));
                        let served = match delay::settle(&self.server_dir(), &counted, verdict, delay) {
                            delay::Settled::Stands(served) => Some(served),
                            delay::Settled::At(until, served) => {
                                // (Our lease nodes are tracked by the session monitor once granted.)
                                let mut never = NodeWatch::never();
                                let _ = self.serve_delay(&self.lock.dir, until, &mut never).await?;
                                served
                            },
                        };
                        for (_, node) in &mut leases.0 {
                            node.served = served;
                        }
                    }
                    return self.vouched_leases(leases).await;
                },
                Count::LockGone => {
                    debug!(lock = &**lock_node, "the internal lock's node was deleted while waiting for leases");
                    return Err(Error::LockLost { path: self.lock.dir.to_string(), reason: LossReason::NodeDeleted });
                },
                Count::NodeGone => {
                    losses += 1;
                    debug!(dir = self.lock.dir, losses, "a lease node of ours was deleted while waiting");
                    if losses >= MAX_NODE_LOSSES {
                        return Err(Error::LockNodeDeleted { path: self.lock.dir.to_string() });
                    }
                    // What is left of them is deleted (newest first), and their pendings retired:
                    // a node whose path was known needs no search by GUID (review T). Then new
                    // nodes, with new GUIDs, at the end.
                    while let Some((mut pending, _)) = leases.0.pop() {
                        pending.abandon_node();
                        pending.retire();
                    }
                },
            }
        }
    }

    /// Waits until a listing taken after our creates shows all of `ours` and at most `max_leases`
    /// children (the rule of the module docs). `pipelined` is the listing sent right behind our
    /// last create, if it came. While it waits, the internal lock's node is watched too (only then:
    /// a grant with room in the pool costs no watch).
    async fn wait_for_count(
        &self,
        ours: &[(PendingNode, LockNode)],
        max_leases: usize,
        pipelined: Option<Arc<Listing>>,
        lock_node: &Arc<str>,
    ) -> Result<Count> {
        let name_of = |node: &LockNode| node.path[self.lock.dir.len() + 1..].to_owned();
        if let Some(listing) = pipelined {
            let listed = ours.iter().all(|(_, node)| {
                let child = naming::LockChild { name: name_of(node).into(), sequence: node.sequence, kind: 0 };
                listing.position(&child).is_some()
            });
            // Not listed: a reply from another connection, maybe; the watched listing decides.
            if listed && listing.all <= max_leases {
                return Ok(Count::Granted(listing.dir_stat));
            }
        }
        let client = self.context.client();
        let dir = &self.lock.dir;
        let mut lock_watch: Option<NodeWatch> = None;
        loop {
            let (names, counted, watcher) = match retry_unknown(|| client.get_and_watch_children(dir)).await {
                Ok(listed) => listed,
                // The directory is gone, and our nodes with it.
                Err(zk::Error::NoNode) => return Ok(Count::NodeGone),
                Err(err) if session_dead(&err) => return Err(self.session_lost(err.to_string())),
                Err(zk::Error::NoAuth) => return Err(Error::NoAuth { op: "list", path: dir.to_string() }),
                Err(err) => return Err(Error::zk("list", dir, err)),
            };
            if !ours.iter().all(|(_, node)| names.iter().any(|name| *name == node.path[dir.len() + 1..])) {
                return Ok(Count::NodeGone);
            }
            if names.len() <= max_leases {
                // The watcher is dropped: the client asks the server to remove it.
                return Ok(Count::Granted(counted));
            }
            debug!(dir, children = names.len(), max_leases, "waiting for leases to be returned");
            let watching_lock = lock_watch.get_or_insert_with(|| self.watch(lock_node.clone()));
            let lock_event = tokio::select! {
                biased;
                event = &mut *watching_lock => Some(event),
                event = watcher.changed() => {
                    if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                        return Err(self.session_lost(event.session_state.to_string()));
                    }
                    None
                },
            };
            match lock_event {
                None => {},
                Some(Watched::Deleted) => return Ok(Count::LockGone),
                Some(Watched::SessionDead(state)) => return Err(self.session_lost(state.to_string())),
                Some(Watched::Refused(err)) => return Err(Error::zk("watch the lock node", lock_node, err)),
                // Its data changed (a revocation request): watch it again.
                Some(Watched::Other) => lock_watch = None,
            }
            // Anything else (a child added or deleted, a reconnection): list again.
        }
    }

    /// Our granted lease nodes as holds, all at once, once the session monitor vouches for the
    /// session (see `vouched_hold`): if it cannot vouch for it at the moment one of them is
    /// tracked, those tracked before are untracked again (released: no loss is told) and all wait
    /// for the monitor together — no lease is ever tracked alone, to be reported lost while its
    /// siblings wait.
    async fn vouched_leases(&self, mut leases: PendingLeases) -> Result<Vec<Grant>> {
        let session = &self.context.session;
        let policy = self.lock.loss_policy;
        loop {
            // Untracked again if dropped before they are returned (a cancel, a refusal).
            let mut tracked = Tracked { session, feeds: Vec::with_capacity(leases.0.len()) };
            for (_, node) in &leases.0 {
                match session.track(&self.context.cleanup, &node.path, policy, None) {
                    Ok(feed) => tracked.feeds.push(feed),
                    Err(_) => break,
                }
            }
            if tracked.feeds.len() == leases.0.len() {
                let feeds = std::mem::take(&mut tracked.feeds);
                let grants = leases
                    .0
                    .iter()
                    .zip(feeds)
                    .map(|((_, node), feed)| Grant {
                        node: node.clone(),
                        feed,
                        context: self.context.clone(),
                        handoff: false,
                        revocable: self.lock.revocable,
                    })
                    .collect();
                for (pending, _) in std::mem::take(&mut leases.0) {
                    pending.disarm();
                }
                return Ok(grants);
            }
            drop(tracked);
            if let Some(reason) = session.ended() {
                return Err(self.session_lost(reason.to_string()));
            }
            debug!(dir = self.lock.dir, "leases granted, but the session cannot be vouched for yet; waiting");
            if let Err(reason) = session.until_vouched(policy).await {
                return Err(self.session_lost(reason.to_string()));
            }
        }
    }
}

/// Lease holds tracked by the session monitor but not returned yet: untracked (released, no loss
/// told) if dropped.
struct Tracked<'a> {
    session: &'a crate::session::monitor::Session,
    feeds: Vec<crate::sync::Record<crate::session::monitor::HoldFeed>>,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        for feed in self.feeds.drain(..).rev() {
            self.session.release(&feed);
        }
    }
}
