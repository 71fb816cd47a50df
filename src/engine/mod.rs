//! The lock engine shared by every lock recipe (Curator's `LockInternals`).
//!
//! One acquire attempt, top to bottom:
//!
//! 1. Choose a GUID and arm a [`PendingNode`] *before* anything is sent, so that whatever happens
//!    next — an error, a timeout, the future dropped at any `.await` — the node is deleted.
//! 2. Create `<dir>/_c_<guid>-lock-` as `EPHEMERAL_SEQUENTIAL` and, pipelined right behind it on
//!    the same session, list the directory (one listing serves every acquire of the session that
//!    created at the same moment: [`listing`]). The server answers a session's
//!    requests in order, so the listing already contains our node: an uncontended acquire costs
//!    one round trip.
//!    - The directory is missing: create its missing levels as container nodes *together with our
//!      node*, in one `multi` (see `OnSession::create_with_levels`: nothing can strand an empty one).
//!      First the directory alone (its parent usually exists); only if that fails, every level is
//!      checked. The listing pipelined behind the `multi` brings our node's czxid, which the
//!      `multi`'s reply lacks (`created_with_directory`).
//!    - A session whose creates keep finding their directories missing sends that `multi` first,
//!      and the plain create only if it is refused ([`directory_guess`]): a new lock path then
//!      costs the `multi` and its listing, not a create answered `NoNode` before them.
//!    - The create's outcome is unknown (connection lost or stalled before the reply): look for
//!      our GUID among the children (owned by our session) before creating again, so one attempt
//!      never leaves two nodes.
//! 3. Sort the lock nodes by sequence (foreign children are ignored) and ask the driver.
//!    - Acquired: hand the node to the session monitor as a hold — only once the monitor vouches
//!      for the session (its loss deadline ahead, and under `LossPolicy::Suspended` the
//!      connection up): a grant is never returned already lost. Until then the node keeps its
//!      place in the queue; `try_acquire` gives it up instead of waiting. Then disarm the pending
//!      node; the caller owns it.
//!    - Not first and not waiting (`try_acquire`): delete our node.
//!    - Our node is not in the listing: someone deleted it; create a new one.
//! 4. Wait: merge the listing into the process's view of the directory ([`DirView`]), watch the
//!    predecessor the driver names and, once it is near the head of the view, our own node (data
//!    watches, not `exists`, which would leave a watch behind if the node is already gone; a
//!    grant before our own watch is confirmed reads our node first). When the predecessor goes, ask the
//!    driver again *from the view*: nodes ahead of ours can only disappear, and every deletion
//!    seen by any waiter of this process is in the view, so a handoff usually needs no listing
//!    at all (see `view.rs` for the argument). A node in the view that is in fact gone costs one
//!    `NoNode` read, once.

mod delay;
mod directory_guess;
pub(crate) mod driver;
pub(crate) mod leases;
pub(crate) mod listing;
pub(crate) mod naming;
pub(crate) mod path;
pub(crate) mod view;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{debug, warn, Span};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::engine::driver::{Decision, LockDriver};
use crate::engine::listing::Listing;
use crate::engine::naming::{LockChild, Queue};
use crate::engine::view::DirView;
use crate::error::{outcome_unknown, session_dead, transient, Error, Result};
use crate::session::cleanup::{find_protected, retry_unknown, Backoff, Cleanup, NodePrefix, PendingNode, Target};
use crate::session::client::{RecipeClient, SessionContext};
use crate::session::monitor::HoldFeed;
use crate::session::watch::{watch_node, watch_sibling, NodeWatch, Watched};
use crate::state::{LossPolicy, LossReason};
use crate::sync::Record;
use delay::DelayCheck;

/// How many times in a row our node may vanish under us before we give up.
const MAX_NODE_LOSSES: usize = 5;

/// How many creates in a row may end with an unknown outcome (the connection dropped before the
/// reply) before the acquire fails. A request the server cannot take (over its size limit) drops
/// the connection every time, and with it every other hold of the session: retrying forever would
/// harm them all.
const MAX_UNKNOWN_CREATES: usize = 4;

/// The least and the most an acquire waits for a listing another session sent (twice its
/// create's round trip, within these).
const SHARED_LISTING_PATIENCE: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));

/// Our lock node, once held.
#[derive(Clone, Debug)]
pub(crate) struct LockNode {
    /// Full path of the node (shared with the hold's session feed and its watch).
    pub path: Arc<str>,
    /// Sequence number the server appended.
    pub sequence: i64,
    /// The zxid of the node's creation: the fencing token.
    pub czxid: i64,
    /// Its kind in the recipe's queue.
    pub kind: usize,
    /// The view of the directory we waited with, if we waited: the node is removed from it once
    /// deleted.
    pub view: Option<Arc<DirView>>,
    /// On a lock with a lock-delay, the served mark its clean release writes, established at its
    /// grant (`engine/delay.rs`); `None` otherwise.
    pub served: Option<u32>,
}

impl LockNode {
    /// Starts deleting the node through `cleanup` (see [`Cleanup::delete`]); once it is gone, it
    /// is also removed from the directory view it was waited with.
    pub(crate) fn delete(&self, cleanup: &Cleanup) -> Option<JoinHandle<Result<()>>> {
        self.delete_marked(cleanup, false)
    }

    /// [`delete`](Self::delete), marked as a clean release when `clean` and the node has a served
    /// mark (a lock with a lock-delay: `engine/delay.rs`).
    pub(crate) fn delete_marked(&self, cleanup: &Cleanup, clean: bool) -> Option<JoinHandle<Result<()>>> {
        let target = match (clean, self.served) {
            (true, Some(served)) => Target::Released { path: self.path.to_string(), served: Some(served) },
            _ => Target::Path(self.path.to_string()),
        };
        match self.view.clone() {
            None => cleanup.delete(target),
            Some(view) => {
                let name = self.path.rsplit('/').next().unwrap_or_default().into();
                let child = LockChild { name, sequence: self.sequence, kind: self.kind };
                cleanup.delete_then(target, move || view.deleted(&child))
            },
        }
    }
}

/// A granted lock: our node, its hold as the session monitor tracks it, and the session it is
/// held by.
pub(crate) struct Grant {
    pub node: LockNode,
    pub feed: Record<HoldFeed>,
    pub context: Arc<SessionContext>,
    /// Granted after waiting for a predecessor (a handoff), not at once.
    pub handoff: bool,
    /// The node was created revocable (empty data; a revocation request is written as its data).
    pub revocable: bool,
}

impl Grant {
    /// Gives up a grant that is not returned (the client was closed meanwhile): untracked, its
    /// node deleted in the background (the close deletes it too: it listed it).
    fn give_back(self) {
        self.context.session.release(&self.feed);
        let _ = self.node.delete(&self.context.cleanup);
    }
}

/// Whether an attempt waits for its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Give up (and delete our node) if the lock is not ours at once.
    No,
    /// Wait until the lock is ours. Timeouts wrap the attempt in `tokio::time::timeout`.
    Forever,
}

enum Turn {
    /// Acquired, after waiting for a predecessor (`handoff`) or not; with the watch on our own
    /// node if one was set while waiting (handed to the hold).
    Acquired {
        own_watch: Option<NodeWatch>,
        handoff: bool,
    },
    NotNow,
    NodeGone,
}

