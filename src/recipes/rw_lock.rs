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
//! # Downgrade, and why no writer slips in
//! Inside a lock scope of the write lock ([`InterProcessMutex::with_lock`] on
//! [`write_lock`](InterProcessReadWriteLock::write_lock)), a read acquire is granted at once: it
//! queues a read node like any reader, but its driver grants it whatever is ahead (the write hold
//! of the same scope is what excludes everyone). The write lock may then be released while the
//! read hold stays. The claim:
//!
//! > While a downgraded read hold lasts, no other holder of the write lock — ours or Curator's,
//! > queued before or after our read node — is granted.
//!
//! 1. The read hold *pins* the write hold before its node is created (`hold/holds.rs`): the write
//!    node is deleted only once the write guards **and** the read hold are gone (the write guard's
//!    release returns at once; the node stays). Pinning fails, and nothing is queued, if the
//!    write hold is already lost or released.
//! 2. Every write node created after ours has a higher sequence number, so it waits while ours
//!    exists (a writer needs *nothing* ahead) — also one queued between our write and read nodes,
//!    which Curator 5.4 lets in as soon as its write lock is released (CURATOR-276's class).
//! 3. Write nodes created before ours were gone when ours was granted, and sequence numbers are
//!    never reused: none is ahead of ours again.
//! 4. So while our write node exists, no other write node is granted; it exists until the read
//!    hold ends, unless the session loses it (expiry, a deletion by hand). Then the write hold is
//!    lost, and the read hold reports `Lost` with it ([`LockGuard::state`] of a downgraded read
//!    is the worse of its own node's and the write node's); its fenced writes check both nodes.
//!
//! Readers queued behind our write node keep waiting too until the downgraded read ends: the
//! price of (4), by design.
//!
//! # Upgrade
//! A write acquire inside a lock scope of the read lock fails at once with [`Error::Upgrade`]:
//! two readers upgrading would each wait for the other's read node. Outside a scope the lock
//! cannot tell who holds a read guard, and a write acquire queues like anyone else's — behind its
//! own read hold, for ever: use `acquire_timeout`, or release the read first.

use std::sync::Arc;

use crate::engine::driver::{AtOnce, Decision, LockDriver};
use crate::engine::naming::{LockChild, Queue};
use crate::error::{Error, Result};
use crate::hold::holds::{Holds, Pin};
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
}

static READ_DRIVER: ReadWriteDriver = ReadWriteDriver { creates: READ };
static WRITE_DRIVER: ReadWriteDriver = ReadWriteDriver { creates: WRITE };
/// A read node granted at once: the downgrade.
static DOWNGRADE_DRIVER: AtOnce = AtOnce { queue: RW_QUEUE, kind: READ };

/// A read acquire: granted at once, pinning the write hold, inside a write scope (the downgrade).
struct ReadEntry {
    write_holds: Arc<Holds>,
}

impl EntryRule for ReadEntry {
    fn entry(&self) -> Result<Entry> {
        match scope_hold(&self.write_holds) {
            Some(write) => Ok(Entry::Pinned { driver: &DOWNGRADE_DRIVER, pin: Pin::take(&write)? }),
            None => Ok(Entry::Queue),
        }
    }
}

/// A write acquire: refused inside a read scope (the upgrade).
struct WriteEntry {
    read_holds: Arc<Holds>,
    path: String,
}

impl EntryRule for WriteEntry {
    fn entry(&self) -> Result<Entry> {
        match scope_hold(&self.read_holds) {
            Some(_) => Err(Error::Upgrade { path: self.path.clone() }),
            None => Ok(Entry::Queue),
        }
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
/// - **Downgrade**: inside a write scope, a read acquire is granted at once with its own node and
///   fencing token; the write lock can then be released while the read stays, and **no writer is
///   granted while the downgraded read lasts** — also one queued before our read node, which
///   Curator 5.4 lets in (the write node stays until the read ends; see the module's source for
///   the argument). The read guard may outlive the write scope.
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
        let read_entry = ReadEntry { write_holds: write_holds.clone() };
        let write_entry = WriteEntry { read_holds: read_holds.clone(), path: internals.dir().to_owned() };
        let read = InterProcessMutex::of_kind(internals.clone(), read_holds, &READ_DRIVER, Some(Box::new(read_entry)));
        let write = InterProcessMutex::of_kind(internals, write_holds, &WRITE_DRIVER, Some(Box::new(write_entry)));
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
        LockChild { name: format!("_c_x-{}{sequence:010}", RW_QUEUE[kind]), sequence, kind }
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
