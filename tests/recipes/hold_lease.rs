//! Hold leases (issue 23, Redisson's `leaseTime`) against a real ZooKeeper: a holder that never
//! releases loses the lock when its lease runs out — told first, its fenced writes refused from
//! then on — and the next waiter is granted within a round trip; `extend` keeps it; every lock
//! recipe takes one (mutex, read/write lock, semaphore lease).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{
    Error, FencedWriteError, InterProcessMutex, InterProcessReadWriteLock, InterProcessSemaphoreV2, LeaderLatch,
    LockState, LossReason,
};
use zookeeper_client as zk;

/// How late the library may end a hold after its lease ran out, and how late the next waiter may
/// be granted after that: scheduling on a loaded 2-core machine, plus a round trip.
const SLACK: Duration = Duration::from_millis(750);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_releases_loses_the_lock_at_its_lease() {
    init_tracing();
    let path = unique_path("lease-mutex");
    let (holder_client, waiter_client) = (client().await, client().await);
    let counter = unique_path("lease-counter");
    holder_client.create(&counter, b"0", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.ok();
    if holder_client.check_stat(&counter).await.unwrap().is_none() {
        let mut level = String::new();
        for name in counter.split('/').skip(1) {
            level = format!("{level}/{name}");
            let _ =
                holder_client.create(&level, b"0", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
        }
    }
    let lease = Duration::from_millis(1500);
    let mutex = InterProcessMutex::builder(holder_client.clone(), &path).lease(lease).build().unwrap();
    let granted_at = Instant::now();
    let guard = Arc::new(mutex.acquire().await.unwrap());
    // A fenced write inside the lease goes through.
    let mut writer = guard.fenced_writer();
    writer.add_set_data(&counter, b"1", None).unwrap();
    writer.commit().await.expect("a fenced write inside the lease");
    let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
    // What the holder is told, read the moment the waiter is granted (the test's own task may be
    // scheduled late on a loaded machine; this read is not).
    let holder = guard.loss_signal();
    let waiting = tokio::spawn(async move {
        let next = waiter.acquire().await.unwrap();
        (Instant::now(), holder.reason(), next)
    });
    // The holder never releases; it is told when the lease runs out.
    let reason = tokio::time::timeout(lease + SLACK * 2, guard.lost()).await.expect("told");
    let told_at = Instant::now();
    assert_eq!(reason, LossReason::LeaseExpired);
    assert_eq!(guard.state(), LockState::Lost(LossReason::LeaseExpired));
    assert!(
        told_at - granted_at >= lease,
        "told {:?} after the grant, before its lease of {lease:?}",
        told_at - granted_at
    );
    assert_within(told_at - granted_at, lease + SLACK, "told within the slack of the lease");
    // Its fenced writes are refused from then on, and nothing is written.
    let mut writer = guard.fenced_writer();
    writer.add_set_data(&counter, b"2", None).unwrap();
    assert!(matches!(writer.commit().await, Err(FencedWriteError::LockLost)));
    assert_eq!(holder_client.get_data(&counter).await.unwrap().0, b"1");
    // The next waiter is granted after the holder was told, within a round trip of the expiry.
    let (next_at, told_at_grant, next) =
        tokio::time::timeout(SLACK * 4, waiting).await.expect("the waiter is granted").unwrap();
    assert_eq!(told_at_grant, Some(LossReason::LeaseExpired), "the waiter was granted before the holder was told");
    assert!(next_at - granted_at >= lease, "granted {:?} after the holder, inside its lease", next_at - granted_at);
    assert_within(next_at - granted_at, lease + SLACK, "the next waiter granted within the slack of the lease");
    assert!(next.fencing_token() > guard.fencing_token());
    // A lost hold cannot be extended.
    assert!(matches!(guard.extend(Duration::from_secs(5)), Err(Error::LockLost { .. })));
    next.release().await.unwrap();
    drop(guard);
    assert_no_nodes_left_while_open(
        &holder_client,
        &path,
        std::slice::from_ref(&holder_client),
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_hold_and_release_ends_it_cleanly() {
    let path = unique_path("lease-extend");
    let client = client().await;
    let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
    let lease = Duration::from_millis(800);
    let guard = mutex.acquire_with_lease(lease).await.unwrap();
    let started = Instant::now();
    // Renewed every 300 ms for 3 s (four leases' worth): still held.
    while started.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        guard.extend(lease).unwrap();
        assert_eq!(guard.state(), LockState::Held);
    }
    assert!(InterProcessMutex::new(client.clone(), &path).unwrap().try_acquire().await.unwrap().is_none());
    let signal = guard.loss_signal();
    guard.release().await.unwrap();
    // Released before the lease ran out: never lost afterwards.
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    assert!(!signal.is_lost() && signal.is_released());
    assert_no_nodes_left_while_open(&client, &path, std::slice::from_ref(&client), Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recipe_takes_a_lease() {
    let client = client().await;
    let lease = Duration::from_millis(700);
    // A read lock of a read/write lock.
    let rw_path = unique_path("lease-rw");
    let rw = InterProcessReadWriteLock::builder(client.clone(), &rw_path).lease(lease).build().unwrap();
    let read = rw.read_lock().acquire().await.unwrap();
    // A semaphore's lease, through acquire_with_lease.
    let sem_path = unique_path("lease-sem");
    let semaphore = InterProcessSemaphoreV2::new(client.clone(), &sem_path, 1).unwrap();
    let leased = semaphore.acquire_with_lease(lease).await.unwrap();
    // A leadership (a one-shot acquire of a LeaderLatch).
    let latch_path = unique_path("lease-latch");
    let latch = LeaderLatch::builder(client.clone(), &latch_path).id("a").lease(lease).build().unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    let limit = lease + SLACK * 2;
    let (read_reason, sem_reason, leader_reason) = tokio::join!(
        async { tokio::time::timeout(limit, read.lost()).await.expect("read told") },
        async { tokio::time::timeout(limit, leased.lost()).await.expect("lease told") },
        async { tokio::time::timeout(limit, leadership.lost()).await.expect("leader told") }
    );
    assert_eq!(read_reason, LossReason::LeaseExpired);
    assert_eq!(sem_reason, LossReason::LeaseExpired);
    assert_eq!(leader_reason, LossReason::LeaseExpired);
    assert!(!latch.has_leadership());
    // Both released by the library: the write lock and the semaphore are free again.
    let write = tokio::time::timeout(SLACK * 4, rw.write_lock().acquire()).await.expect("write lock free").unwrap();
    let again = tokio::time::timeout(SLACK * 4, semaphore.acquire()).await.expect("semaphore free").unwrap();
    write.release().await.unwrap();
    again.release().await.unwrap();
    drop((read, leased));
}
