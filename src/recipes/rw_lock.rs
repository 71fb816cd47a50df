//! [`InterProcessReadWriteLock`]: a fair read/write lock (Curator's `InterProcessReadWriteLock`,
//! same node names, so Curator processes on the same path contend correctly).
//!
//! # The queue
//! Readers and writers queue in one directory, one sequence counter: `_c_<uuid>-__READ__<seq>` and
//! `_c_<uuid>-__WRIT__<seq>`.
//! - A **writer** holds when no node of either kind is ahead of it, and waits for its immediate
//!   predecessor (Curator's write lock).
//! - A **reader** holds when no write node is ahead of it, and waits for the *nearest* write node
//!   ahead — so a writer's release wakes exactly the readers between it and the next writer, and
//!   no reader ever waits for another reader (kazoo #649: its readers could wait for each other
//!   behind a writer and deadlock). Curator watches the *first* write node instead; both are
//!   correct, nearest is what lets a handoff wake only those it lets in.
//! - Fair: a reader queued behind a waiting writer waits for that writer, so a stream of readers
//!   cannot starve writers.
//!
//! Both rules are monotone — removing nodes ahead never turns a grant into a wait — so the engine
//! may decide from the process's view of the directory (`engine/view.rs`): when a writer goes,
//! each reader behind it decides from the view, without a listing.
//!
//! One kind of node does not get its sequence number from the server: a *downgraded read*
//! (below) is created beside its write node, named with that node's sequence number. Curator ≥
//! 5.5 creates them too (CURATOR-621). Such a node can appear below a waiter that has listed
//! already; a reader never waits for a read, but a writer does, so a writer whose latest listing
//! showed a write node ahead confirms a grant from the view with one more listing (`view.rs`,
//! *Nodes created beside another*, has the proof). Readers and the mutex pay nothing.
//!
//! # Downgrade, and why no writer slips in
//! Inside a lock scope of the write lock ([`InterProcessMutex::with_lock`] on
//! [`write_lock`](InterProcessReadWriteLock::write_lock)), a read acquire is granted at once: it
//! creates `_c_<uuid>-__READ__<s>`, where `s` is the sequence number of our write node, as a plain
//! `EPHEMERAL` node — Curator 5.5's layout (`StandardLockInternalsDriver.createsTheLock` with
//! `ReadLock.getSortingSequence`) — in one `multi` behind a check that our write node exists. The
//! write lock may then be released while the read hold stays. The claim:
//!
//! > While a downgraded read node exists, no write lock is granted — to us or to Curator (5.4 or
//! > 5.5+), queued before or after the read node's creation — and readers queued behind our
//! > write node come in once it is released.
//!
//! 1. The read node `R_s` is created only while our write node `W_s` exists (the `multi`'s
//!    check), i.e. while we hold the write lock: at that moment no other writer holds it.
//! 2. Every other write node alive then or later has a sequence number above `s`: those below
//!    were gone before `W_s` was granted, and sequence numbers are never reused. Every client
//!    orders nodes by the sequence number at the end of the name — ours (`naming.rs`), Curator 5.4
//!    and 5.5+ (`SortingLockInternalsDriver.fixForSorting`) — so `R_s` is ahead of every one of
//!    them, beside `W_s` (which of the two sorts first among equal numbers does not matter: both
//!    are ours).
//! 3. A writer holds only with nothing ahead. Curator lists the directory again on every wake-up
//!    (`LockInternals.internalLockLoop`); ours decides from a listing taken after `R_s`'s creation
//!    or from the view under `view.rs`'s rule. So while `R_s` exists, no writer is granted —
//!    including one queued between `W_s` and `R_s`, which Curator 5.4's own downgrade (a read node
//!    with a new sequence number) lets in (CURATOR-621).
//! 4. A reader waits only for write nodes ahead of it. Once `W_s` is deleted, readers behind it
//!    (up to the next writer) hold beside `R_s`, ours and Curator's alike.
//!
//! While the write hold lasts, the downgraded read's state is the worse of both holds' (a loss of
//! the write hold before it ended leaves the read hold lost) and its fenced writes check both
//! nodes; after the write hold ends, the read hold stands on its own node. A downgrade is refused
//! with [`Error::LockLost`] (nothing queued) if the write hold is known lost, or if its node is
//! gone when the `multi` reaches the server.
//!
//! # Who may downgrade
//! The read acquire must run inside a `with_lock` scope of the write lock, in the task polling it
//! (`hold/scope.rs`). Curator's idiom — `write.acquire()` then `read.acquire()` in one thread —
//! cannot be granted soundly here: a guard may move to another task, and futures one task joins
//! are one task, so "the holder" is not known outside a scope. Such a read acquire — by the task
//! (or thread, outside any task) that acquired a write hold of the same lock whose guards are not
//! all released — fails at once with [`Error::UnscopedDowngrade`] instead of waiting for its own
//! write node for ever. Any other task's read acquire queues as usual — also that of a task the
//! write guard was moved to: the lock knows which task *acquired* a hold, not which one holds its
//! guard now (Curator's is the same rule with threads: a lock acquired by one thread is another
//! thread's to wait for). Such a task's read waits until the write hold is released, so it must
//! release the guard first, or downgrade in a scope; `acquire_timeout` bounds the mistake.
//!
//! # Upgrade
//! A write acquire inside a lock scope of the read lock fails at once with [`Error::Upgrade`]:
//! two readers upgrading would each wait for the other's read node. Outside a scope the lock
//! cannot tell who holds a read guard, and a write acquire queues like anyone else's — behind its
//! own read hold, for ever: use `acquire_timeout`, or release the read first.