/// A lock recipe's engine: its lock directory, the data and ACLs of its nodes, and the client
/// whose sessions it runs on.
#[derive(Debug)]
pub(crate) struct LockInternals {
    client: RecipeClient,
    /// Boxed rather than a `String` (and the data a slice): every lock object keeps one, and the
    /// capacities they would keep make the record a size class larger (issue 24).
    dir: Box<str>,
    node_data: Box<[u8]>,
    /// The nodes' ACLs (shared with every lock of the client that sets none of its own).
    acls: Arc<[zk::Acl]>,
    /// When a lost connection means a lost lock, for the holds granted here.
    loss_policy: LossPolicy,
    /// The smallest session timeout any server may negotiate, if the application stated one
    /// (`session/monitor.rs`, *Which T*).
    min_session_timeout: Span8,
    /// Nodes are created revocable (Curator's revocation: see `LockGuard::revoke_requested`).
    revocable: bool,
    /// Whether a waiter watches its own node, and a hold its node (see
    /// [`without_own_node_watch`](Self::without_own_node_watch)).
    watch_own_node: bool,
    /// The lease every hold of this lock gets (`LockBuilder::lease`), applied by the recipe.
    lease: Span8,
    /// The lock-delay (`LockBuilder::lock_delay`, `engine/delay.rs`).
    lock_delay: Span8,
}

/// An `Option<Duration>` in 8 bytes instead of 16: whole nanoseconds, `u64::MAX` for none. A
/// duration of 584 years or more is kept as `u64::MAX − 1` ns (about 584 years): a lease, a
/// lock-delay or a session timeout floor that long means "never" all the same. Every lock object
/// keeps three (issue 24).
#[derive(Clone, Copy, Debug)]
struct Span8(u64);

impl Span8 {
    fn new(duration: Option<Duration>) -> Span8 {
        Span8(
            duration
                .map_or(u64::MAX, |duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX).min(u64::MAX - 1)),
        )
    }

    fn get(self) -> Option<Duration> {
        (self.0 != u64::MAX).then(|| Duration::from_nanos(self.0))
    }
}

impl LockInternals {
    pub(crate) fn new(
        client: RecipeClient,
        dir: String,
        node_data: Vec<u8>,
        acls: Arc<[zk::Acl]>,
        loss_policy: LossPolicy,
        min_session_timeout: Option<Duration>,
    ) -> LockInternals {
        LockInternals {
            client,
            dir: dir.into_boxed_str(),
            node_data: node_data.into_boxed_slice(),
            acls,
            loss_policy,
            min_session_timeout: Span8::new(min_session_timeout),
            revocable: false,
            watch_own_node: true,
            lease: Span8::new(None),
            lock_delay: Span8::new(None),
        }
    }

    /// The same engine with a lock-delay (see `LockBuilder::lock_delay`).
    pub(crate) fn lock_delay(mut self, delay: Option<Duration>) -> LockInternals {
        self.lock_delay = Span8::new(delay);
        self
    }

    /// The same engine, its holds leased for `lease` (see `LockBuilder::lease`).
    pub(crate) fn lease(mut self, lease: Option<Duration>) -> LockInternals {
        self.lease = Span8::new(lease);
        self
    }

    /// The lease every hold of this lock gets, if any.
    pub(crate) fn hold_lease(&self) -> Option<Duration> {
        self.lease.get()
    }

    /// The lock-delay, if any (`engine/delay.rs`).
    pub(crate) fn lock_delay_of(&self) -> Option<Duration> {
        self.lock_delay.get()
    }

    /// The session timeout floor the application stated, if any.
    pub(crate) fn min_session_timeout_of(&self) -> Option<Duration> {
        self.min_session_timeout.get()
    }

    /// The same engine for a lock whose holder need not learn that its node was deleted by
    /// someone else — a semaphore's internal lock (`engine/leases.rs`, *The internal lock*): a
    /// waiter does not watch its own node (one request less per acquire) and the hold does not
    /// watch it either. A waiter whose node was deleted may then be granted when its predecessor
    /// goes, beside another holder; a new connection still makes the waiter check its node before
    /// the grant, and a session that ends still ends the hold.
    pub(crate) fn without_own_node_watch(mut self) -> LockInternals {
        self.watch_own_node = false;
        self
    }

    /// The same engine, its nodes revocable or not.
    pub(crate) fn revocable(mut self, revocable: bool) -> LockInternals {
        self.revocable = revocable;
        self
    }

    /// A new attempt's node prefix, with a GUID of its own.
    pub(crate) fn new_prefix(&self, driver: &dyn LockDriver) -> NodePrefix {
        NodePrefix::new(&self.dir, &naming::protection(&Uuid::new_v4()), driver.lock_name())
    }

    pub(crate) fn dir(&self) -> &str {
        &self.dir
    }

    /// The session acquires run on now.
    pub(crate) fn context(&self) -> Arc<SessionContext> {
        self.client.context()
    }

    /// One acquire: an attempt on the current session, and on each session that replaces it
    /// should it end during the attempt (a [`ManagedClient`](crate::ManagedClient) only). An
    /// attempt never outlives its session: its node died with it, so the acquire queues again —
    /// at the end of the queue — with a new node of the new session; nothing of the old session
    /// is looked for or adopted. `Ok(None)` only with [`Wait::No`] when the lock is taken.
    ///
    /// Cancel safe: dropping the future at any point deletes the node it may have created.
    #[allow(clippy::manual_async_fn)] // an `async` block keeps the arguments once (`wait_for_turn`)
    pub(crate) fn attempt<'a>(
        &'a self,
        driver: &'a dyn LockDriver,
        wait: Wait,
    ) -> impl Future<Output = Result<Option<Grant>>> + 'a {
        async move {
            let mut context = self.context();
            loop {
                let closed = || Error::Closed { path: self.dir.to_string() };
                if context.is_closed() {
                    return Err(closed());
                }
                let on_session = OnSession { lock: self, context: &context };
                // A close cancels the attempt: its node is deleted in the background, as on any drop
                // (and by the close, which lists every node the attempt could have created: see
                // `SessionContext::through_gate`). Checked first: an attempt that could go on is not
                // polled again once the client is closed.
                let attempt = tokio::select! {
                    biased;
                    () = context.closed() => return Err(closed()),
                    result = async {
                        match wait {
                            Wait::Forever => on_session.attempt(driver, wait).await,
                            // Boxed: laid out beside the waiting attempt's state, a `try_acquire`'s
                            // would grow every queued waiter's future.
                            Wait::No => {
                                Box::pin(async {
                                    let attempt = std::pin::pin!(on_session.attempt(driver, wait));
                                    on_session.while_connected(attempt).await
                                })
                                .await
                            },
                        }
                    } => result,
                };
                let result = match attempt {
                    // Granted while the client was being closed (tracked before the close told its
                    // holds `Lost(SessionClosed)`; nothing is tracked after): not returned. The close
                    // deletes the node — it listed it — and so does the cleanup, should the close be
                    // cancelled.
                    Ok(Some(grant)) if context.is_closed() => {
                        grant.give_back();
                        return Err(closed());
                    },
                    // Granted from replies that arrived just before the session ended: the node is
                    // gone (or goes when the server times the session out), so is the lock.
                    Ok(Some(grant)) if context.client().state().is_terminated() => {
                        grant.context.session.release(&grant.feed);
                        Err(Error::SessionLost {
                            path: self.dir.to_string(),
                            state: context.client().state().to_string(),
                        })
                    },
                    result => result,
                };
                let Err(Error::SessionLost { .. }) = &result else { return result };
                // `acquire` waits for the new session however long establishing it takes (a timeout
                // around it bounds that); `try_acquire` only takes one already there.
                let Some(next) = self.client.replacement(&context, wait == Wait::Forever).await else {
                    return if context.is_closed() { Err(closed()) } else { result };
                };
                debug!(lock_path = self.dir, "session ended during an acquire; queueing again on the new session");
                context = next;
            }
        }
    }

    /// One acquire of a node created *beside* `anchor` — a node we hold on the session of
    /// `context` — and granted at once: Curator ≥ 5.5's layout of a downgraded read. The node is
    /// named with the anchor's sequence number (so every client sorts it at the anchor's place in
    /// the queue) and created as a plain `EPHEMERAL` node, in one `multi` behind a check that the
    /// anchor still exists: it is created only while the anchor exists (`view.rs`, *Nodes created
    /// beside another*, assumption B), and the acquire fails with [`Error::LockLost`] if the
    /// anchor is gone. Only on the anchor's session: if that session ends, so did the anchor's
    /// hold, and the acquire fails (nothing is queued on a new session).
    ///
    /// Cancel safe: dropping the future at any point deletes the node it may have created — found
    /// by its GUID if the create's reply was lost, as any lock node.
    pub(crate) async fn attempt_beside(
        &self,
        driver: &dyn LockDriver,
        anchor: &LockNode,
        context: &Arc<SessionContext>,
        wait: Wait,
    ) -> Result<Option<Grant>> {
        let closed = || Error::Closed { path: self.dir.to_string() };
        if context.is_closed() {
            return Err(closed());
        }
        let on_session = OnSession { lock: self, context };
        // As in `attempt`: the close first, and a grant made while the client closes not returned.
        let attempt = tokio::select! {
            biased;
            () = context.closed() => return Err(closed()),
            result = async {
                match wait {
                    Wait::Forever => on_session.attempt_beside(driver, anchor, wait).await,
                    Wait::No => {
                        let attempt = std::pin::pin!(on_session.attempt_beside(driver, anchor, wait));
                        on_session.while_connected(attempt).await
                    },
                }
            } => result,
        };
        match attempt {
            Ok(Some(grant)) if context.is_closed() => {
                grant.give_back();
                Err(closed())
            },
            // As in `attempt`: granted from replies that arrived just before the session ended.
            Ok(Some(grant)) if context.client().state().is_terminated() => {
                grant.context.session.release(&grant.feed);
                Err(Error::SessionLost { path: self.dir.to_string(), state: context.client().state().to_string() })
            },
            result => result,
        }
    }

    /// A runtime to run background work of this lock on: the current one, else the one its
    /// session remembered.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.context().cleanup.runtime()
    }

    /// Resolves once every background deletion on the current session is done — an abandoned
    /// attempt's node (by GUID) or a released or lost one (by path) — or the session is dead
    /// (`Cleanup::searches_done`).
    pub(crate) async fn settled(&self) {
        self.context().cleanup.searches_done().await;
    }

    /// Lists the lock nodes of `queue` in the directory in queue order (on the current session).
    pub(crate) async fn sorted_children(&self, queue: Queue) -> Result<Vec<LockChild>> {
        let context = self.context();
        OnSession { lock: self, context: &context }.sorted_children(queue).await
    }
}

