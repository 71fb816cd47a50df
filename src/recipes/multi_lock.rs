//! [`InterProcessMultiLock`]: several locks taken as one (Curator's `InterProcessMultiLock`).

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::recipes::mutex::InterProcessMutex;
use crate::recipes::semaphore::{InterProcessSemaphoreMutex, Lease};
use crate::state::{LockState, LossReason};

/// All of several locks, or none (Curator's `InterProcessMultiLock`): acquires them in the order
/// given, under one deadline for the whole acquire, and releases them in reverse order.
///
/// On a timeout or an error it releases what it took, in reverse order, before it returns — a
/// timeout is `Ok(None)`, an error [`Error::MultiLock`] with every failure (the acquire's and
/// those of the releases). It holds any mix of this crate's locks: [`InterProcessMutex`] (also
/// the read or write lock of an [`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock)),
/// [`InterProcessSemaphoreMutex`].
///
/// Each lock path may appear once: an acquire of a multi-lock with a path twice (the same mutex,
/// or the read and the write lock of one read/write lock) fails with [`Error::InvalidArgument`]
/// before anything is sent — the second acquire would wait behind the first (Curator's mutex
/// re-enters per thread; ours only inside a lock scope).
///
/// As with any set of locks, two multi-locks that take the same locks in different orders can
/// wait for each other for ever (each holding what the other needs next): give every process the
/// same order, or use [`acquire_timeout`](Self::acquire_timeout).
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// use zk_recipes::{InterProcessMultiLock, InterProcessMutex, InterProcessSemaphoreMutex, MultiLockMember};
///
/// let both = InterProcessMultiLock::new(vec![
///     MultiLockMember::from(InterProcessMutex::new(&client, "/locks/account-17")?),
///     InterProcessSemaphoreMutex::new(&client, "/locks/ledger")?.into(),
/// ]);
/// let held = both.acquire().await?;
/// // ... both resources are ours ...
/// held.release().await?; // ledger first, then account-17
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InterProcessMultiLock {
    locks: Vec<MultiLockMember>,
}

/// One lock of an [`InterProcessMultiLock`]: made `From` any lock of this crate a multi-lock can
/// hold.
#[derive(Clone, Debug)]
pub struct MultiLockMember(Member);

#[derive(Clone, Debug)]
enum Member {
    Mutex(InterProcessMutex),
    SemaphoreMutex(InterProcessSemaphoreMutex),
}

impl From<InterProcessMutex> for MultiLockMember {
    fn from(lock: InterProcessMutex) -> Self {
        MultiLockMember(Member::Mutex(lock))
    }
}

impl From<InterProcessSemaphoreMutex> for MultiLockMember {
    fn from(lock: InterProcessSemaphoreMutex) -> Self {
        MultiLockMember(Member::SemaphoreMutex(lock))
    }
}

impl MultiLockMember {
    /// The member's lock path.
    pub fn path(&self) -> &str {
        match &self.0 {
            Member::Mutex(lock) => lock.path(),
            Member::SemaphoreMutex(lock) => lock.path(),
        }
    }

    async fn acquire(&self, timeout: Option<Duration>) -> Result<Option<HeldLock>> {
        match (&self.0, timeout) {
            (Member::Mutex(lock), None) => lock.acquire().await.map(|guard| Some(HeldLock::Guard(guard))),
            (Member::Mutex(lock), Some(timeout)) => Ok(lock.acquire_timeout(timeout).await?.map(HeldLock::Guard)),
            (Member::SemaphoreMutex(lock), None) => lock.acquire().await.map(|lease| Some(HeldLock::Lease(lease))),
            (Member::SemaphoreMutex(lock), Some(timeout)) => {
                Ok(lock.acquire_timeout(timeout).await?.map(HeldLock::Lease))
            },
        }
    }
}

/// One lock held by a [`MultiLockGuard`]: a mutex's guard or a semaphore mutex's lease.
#[derive(Debug)]
#[non_exhaustive]
pub enum HeldLock {
    /// An [`InterProcessMutex`]'s (or a read/write lock's) guard.
    Guard(LockGuard),
    /// An [`InterProcessSemaphoreMutex`]'s lease.
    Lease(Lease),
}

impl HeldLock {
    /// The full path of the held node.
    pub fn node_path(&self) -> &str {
        match self {
            HeldLock::Guard(guard) => guard.lock_path(),
            HeldLock::Lease(lease) => lease.node_path(),
        }
    }

    /// Its state (see [`LockGuard::state`]).
    pub fn state(&self) -> LockState {
        match self {
            HeldLock::Guard(guard) => guard.state(),
            HeldLock::Lease(lease) => lease.state(),
        }
    }

    /// Resolves once it is lost (see [`LockGuard::lost`]).
    pub async fn lost(&self) -> LossReason {
        match self {
            HeldLock::Guard(guard) => guard.lost().await,
            HeldLock::Lease(lease) => lease.lost().await,
        }
    }

    async fn release(self) -> Result<()> {
        match self {
            HeldLock::Guard(guard) => guard.release().await,
            HeldLock::Lease(lease) => lease.release().await,
        }
    }
}

