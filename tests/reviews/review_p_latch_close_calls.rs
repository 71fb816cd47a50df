//! Review P: every `LeaderLatch::close` call returns the outcome of the same single close work,
//! once it is done (`dfff216` made the outcome's channel lazily, in a `OnceLock`, by the first
//! `close`):
//! - first closes racing on plain threads (each its own minimal executor, released together by a
//!   barrier: the `OnceLock`'s initialisation raced) all return, `Ok`, with no node left;
//! - with the leader's delete held up, closes cancelled by their timeouts, closes retried, closes
//!   from clones while the clones that started the work are dropped: each returns only once the
//!   node is gone, and subscribers are told `NotLeader(LatchClosed)` once;
//! - a close cancelled and then every clone dropped: the work still finishes (the node goes while
//!   the session is open); the last clone dropped without any close still leaves the election.
//!
//! A close that made its own channel instead of sharing the first one's would wait forever (it
//! finds the latch already closed, and nobody publishes to its channel): the timeouts catch it.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{LatchEvent, LeaderLatch, LockState, LossReason};
use zk_testcontainers::{op, FaultProxy};

/// Three first closes at once, on three threads, of each of 60 latches (latent ones, and started
/// ones that lead): each call returns `Ok`, and no node of a started one is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_closes_all_return_the_one_outcome() {
    let observer = client().await;
    let session = client().await;
    let path = unique_path("rp-close-race");
    for round in 0..60 {
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        let leading = round % 2 == 1;
        if leading {
            latch.start().unwrap();
            drop(latch.await_leadership().await.unwrap());
        }
        let barrier = Arc::new(std::sync::Barrier::new(3));
        let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
        for caller in 0..3 {
            let (latch, barrier, sender) = (latch.clone(), barrier.clone(), sender.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let closed = block_on(latch.close());
                let _ = sender.send((caller, closed, Instant::now()));
            });
        }
        drop(sender);
        drop(latch);
        let mut returned = Vec::new();
        for _ in 0..3 {
            let (caller, closed, _) = tokio::time::timeout(Duration::from_secs(20), outcomes.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round} (leading: {leading}): a close never returned: {returned:?}"))
                .expect("an outcome");
            assert!(closed.is_ok(), "round {round}: close {caller}: {closed:?}");
            returned.push(caller);
        }
        if leading {
            // Each close returned Ok only once the node was gone: checked once all have.
            let left = children(&observer, &path).await;
            assert!(left.is_empty(), "round {round}: the closes returned Ok with {left:?} left");
        }
    }
    assert!(!session.state().is_terminated());
}

/// The leader's delete held 1.5 s on its way to the server. A close cancelled by its timeout, on a
/// clone dropped at once; another cancelled, its clone dropped too; then two closes from two more
/// clones at once, the latch's first handle dropped meanwhile; and a last close after all that.
/// Each returns `Ok` only with the node gone, the held guard reads `Lost(LatchClosed)`, and the
/// subscriber saw `Elected`, `NotLeader(LatchClosed)`, the end — one close, told once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_retried_and_concurrent_closes_wait_for_the_same_work() {
    let zk = zookeeper().await;
    let path = unique_path("rp-close-retried");
    let observer = client().await;
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");
    let latch = LeaderLatch::builder(session.clone(), &path).id("a").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let leadership = latch.await_leadership().await.unwrap();
    let (a, b, c, d, last) = (latch.clone(), latch.clone(), latch.clone(), latch.clone(), latch.clone());

    proxy.delay_requests(&[op::DELETE], Duration::from_millis(1500));
    let closing_since = Instant::now();
    assert!(tokio::time::timeout(Duration::from_millis(100), a.close()).await.is_err(), "the delete is held");
    drop(a);
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LatchClosed), "stepped down before any await");
    assert!(tokio::time::timeout(Duration::from_millis(50), b.close()).await.is_err(), "still held");
    drop(b);
    let concurrent: Vec<_> = [c, d]
        .into_iter()
        .map(|clone| {
            let observer = observer.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let closed = clone.close().await;
                let left = children(&observer, &path).await;
                (closed, left, closing_since.elapsed())
            })
        })
        .collect();
    drop(latch);
    for (i, closing) in concurrent.into_iter().enumerate() {
        let (closed, left, after) =
            tokio::time::timeout(Duration::from_secs(20), closing).await.expect("a close returns").unwrap();
        closed.unwrap_or_else(|err| panic!("close {i}: {err}"));
        assert!(left.is_empty(), "close {i} returned Ok after {after:?} with {left:?} left");
    }
    tokio::time::timeout(Duration::from_secs(5), last.close()).await.expect("the last close returns").unwrap();
    assert!(children(&observer, &path).await.is_empty());
    assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the session is still open");
    proxy.delay_requests(&[], Duration::ZERO);

    assert_led_then_closed(&mut events).await;
    assert!(!last.has_leadership());
    assert!(last.await_leadership().await.is_err(), "a closed latch leads");
}

/// A close cancelled while the leader's delete is held, then every clone of the latch dropped: the
/// close's work goes on and deletes the node while the session is open. A second latch, leading,
/// whose clones are all dropped without any close (`Drop` of the last clone): it steps down, tells
/// its subscriber `NotLeader(LatchClosed)` and ends the stream, and its node goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_outlives_every_clone_and_a_dropped_latch_still_leaves() {
    let zk = zookeeper().await;
    let observer = client().await;
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");

    let closed_path = unique_path("rp-close-orphaned");
    let closed = LeaderLatch::builder(session.clone(), &closed_path).id("closed").build().unwrap();
    closed.start().unwrap();
    let closed_leadership = closed.await_leadership().await.unwrap();
    let clone = closed.clone();
    proxy.delay_requests(&[op::DELETE], Duration::from_millis(1000));
    assert!(tokio::time::timeout(Duration::from_millis(100), clone.close()).await.is_err(), "the delete is held");
    drop(clone);
    drop(closed);
    assert_eq!(closed_leadership.state(), LockState::Lost(LossReason::LatchClosed));
    drop(closed_leadership);
    assert_no_nodes_left_while_open(&observer, &closed_path, std::slice::from_ref(&session), Duration::from_secs(10))
        .await;
    proxy.delay_requests(&[], Duration::ZERO);

    let dropped_path = unique_path("rp-close-dropped");
    let dropped = LeaderLatch::builder(session.clone(), &dropped_path).id("dropped").build().unwrap();
    let mut events = dropped.subscribe();
    dropped.start().unwrap();
    let dropped_leadership = dropped.await_leadership().await.unwrap();
    let clones: Vec<_> = (0..4).map(|_| dropped.clone()).collect();
    drop(dropped);
    let handles: Vec<_> = clones.into_iter().map(|clone| std::thread::spawn(move || drop(clone))).collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(dropped_leadership.state(), LockState::Lost(LossReason::LatchClosed), "dropped: stepped down");
    assert_led_then_closed(&mut events).await;
    drop(dropped_leadership);
    assert_no_nodes_left_while_open(&observer, &dropped_path, &[session], Duration::from_secs(10)).await;
}

/// The subscriber's whole stream: exactly `Elected`, then `NotLeader(LatchClosed)`, then its end.
async fn assert_led_then_closed(events: &mut zk_recipes::LatchEvents) {
    let mut seen = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("the end") {
        seen.push(event);
    }
    assert!(
        matches!(
            seen.as_slice(),
            [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::LatchClosed }]
        ),
        "{seen:?}"
    );
}