/// The engine on one session: everything one attempt does.
struct OnSession<'a> {
    lock: &'a LockInternals,
    context: &'a Arc<SessionContext>,
}

impl<'l> OnSession<'l> {
    /// One acquire attempt. `Ok(None)` only with [`Wait::No`] when the lock is taken.
    ///
    /// Cancel safe: dropping the future at any point deletes the node it may have created.
    #[allow(clippy::manual_async_fn)] // an `async` block keeps the arguments once (`wait_for_turn`)
    pub(crate) fn attempt<'a>(
        &'a self,
        driver: &'a dyn LockDriver,
        wait: Wait,
    ) -> impl Future<Output = Result<Option<Grant>>> + use<'a, 'l> {
        async move {
            // The session monitor heartbeats while we wait, so a grant from the view has fresh
            // evidence that the session is alive (see `session/monitor.rs`).
            self.context.session.min_session_timeout(self.lock.min_session_timeout_of());
            let _ticket = self.context.session.begin_acquire()?;
            self.context.cleanup.remember_runtime();
            // It keeps the attempt's node prefix (the GUID), read from our node's path once created:
            // a queued waiter keeps no copy of its own.
            let mut pending =
                PendingNode::new(self.context.cleanup.clone(), self.lock.new_prefix(driver)).not_sent_yet();
            let mut losses = 0;
            loop {
                // A place in the session's window of creates, held until the create and its retries
                // are answered (so a burst queues here, not ahead of the session's heartbeats at the
                // server: *A window of creates* in `session/monitor.rs`); taken before a lock-delay's
                // read too, which is sent as it is made.
                let slot = self.context.session.create_slot().await;
                // With a lock-delay, the directory's stat from before our create (sent first: one round
                // trip still; `delay.rs`).
                let before =
                    self.lock.lock_delay_of().map(|_| Box::pin(self.context.client().get_data(&self.lock.dir)));
                // The future of an acquire is as large as its largest state, and a queued waiter keeps
                // it for as long as it waits (its heap, issue 24). So every await before the wait is
                // boxed — the create (784 B with the listing pipelined behind it), the listing still
                // to come (672 B), a lock-delay's read and its result (96 B, kept while waiting) — and
                // so are those off the common path (a listing not shared, a create's retries): the
                // acquire future was 1,360 B then, where it was 1,696 with the create inline
                // (`-Zprint-type-sizes`, release; smaller since: BENCHMARKS.md). (Before a session's creates in flight were bounded,
                // a boxed create left a hole at every grant that the hold's records filled: a burst's
                // resident memory per held lock went from 3.1 to 4.8 KB. With the window of creates,
                // at most that many boxes live at once, and the burst's resident memory is unchanged:
                // BENCHMARKS.md.)
                let (mut node, listing) =
                    Box::pin(self.create(&pending.prefix().clone(), driver, &mut pending)).await?;
                drop(slot);
                let listing = Box::pin(self.listing_to_come(&node, listing)).await;
                let before: delay::Before = match before {
                    Some(read) => Some(Box::new(read.await)),
                    None => None,
                };
                Span::current().record("sequence", node.sequence);
                if !naming::in_counter_range(node.sequence) {
                    // At or past the end of the directory's counter: never granted (see `naming`,
                    // *The counter's end*).
                    let name = node.path.rsplit('/').next().unwrap_or_default().to_owned();
                    warn!(path = %node.path, "the lock directory's sequence counter is used up: refusing the node");
                    Box::pin(pending.delete_now()).await?;
                    return Err(Error::SequenceWrapped { path: self.lock.dir.to_string(), name });
                }
                if self.lock.lock_delay_of().is_some() {
                    // Until handed to the application, our node ends no hold (`delay.rs`, *Give-ups*).
                    let counted = listing.as_ref().map(|listing| listing.dir_stat);
                    let mark = counted.and_then(|counted| delay::give_up_mark(&counted, delay::marks_before(&before)));
                    pending.give_up_with_mark(mark);
                }
                match self.wait_for_turn(driver, &mut node, listing, wait, &before).await? {
                    Turn::Acquired { own_watch, handoff } => {
                        // (The hold of a lock whose node needs no watching is handed a watch that
                        // never fires: the monitor sets none either.)
                        let own_watch = if self.lock.watch_own_node { own_watch } else { Some(NodeWatch::never()) };
                        let Some(feed) = self.vouched_hold(&node, own_watch, wait).await? else {
                            Box::pin(pending.delete_now()).await?;
                            return Ok(None);
                        };
                        pending.disarm();
                        return Ok(Some(Grant {
                            node,
                            feed,
                            context: self.context.clone(),
                            handoff,
                            revocable: self.lock.revocable,
                        }));
                    },
                    Turn::NotNow => {
                        Box::pin(pending.delete_now()).await?;
                        return Ok(None);
                    },
                    Turn::NodeGone => {
                        losses += 1;
                        debug!(path = &*node.path, losses, "our lock node was deleted while waiting");
                        if losses >= MAX_NODE_LOSSES {
                            return Err(Error::LockNodeDeleted { path: self.lock.dir.to_string() });
                        }
                        // Gone, as far as we can tell; should it still exist, this deletes it.
                        pending.abandon_node();
                        // The next node gets a GUID of its own: in a lock directory deleted and made
                        // again its sequence number may be the old node's, and a late delete of the
                        // old path must not find it (`session/cleanup.rs`, `Deletion`; review S).
                        let fresh =
                            PendingNode::new(self.context.cleanup.clone(), self.lock.new_prefix(driver)).not_sent_yet();
                        std::mem::replace(&mut pending, fresh).retire();
                    },
                }
            }
        }
    }

    /// Step 3, acquired: our node as a hold the session monitor tracks, once the monitor vouches
    /// for the session. `None` with [`Wait::No`] when it cannot right now.
    ///
    /// Why wait rather than grant: the grant is decided from our view of the queue, but the
    /// holder's right to act rests on the session — were its loss deadline already past, the
    /// leader could have expired it, deleted our node and granted the next waiter, while
    /// `acquire` told the application it holds the lock. Waiting keeps our place: if the session
    /// lives, the monitor's next answered round vouches for it again; if not, the session ends and
    /// so does this attempt.
    async fn vouched_hold(
        &self,
        node: &LockNode,
        mut own_watch: Option<NodeWatch>,
        wait: Wait,
    ) -> Result<Option<Record<HoldFeed>>> {
        let session = &self.context.session;
        loop {
            match session.track(&self.context.cleanup, &node.path, self.lock.loss_policy, own_watch) {
                Ok(feed) => return Ok(Some(feed)),
                Err(unvouched) => {
                    own_watch = unvouched.own_watch;
                    if let Some(reason) = session.ended() {
                        return Err(self.session_lost(reason.to_string()));
                    }
                    if wait == Wait::No {
                        return Ok(None);
                    }
                    debug!(path = &*node.path, reason = %unvouched.reason, "our turn, but the session cannot be vouched for yet; waiting");
                    if let Err(reason) = session.until_vouched(self.lock.loss_policy).await {
                        return Err(self.session_lost(reason.to_string()));
                    }
                },
            }
        }
    }

    /// A [`Wait::No`] attempt (`try_acquire`), which waits for no holder and for no connection
    /// either: `Ok(None)` at once when the connection is down (a managed client's `Suspended`),
    /// or as soon as it goes down during the attempt.
    ///
    /// 1. While disconnected, the client queues requests until it reconnects or gives the
    ///    session up (1.4 T): an attempt would wait that long for its create's reply.
    /// 2. So the attempt is raced against the connection going down, which is checked first: an
    ///    attempt is only dropped before it produced its result (a grant is returned, never
    ///    dropped), and one never polled has sent nothing and armed nothing.
    /// 3. Dropping the attempt is its cancellation, which is safe at any `.await` (step 1 of the
    ///    module docs): a node it may have created — even a create still queued in the client,
    ///    sent after the reconnection — is found by its GUID and deleted in the background.
    /// 4. `Ok(None)`, not `SessionLost`: the session may well be alive (it is until the ensemble
    ///    expires it); the lock just cannot be taken now. A session already ended is reported by
    ///    the attempt itself (the state is then terminal, never `Disconnected` again).
    ///
    /// The attempt is passed pinned where it lives (in the caller's future): passed by value, it
    /// was stored twice in this future (an argument, then moved into the `select!`), which grew
    /// every acquire's future by about 1.9 KB.
    async fn while_connected<F>(&self, attempt: Pin<&mut F>) -> Result<Option<Grant>>
    where
        F: Future<Output = Result<Option<Grant>>>,
    {
        let mut states = self.context.client().state_watcher();
        let disconnected = async move {
            let mut state = states.state();
            while state != zk::SessionState::Disconnected {
                state = states.changed().await;
            }
        };
        tokio::select! {
            biased;
            () = disconnected => {
                debug!(lock_path = self.lock.dir, "try_acquire: the connection is down; the lock cannot be taken now");
                Ok(None)
            },
            result = attempt => result,
        }
    }

    /// Creates our node beside `anchor`, a node of ours on this session, and takes it as a hold
    /// at once (see `LockInternals::attempt_beside`). `None` only with [`Wait::No`], when the
    /// session cannot be vouched for right now.
    ///
    /// Cancel safe: the pending node is armed before anything is sent.
    async fn attempt_beside(&self, driver: &dyn LockDriver, anchor: &LockNode, wait: Wait) -> Result<Option<Grant>> {
        self.context.session.min_session_timeout(self.lock.min_session_timeout_of());
        let _ticket = self.context.session.begin_acquire()?;
        let prefix = self.lock.new_prefix(driver);
        self.context.cleanup.remember_runtime();
        let mut pending = PendingNode::new(self.context.cleanup.clone(), prefix.clone());
        // The anchor's sequence number spelled as the server spells it (`%010d`).
        let path: Arc<str> = format!("{}{:010}", prefix.as_str(), anchor.sequence).into();
        Span::current().record("sequence", anchor.sequence);
        let czxid = self.create_beside(&path, prefix.protection(), anchor, &mut pending).await?;
        // Granted beside a node we hold: no hold we exclude can have ended meanwhile; the anchor's
        // served mark is ours (`delay.rs`).
        let node =
            LockNode { path, sequence: anchor.sequence, czxid, kind: driver.kind(), view: None, served: anchor.served };
        let Some(feed) = self.vouched_hold(&node, None, wait).await? else {
            Box::pin(pending.delete_now()).await?;
            return Ok(None);
        };
        pending.disarm();
        Ok(Some(Grant { node, feed, context: self.context.clone(), handoff: false, revocable: self.lock.revocable }))
    }

    /// Sends `multi(check anchor exists, create path EPHEMERAL)` until its outcome is known;
    /// returns the czxid of our node. A create whose outcome is unknown is looked for by its GUID
    /// before the `multi` is sent again, so one attempt never leaves two nodes.
    async fn create_beside(
        &self,
        path: &Arc<str>,
        protection: &str,
        anchor: &LockNode,
        pending: &mut PendingNode,
    ) -> Result<i64> {
        let client = self.context.client();
        let dir = &self.lock.dir;
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::new(&self.lock.acls));
        let mut backoff = Backoff::new();
        let mut outcome_was_unknown = false;
        let mut unknown_in_a_row = 0;
        loop {
            if outcome_was_unknown {
                match find_protected(client, dir, protection).await {
                    Ok(Some(found)) => {
                        debug!(path = found.path, "found our lock node by GUID after an unknown create outcome");
                        pending.created(found.path.into());
                        return Ok(found.stat.czxid);
                    },
                    Ok(None) => outcome_was_unknown = false,
                    Err(err) if transient(&err) => {
                        backoff.wait().await;
                        continue;
                    },
                    Err(err) => return Err(Error::zk("list", dir, err)),
                }
            }
            let sent = self.context.session.now();
            let mut writer = client.new_multi_writer();
            writer.add_check_version(&anchor.path, -1).map_err(|err| Error::zk("check", &anchor.path, err))?;
            writer
                .add_create(path, &self.lock.node_data, &options)
                .map_err(|err| Error::zk("create lock node in", dir, err))?;
            // Through the close gate, as every create of ours (`SessionContext::through_gate`).
            let commit =
                self.context.through_gate(|| writer.commit()).map_err(|_| Error::Closed { path: dir.to_string() })?;
            match commit.await {
                Ok(mut results) => {
                    self.context.session.answered(sent, true);
                    pending.created(path.clone());
                    return match results.pop() {
                        Some(zk::MultiWriteResult::Create { stat, .. }) if !stat.is_invalid() => Ok(stat.czxid),
                        _ => self.czxid_of(path).await,
                    };
                },
                // The anchor is gone: its hold is lost (or being released). Nothing was applied.
                Err(zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoNode }) => {
                    pending.never_created();
                    return Err(Error::LockLost { path: dir.to_string(), reason: LossReason::NodeDeleted });
                },
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => {
                    pending.never_created();
                    return Err(Error::zk("create lock node in", dir, source));
                },
                Err(zk::MultiWriteError::RequestFailed { source }) if outcome_unknown(&source) => {
                    debug!(%source, "lock node create outcome unknown");
                    unknown_in_a_row += 1;
                    if unknown_in_a_row >= MAX_UNKNOWN_CREATES {
                        return Err(Error::zk("create a lock node beside ours", dir, source));
                    }
                    outcome_was_unknown = true;
                    pending.maybe_applied();
                    backoff.wait().await;
                },
                Err(zk::MultiWriteError::RequestFailed { source: zk::Error::Throttled }) => backoff.wait().await,
                Err(zk::MultiWriteError::RequestFailed { source }) => {
                    if refused(&source) {
                        pending.never_created();
                    }
                    return Err(Error::zk("create lock node in", dir, source));
                },
            }
        }
    }

    /// Creates our node (step 2), returning it and the pipelined listing when that succeeded.
    async fn create(
        &self,
        prefix: &NodePrefix,
        driver: &dyn LockDriver,
        pending: &mut PendingNode,
    ) -> Result<(LockNode, ListingToCome)> {
        let (lock_name, kind) = (driver.lock_name(), driver.kind());
        let (protection, prefix) = (prefix.protection(), prefix.as_str());
        let client = self.context.client();
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::new(&self.lock.acls));
        let mut backoff = Backoff::new();
        let mut outcome_was_unknown = false;
        let mut unknown_in_a_row = 0;
        // Levels of the lock path found missing, or the directory guessed missing by this
        // session's recent creates (`directory_guess`): created with our node by the next create.
        let mut guessed = directory_guess::missing(&self.context.directory_guess);
        let mut missing: Option<Vec<String>> = guessed.then(|| vec![self.lock.dir.to_string()]);
        // Counted as setting up among the process's acquires of this directory, which may share a
        // listing (`listing::Setup`); not with a lock-delay, whose grant reads our own session's.
        let mut setup =
            self.lock.lock_delay_of().is_none().then(|| listing::Setup::begin(self.server_dir(), driver.queue()));
        loop {
            if outcome_was_unknown {
                // A previous create may have been applied: find it before creating again.
                match Box::pin(find_protected(client, &self.lock.dir, protection)).await {
                    Ok(Some(found)) => {
                        let sequence = naming::parse_sequence(&found.name, lock_name).unwrap_or(i64::MAX);
                        debug!(path = found.path, "found our lock node by GUID after an unknown create outcome");
                        let path: Arc<str> = found.path.into();
                        pending.created(path.clone());
                        let node = LockNode { path, sequence, czxid: found.stat.czxid, kind, view: None, served: None };
                        return Ok((node, ListingToCome::Have(None)));
                    },
                    Ok(None) => outcome_was_unknown = false,
                    Err(err) if transient(&err) => {
                        Box::pin(backoff.wait()).await;
                        continue;
                    },
                    Err(err) => return Err(Error::zk("list", &self.lock.dir, err)),
                }
            }
            // The create is sent now, the listing right behind it (shared with other acquires
            // on this session that are creating at the same moment); then we wait for replies.
            let sent = self.context.session.now();
            // Through the close gate: sent before a `close()` lists the session's nodes, or not
            // at all.
            let levels = missing.take();
            // With the levels of the lock path, our node is created with its directory.
            let with_levels = levels.is_some();
            // Those levels only guessed: whatever refuses them, the plain create comes next.
            let guess = std::mem::take(&mut guessed);
            let create: CreateFuture<'_> = self
                .context
                .through_gate(|| {
                    // Before the request is made (a create refused by the gate sent nothing).
                    pending.sending();
                    match levels {
                        None => {
                            let create = client.create(prefix, &self.lock.node_data, &options);
                            Ok(Box::pin(async move {
                                create
                                    .await
                                    .map(|(stat, sequence)| (stat, format!("{prefix}{sequence}"), sequence.into_i64()))
                                    .map_err(CreateError::Node)
                            }) as CreateFuture<'_>)
                        },
                        Some(levels) => self.create_with_levels(&levels, prefix, lock_name, &options),
                    }
                })
                .map_err(|_| {
                    // Nothing was sent by this create (an earlier one of the attempt is looked
                    // for by the pending node, and listed by the close).
                    Error::Closed { path: self.lock.dir.to_string() }
                })??;
            // Alone (or nearly) among the process's acquires of this directory, the listing is
            // pipelined right behind the create: one round trip. In a burst, most wait for their
            // create's reply and share a listing that shows their node.
            // Behind a `multi` that creates a directory known missing, always: its create carries
            // no stat, and this listing brings our node's czxid (`created_with_directory`). Behind
            // a guessed one only as behind a plain create: for a directory that exists (the guess
            // refused), it would be a listing of its whole queue, not shared (review AC); applied,
            // the node's czxid is read instead (`czxid_of`) unless a listing came with it.
            let pipelined = (with_levels && !guess) || setup.as_ref().is_none_or(listing::Setup::pipelined);
            let mut listing =
                pipelined.then(|| Box::pin(listing::after_sent_requests(client, &self.lock.dir, driver.queue())));
            match create.await {
                Ok((stat, path, sequence)) => {
                    // A write is answered only once the leader committed it: evidence for the
                    // session's loss deadline, so a hold granted now needs no heartbeat first.
                    self.context.session.answered(sent, true);
                    let round_trip = self.context.session.now().saturating_duration_since(sent);
                    // One copy of the path, shared by the pending node and ours.
                    let path: Arc<str> = path.into();
                    pending.created(path.clone());
                    // A known-missing directory was counted when its create found it missing.
                    if guess || !with_levels {
                        directory_guess::found(&self.context.directory_guess, with_levels);
                    }
                    if let (true, Some(listing)) = (with_levels, &mut listing) {
                        let listing = listing.await.and_then(Result::ok);
                        if let Some(listing) = &listing {
                            // As below: an answer to a request sent no earlier than the create.
                            self.context.session.answered(sent, false);
                            if let Some(setup) = &setup {
                                setup.offer(listing);
                            }
                        }
                        let czxid = match created_with_directory(&stat, &path, listing.as_deref()) {
                            Some(czxid) => czxid,
                            None => Box::pin(self.czxid_of(&path)).await?,
                        };
                        let node = LockNode { path, sequence, czxid, kind, view: None, served: None };
                        return Ok((node, ListingToCome::Have(listing)));
                    }
                    let czxid = if stat.is_invalid() { Box::pin(self.czxid_of(&path)).await? } else { stat.czxid };
                    let listing = match (listing, &setup) {
                        (Some(listing), _) => {
                            let listing = listing.await.and_then(Result::ok);
                            if let Some(listing) = &listing {
                                // Sent no earlier than the create: an answer a later round pairs with.
                                self.context.session.answered(sent, false);
                                // For the acquires that get their create's reply meanwhile.
                                if let Some(setup) = &setup {
                                    setup.offer(listing);
                                }
                            }
                            listing
                        },
                        (None, Some(_)) => {
                            // Awaited by the caller (`ListingToCome`).
                            let node = LockNode { path, sequence, czxid, kind, view: None, served: None };
                            // How long to wait for another session's listing (`Setup::listing_for`).
                            let patience = (round_trip * 2).clamp(SHARED_LISTING_PATIENCE.0, SHARED_LISTING_PATIENCE.1);
                            return Ok((node, ListingToCome::Shared { setup: setup.take(), patience }));
                        },
                        (None, None) => None,
                    };
                    let node = LockNode { path, sequence, czxid, kind, view: None, served: None };
                    return Ok((node, ListingToCome::Have(listing)));
                },
                Err(CreateError::Parents(err)) if guess => {
                    // Nothing was applied: the plain create next, as if the guess had not been
                    // sent (`directory_guess`, *Only what is sent first*); what it finds counts.
                    drop(listing);
                    if transient(&err) {
                        Box::pin(backoff.wait()).await;
                    }
                },
                Err(CreateError::Parents(err)) => {
                    // Nothing was applied (a `multi` is all or nothing): look again.
                    drop(listing);
                    match err {
                        // A level was created meanwhile, or one above deleted (by the container
                        // reaper): what is missing now?
                        zk::Error::NodeExists | zk::Error::NoNode => {},
                        err if transient(&err) => Box::pin(backoff.wait()).await,
                        zk::Error::NoAuth => {
                            return Err(Error::NoAuth { op: "create the lock path", path: self.lock.dir.to_string() })
                        },
                        err => return Err(Error::zk("create the lock path", &self.lock.dir, err)),
                    }
                    missing = Box::pin(self.missing_levels()).await?;
                },
                Err(CreateError::ChrootMissing) => {
                    return Err(Error::ChrootMissing { path: self.lock.dir.to_string() })
                },
                Err(CreateError::Node(zk::Error::NoNode)) => {
                    drop(listing);
                    if !with_levels {
                        directory_guess::found(&self.context.directory_guess, true);
                    }
                    // Most often only the directory is missing (a lock path under a parent that
                    // exists): created with our node at once. Should a level above be missing
                    // too, that `multi` fails without effect and the levels are looked up.
                    missing = Some(vec![self.lock.dir.to_string()]);
                },
                Err(CreateError::Node(err)) if outcome_unknown(&err) => {
                    debug!(%err, "lock node create outcome unknown");
                    unknown_in_a_row += 1;
                    if unknown_in_a_row >= MAX_UNKNOWN_CREATES {
                        return Err(Error::zk(
                            "create a lock node (the connection dropped before every reply; a request the server refuses to read does that)",
                            &self.lock.dir,
                            err,
                        ));
                    }
                    outcome_was_unknown = true;
                    pending.maybe_applied();
                    Box::pin(backoff.wait()).await;
                },
                Err(CreateError::Node(zk::Error::Throttled)) => Box::pin(backoff.wait()).await,
                Err(CreateError::Node(err)) => {
                    if refused(&err) {
                        // Refused: unless an earlier create of this attempt may have been applied,
                        // no node exists that cleanup would have to look for.
                        pending.never_created();
                    }
                    return Err(Error::zk("create lock node in", &self.lock.dir, err));
                },
            }
        }
    }

    /// The listing `create` left to come for `node`: one that shows it, or `None` (the waiter
    /// lists on its own).
    async fn listing_to_come(&self, node: &LockNode, to_come: ListingToCome) -> Option<Arc<Listing>> {
        match to_come {
            ListingToCome::Have(listing) => listing,
            ListingToCome::Shared { setup: None, .. } => None,
            ListingToCome::Shared { setup: Some(setup), patience } => {
                let ours = LockChild {
                    name: node.path.get(self.lock.dir.len() + 1..).unwrap_or_default().into(),
                    sequence: node.sequence,
                    kind: node.kind,
                };
                setup.listing_for(self.context.client(), &self.lock.dir, &ours, node.czxid, patience).await
            },
        }
    }

    /// The czxid of `path`, for servers too old to return a stat from create.
    async fn czxid_of(&self, path: &str) -> Result<i64> {
        retry_unknown(|| self.context.client().get_data(path))
            .await
            .map(|(_, stat)| stat.czxid)
            .map_err(|err| Error::zk("read lock node", path, err))
    }

    /// The levels of the lock path (top-down) from the first one missing; `None` if none is
    /// missing (someone created them meanwhile). The checks are pipelined: one round trip.
    async fn missing_levels(&self) -> Result<Option<Vec<String>>> {
        let client = self.context.client();
        let dir = &self.lock.dir;
        let levels: Vec<&str> =
            dir.match_indices('/').skip(1).map(|(at, _)| &dir[..at]).chain(std::iter::once(&dir[..])).collect();
        let first_missing = retry_unknown(|| async {
            let checks: Vec<_> = levels.iter().map(|level| client.check_stat(level)).collect();
            for (at, check) in checks.into_iter().enumerate() {
                if check.await?.is_none() {
                    return Ok(Some(at));
                }
            }
            Ok(None)
        })
        .await
        .map_err(|err| Error::zk("look for the lock path", dir, err))?;
        Ok(first_missing.map(|at| levels[at..].iter().map(|level| (*level).to_owned()).collect()))
    }

    /// Sends one `multi` that creates the missing `levels` of the lock path as container nodes
    /// and our node below them, and returns its reply.
    ///
    /// Why together: the server removes a container once it is empty *after having had a
    /// child*; one that never had a child stays for ever. Created on their own, the levels would
    /// be stranded by a cancel (or an error) between their creation and our node's create.
    /// 1. A `multi` is applied entirely or not at all: the levels exist only with our node in
    ///    them. Nothing is created (nothing to clean up) if it fails, however it fails.
    /// 2. Our node is then cleaned up like any other (the pending node, by GUID if the reply is
    ///    lost); once it is deleted, every level has had a child, and the server removes them
    ///    when they are empty.
    /// 3. Concurrent acquirers: whoever's `multi` comes second fails with `NodeExists` at a
    ///    level, without effect, and creates its node plainly in the level now there (or looks
    ///    again). A level above deleted meanwhile (by the container reaper) fails with `NoNode`:
    ///    look again. No node of anyone else is ever deleted or changed.
    fn create_with_levels<'f>(
        &'f self,
        levels: &[String],
        prefix: &'f str,
        lock_name: &'static str,
        options: &zk::CreateOptions<'_>,
    ) -> Result<CreateFuture<'f>> {
        let client = self.context.client();
        let container = zk::CreateMode::Container.with_acls(zk::Acls::new(&self.lock.acls));
        // A lock with a lock-delay keeps its directory: a reaped one could hide an unclean loss
        // (`delay.rs`).
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&self.lock.acls));
        let mut writer = client.new_multi_writer();
        for level in levels {
            let mode =
                if self.lock.lock_delay_of().is_some() && **level == *self.lock.dir { &persistent } else { &container };
            writer.add_create(level, &[], mode).map_err(|err| Error::zk("create the lock path", level, err))?;
        }
        writer
            .add_create(prefix, &self.lock.node_data, options)
            .map_err(|err| Error::zk("create lock node in", &self.lock.dir, err))?;
        let commit = writer.commit();
        let level_count = levels.len();
        // The levels start at the top: the first one's parent is the chroot.
        let chroot_level = level_count == self.lock.dir.matches('/').count();
        Ok(Box::pin(async move {
            match commit.await {
                Ok(mut results) => match results.pop() {
                    Some(zk::MultiWriteResult::Create { path, stat }) => {
                        // As for a node found by its GUID: the server names it, so this parses.
                        let name = path.rsplit('/').next().unwrap_or_default();
                        let sequence = naming::parse_sequence(name, lock_name).unwrap_or(i64::MAX);
                        Ok((stat, path, sequence))
                    },
                    other => {
                        Err(CreateError::Node(zk::Error::UnexpectedError(format!("multi create returned {other:?}"))))
                    },
                },
                // The request as a whole: its outcome, like a create's.
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(CreateError::Node(source)),
                // The top level's parent — the chroot — is missing.
                Err(zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoNode }) if chroot_level => {
                    Err(CreateError::ChrootMissing)
                },
                Err(zk::MultiWriteError::OperationFailed { index, source }) if index < level_count => {
                    Err(CreateError::Parents(source))
                },
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => Err(CreateError::Node(source)),
            }
        }))
    }

    /// The lock directory as the server names it (our client's chroot and the lock path): what
    /// keys the process's tables of directory instances (`view.rs`, `delay.rs`).
    fn server_dir(&self) -> String {
        path::on_server(self.context.client().path(), &self.lock.dir)
    }

    /// Lists the lock nodes of `queue` in the directory in queue order.
    async fn sorted_children(&self, queue: Queue) -> Result<Vec<LockChild>> {
        match retry_unknown(|| self.context.client().list_children(&self.lock.dir)).await {
            Ok(children) => Ok(naming::sort_lock_children(children, queue)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(err) => Err(Error::zk("list", &self.lock.dir, err)),
        }
    }

    /// Lists the directory with its stat (which identifies the directory instance).
    async fn listing(&self, queue: Queue) -> Result<Option<Arc<Listing>>> {
        match retry_unknown(|| self.context.client().get_children(&self.lock.dir)).await {
            Ok((names, dir_stat)) => Ok(Some(Arc::new(Listing::new(names, dir_stat, queue)))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(err) => Err(Error::zk("list", &self.lock.dir, err)),
        }
    }

    /// Step 3: waits until the driver says our node holds the lock.
    ///
    /// An `async` block over the arguments, not an `async fn`, which would keep them twice in
    /// every queued waiter's future (rust-lang/rust#62958; issue 24).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn wait_for_turn<'a>(
        &'a self,
        driver: &'a dyn LockDriver,
        node: &'a mut LockNode,
        pipelined: Option<Arc<Listing>>,
        wait: Wait,
        before: &'a delay::Before,
    ) -> impl Future<Output = Result<Turn>> + use<'a, 'l> {
        async move {
            let queue = driver.queue();
            let mut ours = LockChild {
                name: node.path.get(self.lock.dir.len() + 1..).unwrap_or_default().into(),
                sequence: node.sequence,
                kind: node.kind,
            };
            // The pipelined listing was answered after our create, so it contains our node; should it
            // not (a reply from another connection), list again before concluding anything.
            let mut relisted = pipelined.is_none();
            let mut listing = match pipelined {
                Some(listing) => Some(listing),
                None => Box::pin(self.listing(queue)).await?,
            };
            let (listing, ours_at) = loop {
                let Some(current) = listing else {
                    return Ok(Turn::NodeGone);
                };
                if let Some(index) = current.position(&ours) {
                    // The listing's copy of our name: the one the view keeps (one allocation, shared).
                    ours.clone_from(&current.children[index]);
                    break (current, index);
                }
                if relisted {
                    return Ok(Turn::NodeGone);
                }
                relisted = true;
                listing = Box::pin(self.listing(queue)).await?;
            };
            match driver.decide(ours.kind, &mut listing.children[..ours_at].iter().rev()) {
                Decision::Acquired => {
                    if let Some(delay) = self.lock.lock_delay_of() {
                        // Decided by this listing, on our session after our create: its stat counts
                        // the deletion of every node we would have waited for (`delay.rs`).
                        let verdict = delay::verdict(&listing.dir_stat, delay::marks_before(before));
                        node.served = match delay::settle(&self.server_dir(), &listing.dir_stat, verdict, delay) {
                            delay::Settled::Stands(served) => Some(served),
                            delay::Settled::At(..) if wait == Wait::No => return Ok(Turn::NotNow),
                            delay::Settled::At(until, served) => {
                                drop(listing);
                                let mut own_watch = self.watch(node.path.clone());
                                if let Some(turn) =
                                    Box::pin(self.serve_delay(&node.path, until, &mut own_watch)).await?
                                {
                                    return Ok(turn);
                                }
                                served
                            },
                        };
                    }
                    return Ok(Turn::Acquired { own_watch: None, handoff: false });
                },
                Decision::WaitFor(_) if wait == Wait::No => return Ok(Turn::NotNow),
                Decision::WaitFor(_) => {},
            }

            // Wait with the process's shared view of the directory (see `engine/view.rs` for why deciding
            // from it is safe): a waiter woken by its predecessor's deletion usually knows it holds
            // the lock without listing the directory again.
            let view = DirView::of(&self.server_dir(), queue, &listing.dir_stat);
            view.merge(&listing.children, ours.sequence, driver.admits_nodes_beside());
            // Whether a grant from the view must be confirmed by a listing (`view.rs`, *Nodes created
            // beside another*): decided by the latest listing, this one until we list again.
            let mut confirm = driver.confirm_grant(ours.kind, &listing.children[..ours_at]);
            drop(listing);
            // Our own node is watched too: if someone deletes it while we wait, we must not be granted
            // the lock when our predecessor goes. The server sends a session's replies and events in
            // order, and the select below polls our own watch first: once the server has confirmed
            // our watch (its reply came first), a deletion of our node before our predecessor's is
            // seen first. That holds while the watch is armed and the connection has not been
            // re-established since (re-registered watches fire in no particular order); otherwise —
            // the watch not set yet, or its reply not in — we check our node once more before taking
            // the lock: a read answered after our predecessor's deletion was seen.
            //
            // The watch is set only once our turn is near (`view.rs`, *Near turns*): a waiter deep in
            // the queue keeps none (a request and about 0.75 KB of memory less while it waits, issue
            // 24). In a queue drained through this process, each deletion the view records brings the
            // next waiters near, so a waiter's watch is set about two handoffs before its turn and its
            // grant needs no read.
            let mut own_watch = if self.lock.watch_own_node { NodeWatch::unset() } else { NodeWatch::never() };
            let mut own_watch_trusted = true;
            let mut session = self.context.client().state_watcher();
            session.state();
            'waiting: loop {
                let predecessor = 'decided: {
                    match view.decide(driver, &ours) {
                        None => return Ok(Turn::NodeGone),
                        Some(Decision::Acquired) if confirm => {
                            // A node created beside a write node ahead of us may have appeared since we
                            // listed: decide from a listing taken now instead (`view.rs`).
                            debug!(path = &*node.path, "granted from the view; confirming with a listing");
                            let Some(listing) = Box::pin(self.listing(queue)).await? else {
                                view.deleted(&ours);
                                return Ok(Turn::NodeGone);
                            };
                            // Answered after our create, on our session: our node is listed unless gone.
                            let Some(ours_at) = listing.position(&ours) else {
                                view.deleted(&ours);
                                return Ok(Turn::NodeGone);
                            };
                            // The listing is now the latest: merged, it decides (from the view, which has
                            // every node it shows ahead) whether we wait, and whether to confirm again.
                            view.merge(&listing.children[..=ours_at], ours.sequence, driver.admits_nodes_beside());
                            confirm = driver.confirm_grant(ours.kind, &listing.children[..ours_at]);
                            continue 'waiting;
                        },
                        Some(Decision::Acquired) => {
                            // Take in any event already delivered for our own node (one poll, no wait).
                            tokio::select! {
                                biased;
                                event = &mut own_watch => {
                                    if let Some(end) = self.own_node_event(event, &view, &ours, &mut own_watch, &mut own_watch_trusted) {
                                        return end;
                                    }
                                },
                                _ = std::future::ready(()) => {},
                            }
                            if !(own_watch_trusted && own_watch.is_armed()) {
                                debug!(
                                    path = &*node.path,
                                    watch_set = !own_watch.is_unset(),
                                    own_watch_trusted,
                                    "granted from the view before our own node's watch was confirmed; reading the node"
                                );
                                match Box::pin(retry_unknown(|| self.context.client().check_stat(&node.path))).await {
                                    Ok(Some(_)) => {},
                                    Ok(None) => {
                                        view.deleted(&ours);
                                        return Ok(Turn::NodeGone);
                                    },
                                    Err(err) if session_dead(&err) => return Err(self.session_lost(err.to_string())),
                                    Err(err) => return Err(Error::zk("check lock node", &node.path, err)),
                                }
                            }
                            match self.lock.lock_delay_of() {
                                None => {},
                                Some(delay) => match Box::pin(self.delay_verdict(driver, &ours, before)).await? {
                                    DelayCheck::NodeGone => {
                                        view.deleted(&ours);
                                        return Ok(Turn::NodeGone);
                                    },
                                    // Our server has not applied a deletion the shared view has seen:
                                    // wait for that node on our session, then decide again.
                                    DelayCheck::Behind(blocker) => break 'decided blocker,
                                    DelayCheck::Verdict(counted, verdict) => {
                                        node.served = match delay::settle(&self.server_dir(), &counted, verdict, delay)
                                        {
                                            delay::Settled::Stands(served) => Some(served),
                                            delay::Settled::At(until, served) => {
                                                if own_watch.is_unset() {
                                                    own_watch = self.watch(node.path.clone());
                                                }
                                                if let Some(turn) =
                                                    Box::pin(self.serve_delay(&node.path, until, &mut own_watch))
                                                        .await?
                                                {
                                                    view.deleted(&ours);
                                                    return Ok(turn);
                                                }
                                                served
                                            },
                                        }
                                    },
                                },
                            }
                            node.view = Some(view);
                            // Handed to the hold, which keeps watching our node with it (one not set
                            // yet is set by the session: `session/monitor.rs`).
                            let own_watch = (!own_watch.is_unset()).then_some(own_watch);
                            return Ok(Turn::Acquired { own_watch, handoff: true });
                        },
                        Some(Decision::WaitFor(predecessor)) => predecessor,
                    }
                };
                debug!(predecessor = &*predecessor.name, "waiting for predecessor");
                // Only its event matters, not when it is armed; its path is not kept but made from
                // our node's and its name when the watch is set (issue 24).
                let mut predecessor_watch =
                    watch_sibling(self.context.cleanup.clone(), node.path.clone(), predecessor.name.clone());
                let mut near = own_watch.is_unset().then(|| view.near(predecessor.sequence, ours.sequence));
                loop {
                    tokio::select! {
                        biased;
                        event = &mut own_watch => {
                            if let Some(end) = self.own_node_event(event, &view, &ours, &mut own_watch, &mut own_watch_trusted) {
                                return end;
                            }
                        },
                        true = async { match near.as_mut() { Some(near) => { near.await; true }, None => false } }, if near.is_some() => {
                            // Our turn is near: watch our node (the request goes out when the first
                            // branch polls it, right after this).
                            near = None;
                            own_watch = self.watch(node.path.clone());
                        },
                        _ = session.changed() => own_watch_trusted = false,
                        event = &mut predecessor_watch => {
                            match event {
                                Watched::Deleted => view.deleted(&predecessor),
                                Watched::SessionDead(state) => return Err(self.session_lost(state.to_string())),
                                Watched::Refused(err) => {
                                    let path = format!("{}/{}", self.lock.dir, predecessor.name);
                                    return Err(Error::zk("watch the lock node", &path, err));
                                },
                                Watched::Other => {},
                            }
                            break;
                        },
                    }
                }
            }
        }
    }

    /// What an event on our own node means for a waiter: `Some` ends the wait (our node is gone,
    /// or the session). Otherwise (its data changed) the watch is set again, and can no longer be
    /// trusted to show a deletion before our predecessor's.
    fn own_node_event(
        &self,
        event: Watched,
        view: &DirView,
        ours: &LockChild,
        own_watch: &mut NodeWatch,
        trusted: &mut bool,
    ) -> Option<Result<Turn>> {
        match event {
            Watched::Deleted => {
                view.deleted(ours);
                Some(Ok(Turn::NodeGone))
            },
            Watched::SessionDead(state) => Some(Err(self.session_lost(state.to_string()))),
            Watched::Refused(err) => {
                Some(Err(Error::zk("watch the lock node", &format!("{}/{}", self.lock.dir, ours.name), err)))
            },
            Watched::Other => {
                *trusted = false;
                *own_watch = self.watch(format!("{}/{}", self.lock.dir, ours.name).into());
                None
            },
        }
    }

    fn session_lost(&self, state: String) -> Error {
        Error::SessionLost { path: self.lock.dir.to_string(), state }
    }

    fn watch(&self, path: Arc<str>) -> NodeWatch {
        watch_node(self.context.cleanup.clone(), path)
    }
}

