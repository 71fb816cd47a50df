//! Review N: a held lock's own-node watch (9cb8043: it keeps the hold's `Weak` feed and the
//! client's watcher while waiting, is set anew from the feed, and watches a node its session may
//! not read through the node's directory, remembering that across re-arms). Checked: it is set
//! again after a data change (both when the acquire set it and when the hold did), a deletion
//! while the connection is down is heard after the reconnection (data watch and directory watch
//! alike), and a released hold watched through its directory stops listing the directory.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockState, LossPolicy, LossReason};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// A client whose traffic goes through a fault proxy (which also counts its requests).
async fn proxied_client() -> (FaultProxy, zk::Client) {
    let zk = zookeeper().await;
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let client =
        zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");
    (proxy, client)
}

fn count(proxy: &FaultProxy, ops: &[i32]) -> u64 {
    let requests = proxy.requests();
    ops.iter().map(|op| requests.get(op).copied().unwrap_or(0)).sum()
}

const LISTINGS: &[i32] = &[op::GET_CHILDREN, op::GET_CHILDREN2];

/// A directory anyone may list (its own top-level path: `tests/recipes/acl.rs` notes why), and ACLs
/// for lock nodes that leave out READ.
async fn readable_dir_unreadable_nodes(observer: &zk::Client, name: &str) -> (String, Vec<zk::Acl>) {
    let path = unique_path(name).replace("/zkr-tests/", "/zkr-tests-");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&path, &[], &persistent).await.unwrap();
    let no_read = vec![zk::Acl::new(
        zk::Permission::WRITE | zk::Permission::CREATE | zk::Permission::DELETE | zk::Permission::ADMIN,
        zk::AuthId::anyone(),
    )];
    (path, no_read)
}

