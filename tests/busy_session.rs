//! A busy session keeps its locks (issue 20, item 1): a `LeaderLatch` and a read/write-locked
//! cache that readers hit every 50 ms share one `ManagedClient` for a minute, with no fault. The
//! leadership is never lost, and no read acquire waits for the session to be vouched for again
//! (each one is answered in a few round trips). Before answers were kept in entries of bounded
//! span, the leader lost leadership with `SessionDeadlinePassed` several times a minute and reads
//! stalled up to 3.6 s here.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{InterProcessReadWriteLock, LeaderLatch, LockState, ManagedClient};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_and_a_busy_read_write_lock_on_one_client_lose_nothing_in_a_minute() {
    init_tracing();
    let zk = zookeeper().await;
    let t = Duration::from_secs(6);
    let run_for = Duration::from_secs(60);
    let managed = ManagedClient::builder(zk.connect_string()).session_timeout(t).connect().await.unwrap();
    let election = unique_path("busy-election");
    let cache = unique_path("busy-cache");
    let latch = LeaderLatch::builder(&managed, &election).id("scheduler").build().unwrap();
    latch.start().unwrap();
    let leadership = latch.await_leadership().await.unwrap();
    let lock = InterProcessReadWriteLock::new(&managed, &cache).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Three readers, each taking the read lock every 50 ms for a short read.
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (read, stop) = (lock.read_lock(), stop.clone());
        readers.push(tokio::spawn(async move {
            let (mut reads, mut slowest) = (0u32, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let guard = read.acquire().await.unwrap();
                slowest = slowest.max(started.elapsed());
                assert_eq!(guard.state(), LockState::Held);
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.release().await.unwrap();
                reads += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (reads, slowest)
        }));
    }
    let lost = tokio::time::timeout(run_for, leadership.lost()).await;
    stop.store(true, Ordering::Relaxed);
    let (mut reads, mut slowest) = (0, Duration::ZERO);
    for reader in readers {
        let (n, worst) = reader.await.unwrap();
        reads += n;
        slowest = slowest.max(worst);
    }
    eprintln!("{reads} read acquires in {run_for:?} on the latch's client (T = {t:?}); slowest {slowest:?}");
    assert!(lost.is_err(), "the leader lost its leadership on a healthy, busy session: {:?}", lost.ok());
    assert_eq!(leadership.state(), LockState::Held);
    assert!(latch.has_leadership());
    // A read waits for nobody here (no writer): a few round trips, or a heartbeat's worth if the
    // session had to be vouched for again. A read that waited for the deadline to move again
    // (the defect) took over a second; generous slack for a loaded machine.
    assert!(slowest < Duration::from_secs(1) + SCHED_SLACK, "a read acquire took {slowest:?}");
    assert!(reads > 300, "the cache was not busy: {reads} reads");
    latch.close().await.unwrap();
    drop(leadership);
    assert_no_nodes_left(&managed.client(), &election).await;
    assert_no_nodes_left(&managed.client(), &cache).await;
    managed.close().await.unwrap();
}
