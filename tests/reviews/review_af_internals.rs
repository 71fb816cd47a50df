//! Review AF (`f59f576`: `LockInternals` keeps its durations in 8 bytes (`Span8`: whole
//! nanoseconds, `u64::MAX` for none, capped at `u64::MAX - 1` ns), its directory and data boxed;
//! a read/write lock's entry rules are inline functions of the other kind's holds). Attacks:
//! - extreme durations: `Duration::MAX` lease, min session timeout and lock-delay; a zero lease;
//!   a 1 ns lock-delay (nanosecond precision kept);
//! - the downgrade, upgrade and unscoped-downgrade rules, and the path their errors name.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{Error, InterProcessMutex, InterProcessReadWriteLock, LockState, LossReason};

/// `Duration::MAX` lease and session timeout floor: built, granted, `Held`, released cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_duration_max_lease_and_floor_hold_and_release() {
    let path = unique_path("raf-span-max");
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path)
        .lease(Duration::MAX)
        .min_session_timeout(Duration::MAX)
        .build()
        .unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await.unwrap().unwrap();
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.certain_for().is_some());
    guard.extend(Duration::MAX).unwrap();
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
    let guard = lock.acquire_with_lease(Duration::MAX).await.unwrap();
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours], Duration::from_secs(10)).await;
}

/// A zero lease: the acquire fails `LockLost(LeaseExpired)` (the lease ran out at the grant), its
/// node goes, and the lock goes to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_zero_lease_is_lost_at_once_and_frees_the_lock() {
    let path = unique_path("raf-span-zero");
    let ours = client().await;
    let theirs = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lease(Duration::ZERO).build().unwrap();
    match lock.acquire().await {
        Err(Error::LockLost { reason: LossReason::LeaseExpired, path: named }) => assert_eq!(named, path),
        other => panic!("{other:?}"),
    }
    let next = InterProcessMutex::new(theirs.clone(), &path).unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), next.acquire()).await.unwrap().unwrap();
    granted.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours, theirs], Duration::from_secs(10)).await;
}

/// `Duration::MAX` lock-delay on a new path ("the first acquire on a new path waits the delay
/// once"): a bounded acquire gives up without panicking (`now + delay`) and leaves no node; a 1 ns
/// delay is a delay (nanoseconds kept), granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_extreme_lock_delays() {
    let path = unique_path("raf-delay-max");
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lock_delay(Duration::MAX).build().unwrap();
    let timed = lock.acquire_timeout(Duration::from_millis(500)).await;
    assert!(matches!(timed, Ok(None)), "{timed:?}");
    assert_no_nodes_left_while_open(&client().await, &path, std::slice::from_ref(&ours), Duration::from_secs(10)).await;

    let path = unique_path("raf-delay-ns");
    let lock = InterProcessMutex::builder(ours.clone(), &path).lock_delay(Duration::from_nanos(1)).build().unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await.unwrap().unwrap();
    guard.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), lock.acquire()).await.unwrap().unwrap();
    guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours], Duration::from_secs(10)).await;
}

/// Not from these commits (the lock-delay's give-up rule, `delay.rs`): on a new path, "the first
/// acquire waits the delay once" and "`try_acquire` finds the lock unavailable while the delay
/// runs". A refused `try_acquire` gives its node up with mark 0 on the directory it just created,
/// which vouches for the directory: the next acquire, a moment later, is granted at once — the
/// delay a missing directory stands for (a container reaped after an unclean loss) is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_a_refused_try_acquire_erases_a_new_paths_delay() {
    let path = unique_path("raf-delay-tried");
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lock_delay(Duration::from_secs(20)).build().unwrap();
    let tried = lock.try_acquire().await;
    assert!(matches!(tried, Ok(None)), "{tried:?}");
    let again = lock.try_acquire().await;
    let granted_again = matches!(again, Ok(Some(_)));
    drop(again);
    assert!(!granted_again, "a try_acquire 0 s into a new path's 20 s lock-delay was granted");
    assert_no_nodes_left_while_open(&client().await, &path, &[ours], Duration::from_secs(10)).await;
}

/// The entry rules, as inline functions: a downgrade inside a write scope is granted at once
/// beside the write node; the writer's unscoped read and a write inside a read scope are refused
/// at once, each naming the lock path; someone else's read queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_entry_rules_and_their_paths() {
    let path = unique_path("raf-rules");
    let ours = client().await;
    let theirs = client().await;
    let rw = InterProcessReadWriteLock::new(ours.clone(), &path).unwrap();
    let (read, write) = (rw.read_lock(), rw.write_lock());
    drop(rw);
    let read2 = read.clone();
    let downgraded = write
        .with_lock(|_write| async move {
            tokio::time::timeout(Duration::from_secs(5), read2.acquire()).await.expect("at once")
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(downgraded.state(), LockState::Held);
    drop(downgraded);

    let write_guard = write.acquire().await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), read.acquire()).await.expect("at once") {
        Err(Error::UnscopedDowngrade { path: named }) => assert_eq!(named, path),
        other => panic!("{other:?}"),
    }
    // Someone else's read (another session's lock) queues behind the write.
    let their_read = InterProcessReadWriteLock::new(theirs.clone(), &path).unwrap().read_lock();
    assert!(matches!(their_read.try_acquire().await, Ok(None)));
    write_guard.release().await.unwrap();

    let write2 = write.clone();
    let refused = read
        .with_lock(|_read| async move {
            tokio::time::timeout(Duration::from_secs(5), write2.acquire()).await.expect("at once")
        })
        .await
        .unwrap();
    match refused {
        Err(Error::Upgrade { path: named }) => assert_eq!(named, path),
        other => panic!("{other:?}"),
    }
    assert_no_nodes_left_while_open(&client().await, &path, &[ours, theirs], Duration::from_secs(10)).await;
}