/// The listing a create of our node leaves to come (`OnSession::create`).
enum ListingToCome {
    /// Pipelined behind the create (`None`: none, or it failed: the waiter lists).
    Have(Option<Arc<Listing>>),
    /// Among acquires of the directory setting up at once: one that shows our node, shared
    /// (`listing::Setup::listing_for`). Awaited by the attempt rather than in the create, whose
    /// future every queued waiter would otherwise keep at the size of this state.
    Shared { setup: Option<listing::Setup>, patience: Duration },
}

/// The czxid of our node at `path`, created in one `multi` with its directory — whose create
/// results carry no stat (`stat` is invalid then) — from `listing`, the directory listed right
/// behind that `multi` on our session: `None` if it cannot tell (then read the node).
///
/// Why the directory's czxid is our node's:
/// 1. The `multi` created the directory instance D and our node in it in one transaction; every
///    operation of a transaction bears its zxid. So D's czxid is our node's.
/// 2. The listing is answered after the `multi`, and is of D if it lists our node's name: that
///    name (our attempt's GUID and the sequence number D's counter gave it) is in no other
///    instance. A node of ours in another instance would be of an earlier create of this
///    attempt, found missing (`find_protected`) before the `multi` was sent, and numbered by
///    that instance's counter — and an instance made after D would only hold it were our node
///    created there, which nothing of ours does once the `multi` succeeded.
fn created_with_directory(stat: &zk::Stat, path: &str, listing: Option<&Listing>) -> Option<i64> {
    if !stat.is_invalid() {
        return Some(stat.czxid);
    }
    let name = path.rsplit('/').next()?;
    let listing = listing?;
    listing.children.iter().any(|child| *child.name == *name).then_some(listing.dir_stat.czxid)
}

