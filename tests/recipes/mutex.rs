//! InterProcessMutex against a real ZooKeeper: exclusion, fairness, re-entrancy, timeouts,
//! cancellation, cleanup, foreign children, participants and invalid input.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use zk_recipes::{Error, InterProcessMutex, LockGuard};
use zookeeper_client as zk;

#[test]
fn public_types_are_send_sync_static() {
    fn assert_send_sync_static<T: Send + Sync + 'static>() {}
    assert_send_sync_static::<InterProcessMutex>();
    assert_send_sync_static::<LockGuard>();
    assert_send_sync_static::<Error>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_4_sessions_x_4_tasks() {
    init_tracing();
    let path = unique_path("exclusion");
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        for _ in 0..4 {
            let (mutex, holders, violations, acquisitions, counter) =
                (mutex.clone(), holders.clone(), violations.clone(), acquisitions.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let guard = mutex.acquire().await.unwrap();
                    if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    // An unsynchronised read-yield-write: a lost update means two holders.
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    holders.fetch_sub(1, Ordering::SeqCst);
                    acquisitions.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(acquisitions.load(Ordering::SeqCst), 4 * 4 * 8);
    assert_eq!(counter.load(Ordering::SeqCst), 4 * 4 * 8, "lost updates");
    assert_no_nodes_left(&client().await, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_follow_queue_order() {
    let path = unique_path("fifo");
    let observer = client().await;
    let holder = InterProcessMutex::new(client().await, &path).unwrap();
    let held = holder.acquire().await.unwrap();
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut queue = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let mutex = InterProcessMutex::builder(client().await, &path).node_data(format!("w{i}")).build().unwrap();
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.acquire().await.unwrap();
            grants.lock().unwrap().push(guard.sequence());
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.release().await.unwrap();
        }));
        // Wait until this waiter is queued, so the queue order is the spawn order.
        eventually(Duration::from_secs(10), "waiter queued", || async {
            holder.participants().await.unwrap().len() == i + 2
        })
        .await;
        let participants = holder.participants().await.unwrap();
        let last = participants.last().unwrap();
        assert_eq!(last.data, format!("w{i}").into_bytes());
        queue.push(last.sequence);
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
    }
    assert_eq!(*grants.lock().unwrap(), queue, "grant order differs from queue order");
    assert_no_nodes_left(&observer, &path).await;
}

#[tokio::test]
async fn reentrant_three_deep() {
    let path = unique_path("reentrant");
    let observer = client().await;
    let owner = client().await;
    let mutex = InterProcessMutex::new(owner.clone(), &path).unwrap();
    assert!(!mutex.is_acquired_in_this_process());
    assert!(!mutex.is_held_in_current_scope());
    let (mutex_ref, observer_ref, path_ref) = (&mutex, &observer, &path);
    let node = mutex
        .with_lock(|first| async move {
            let (mutex, observer, path) = (mutex_ref, observer_ref, path_ref);
            let second = mutex.acquire().await.unwrap();
            let third = mutex.try_acquire().await.unwrap().expect("re-entry never waits");
            assert_eq!(first.lock_path(), second.lock_path());
            assert_eq!(first.lock_path(), third.lock_path());
            assert_eq!(first.fencing_token(), third.fencing_token());
            assert!(mutex.is_held_in_current_scope());
            assert!(mutex.is_acquired_in_this_process());
            assert_eq!(children(observer, path).await.len(), 1, "re-entry must not create nodes");
            let node = first.lock_path().to_owned();
            third.release().await.unwrap();
            drop(first);
            assert!(observer.check_stat(&node).await.unwrap().is_some(), "node deleted before last release");
            second.release().await.unwrap();
            assert!(observer.check_stat(&node).await.unwrap().is_some(), "node deleted while the scope holds it");
            node
        })
        .await
        .unwrap();
    // with_lock sent the delete before returning: a read on the same session comes after it.
    // (Another session's read has no such order: the observer only sees it eventually.)
    assert!(owner.check_stat(&node).await.unwrap().is_none(), "node left after the scope ended");
    assert!(!mutex.is_held_in_current_scope());
    assert!(!mutex.is_acquired_in_this_process());
    assert_no_nodes_left(&observer, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tasks_on_the_same_mutex_contend() {
    let path = unique_path("tasks");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let other = mutex.clone();
    let blocked = tokio::spawn(async move {
        assert!(!other.is_held_in_current_scope());
        assert!(other.is_acquired_in_this_process());
        assert!(other.try_acquire().await.unwrap().is_none());
        assert!(other.acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    });
    blocked.await.unwrap();

    let other = mutex.clone();
    let waiter = tokio::spawn(async move {
        let guard = other.acquire().await.unwrap();
        assert!(other.is_acquired_in_this_process());
        guard.fencing_token()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "another task got the lock while we hold it");
    let ours = guard.fencing_token();
    guard.release().await.unwrap();
    let theirs = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert!(theirs > ours, "fencing tokens must increase: {ours} then {theirs}");
}

#[tokio::test]
async fn guard_released_from_another_task() {
    let path = unique_path("moved");
    let observer = client().await;
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    tokio::spawn(async move { guard.release().await.unwrap() }).await.unwrap();
    assert!(!mutex.is_acquired_in_this_process());
    assert!(children(&observer, &path).await.is_empty());
}

#[tokio::test]
async fn try_acquire_and_timeout() {
    let path = unique_path("try");
    let observer = client().await;
    let a = InterProcessMutex::new(client().await, &path).unwrap();
    let b = InterProcessMutex::new(client().await, &path).unwrap();

    let held = a.try_acquire().await.unwrap().expect("free lock");
    assert!(b.try_acquire().await.unwrap().is_none());
    assert_eq!(children(&observer, &path).await.len(), 1, "try_acquire left its node behind");

    let start = Instant::now();
    assert!(b.acquire_timeout(Duration::from_millis(400)).await.unwrap().is_none());
    assert!(start.elapsed() >= Duration::from_millis(400));
    eventually(Duration::from_secs(10), "timed-out node removed", || async {
        children(&observer, &path).await.len() == 1
    })
    .await;

    held.release().await.unwrap();
    let got = b.acquire_timeout(Duration::from_secs(5)).await.unwrap().expect("free lock within timeout");
    got.release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
}

#[tokio::test]
async fn dropped_guard_releases() {
    let path = unique_path("dropped");
    let a = InterProcessMutex::new(client().await, &path).unwrap();
    let b = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = a.acquire().await.unwrap();
    let waiter = tokio::spawn(async move { b.acquire().await.map(|g| g.fencing_token()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(guard);
    assert!(!a.is_acquired_in_this_process());
    tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("waiter granted").unwrap().unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// Acquires are cancelled at random points (during create, while queued, right as they are
/// granted); no trial may leave a node behind and the lock must stay usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_random_points_leaves_no_nodes() {
    let path = unique_path("cancel");
    let observer = client().await;
    let holder = InterProcessMutex::new(client().await, &path).unwrap();
    let contender = InterProcessMutex::new(client().await, &path).unwrap();
    let mut rng = rand::rng();
    let mut granted = 0;
    for trial in 0..120 {
        let held = if trial % 2 == 0 { Some(holder.acquire().await.unwrap()) } else { None };
        let cancel_after = Duration::from_micros(rng.random_range(0..4000));
        match trial % 3 {
            0 => {
                if let Ok(Ok(guard)) = tokio::time::timeout(cancel_after, contender.acquire()).await {
                    granted += 1;
                    drop(guard);
                }
            },
            1 => {
                tokio::select! {
                    result = contender.try_acquire() => if let Some(guard) = result.unwrap() { granted += 1; drop(guard) },
                    _ = tokio::time::sleep(cancel_after) => {},
                }
            },
            _ => {
                let fut = contender.acquire_timeout(Duration::from_secs(30));
                let mut fut = Box::pin(fut);
                // Poll once or a few times, then drop it mid-flight.
                let _ = tokio::time::timeout(cancel_after, &mut fut).await;
                drop(fut);
            },
        }
        drop(held);
    }
    assert_no_nodes_left(&observer, &path).await;
    // Still usable by both.
    contender.acquire().await.unwrap().release().await.unwrap();
    holder.acquire().await.unwrap().release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
    eprintln!("cancellation trials: {granted} of 120 were granted before being cancelled");
}

#[tokio::test]
async fn container_parents_disappear_after_use() {
    let base = unique_path("container");
    let path = format!("{base}/a/b");
    let observer = client().await;
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    mutex.acquire().await.unwrap().release().await.unwrap();
    let stat = observer.check_stat(&path).await.unwrap();
    // Created as a container (ephemeral_owner 0, and the server removes it once empty).
    assert!(stat.is_some());
    let limit = container_check_limit().await;
    eventually(limit, "empty container lock path removed by the server", || async {
        observer.check_stat(&base).await.unwrap().is_none()
    })
    .await;
}

/// How long the server may take to remove empty containers: our servers check every 500 ms, an
/// external one (`ZK_CONNECT`) may use the default of 60 s.
async fn container_check_limit() -> Duration {
    match zookeeper().await.backend() {
        zk_testcontainers::Backend::External => Duration::from_secs(200),
        _ => Duration::from_secs(15),
    }
}

#[tokio::test]
async fn foreign_children_never_block_or_grant() {
    let path = unique_path("foreign");
    let admin = client().await;
    admin.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    // (`<uuid>__lock__<seq>` is not foreign: it is kazoo's lock node, see below.)
    for name in ["aaa-foreign", "lock-notanumber", "lock-", "0000000000", "__rlock__0000000000"] {
        admin.create(&format!("{path}/{name}"), b"x", &persistent).await.unwrap();
    }
    let a = InterProcessMutex::new(client().await, &path).unwrap();
    let b = InterProcessMutex::new(client().await, &path).unwrap();
    let held = a.try_acquire().await.unwrap().expect("foreign children must not block");
    assert!(b.try_acquire().await.unwrap().is_none(), "foreign children must not grant");
    let participants = a.participants().await.unwrap();
    assert_eq!(participants.len(), 1);
    assert_eq!(participants[0].path, held.lock_path());
    held.release().await.unwrap();
    b.acquire_timeout(Duration::from_secs(5)).await.unwrap().expect("free").release().await.unwrap();
    assert_eq!(children(&admin, &path).await.len(), 5, "only foreign children remain");
}

/// kazoo's `Lock` names its nodes `<hex uuid>__lock__<seq>` in the same directory, with the same
/// sequence counter: a mutex queues behind one (and kazoo, built with
/// `extra_lock_patterns=["-lock-"]`, behind ours: `tests/interop/mixed_interop.rs`).
#[tokio::test]
async fn kazoo_lock_nodes_are_queued_behind() {
    let path = unique_path("kazoo-named");
    let kazoo_like = client().await;
    kazoo_like.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let ephemeral_sequential = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{path}/{}__lock__", uuid::Uuid::new_v4().simple());
    let (_, sequence) = kazoo_like.create(&prefix, b"", &ephemeral_sequential).await.unwrap();
    let kazoo_node = format!("{prefix}{sequence}");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted ahead of a kazoo holder");
    let participants = mutex.participants().await.unwrap();
    assert_eq!(participants.len(), 1);
    assert!(participants[0].is_holder && participants[0].path == kazoo_node, "{participants:?}");
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted while the kazoo node exists");
    kazoo_like.delete(&kazoo_node, None).await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted after kazoo").unwrap();
    guard.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

#[tokio::test]
async fn participants_in_queue_order_with_data() {
    let path = unique_path("participants");
    let names = ["host-a:1", "host-b:2", "host-c:3"];
    let mut mutexes = Vec::new();
    for name in names {
        mutexes.push(InterProcessMutex::builder(client().await, &path).node_data(name.as_bytes()).build().unwrap());
    }
    let guard = mutexes[0].acquire().await.unwrap();
    let mut waiters = Vec::new();
    for (i, mutex) in mutexes.iter().enumerate().skip(1) {
        let mutex = mutex.clone();
        waiters.push(tokio::spawn(async move { mutex.acquire().await.unwrap().release().await.unwrap() }));
        eventually(Duration::from_secs(10), "queued", || async {
            mutexes[0].participants().await.unwrap().len() == i + 1
        })
        .await;
    }
    let participants = mutexes[2].participants().await.unwrap();
    let data: Vec<&[u8]> = participants.iter().map(|p| p.data.as_slice()).collect();
    assert_eq!(data, names.map(str::as_bytes));
    assert_eq!(participants.iter().map(|p| p.is_holder).collect::<Vec<_>>(), [true, false, false]);
    assert_eq!(participants[0].path, guard.lock_path());
    assert!(participants.windows(2).all(|w| w[0].sequence < w[1].sequence));
    guard.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    }
    assert!(mutexes[0].participants().await.unwrap().is_empty());
}

#[tokio::test]
async fn two_mutexes_on_one_client_are_two_processes() {
    let path = unique_path("same-client");
    let client = client().await;
    let one = InterProcessMutex::new(client.clone(), &path).unwrap();
    let two = InterProcessMutex::new(client.clone(), &path).unwrap();
    let guard = one.acquire().await.unwrap();
    // Same task, same session, but another mutex: no re-entry.
    assert!(two.try_acquire().await.unwrap().is_none());
    assert!(two.acquire_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    assert!(!two.is_held_in_current_scope());
    let waiter = {
        let two = two.clone();
        tokio::spawn(async move { two.acquire().await.unwrap().release().await.unwrap() })
    };
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_no_nodes_left(&client, &path).await;
}

/// Outside a task (a `block_on` future), acquires work like anywhere else: outside a lock scope
/// they queue, inside one they re-enter.
#[test]
fn acquires_outside_a_task() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let path = unique_path("thread-owner");
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        let first = mutex.acquire().await.unwrap();
        assert!(mutex.try_acquire().await.unwrap().is_none(), "an acquire outside a scope re-entered");
        drop(first);
        let mutex_ref = &mutex;
        let reentered = mutex
            .with_lock(|first| async move {
                let second = mutex_ref.try_acquire().await.unwrap().expect("re-entry inside the scope");
                first.lock_path() == second.lock_path()
            })
            .await
            .unwrap();
        assert!(reentered);
        assert!(!mutex.is_acquired_in_this_process());
    });
}

#[tokio::test]
async fn invalid_paths_are_clear_errors() {
    let client = client().await;
    for path in ["", "locks", "/", "/locks/", "/a//b", "/a/./b", "/a/../b", "/a\u{1}b", "/zookeeper/x"] {
        match InterProcessMutex::new(client.clone(), path) {
            Err(err @ Error::InvalidPath { .. }) => {
                let message = err.to_string();
                assert!(message.contains("invalid lock path"), "{message}");
            },
            other => panic!("{path:?} gave {other:?}"),
        }
    }
}

#[tokio::test]
async fn missing_chroot_is_a_clear_error() {
    let zk = zookeeper().await;
    let chroot = unique_path("no-such-chroot");
    let client = zk.client().await.unwrap().chroot(chroot.as_str()).unwrap();
    let mutex = InterProcessMutex::new(client, "/locks/x").unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), mutex.acquire()).await.unwrap().unwrap_err();
    assert!(matches!(err, Error::ChrootMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("chroot"), "{err}");
}

#[tokio::test]
async fn lock_path_under_an_ephemeral_node_is_a_clear_error() {
    let base = unique_path("ephemeral");
    let owner = client().await;
    owner.mkdir(&base, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let ephemeral = format!("{base}/eph");
    owner.create(&ephemeral, b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.unwrap();
    for path in [ephemeral.clone(), format!("{ephemeral}/below")] {
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), mutex.acquire()).await.unwrap().unwrap_err();
        assert!(matches!(err, Error::EphemeralParent { .. }), "{path}: {err:?}");
        assert!(err.to_string().contains("ephemeral"), "{err}");
    }
}

#[tokio::test]
async fn acl_denial_is_a_clear_error() {
    let path = unique_path("acl");
    let admin = client().await;
    admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    admin.create(&path, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read())).await.unwrap();
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), mutex.acquire()).await.unwrap().unwrap_err();
    assert!(matches!(err, Error::NoAuth { .. }), "{err:?}");
    assert!(err.to_string().contains(&path), "{err}");
    assert!(children(&admin, &path).await.is_empty());
}

/// Lock paths are relative to the client's chroot, and clients with and without the chroot see
/// the same lock.
#[tokio::test]
async fn chrooted_clients_share_the_lock_with_absolute_ones() {
    let root = unique_path("chroot");
    let admin = client().await;
    admin.mkdir(&root, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let chrooted = client().await.chroot(root.as_str()).unwrap();
    let inner = InterProcessMutex::new(chrooted, "/locks/a").unwrap();
    let outer = InterProcessMutex::new(client().await, format!("{root}/locks/a")).unwrap();
    let guard = inner.acquire().await.unwrap();
    assert!(guard.lock_path().starts_with("/locks/a/_c_"), "{}", guard.lock_path());
    assert!(admin.check_stat(&format!("{root}{}", guard.lock_path())).await.unwrap().is_some());
    assert!(outer.try_acquire().await.unwrap().is_none());
    let waiter = tokio::spawn(async move { outer.acquire().await.unwrap().release().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_no_nodes_left(&admin, &format!("{root}/locks/a")).await;
}

/// README "No leaked nodes": `release()` is cancel safe. Its future is dropped before it was
/// polled, after one poll, and after 1 ms and 5 ms: each time the node is deleted and the next
/// waiter granted, checked while the releasing session is still open (so it is our cleanup that
/// deleted the node, not the server ending the session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_cancel_safe() {
    init_tracing();
    let path = unique_path("release-cancel");
    let observer = client().await;
    let holder_client = client().await;
    let holder = InterProcessMutex::new(holder_client.clone(), &path).unwrap();
    let waiter = InterProcessMutex::new(client().await, &path).unwrap();
    for cancel_after in [None, Some(Duration::ZERO), Some(Duration::from_millis(1)), Some(Duration::from_millis(5))] {
        let guard = holder.acquire().await.unwrap();
        let node = guard.lock_path().to_owned();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire().await.unwrap() }
        });
        eventually(Duration::from_secs(10), "the waiter queued", || async {
            children(&observer, &path).await.len() == 2
        })
        .await;
        let release = guard.release();
        match cancel_after {
            None => drop(release),
            // A timeout polls the release once before it looks at its deadline.
            Some(after) => {
                let _ = tokio::time::timeout(after, release).await;
            },
        }
        let next = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap_or_else(|_| panic!("{cancel_after:?}: the next waiter was not granted"))
            .unwrap();
        assert_eq!(observer.check_stat(&node).await.unwrap(), None, "{cancel_after:?}: the released node is left");
        assert!(!holder_client.state().is_terminated(), "the releasing session must still be open");
        assert_eq!(nodes_of_session(&observer, &path, holder_client.session_id().0).await, Vec::<String>::new());
        next.release().await.unwrap();
    }
    assert_no_nodes_left(&observer, &path).await;
}
