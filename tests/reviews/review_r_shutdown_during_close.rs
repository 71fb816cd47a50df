//! Review R: parked deletions (`session/cleanup.rs`, `Search`) and runtimes shut down while a
//! `close` runs them, and marked deletes (lock-delay) parked.
//!
//! (Written against parked deletions; the cleanup now keeps every deletion in a registry until some
//! runner ends it, `session/cleanup.rs`, `Deletion`: a "parked" deletion reads as an orphaned one,
//! run by `searches_done` at once.)
//!
//! - `a_close_whose_runtime_shuts_down_mid_wait_parks_its_deletion_again` (passes, kept): a latch's
//!   close, on a current-thread runtime shut down while its `searches_done` runs a parked deletion:
//!   nothing panics, the deletion is parked again, and another latch's close from the test's
//!   runtime ends it. (The first latch's close then reports that its close was stopped.)
//! - `the_remembered_runtime_shut_down_inside_close_parks_again_without_panic` (passes, kept): the
//!   same with the runtime shut down being the one the session remembers (the re-park spawns onto
//!   the dying runtime from a `Drop` during its own shutdown), current-thread and multi-thread.
//! - `a_parked_marked_delete_is_run_plainly_by_close` (passes, kept): a lock-delay mutex's clean
//!   release (`Target::Released`, sent only by its task) dropped unrun by a shutdown: the node
//!   stays (the lock is still taken) until a `close` runs the parked deletion.
//! - `a_lock_delay_guard_dropped_outside_any_runtime_never_releases` (failed: a defect older than
//!   the change; fixed: such a release's `multi` is sent by a first poll at the drop, and a latch
//!   `close` runs a deletion stalled on a runtime nobody drives): with the remembered runtime not
//!   driven, a lock-delay guard dropped on a thread with no runtime spawns its marked delete there;
//!   nothing is sent, the node stays while the session lives (another session never gets the lock),
//!   and the count keeps `close` waiting.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LeaderLatch};
use zookeeper_client as zk;

