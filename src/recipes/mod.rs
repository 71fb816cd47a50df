//! The recipes: each a driver for the engine (who holds the lock, whom a waiter watches) and a
//! thin API over the shared hold layer.
//!
//! - [`mutex`]: [`InterProcessMutex`](mutex::InterProcessMutex) (Curator's `InterProcessMutex`),
//!   the re-entrant lock every recipe's lock kinds are made of.
//! - [`rw_lock`]: [`InterProcessReadWriteLock`](rw_lock::InterProcessReadWriteLock) (Curator's
//!   `InterProcessReadWriteLock`): a read and a write lock on one queue.
//! - [`leader`]: [`LeaderLatch`](leader::LeaderLatch) and [`LeaderSelector`](leader::LeaderSelector)
//!   (Curator's): leader election, leadership being a hold of a lock.
//! - [`semaphore`]: [`InterProcessSemaphoreV2`](semaphore::InterProcessSemaphoreV2) and
//!   [`InterProcessSemaphoreMutex`](semaphore::InterProcessSemaphoreMutex) (Curator's): leases
//!   counted in one directory, granted under an internal mutex.
//! - [`multi_lock`]: [`InterProcessMultiLock`](multi_lock::InterProcessMultiLock) (Curator's):
//!   several locks, all or none.
//! - [`revoker`]: [`Revoker`](revoker::Revoker) (Curator's): asks a revocable lock's holder to
//!   release it.
//! - [`builder`]: the options every lock recipe takes.

pub(crate) mod builder;
pub(crate) mod leader;
pub(crate) mod multi_lock;
pub(crate) mod mutex;
pub(crate) mod revoker;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;
