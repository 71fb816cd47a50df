//! A hold — one granted lock node, shared by the guards of re-entrant acquires — and the table of
//! a lock's holds, which every recipe owns one of (per lock kind: a read/write lock owns two).
//!
//! # When a hold's node is deleted
//! A hold ends — it is released to the session monitor (nothing that happens to its node from
//! then on is a loss) and its node's delete is sent — when both:
//! 1. its last guard is released or dropped, and
//! 2. no other hold *pins* it. A read hold downgraded from a write hold pins that write hold: the
//!    write node is what keeps every writer out while the read lasts (see
//!    [`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock)), so it stays until the read
//!    hold ends, however early the write guards go.
//!
//! Both counts live behind one lock in the hold, so exactly one caller sees them reach zero and
//! ends the hold, once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tracing::{info_span, Instrument};

use crate::engine::{Grant, LockNode};
use crate::error::{Error, Result};
use crate::metrics;
use crate::session::client::SessionContext;
use crate::session::monitor::HoldFeed;
use crate::state::{LockState, LossReason};
use crate::sync::lock;

/// One hold of a lock: our node, shared by all of its guards, and what the session monitor tells
/// about it.
#[derive(Debug)]
pub(crate) struct Hold {
    id: u64,
    pub(crate) node: LockNode,
    pub(crate) feed: Arc<HoldFeed>,
    /// The session holding the lock (not necessarily the client's current one).
    pub(crate) context: Arc<SessionContext>,
    /// The hold whose node this hold's exclusion also rests on (a downgraded read: its write
    /// hold), kept from ending until this one ends.
    pin: Option<Arc<Hold>>,
    /// The recipe's metrics label.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    recipe: &'static str,
    life: Mutex<Life>,
    #[cfg(feature = "metrics")]
    granted: std::time::Instant,
}

#[derive(Debug, Default)]
struct Life {
    /// Guards alive.
    guards: usize,
    /// Holds pinning this one.
    pins: usize,
    /// The hold ended (released to the monitor, its node's delete sent).
    ended: bool,
}

/// A pin on a hold: keeps it from ending while taken. Taken *before* the pinning hold is queued
/// (a hold with no guard left cannot be pinned) and handed to that hold once granted, which gives
/// it up when it ends; dropped unused — the acquire failed or was cancelled — it gives itself up,
/// ending the pinned hold if its guards are gone meanwhile.
#[derive(Debug)]
pub(crate) struct Pin(Option<Arc<Hold>>);

impl Pin {
    /// Pins `hold` if one of its guards is still alive and it is not known lost.
    pub(crate) fn take(hold: &Arc<Hold>) -> Result<Pin> {
        if let LockState::Lost(reason) = hold.state() {
            return Err(Error::LockLost { path: hold.lock_path().to_owned(), reason });
        }
        let mut life = lock(&hold.life);
        if life.guards == 0 {
            return Err(Error::LockLost { path: hold.lock_path().to_owned(), reason: LossReason::NodeDeleted });
        }
        life.pins += 1;
        Ok(Pin(Some(hold.clone())))
    }

    /// The pinned hold, for the hold that keeps the pin from now on (and gives it up with
    /// [`unpin`] when it ends).
    fn keep(mut self) -> Option<Arc<Hold>> {
        self.0.take()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Some(pinned) = self.0.take() {
            // Nobody awaits this deletion: it runs in the background like a dropped guard's.
            drop(unpin(&pinned));
        }
    }
}

/// Gives up one pin on `pinned`; ends it (returning its deletion) if that was the last thing
/// keeping it.
fn unpin(pinned: &Hold) -> Option<JoinHandle<Result<()>>> {
    let ends = {
        let mut life = lock(&pinned.life);
        life.pins -= 1;
        life.guards == 0 && life.pins == 0 && !std::mem::replace(&mut life.ended, true)
    };
    if ends {
        pinned.end(None)
    } else {
        None
    }
}

impl Hold {
    /// The lock path (the directory of our node).
    pub(crate) fn lock_path(&self) -> &str {
        self.node.path.rsplit_once('/').map_or("/", |(dir, _)| if dir.is_empty() { "/" } else { dir })
    }

    /// The pinned hold, if this one is a downgraded read.
    pub(crate) fn pinned(&self) -> Option<&Arc<Hold>> {
        self.pin.as_ref()
    }

    /// What this process knows about the hold now (re-evaluated by the session monitor): its own
    /// node's state, and lost as soon as the hold it pins is.
    pub(crate) fn state(&self) -> LockState {
        let own = self.context.session.state(&self.feed);
        match (own, self.pinned()) {
            (LockState::Lost(_), _) | (_, None) => own,
            (_, Some(pinned)) => match pinned.context.session.state(&pinned.feed) {
                lost @ LockState::Lost(_) => lost,
                LockState::Suspended => LockState::Suspended,
                LockState::Held => own,
            },
        }
    }

    /// Resolves once the hold is lost (its own node, or the one it pins), with the reason.
    pub(crate) async fn lost(&self) -> LossReason {
        // Starts the watches on the nodes if nobody looked yet.
        self.state();
        match self.pinned() {
            None => self.feed.lost().await,
            Some(pinned) => tokio::select! {
                reason = self.feed.lost() => reason,
                reason = pinned.feed.lost() => reason,
            },
        }
    }

