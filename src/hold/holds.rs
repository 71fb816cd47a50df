//! A hold — one granted lock node, shared by the guards of re-entrant acquires — and the table of
//! a lock's holds, which every recipe owns one of (per lock kind: a read/write lock owns two).
//!
//! # When a hold's node is deleted
//! A hold ends — it is released to the session monitor (nothing that happens to its node from
//! then on is a loss) and its node's delete is sent — when its last guard is released or dropped.
//! The guard count lives behind a lock in the hold, so exactly one caller sees it reach zero and
//! ends the hold, once.
//!
//! # A hold downgraded from another
//! A read hold downgraded from a write hold (see
//! [`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock)) has its own node, created
//! beside the write node, which alone keeps writers out once the write hold ends; the write hold
//! ends with its own guards, as any hold. While the write hold lasts, the read hold's state is the
//! worse of both (a write hold lost before it ended leaves the read hold lost: `Lost` is final),
//! and its fenced writes check both nodes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info_span, warn, Instrument};

use crate::engine::{Grant, LockNode};
use crate::error::{Error, Result};
use crate::metrics;
use crate::session::client::SessionContext;
use crate::session::monitor::HoldFeed;
use crate::session::timers::{Due, TimerKey};
use crate::state::{LockState, LossReason};
use crate::sync::{lock, Record, Records, WeakRecord};

/// Every hold, side by side (see [`Records`]: the holds of a burst of grants would otherwise pin
/// the pages the acquires' transient state leaves free).
static HOLDS: Records<Hold> = Records::new();

/// One hold of a lock: our node, shared by all of its guards, and what the session monitor tells
/// about it.
#[derive(Debug)]
pub(crate) struct Hold {
    id: u64,
    pub(crate) node: LockNode,
    pub(crate) feed: Record<HoldFeed>,
    /// The session holding the lock (not necessarily the client's current one).
    pub(crate) context: Arc<SessionContext>,
    /// The hold this one was downgraded from (a downgraded read: its write hold), if any.
    downgraded_from: Option<Record<Hold>>,
    /// Who acquired the hold (the task, or the thread outside any task).
    acquired_by: Owner,
    /// Its node was created revocable.
    pub(crate) revocable: bool,
    /// The recipe's metrics label (only with metrics: every held lock has a `Hold`).
    #[cfg(feature = "metrics")]
    recipe: &'static str,
    life: Mutex<Life>,
    /// Its lease, once it has one (`Holds::lease`).
    lease: OnceLock<Arc<HoldLease>>,
    #[cfg(feature = "metrics")]
    granted: std::time::Instant,
}

/// A hold's lease ([`LockBuilder::lease`](crate::LockBuilder::lease)): when it runs out, the hold
/// ends `Lost(LeaseExpired)` — told first, then its node's delete sent (see `Holds::lease`).
struct HoldLease {
    /// When it runs out, on the session's clock (`SessionClock`: it counts a suspended machine's
    /// sleep, as the loss deadline does), and whether it was seen run out — final: from then on
    /// no `extend` moves it (read and written under this lock, so a hold once read
    /// `Lost(LeaseExpired)` never reads `Held` again); and its timer.
    until: Mutex<LeaseEnd>,
    /// The table that ends the hold, and the hold (weak: the hold owns its lease).
    holds: Weak<Holds>,
    hold: WeakRecord<Hold>,
}

impl std::fmt::Debug for HoldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldLease").field("until", &self.until).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct LeaseEnd {
    until: Instant,
    ran_out: bool,
    /// The session's timer that looks at the lease again (`Session::set_timer`): at or before
    /// `until` while the hold lasts; `None` once the hold ended (cancelled) or the lease ran out.
    timer: Option<TimerKey>,
}

impl LeaseEnd {
    /// Whether the lease has run out at `now`; once it has, for good.
    fn ran_out(&mut self, now: Instant) -> bool {
        self.ran_out |= now >= self.until;
        self.ran_out
    }
}

/// The longest lease taken as given (a longer one is this long: `Instant` arithmetic must not
/// overflow); about 30 years.
const MAX_LEASE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

#[derive(Debug, Default)]
struct Life {
    /// Guards alive.
    guards: usize,
    /// The hold ended (released to the monitor, its node's delete sent).
    ended: bool,
}

impl Hold {
    /// The lock path (the directory of our node).
    pub(crate) fn lock_path(&self) -> &str {
        self.node.path.rsplit_once('/').map_or("/", |(dir, _)| if dir.is_empty() { "/" } else { dir })
    }

