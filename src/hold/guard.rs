//! [`LockGuard`]: proof of holding a lock, and its [`FencingToken`].

use std::fmt;
use std::sync::Arc;

use crate::engine::Grant;
use crate::error::Result;
use crate::hold::fenced::FencedWriter;
use crate::hold::holds::{confirm, Hold, Holds};
use crate::session::cleanup::Backoff;
use crate::session::monitor::LossHook;
use crate::state::{LockState, LossReason};
use crate::sync::Record;

/// What a revocation request writes as the lock node's data (Curator's
/// `LockInternals.REVOKE_MESSAGE`).
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

/// Resolves once `hold`'s node's data is [`REVOKE_MESSAGE`]; never if the node is gone or its
/// session dead (the hold is lost then, which its loss signal tells).
async fn revoke_requested(hold: &Hold) {
    let client = hold.context.client();
    let path = &*hold.node.path;
    let mut backoff = Backoff::new();
    loop {
        match client.get_and_watch_data(path).await {
            Ok((data, _, watcher)) => {
                if data == REVOKE_MESSAGE {
                    return;
                }
                // Its data changed, it was deleted, or the session ended: read again.
                let event = watcher.changed().await;
                if event.event_type == zookeeper_client::EventType::Session && event.session_state.is_terminated() {
                    return std::future::pending().await;
                }
            },
            Err(zookeeper_client::Error::NoNode) => return std::future::pending().await,
            Err(err) if crate::error::session_dead(&err) => return std::future::pending().await,
            Err(err) => {
                tracing::debug!(path, %err, "reading the lock node for a revocation request; retrying");
                backoff.wait().await;
            },
        }
    }
}

/// A token that orders holders of a lock: the `czxid` (creation transaction id) of the holder's
/// lock node.
///
/// Transaction ids are assigned by the ensemble's leader in one total order, so a later holder
/// of the same lock always has a larger token than an earlier one. Pass it to the resources you
/// guard and have them reject any token lower than the highest they have seen: that is what
/// stops a holder that lost the lock without noticing (a long GC pause, a frozen VM) from
/// overwriting the work of the next holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

impl FencingToken {
    /// The token as a number (the node's `czxid`), e.g. to store it next to the data it guards.
    pub fn as_i64(self) -> i64 {
        self.0
    }

    /// A token from a number stored earlier with [`as_i64`](Self::as_i64), to compare it with the
    /// token of a later hold.
    pub fn from_i64(czxid: i64) -> FencingToken {
        FencingToken(czxid)
    }
}

