//! [`FencedWriter`]: ZooKeeper writes that only apply while we hold the lock.

use zookeeper_client as zk;

use crate::error::{session_dead, Error, Result};
use crate::guard::LockGuard;
use crate::state::LockState;

/// Why a [`FencedWriter::commit`] failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FencedWriteError {
    /// Nothing was written: our lock node is gone (the session expired, or someone deleted it),
    /// the session is dead, or this process already knows the lock is lost
    /// ([`LockGuard::state`] is `Lost`).
    #[error("fenced write refused: the lock is lost, nothing was written")]
    LockLost,
    /// Nothing was written: the operation at `index` (counting the operations you added, from
    /// 0) failed, e.g. a version mismatch.
    #[error("fenced write failed at operation {index}: {source}")]
    OperationFailed {
        /// Index of the failing operation among those added.
        index: usize,
        /// What ZooKeeper reported.
        #[source]
        source: zk::Error,
    },
    /// Nothing was written: the server refused the transaction for lack of rights (ACLs) on
    /// the operation at `index` (counting the operations you added, from 0), or on our lock
    /// node's check when `index` is `None`. The lock is still held; check the client's auth and
    /// the ACLs of the paths written.
    #[error("fenced write refused by ACLs (operation {index:?}); nothing was written, the lock is still held")]
    NoAuth {
        /// Index of the refused operation among those added; `None` for the lock check itself.
        index: Option<usize>,
    },
    /// The request failed without a verdict from the server (e.g. the connection was lost before
    /// the reply): the transaction may or may not have been applied. Read back before retrying.
    #[error("fenced write outcome unknown: {source}")]
    Request {
        /// What the client reported.
        #[source]
        source: zk::Error,
    },
}

/// A ZooKeeper `multi` transaction whose first operation checks that our lock node still exists,
/// so the writes are applied only if, at that point in the server's total order, we still hold
/// the lock. A holder whose session expired — even one that has not noticed yet, paused by GC or
/// a frozen VM — cannot write through it.
///
/// Made by [`LockGuard::fenced_writer`]. Add operations, then [`commit`](Self::commit); all or
/// none are applied.
///
/// ```no_run
/// # async fn demo(guard: zk_recipes::LockGuard) -> Result<(), Box<dyn std::error::Error>> {
/// let mut writer = guard.fenced_writer();
/// writer.add_set_data("/app/config", b"v2", None)?;
/// match writer.commit().await {
///     Ok(_) => println!("written while holding the lock"),
///     Err(zk_recipes::FencedWriteError::LockLost) => println!("lock lost: nothing written"),
///     Err(err) => return Err(err.into()),
/// }
/// # Ok(())
/// # }
/// ```
pub struct FencedWriter<'a> {
    guard: &'a LockGuard,
    writer: zk::MultiWriter<'a>,
}

impl std::fmt::Debug for FencedWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedWriter").field("lock_node", &self.guard.lock_path()).finish_non_exhaustive()
    }
}

impl<'a> FencedWriter<'a> {
    pub(crate) fn new(guard: &'a LockGuard, client: &'a zk::Client) -> FencedWriter<'a> {
        let mut writer = client.new_multi_writer();
        // Version -1: the check passes for any version, i.e. while the node exists. The path is
        // the one the server gave us, so it is valid.
        let _ = writer.add_check_version(guard.lock_path(), -1);
        FencedWriter { guard, writer }
    }

    /// Adds a data update of `path` (with `expected_version`, or any version with `None`).
    ///
    /// # Errors
    /// [`Error::ZooKeeper`] if `path` is not a valid ZooKeeper path (checked before sending).
    pub fn add_set_data(&mut self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<()> {
        self.writer.add_set_data(path, data, expected_version).map_err(|err| Error::zk("add set_data", path, err))
    }

    /// Adds a node creation.
    ///
    /// # Errors
    /// [`Error::ZooKeeper`] if `path` is not a valid ZooKeeper path (checked before sending).
    pub fn add_create(&mut self, path: &str, data: &[u8], options: &zk::CreateOptions<'_>) -> Result<()> {
        self.writer.add_create(path, data, options).map_err(|err| Error::zk("add create", path, err))
    }

    /// Adds a node deletion (with `expected_version`, or any version with `None`).
    ///
    /// # Errors
    /// [`Error::ZooKeeper`] if `path` is not a valid ZooKeeper path (checked before sending).
    pub fn add_delete(&mut self, path: &str, expected_version: Option<i32>) -> Result<()> {
        self.writer.add_delete(path, expected_version).map_err(|err| Error::zk("add delete", path, err))
    }

    /// Adds a check that `path` has data version `version`.
    ///
    /// # Errors
    /// [`Error::ZooKeeper`] if `path` is not a valid ZooKeeper path (checked before sending).
    pub fn add_check_version(&mut self, path: &str, version: i32) -> Result<()> {
        self.writer.add_check_version(path, version).map_err(|err| Error::zk("add check", path, err))
    }

    /// Commits the transaction. Returns the results of the operations you added (without the
    /// lock check), in order.
    ///
    /// Refused without sending anything if the guard already knows the lock is lost.
    ///
    /// # Errors
    /// [`FencedWriteError::LockLost`] if our lock node is gone (nothing was written),
    /// [`FencedWriteError::NoAuth`] if ACLs refused an operation, `OperationFailed` with the index
    /// of the first of your operations that failed (nothing was written), and `Request` when the
    /// outcome is unknown (the connection was lost before the reply).
    pub async fn commit(mut self) -> Result<Vec<zk::MultiWriteResult>, FencedWriteError> {
        if let LockState::Lost(_) = self.guard.state() {
            return Err(FencedWriteError::LockLost);
        }
        match self.writer.commit().await {
            Ok(mut results) => {
                if !results.is_empty() {
                    results.remove(0);
                }
                Ok(results)
            },
            Err(zk::MultiWriteError::OperationFailed { index: 0, source: zk::Error::NoAuth }) => {
                Err(FencedWriteError::NoAuth { index: None })
            },
            Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => Err(FencedWriteError::LockLost),
            Err(zk::MultiWriteError::OperationFailed { index, source: zk::Error::NoAuth }) => {
                Err(FencedWriteError::NoAuth { index: Some(index - 1) })
            },
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                Err(FencedWriteError::OperationFailed { index: index - 1, source })
            },
            Err(zk::MultiWriteError::RequestFailed { source: zk::Error::NoAuth }) => {
                Err(FencedWriteError::NoAuth { index: None })
            },
            Err(zk::MultiWriteError::RequestFailed { source }) if session_dead(&source) => {
                Err(FencedWriteError::LockLost)
            },
            Err(zk::MultiWriteError::RequestFailed { source }) => Err(FencedWriteError::Request { source }),
        }
    }
}