use std::sync::Arc;

use crate::engine::driver::{Decision, LockDriver};
use crate::engine::naming::{LockChild, Queue};
use crate::error::{Error, Result};
use crate::hold::holds::Holds;
use crate::hold::scope::scope_hold;
use crate::recipes::builder::LockBuilder;
use crate::recipes::mutex::{Entry, EntryRule, InterProcessMutex};
use crate::session::client::RecipeClient;
/// Curator's read lock name.
pub(crate) const READ_LOCK_NAME: &str = "__READ__";
/// Curator's write lock name.
pub(crate) const WRITE_LOCK_NAME: &str = "__WRIT__";
/// The kinds of a read/write lock's queue.
const RW_QUEUE: Queue = &[READ_LOCK_NAME, WRITE_LOCK_NAME];
const READ: usize = 0;
const WRITE: usize = 1;

/// The read/write rule (module docs, *The queue*), for nodes of either kind; creates nodes of
/// kind `creates`.
struct ReadWriteDriver {
    creates: usize,
}

impl LockDriver for ReadWriteDriver {
    fn queue(&self) -> Queue {
        RW_QUEUE
    }

    fn kind(&self) -> usize {
        self.creates
    }

    fn decide(&self, kind: usize, mut ahead_nearest_first: &mut dyn Iterator<Item = &LockChild>) -> Decision {
        let blocker = if kind == WRITE {
            ahead_nearest_first.next()
        } else {
            Iterator::find(&mut ahead_nearest_first, |child| child.kind == WRITE)
        };
        match blocker {
            None => Decision::Acquired,
            Some(blocker) => Decision::WaitFor(blocker.clone()),
        }
    }

    /// Downgraded reads are created beside write nodes (module docs).
    fn admits_nodes_beside(&self) -> bool {
        true
    }

    /// Only reads are created beside another, only beside a write node, and only writers wait
    /// for reads (`view.rs`, *Nodes created beside another*).
    fn confirm_grant(&self, kind: usize, ahead: &[LockChild]) -> bool {
        kind == WRITE && ahead.iter().any(|child| child.kind == WRITE)
    }
}

