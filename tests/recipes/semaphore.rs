//! InterProcessSemaphoreV2 and InterProcessSemaphoreMutex against a real ZooKeeper (the intent of
//! Curator's TestInterProcessSemaphore and TestInterProcessSemaphoreMutex): the lease bound,
//! all-or-nothing acquires, timeouts, cancellation, Curator's layout, foreign children, lost
//! leases, and the semaphore mutex's lack of re-entry.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::Rng;
use zk_recipes::{Error, InterProcessSemaphoreMutex, InterProcessSemaphoreV2, Lease, LockState, LossReason};
use zookeeper_client as zk;

#[test]
fn public_types_are_send_sync_static() {
    fn assert_send_sync_static<T: Send + Sync + 'static>() {}
    assert_send_sync_static::<InterProcessSemaphoreV2>();
    assert_send_sync_static::<InterProcessSemaphoreMutex>();
    assert_send_sync_static::<Lease>();
}

/// Children of the semaphore's two directories (leases and the internal lock's nodes).
async fn semaphore_nodes(client: &zk::Client, path: &str) -> Vec<String> {
    let mut nodes = children(client, &format!("{path}/leases")).await;
    nodes.extend(children(client, &format!("{path}/locks")).await.into_iter().map(|n| format!("locks/{n}")));
    nodes
}

async fn assert_semaphore_empty_while_open(observer: &zk::Client, path: &str, open: &[zk::Client]) {
    assert_no_nodes_left_while_open(observer, &format!("{path}/leases"), open, Duration::from_secs(10)).await;
    assert_no_nodes_left_while_open(observer, &format!("{path}/locks"), open, Duration::from_secs(10)).await;
}

/// A shared in-process occupancy counter: the number of leases believed held, and its peak.
#[derive(Default)]
struct Occupancy {
    now: AtomicUsize,
    peak: AtomicUsize,
    over: AtomicUsize,
}

