//! Review B (second review): managed client, re-entry, cancellation and bad input. The test
//! names are the review's (several name the defect each reproduced); each test's doc says what it
//! asserts.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{validate_lock_path, Error, InterProcessMutex};
use zookeeper_client as zk;

async fn ensure_tests_root(admin: &zk::Client) {
    let _ = admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
}

/// Asserts (README "Clear errors"): a lock path with a character outside the BMP (an emoji; the
/// Java server sees UTF-16 surrogates, which `PathUtils` rejects) is `Error::InvalidPath`, at build
/// or at acquire, and leaves no container parent behind.
#[tokio::test]
async fn non_bmp_lock_path_is_invalid_path_and_leaves_nothing() {
    let admin = client().await;
    ensure_tests_root(&admin).await;
    let root = unique_path("emoji");
    let path = format!("{root}/orders-\u{1F512}");
    let validated = validate_lock_path(&path);
    eprintln!("validate_lock_path({path:?}) = {validated:?}");
    // Refused at build (best) or at acquire: either way `Error::InvalidPath` and nothing left.
    let err = match InterProcessMutex::new(client().await, &path) {
        Err(err) => err,
        Ok(mutex) => {
            tokio::time::timeout(Duration::from_secs(10), mutex.acquire()).await.expect("no hang").unwrap_err()
        },
    };
    eprintln!("acquire error: {err:?}");
    tokio::time::sleep(Duration::from_secs(2)).await; // container cleanup runs every 500 ms
    let leftover = admin.check_stat(&root).await.unwrap();
    eprintln!("{root} still exists after 2 s: {}", leftover.is_some());
    assert!(matches!(err, Error::InvalidPath { .. }), "{err:?}");
    assert!(leftover.is_none(), "container parent {root} left behind");
}

/// Things that held up: a panic in the critical section, a cancelled scope, a guard moved out of
/// the scope through a channel (keeps the hold; the node goes with it), nested scopes of two
/// mutexes and of the same mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_edge_cases_hold_up() {
    let observer = client().await;
    let path = unique_path("scope-edges");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let other = InterProcessMutex::new(client().await, &path).unwrap();
    // Panic inside.
    let m = mutex.clone();
    let panicked = tokio::spawn(async move { m.with_lock(|_g| async { panic!("boom") }).await }).await;
    assert!(panicked.is_err());
    assert_no_nodes_left(&observer, &path).await;
    // Cancelled mid-way.
    let _ = tokio::time::timeout(Duration::from_millis(200), mutex.with_lock(|_g| std::future::pending::<()>())).await;
    assert_no_nodes_left(&observer, &path).await;
    // Moved out through a channel: still held after the scope, by that guard only.
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let inner = mutex.clone();
    mutex.with_lock(|_g| async move { tx.send(inner.acquire().await.unwrap()).await.unwrap() }).await.unwrap();
    let moved = rx.recv().await.unwrap();
    assert!(other.try_acquire().await.unwrap().is_none(), "lock free while a moved guard lives");
    assert_eq!(children(&observer, &path).await.len(), 1);
    drop(moved);
    assert_no_nodes_left(&observer, &path).await;
    // Nested: two mutexes, and the same mutex again.
    let path2 = unique_path("scope-edges-2");
    let second = InterProcessMutex::new(client().await, &path2).unwrap();
    let (m1, m2) = (mutex.clone(), second.clone());
    let tokens = mutex
        .with_lock(|g1| async move {
            let t1 = g1.fencing_token();
            m1.clone()
                .with_lock(|g1b| async move {
                    m2.with_lock(|g2| async move { (t1, g1b.fencing_token(), g2.fencing_token()) }).await.unwrap()
                })
                .await
                .unwrap()
        })
        .await
        .unwrap();
    assert_eq!(tokens.0, tokens.1);
    assert_no_nodes_left(&observer, &path).await;
    assert_no_nodes_left(&observer, &path2).await;
}

