//! Leader election: [`LeaderLatch`] and [`LeaderSelector`] (Curator's), each a lock on the shared
//! engine — leadership *is* a hold, so it inherits the mutex's loss signal, loss deadline, fencing
//! token, fenced writes, cancel safety and managed-client behaviour instead of re-implementing
//! them.
//!
//! - A [`LeaderLatch`] queues `_c_<uuid>-latch-<seq>` nodes holding the participant id, as
//!   Curator's `LeaderLatch` does: the first node in sequence order leads; everyone else watches
//!   its immediate predecessor. Curator's `LeaderLatch` on the same path is a peer.
//! - A [`LeaderSelector`] is a mutex with Curator's `lock-` names and the participant id as node
//!   data, as Curator's `LeaderSelector` is, with Curator's `autoRequeue` loop around it: wait for
//!   leadership, lead, step down, queue again.
//!
//! # Two leaders never act at once
//! A leadership is a [`LockGuard`]. What the mutex proves for its holder holds for a leader
//! (`session/monitor.rs`, `engine/view.rs`): the next leader is elected only once the previous
//! leader's node is gone, and a leader whose session the ZooKeeper leader could expire is told
//! `Lost` before that can happen. [`LeaderSelector::run`] drops the leader's future as soon as the
//! leadership is `Lost` — before anyone else can be elected — and so does any code that races its
//! work against [`LockGuard::lost`]. What runs between two polls of that future (a blocking call)
//! cannot be stopped: fence what it writes with [`LockGuard::fenced_writer`] or the
//! [`fencing_token`](LockGuard::fencing_token), which grows with every leadership.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tracing::{info, warn};

