//! Review T (read-only, on `372eb68`): two ways a latch's `close` still misbehaved with the
//! session's background deletions (`session/cleanup.rs`, `Cleanup::searches_done`, `Deletion`).
//!
//! - `a_close_on_a_busy_session_waits_only_for_deletions_started_before_it`: `searches_done`
//!   waited for *every* deletion of the session, also those started after it began; on a session
//!   whose nodes are always being deleted it never returned. Here a deletion that stays unended
//!   (its task on a runtime never driven; only a `close` runs it) is started every 300 ms while a
//!   latch closes: the close must return once the deletions from before it ended. Failed (close
//!   still waiting after 5 s) before the fix: a horizon of ids taken when the call starts.
//! - `a_disconnection_under_concurrent_closes_costs_one_more_delete_per_stalled_deletion`: a
//!   stalled deletion was run by one more close every second (`Deletion::due` set once when a
//!   close took it up), so with the connection stalled for 5 s, ten closes sent about five deletes
//!   per deletion once it came back. The close running a deletion now keeps it to itself while
//!   it is polled: one more delete per deletion (the test allows half again). Failed (2,500
//!   deletes for 500) with the close not keeping it.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::LeaderLatch;
use zk_testcontainers::{op, FaultProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_on_a_busy_session_waits_only_for_deletions_started_before_it() {
    let session = client().await;
    let stuck = stuck_runtime();
    // One from before the close: the close runs it (a second after it started) and returns.
    stuck_deletions(&session, 1, &stuck).await;
    let latch = LeaderLatch::new(session.clone(), unique_path("rt-busy-latch")).unwrap();
    let started = Instant::now();
    let closing = tokio::spawn(async move { latch.close().await });
    // Meanwhile, a new unended deletion every 300 ms for 8 s.
    let busy = {
        let (session, stuck) = (session.clone(), stuck.clone());
        tokio::spawn(async move {
            while started.elapsed() < Duration::from_secs(8) {
                stuck_deletions(&session, 1, &stuck).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let closed = tokio::time::timeout(Duration::from_secs(5), closing).await;
    let took = started.elapsed();
    busy.await.unwrap();
    std::mem::forget(stuck);
    closed
        .unwrap_or_else(|_| {
            panic!("a latch's close on a busy session still waited after {took:?}: it waits for deletions started after it")
        })
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnection_under_concurrent_closes_costs_one_more_delete_per_stalled_deletion() {
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper()
        .await
        .connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(&proxy.addr())
        .await
        .unwrap();
    let stuck = stuck_runtime();
    let n = 500;
    stuck_deletions(&session, n, &stuck).await;
    // The first deletes (sent at the drops) pass before the stall.
    let first_sent = Instant::now();
    while proxy.requests().get(&op::DELETE).copied().unwrap_or(0) < n as u64 {
        assert!(first_sent.elapsed() < Duration::from_secs(10), "the drops' deletes were not sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = proxy.requests().get(&op::DELETE).copied().unwrap_or(0);
    proxy.stall();
    let mut closes = Vec::new();
    for _ in 0..10 {
        let latch = LeaderLatch::new(session.clone(), unique_path("rt-disconnected-latch")).unwrap();
        closes.push(tokio::spawn(async move { latch.close().await }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.pass();
    for close in closes {
        tokio::time::timeout(Duration::from_secs(30), close).await.expect("close returns").unwrap().unwrap();
    }
    let sent = proxy.requests().get(&op::DELETE).copied().unwrap_or(0) - before;
    eprintln!("{n} stalled deletions, 10 closes across a 5 s stall: {sent} deletes sent by the closes");
    std::mem::forget(stuck);
    assert!(!session.state().is_terminated());
    assert!(
        sent <= n as u64 * 3 / 2,
        "10 closes across a 5 s stall sent {sent} deletes for {n} stalled deletions: {:.1} per deletion",
        sent as f64 / n as f64
    );
}
