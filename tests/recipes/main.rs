//! The recipes' own tests against a real ZooKeeper: each module was its own test binary (the
//! mutex, the read/write lock, leader election, the semaphores and the rest of the lock family,
//! lock-delay, hold leases, `ManagedClient`, ACLs, `close()`). One binary for all of them:
//! compiling and linking each on its own was most of CI's test build (the reviews' reproductions
//! were merged the same way, `tests/reviews/`).
//!
//! Kept apart, in binaries of their own: tests that set the process's global tracing subscriber
//! or capture its logs (`input`, `secrets`), count its heap (`drain`, `review_k_leak`), measure a
//! server's request counts (`shared_listing`), or run for long (`soak`, `busy_session`,
//! `session`), and the 3-server ensembles (`tests/ensembles/`) and peer interop
//! (`tests/interop/`).
//!
//! Tests here run beside tests of other modules (two at a time): none may assume it is alone in
//! the process or on the shared server (each uses paths of its own, `common::unique_path`).

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod close;
mod connect;
mod family_contract;
mod hold_lease;
mod leader;
mod lock_delay;
mod lock_family;
mod loss_signal;
mod managed;
mod mutex;
mod new_path;
mod reentry;
mod rw_lock;
mod semaphore;
mod sequence_wrap;
