//! Review P: `LeaderLatch::await_leadership` wakes on every change of the latch's state (the
//! `Notify` of `dfff216`, which replaced a version counter in a `watch` channel): many waiters at
//! once — each parked in its own `notified()` — are all woken by the one `notify_waiters` of a
//! grant, of a close, of a stop (an expired plain session) and of a loss followed by the
//! re-queue's new leadership; waiters that give up again and again with tiny timeouts around the
//! grant keep the latch's place and still get the leadership; and a waiter polled outside any
//! tokio runtime is woken too.
//!
//! A lost wake-up shows as a waiter that never returns (each is bounded by a generous timeout);
//! a `notify_one` in place of `notify_waiters`, or a registration after the state is read, fails
//! these.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use zk_recipes::{Error, LatchEvent, LeaderLatch, LockGuard, LockState, LossReason};
use zk_testcontainers::expire_session;

/// Generous: a wake-up is a local notification, the grant one ZooKeeper round trip away.
const WOKEN_WITHIN: Duration = Duration::from_secs(15);
const WAITERS: usize = 24;

/// A started latch queued behind a one-shot leader on another session: `(the holder's
/// leadership, the holder, the queued latch, its session)`.
async fn queued_behind_a_leader(path: &str) -> (LockGuard, LeaderLatch, LeaderLatch, zookeeper_client::Client) {
    let observer = client().await;
    let holder = LeaderLatch::builder(client().await, path).id("holder").build().unwrap();
    let held = holder.acquire_once().await.unwrap();
    let session = client().await;
    let latch = LeaderLatch::builder(session.clone(), path).id("x").build().unwrap();
    latch.start().unwrap();
    eventually(Duration::from_secs(10), "x queued behind the holder", || async {
        queued_nodes(&observer, path, "-latch-").await.len() == 2
    })
    .await;
    (held, holder, latch, session)
}

