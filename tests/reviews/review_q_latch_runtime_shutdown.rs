//! Review Q (`92da35d`: the first grant spawns the latch's serving task with `tokio::spawn`, under
//! the latch state's std mutex). The runtime a latch was started on is shut down while the
//! client's session lives on another runtime.
//!
//! - Kept (passes): shut down at swept moments just after the first grant (the serving task spawned
//!   or about to be, maybe never polled): the shutdown neither panics nor hangs, and afterwards
//!   `close` from the other runtime returns `Ok` with the node gone (session open), or the drop of
//!   the latch leaves nothing soon after.
//! - Shut down while the latch's create is in flight (swept across it): `close` from the other
//!   runtime returns `Ok` only with the node gone. It failed before the fix (a defect older than
//!   `92da35d`, found by review Q): the dropped attempt's delete by GUID was spawned on the
//!   runtime that was shutting down, which dropped it unrun, and `close` did not wait for it. A
//!   deletion is now counted until some runner ends it, and one dropped unfinished starts again
//!   on the session's remembered runtime and in `close` (`session/cleanup.rs`, `Deletion`).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::LeaderLatch;

/// Starts `latch` on a runtime of its own on another thread, waits there for `ready`, then spins
/// `delay` and shuts that runtime down; panics if the shutdown panicked.
async fn start_then_shut_down<F, Fut>(latch: &LeaderLatch, ready: F, delay: Duration)
where
    F: FnOnce(LeaderLatch) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let latch = latch.clone();
    let side = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async {
            latch.start().unwrap();
            ready(latch).await;
        });
        let started = Instant::now();
        while started.elapsed() < delay {
            std::hint::spin_loop();
        }
        drop(runtime); // the latch's task is dropped wherever it is
    });
    tokio::task::spawn_blocking(move || side.join()).await.unwrap().expect("the side runtime's shutdown panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latch_runtime_shut_down_just_after_the_first_grant_leaves_a_closable_latch() {
    let observer = client().await;
    let session = client().await;
    for round in 0..30u32 {
        let path = unique_path("rq-rt-granted");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        // Ready once leadership shows (`has_leadership` reads the hold, set before the handover).
        let ready = |latch: LeaderLatch| async move {
            while !latch.has_leadership() {
                tokio::task::yield_now().await;
            }
        };
        start_then_shut_down(&latch, ready, Duration::from_micros(u64::from(round % 15) * 50)).await;
        if round % 2 == 0 {
            tokio::time::timeout(Duration::from_secs(20), latch.close())
                .await
                .unwrap_or_else(|_| panic!("round {round}: close did not return"))
                .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
            let left = children(&observer, &path).await;
            assert!(left.is_empty(), "round {round}: close returned Ok with {left:?} left");
        } else {
            drop(latch);
            eventually(Duration::from_secs(5), "a dropped latch leaves", || async {
                children(&observer, &path).await.is_empty()
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(children(&observer, &path).await.is_empty(), "round {round}: a node appeared later");
        assert!(!session.state().is_terminated());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latch_runtime_shut_down_while_its_create_is_in_flight_leaves_its_node() {
    let observer = client().await;
    let session = client().await;
    let grant = latch_grant_time(&session, 3).await;
    for round in 0..40u32 {
        let path = unique_path("rq-rt-in-flight");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        // Swept across the create: 0.3 .. 1.3 x the time a grant takes from `start`.
        let delay = grant * (6 + round % 20) / 20;
        start_then_shut_down(&latch, |_| async {}, delay).await;
        let leads = latch.has_leadership();
        latch.close().await.unwrap();
        let left = children(&observer, &path).await;
        assert!(!session.state().is_terminated());
        assert!(
            left.is_empty(),
            "round {round} (shut down {delay:?} after start, leading: {leads}): close returned Ok with {left:?} left"
        );
    }
}

/// The same sweep, with the latch built inside the runtime that is shut down, as its session's
/// first recipe: the runtime the session remembers for background work is the dying one. A
/// deletion that runtime drops unfinished stays counted, and `close` from the other runtime runs
/// it (`session/cleanup.rs`, `Deletion`): `close` returns `Ok` only with the node gone. When such
/// a deletion was only started again on the remembered runtime, that runtime dropped it at once,
/// and `close` returned `Ok` with the node left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latch_built_on_a_runtime_shut_down_while_its_create_is_in_flight_leaves_its_node() {
    let observer = client().await;
    let grant = latch_grant_time(&client().await, 3).await;
    let mut in_flight = 0;
    for round in 0..40u32 {
        // A new session each round: its first recipe is the one built on the side runtime.
        let session = client().await;
        let path = unique_path("rq-rt-first-recipe");
        let delay = grant * (6 + round % 20) / 20;
        let (built, id) = (session.clone(), format!("r{round}"));
        let (path_there, side_path) = (path.clone(), path.clone());
        let side = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            let latch = runtime.block_on(async {
                let latch = LeaderLatch::builder(built, &path_there).id(id).build().unwrap();
                latch.start().unwrap();
                latch
            });
            let started = Instant::now();
            while started.elapsed() < delay {
                std::hint::spin_loop();
            }
            drop(runtime);
            latch
        });
        let latch = tokio::task::spawn_blocking(move || side.join())
            .await
            .unwrap()
            .unwrap_or_else(|_| panic!("round {round}: the side runtime's shutdown panicked ({side_path})"));
        let leads = latch.has_leadership();
        if !leads {
            in_flight += 1;
        }
        tokio::time::timeout(Duration::from_secs(20), latch.close())
            .await
            .unwrap_or_else(|_| panic!("round {round}: close did not return"))
            .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
        let left = children(&observer, &path).await;
        assert!(!session.state().is_terminated());
        assert!(
            left.is_empty(),
            "round {round} (shut down {delay:?} after start, leading: {leads}): close returned Ok with {left:?} left"
        );
        drop(session);
    }
    // The sweep must have caught creates in flight, or it tested nothing new.
    assert!(in_flight >= 5, "only {in_flight} of 40 rounds shut down before the grant");
}

/// The session remembers a current-thread runtime that is alive but no longer driven (it built the
/// session's first recipe on a thread that then stopped driving it), and the latch is started on
/// a third runtime shut down while its create is in flight: the orphaned deletion's task on the
/// remembered runtime never runs, and `close` from the test's runtime runs it itself. When such a
/// deletion was only started again on the remembered runtime, `close` waited for it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_deletion_runs_in_close_when_the_remembered_runtime_is_not_driven() {
    let observer = client().await;
    let session = client().await;
    let remembering = session.clone();
    let (idle, first) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // The session's first recipe: the session remembers this runtime for as long as one of
        // its recipes lives.
        let first =
            runtime.block_on(async move { zk_recipes::InterProcessMutex::new(remembering, "/zkr-tests/rq-idle") });
        (runtime, first.unwrap())
    })
    .join()
    .unwrap();
    let grant = latch_grant_time(&session, 3).await;
    let mut in_flight = 0;
    for round in 0..30u32 {
        let path = unique_path("rq-rt-idle");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        let delay = grant * (6 + round % 20) / 20;
        start_then_shut_down(&latch, |_| async {}, delay).await;
        let leads = latch.has_leadership();
        if !leads {
            in_flight += 1;
        }
        tokio::time::timeout(Duration::from_secs(20), latch.close())
            .await
            .unwrap_or_else(|_| panic!("round {round} (shut down {delay:?} after start): close did not return"))
            .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
        let left = children(&observer, &path).await;
        assert!(left.is_empty(), "round {round} (leading: {leads}): close returned Ok with {left:?} left");
    }
    assert!(!session.state().is_terminated());
    assert!(in_flight >= 5, "only {in_flight} of 30 rounds shut down before the grant");
    drop(first);
    // Dropped where blocking is allowed (with the tasks queued on it).
    tokio::task::spawn_blocking(move || drop(idle)).await.unwrap();
}
