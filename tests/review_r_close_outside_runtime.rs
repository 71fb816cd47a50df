//! Review R: a latch's `close` polled outside any runtime (`common::block_on`), the session's
//! remembered runtime a current-thread one no longer driven. `close` spawns its confirming task
//! (the one that runs `searches_done`) on the remembered runtime, where it never runs.
//!
//! - `close_outside_any_runtime_with_the_remembered_runtime_not_driven` (failed: a defect in
//!   `LeaderLatch::close`, older than the change): `close` never returned, even with nothing to
//!   delete. Fixed: polled outside any runtime, `close` drives the confirmation itself too (a
//!   shared future, also spawned on the remembered runtime).
//! - `close_outside_any_runtime_runs_a_stalled_deletion_through_a_connection_loss` (added with
//!   the fix): the same close runs a deletion stalled on the undriven runtime itself, through a
//!   `ConnectionLoss` and its backoff, with no tokio timer to use (checked failing both with the
//!   close's timer and with the backoff's a tokio one: a hang, a panic).

mod common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LeaderLatch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_outside_any_runtime_with_the_remembered_runtime_not_driven() {
    let session = client().await;
    let remembering = session.clone();
    let (idle, first) = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let first =
            runtime.block_on(async move { InterProcessMutex::new(remembering, unique_path("rr-first")) }).unwrap();
        (runtime, first)
    })
    .await
    .unwrap();
    let latch = LeaderLatch::new(session.clone(), unique_path("rr-outside-close")).unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    // Left blocked if `close` never returns (the process ends with the test binary).
    std::thread::spawn(move || {
        let _ = sender.send(block_on(latch.close()));
    });
    let outcome = tokio::task::spawn_blocking(move || receiver.recv_timeout(Duration::from_secs(10))).await.unwrap();
    drop(first);
    std::mem::forget(idle); // its queued task would block a drop here
    assert!(
        outcome.is_ok(),
        "a latch's close polled outside any runtime did not return within 10 s: its \
         confirming task was spawned on the session's remembered runtime, which is not driven"
    );
    assert!(!session.state().is_terminated());
}

/// A latch's `close` polled outside any runtime, the remembered runtime not driven, and a guard's
/// deletion stalled there (dropped on a thread with no runtime: its task never runs): the close
/// runs the deletion itself once it has stalled, and the delete it sends loses its reply to a
/// connection cut (`ConnectionLoss`, retried after a backoff). Fails if the close has no timer
/// outside a runtime (it never runs the stalled deletion: hangs), or if the retry's backoff is a
/// tokio timer (it panics: no reactor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_outside_any_runtime_runs_a_stalled_deletion_through_a_connection_loss() {
    let zk = zookeeper().await;
    let observer = client().await;
    let proxy = zk_testcontainers::FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(10)).connect(&proxy.addr()).await.expect("connect");
    let remembering = session.clone();
    let (idle, first) = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let first =
            runtime.block_on(async move { InterProcessMutex::new(remembering, unique_path("rr-first")) }).unwrap();
        (runtime, first)
    })
    .await
    .unwrap();
    let path = unique_path("rr-outside-stalled");
    let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    // Its first delete is sent at the drop; its task, on the remembered runtime, never runs.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    eventually(Duration::from_secs(5), "the released node is deleted", || async {
        children(&observer, &path).await.is_empty()
    })
    .await;
    // The next delete on the session (the close's own run of the deletion) loses its reply.
    proxy.drop_reply_to_next(&[zk_testcontainers::op::DELETE]);
    let latch = LeaderLatch::new(session.clone(), unique_path("rr-outside-stalled-latch")).unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(latch.close())));
        let _ = sender.send(outcome.map_err(|panic| {
            panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned())
        }));
    });
    let outcome = tokio::task::spawn_blocking(move || receiver.recv_timeout(Duration::from_secs(20))).await.unwrap();
    let dropped_a_reply = !proxy.drop_reply_armed();
    drop(first);
    std::mem::forget(idle); // its queued tasks would block a drop here
    let outcome = outcome.expect("a latch's close polled outside any runtime did not return within 20 s");
    let result = outcome.unwrap_or_else(|panic| panic!("the close panicked: {panic:?}"));
    result.expect("close");
    assert!(dropped_a_reply, "the close sent no delete: the deletion was not run by it");
    assert!(!session.state().is_terminated());
}