    /// The nodes whose existence the hold's exclusion rests on, ours first: what a fenced write
    /// checks.
    pub(crate) fn fence_nodes(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.node.path).chain(self.pinned().map(|pinned| &*pinned.node.path))
    }

    /// Ends the hold: no longer tracked as a hold, and its node's delete sent (before this
    /// returns, so whatever the caller sends next on the session is ordered after it). With
    /// `relinquished`, guards of it may still be alive: they are told `Lost(reason)` before the
    /// delete is sent.
    fn end(&self, relinquished: Option<LossReason>) -> Option<JoinHandle<Result<()>>> {
        // Whether it ended lost (re-evaluated now: the monitor may not have told it yet; no side
        // effects on the release path).
        #[cfg(feature = "metrics")]
        let lost = matches!(self.context.session.peek(&self.feed), LockState::Lost(_));
        // Released: what happens to the node from now on is no loss. (Told before the node's
        // delete is sent, so the monitor hears of the release before the deletion.)
        match relinquished {
            None => self.context.session.release(&self.feed),
            Some(reason) => self.context.session.relinquish(&self.feed, reason),
        }
        #[cfg(feature = "metrics")]
        metrics::hold_ended(self.recipe, self.granted.elapsed(), lost);
        let _span = info_span!("release", lock_path = %self.lock_path(), sequence = self.node.sequence).entered();
        self.node.delete(&self.context.cleanup)
    }
}

/// The holds of one lock (one lock kind) in this process: at most one granted at a time for an
/// exclusive lock, plus lost ones whose guards are still alive (a short list; a map would cost
/// more per held lock).
#[derive(Debug)]
pub(crate) struct Holds {
    live: Mutex<Vec<Arc<Hold>>>,
    next_id: AtomicU64,
    recipe: &'static str,
}

/// What releasing a guard started: the deletions of the holds it ended (none while other guards
/// or pins remain; two when a downgraded read ends the write hold it pinned).
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
        Arc::new(Holds { live: Mutex::new(Vec::new()), next_id: AtomicU64::new(0), recipe })
    }

    /// The `recipe` label of this lock's metrics.
    pub(crate) fn recipe(&self) -> &'static str {
        self.recipe
    }

    /// Whether any hold with a guard alive is not lost (each re-evaluated now).
    pub(crate) fn any_not_lost(&self) -> bool {
        let live: Vec<Arc<Hold>> = lock(&self.live).clone();
        live.iter().any(|hold| !matches!(hold.state(), LockState::Lost(_)))
    }

    /// Whether any hold has a guard alive.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.live).is_empty()
    }

    /// A new hold from a grant, counting its first guard; `pin` keeps another hold from ending
    /// while this one lasts.
    pub(crate) fn register(&self, grant: Grant, pin: Option<Pin>) -> Arc<Hold> {
        let Grant { node, feed, context, handoff } = grant;
        metrics::granted(self.recipe);
        if handoff {
            metrics::handoff(self.recipe);
        }
        let hold = Arc::new(Hold {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            node,
            feed,
            context,
            pin: pin.and_then(Pin::keep),
            recipe: self.recipe,
            life: Mutex::new(Life { guards: 1, ..Life::default() }),
            #[cfg(feature = "metrics")]
            granted: std::time::Instant::now(),
        });
        lock(&self.live).push(hold.clone());
        hold
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
    /// node's delete is sent before this returns. Guards released later end nothing more. A hold
    /// that another hold pins (a downgraded read's write hold) is left alone: recipes that pin
    /// never call this.
    pub(crate) fn end_all(&self, reason: LossReason) -> Ended {
        let live: Vec<Arc<Hold>> = std::mem::take(&mut *lock(&self.live));
        let mut deletions = Vec::new();
        for hold in live {
            let ends = {
                let mut life = lock(&hold.life);
                life.pins == 0 && !std::mem::replace(&mut life.ended, true)
            };
            if ends {
                deletions.extend(hold.end(Some(reason)));
                if let Some(pinned) = hold.pinned() {
                    deletions.extend(unpin(pinned));
                }
            }
        }
        Ended(deletions)
    }

    /// Drops one guard of `hold`. When it was the last and nothing pins the hold, the hold ends:
    /// its node's delete is sent before this returns. Ending a hold drops its own pin, which may
    /// end the pinned hold in turn.
    pub(crate) fn release_guard(&self, hold: &Arc<Hold>) -> Ended {
        let ends = {
            let mut life = lock(&hold.life);
            life.guards -= 1;
            if life.guards > 0 {
                return Ended(Vec::new());
            }
            life.pins == 0 && !std::mem::replace(&mut life.ended, true)
        };
        {
            let mut live = lock(&self.live);
            if let Some(at) = live.iter().position(|live| live.id == hold.id) {
                live.swap_remove(at);
            }
        }
        if !ends {
            return Ended(Vec::new());
        }
        let mut deletions: Vec<_> = hold.end(None).into_iter().collect();
        // Our node's delete is sent; now the hold we pinned may end (its delete sent after ours).
        if let Some(pinned) = hold.pinned() {
            deletions.extend(unpin(pinned));
        }
        Ended(deletions)
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
