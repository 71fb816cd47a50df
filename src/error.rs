//! The crate's error type.

use zookeeper_client as zk;

use crate::state::LossReason;

/// Result alias used throughout `zk_recipes`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a recipe.
///
/// Messages name the path involved and, where there is one, what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock path is not a valid ZooKeeper path.
    #[error("invalid lock path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The client's chroot does not exist on the server, so nothing can be created below it.
    #[error("cannot create {path:?}: the client's chroot does not exist on the server; create the chroot node first")]
    ChrootMissing {
        /// The lock path (relative to the chroot).
        path: String,
    },

    /// The lock path, or one of its ancestors, is an ephemeral node, which cannot have children.
    #[error("cannot create lock nodes below {path:?}: it or one of its ancestors is an ephemeral node (ephemeral nodes cannot have children); use a path below persistent or container nodes")]
    EphemeralParent {
        /// The lock path.
        path: String,
    },

    /// The server refused an operation because of ACLs.
    #[error("not authorized to {op} {path:?}: check the ACLs of the lock path and its parents and the client's auth")]
    NoAuth {
        /// The operation that was refused.
        op: &'static str,
        /// The path it was refused on.
        path: String,
    },

    /// The ZooKeeper session has expired (or the client failed authentication or was closed).
    ///
    /// A plain `zookeeper_client::Client` never recovers from this: every ephemeral node of the
    /// session, including any lock node, is gone. Create a new `Client` and a new
    /// `InterProcessMutex`, or use a [`ManagedClient`](crate::ManagedClient), whose recipes see
    /// this only from `try_acquire` while a new session is being established, or once it gave up
    /// ([`ConnectionState::AuthFailed`](crate::ConnectionState::AuthFailed)).
    #[error("ZooKeeper session is no longer usable ({state}) while working on {path:?}: its lock nodes are gone; a ManagedClient establishes a new session by itself, a plain client cannot: create a new zookeeper_client::Client and a new InterProcessMutex (or use a ManagedClient)")]
    SessionLost {
        /// The lock path.
        path: String,
        /// The terminal session state or error that was seen.
        state: String,
    },

    /// The [`ManagedClient`](crate::ManagedClient) was closed
    /// ([`close`](crate::ManagedClient::close)): it acquires nothing any more.
    #[error("cannot acquire {path:?}: the ManagedClient was closed; connect a new one")]
    Closed {
        /// The lock path.
        path: String,
    },

    /// A re-entrant acquire found the current task's hold of the lock lost. Release (or drop) the
    /// task's guards of the lost hold first; the next acquire then queues afresh.
    #[error("the current task's hold of {path:?} was lost ({reason}); release its guards before acquiring again")]
    LockLost {
        /// The lock path.
        path: String,
        /// Why the hold was lost.
        reason: LossReason,
    },

    /// Our own lock node was deleted by someone else while we were waiting for the lock, too many
    /// times in a row to keep trying.
    #[error("our lock node below {path:?} keeps being deleted by another client while we wait; giving up")]
    LockNodeDeleted {
        /// The lock path.
        path: String,
    },

    /// A request would exceed the server's request size limit (`jute.maxbuffer`, 1 MiB by
    /// default), which makes the server drop the connection rather than answer.
    #[error("{what} of {size} bytes makes a request over the server's limit of {limit} bytes (jute.maxbuffer); store less, or set MutexBuilder::max_request_bytes to the server's real limit")]
    TooLarge {
        /// What is too large (`"node data"`, `"lock path"`).
        what: &'static str,
        /// Its size in bytes (a lock path's with the client's chroot, which the server receives
        /// in front of it).
        size: usize,
        /// The request size limit in force.
        limit: usize,
    },

    /// The current async runtime cannot run the lock's session monitor.
    #[error("cannot run zk-recipes here: {reason}")]
    Runtime {
        /// What is missing.
        reason: &'static str,
    },

    /// No ZooKeeper session could be established with the ensemble (a [`ManagedClient`]'s first
    /// connect).
    ///
    /// [`ManagedClient`]: crate::ManagedClient
    #[error("cannot connect to ZooKeeper at {hosts:?}: {reason}")]
    Connect {
        /// The connect string.
        hosts: String,
        /// What went wrong: the last attempt's error and, when no server could be reached, why
        /// (name resolution failed, connection refused, timed out).
        reason: String,
        /// The underlying cause, when it is a network error (also in `reason`).
        #[source]
        source: Option<std::sync::Arc<std::io::Error>>,
    },

    /// A write fenced by a lock failed ([`FencedWriter::commit`](crate::FencedWriter::commit)), so
    /// `?` works on it in a function returning [`Result`].
    #[error(transparent)]
    FencedWrite(#[from] FencedWriteError),

    /// A write lock was acquired inside a lock scope of the read lock of the same
    /// [`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock): a read hold cannot be
    /// upgraded (two readers upgrading would wait for each other for ever). Nothing was queued.
    #[error("cannot acquire the write lock of {path:?} inside a read scope of it: a read lock cannot be upgraded; release the read lock first")]
    Upgrade {
        /// The lock path.
        path: String,
    },

    /// A read lock was acquired, outside a lock scope of the write lock, by the task (or, outside
    /// any task, the thread) that acquired a write hold of the same
    /// [`InterProcessReadWriteLock`](crate::InterProcessReadWriteLock) (or a clone) whose guards
    /// are not all released. Queued, it would wait for its own write node for ever; downgrade
    /// inside [`with_lock`](crate::InterProcessMutex::with_lock) of the write lock instead, or
    /// release the write guards first. Nothing was queued.
    #[error("cannot acquire the read lock of {path:?} while the current task holds its write lock outside a write scope: it would wait for its own write node; downgrade inside `write_lock().with_lock(..)`, or release the write lock first")]
    UnscopedDowngrade {
        /// The lock path.
        path: String,
    },

    /// The server named this acquire's lock node at or past the end of the lock directory's
    /// 32-bit child counter (2147483647, repeated by ZooKeeper 3.6+ once reached, or a negative
    /// number): after 2³¹ creates under one path, queue order is no longer arrival order (a new
    /// node may sort ahead of the holder), so the node was deleted and nothing is held; holds
    /// granted before are unaffected. If the directory is a container node (this crate and
    /// Curator create missing levels so; kazoo and hand-made directories are persistent), the
    /// server deletes it once it is empty (every `znode.container.checkIntervalMs`, 60 s by
    /// default; on ZooKeeper 3.6+, whose counter never goes negative when stored) and the next
    /// acquire creates it again with a fresh counter. Otherwise delete the empty directory
    /// yourself, or use another lock path. See the README's *Limits*.
    #[error("the lock node created under {path:?} was named {name:?}: the directory's sequence counter is used up (2^31 children created), so queue order is no longer arrival order; the node was deleted and nothing is held. Once the directory is empty the server deletes it if it is a container node, and the next acquire starts a fresh counter; otherwise (or to recover at once) delete the empty directory")]
    SequenceWrapped {
        /// The lock path.
        path: String,
        /// The node's name, with its negative sequence number.
        name: String,
    },

    /// A [`LeaderLatch`](crate::LeaderLatch) was asked to acquire leadership while it already
    /// leads: the acquire would queue behind its own node and wait for itself. Nothing was
    /// queued.
    #[error("the LeaderLatch on {path:?} already leads: acquiring again would wait behind its own node; use the leadership it holds (LeaderLatch::await_leadership on a started latch)")]
    AlreadyLeading {
        /// The election path.
        path: String,
    },

    /// A [`LeaderLatch`](crate::LeaderLatch) was used in a way its lifecycle (`start` once, then
    /// `close` once, as Curator's `LeaderLatch`) does not allow: started twice, awaited before
    /// `start` or after `close`, or a one-shot acquire on a started latch. Nothing was sent.
    #[error("LeaderLatch on {path:?}: {reason}")]
    LatchState {
        /// The election path.
        path: String,
        /// What the latch's state does not allow.
        reason: &'static str,
    },

    /// An argument a recipe cannot work with: a semaphore of no leases, an acquire of more leases
    /// than the semaphore has (it would wait for ever), node data on a revocable lock (the data
    /// carries the revocation request). Nothing was sent.
    #[error("invalid argument for {path:?}: {reason}")]
    InvalidArgument {
        /// The lock path.
        path: String,
        /// What is wrong with the argument.
        reason: String,
    },

    /// An [`InterProcessMultiLock`](crate::InterProcessMultiLock) acquire failed: every failure,
    /// in the order they happened — the acquire that failed first, then any release of a lock it
    /// had already taken that failed (those locks were released in reverse order of acquisition;
    /// a failed release still ends in the background, as a dropped guard's).
    #[error("multi-lock acquire failed: {}", describe_failures(.failures))]
    MultiLock {
        /// Each failure with the lock path it happened on.
        failures: Vec<(String, Error)>,
    },

    /// Any other error reported by ZooKeeper.
    #[error("ZooKeeper {op} on {path:?} failed: {source}")]
    ZooKeeper {
        /// The operation that failed.
        op: &'static str,
        /// The path it failed on.
        path: String,
        /// What the client library reported.
        #[source]
        source: zk::Error,
    },
}