use crate::engine::driver::StandardDriver;
use crate::engine::naming::{Queue, MUTEX_LOCK_NAME};
use crate::error::{transient, Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::holds::Holds;
use crate::metrics::{LEADER_LATCH, LEADER_SELECTOR};
use crate::recipes::builder::LockBuilder;
use crate::recipes::mutex::{InterProcessMutex, Participant, MUTEX_DRIVER};
use crate::session::client::RecipeClient;

/// Curator's `LeaderLatch` lock name.
const LATCH_LOCK_NAME: &str = "latch-";
const LATCH_QUEUE: Queue = &[LATCH_LOCK_NAME];
static LATCH_DRIVER: StandardDriver = StandardDriver { queue: LATCH_QUEUE, kind: 0, max_leases: 1 };

/// Leader election on a lock path: whoever holds the latch leads (Curator's `LeaderLatch`, node
/// for node).
///
/// [`acquire`](Self::acquire) joins the election with a node `_c_<uuid>-latch-<seq>` whose data
/// is the participant [`id`](LeaderLatchBuilder::id), and returns once that node is the first in
/// the queue: the returned [`LockGuard`] *is* the leadership. Its
/// [`state`](LockGuard::state) and [`lost`](LockGuard::lost) say when leadership can no longer be
/// trusted — before the next leader can be elected (see the README's *Leader election*); its
/// [`fencing_token`](LockGuard::fencing_token) grows with every leadership; its
/// [`fenced_writer`](LockGuard::fenced_writer) writes only while it leads.
/// [`release`](LockGuard::release) (or dropping it) steps down and leaves the election.
///
/// - Fair and herd-free: each participant watches only the one queued ahead of it.
/// - Cancel safe: dropping an `acquire` future leaves the election (its node is deleted in the
///   background, retried until it is gone or the session is dead).
/// - On a [`ManagedClient`](crate::ManagedClient), a pending `acquire` whose session expires joins
///   the election again on the new session by itself, at the end of the queue; it never claims
///   leadership from a node of an earlier session. A leadership lost to an expiry is
///   `Lost(SessionExpired)`; call `acquire` again to rejoin, or use [`LeaderSelector`], which does.
/// - Not re-entrant: a second `acquire` while this process leads through the same latch queues
///   behind its own leadership, like another participant.
///
/// Cheap to clone (clones are the same latch), `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zookeeper_client::Client) -> zk_recipes::Result<()> {
/// let latch = zk_recipes::LeaderLatch::builder(client, "/election/orders").id("host-a:4242").build()?;
/// let leadership = latch.acquire().await?; // waits until this participant leads
/// assert!(latch.has_leadership());
/// tokio::select! {
///     _ = async { /* lead: schedule jobs, fenced by leadership.fencing_token() */ } => {},
///     reason = leadership.lost() => eprintln!("no longer the leader: {reason}"),
/// }
/// leadership.release().await?; // step down
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LeaderLatch {
    lock: InterProcessMutex,
}

/// Builds a [`LeaderLatch`] with options: the participant [`id`](Self::id), and every option of
/// [`MutexBuilder`](crate::MutexBuilder) (loss policy, ACLs, request size limit, minimum session
/// timeout); see [`LeaderLatch::builder`].
pub type LeaderLatchBuilder = LockBuilder<LeaderLatch>;

impl LockBuilder<LeaderLatch> {
    /// The participant id, stored in the latch's node (UTF-8, as Curator stores its id): what
    /// [`LeaderLatch::leader`] and Curator's `getLeader().getId()` show. Default: empty.
    pub fn id(self, id: impl Into<String>) -> LeaderLatchBuilder {
        self.node_data(id.into().into_bytes())
    }

    /// Validates the path and the sizes (as [`MutexBuilder::build`](crate::MutexBuilder::build))
    /// and builds the latch. Nothing is sent to ZooKeeper until the first acquire.
    ///
    /// # Errors
    /// As [`MutexBuilder::build`](crate::MutexBuilder::build).
    pub fn build(self) -> Result<LeaderLatch> {
        let internals = Arc::new(self.internals(LATCH_LOCK_NAME)?);
        Ok(LeaderLatch { lock: InterProcessMutex::of_kind(internals, Holds::new(LEADER_LATCH), &LATCH_DRIVER, None) })
    }
}

impl LeaderLatch {
    /// A latch on the election path `path` (absolute, relative to the client's chroot if any),
    /// with an empty participant id.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it
    /// is too long for the server.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<LeaderLatch> {
        Self::builder(client, path).build()
    }

    /// A builder for a latch with options (the participant [`id`](LeaderLatchBuilder::id) first
    /// of all).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> LeaderLatchBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The election path.
    pub fn path(&self) -> &str {
        self.lock.path()
    }

    /// Joins the election and waits until this participant leads; the guard is the leadership.
    /// Keeps waiting across disconnections; on a `ManagedClient`, across session expiries.
    ///
    /// Cancel safe: dropping the future leaves the election.
    ///
    /// # Errors
    /// As [`InterProcessMutex::acquire`].
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.lock.acquire().await.inspect(|leadership| self.elected(leadership))
    }

    /// The tracing event of a leadership taken.
    fn elected(&self, leadership: &LockGuard) {
        info!(election = self.path(), node = leadership.lock_path(), fencing_token = %leadership.fencing_token(), "leadership taken");
    }

    /// Leads if nobody else leads or waits ahead right now; `Ok(None)` otherwise (and while the
    /// connection is down), leaving the election at once.
    ///
    /// # Errors
    /// As [`InterProcessMutex::try_acquire`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.lock.try_acquire().await.inspect(|leadership| leadership.iter().for_each(|l| self.elected(l)))
    }

    /// Waits at most `timeout` for leadership; `Ok(None)` if not elected in time (the election
    /// is then left).
    ///
    /// # Errors
    /// As [`InterProcessMutex::acquire_timeout`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.lock.acquire_timeout(timeout).await.inspect(|leadership| leadership.iter().for_each(|l| self.elected(l)))
    }

    /// Whether this process leads through this latch (or a clone) right now: a leadership guard
    /// is alive and not [`Lost`](crate::LockState::Lost) (re-evaluated now, so a lost leadership
    /// says `false` from the moment it is lost, also while its guard is still held).
    pub fn has_leadership(&self) -> bool {
        self.lock.holds().any_not_lost()
    }

    /// The current leader: the first participant in the queue, with its id
    /// ([`Participant::id`]), session and node; `None` if nobody is in the election.
    ///
    /// # Errors
    /// As [`participants`](Self::participants).
    pub async fn leader(&self) -> Result<Option<Participant>> {
        leader_of(&self.lock).await
    }

    /// Every participant in queue order, the leader first.
    ///
    /// # Errors
    /// As [`InterProcessMutex::participants`].
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.lock.participants().await
    }
}

