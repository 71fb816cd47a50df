//! Review L: the shared listing (`engine/listing.rs`, `Setup`) is chosen by its *content* — "a
//! listing that contains our node" — and the doc claims "Our GUID is in our node's name, so a
//! listing that contains it is of our directory instance".
//!
//! But one attempt keeps its GUID when it creates again after its node was deleted
//! (`OnSession::attempt`: the protection is chosen once, `Turn::NodeGone` loops to `create`), and
//! a directory that was deleted and re-created starts its sequence counter at 0 again. So an
//! attempt can create, in the new directory, a node with *exactly* the name its previous node had
//! in the old one. `Setup::listing_for` step 1 then takes the process's `latest` listing — of the
//! OLD directory instance — as "showing our node", and the waiter decides from a listing that
//! never saw the new directory's nodes ahead of it.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

async fn via(proxy: &FaultProxy) -> zk::Client {
    let connector = zookeeper().await.connector().with_session_timeout(Duration::from_secs(30));
    connector.connect(&proxy.addr()).await.expect("connect through the proxy")
}

fn creates(proxy: &FaultProxy) -> u64 {
    proxy.requests().get(&op::CREATE2).copied().unwrap_or(0)
}

/// A waiter whose node an operator deleted creates again, with the same GUID, in the directory
/// re-created meanwhile, where a Curator holder (`_c_<uuid>-lock-0000000000`) holds the lock. It
/// must wait for that holder; it must not decide from the old directory's listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_the_old_directory_instance_is_not_taken_for_ours() {
    init_tracing();
    let raw = client().await;
    let path = unique_path("rl-reuse");
    let anyone = zk::Acls::anyone_all();
    let persistent = zk::CreateMode::Persistent.with_acls(anyone);
    let container = zk::CreateMode::Container.with_acls(anyone);
    let ephemeral_seq = zk::CreateMode::EphemeralSequential.with_acls(anyone);
    raw.mkdir("/zkr-tests", &persistent).await.unwrap();

    // D1, with a node P (another process's waiter or holder) at sequence 0.
    raw.create(&path, b"", &container).await.unwrap();
    let p = format!("_c_{}-lock-", uuid::Uuid::new_v4());
    let (_, p_seq) = raw.create(&format!("{path}/{p}"), b"", &ephemeral_seq).await.unwrap();
    assert_eq!(p_seq.into_i64(), 0);
    let p = format!("{p}{p_seq}");

    // B: an acquire of the same lock in this process that stays setting up (its create is held up
    // 10 s on its way, under the client's 12 s reply timeout), so that A's acquires share
    // listings (`Setup`).
    let proxy_b = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session_b = via(&proxy_b).await;
    proxy_b.delay_requests(&[op::CREATE2, op::MULTI], Duration::from_secs(10));
    let mutex_b = InterProcessMutex::new(session_b.clone(), &path).unwrap();
    let task_b = tokio::spawn(async move {
        let guard = mutex_b.acquire().await?;
        guard.release().await
    });
    eventually(Duration::from_secs(5), "B's create reached its proxy", || async { creates(&proxy_b) == 1 }).await;

    // A: queues behind P in D1 (sequence 1), lists, waits.
    let proxy_a = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session_a = via(&proxy_a).await;
    let mutex_a = InterProcessMutex::new(session_a.clone(), &path).unwrap();
    let a_granted = Arc::new(AtomicBool::new(false));
    let task_a = {
        let a_granted = a_granted.clone();
        tokio::spawn(async move {
            let guard = mutex_a.acquire().await.expect("A acquires");
            a_granted.store(true, Ordering::SeqCst);
            guard
        })
    };
    eventually(Duration::from_secs(5), "A's node in D1", || async { children(&raw, &path).await.len() == 2 }).await;
    let a_first = children(&raw, &path).await.into_iter().find(|name| *name != p).unwrap();
    assert!(a_first.ends_with("-lock-0000000001"), "{a_first}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!a_granted.load(Ordering::SeqCst), "A waits for P");

    // An operator deletes A's node; A creates again (same GUID) — held up 3 s on its way, during
    // which D1 empties, is deleted, and is re-created (D2) with a Curator holder Q at sequence 0.
    proxy_a.delay_requests(&[op::CREATE2], Duration::from_secs(3));
    let before = creates(&proxy_a);
    raw.delete(&format!("{path}/{a_first}"), None).await.unwrap();
    eventually(Duration::from_secs(5), "A creates again", || async { creates(&proxy_a) > before }).await;
    proxy_a.delay_requests(&[], Duration::ZERO);
    raw.delete(&format!("{path}/{p}"), None).await.unwrap();
    // Empty now, D1 may already be gone: the server reaps empty containers every 500 ms here
    // (review Y).
    match raw.delete(&path, None).await {
        Ok(()) | Err(zk::Error::NoNode) => {},
        Err(err) => panic!("delete D1: {err}"),
    }
    raw.create(&path, b"", &container).await.unwrap();
    let q = format!("_c_{}-lock-", uuid::Uuid::new_v4());
    let (_, q_seq) = raw.create(&format!("{path}/{q}"), b"", &ephemeral_seq).await.unwrap();
    assert_eq!(q_seq.into_i64(), 0);
    let q = format!("{q}{q_seq}");

    // A's new node in D2 has the very name its node in D1 had.
    eventually(Duration::from_secs(10), "A's node in D2", || async { children(&raw, &path).await.len() == 2 }).await;
    let a_second = children(&raw, &path).await.into_iter().find(|name| *name != q).unwrap();
    eprintln!("A's node in D1: {a_first}; in D2: {a_second}; Q holds with {q}");

    // Q holds the lock (first in D2): A must not be granted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let granted_beside_q = a_granted.load(Ordering::SeqCst);
    eprintln!("A granted while Q holds: {granted_beside_q}");
    proxy_b.delay_requests(&[], Duration::ZERO);
    // Clean up before asserting (Q released: A, then B, get the lock).
    raw.delete(&format!("{path}/{q}"), None).await.unwrap();
    let guard_a = tokio::time::timeout(Duration::from_secs(10), task_a).await.expect("A acquires after Q").unwrap();
    guard_a.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(40), task_b).await.expect("B ends").unwrap().expect("B acquires");
    assert!(
        !granted_beside_q,
        "A ({a_second}) was granted while Q ({q}, sequence 0) holds the lock in the re-created directory: \
         it decided from the old directory's listing, which shows a node of the same name"
    );
    assert_no_nodes_left_while_open(&raw, &path, &[session_a, session_b], Duration::from_secs(10)).await;
}