static READ_DRIVER: ReadWriteDriver = ReadWriteDriver { creates: READ };
static WRITE_DRIVER: ReadWriteDriver = ReadWriteDriver { creates: WRITE };

/// A read acquire (its [`EntryRule`], `other` being the write lock's holds): inside a write
/// scope, a downgrade (granted at once beside the write node); outside one, refused for the task
/// that holds the write lock (module docs, *Who may downgrade*), queued for anyone else.
fn read_entry(write_holds: &Arc<Holds>, path: &str) -> Result<Entry> {
    match scope_hold(write_holds) {
        Some(write) => {
            write.check_live()?;
            Ok(Entry::Beside { anchor: write })
        },
        None if write_holds.held_by_current_owner() => Err(Error::UnscopedDowngrade { path: path.to_owned() }),
        None => Ok(Entry::Queue),
    }
}

/// A write acquire (`other` being the read lock's holds): refused inside a read scope (the
/// upgrade).
fn write_entry(read_holds: &Arc<Holds>, path: &str) -> Result<Entry> {
    match scope_hold(read_holds) {
        Some(_) => Err(Error::Upgrade { path: path.to_owned() }),
        None => Ok(Entry::Queue),
    }
}

/// A fair read/write lock shared by every process that uses the same lock path — Curator's
/// `InterProcessReadWriteLock`, node for node, so Curator processes on the path contend with ours.
///
/// It is two locks on one queue: [`read_lock`](Self::read_lock), held by any number of readers at
/// once while no writer is ahead of them, and [`write_lock`](Self::write_lock), held by one writer
/// alone. Each is an [`InterProcessMutex`] handle with the mutex's whole API (`acquire`,
/// `try_acquire`, `acquire_timeout`, `with_lock`, `participants`, `path`) and returns the same
/// [`LockGuard`](crate::LockGuard): fencing token, state, `lost()`, fenced writes. Cancel safety,
/// loss reporting, ACLs, the managed client and metrics (labels `read_lock`, `write_lock`) are
/// the mutex's.
///
/// - **Fair**: a reader that queues behind a waiting writer waits for that writer.
/// - **Re-entrant** in the mutex's scoped sense: inside `with_lock` of the read (write) lock,
///   acquires of the same lock re-enter.
/// - **Downgrade**: inside a write scope, a read acquire is granted at once with its own node —
///   created beside the write node, named with its sequence number, as Curator ≥ 5.5 does — and
///   its own fencing token. The write lock can then be released while the read stays: other
///   readers come in, and **no writer is granted while the downgraded read lasts** — also one
///   queued between the write node and the read node, which Curator 5.4's own downgrade lets in
///   (see the module's source for the argument). The read guard may outlive the write scope.
///   Outside a write scope, a read acquire by the task holding the write lock fails at once with
///   [`Error::UnscopedDowngrade`] instead of waiting for itself.
/// - **Upgrade**: a write acquire inside a read scope fails at once with [`Error::Upgrade`]
///   (never a deadlock) and queues nothing.
///
/// Handles are owned, cheap to clone, `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zookeeper_client::Client) -> zk_recipes::Result<()> {
/// let rw = zk_recipes::InterProcessReadWriteLock::new(client, "/locks/catalog")?;
/// let (read, write) = (rw.read_lock(), rw.write_lock());
///
/// let g = read.acquire().await?; // shared with other readers
/// g.release().await?;
///
/// // Update, then keep reading what we wrote while other readers come in — no writer can.
/// let read_back = write
///     .with_lock(|_write_guard| async move { read.acquire().await })
///     .await??; // the write lock is released here; the downgraded read stays held
/// read_back.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InterProcessReadWriteLock {
    read: InterProcessMutex,
    write: InterProcessMutex,
}

/// Builds an [`InterProcessReadWriteLock`] with options; see
/// [`InterProcessReadWriteLock::builder`].
pub type ReadWriteLockBuilder = LockBuilder<InterProcessReadWriteLock>;