/// The number of [`as_i64`](FencingToken::as_i64), in decimal (what `ZKLOCK_FENCING_TOKEN`-style
/// environment variables and logs carry; it parses back with `str::parse::<i64>`).
impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Holding a lock: returned by the acquire methods of every lock
/// ([`InterProcessMutex`](crate::InterProcessMutex)).
///
/// Call [`release`](Self::release) to release and learn whether the lock node was deleted;
/// dropping the guard releases in the background (the node is deleted by a task that retries
/// until it is gone or the session is dead). With re-entrant acquires (inside
/// [`InterProcessMutex::with_lock`](crate::InterProcessMutex::with_lock)), the node is deleted
/// when the hold's last guard goes. A guard may be moved to and released from any task: the lock
/// stays held until then, and every acquire outside a lock scope queues behind it.
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    holds: Arc<Holds>,
    pub(crate) hold: Record<Hold>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock_node", &self.lock_path())
            .field("fencing_token", &self.fencing_token())
            .field("state", &self.hold.feed.current())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The first guard of a new hold of `holds` (see [`Holds::register`]).
    pub(crate) fn granted(holds: &Arc<Holds>, grant: Grant, downgraded_from: Option<Record<Hold>>) -> LockGuard {
        LockGuard { holds: holds.clone(), hold: holds.register(grant, downgraded_from), released: false }
    }

    /// Another guard of `hold` (re-entry; see [`Holds::reenter`]).
    pub(crate) fn reentered(holds: &Arc<Holds>, hold: &Record<Hold>) -> Result<Option<LockGuard>> {
        Ok(holds.reenter(hold)?.then(|| LockGuard { holds: holds.clone(), hold: hold.clone(), released: false }))
    }

    /// Another guard of this hold (as a re-entrant acquire would get), keeping it held until
    /// both are released; `None` if the hold is lost or its last guard is gone.
    pub(crate) fn another(&self) -> Option<LockGuard> {
        LockGuard::reentered(&self.holds, &self.hold).ok().flatten()
    }

    /// Calls `hook` once when this hold is newly lost (see `HoldFeed::on_lost`); returns the
    /// reason instead if it was already told it is lost.
    pub(crate) fn on_lost(&self, hook: std::sync::Weak<dyn LossHook>) -> Option<LossReason> {
        self.hold.feed.on_lost(hook)
    }

    /// Full path of our lock node, e.g. `/locks/orders/_c_<uuid>-lock-0000000007`.
    pub fn lock_path(&self) -> &str {
        &self.hold.node.path
    }

    /// The sequence number of our lock node.
    pub fn sequence(&self) -> i64 {
        self.hold.node.sequence
    }

    /// The fencing token of this hold: the `czxid` of our lock node. Larger for every later
    /// holder of the same lock path.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken(self.hold.node.czxid)
    }

    /// What this process knows about the lock right now: `Held`, `Suspended` (only under
    /// [`LossPolicy::SessionDeadline`](crate::LossPolicy::SessionDeadline)) or `Lost(reason)`.
    /// `Lost` is final.
    pub fn state(&self) -> LockState {
        self.hold.state()
    }

    /// How long this hold stays certain if ZooKeeper answers nothing more: the time left until
    /// its session's loss deadline (the README's *Guarantees*), when the hold becomes
    /// `Lost(SessionDeadlinePassed)` unless a heartbeat has moved the deadline on. `None` once
    /// the hold is lost.
    ///
    /// The deadline moves with every answered heartbeat (about every 0.22 × the session
    /// timeout). It lets the hold's certainty be handed to something that cannot watch the
    /// session itself — another process, a hardware watchdog: give it `now + certain_for()` as a
    /// lease and renew the lease as the value moves. If the renewals stop (this process frozen
    /// or starved), the lease runs out no later than this hold would have been told it is lost,
    /// so still before ZooKeeper can grant the lock to anyone else. `zklock`'s supervisor works
    /// this way. The deadline counts time the machine spent suspended (on Linux): count the lease
    /// on a clock that does too (`CLOCK_BOOTTIME`) where the machine may sleep.
    ///
    /// Read your clock *before* the call, so that the lease ends no later than the deadline:
    ///
    /// ```no_run
    /// # async fn demo(guard: zk_recipes::LockGuard) {
    /// let now = std::time::Instant::now();
    /// if let Some(left) = guard.certain_for() {
    ///     let lease_until = now + left;
    ///     // hand `lease_until` to the worker; renew it while the guard is held
    /// #   let _ = lease_until;
    /// }
    /// # }
    /// ```
    pub fn certain_for(&self) -> Option<std::time::Duration> {
        self.hold.certain_for()
    }

    /// Resolves once the lock can no longer be trusted, with the reason; at once if it already
    /// is lost.
    ///
    /// Cancel safe, and any number of tasks may wait on it. The usual shape is a `select!`
    /// between the work and `lost()`:
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn demo(guard: zk_recipes::LockGuard) {
    /// tokio::select! {
    ///     // Loss first: once the loss is known, the work gets no further poll.
    ///     biased;
    ///     reason = guard.lost() => eprintln!("stopping: lock lost ({reason})"),
    ///     _ = work() => {},
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) -> LossReason {
        self.hold.lost().await
    }

    /// An owned, cloneable handle on this hold's loss, for a task that does not own the guard: a
    /// spawned worker, a `select!` loop that must also call [`release`](Self::release), a
    /// `'static` callback. [`LossSignal::lost`] resolves when the hold is lost — exactly when
    /// [`lost`](Self::lost) does — and **never on a clean release**: once the guard is released
    /// it stays pending, and [`LossSignal::is_released`] says so.
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn demo(guard: zk_recipes::LockGuard) -> zk_recipes::Result<()> {
    /// let signal = guard.loss_signal();
    /// let worker = tokio::spawn(async move {
    ///     tokio::select! {
    ///         biased; // loss first
    ///         reason = signal.lost() => { eprintln!("stopping: {reason}"); false }
    ///         _ = work() => true,
    ///     }
    /// });
    /// let finished = worker.await.unwrap_or(false);
    /// guard.release().await?;      // the guard was never borrowed by the worker
    /// # let _ = finished; Ok(())
    /// # }
    /// ```
    pub fn loss_signal(&self) -> LossSignal {
        LossSignal { hold: self.hold.clone() }
    }

    /// Moves the end of this hold's lease to `duration` from now, or gives the hold a lease if it
    /// has none (Redisson's watchdog, made explicit: call it while the work goes on). When a lease
    /// runs out the hold ends `Lost(LeaseExpired)` whatever its guards do: every guard reads
    /// `Lost` from that instant, fenced writes are refused, [`lost`](Self::lost) resolves, and
    /// then the node is deleted, so the next waiter gets the lock. All guards of a hold (re-entry)
    /// share its lease.
    ///
    /// A fenced write is checked against the lease when it is sent: one sent before the lease ran
    /// out may still be applied after `lost()` resolved (the library's delete of the node is sent
    /// after it on the same session, so no later holder's write comes between). Sizes above about
    /// 30 years are taken as 30 years.
    ///
    /// How it differs from the session timeout: the session outlives a stuck task (its heartbeats
    /// come from the client, not from your code), so a holder that hangs or forgets its guard
    /// keeps the lock for ever; a lease bounds that. It is measured by this process, on the same
    /// clock as the loss deadline, and only ever shortens a hold: the session's loss still ends it
    /// earlier when it comes first.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the hold is already lost (a lease that ran
    /// out included) or released: a lease cannot revive it.
    pub fn extend(&self, duration: std::time::Duration) -> Result<()> {
        self.holds.lease(&self.hold, duration)
    }

    /// Resolves once someone asks for this lock back: the hold's node's data became
    /// `__REVOKE__`, written by [`Revoker::attempt_revoke`](crate::Revoker::attempt_revoke) or by
    /// Curator's `Revoker` (a request made before this call counts too). Only for a lock built
    /// with [`revocable(true)`](crate::LockBuilder::revocable); for any other it never resolves,
    /// nor once the hold's node is gone (then [`lost`](Self::lost) tells).
    ///
    /// Revocation is advisory, as in Curator: nothing is released by the request; the holder
    /// decides whether and when to [`release`](Self::release).
    ///
    /// Cancel safe; takes `&self`, so it can be awaited again after a timeout, and by several
    /// tasks (each sets a data watch on the node while it waits).
    pub async fn revoke_requested(&self) {
        if self.hold.revocable {
            revoke_requested(&self.hold).await;
        } else {
            std::future::pending::<()>().await;
        }
    }

    /// A ZooKeeper transaction fenced by this lock: its first operation checks that our lock
    /// node still exists, so nothing is written once the lock is gone. See [`FencedWriter`].
    pub fn fenced_writer(&self) -> FencedWriter<'_> {
        FencedWriter::new(&self.hold)
    }

    /// Releases this guard. If it was the hold's last guard, deletes the lock node and waits
    /// until ZooKeeper confirms (retrying across connection loss); if the session died first,
    /// the server has removed or will remove the node and this returns `Ok`.
    ///
    /// Cancel safe: if this future is dropped, the deletion still completes in the background.
    ///
    /// # Errors
    /// [`Error::SessionLost`] when the client became unusable (authentication failed) while the
    /// server keeps the session: the node goes when the server times the session out.
    /// [`Error::ZooKeeper`] or [`Error::NoAuth`] if the server refused the delete.
    ///
    /// [`Error::SessionLost`]: crate::Error::SessionLost
    /// [`Error::ZooKeeper`]: crate::Error::ZooKeeper
    /// [`Error::NoAuth`]: crate::Error::NoAuth
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        let ended = self.holds.release_guard(&self.hold);
        confirm(&self.hold, ended).await
    }
}