impl Occupancy {
    fn enter(&self, n: usize, max: usize) {
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if now > max {
            self.over.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_max_leases_5_sessions_x_3_tasks() {
    init_tracing();
    let path = unique_path("sem-bound");
    const MAX: usize = 3;
    let occupancy = Arc::new(Occupancy::default());
    let granted = Arc::new(AtomicUsize::new(0));
    let mut sessions = Vec::new();
    let mut tasks = Vec::new();
    for s in 0..5 {
        let client = client().await;
        sessions.push(client.clone());
        let semaphore = InterProcessSemaphoreV2::new(client, &path, MAX).unwrap();
        for t in 0..3 {
            let (semaphore, occupancy, granted) = (semaphore.clone(), occupancy.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    // Some take two leases at once: the bound counts leases, not holders.
                    let qty = if (s + t + i) % 4 == 0 { 2 } else { 1 };
                    let leases = semaphore.acquire_many(qty).await.unwrap();
                    assert_eq!(leases.len(), qty);
                    occupancy.enter(qty, MAX);
                    granted.fetch_add(qty, Ordering::SeqCst);
                    let hold = rand::rng().random_range(1..15);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    occupancy.leave(qty);
                    for lease in leases {
                        assert_eq!(lease.state(), LockState::Held);
                        lease.release().await.unwrap();
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(occupancy.over.load(Ordering::SeqCst), 0, "more than {MAX} leases held at once");
    // The bound was reached, so the check above could fail.
    assert_eq!(occupancy.peak.load(Ordering::SeqCst), MAX, "the pool never filled");
    assert!(granted.load(Ordering::SeqCst) >= 5 * 3 * 10);
    assert_semaphore_empty_while_open(&client().await, &path, &sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_layout_and_participant_nodes() {
    let path = unique_path("sem-layout");
    let client = client().await;
    let semaphore =
        InterProcessSemaphoreV2::builder(client.clone(), &path).node_data(b"worker-1".to_vec()).build(2).unwrap();
    let lease = semaphore.acquire().await.unwrap();
    let name =
        lease.node_path().strip_prefix(&format!("{path}/leases/")).expect("lease under <path>/leases").to_owned();
    // _c_<uuid>-lease-<10 digits>
    let rest = name.strip_prefix("_c_").expect("protected prefix");
    let (uuid, seq) = rest.split_at(36);
    uuid::Uuid::parse_str(uuid).expect("a GUID");
    let digits = seq.strip_prefix("-lease-").expect("Curator's lease name");
    assert!(digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()), "{name}");
    let (data, stat) = client.get_data(lease.node_path()).await.unwrap();
    assert_eq!(data, b"worker-1");
    assert_ne!(stat.ephemeral_owner, 0, "lease nodes are ephemeral");
    assert_eq!(lease.fencing_token().as_i64(), stat.czxid);
    // The internal lock is released once the lease is granted.
    eventually(Duration::from_secs(5), "internal lock released", || async {
        children(&client, &format!("{path}/locks")).await.is_empty()
    })
    .await;
    let second = semaphore.acquire().await.unwrap();
    assert_eq!(
        semaphore.participant_nodes().await.unwrap(),
        vec![lease.node_path().to_owned(), second.node_path().to_owned()]
    );
    assert!(semaphore.is_acquired_in_this_process());
    second.release().await.unwrap();
    drop(lease); // returned in the background
    assert_semaphore_empty_while_open(&client, &path, std::slice::from_ref(&client)).await;
    assert!(!semaphore.is_acquired_in_this_process());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_is_all_or_nothing_and_times_out_cleanly() {
    let path = unique_path("sem-many");
    let (a, b) = (client().await, client().await);
    let sa = InterProcessSemaphoreV2::new(a.clone(), &path, 3).unwrap();
    let sb = InterProcessSemaphoreV2::new(b.clone(), &path, 3).unwrap();
    let two = sa.acquire_many(2).await.unwrap();
    // One lease left: two cannot be had, and none is kept.
    let started = std::time::Instant::now();
    assert!(sb.acquire_many_timeout(2, Duration::from_millis(400)).await.unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(400));
    // The timed-out attempt's lease node and internal lock node go (only A's two leases remain).
    eventually(Duration::from_secs(10), "only A's leases left", || async {
        semaphore_nodes(&a, &path).await.len() == 2
    })
    .await;
    let one = sb.acquire_timeout(Duration::from_secs(5)).await.unwrap().expect("one lease is free");
    // A waiting acquire_many(2) gets both once A returns its two.
    let waiter = tokio::spawn({
        let sb = sb.clone();
        async move { sb.acquire_many(2).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "granted with one lease free");
    for lease in two {
        lease.release().await.unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    assert_eq!(got.len(), 2);
    drop(got);
    one.release().await.unwrap();
    assert_semaphore_empty_while_open(&a, &path, &[a.clone(), b.clone()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_errors() {
    let path = unique_path("sem-args");
    let client = client().await;
    assert!(matches!(InterProcessSemaphoreV2::new(client.clone(), &path, 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(InterProcessSemaphoreV2::new(client.clone(), "no-slash", 1), Err(Error::InvalidPath { .. })));
    let semaphore = InterProcessSemaphoreV2::new(client.clone(), &path, 2).unwrap();
    assert!(matches!(semaphore.acquire_many(0).await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(semaphore.acquire_many(3).await, Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        semaphore.acquire_many_timeout(3, Duration::from_secs(1)).await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(semaphore_nodes(&client, &path).await.is_empty(), "nothing sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_child_of_leases_counts() {
    // Curator counts every child of `leases`: a foreign node takes a lease until it goes.
    let path = unique_path("sem-foreign");
    let client = client().await;
    let semaphore = InterProcessSemaphoreV2::new(client.clone(), &path, 1).unwrap();
    // The first lease creates the directories; the foreign node goes in while it is held, so the
    // server cannot reap the emptied `leases` container first (review AA).
    let first = semaphore.acquire().await.unwrap();
    let foreign = format!("{path}/leases/not-a-lease");
    client.create(&foreign, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    first.release().await.unwrap();
    assert!(semaphore.acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let waiter = tokio::spawn({
        let semaphore = semaphore.clone();
        async move { semaphore.acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    client.delete(&foreign, None).await.unwrap();
    let lease =
        tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted once the child went").unwrap();
    lease.release().await.unwrap();
    assert_semaphore_empty_while_open(&client, &path, std::slice::from_ref(&client)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_node() {
    let path = unique_path("sem-cancel");
    let (a, b) = (client().await, client().await);
    let holder = InterProcessSemaphoreV2::new(a.clone(), &path, 2).unwrap();
    let semaphore = InterProcessSemaphoreV2::new(b.clone(), &path, 2).unwrap();
    let held = holder.acquire_many(2).await.unwrap();
    // Cancelled at every point of the wait: in the internal lock's queue, while creating, while
    // waiting on the full pool.
    for i in 0..40u64 {
        let cut = Duration::from_micros(rand::rng().random_range(0..4000) + i * 50);
        let acquires = [
            tokio::spawn({
                let s = semaphore.clone();
                async move { tokio::time::timeout(cut, s.acquire()).await.map(|lease| lease.unwrap()) }
            }),
            tokio::spawn({
                let s = semaphore.clone();
                async move { tokio::time::timeout(cut, s.acquire_many(2)).await.map(|l| l.unwrap().pop().unwrap()) }
            }),
        ];
        for acquire in acquires {
            assert!(acquire.await.unwrap().is_err(), "granted while the pool is full");
        }
    }
    // Only the holder's two leases are left, while every session is still open.
    eventually(Duration::from_secs(10), "the cancelled acquires' nodes are gone", || async {
        semaphore_nodes(&a, &path).await.len() == 2
    })
    .await;
    for lease in held {
        lease.release().await.unwrap();
    }
    // And the semaphore still works.
    let lease = semaphore.acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("pool free");
    lease.release().await.unwrap();
    assert_semaphore_empty_while_open(&a, &path, &[a.clone(), b.clone()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_session_is_closed_is_lost_and_returned() {
    let path = unique_path("sem-lost");
    let observer = client().await;
    let doomed = client().await;
    let semaphore = InterProcessSemaphoreV2::new(doomed.clone(), &path, 1).unwrap();
    let lease = semaphore.acquire().await.unwrap();
    let other = InterProcessSemaphoreV2::new(observer.clone(), &path, 1).unwrap();
    let waiter = tokio::spawn(async move { other.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost()).await.expect("told");
    assert!(
        matches!(reason, LossReason::SessionExpired | LossReason::NodeDeleted | LossReason::SessionClosed),
        "{reason:?}"
    );
    assert!(matches!(lease.state(), LockState::Lost(_)));
    let next = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("the lease was freed").unwrap();
    next.release().await.unwrap();
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_mutex_is_not_reentrant_and_released_by_any_task() {
    let path = unique_path("sem-mutex");
    let client = client().await;
    let mutex = InterProcessSemaphoreMutex::new(client.clone(), &path).unwrap();
    let lease = mutex.acquire().await.unwrap();
    assert!(mutex.is_acquired_in_this_process());
    // The same task again: it waits (no re-entry).
    assert!(mutex.acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    // Another handle on another session waits too.
    let other = InterProcessSemaphoreMutex::new(super_client().await, &path).unwrap();
    let waiter = tokio::spawn(async move { other.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    // Released from another task.
    tokio::spawn(async move { lease.release().await.unwrap() }).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    assert!(next.fencing_token() > zk_recipes::FencingToken::from_i64(0));
    next.release().await.unwrap();
    assert_semaphore_empty_while_open(&client, &path, std::slice::from_ref(&client)).await;
}

async fn super_client() -> zk::Client {
    client().await
}

/// The internal lock's node of a waiting acquirer is deleted by someone else: another acquirer
/// then takes the internal lock and waits in the pool too. Each counts the other's lease node, so
/// with one lease both would wait for ever once the holder returns it; the first one sees its lock
/// node go, gives up its lease node and queues again, and both are granted in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_internal_lock_node_is_deleted_queues_again() {
    let path = unique_path("sem-lock-deleted");
    let (h, a, b, admin) = (client().await, client().await, client().await, client().await);
    let holder = InterProcessSemaphoreV2::new(h.clone(), &path, 1).unwrap();
    let lease = holder.acquire().await.unwrap();
    let first = tokio::spawn({
        let s = InterProcessSemaphoreV2::new(a.clone(), &path, 1).unwrap();
        async move { s.acquire().await.unwrap() }
    });
    let locks = format!("{path}/locks");
    eventually(Duration::from_secs(10), "the first waiter holds the internal lock and waits", || async {
        children(&admin, &format!("{path}/leases")).await.len() == 2 && children(&admin, &locks).await.len() == 1
    })
    .await;
    let lock_node = children(&admin, &locks).await.remove(0);
    admin.delete(&format!("{locks}/{lock_node}"), None).await.unwrap();
    let second = tokio::spawn({
        let s = InterProcessSemaphoreV2::new(b.clone(), &path, 1).unwrap();
        async move { s.acquire().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await.unwrap();
    // Both are granted, one after the other.
    let (mut first, mut second) = (Some(first), Some(second));
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                for task in [&mut first, &mut second] {
                    if task.as_ref().is_some_and(|t| t.is_finished()) {
                        return task.take().unwrap().await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("granted: no two waiters stuck in the pool");
        next.release().await.unwrap();
    }
    assert_semaphore_empty_while_open(&admin, &path, &[h.clone(), a.clone(), b.clone()]).await;
}

/// A waiter's lease node is deleted by someone else: the waiter deletes what is left of its nodes,
/// creates new ones (new GUIDs) and is granted once the holder returns its lease. Its old nodes'
/// paths were known, so nothing is searched for by GUID (review T). A search lists the directory
/// with `getChildren` (`find_protected`); the waiter's own listings are `getChildren2` (with the
/// directory's stat). With the search, this test counts one `getChildren`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_node_is_deleted_makes_a_new_one_without_a_search() {
    use zk_testcontainers::{op, FaultProxy};
    let path = unique_path("sem-lease-deleted");
    let leases = format!("{path}/leases");
    let (h, admin) = (client().await, client().await);
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let b = zookeeper()
        .await
        .connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(&proxy.addr())
        .await
        .unwrap();
    let holder = InterProcessSemaphoreV2::new(h.clone(), &path, 1).unwrap();
    let lease = holder.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let s = InterProcessSemaphoreV2::new(b.clone(), &path, 1).unwrap();
        async move { s.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "the waiter's lease node is made", || async {
        !nodes_of_session(&admin, &leases, b.session_id().0).await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old = nodes_of_session(&admin, &leases, b.session_id().0).await;
    assert_eq!(old.len(), 1, "one lease node of the waiter: {old:?}");
    let before = proxy.requests();
    admin.delete(&format!("{leases}/{}", old[0]), None).await.unwrap();
    eventually(Duration::from_secs(10), "the waiter makes a new lease node", || async {
        let now = nodes_of_session(&admin, &leases, b.session_id().0).await;
        now.len() == 1 && now != old
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = proxy.requests();
    let sent: std::collections::BTreeMap<i32, u64> = after
        .iter()
        .map(|(op, n)| (*op, n - before.get(op).copied().unwrap_or(0)))
        .filter(|(op, n)| *n > 0 && *op != op::PING)
        .collect();
    eprintln!("the waiter's session sent, from the deletion on: {sent:?}");
    let searches = sent.get(&op::GET_CHILDREN).copied().unwrap_or(0);
    lease.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    granted.release().await.unwrap();
    assert_semaphore_empty_while_open(&admin, &path, &[h.clone(), b.clone()]).await;
    assert!(sent.contains_key(&op::CREATE2), "the waiter made its new node on its session: {sent:?}");
    assert_eq!(searches, 0, "the waiter searched for a node whose path it knew, by GUID: {sent:?}");
}