/// How a create of our node (alone, or with missing levels of the lock path) failed.
enum CreateError {
    /// The create of our node (or the whole request) failed.
    Node(zk::Error),
    /// The create of a missing level failed: nothing was applied.
    Parents(zk::Error),
    /// The client's chroot does not exist: nothing was applied.
    ChrootMissing,
}

/// A create of our node sent, resolving to its stat, path and sequence number.
type CreateFuture<'f> =
    Pin<Box<dyn Future<Output = std::result::Result<(zk::Stat, String, i64), CreateError>> + Send + 'f>>;

/// Whether a create that failed with `err` was certainly not applied: the server refused it.
fn refused(err: &zk::Error) -> bool {
    matches!(
        err,
        zk::Error::NoAuth
            | zk::Error::InvalidAcl
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::NotReadOnly
            | zk::Error::QuotaExceeded
            | zk::Error::BadArguments(_)
    ) || session_dead(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `Option<Duration>` kept in 8 bytes comes back as it went in, up to the cap.
    #[test]
    fn span8_keeps_a_duration() {
        assert_eq!(Span8::new(None).get(), None);
        for duration in
            [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(1_500), Duration::from_secs(86_400)]
        {
            assert_eq!(Span8::new(Some(duration)).get(), Some(duration));
        }
        // Past about 584 years: kept as the cap, never as "none".
        let cap = Duration::from_nanos(u64::MAX - 1);
        assert_eq!(Span8::new(Some(Duration::MAX)).get(), Some(cap));
        assert_eq!(Span8::new(Some(Duration::from_nanos(u64::MAX))).get(), Some(cap));
        assert_eq!(std::mem::size_of::<Span8>(), 8);
    }
}
