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
//! See the README for guarantees, limits and how the recipe works.
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
mod state;
mod view;

pub use error::{Error, Result};
pub use fenced::{FencedWriteError, FencedWriter};
pub use guard::{FencingToken, LockGuard};
pub use mutex::{InterProcessMutex, MutexBuilder, Participant};
pub use state::{LockState, LossPolicy, LossReason};

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
