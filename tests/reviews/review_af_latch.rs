//! Review AF (`4f47e25`: a `LeaderLatch`'s clones are counted in its election, `Election::handles`,
//! instead of sharing a record; the last clone's drop ends a started latch's election). Attacks on
//! the count:
//! - clones made and dropped on many threads at once, clones made from clones, the original
//!   dropped meanwhile: the latch keeps its node and its leadership while any clone lives, and the
//!   last drop — on a plain thread, outside any runtime — ends it (node gone while the session is
//!   open, subscribers told `NotLeader(LatchClosed)`, streams ended);
//! - the last user clone dropped while another clone's `await_leadership` / `acquire_once` is
//!   pending in a task (the task's clone keeps it), then that task aborted;
//! - `close` then drop, and a `close` cancelled at once then drop.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{LatchEvent, LatchEvents, LeaderLatch, LossReason};

async fn rest(events: &mut LatchEvents) -> Vec<LatchEvent> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(event)) => seen.push(event),
            Ok(None) => return seen,
            Err(_) => panic!("the stream did not end: {seen:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_clone_drop_storm_on_threads_keeps_the_latch_until_its_last_clone() {
    let path = unique_path("raf-latch-storm");
    let ours = client().await;
    let observer = client().await;
    let latch = LeaderLatch::builder(ours.clone(), &path).id("af").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    drop(tokio::time::timeout(Duration::from_secs(10), latch.await_leadership()).await.unwrap().unwrap());
    assert!(matches!(events.next().await, Some(LatchEvent::Elected { .. })));

    // Round 1: the original stays; four threads clone and drop 20,000 times each, passing clones
    // between them.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mine = latch.clone();
            std::thread::spawn(move || {
                let (send, receive) = std::sync::mpsc::channel::<LeaderLatch>();
                for i in 0..20_000 {
                    let a = mine.clone();
                    let b = a.clone();
                    if i % 3 == 0 {
                        send.send(b).unwrap();
                    } else {
                        drop(b);
                    }
                    drop(a);
                    if i % 7 == 0 {
                        while let Ok(c) = receive.try_recv() {
                            drop(c.clone());
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(latch.has_leadership(), "a started latch stopped leading while its original was alive");
    assert_eq!(children(&observer, &path).await.len(), 1);
    assert!(events.try_next().is_none(), "an event while every clone's drop was not the last");

    // Round 2: the original is dropped while the threads hold clones; the last one dropped — on
    // one of these plain threads, outside any runtime — must end the election.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(5));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mine = latch.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..5_000 {
                    drop(mine.clone());
                }
                assert!(mine.has_leadership());
                drop(mine);
            })
        })
        .collect();
    drop(latch);
    barrier.wait();
    for thread in threads {
        thread.join().unwrap();
    }
    let told = rest(&mut events).await;
    assert!(
        matches!(told.as_slice(), [LatchEvent::NotLeader { reason: LossReason::LatchClosed }]),
        "the last clone's drop told: {told:?}"
    );
    assert_no_nodes_left_while_open(&observer, &path, &[ours], Duration::from_secs(10)).await;
}

/// The last clone the application keeps is dropped while another clone, owned by a task, waits in
/// `await_leadership` behind another leader: nothing changes (the task's clone counts); the wait
/// resolves when the other leader leaves; aborting the task then ends the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_dropping_a_clone_while_another_waits_changes_nothing() {
    let path = unique_path("raf-latch-await");
    let ours = client().await;
    let theirs = client().await;
    // A latch-named node of another session leads first: Curator's and ours are peers.
    let leader = LeaderLatch::builder(theirs.clone(), &path).id("them").build().unwrap();
    leader.start().unwrap();
    drop(tokio::time::timeout(Duration::from_secs(10), leader.await_leadership()).await.unwrap().unwrap());

    let latch = LeaderLatch::builder(ours.clone(), &path).id("af").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let waiter = tokio::spawn({
        let latch = latch.clone();
        async move {
            let guard = latch.await_leadership().await;
            (guard.map(|guard| guard.fencing_token()), latch)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(latch);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(children(&theirs, &path).await.len(), 2, "the waiting clone's latch left the queue");
    leader.close().await.unwrap();
    let (elected, latch) = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert!(elected.is_ok(), "{elected:?}");
    assert!(latch.has_leadership());
    drop(latch);
    let told = rest(&mut events).await;
    assert!(
        matches!(
            told.as_slice(),
            [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }]
        ),
        "{told:?}"
    );
    assert_no_nodes_left_while_open(&theirs, &path, &[ours, theirs.clone()], Duration::from_secs(10)).await;
}

/// One-shot: a clone's `acquire_once` waits in a task; the application's clone is dropped (not the
/// last: nothing happens), then the task is aborted (its clone the last): no node left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_dropping_clones_around_a_pending_one_shot_leaves_no_node() {
    let path = unique_path("raf-latch-oneshot");
    let ours = client().await;
    let theirs = client().await;
    // A latch's queue counts `latch-` nodes only: the holder is a latch's one-shot.
    let holder = LeaderLatch::builder(theirs.clone(), &path).build().unwrap();
    let held = holder.acquire_once().await.unwrap();
    let latch = LeaderLatch::builder(ours.clone(), &path).build().unwrap();
    let waiter = tokio::spawn({
        let latch = latch.clone();
        async move {
            let outcome = latch.acquire_once().await.map(drop);
            #[allow(unreachable_code)]
            {
                panic!("the one-shot ended while another leads: {outcome:?}")
            }
        }
    });
    eventually(Duration::from_secs(10), "the one-shot queued", || async { children(&theirs, &path).await.len() == 2 })
        .await;
    drop(latch);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(children(&theirs, &path).await.len(), 2);
    waiter.abort();
    let _ = waiter.await;
    eventually(Duration::from_secs(10), "the one-shot's node deleted", || async {
        children(&theirs, &path).await.len() == 1
    })
    .await;
    held.release().await.unwrap();
    assert_no_nodes_left_while_open(&theirs, &path, &[ours, theirs.clone()], Duration::from_secs(10)).await;
}

/// `close` then the last drop; and a `close` cancelled before its first poll finished, then the last
/// drop: no node left, and the events tell one `NotLeader(LatchClosed)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_close_then_drop_and_cancelled_close_then_drop() {
    for cancelled in [false, true] {
        let path = unique_path("raf-latch-close-drop");
        let ours = client().await;
        let latch = LeaderLatch::builder(ours.clone(), &path).build().unwrap();
        let mut events = latch.subscribe();
        latch.start().unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), latch.await_leadership()).await.unwrap().unwrap();
        let clone = latch.clone();
        if cancelled {
            let _ = tokio::time::timeout(Duration::ZERO, clone.close()).await;
        } else {
            clone.close().await.unwrap();
        }
        drop(clone);
        assert!(guard.state() != zk_recipes::LockState::Held, "a closed latch's guard still reads Held");
        drop(latch);
        drop(guard);
        let told = rest(&mut events).await;
        assert!(
            matches!(
                told.as_slice(),
                [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }]
            ),
            "cancelled {cancelled}: {told:?}"
        );
        assert_no_nodes_left_while_open(&client().await, &path, &[ours], Duration::from_secs(10)).await;
    }
}