/// Runs a leader again and again: Curator's `LeaderSelector` with `autoRequeue`.
///
/// [`run`](Self::run) waits for leadership, runs the leader's closure with the leadership (a
/// [`LockGuard`]) by value, steps down when its future completes, and queues again. The
/// closure's future is **dropped as soon as the leadership is `Lost`** — before the next leader
/// can be elected (the session monitor's bound; see the README's *Leader election*) — so a
/// leader that only acts inside that future never acts beside the next one. Code that blocks
/// the thread cannot be interrupted: fence its effects with the leadership's fencing token.
///
/// Nodes are a mutex's, `_c_<uuid>-lock-<seq>` holding the participant id: Curator's
/// `LeaderSelector` on the same path is a peer.
///
/// Cheap to clone, `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// let selector = zk_recipes::LeaderSelector::builder(&client, "/election/scheduler").id("host-a").build()?;
/// selector
///     .run(|leadership| async move {
///         // Lead until done; dropped at once if the leadership is lost.
///         println!("leading with fencing token {}", leadership.fencing_token());
///         tokio::time::sleep(std::time::Duration::from_secs(30)).await;
///     }) // returns, and queues again, when the closure's future completes
///     .await?; // never Ok: it ends only with an error no retry can fix
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LeaderSelector {
    lock: InterProcessMutex,
}

/// Builds a [`LeaderSelector`] with options: the participant [`id`](Self::id), and every option
/// of [`MutexBuilder`](crate::MutexBuilder); see [`LeaderSelector::builder`].
pub type LeaderSelectorBuilder = LockBuilder<LeaderSelector>;

impl LockBuilder<LeaderSelector> {
    /// The participant id, stored in the selector's node (UTF-8, as Curator's `LeaderSelector`
    /// stores its id). Default: empty.
    pub fn id(self, id: impl Into<String>) -> LeaderSelectorBuilder {
        self.node_data(id.into().into_bytes())
    }

    /// Validates the path and the sizes (as [`MutexBuilder::build`](crate::MutexBuilder::build))
    /// and builds the selector. Nothing is sent to ZooKeeper until `run`.
    ///
    /// # Errors
    /// As [`MutexBuilder::build`](crate::MutexBuilder::build).
    pub fn build(self) -> Result<LeaderSelector> {
        let internals = Arc::new(self.internals(MUTEX_LOCK_NAME)?);
        Ok(LeaderSelector {
            lock: InterProcessMutex::of_kind(internals, Holds::new(LEADER_SELECTOR), &MUTEX_DRIVER, None),
        })
    }
}

/// The pause before queueing again after an error a retry may fix.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