    /// The hold this one was downgraded from, if this one is a downgraded read.
    pub(crate) fn downgraded_from(&self) -> Option<&Record<Hold>> {
        self.downgraded_from.as_ref()
    }

    /// Fails unless the hold may be built on now: a guard of it is alive and it is not known
    /// lost (so a downgrade inside a lost write scope is refused).
    pub(crate) fn check_live(&self) -> Result<()> {
        if let LockState::Lost(reason) = self.state() {
            return Err(Error::LockLost { path: self.lock_path().to_owned(), reason });
        }
        if lock(&self.life).guards == 0 {
            return Err(Error::LockLost { path: self.lock_path().to_owned(), reason: LossReason::NodeDeleted });
        }
        Ok(())
    }

    /// Whether the hold ended (its last guard went; its node's delete was sent).
    fn has_ended(&self) -> bool {
        lock(&self.life).ended
    }

    /// Whether the hold's lease has run out by the session's clock (its timer may not have run
    /// yet).
    fn lease_ran_out(&self) -> bool {
        self.lease.get().is_some_and(|lease| lock(&lease.until).ran_out(self.context.session.now()))
    }

    /// What this process knows about the hold now (re-evaluated by the session monitor): its own
    /// node's state — `Lost(LeaseExpired)` from the instant its lease runs out, even before its
    /// timer has ended it; for a downgraded read, lost as soon as the write hold it came from is
    /// lost before it ended, and suspended while that one is.
    pub(crate) fn state(&self) -> LockState {
        let own = self.own_state();
        let Some(write) = self.downgraded_from() else { return own };
        if let LockState::Lost(_) = own {
            return own;
        }
        // Ended cleanly, the write hold is never lost any more: only a loss it was told counts.
        // Until then, its own state — its lease read against the clock too, not only once its
        // timer has run (review I: a read downgraded from a write whose lease had run out read
        // `Held`, and its fenced write, checking the write node not yet deleted, was applied).
        let released = write.feed.is_released();
        let write_state = if released { write.feed.current() } else { write.own_state() };
        match write_state {
            lost @ LockState::Lost(_) => lost,
            LockState::Suspended if !released => LockState::Suspended,
            _ => own,
        }
    }

    /// The state of this hold's own node: the session monitor's, or `Lost(LeaseExpired)` from
    /// the instant its lease runs out (before its timer has ended it).
    fn own_state(&self) -> LockState {
        match self.context.session.state(&self.feed) {
            LockState::Lost(reason) => LockState::Lost(reason),
            _ if !self.has_ended() && self.lease_ran_out() => LockState::Lost(LossReason::LeaseExpired),
            own => own,
        }
    }

    /// How long the hold stays certain without another answer: `None` once it is lost, else the
    /// time left until its session's loss deadline.
    pub(crate) fn certain_for(&self) -> Option<std::time::Duration> {
        match self.state() {
            LockState::Lost(_) => None,
            _ => self.context.session.certain_for(),
        }
    }

    /// Resolves once the hold is lost (its own node, or the write hold it was downgraded from,
    /// before that one ended), with the reason.
    pub(crate) async fn lost(&self) -> LossReason {
        // Starts the watches on the nodes if nobody looked yet.
        self.state();
        match self.downgraded_from() {
            None => self.feed.lost().await,
            // A write hold released cleanly is never lost: its `lost()` stays pending.
            Some(write) => tokio::select! {
                reason = self.feed.lost() => reason,
                reason = write.feed.lost() => reason,
            },
        }
    }

    /// The nodes whose existence the hold's exclusion rests on, ours first: what a fenced write
    /// checks. A downgraded read checks the write node too while the write hold lasts.
    pub(crate) fn fence_nodes(&self) -> impl Iterator<Item = &str> {
        let write = self.downgraded_from().filter(|write| !write.has_ended());
        std::iter::once(&*self.node.path).chain(write.map(|write| &*write.node.path))
    }

    /// Whether `owner` acquired this hold.
    fn acquired_by(&self, owner: Owner) -> bool {
        self.acquired_by == owner
    }