/// Every lock of an [`InterProcessMultiLock`], held. Released with
/// [`release`](Self::release), or in the background when dropped — in reverse order of
/// acquisition either way.
#[must_use = "dropping the guard releases every lock"]
#[derive(Debug)]
pub struct MultiLockGuard {
    /// In acquisition order.
    held: Vec<HeldLock>,
}

impl MultiLockGuard {
    /// The held locks, in acquisition order.
    pub fn held(&self) -> &[HeldLock] {
        &self.held
    }

    /// The worst state of the held locks: `Lost` if any is lost, else `Suspended` if any is, else
    /// `Held`.
    pub fn state(&self) -> LockState {
        let states = self.held.iter().map(HeldLock::state);
        let mut worst = LockState::Held;
        for state in states {
            match state {
                LockState::Lost(_) => return state,
                LockState::Suspended => worst = LockState::Suspended,
                LockState::Held => {},
            }
        }
        worst
    }

    /// Resolves once any of the held locks is lost, with its reason. Cancel safe.
    pub async fn lost(&self) -> LossReason {
        use std::future::Future;
        use std::task::Poll;
        let mut losses: Vec<_> = self.held.iter().map(|held| Box::pin(held.lost())).collect();
        std::future::poll_fn(|cx| {
            for loss in &mut losses {
                if let Poll::Ready(reason) = loss.as_mut().poll(cx) {
                    return Poll::Ready(reason);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Releases every lock in reverse order of acquisition, each waiting for ZooKeeper's
    /// confirmation (see [`LockGuard::release`]); every release is attempted.
    ///
    /// # Errors
    /// [`Error::MultiLock`] with every release that failed.
    pub async fn release(mut self) -> Result<()> {
        let failures = release_in_reverse(std::mem::take(&mut self.held)).await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::MultiLock { failures })
        }
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        // Each dropped guard starts its release in the background, newest first.
        while let Some(held) = self.held.pop() {
            drop(held);
        }
    }
}

/// Releases `held` newest first; the failures, with their paths. If cancelled, what is left is
/// released in the background, newest first too (dropped as a guard).
async fn release_in_reverse(held: Vec<HeldLock>) -> Vec<(String, Error)> {
    let mut held = MultiLockGuard { held };
    let mut failures = Vec::new();
    while let Some(lock) = held.held.pop() {
        let path = lock.node_path().to_owned();
        if let Err(err) = lock.release().await {
            failures.push((path, err));
        }
    }
    failures
}

impl InterProcessMultiLock {
    /// A multi-lock over `locks`, acquired in this order: `InterProcessMutex`es (a `Vec` of them
    /// as is), or any mix of [`MultiLockMember`]s.
    pub fn new<L: Into<MultiLockMember>>(locks: impl IntoIterator<Item = L>) -> InterProcessMultiLock {
        InterProcessMultiLock { locks: locks.into_iter().map(Into::into).collect() }
    }

    /// The member locks, in acquisition order.
    pub fn members(&self) -> &[MultiLockMember] {
        &self.locks
    }

    /// Waits until every lock is held.
    ///
    /// Cancel safe: the locks taken so far are released in the background, newest first, and
    /// nothing of the acquire in progress is left.
    ///
    /// # Errors
    /// [`Error::MultiLock`]: the first acquire that failed (the locks already taken were released
    /// before this returns), and any of those releases that failed.
    pub async fn acquire(&self) -> Result<MultiLockGuard> {
        match self.acquire_with(None).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::MultiLock { failures: Vec::new() }),
        }
    }

    /// Waits at most `timeout` — for the whole acquire, not per lock — until every lock is held;
    /// `Ok(None)` if they were not all held in time, once the locks already taken are released.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); also [`Error::MultiLock`] if releasing after a timeout
    /// failed.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<MultiLockGuard>> {
        self.acquire_with(Some(timeout)).await
    }

    async fn acquire_with(&self, timeout: Option<Duration>) -> Result<Option<MultiLockGuard>> {
        // A lock path twice: the second acquire would wait behind the first (ours are re-entrant
        // only inside a lock scope, not per thread as Curator's), or be refused.
        for (at, lock) in self.locks.iter().enumerate() {
            if self.locks[..at].iter().any(|earlier| earlier.path() == lock.path()) {
                return Err(Error::InvalidArgument {
                    path: lock.path().to_owned(),
                    reason: "the lock path is in the multi-lock twice: its second acquire would wait for the first"
                        .into(),
                });
            }
        }
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        // Dropped on a cancel: the locks taken so far are released newest first.
        let mut guard = MultiLockGuard { held: Vec::with_capacity(self.locks.len()) };
        for lock in &self.locks {
            let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            match lock.acquire(left).await {
                Ok(Some(held)) => guard.held.push(held),
                Ok(None) => {
                    let failures = release_in_reverse(std::mem::take(&mut guard.held)).await;
                    return if failures.is_empty() { Ok(None) } else { Err(Error::MultiLock { failures }) };
                },
                Err(err) => {
                    let mut failures = vec![(lock.path().to_owned(), err)];
                    failures.extend(release_in_reverse(std::mem::take(&mut guard.held)).await);
                    return Err(Error::MultiLock { failures });
                },
            }
        }
        Ok(Some(guard))
    }
}
