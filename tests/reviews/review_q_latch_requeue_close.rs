//! Review Q (`92da35d`: the first term in `elect`, the rest in `serve`, spawned at the first grant
//! under the state's lock; since `a802210` no task runs while the latch leads, and a loss starts
//! `rejoin`, which queues again through `elect`). A close or a drop swept across a re-queue after a loss — the loss
//! being handled, the re-queue's create, its second grant (`hand_over` racing the close)
//! — and across the first term (a drop). Whatever it met:
//! - `close` returns `Ok` with no node of the latch left (its session open), and no node of it
//!   appears afterwards (the election is not kept running by a task `close` missed);
//! - the subscriber's story is `Elected, NotLeader(NodeDeleted)`, then at most one more
//!   `Elected, NotLeader(LatchClosed)`, then the end: never an `Elected` after `LatchClosed`.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{LatchEvent, LatchEvents, LeaderLatch, LossReason};

async fn drain(events: &mut LatchEvents, round: u32) -> Vec<LatchEvent> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(event)) => seen.push(event),
            Ok(None) => return seen,
            Err(_) => panic!("round {round}: the stream did not end: {seen:?}"),
        }
    }
}

fn spin(delay: Duration) {
    let started = Instant::now();
    while started.elapsed() < delay {
        std::hint::spin_loop();
    }
}

/// Alone in the election, the latch leads, its node is deleted by another session, and it queues
/// again and leads again at once (the second grant, `rejoin`'s handover): `close` is issued at
/// delays swept across that re-queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_racing_the_requeue_and_its_grant_leaves_nothing() {
    let observer = client().await;
    let session = client().await;
    let mut regranted = 0;
    for round in 0..60u32 {
        let path = unique_path("rq-requeue-close");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        let mut events = latch.subscribe();
        latch.start().unwrap();
        let leadership = latch.await_leadership().await.unwrap();
        let first = leadership.lock_path().to_owned();
        drop(leadership);
        observer.delete(&first, None).await.unwrap();
        // 0 .. ~6 ms after the delete's reply: the loss being told, the create, the grant, after.
        spin(Duration::from_micros(u64::from(round % 30) * 200));
        tokio::time::timeout(Duration::from_secs(20), latch.close())
            .await
            .unwrap_or_else(|_| panic!("round {round}: close did not return"))
            .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
        assert!(!session.state().is_terminated());
        let left = children(&observer, &path).await;
        assert!(left.is_empty(), "round {round}: close returned Ok with {left:?} left");
        assert!(!latch.has_leadership(), "round {round}");
        let seen = drain(&mut events, round).await;
        match seen.as_slice() {
            [LatchEvent::Elected { .. }] => {}, // closed before the loss was told
            [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }] => {},
            [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::NodeDeleted }] => {},
            [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::NodeDeleted }, LatchEvent::Elected { lock_path, .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }] =>
            {
                assert_ne!(lock_path, &first, "round {round}");
                regranted += 1;
            },
            other => panic!("round {round}: events {other:?}"),
        }
        // Nothing keeps the election running: no node appears later either.
        tokio::time::sleep(Duration::from_millis(40)).await;
        let later = children(&observer, &path).await;
        assert!(later.is_empty(), "round {round}: a node appeared after close: {later:?}");
    }
    println!("60 closes across a re-queue: {regranted} after the second grant");
}

/// Queued behind another leader after a loss (the re-queue waits in `rejoin`): `close` and the
/// drop of the last clone at swept delays after the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_or_drop_while_requeued_behind_another_leader_leaves_nothing() {
    let observer = client().await;
    let (a_session, b_session) = (client().await, client().await);
    for round in 0..30u32 {
        let path = unique_path("rq-requeue-behind");
        let a = LeaderLatch::builder(a_session.clone(), &path).id("a").build().unwrap();
        let b = LeaderLatch::builder(b_session.clone(), &path).id("b").build().unwrap();
        a.start().unwrap();
        let leadership = a.await_leadership().await.unwrap();
        b.start().unwrap();
        eventually(Duration::from_secs(5), "b queued", || async { children(&observer, &path).await.len() == 2 }).await;
        observer.delete(leadership.lock_path(), None).await.unwrap();
        drop(leadership);
        spin(Duration::from_micros(u64::from(round % 15) * 400));
        if round % 2 == 0 {
            a.close().await.unwrap_or_else(|err| panic!("round {round}: close: {err}"));
            let ids: Vec<String> = b.participants().await.unwrap().iter().map(|p| p.id()).collect();
            assert_eq!(ids, ["b"], "round {round}: a's node left when close returned");
        } else {
            drop(a);
            eventually(Duration::from_secs(5), "a dropped latch leaves", || async {
                children(&observer, &path).await.len() == 1
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        let ids: Vec<String> = b.participants().await.unwrap().iter().map(|p| p.id()).collect();
        assert_eq!(ids, ["b"], "round {round}: a node of a appeared after it left");
        assert!(!a_session.state().is_terminated());
        b.close().await.unwrap();
    }
}

/// The last clone dropped at swept moments of the first term (before the create, while it waits,
/// at the grant, after): the node goes soon after, and none appears later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_across_the_first_term_leaves_nothing() {
    let observer = client().await;
    let session = client().await;
    let grant = latch_grant_time(&session, 3).await;
    for round in 0..60u32 {
        let path = unique_path("rq-drop-first");
        let latch = LeaderLatch::new(session.clone(), &path).unwrap();
        let mut events = latch.subscribe();
        latch.start().unwrap();
        spin(grant * (20 + round % 30) / 30);
        drop(latch);
        eventually(Duration::from_secs(5), "a dropped latch leaves", || async {
            children(&observer, &path).await.is_empty()
        })
        .await;
        let seen = drain(&mut events, round).await;
        match seen.as_slice() {
            [] | [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }] => {},
            other => panic!("round {round}: events {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(children(&observer, &path).await.is_empty(), "round {round}: a node appeared after the drop");
        assert!(!session.state().is_terminated());
    }
}