/// Many waiters parked on a queued latch — `await_leadership`, and loops of
/// `await_leadership_timeout` with 1–3 ms timeouts (each gives up and registers anew, around the
/// very moment of the grant) — are all woken by the grant and all get the same leadership; the
/// giving-up kept the latch's node in its place. Four rounds, each a new election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_is_woken_by_the_grant() {
    let observer = client().await;
    for round in 0..4 {
        let path = unique_path("rp-wake-grant");
        let (held, holder, latch, session) = queued_behind_a_leader(&path).await;
        let queued = queued_nodes(&observer, &path, "-latch-").await;
        let mut waiters = Vec::new();
        for _ in 0..WAITERS {
            let latch = latch.clone();
            waiters.push(tokio::spawn(async move { latch.await_leadership().await }));
        }
        let mut impatient = Vec::new();
        for i in 0..6u64 {
            let latch = latch.clone();
            impatient.push(tokio::spawn(async move {
                let mut gave_up = 0u64;
                loop {
                    match latch.await_leadership_timeout(Duration::from_millis(1 + i % 3)).await? {
                        Some(leadership) => return Ok::<_, Error>((leadership, gave_up)),
                        None => gave_up += 1,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "a waiter returned while another leads");
        assert!(impatient.iter().all(|w| !w.is_finished()), "an impatient waiter returned while another leads");
        assert_eq!(queued_nodes(&observer, &path, "-latch-").await, queued, "waiting moved the latch's node");

        held.release().await.unwrap();
        let mut tokens = Vec::new();
        for (i, waiter) in waiters.into_iter().enumerate() {
            let leadership = tokio::time::timeout(WOKEN_WITHIN, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter {i} was not woken by the grant"))
                .unwrap()
                .unwrap_or_else(|err| panic!("round {round}: waiter {i}: {err}"));
            tokens.push(leadership.fencing_token());
        }
        let mut gave_up = 0;
        for (i, waiter) in impatient.into_iter().enumerate() {
            let (leadership, n) = tokio::time::timeout(WOKEN_WITHIN, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: impatient waiter {i} never got the leadership"))
                .unwrap()
                .unwrap_or_else(|err| panic!("round {round}: impatient waiter {i}: {err}"));
            tokens.push(leadership.fencing_token());
            gave_up += n;
        }
        assert!(tokens.windows(2).all(|w| w[0] == w[1]), "round {round}: one leadership, many tokens: {tokens:?}");
        assert!(gave_up > 0, "round {round}: the impatient waiters never gave up: the test tested nothing");
        assert!(latch.has_leadership());
        latch.close().await.unwrap();
        holder.close().await.unwrap();
        assert_no_nodes_left_while_open(&observer, &path, &[session], Duration::from_secs(5)).await;
    }
}

/// Waiters parked on a queued latch, and more arriving while the latch closes (a close from
/// another clone, on another task): every one returns `LatchState` — none is left waiting on a
/// latch that will never lead again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_is_woken_by_a_close() {
    let observer = client().await;
    for round in 0..4 {
        let path = unique_path("rp-wake-close");
        let (held, holder, latch, session) = queued_behind_a_leader(&path).await;
        let mut waiters = parked_waiters(&latch).await;
        let gate = Arc::new(tokio::sync::Barrier::new(9));
        for _ in 0..8 {
            let (latch, gate) = (latch.clone(), gate.clone());
            waiters.push(tokio::spawn(async move {
                gate.wait().await;
                latch.await_leadership().await
            }));
        }
        let closing = {
            let (latch, gate) = (latch.clone(), gate.clone());
            tokio::spawn(async move {
                gate.wait().await;
                latch.close().await
            })
        };
        for (i, waiter) in waiters.into_iter().enumerate() {
            let awaited = tokio::time::timeout(WOKEN_WITHIN, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter {i} was not woken by the close"))
                .unwrap();
            assert!(matches!(awaited, Err(Error::LatchState { .. })), "round {round}: waiter {i}: {awaited:?}");
        }
        tokio::time::timeout(WOKEN_WITHIN, closing).await.expect("close returns").unwrap().unwrap();
        assert!(queued_nodes(&observer, &path, "-latch-").await.len() == 1, "the closed latch's node is left");
        held.release().await.unwrap();
        drop(holder);
        assert_no_nodes_left_while_open(&observer, &path, &[session], Duration::from_secs(5)).await;
    }
}

/// A queued latch on a plain client whose session expires stops: every waiter parked on it is
/// woken with the `SessionLost` that stopped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_is_woken_by_a_stop() {
    let zk = zookeeper().await;
    let path = unique_path("rp-wake-stop");
    let (held, holder, latch, session) = queued_behind_a_leader(&path).await;
    let mut events = latch.subscribe();
    let waiters = parked_waiters(&latch).await;
    expire_session(zk.connect_string(), &session).await.expect("expire");
    for (i, waiter) in waiters.into_iter().enumerate() {
        let awaited = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} was not woken by the stop"))
            .unwrap();
        assert!(matches!(awaited, Err(Error::SessionLost { .. })), "waiter {i}: {awaited:?}");
    }
    let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event");
    assert!(matches!(event, Some(LatchEvent::Stopped { error: Error::SessionLost { .. } })), "{event:?}");
    latch.close().await.unwrap();
    held.release().await.unwrap();
    drop(holder);
    assert_no_nodes_left(&client().await, &path).await;
}

/// The leader's node deleted by an operator: the leadership is lost, the latch queues again by
/// itself and leads again (alone in the election). Waiters that arrive in the window — the old
/// leadership lost, not yet taken away, the new one not yet granted — are woken by the new grant
/// and get the new leadership; subscribers see `Elected`, `NotLeader(NodeDeleted)`, `Elected`
/// with a larger fencing token, in that order. Three losses in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_a_loss_are_woken_by_the_next_grant() {
    let observer = client().await;
    let path = unique_path("rp-wake-requeue");
    let session = client().await;
    let latch = LeaderLatch::builder(session.clone(), &path).id("x").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let mut leadership = latch.await_leadership().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("an event");
    assert!(
        matches!(&first, Some(LatchEvent::Elected { fencing_token, .. }) if *fencing_token == leadership.fencing_token()),
        "{first:?}"
    );
    for round in 0..3 {
        let node = leadership.lock_path().to_owned();
        observer.delete(&node, None).await.unwrap();
        let reason = tokio::time::timeout(WOKEN_WITHIN, leadership.lost()).await.expect("told lost");
        assert_eq!(reason, LossReason::NodeDeleted);
        let mut waiters = Vec::new();
        for _ in 0..WAITERS {
            let latch = latch.clone();
            waiters.push(tokio::spawn(async move { latch.await_leadership().await }));
        }
        let mut next = None;
        for (i, waiter) in waiters.into_iter().enumerate() {
            let got = tokio::time::timeout(WOKEN_WITHIN, waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter {i} was not woken by the new grant"))
                .unwrap()
                .unwrap_or_else(|err| panic!("round {round}: waiter {i}: {err}"));
            assert!(got.fencing_token() > leadership.fencing_token(), "round {round}: waiter {i} got the lost one");
            assert_eq!(got.state(), LockState::Held);
            next.get_or_insert(got);
        }
        let next = next.unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("an event");
        assert!(matches!(lost, Some(LatchEvent::NotLeader { reason: LossReason::NodeDeleted })), "{lost:?}");
        let elected = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("an event");
        assert!(
            matches!(&elected, Some(LatchEvent::Elected { fencing_token, .. }) if *fencing_token == next.fencing_token()),
            "round {round}: {elected:?}"
        );
        assert!(events.try_next().is_none(), "round {round}: more events than changes");
        leadership = next;
    }
    latch.close().await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("an event");
    assert!(matches!(closed, Some(LatchEvent::NotLeader { reason: LossReason::LatchClosed })), "{closed:?}");
    assert!(tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("the end").is_none());
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LatchClosed));
    assert_no_nodes_left_while_open(&observer, &path, &[session], Duration::from_secs(5)).await;
}

/// `await_leadership` polled on plain threads, outside any tokio runtime (a minimal executor that
/// parks the thread): woken by the grant on one latch, by the close on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_outside_any_runtime_are_woken() {
    let observer = client().await;
    let granted_path = unique_path("rp-wake-outside-grant");
    let closed_path = unique_path("rp-wake-outside-close");
    let (held_a, holder_a, granted, session_a) = queued_behind_a_leader(&granted_path).await;
    let (held_b, holder_b, closed, session_b) = queued_behind_a_leader(&closed_path).await;
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    for (name, latch) in [("granted", granted.clone()), ("closed", closed.clone())] {
        for _ in 0..3 {
            let (latch, sender) = (latch.clone(), sender.clone());
            std::thread::spawn(move || {
                let awaited = block_on(latch.await_leadership());
                let _ = sender.send((name, awaited.map(|leadership| leadership.fencing_token())));
            });
        }
    }
    drop(sender);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(outcomes.try_recv().is_err(), "a waiter returned while another leads");
    held_a.release().await.unwrap();
    closed.close().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        let (name, awaited) = tokio::time::timeout(WOKEN_WITHIN, outcomes.recv())
            .await
            .unwrap_or_else(|_| panic!("a waiter outside the runtime was not woken; seen: {seen:?}"))
            .expect("a thread's outcome");
        match name {
            "granted" => assert!(awaited.is_ok(), "{awaited:?}"),
            _ => assert!(matches!(awaited, Err(Error::LatchState { .. })), "{awaited:?}"),
        }
        seen.push((name, awaited));
    }
    granted.close().await.unwrap();
    holder_a.close().await.unwrap();
    held_b.release().await.unwrap();
    drop(holder_b);
    assert_no_nodes_left_while_open(&observer, &granted_path, &[session_a], Duration::from_secs(5)).await;
    assert_no_nodes_left_while_open(&observer, &closed_path, &[session_b], Duration::from_secs(5)).await;
}

/// `WAITERS` tasks parked in `await_leadership` on `latch`, which another leads.
async fn parked_waiters(latch: &LeaderLatch) -> Vec<tokio::task::JoinHandle<zk_recipes::Result<LockGuard>>> {
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let latch = latch.clone();
        waiters.push(tokio::spawn(async move { latch.await_leadership().await }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "a waiter returned while another leads");
    waiters
}