    /// Ends the hold: no longer tracked as a hold, and its node's delete sent (before this
    /// returns, so whatever the caller sends next on the session is ordered after it). With
    /// `relinquished`, guards of it may still be alive: they are told `Lost(reason)` before the
    /// delete is sent.
    fn end(&self, relinquished: Option<LossReason>) -> Option<JoinHandle<Result<()>>> {
        // A lease seen run out by the clock (its timer may not have run yet) ends the hold
        // `Lost(LeaseExpired)` however it ends — released by its holder too: `Lost` is final, for
        // its guards, its loss signal and a read downgraded from it (review J: they read `Held`
        // again after the release) — and its node's deletion is unclean (a lock-delay waits it
        // out, as for a lease the timer ended).
        let relinquished = relinquished.or_else(|| self.lease_ran_out().then_some(LossReason::LeaseExpired));
        // Cancels its lease's timer, if any: the session's timers keep only live ones.
        if let Some(lease) = self.lease.get() {
            if let Some(timer) = lock(&lease.until).timer.take() {
                self.context.session.cancel_timer(timer);
            }
        }
        // Whether it ended lost (re-evaluated now: the monitor may not have told it yet; no side
        // effects on the release path).
        #[cfg(feature = "metrics")]
        let lost = matches!(self.context.session.peek(&self.feed), LockState::Lost(_));
        // Released: what happens to the node from now on is no loss. (Told before the node's
        // delete is sent, so the monitor hears of the release before the deletion.)
        let hook_due = match relinquished {
            None => {
                self.context.session.release(&self.feed);
                None
            },
            Some(reason) => Some(self.context.session.relinquish(&self.feed, reason)),
        };
        // Marked clean unless the library ended it for a holder that did not (its lease ran out):
        // that holder may still be running, which is what a lock-delay waits out.
        let clean = relinquished != Some(LossReason::LeaseExpired);
        // From here the delete is sent however this ends, before the hook (dropped after it):
        // the application's metrics recorder and `tracing` subscriber run below, and a panic
        // there left the hold ended, untracked and its node in place (review AG).
        let mut delete = DeleteOnDrop { hold: self, clean, sent: false };
        #[cfg(feature = "metrics")]
        metrics::hold_ended(self.recipe, self.granted.elapsed(), lost);
        let _span = info_span!("release", lock_path = %self.lock_path(), sequence = self.node.sequence).entered();
        let deletion = delete.send();
        // Its loss hook, now that the delete is sent (`Session::relinquish`).
        drop(hook_due);
        deletion
    }
}

/// Sends the delete of its hold's node (`LockNode::delete_marked`) when dropped, unless
/// [`send`](Self::send) did: [`Hold::end`] keeps one across the application's code.
struct DeleteOnDrop<'a> {
    hold: &'a Hold,
    clean: bool,
    sent: bool,
}

impl DeleteOnDrop<'_> {
    fn send(&mut self) -> Option<JoinHandle<Result<()>>> {
        self.sent = true;
        self.hold.node.delete_marked(&self.hold.context.cleanup, self.clean)
    }
}

impl Drop for DeleteOnDrop<'_> {
    fn drop(&mut self) {
        if !self.sent {
            // Only ever during a panic's unwind: a second panic here would abort the process.
            let send = std::panic::AssertUnwindSafe(|| drop(self.send()));
            let _ = std::panic::catch_unwind(send);
        }
    }
}

/// The holds of one lock (one lock kind) in this process: at most one granted at a time for an
/// exclusive lock, plus lost ones whose guards are still alive (a short list; a map would cost
/// more per held lock).
#[derive(Debug)]
pub(crate) struct Holds {
    live: Mutex<Live>,
    next_id: AtomicU64,
    recipe: &'static str,
}

/// The holds of one lock with a guard alive: the first in place, more in a list made only when a
/// second is live at the same time (a lost hold whose guards are kept, a shared lock's readers).
/// A lock usually has one at a time, so a hold costs no allocation of its own here: one made at
/// the grant would land among the acquires' transient state and pin its pages in a burst.
///
/// Invariant: `more` is empty while `first` is `None`.
#[derive(Debug, Default)]
struct Live {
    first: Option<Record<Hold>>,
    more: Vec<Record<Hold>>,
}

