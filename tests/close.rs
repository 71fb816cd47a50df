//! `ManagedClient::close`: holds and queued nodes go at once, so another client is granted
//! without waiting for the session timeout; acquires fail with `Error::Closed`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{ConnectionState, Error, InterProcessMutex, LockState, LossReason, ManagedClient};
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_everything_and_the_next_holder_is_granted_at_once() {
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
    let err =
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the waiter ends").unwrap().unwrap_err();
    assert!(matches!(err, Error::Closed { .. }), "{err:?}");
    // Nothing of the closed client is left, checked while its session is still open.
    assert!(!zk.client().state().is_terminated());
    assert_eq!(admin.check_stat(&own).await.unwrap(), None, "its own ephemeral node is gone too");
    assert_eq!(children(&admin, &queued_path).await.len(), 1, "its queued node is gone");
    assert!(zk.client().list_ephemerals("/").await.unwrap().is_empty());
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
