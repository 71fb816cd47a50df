// The user guide (README.md) is the crate's front page, so docs.rs shows it; its examples are
// compiled as doc-tests.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

// The layers, top to bottom; each module imports only from its own layer and those below it.
mod engine; // the acquire loop (Curator's LockInternals), drivers, the directory view, naming
mod hold; // LockGuard, FencedWriter, lock scopes: shared by every recipe
mod recipes; // InterProcessMutex, InterProcessReadWriteLock, LeaderLatch, LeaderSelector: a driver and a thin API each
mod session; // clients, session monitor, watches, cleanup
             // At the bottom, used by every layer.
mod error;
mod metrics;
mod state;
mod sync;

pub use engine::path::validate_lock_path;
pub use error::{Error, FencedWriteError, Result};
pub use hold::fenced::FencedWriter;
pub use hold::guard::{FencingToken, LockGuard, LossSignal};
pub use recipes::builder::{LockBuilder, DEFAULT_MAX_REQUEST_BYTES};
pub use recipes::leader::{
    LatchEvent, LatchEvents, LeaderLatch, LeaderLatchBuilder, LeaderSelector, LeaderSelectorBuilder,
};
pub use recipes::multi_lock::{HeldLock, InterProcessMultiLock, MultiLockGuard, MultiLockMember};
pub use recipes::mutex::{InterProcessMutex, MutexBuilder, Participant};
pub use recipes::revoker::Revoker;
pub use recipes::rw_lock::{InterProcessReadWriteLock, ReadWriteLockBuilder};
pub use recipes::semaphore::{
    InterProcessSemaphoreMutex, InterProcessSemaphoreV2, Lease, SemaphoreBuilder, SemaphoreMutexBuilder,
};
pub use session::acl::AclList;
pub use session::client::{
    ConnectionState, ConnectionStateWatcher, ManagedClient, ManagedClientBuilder, RecipeClient, DEFAULT_CONNECT_TIMEOUT,
};
pub use state::{LockState, LossPolicy, LossReason};
/// The ZooKeeper client library this crate is built on (`zookeeper-client` 0.11, feature `tokio`),
/// re-exported so applications use the very version recipes take.
pub use zookeeper_client;
