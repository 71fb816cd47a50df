//! Review M: the fencing token of a hold whose node was created in one `multi` with its directory
//! (`created_with_directory`, b19ca63) is the node's real czxid — for every recipe that creates
//! nodes through the engine's `create`, under chroots, below several missing levels, with a
//! lock-delay (persistent directory), and when the `multi`'s or the listing's reply is lost.
//!
//! Every check compares the token with the czxid a raw client reads from the node itself: a token
//! taken from another directory instance, another node or a stale listing would differ.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{
    InterProcessMutex, InterProcessReadWriteLock, InterProcessSemaphoreMutex, InterProcessSemaphoreV2, LeaderLatch,
};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

async fn parent(raw: &zk::Client, name: &str) -> String {
    let parent = unique_path(name);
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    parent
}

/// The czxid of the node at `path` (a full server path), read by a raw client.
async fn czxid(raw: &zk::Client, path: &str) -> i64 {
    raw.get_data(path).await.unwrap_or_else(|err| panic!("read {path}: {err}")).1.czxid
}

/// The directory of `node` was created by the same `multi` as `node` (same czxid): the case
/// `created_with_directory` covers. Asserted so that a test meant to hit that path cannot pass
/// without hitting it.
async fn assert_created_with_directory(raw: &zk::Client, node: &str) {
    let dir = &node[..node.rfind('/').unwrap()];
    let (node_czxid, dir_czxid) = (czxid(raw, node).await, czxid(raw, dir).await);
    assert_eq!(node_czxid, dir_czxid, "{node} was not created together with its directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_tokens_on_new_paths_are_the_nodes_czxid() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-mutex").await;
    let session = client().await;
    let chrooted = client().await.chroot(parent.as_str()).unwrap();
    // (client, lock path as that client names it, server prefix)
    let cases: Vec<(zk::Client, String, String)> = vec![
        (session.clone(), format!("{parent}/one"), String::new()),
        (session.clone(), format!("{parent}/a/b/c/nested"), String::new()),
        (chrooted.clone(), "/chrooted".to_owned(), parent.clone()),
        (chrooted.clone(), "/x/y/chrooted-nested".to_owned(), parent.clone()),
    ];
    for (client, path, prefix) in cases {
        let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
        let guard = mutex.acquire().await.unwrap();
        let node = format!("{prefix}{}", guard.lock_path());
        assert_created_with_directory(&raw, &node).await;
        assert_eq!(guard.fencing_token().as_i64(), czxid(&raw, &node).await, "{path}");
        guard.release().await.unwrap();
        // The next holder (the directory exists now, unless reaped) has a larger token.
        let again = mutex.acquire().await.unwrap();
        let node2 = format!("{prefix}{}", again.lock_path());
        assert_eq!(again.fencing_token().as_i64(), czxid(&raw, &node2).await, "{path} second");
        again.release().await.unwrap();
    }
    // The same new path under a chroot and without one, first acquire by the chrooted client.
    let path = "/shared-new";
    let chroot_mutex = InterProcessMutex::new(chrooted.clone(), path).unwrap();
    let plain_mutex = InterProcessMutex::new(session.clone(), format!("{parent}{path}")).unwrap();
    let first = chroot_mutex.acquire().await.unwrap();
    let node = format!("{parent}{}", first.lock_path());
    assert_eq!(first.fencing_token().as_i64(), czxid(&raw, &node).await);
    assert!(plain_mutex.try_acquire().await.unwrap().is_none(), "granted beside the chrooted holder");
    first.release().await.unwrap();
    let second = plain_mutex.acquire_timeout(Duration::from_secs(10)).await.unwrap().unwrap();
    assert_eq!(second.fencing_token().as_i64(), czxid(&raw, second.lock_path()).await);
    second.release().await.unwrap();
    assert_no_nodes_left_while_open(&raw, &format!("{parent}{path}"), &[session, chrooted], Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_and_timeout_tokens_on_new_paths() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-try").await;
    let session = client().await;
    for (i, path) in [format!("{parent}/t"), format!("{parent}/u/v")].into_iter().enumerate() {
        let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
        let guard = if i == 0 {
            mutex.try_acquire().await.unwrap().expect("a new path is free")
        } else {
            mutex.acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("a new path is free")
        };
        assert_created_with_directory(&raw, guard.lock_path()).await;
        assert_eq!(guard.fencing_token().as_i64(), czxid(&raw, guard.lock_path()).await, "{path}");
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_token_on_a_new_path() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-delay").await;
    let session = client().await;
    for path in [format!("{parent}/d"), format!("{parent}/e/f")] {
        let mutex =
            InterProcessMutex::builder(session.clone(), &path).lock_delay(Duration::from_millis(200)).build().unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(20), mutex.acquire()).await.unwrap().unwrap();
        assert_created_with_directory(&raw, guard.lock_path()).await;
        assert_eq!(guard.fencing_token().as_i64(), czxid(&raw, guard.lock_path()).await, "{path}");
        let (_, dir) = raw.get_data(&path).await.unwrap();
        assert_eq!(dir.ephemeral_owner, 0);
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock_tokens_on_new_paths() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-rw").await;
    let session = client().await;
    let other = client().await;
    // Read first on one new path, write first on another.
    let rw = InterProcessReadWriteLock::new(session.clone(), format!("{parent}/r/w")).unwrap();
    let read = rw.read_lock().acquire().await.unwrap();
    assert_created_with_directory(&raw, read.lock_path()).await;
    assert_eq!(read.fencing_token().as_i64(), czxid(&raw, read.lock_path()).await);
    // A second reader on another session shares it.
    let rw2 = InterProcessReadWriteLock::new(other.clone(), format!("{parent}/r/w")).unwrap();
    let read2 = rw2.read_lock().acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("readers share");
    assert_eq!(read2.fencing_token().as_i64(), czxid(&raw, read2.lock_path()).await);
    assert!(rw2.write_lock().try_acquire().await.unwrap().is_none(), "a writer beside readers");
    read.release().await.unwrap();
    read2.release().await.unwrap();

    let rw = InterProcessReadWriteLock::new(session.clone(), format!("{parent}/w")).unwrap();
    let write = rw.write_lock().acquire().await.unwrap();
    assert_created_with_directory(&raw, write.lock_path()).await;
    assert_eq!(write.fencing_token().as_i64(), czxid(&raw, write.lock_path()).await);
    let rw2 = InterProcessReadWriteLock::new(other.clone(), format!("{parent}/w")).unwrap();
    assert!(rw2.read_lock().try_acquire().await.unwrap().is_none(), "a reader beside a writer");
    write.release().await.unwrap();
    for dir in [format!("{parent}/r/w"), format!("{parent}/w")] {
        assert_no_nodes_left_while_open(&raw, &dir, &[session.clone(), other.clone()], Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_and_leader_tokens_on_new_paths() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-sem").await;
    let session = client().await;
    let chrooted = client().await.chroot(parent.as_str()).unwrap();

    let semaphore = InterProcessSemaphoreV2::new(session.clone(), format!("{parent}/s/new"), 3).unwrap();
    let leases = semaphore.acquire_many(3).await.unwrap();
    for lease in &leases {
        assert_eq!(lease.fencing_token().as_i64(), czxid(&raw, lease.node_path()).await, "{}", lease.node_path());
    }
    assert_created_with_directory(&raw, leases[0].node_path()).await;
    assert!(semaphore.acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none(), "a fourth lease of three");
    for lease in leases {
        lease.release().await.unwrap();
    }

    let chrooted_semaphore = InterProcessSemaphoreV2::new(chrooted.clone(), "/cs/new", 1).unwrap();
    let lease = chrooted_semaphore.acquire().await.unwrap();
    let node = format!("{parent}{}", lease.node_path());
    assert_created_with_directory(&raw, &node).await;
    assert_eq!(lease.fencing_token().as_i64(), czxid(&raw, &node).await);
    lease.release().await.unwrap();

    let semaphore_mutex = InterProcessSemaphoreMutex::new(session.clone(), format!("{parent}/sm")).unwrap();
    let lease = semaphore_mutex.acquire().await.unwrap();
    assert_eq!(lease.fencing_token().as_i64(), czxid(&raw, lease.node_path()).await);
    lease.release().await.unwrap();

    let latch = LeaderLatch::new(session.clone(), format!("{parent}/leader/new")).unwrap();
    let guard = latch.acquire_once().await.unwrap();
    assert_created_with_directory(&raw, guard.lock_path()).await;
    assert_eq!(guard.fencing_token().as_i64(), czxid(&raw, guard.lock_path()).await);
    guard.release().await.unwrap();
}

/// The `multi`'s reply is lost (applied; the connection cut before its reply): the node is found
/// by its GUID, and the token is its czxid; the listing's reply lost instead (behind the plain
/// create, or behind the `multi`): same. Exactly one node of ours, none left afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_on_a_new_path_keep_the_token_right() {
    let raw = client().await;
    let parent = parent(&raw, "rm-token-lost").await;
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let faults: &[(&str, &[i32], usize)] = &[
        ("multi", &[op::MULTI], 0),
        ("first listing", &[op::GET_CHILDREN2], 0),
        ("listing behind the multi", &[op::GET_CHILDREN2], 1),
        ("create", &[op::CREATE2], 0),
    ];
    for (i, (what, codes, skip)) in faults.iter().enumerate() {
        for nested in [false, true] {
            let path = if nested { format!("{parent}/n{i}/x") } else { format!("{parent}/p{i}") };
            let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
            let arm = {
                let proxy = &proxy;
                async move {
                    // Skip the first `skip` requests of these codes (counted at the proxy).
                    let target: u64 =
                        codes.iter().map(|c| proxy.requests().get(c).copied().unwrap_or(0)).sum::<u64>() + *skip as u64;
                    if *skip == 0 {
                        proxy.drop_reply_to_next(codes);
                        return;
                    }
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while std::time::Instant::now() < deadline {
                        let seen: u64 = codes.iter().map(|c| proxy.requests().get(c).copied().unwrap_or(0)).sum();
                        if seen >= target {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    if std::time::Instant::now() < deadline {
                        proxy.drop_reply_to_next(codes);
                    }
                }
            };
            // With skip > 0 arming races the acquire: the point is chaos around the multi, and the
            // token check below holds whatever was lost.
            let (guard, ()) = tokio::join!(
                async { tokio::time::timeout(Duration::from_secs(30), mutex.acquire()).await.expect("no hang") },
                arm
            );
            let guard = guard.unwrap_or_else(|err| panic!("{what} {path}: {err:?}"));
            proxy.drop_reply_to_next(&[]);
            let listed = children(&raw, &path).await;
            assert_eq!(listed.len(), 1, "{what} {path}: one node of ours: {listed:?}");
            assert_eq!(
                guard.fencing_token().as_i64(),
                czxid(&raw, guard.lock_path()).await,
                "{what} {path}: the token is the node's czxid"
            );
            guard.release().await.unwrap();
            assert_no_nodes_left_while_open(&raw, &path, std::slice::from_ref(&session), Duration::from_secs(10)).await;
        }
    }
}