/// Changes of the held node's data fire its watch (`NodeDataChanged`), which is set again each
/// time: the hold stays `Held`, and a deletion after several changes is still heard. Both for a
/// watch the hold set itself (an uncontended acquire, first `state()`) and one the acquire set
/// while waiting (handed to the hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_node_watch_is_set_again_after_data_changes() {
    let observer = client().await;
    for contended in [false, true] {
        let path = unique_path("review-n-data-changes");
        let (proxy, holder_client) = proxied_client().await;
        let mutex =
            InterProcessMutex::builder(holder_client, &path).acls(zk::Acls::anyone_all().to_vec()).build().unwrap();
        // Counted before the acquire: the hold sets the watch 100 ms after the grant, which on a
        // loaded machine can be before the acquire's caller runs again.
        let gets = count(&proxy, &[op::GET_DATA]);
        let guard = if contended {
            let other = InterProcessMutex::new(observer.clone(), &path).unwrap();
            let first = other.acquire().await.unwrap();
            let waiter = tokio::spawn(async move { mutex.acquire().await.unwrap() });
            tokio::time::sleep(Duration::from_millis(300)).await;
            first.release().await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap()
        } else {
            mutex.acquire().await.unwrap()
        };
        assert_eq!(guard.state(), LockState::Held);
        let node = guard.lock_path().to_owned();
        // The watch is set (a `getData` on the node) by now or shortly.
        if !contended {
            eventually(Duration::from_secs(10), "the hold's own-node watch set", || async {
                count(&proxy, &[op::GET_DATA]) > gets
            })
            .await;
        }
        for i in 0..3u32 {
            let before = count(&proxy, &[op::GET_DATA]);
            // The change fires the watch; it is set again with another `getData`. (A change the
            // server applies before it has set the previous watch fires nothing: changed again
            // until a watch is set anew.)
            let mut tries = 0;
            while count(&proxy, &[op::GET_DATA]) == before {
                tries += 1;
                assert!(tries <= 20, "contended {contended}: watch never set again after change {i}");
                observer.set_data(&node, format!("{i}-{tries}").as_bytes(), None).await.unwrap();
                for _ in 0..40 {
                    if count(&proxy, &[op::GET_DATA]) > before {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
            assert_eq!(guard.state(), LockState::Held, "contended {contended}: a data change is no loss");
        }
        // The last `getData`'s reply (the watch set) before the deletion, or not: either way heard.
        observer.delete(&node, None).await.unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost()).await;
        assert_eq!(lost.ok(), Some(LossReason::NodeDeleted), "contended {contended}: deletion after data changes");
        drop(guard);
        assert_no_nodes_left(&observer, &path).await;
    }
}

/// Our node is deleted by someone else while our connection is down (same session): once the
/// client reconnects and sets its watches again, the hold is told `Lost(NodeDeleted)` — through
/// a data watch on a readable node, and through the directory's children watch on a node the
/// session may not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_node_deleted_while_disconnected_is_heard_after_reconnecting() {
    let observer = client().await;
    for readable in [true, false] {
        let (path, acls) = if readable {
            (unique_path("review-n-deleted-offline"), zk::Acls::anyone_all().to_vec())
        } else {
            readable_dir_unreadable_nodes(&observer, "review-n-deleted-offline-unreadable").await
        };
        let (proxy, holder_client) = proxied_client().await;
        // `SessionDeadline`: a short disconnection only suspends the hold.
        let mutex = InterProcessMutex::builder(holder_client, &path)
            .acls(acls)
            .loss_policy(LossPolicy::SessionDeadline)
            .build()
            .unwrap();
        let guard = mutex.acquire().await.unwrap();
        let node = guard.lock_path().to_owned();
        let (ops, what): (&[i32], _) = if readable { (&[op::GET_DATA], "data") } else { (LISTINGS, "directory") };
        let before = count(&proxy, ops);
        assert_eq!(guard.state(), LockState::Held);
        eventually(Duration::from_secs(10), &format!("the {what} watch set"), || async { count(&proxy, ops) > before })
            .await;
        // Give the watch's reply time to arrive before the connection goes.
        tokio::time::sleep(Duration::from_millis(300)).await;

        proxy.refuse(true);
        proxy.cut();
        eventually(Duration::from_secs(10), "holder suspended", || async { guard.state() == LockState::Suspended })
            .await;
        observer.delete(&node, None).await.unwrap();
        proxy.refuse(false);
        let lost = tokio::time::timeout(Duration::from_secs(15), guard.lost()).await;
        assert_eq!(
            lost.ok(),
            Some(LossReason::NodeDeleted),
            "{what} watch: a deletion while disconnected must be heard (state {:?})",
            guard.state()
        );
        drop(guard);
        assert_no_nodes_left(&observer, &path).await;
    }
}

/// A released hold whose node was watched through its directory stops watching: the directory's
/// later changes make its session list it no more (the driver's future for it has ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_hold_watched_through_its_directory_stops_listing_it() {
    let observer = client().await;
    let (path, no_read) = readable_dir_unreadable_nodes(&observer, "review-n-released-unreadable").await;
    let (proxy, holder_client) = proxied_client().await;
    let mutex = InterProcessMutex::builder(holder_client, &path).acls(no_read).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    let listed = count(&proxy, LISTINGS);
    assert_eq!(guard.state(), LockState::Held);
    eventually(Duration::from_secs(10), "the directory watch set", || async { count(&proxy, LISTINGS) > listed }).await;

    // A sibling's coming: the watch fires and is set again (another listing), still held.
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let sibling = format!("{path}/not-a-lock");
    let listed = count(&proxy, LISTINGS);
    observer.create(&sibling, &[], &persistent).await.unwrap();
    eventually(Duration::from_secs(10), "the directory watch set again", || async { count(&proxy, LISTINGS) > listed })
        .await;
    observer.delete(&sibling, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(guard.state(), LockState::Held);

    guard.release().await.unwrap();
    eventually(Duration::from_secs(10), "our node deleted", || async { children(&observer, &path).await.is_empty() })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = count(&proxy, LISTINGS);
    for _ in 0..5 {
        observer.create(&sibling, &[], &persistent).await.unwrap();
        observer.delete(&sibling, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // At most the one listing our own delete may still cause (late under load); a watch still
    // set would list the directory again on (nearly) every change.
    let after = count(&proxy, LISTINGS) - listed;
    assert!(after <= 1, "a released hold's directory watch kept listing: {after} listings after release");
}