impl Error {
    /// Maps a `zookeeper_client` error on `path` into a recipe error with context.
    pub(crate) fn zk(op: &'static str, path: &str, source: zk::Error) -> Error {
        match source {
            zk::Error::NoAuth => Error::NoAuth { op, path: path.to_owned() },
            zk::Error::NoChildrenForEphemerals => Error::EphemeralParent { path: path.to_owned() },
            zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed => {
                Error::SessionLost { path: path.to_owned(), state: source.to_string() }
            },
            source => Error::ZooKeeper { op, path: path.to_owned(), source },
        }
    }
}

/// Whether the outcome of a request that failed with `err` is unknown: it may or may not have
/// been applied by the server (the connection broke or stalled before the reply arrived).
///
/// `zookeeper-client` 0.11 reports a stalled connection as `Error::Custom("no response ...")`.
pub(crate) fn outcome_unknown(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_))
}

/// Whether a request that failed with `err` may simply be sent again: its outcome is unknown, or
/// the server refused it for load (`Throttled`, not applied).
pub(crate) fn transient(err: &zk::Error) -> bool {
    outcome_unknown(err) || matches!(err, zk::Error::Throttled)
}

/// Whether `err` means the session is dead for good (its ephemeral nodes are or will be gone).
pub(crate) fn session_dead(err: &zk::Error) -> bool {
    matches!(err, zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed)
}

/// Why a [`FencedWriter::commit`](crate::FencedWriter::commit) failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FencedWriteError {
    /// Nothing was written: our lock node is gone (the session expired, or someone deleted it),
    /// the session is dead, or this process already knows the lock is lost
    /// ([`LockGuard::state`](crate::LockGuard::state) is `Lost`).
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

/// `path: error; path: error` for [`Error::MultiLock`].
fn describe_failures(failures: &[(String, Error)]) -> String {
    failures.iter().map(|(path, err)| format!("{path:?}: {err}")).collect::<Vec<_>>().join("; ")
}