/// Asserts: under a chroot, a lock path whose first segment is `zookeeper` is accepted (the server
/// sees `<chroot>/zookeeper/...`, not the reserved tree).
#[tokio::test]
async fn zookeeper_segment_under_a_chroot_is_refused() {
    let server = zookeeper().await;
    let admin = client().await;
    ensure_tests_root(&admin).await;
    let root = unique_path("chroot-zk");
    admin.mkdir(&root, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let chrooted = zk::Client::connector().connect(&format!("{}{root}", server.connect_string())).await.unwrap();
    // The server is happy with that path under the chroot:
    chrooted.mkdir("/zookeeper/locks", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let built = InterProcessMutex::new(chrooted, "/zookeeper/locks");
    eprintln!("build: {:?}", built.as_ref().map(|_| ()));
    assert!(built.is_ok(), "valid chrooted path refused: {:?}", built.err());
    // Without a chroot the server reserves /zookeeper: still refused at build.
    let unchrooted = InterProcessMutex::new(admin, "/zookeeper/locks");
    assert!(matches!(unchrooted, Err(Error::InvalidPath { .. })), "{:?}", unchrooted.map(|_| ()));
}

/// Asserts: `build()`'s size check counts the client's chroot (which the client prepends to every
/// path): a lock `build()` accepts is accepted by the server too (not answered by dropping the
/// connection), and an unrelated hold on the same client stays `Held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_check_ignores_the_chroot() {
    init_tracing();
    let server = zookeeper().await;
    let admin = client().await;
    ensure_tests_root(&admin).await;
    let chroot = format!("{}/{}", unique_path("long-chroot"), "c".repeat(2000));
    admin.mkdir(&chroot, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let chrooted = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .connect(&format!("{}{chroot}", server.connect_string()))
        .await
        .unwrap();
    let other = InterProcessMutex::new(chrooted.clone(), "/other").unwrap();
    let held = other.acquire().await.unwrap();
    // The largest node data build() accepts for this path.
    let path = "/locks/big";
    let mut data_len = zk_recipes::DEFAULT_MAX_REQUEST_BYTES;
    let big = loop {
        match InterProcessMutex::builder(chrooted.clone(), path).node_data(vec![b'x'; data_len]).build() {
            Ok(mutex) => break mutex,
            Err(_) => data_len -= 1,
        }
    };
    eprintln!("build() accepts {data_len} bytes of node data under a {}-byte chroot", chroot.len());
    let outcome = tokio::time::timeout(Duration::from_secs(10), big.acquire()).await;
    let other_state = held.state();
    eprintln!(
        "acquire: {:?}; unrelated hold on the same client: {other_state:?}",
        outcome.as_ref().map(|r| r.as_ref().map(|g| g.lock_path().to_owned()))
    );
    assert!(matches!(outcome, Ok(Ok(_))), "a request build() accepted was not accepted by the server");
    assert_eq!(other_state, zk_recipes::LockState::Held, "an unrelated hold on the same client was lost");
}

/// Asserts (README "Re-entry": "every other acquire — another task ... — contends like another
/// process"): a task of a `LocalSet` driven inside a scope (`run_until`), which sees the scope's
/// task-local, does not re-enter the scope's hold; it queues.
#[tokio::test]
async fn local_task_driven_inside_a_scope_reenters() {
    let path = unique_path("localset");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let local = tokio::task::LocalSet::new();
    // Unrelated work, spawned before (and outside) any critical section.
    let unrelated = local.spawn_local({
        let mutex = mutex.clone();
        async move {
            let guard = mutex.acquire_timeout(Duration::from_millis(300)).await.unwrap();
            let reentered = guard.is_some();
            // It now works "under the lock", concurrently with the scope's own critical section.
            (reentered, guard.map(|g| g.fencing_token()))
        }
    });
    let (scope_token, unrelated_result) = mutex
        .with_lock(|guard| {
            let local = &local;
            async move {
                // Some helper inside the critical section drives the local set for a moment.
                let out = local.run_until(unrelated).await.unwrap();
                (guard.fencing_token(), out)
            }
        })
        .await
        .unwrap();
    eprintln!("scope token {scope_token}, unrelated local task: {unrelated_result:?}");
    assert!(!unrelated_result.0, "a task that is not the scope's re-entered its hold: two holders at once");
}

/// The scope's identity is the task polling it, also when that is a task (not `block_on`'s
/// future): inside a scope entered by a `LocalSet` task, acquires the scope's future joins
/// re-enter, and a task of another `LocalSet` it drives queues (times out here).
#[tokio::test]
async fn scope_entered_by_a_task_admits_its_own_futures_only() {
    let path = unique_path("task-scope");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let outer = tokio::task::LocalSet::new();
    let (scope_token, joined, driven) = outer
        .run_until(async move {
            tokio::task::spawn_local(async move {
                let inner = tokio::task::LocalSet::new();
                let driven = inner.spawn_local({
                    let mutex = mutex.clone();
                    async move {
                        mutex.acquire_timeout(Duration::from_millis(300)).await.unwrap().map(|g| g.fencing_token())
                    }
                });
                let m = mutex.clone();
                mutex
                    .with_lock(|guard| async move {
                        let (joined, driven) = tokio::join!(
                            async {
                                m.acquire_timeout(Duration::from_millis(300)).await.unwrap().map(|g| g.fencing_token())
                            },
                            inner.run_until(driven),
                        );
                        (guard.fencing_token(), joined, driven.unwrap())
                    })
                    .await
                    .unwrap()
            })
            .await
            .unwrap()
        })
        .await;
    eprintln!("scope {scope_token}, joined {joined:?}, driven local task {driven:?}");
    assert_eq!(joined, Some(scope_token), "a future joined by the scope's own task must re-enter");
    assert_eq!(driven, None, "a local task driven inside the scope re-entered its hold");
}

/// Asserts (README, Sessions: `try_acquire` "never waits"): while the managed client is
/// `Suspended` (connection down, no new session yet), `try_acquire` returns at once rather than
/// when the client library gives the session up (1.4 T).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_while_suspended_blocks_until_the_session_is_given_up() {
    use zk_recipes::{ConnectionState, ManagedClient};
    use zk_testcontainers::FaultProxy;
    let server = zookeeper().await;
    let observer = client().await;
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let zk = ManagedClient::builder(proxy.addr()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let path = unique_path("try-suspended");
    let mutex = InterProcessMutex::new(&zk, &path).unwrap();
    mutex.acquire().await.unwrap().release().await.unwrap();
    let mut states = zk.state_watcher();
    proxy.refuse(true);
    proxy.cut();
    assert_eq!(states.changed().await, Some(ConnectionState::Suspended));
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(20), mutex.try_acquire()).await;
    let blocked = started.elapsed();
    eprintln!(
        "try_acquire while Suspended: {:?} after {blocked:?}; state now {}",
        outcome.as_ref().map(|r| r.as_ref().map(|g| g.is_some())),
        zk.state()
    );
    // No session now: acquire_timeout returns at its timeout.
    let started = std::time::Instant::now();
    let timed = mutex.acquire_timeout(Duration::from_secs(1)).await;
    eprintln!(
        "acquire_timeout(1 s) with no session: {:?} after {:?}",
        timed.as_ref().map(|g| g.is_some()),
        started.elapsed()
    );
    proxy.refuse(false);
    let mut seen = Vec::new();
    while let Ok(Some(state)) = tokio::time::timeout(Duration::from_secs(20), states.changed()).await {
        seen.push(state);
        if state == ConnectionState::NewSession {
            break;
        }
    }
    eprintln!("states after the cut: Suspended, then {seen:?}");
    mutex.acquire().await.unwrap().release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
    assert!(blocked < Duration::from_secs(1), "try_acquire blocked {blocked:?} while the managed client was Suspended");
}

/// `try_acquire` waits for no connection either when it goes down mid-attempt: the create is
/// applied, its reply lost with the connection, and no new connection is possible. It returns
/// `Ok(None)` at once, and the node the server did create is deleted once the session is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_gives_up_when_the_connection_drops_mid_attempt() {
    use zk_recipes::{ConnectionState, ManagedClient};
    use zk_testcontainers::{op, FaultProxy};
    let server = zookeeper().await;
    let observer = client().await;
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let zk = ManagedClient::builder(proxy.addr()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let path = unique_path("try-drop");
    let mutex = InterProcessMutex::new(&zk, &path).unwrap();
    mutex.acquire().await.unwrap().release().await.unwrap();
    let mut states = zk.state_watcher();
    proxy.refuse(true);
    proxy.drop_reply_to_next(&[op::CREATE, op::CREATE2]);
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(20), mutex.try_acquire()).await;
    let blocked = started.elapsed();
    eprintln!(
        "try_acquire with its create's reply lost: {:?} after {blocked:?}",
        outcome.as_ref().map(|r| r.as_ref().map(|g| g.is_some()))
    );
    assert!(!proxy.drop_reply_armed(), "the create never reached the server");
    assert!(matches!(outcome, Ok(Ok(None))), "{:?}", outcome.map(|r| r.map(|g| g.is_some())));
    assert!(blocked < Duration::from_secs(1), "try_acquire blocked {blocked:?} with the connection down");
    assert_eq!(states.changed().await, Some(ConnectionState::Suspended));
    proxy.refuse(false);
    assert_eq!(states.changed().await, Some(ConnectionState::Reconnected));
    // The node the server created for the lost reply is found by its GUID and deleted.
    assert_no_nodes_left(&observer, &path).await;
    mutex.acquire().await.unwrap().release().await.unwrap();
}