/// An owned handle on a hold's loss; see [`LockGuard::loss_signal`]. Cheap to clone,
/// `Send + Sync + 'static`; it keeps no lock held (the hold ends with its guards).
#[derive(Clone)]
pub struct LossSignal {
    hold: Record<Hold>,
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("lock_node", &&*self.hold.node.path)
            .field("state", &self.hold.feed.current())
            .field("released", &self.is_released())
            .finish()
    }
}

impl LossSignal {
    /// Resolves once the hold is lost, with the reason (at once if it already is); never if the
    /// hold was released cleanly. Cancel safe; any number of tasks may wait.
    pub async fn lost(&self) -> LossReason {
        if self.is_released() {
            // Released cleanly: never lost from now on (the feed says what it was told).
            return self.hold.feed.lost().await;
        }
        self.hold.lost().await
    }

    /// Whether the hold is lost (re-evaluated now, like [`LockGuard::state`]).
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Why the hold was lost, if it was.
    pub fn reason(&self) -> Option<LossReason> {
        let state = if self.is_released() { self.hold.feed.current() } else { self.hold.state() };
        match state {
            LockState::Lost(reason) => Some(reason),
            _ => None,
        }
    }

    /// Whether the hold's last guard was released (cleanly: it is then never lost).
    pub fn is_released(&self) -> bool {
        self.hold.feed.is_released()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // The deletions run in the background; nobody awaits them.
        drop(self.holds.release_guard(&self.hold));
    }
}