impl LeaderSelector {
    /// A selector on the election path `path`, with an empty participant id.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it
    /// is too long for the server.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<LeaderSelector> {
        Self::builder(client, path).build()
    }

    /// A builder for a selector with options (the participant id first of all).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> LeaderSelectorBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The election path.
    pub fn path(&self) -> &str {
        self.lock.path()
    }

    /// Leads whenever elected, for ever: waits for leadership, runs `lead(leadership)`, steps
    /// down when its future completes, and queues again. The leadership lasts exactly as long as
    /// that future (a guard the closure keeps beyond it keeps it longer; one it drops early does
    /// not end it). The future is dropped at once when the leadership is lost, and the selector
    /// queues again too.
    ///
    /// Never returns by itself: drop the future to leave the election (cancel safe — a queued
    /// node is deleted in the background, a leadership held by the dropped closure is released).
    /// Errors a retry may fix (a failed request) are logged and retried after a pause.
    ///
    /// A closure whose future completes at once steps down at once: the selector queues again
    /// right away (two requests a turn), as Curator's does.
    ///
    /// # Errors
    /// Only what no retry can fix: [`Error::ChrootMissing`], [`Error::EphemeralParent`],
    /// [`Error::NoAuth`], [`Error::Runtime`], [`Error::Closed`], [`Error::ZooKeeper`] for a
    /// request the server refused (an invalid ACL, say), and [`Error::SessionLost`] when the client
    /// will have no new session (a plain client's expired session, a managed client that gave
    /// up). Failed requests whose outcome is unknown, and throttling, are retried.
    pub async fn run<F, Fut>(&self, mut lead: F) -> Result<Infallible>
    where
        F: FnMut(LockGuard) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let leadership = match self.lock.acquire().await {
                Ok(leadership) => leadership,
                Err(err) if retry_may_fix(&err) => {
                    warn!(election = self.path(), %err, "leader selector: acquire failed; queueing again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                },
                Err(err) => return Err(err),
            };
            let signal = leadership.loss_signal();
            // The leadership lasts as long as the leader's future, whatever the closure does with
            // its guard (`|_leadership| async { .. }` drops it at once).
            let kept = leadership.another();
            let (node, token) = (leadership.lock_path().to_owned(), leadership.fencing_token());
            info!(election = self.path(), node, fencing_token = %token, "leadership taken");
            let stepped_down = {
                let leading = lead(leadership);
                let lost = signal.lost();
                tokio::pin!(leading, lost);
                // Loss wins a race with work: the leader's future is polled only while the leadership
                // is not known lost, checked anew before *every* poll. Polling `lost()` first
                // (`biased`) is not enough: it is woken by the session monitor, which re-evaluates the
                // loss deadline on its own timer. After a freeze (SIGSTOP, a long GC pause, a blocked
                // runtime thread) the leader's timer and the monitor's fire together, and the task
                // polled first wins: were it this one, the loss would not have been told yet and the
                // leader would run one more step after its loss deadline — possibly beside the next
                // leader. `reason()` re-evaluates the hold against the clock now (the deadline passed
                // is a loss at once), so the future is dropped before that step.
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                        return Poll::Ready(Err(reason));
                    }
                    if let Some(reason) = signal.reason() {
                        return Poll::Ready(Err(reason));
                    }
                    leading.as_mut().poll(cx).map(Ok)
                })
                .await
                // The leader's future is dropped here, before its guard below.
            };
            match stepped_down {
                Ok(()) => info!(election = self.path(), node, "stepped down"),
                Err(reason) => {
                    warn!(election = self.path(), node, %reason, "leadership lost; the leader's future is dropped")
                },
            }
            drop(kept);
        }
    }

    /// Whether this process leads through this selector right now (see
    /// [`LeaderLatch::has_leadership`]).
    pub fn has_leadership(&self) -> bool {
        self.lock.holds().any_not_lost()
    }

    /// The current leader (see [`LeaderLatch::leader`]).
    ///
    /// # Errors
    /// As [`participants`](Self::participants).
    pub async fn leader(&self) -> Result<Option<Participant>> {
        leader_of(&self.lock).await
    }

    /// Every participant in queue order, the leader first.
    ///
    /// # Errors
    /// As [`InterProcessMutex::participants`].
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.lock.participants().await
    }
}

async fn leader_of(lock: &InterProcessMutex) -> Result<Option<Participant>> {
    Ok(lock.participants().await?.into_iter().find(|participant| participant.is_holder))
}

/// Whether an acquire that failed with `err` may succeed if tried again: a request whose outcome
/// is unknown or that the server throttled, or our node deleted under us again and again — not a
/// refusal (an invalid ACL, bad arguments), which would fail the same way for ever.
fn retry_may_fix(err: &Error) -> bool {
    match err {
        Error::ZooKeeper { source, .. } => transient(source),
        Error::LockNodeDeleted { .. } => true,
        _ => false,
    }
}