/// Builds the session's first recipe on `runtime` (the session remembers it); returns both.
async fn remember_runtime(
    session: &zk::Client,
    runtime: tokio::runtime::Runtime,
) -> (tokio::runtime::Runtime, InterProcessMutex) {
    let remembering = session.clone();
    tokio::task::spawn_blocking(move || {
        let first =
            runtime.block_on(async move { InterProcessMutex::new(remembering, unique_path("rr-first")) }).unwrap();
        (runtime, first)
    })
    .await
    .unwrap()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Acquires `mutex` on a current-thread runtime of its own, drops the guard there (its node's
/// deletion is spawned on that runtime) and shuts it down before the deletion's task is polled.
async fn park_a_deletion(mutex: &InterProcessMutex) -> String {
    let mutex = mutex.clone();
    tokio::task::spawn_blocking(move || {
        let side = current_thread();
        let node = side.block_on(async {
            let guard = mutex.acquire().await.unwrap();
            let node = guard.lock_path().to_owned();
            drop(guard);
            node
        });
        drop(side);
        node
    })
    .await
    .unwrap()
}

/// Runs `latch.close()` on `closer` (on a thread of the blocking pool) just long enough for its
/// confirming task to start its wait, then shuts `closer` down. Panics if the shutdown did.
async fn close_then_shut_down(latch: &LeaderLatch, closer: tokio::runtime::Runtime) {
    let latch = latch.clone();
    tokio::task::spawn_blocking(move || {
        closer.block_on(async {
            tokio::select! {
                biased;
                _ = latch.close() => {},
                () = async { for _ in 0..3 { tokio::task::yield_now().await } } => {},
            }
        });
        drop(closer);
    })
    .await
    .expect("shutting the closer's runtime down panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_whose_runtime_shuts_down_mid_wait_parks_its_deletion_again() {
    let observer = client().await;
    let session = client().await;
    let (idle, first) = remember_runtime(&session, current_thread()).await;
    for round in 0..10 {
        let path = unique_path("rr-remid");
        let mutex =
            InterProcessMutex::builder(session.clone(), &path).lock_delay(Duration::from_secs(1)).build().unwrap();
        park_a_deletion(&mutex).await;
        let latch = LeaderLatch::new(session.clone(), unique_path("rr-remid-a")).unwrap();
        close_then_shut_down(&latch, tokio::task::spawn_blocking(current_thread).await.unwrap()).await;
        let again = tokio::time::timeout(Duration::from_secs(10), latch.close())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the first latch's close hangs"));
        eprintln!("round {round}: the first latch's close again: {again:?}");
        let other = LeaderLatch::new(session.clone(), unique_path("rr-remid-b")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), other.close())
            .await
            .unwrap_or_else(|_| panic!("round {round}: close with the deletion parked again hangs"))
            .unwrap();
        assert!(children(&observer, &path).await.is_empty(), "round {round}: the node is left");
    }
    assert!(!session.state().is_terminated());
    drop(first);
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remembered_runtime_shut_down_inside_close_parks_again_without_panic() {
    let observer = client().await;
    for round in 0..10 {
        let session = client().await;
        let remembered = tokio::task::spawn_blocking(move || {
            if round % 2 == 0 {
                current_thread()
            } else {
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
            }
        })
        .await
        .unwrap();
        let (remembered, first) = remember_runtime(&session, remembered).await;
        let path = unique_path("rr-rem-dying");
        let mutex =
            InterProcessMutex::builder(session.clone(), &path).lock_delay(Duration::from_secs(1)).build().unwrap();
        park_a_deletion(&mutex).await;
        let latch = LeaderLatch::new(session.clone(), unique_path("rr-rem-dying-a")).unwrap();
        close_then_shut_down(&latch, remembered).await;
        let other = LeaderLatch::new(session.clone(), unique_path("rr-rem-dying-b")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), other.close())
            .await
            .unwrap_or_else(|_| panic!("round {round}: close hangs"))
            .unwrap();
        assert!(children(&observer, &path).await.is_empty(), "round {round}: the node is left");
        assert!(!session.state().is_terminated());
        drop(first);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_marked_delete_is_run_plainly_by_close() {
    let observer = client().await;
    let session = client().await;
    let (idle, first) = remember_runtime(&session, current_thread()).await;
    let path = unique_path("rr-marked");
    let mutex = InterProcessMutex::builder(session.clone(), &path).lock_delay(Duration::from_secs(1)).build().unwrap();
    let node = park_a_deletion(&mutex).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = children(&observer, &path).await;
    assert_eq!(left.len(), 1, "the parked marked delete was never sent, so its node stays: {left:?} ({node})");
    let latch = LeaderLatch::new(session.clone(), unique_path("rr-marked-latch")).unwrap();
    tokio::time::timeout(Duration::from_secs(10), latch.close()).await.expect("close hangs").unwrap();
    assert!(children(&observer, &path).await.is_empty(), "close returned with the node left");
    drop(first);
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_guard_dropped_outside_any_runtime_never_releases() {
    let observer = client().await;
    let session = client().await;
    let (idle, first) = remember_runtime(&session, current_thread()).await;
    let path = unique_path("rr-outside-marked");
    let mutex = InterProcessMutex::builder(session.clone(), &path).lock_delay(Duration::from_secs(1)).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let other = client().await;
    let contender =
        InterProcessMutex::builder(other.clone(), &path).lock_delay(Duration::from_secs(1)).build().unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(8), contender.acquire()).await;
    let left = children(&observer, &path).await;
    let latch = LeaderLatch::new(session.clone(), unique_path("rr-outside-marked-latch")).unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), latch.close()).await;
    drop(first);
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
    assert!(
        granted.is_ok() && closed.is_ok(),
        "a lock-delay guard released (dropped) on a thread with no runtime, the session's \
         remembered runtime not driven: another session granted within 8 s: {}; latch close \
         returned within 5 s: {}; nodes left while the session lives: {left:?}. The marked delete \
         was spawned on the undriven runtime and never sent, nor parked (its task is never dropped)",
        granted.is_ok(),
        closed.is_ok()
    );
}
