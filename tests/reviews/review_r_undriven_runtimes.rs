//! Review R: the session's background deletions (`session/cleanup.rs`, `Searches`, `Search`) and
//! runtimes that are alive but no longer driven. The change's promise: "an undriven remembered
//! current-thread runtime does not block `close`", and a parked deletion is never lost while
//! someone calls `close`.
//!
//! (Written against parked deletions; the cleanup now keeps every deletion in a registry until some
//! runner ends it, `session/cleanup.rs`, `Deletion`: a "parked" deletion reads as an orphaned one,
//! run by `searches_done` at once.)
//!
//! Setup shared by every test: the session's first recipe is built on a current-thread runtime `R`
//! that is then no longer driven (kept alive), so `R` is the runtime the session remembers.
//!
//! - `a_deletion_parked_by_a_shutdown_is_run_by_close` (passes, kept as a regression test): a guard
//!   dropped on a runtime `S` that shuts down before the deletion's task ran: the deletion is
//!   parked, its restart task on `R` never runs, and `close` from the test's runtime runs it.
//! - `a_guard_dropped_outside_any_runtime_blocks_close` (failed; fixed: `searches_done` runs a
//!   deletion stalled a second, `session/cleanup.rs`, `Deletion`): a mutex guard dropped on a
//!   thread with no runtime spawns its node's deletion on `R`, where it never runs. It is counted
//!   in `Searches.running` but never dropped (so never parked either): every latch `close` on the
//!   session waits for it for ever, although the node itself is gone (its delete was sent
//!   synchronously). The count tracks a task, not the node.
//! - `a_close_no_longer_polled_holds_a_parked_deletion_hostage` (failed; fixed the same way): a
//!   parked deletion is taken by the `searches_done` of a first latch's `close`, whose confirming
//!   task lives on a current-thread runtime `C` that then stops being driven (a `block_on` that
//!   gave up waiting). The deletion sits in that task's `FuturesUnordered`: neither parked nor
//!   ended. A second latch's `close` from the test's runtime finds nothing parked and the count
//!   above 0, and waits for ever — until `C` is driven again.
//!
//! Both hangs are a wait on `Notify` (no CPU spin: checked).

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LeaderLatch};
use zookeeper_client as zk;

/// A current-thread runtime that built the session's first recipe (the session remembers it),
/// returned not driven, with that recipe.
fn remember_an_undriven_runtime(session: &zk::Client) -> (tokio::runtime::Runtime, InterProcessMutex) {
    let remembering = session.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let first =
            runtime.block_on(async move { InterProcessMutex::new(remembering, unique_path("rr-first")) }).unwrap();
        (runtime, first)
    })
    .join()
    .unwrap()
}

/// CPU time (user + system) this process used so far, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Acquires `mutex` on a current-thread runtime of its own, drops the guard there (its node's
/// deletion is spawned on that runtime, its first delete sent) and shuts the runtime down before
/// the deletion's task is polled: the deletion is parked.
async fn park_a_deletion(mutex: &InterProcessMutex) {
    let mutex = mutex.clone();
    tokio::task::spawn_blocking(move || {
        let side = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        side.block_on(async {
            let guard = mutex.acquire().await.unwrap();
            drop(guard); // the deletion's task is spawned here, never polled
        });
        drop(side);
    })
    .await
    .unwrap();
}

/// Closes `latch` with a limit; `Err` if it did not return. Also the CPU ticks used meanwhile.
async fn close_within(latch: &LeaderLatch, limit: Duration) -> (Result<zk_recipes::Result<()>, ()>, u64) {
    let before = cpu_ticks();
    let result = tokio::time::timeout(limit, latch.close()).await.map_err(drop);
    (result, cpu_ticks() - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_parked_by_a_shutdown_is_run_by_close() {
    let observer = client().await;
    let session = client().await;
    let (idle, first) = remember_an_undriven_runtime(&session);
    for round in 0..10 {
        let path = unique_path("rr-parked");
        let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
        park_a_deletion(&mutex).await;
        let latch = LeaderLatch::new(session.clone(), unique_path("rr-parked-latch")).unwrap();
        let (result, _) = close_within(&latch, Duration::from_secs(10)).await;
        result.unwrap_or_else(|()| panic!("round {round}: close did not return with a deletion parked")).unwrap();
        assert!(children(&observer, &path).await.is_empty(), "round {round}: node left");
    }
    assert!(!session.state().is_terminated());
    drop(first);
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_any_runtime_blocks_close() {
    let observer = client().await;
    let session = client().await;
    let (idle, first) = remember_an_undriven_runtime(&session);
    let path = unique_path("rr-outside");
    let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    // Dropped on a thread with no runtime: the deletion goes to the remembered runtime.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    eventually(Duration::from_secs(5), "the released node is deleted", || async {
        children(&observer, &path).await.is_empty()
    })
    .await;
    let latch = LeaderLatch::new(session.clone(), unique_path("rr-outside-latch")).unwrap();
    let (result, ticks) = close_within(&latch, Duration::from_secs(10)).await;
    let hung = result.is_err();
    drop(first);
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
    assert!(
        !hung,
        "a latch's close did not return within 10 s ({ticks} CPU ticks meanwhile): a guard \
         dropped outside any runtime spawned its node's deletion on the session's remembered \
         runtime, which is not driven; the deletion stays counted in `Searches.running` (never \
         dropped, so never parked) and `searches_done` waits for it for ever, though the node is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_no_longer_polled_holds_a_parked_deletion_hostage() {
    let session = client().await;
    let (idle, first) = remember_an_undriven_runtime(&session);
    let mutex = InterProcessMutex::new(session.clone(), unique_path("rr-hostage")).unwrap();
    park_a_deletion(&mutex).await;
    // A first close, on a current-thread runtime driven only briefly: its confirming task (spawned
    // on that runtime) reaches `searches_done` and takes the parked deletion.
    let first_latch = LeaderLatch::new(session.clone(), unique_path("rr-hostage-a")).unwrap();
    let closer = {
        let latch = first_latch.clone();
        tokio::task::spawn_blocking(move || {
            let closer = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            closer.block_on(async {
                tokio::select! {
                    biased;
                    _ = latch.close() => panic!("the first close ended at once (the test needs it pending)"),
                    () = async { for _ in 0..3 { tokio::task::yield_now().await } } => {},
                }
            });
            closer // alive, no longer driven
        })
        .await
        .unwrap()
    };
    let second_latch = LeaderLatch::new(session.clone(), unique_path("rr-hostage-b")).unwrap();
    let (result, ticks) = close_within(&second_latch, Duration::from_secs(10)).await;
    let hung = result.is_err();
    // Driving the first closer's runtime again frees the deletion: the second close returns.
    let freed = tokio::task::spawn_blocking(move || {
        closer.block_on(tokio::time::sleep(Duration::from_millis(500)));
        closer
    });
    let (after, _) = close_within(&second_latch, Duration::from_secs(10)).await;
    let closer = freed.await.unwrap();
    drop(first);
    tokio::task::spawn_blocking(move || {
        drop(closer);
        drop(idle)
    })
    .await
    .unwrap();
    assert!(
        !hung,
        "a latch's close did not return within 10 s ({ticks} CPU ticks meanwhile; once the \
         first closer's runtime was driven again it returned: {}): the parked deletion was taken by \
         the `searches_done` of another latch's close whose runtime is no longer driven, and sits in \
         its `FuturesUnordered`, neither parked nor ended",
        after.is_ok()
    );
}