impl Live {
    fn push(&mut self, hold: Record<Hold>) {
        match self.first {
            None => self.first = Some(hold),
            Some(_) => self.more.push(hold),
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &Record<Hold>> {
        self.first.iter().chain(&self.more)
    }

    /// Removes the hold `id` if it is here.
    fn remove(&mut self, id: u64) {
        if self.first.as_ref().is_some_and(|first| first.id == id) {
            self.first = self.more.pop();
        } else if let Some(at) = self.more.iter().position(|hold| hold.id == id) {
            self.more.swap_remove(at);
        }
    }

    /// Takes every hold out.
    fn take(&mut self) -> Vec<Record<Hold>> {
        let Live { first, more } = std::mem::take(self);
        first.into_iter().chain(more).collect()
    }
}

/// What releasing a guard started: the deletion of the hold it ended (none while other guards
/// remain).
#[must_use]
pub(crate) struct Ended(Vec<JoinHandle<Result<()>>>);

impl Ended {
    /// Waits until every deletion is confirmed; the first error, if any.
    pub(crate) async fn confirmed(self) -> Result<()> {
        let mut result = Ok(());
        for task in self.0 {
            let outcome = task.await.unwrap_or(Ok(()));
            if result.is_ok() {
                result = outcome;
            }
        }
        result
    }
}

impl Holds {
    /// An empty table for a lock whose metrics carry `recipe`.
    pub(crate) fn new(recipe: &'static str) -> Arc<Holds> {
        Arc::new(Holds { live: Mutex::new(Live::default()), next_id: AtomicU64::new(0), recipe })
    }

    /// The `recipe` label of this lock's metrics.
    pub(crate) fn recipe(&self) -> &'static str {
        self.recipe
    }

    /// Whether any hold with a guard alive is not lost (each re-evaluated now).
    pub(crate) fn any_not_lost(&self) -> bool {
        let live: Vec<Record<Hold>> = lock(&self.live).iter().cloned().collect();
        live.iter().any(|hold| !matches!(hold.state(), LockState::Lost(_)))
    }

    /// Whether any hold has a guard alive.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.live).is_empty()
    }

    /// A new hold from a grant, counting its first guard, acquired by the current task (or
    /// thread); `downgraded_from` is the write hold a downgraded read comes from.
    pub(crate) fn register(&self, grant: Grant, downgraded_from: Option<Record<Hold>>) -> Record<Hold> {
        let Grant { node, feed, context, handoff, revocable } = grant;
        metrics::granted(self.recipe);
        if handoff {
            metrics::handoff(self.recipe);
        }
        let hold = HOLDS.insert(Hold {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            node,
            feed,
            context,
            downgraded_from,
            acquired_by: Owner::current(),
            revocable,
            #[cfg(feature = "metrics")]
            recipe: self.recipe,
            life: Mutex::new(Life { guards: 1, ..Life::default() }),
            lease: OnceLock::new(),
            #[cfg(feature = "metrics")]
            granted: std::time::Instant::now(),
        });
        lock(&self.live).push(hold.clone());
        hold
    }

    /// Whether the current task (or thread, outside any task) acquired a hold of this lock whose
    /// guards are not all released.
    pub(crate) fn held_by_current_owner(&self) -> bool {
        let owner = Owner::current();
        lock(&self.live).iter().any(|hold| hold.acquired_by(owner))
    }

    /// Counts another guard of `hold` (re-entry); fails if the hold was lost, `false` if every
    /// guard of it is already released (its node is gone or going: it cannot be re-entered).
    pub(crate) fn reenter(&self, hold: &Hold) -> Result<bool> {
        if let LockState::Lost(reason) = hold.state() {
            return Err(Error::LockLost { path: hold.lock_path().to_owned(), reason });
        }
        {
            let mut life = lock(&hold.life);
            if life.guards == 0 {
                return Ok(false);
            }
            life.guards += 1;
        }
        Ok(true)
    }

    /// Ends every hold of this lock now, however many guards of them are still alive (a closed
    /// [`LeaderLatch`](crate::LeaderLatch) steps down): each is told `Lost(reason)`, then its
    /// node's delete is sent before this returns. Guards released later end nothing more.
    pub(crate) fn end_all(&self, reason: LossReason) -> Ended {
        let live = lock(&self.live).take();
        let mut deletions = Vec::new();
        for hold in live {
            let ends = !std::mem::replace(&mut lock(&hold.life).ended, true);
            if ends {
                deletions.extend(hold.end(Some(reason)));
            }
        }
        Ended(deletions)
    }