/// Asserts (README "No leaked nodes"): acquires cancelled at every point while the lock path's
/// missing parents are being created leave no container parent behind (a container that never
/// had a child is never removed by ZooKeeper, so the parents are created with the lock node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquire_leaves_container_parents_forever() {
    let admin = client().await;
    ensure_tests_root(&admin).await;
    let contender = client().await;
    let mut roots = Vec::new();
    for trial in 0..40u64 {
        let root = unique_path("cancel-dir");
        let mutex = InterProcessMutex::new(contender.clone(), format!("{root}/a/b/c")).unwrap();
        // Cancel somewhere inside the acquire (a few round trips on loopback).
        let cancel_after = Duration::from_micros(300 + 150 * trial);
        let _ = tokio::time::timeout(cancel_after, mutex.acquire()).await;
        roots.push(root);
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // several container-cleanup rounds
    let mut leaked = Vec::new();
    for root in &roots {
        if admin.check_stat(root).await.unwrap().is_some() {
            let mut nodes = Vec::new();
            for sub in ["", "/a", "/a/b", "/a/b/c"] {
                if let Some(stat) = admin.check_stat(&format!("{root}{sub}")).await.unwrap() {
                    nodes.push(format!("{root}{sub} (children {}, cversion {})", stat.num_children, stat.cversion));
                }
            }
            leaked.push(nodes);
        }
    }
    eprintln!(
        "{} of {} cancelled acquires left container nodes behind, e.g. {:?}",
        leaked.len(),
        roots.len(),
        leaked.first()
    );
    assert!(leaked.is_empty(), "{} lock directories leaked", leaked.len());
}
