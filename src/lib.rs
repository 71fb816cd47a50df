//! ZooKeeper coordination recipes for Rust, starting with a Curator-compatible
//! [`InterProcessMutex`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = zookeeper_client::Client::connect("127.0.0.1:2181").await?;
//! let mutex = zk_recipes::InterProcessMutex::new(client, "/locks/orders")?;
//! let guard = mutex.acquire().await?;
//! // ... only one process in the world runs this at a time ...
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees, in short
//!
//! - **Mutual exclusion and fairness** among every client of the lock path (Curator's
//!   `InterProcessMutex` included), grants in queue order, while sessions are alive.
//! - **No leaked nodes**: every acquire method is cancel safe; abandoned nodes are deleted in the
//!   background until gone or the session is dead, and only if they belong to our session.
//! - **The holder is told, before anyone else is granted**: [`LockGuard::state`] and
//!   [`LockGuard::lost`] report a lost lock (session expired, connection lost or stalled under
//!   [`LossPolicy::Suspended`], the session's loss deadline passed — which happens before the
//!   ZooKeeper leader can expire the session, also when our server is cut off from the leader —,
//!   node deleted by someone else); `Lost` is final.
//! - **Re-entry cannot break exclusion**: it happens only inside
//!   [`InterProcessMutex::with_lock`] scopes; every other acquire queues.
//! - **Fencing**: [`LockGuard::fencing_token`] increases with every holder, and
//!   [`LockGuard::fenced_writer`] writes to ZooKeeper only while our lock node exists.
//!
//! What no lock can guarantee: a holder paused (GC, a frozen VM) for longer than the session
//! timeout wakes up believing it holds the lock, after the server gave it to someone else. Only the
//! guarded resource can stop its late writes — through [`FencedWriter`] for ZooKeeper data, or by
//! rejecting fencing tokens lower than the highest it has seen.
//!
//! See the README for the details, the timing of loss detection, and limits.
#![warn(missing_docs)]

mod cleanup;
mod driver;
mod engine;
mod error;
mod fenced;
mod guard;
mod listing;
mod mutex;
mod naming;
mod path;
mod session;
mod state;
mod view;

pub use error::{Error, Result};
pub use fenced::{FencedWriteError, FencedWriter};
pub use guard::{FencingToken, LockGuard};
pub use mutex::{InterProcessMutex, MutexBuilder, Participant, DEFAULT_MAX_REQUEST_BYTES};
pub use state::{LockState, LossPolicy, LossReason};

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