    /// Gives `hold` a lease that runs out `duration` from now, or moves the end of the one it has
    /// (`extend`). When it runs out the hold ends `Lost(LeaseExpired)`, guards alive or not: every
    /// guard reads `Lost` from that instant (its state is checked against the clock, and so are
    /// fenced writes, which are refused from then on), the session monitor is told, and only then
    /// is the node's delete sent — so the next holder is granted after the holder was told. The
    /// session's timers do it (`session/timers.rs`: one task for every lease of the session); the
    /// timer holds the lease weakly and is cancelled when the hold ends.
    ///
    /// Fails with `LockLost` if the hold is already lost or ended (a lease cannot revive it).
    pub(crate) fn lease(self: &Arc<Self>, hold: &Record<Hold>, duration: Duration) -> Result<()> {
        hold.check_live()?;
        let duration = duration.min(MAX_LEASE);
        let session = &hold.context.session;
        let lease = hold.lease.get_or_init(|| {
            let until = session.now() + duration;
            Arc::new(HoldLease {
                until: Mutex::new(LeaseEnd { until, ran_out: false, timer: None }),
                holds: Arc::downgrade(self),
                hold: Record::downgrade(hold),
            })
        });
        // Checked and moved in one step: a lease seen run out is never moved.
        let mut end = lock(&lease.until);
        let now = session.now();
        if end.ran_out(now) {
            return Err(Error::LockLost { path: hold.lock_path().to_owned(), reason: LossReason::LeaseExpired });
        }
        // Ended since `check_live` (`end_all`: a closed latch): `end` marks the hold ended before
        // it cancels the lease's timer under this lock, so no timer set here outlives the hold
        // (review AD: one set after the cancel kept the session's timers alive for the lease).
        if hold.has_ended() {
            return Err(Error::LockLost { path: hold.lock_path().to_owned(), reason: LossReason::NodeDeleted });
        }
        end.until = now + duration;
        // A timer at or before the new end is kept: when it fires, it looks again (`due`). A later
        // one (the lease shortened) is replaced.
        if end.timer.is_none_or(|timer| timer.at() > end.until) {
            if let Some(timer) = end.timer.take() {
                session.cancel_timer(timer);
            }
            end.timer = Some(session.set_timer(end.until, Arc::downgrade(lease) as Weak<dyn Due>));
        }
        Ok(())
    }

    /// The lease of `hold` ran out: the hold ends now, told `Lost(LeaseExpired)` before its node's
    /// delete is sent (as `end_all` ends a hold).
    fn expire(&self, hold: &Record<Hold>) {
        lock(&self.live).remove(hold.id);
        if !std::mem::replace(&mut lock(&hold.life).ended, true) {
            // The report runs the application's `tracing` subscriber: a panic there must not
            // leave a hold marked ended but neither told lost nor deleted (review AF).
            let report = || {
                warn!(
                    lock_path = hold.lock_path(),
                    sequence = hold.node.sequence,
                    "the hold's lease ran out; releasing the lock"
                )
            };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(report));
            drop(hold.end(Some(LossReason::LeaseExpired)));
        }
    }

    /// Drops one guard of `hold`. When it was the last, the hold ends: its node's delete is sent
    /// before this returns.
    pub(crate) fn release_guard(&self, hold: &Record<Hold>) -> Ended {
        let ends = {
            let mut life = lock(&hold.life);
            life.guards -= 1;
            if life.guards > 0 {
                return Ended(Vec::new());
            }
            !std::mem::replace(&mut life.ended, true)
        };
        lock(&self.live).remove(hold.id);
        if !ends {
            return Ended(Vec::new());
        }
        Ended(hold.end(None).into_iter().collect())
    }
}

impl Due for HoldLease {
    /// The lease's timer fired: if the lease ran out, the hold ends (`Holds::expire`); if it was
    /// moved meanwhile, a timer is set at its new end. A timer that is no longer the lease's (the
    /// lease shortened: replaced) does nothing.
    fn due(self: Arc<Self>, key: TimerKey) {
        let Some(hold) = self.hold.upgrade() else { return };
        if hold.has_ended() {
            return;
        }
        let session = &hold.context.session;
        let mut end = lock(&self.until);
        if end.timer != Some(key) {
            return;
        }
        if end.ran_out(session.now()) {
            end.timer = None;
            drop(end);
            if let Some(holds) = self.holds.upgrade() {
                holds.expire(&hold);
            }
            return;
        }
        let due = Arc::downgrade(&self) as Weak<dyn Due>;
        end.timer = Some(session.set_timer(end.until, due));
    }
}

/// The span of a guard's release, for callers that await an [`Ended`].
pub(crate) fn release_span(hold: &Hold) -> tracing::Span {
    info_span!("release", lock_path = %hold.lock_path(), sequence = hold.node.sequence)
}

/// Awaits `ended` in the release span of `hold`.
pub(crate) async fn confirm(hold: &Hold, ended: Ended) -> Result<()> {
    ended.confirmed().instrument(release_span(hold)).await
}

/// Who runs an acquire: the tokio task polling it, or — outside any task (`Runtime::block_on`)
/// — the thread (a future given to `block_on` is polled on that thread only). Recorded in each
/// hold, so that a read acquire by the task that holds the write lock outside a scope can be
/// refused instead of waiting for itself
/// ([`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock), *Downgrade*). Futures one
/// task polls at once (`join!`, `select!`) are one owner, as in a lock scope ([`with_lock`](crate::InterProcessMutex::with_lock)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The owner of the code running now.
    pub(crate) fn current() -> Owner {
        match tokio::task::try_id() {
            Some(task) => Owner::Task(task),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}
