// The user guide (README.md) is the crate's front page, so docs.rs shows it; its examples are
// compiled as doc-tests.
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod acl;
mod cleanup;
mod client;
mod clock;
mod driver;
mod engine;
mod error;
mod fenced;
mod guard;
mod listing;
mod metrics;
mod mutex;
mod naming;
mod path;
mod session;
mod state;
mod view;

pub use acl::AclList;
pub use client::{
    ConnectionState, ConnectionStateWatcher, ManagedClient, ManagedClientBuilder, RecipeClient, DEFAULT_CONNECT_TIMEOUT,
};
pub use error::{Error, Result};
pub use fenced::{FencedWriteError, FencedWriter};
pub use guard::{FencingToken, LockGuard, LossSignal};
pub use mutex::{InterProcessMutex, MutexBuilder, Participant, DEFAULT_MAX_REQUEST_BYTES};
pub use path::validate_lock_path;
pub use state::{LockState, LossPolicy, LossReason};
/// The ZooKeeper client library this crate is built on (`zookeeper-client` 0.11, feature `tokio`),
/// re-exported so applications use the very version recipes take.
pub use zookeeper_client;
