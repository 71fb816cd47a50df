//! Review J: `Lost` is final (src/state.rs: "a lost guard never returns to `Held`"; holds.rs: "a
//! write hold lost before it ended leaves the read hold lost: `Lost` is final").
//!
//! A read downgraded from a write whose lease ran out (by the clock: the lease timer has not run,
//! the runtime busy) reads `Lost(LeaseExpired)` since review I. If the write hold is then
//! released by its guards before the timer runs, `Hold::state` reads the write's *feed* (released:
//! never told of the lease) and the read is `Held` again.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, InterProcessReadWriteLock, LockState};

/// Current-thread runtime: the lease timer cannot run while the holder's task does not yield.
#[tokio::test]
async fn a_downgraded_read_lost_to_its_writes_lease_stays_lost_once_the_write_is_released() {
    let path = unique_path("rj-downgrade-final");
    let lease = Duration::from_millis(600);
    let rw = InterProcessReadWriteLock::builder(client().await, &path).build().unwrap();
    let (read, write) = (rw.read_lock(), rw.write_lock());
    let (seen, read_guard) = write
        .with_lock(|write_guard| async move {
            write_guard.extend(lease).unwrap();
            // The downgraded read: no lease of its own.
            let read_guard = read.acquire().await.unwrap();
            // Busy past the write's lease (the timer cannot run: no yield from here on).
            std::thread::sleep(lease + Duration::from_millis(200));
            let seen = read_guard.state();
            drop(write_guard);
            (seen, read_guard)
        })
        .await
        .unwrap();
    // The write hold ended (its last guard went with `with_lock`), before its lease timer ran.
    let after = read_guard.state();
    let signal = read_guard.loss_signal();
    eprintln!(
        "downgraded read: {seen:?} before the write's release, {after:?} after; signal lost: {}",
        signal.is_lost()
    );
    assert!(matches!(seen, LockState::Lost(_)), "not lost with the write's lease run out: {seen:?}");
    assert!(matches!(after, LockState::Lost(_)), "the read read {seen:?}, then {after:?}: Lost is not final");
    drop(read_guard);
}

/// The same for a plain hold seen through its `LossSignal`: `is_lost` read `true` (the lease
/// ran out by the clock), then the guard is released before the timer runs.
#[tokio::test]
async fn a_loss_signal_that_read_lost_to_a_lease_stays_lost_after_the_release() {
    let path = unique_path("rj-signal-final");
    let lease = Duration::from_millis(600);
    let mutex = InterProcessMutex::builder(client().await, &path).lease(lease).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    let signal = guard.loss_signal();
    std::thread::sleep(lease + Duration::from_millis(200));
    let seen = signal.reason();
    drop(guard);
    let after = signal.reason();
    eprintln!("loss signal: {seen:?} before the release, {after:?} after (released: {})", signal.is_released());
    assert!(seen.is_some(), "not lost with the lease run out");
    assert!(after.is_some(), "the signal read lost ({seen:?}), then not lost ({after:?}) after the release");
}
