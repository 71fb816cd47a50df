//! [`FencedWriter`]: ZooKeeper writes that only apply while we hold the lock.

use zookeeper_client as zk;

use crate::error::{session_dead, Error, FencedWriteError, Result};
use crate::hold::holds::Hold;
use crate::state::LockState;

/// A ZooKeeper `multi` transaction whose first operation checks that our lock node still exists,
/// so the writes are applied only if, at that point in the server's total order, we still hold
/// the lock. A holder whose session expired — even one that has not noticed yet, paused by GC or
/// a frozen VM — cannot write through it.
///
/// Made by [`LockGuard::fenced_writer`](crate::LockGuard::fenced_writer). Add operations, then [`commit`](Self::commit); all or
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
    hold: &'a Hold,
    writer: zk::MultiWriter<'a>,
    /// How many checks of lock nodes come before the operations added.
    checks: usize,
}

impl std::fmt::Debug for FencedWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedWriter").field("lock_node", &&*self.hold.node.path).finish_non_exhaustive()
    }
}

impl<'a> FencedWriter<'a> {
    pub(crate) fn new(hold: &'a Hold) -> FencedWriter<'a> {
        // Starts the watch on our node if nobody looked yet, as `LockGuard::state` does.
        hold.state();
        let mut writer = hold.context.client().new_multi_writer();
        let mut checks = 0;
        // Version -1: the check passes for any version, i.e. while the node exists. The paths are
        // the ones the server gave us, so they are valid. A downgraded read checks the write node
        // it rests on too.
        for node in hold.fence_nodes() {
            let _ = writer.add_check_version(node, -1);
            checks += 1;
        }
        FencedWriter { hold, writer, checks }
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
        if let LockState::Lost(_) = self.hold.state() {
            return Err(FencedWriteError::LockLost);
        }
        match self.writer.commit().await {
            Ok(mut results) => {
                results.drain(..self.checks.min(results.len()));
                Ok(results)
            },
            Err(zk::MultiWriteError::OperationFailed { index, source: zk::Error::NoAuth }) if index < self.checks => {
                Err(FencedWriteError::NoAuth { index: None })
            },
            Err(zk::MultiWriteError::OperationFailed { index, .. }) if index < self.checks => {
                Err(FencedWriteError::LockLost)
            },
            Err(zk::MultiWriteError::OperationFailed { index, source: zk::Error::NoAuth }) => {
                Err(FencedWriteError::NoAuth { index: Some(index - self.checks) })
            },
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                Err(FencedWriteError::OperationFailed { index: index - self.checks, source })
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
