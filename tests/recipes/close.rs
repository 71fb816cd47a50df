//! `ManagedClient::close`: holds and queued nodes go at once, so another client is granted
//! without waiting for the session timeout; acquires fail with `Error::Closed`.

use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{ConnectionState, Error, InterProcessMutex, LockState, LossReason, ManagedClient};
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_everything_and_the_next_holder_is_granted_at_once() {
    init_tracing();
    let server = zookeeper().await;
    let t = Duration::from_secs(10);
    let admin = client().await;
    let (held_path, queued_path) = (unique_path("close-held"), unique_path("close-queued"));
    let zk = ManagedClient::builder(server.connect_string()).session_timeout(t).connect().await.unwrap();
    // A holds one lock, waits for another (held by someone else), and has an ephemeral of its own.
    let held = InterProcessMutex::new(&zk, &held_path).unwrap().acquire().await.unwrap();
    let other_holder = InterProcessMutex::new(client().await, &queued_path).unwrap().acquire().await.unwrap();
    let queued = InterProcessMutex::new(&zk, &queued_path).unwrap();
    let waiting = tokio::spawn(async move { queued.acquire().await.map(|_| ()) });
    let own = unique_path("close-own");
    zk.client().create(&own, b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let next = InterProcessMutex::new(client().await, &held_path).unwrap();
    let next_waiting = tokio::spawn(async move {
        let guard = next.acquire().await.unwrap();
        (Instant::now(), guard)
    });
    eventually(Duration::from_secs(10), "both waiters queued", || async {
        children(&admin, &held_path).await.len() == 2 && children(&admin, &queued_path).await.len() == 2
    })
    .await;
    let mut states = zk.state_watcher();
    // What the holder was told when its node's deletion reached another client: told first.
    let told_at_delete = {
        let signal = held.loss_signal();
        let (_, _, deleted) = admin.get_and_watch_data(held.lock_path()).await.unwrap();
        tokio::spawn(async move {
            let event = deleted.changed().await;
            (event.event_type, signal.reason())
        })
    };

    let closing = Instant::now();
    zk.close().await.expect("close confirms the deletions");
    let closed = closing.elapsed();
    let (granted_at, next_guard) =
        tokio::time::timeout(t, next_waiting).await.expect("the next holder is granted").unwrap();
    let granted = granted_at - closing;
    eprintln!("close took {closed:?}; the next holder on another client was granted {granted:?} after it began");
    // A round trip or a few, never the session timeout (generous slack for a loaded machine).
    assert!(granted < t / 10 + SCHED_SLACK, "granted {granted:?} after close (T = {t:?})");
    assert_eq!(held.state(), LockState::Lost(LossReason::SessionClosed));
    let (event, told) = tokio::time::timeout(Duration::from_secs(5), told_at_delete).await.unwrap().unwrap();
    assert_eq!(event, zk::EventType::NodeDeleted);
    assert_eq!(told, Some(LossReason::SessionClosed), "the holder was told before its node was deleted");
    let err =
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the waiter ends").unwrap().unwrap_err();
    assert!(matches!(err, Error::Closed { .. }), "{err:?}");
    // Nothing of the closed client is left.
    assert_eq!(admin.check_stat(&own).await.unwrap(), None, "its own ephemeral node is gone too");
    assert_eq!(children(&admin, &queued_path).await.len(), 1, "its queued node is gone");
    assert_eq!(zk.state(), ConnectionState::Closed);
    assert_eq!(states.changed().await, Some(ConnectionState::Closed));
    let err = InterProcessMutex::new(&zk, &held_path).unwrap().try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::Closed { .. }), "{err:?}");
    zk.close().await.expect("idempotent");
    drop(held);
    next_guard.release().await.unwrap();
    other_holder.release().await.unwrap();
    assert_no_nodes_left(&admin, &held_path).await;
    assert_no_nodes_left(&admin, &queued_path).await;
}

/// Concurrent `close()` calls all return after the work is done: a second `close()` while the
/// first has only begun (polled once, then left alone by its caller) does not return before the
/// nodes are deleted; and the work runs to its end even when the first `close()` is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_close_returns_after_the_work_is_done() {
    let server = zookeeper().await;
    let admin = client().await;
    let zk = ManagedClient::builder(server.connect_string())
        .session_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let path = unique_path("close-concurrent");
    let held = InterProcessMutex::new(&zk, &path).unwrap().acquire().await.unwrap();
    let node = held.lock_path().to_owned();
    // The first close is polled once (the client is closed, its work begun) and then dropped.
    let mut first = Box::pin(zk.close());
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(first.as_mut().poll(cx).is_ready())).await;
    drop(first);
    if !polled {
        // The second close returns only once the work is done: the node is gone by then.
        zk.close().await.expect("the second close returns the outcome of the work");
    }
    assert_eq!(admin.check_stat(&node).await.unwrap(), None, "a close returned before the node was deleted");
    assert_eq!(held.state(), LockState::Lost(LossReason::SessionClosed));
    zk.close().await.expect("a close after the work returns its outcome");
    drop(held);
    assert_no_nodes_left(&admin, &path).await;
}

/// The runtime the first close() ran on shuts down before the close work finished (its task is
/// dropped); a later close() from another runtime returns `Err(Closed)` at once, never waits for ever.
#[test]
fn a_close_after_the_close_work_was_dropped_returns() {
    let main = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let connect = main.block_on(async { zookeeper().await.connect_string().to_owned() });
    let a = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let zk = a.block_on(async {
        let zk = ManagedClient::builder(connect).session_timeout(Duration::from_secs(6)).connect().await.unwrap();
        let mut first = Box::pin(zk.close());
        let ready = std::future::poll_fn(|cx| std::task::Poll::Ready(first.as_mut().poll(cx).is_ready())).await;
        assert!(!ready);
        drop(first);
        zk
    });
    drop(a); // the service's runtime shuts down: the spawned close work is dropped unrun
    let second = main.block_on(async { tokio::time::timeout(Duration::from_secs(20), zk.close()).await });
    eprintln!("second close after the work was dropped: {second:?}");
    assert!(second.is_ok(), "close() still waiting after 20 s");
}
