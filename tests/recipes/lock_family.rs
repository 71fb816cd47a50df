//! InterProcessMultiLock and revocation against a real ZooKeeper (the intent of Curator's
//! TestInterProcessMultiMutex and TestRevoker).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{
    Error, HeldLock, InterProcessMultiLock, InterProcessMutex, InterProcessReadWriteLock, InterProcessSemaphoreMutex,
    LockState, MultiLockMember, Revoker,
};
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_holds_a_mix_and_releases_in_reverse() {
    let (a, b) = (unique_path("multi-a"), unique_path("multi-b"));
    let c = unique_path("multi-c");
    let client = client().await;
    let rw = InterProcessReadWriteLock::new(client.clone(), &c).unwrap();
    let multi = InterProcessMultiLock::new(vec![
        MultiLockMember::from(InterProcessMutex::new(client.clone(), &a).unwrap()),
        InterProcessSemaphoreMutex::new(client.clone(), &b).unwrap().into(),
        rw.write_lock().clone().into(),
    ]);
    let held = multi.acquire().await.unwrap();
    assert_eq!(held.held().len(), 3);
    assert_eq!(held.state(), LockState::Held);
    assert!(matches!(held.held()[1], HeldLock::Lease(_)));
    // Each is really held: another session cannot take any of them.
    let other = client_b().await;
    assert!(InterProcessMutex::new(other.clone(), &a).unwrap().try_acquire().await.unwrap().is_none());
    assert!(InterProcessSemaphoreMutex::new(other.clone(), &b)
        .unwrap()
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    assert!(InterProcessReadWriteLock::new(other.clone(), &c)
        .unwrap()
        .read_lock()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    // The deletions, seen in the ensemble's order through data watches on one session.
    let observer = client_b().await;
    let paths: Vec<String> = held.held().iter().map(|h| h.node_path().to_owned()).collect();
    let mut watchers = Vec::new();
    for path in &paths {
        let (_, _, watcher) = observer.get_and_watch_data(path).await.unwrap();
        watchers.push((path.clone(), watcher));
    }
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waits = Vec::new();
    for (path, watcher) in watchers {
        let order = order.clone();
        waits.push(tokio::spawn(async move {
            let event = watcher.changed().await;
            assert_eq!(event.event_type, zk::EventType::NodeDeleted);
            // Stamped with the deleted node's path, in the order the session's events arrive.
            order.lock().unwrap().push(path);
        }));
    }
    held.release().await.unwrap();
    for wait in waits {
        tokio::time::timeout(Duration::from_secs(10), wait).await.expect("deleted").unwrap();
    }
    let mut reversed = paths.clone();
    reversed.reverse();
    // Each release awaits its delete's confirmation before the next is sent: one order only.
    assert_eq!(*order.lock().unwrap(), reversed, "released newest first");
    for path in [&a, &b, &c] {
        assert!(semaphore_or_lock_nodes(&observer, path).await.is_empty());
    }
}

async fn client_b() -> zk::Client {
    client().await
}

/// Every node below a lock path, two levels deep (a semaphore mutex's `locks/` and `leases/`).
async fn semaphore_or_lock_nodes(client: &zk::Client, path: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    for child in children(client, path).await {
        let below = children(client, &format!("{path}/{child}")).await;
        if child == "locks" || child == "leases" {
            nodes.extend(below);
        } else {
            nodes.push(child);
        }
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_timeout_is_one_deadline_and_gives_back_what_it_took() {
    let (a, b, c) = (unique_path("multi-t-a"), unique_path("multi-t-b"), unique_path("multi-t-c"));
    let (client, other) = (client().await, client_b().await);
    // b is held elsewhere; a is free; c is held elsewhere too.
    let held_b = InterProcessMutex::new(other.clone(), &b).unwrap().acquire().await.unwrap();
    let held_c = InterProcessMutex::new(other.clone(), &c).unwrap().acquire().await.unwrap();
    let multi = InterProcessMultiLock::new(
        [&a, &b, &c].map(|path| InterProcessMutex::new(client.clone(), path.as_str()).unwrap()),
    );
    let started = Instant::now();
    assert!(multi.acquire_timeout(Duration::from_millis(600)).await.unwrap().is_none());
    let took = started.elapsed();
    // One deadline for the whole acquire: not 600 ms per lock waited for.
    assert!(took >= Duration::from_millis(600), "{took:?}");
    assert_within(took, Duration::from_millis(600) + Duration::from_millis(900) + SCHED_SLACK, "one deadline");
    // a was taken and given back before the timeout returned: its node is gone now, not later.
    assert!(children(&other, &a).await.is_empty(), "a still held after the timed-out multi acquire returned");
    // b and c: only the other session's node (ours were deleted with the timed-out attempt).
    assert_no_nodes_left_while_open(&other, &a, &[client.clone(), other.clone()], Duration::from_secs(10)).await;
    eventually(Duration::from_secs(10), "only the holders' nodes", || async {
        children(&other, &b).await.len() == 1 && children(&other, &c).await.len() == 1
    })
    .await;
    held_b.release().await.unwrap();
    held_c.release().await.unwrap();
    let all = multi.acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("all free");
    all.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_error_releases_the_rest_and_reports_every_failure() {
    let a = unique_path("multi-e-a");
    let client = client().await;
    // A lock path below an ephemeral node cannot have lock nodes: the second member fails.
    let ephemeral = format!("/multi-e-ephemeral-{}", uuid::Uuid::new_v4().simple());
    client.create(&ephemeral, b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let bad = format!("{ephemeral}/lock");
    let multi = InterProcessMultiLock::new(vec![
        InterProcessMutex::new(client.clone(), &a).unwrap(),
        InterProcessMutex::new(client.clone(), &bad).unwrap(),
    ]);
    match multi.acquire().await {
        Err(Error::MultiLock { failures }) => {
            assert_eq!(failures.len(), 1, "{failures:?}");
            assert_eq!(failures[0].0, bad);
            assert!(matches!(failures[0].1, Error::EphemeralParent { .. }), "{failures:?}");
        },
        other => panic!("expected a multi-lock error, got {other:?}"),
    }
    // The first lock was released before the error was returned.
    assert!(children(&client, &a).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_is_asked_for_and_advisory() {
    init_tracing();
    let path = unique_path("revoke");
    let (client, other) = (client().await, client_b().await);
    let mutex = InterProcessMutex::builder(client.clone(), &path).revocable(true).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    // Revocable nodes carry no data.
    assert!(client.get_data(guard.lock_path()).await.unwrap().0.is_empty());
    assert!(tokio::time::timeout(Duration::from_millis(300), guard.revoke_requested()).await.is_err());
    // Asked from another session, through a plain client.
    Revoker::attempt_revoke(&other, guard.lock_path()).await.unwrap();
    assert_eq!(client.get_data(guard.lock_path()).await.unwrap().0, b"__REVOKE__");
    tokio::time::timeout(Duration::from_secs(10), guard.revoke_requested()).await.expect("revocation seen");
    // It can be awaited again, and resolves again.
    tokio::time::timeout(Duration::from_secs(10), guard.revoke_requested()).await.expect("seen again");
    // Advisory: still held, never reported lost.
    assert!(tokio::time::timeout(Duration::from_millis(500), guard.lost()).await.is_err());
    assert_eq!(guard.state(), LockState::Held);
    assert!(InterProcessMutex::new(other.clone(), &path).unwrap().try_acquire().await.unwrap().is_none());
    let node = guard.lock_path().to_owned();
    guard.release().await.unwrap();
    // A node that is gone: Ok, nothing written.
    Revoker::attempt_revoke(&other, &node).await.unwrap();
    assert!(other.check_stat(&node).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_made_before_the_wait_counts_and_non_revocable_locks_never_resolve() {
    let path = unique_path("revoke-early");
    let client = client().await;
    let revocable = InterProcessMutex::builder(client.clone(), &path).revocable(true).build().unwrap();
    let guard = revocable.acquire().await.unwrap();
    Revoker::attempt_revoke(&client, guard.lock_path()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), guard.revoke_requested()).await.expect("an earlier request counts");
    guard.release().await.unwrap();

    let plain_path = unique_path("revoke-plain");
    let plain = InterProcessMutex::new(client.clone(), &plain_path).unwrap();
    let guard = plain.acquire().await.unwrap();
    Revoker::attempt_revoke(&client, guard.lock_path()).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(500), guard.revoke_requested()).await.is_err());
    guard.release().await.unwrap();

    // Node data and revocation exclude each other.
    assert!(matches!(
        InterProcessMutex::builder(client.clone(), &path).revocable(true).node_data(b"x".to_vec()).build(),
        Err(Error::InvalidArgument { .. })
    ));
}