impl LockBuilder<InterProcessReadWriteLock> {
    /// Validates the path and the sizes and builds the lock, as
    /// [`MutexBuilder::build`](crate::MutexBuilder::build) does. Nothing is sent to ZooKeeper until
    /// the first acquire.
    ///
    /// # Errors
    /// As [`MutexBuilder::build`](crate::MutexBuilder::build).
    pub fn build(self) -> Result<InterProcessReadWriteLock> {
        let internals = Arc::new(self.internals(WRITE_LOCK_NAME)?);
        let (read_holds, write_holds) = (Holds::new("read_lock"), Holds::new("write_lock"));
        let read_entry = EntryRule { rule: read_entry, other: write_holds.clone() };
        let write_entry = EntryRule { rule: write_entry, other: read_holds.clone() };
        let read = InterProcessMutex::of_kind(internals.clone(), read_holds, &READ_DRIVER, Some(read_entry));
        let write = InterProcessMutex::of_kind(internals, write_holds, &WRITE_DRIVER, Some(write_entry));
        Ok(InterProcessReadWriteLock { read, write })
    }
}

impl InterProcessReadWriteLock {
    /// A read/write lock on the lock path `path` (absolute, relative to the client's chroot if
    /// any). Missing parents are created as container nodes on the first acquire.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it is
    /// too long for the server.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<InterProcessReadWriteLock> {
        Self::builder(client, path).build()
    }

    /// A builder with the mutex's options (node data, ACLs, loss policy, request size limit,
    /// minimum session timeout).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> ReadWriteLockBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The read lock: held by any number of readers while no writer is ahead of them.
    pub fn read_lock(&self) -> InterProcessMutex {
        self.read.clone()
    }

    /// The write lock: held by one writer, with no reader or writer ahead of it.
    pub fn write_lock(&self) -> InterProcessMutex {
        self.write.clone()
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        self.read.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(sequence: i64, kind: usize) -> LockChild {
        LockChild { name: format!("_c_x-{}{sequence:010}", RW_QUEUE[kind]).into(), sequence, kind }
    }

    #[test]
    fn readers_wait_for_the_nearest_writer_only() {
        let ahead = [node(5, READ), node(4, WRITE), node(3, READ), node(2, WRITE)];
        assert_eq!(READ_DRIVER.decide(READ, &mut ahead.iter()), Decision::WaitFor(node(4, WRITE)));
        assert_eq!(READ_DRIVER.decide(READ, &mut [node(2, READ), node(1, READ)].iter()), Decision::Acquired);
        assert_eq!(READ_DRIVER.decide(READ, &mut [].iter()), Decision::Acquired);
    }

    #[test]
    fn writers_wait_for_anyone_ahead() {
        assert_eq!(
            WRITE_DRIVER.decide(WRITE, &mut [node(3, READ), node(1, WRITE)].iter()),
            Decision::WaitFor(node(3, READ))
        );
        assert_eq!(WRITE_DRIVER.decide(WRITE, &mut [].iter()), Decision::Acquired);
    }

    #[test]
    fn the_rule_is_monotone() {
        // Every subset of the nodes ahead that the rule grants with, it grants with any subset of.
        let all = [node(6, READ), node(5, WRITE), node(4, READ), node(3, READ), node(2, WRITE)];
        for kind in [READ, WRITE] {
            for mask in 0u32..(1 << all.len()) {
                let set: Vec<_> = (0..all.len()).filter(|i| mask & (1 << i) != 0).map(|i| all[i].clone()).collect();
                if READ_DRIVER.decide(kind, &mut set.iter()) != Decision::Acquired {
                    continue;
                }
                for sub in 0u32..(1 << set.len()) {
                    let subset: Vec<_> =
                        (0..set.len()).filter(|i| sub & (1 << i) != 0).map(|i| set[i].clone()).collect();
                    assert_eq!(READ_DRIVER.decide(kind, &mut subset.iter()), Decision::Acquired);
                }
            }
        }
    }
}
