//! Review H: lock-delay (issue 23) and acquires that do not wait the delay out — `try_acquire`
//! and an `acquire_timeout` shorter than the delay.
//!
//! The promise: after an unclean deletion, no conflicting hold is granted until `delay` after it.
//! Once `delay` has passed, the lock is free again and `try_acquire` should take it. The rule in
//! `src/engine/delay.rs` cannot tell *how long ago* an unserved deletion happened (it only counts
//! them), so an acquire that does not wait (`try_acquire`: `Verdict::Wait(_) if wait == Wait::No
//! => NotNow`) refuses; and the refusal deletes its node without a mark — one more unclean
//! deletion. Nothing but a grant that waits the full delay ever writes a new mark, so a user of
//! `try_acquire` alone (or of `acquire_timeout(t)` with `t < delay`) never gets the lock again.
//!
//! Fixed (`delay.rs`, *Give-ups and waits cut short*): a give-up keeps the count, and the process
//! remembers when it first saw the count a grant needs. `tests/recipes/lock_delay.rs` checks that neither
//! lets a grant come before the delay after the loss.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{InterProcessMutex, InterProcessSemaphoreV2, LeaderLatch};

const DELAY: Duration = Duration::from_millis(1500);

fn delayed(client: zookeeper_client::Client, path: &str) -> InterProcessMutex {
    InterProcessMutex::builder(client, path).lock_delay(DELAY).build().unwrap()
}

/// Takes and cleanly releases the lock once (pays the first-acquire delay; leaves a mark).
async fn warm_up(client: &zookeeper_client::Client, path: &str) {
    delayed(client.clone(), path).acquire().await.unwrap().release().await.unwrap();
}

/// After a holder's session expired, the lock is free `DELAY` later. A `try_acquire` poller
/// should get it once the delay is over. Here: polls every 2 × DELAY for 4 rounds (12 s: eight
/// times the delay after the loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_succeeds_once_the_delay_after_an_unclean_loss_is_over() {
    let path = unique_path("rh-try");
    let (doomed, poller) = (client().await, client().await);
    warm_up(&poller, &path).await;
    let _expired = delayed(doomed.clone(), &path).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let lost_at = Instant::now();
    let mutex = delayed(poller.clone(), &path);
    let mut got = None;
    for round in 0..4 {
        tokio::time::sleep(DELAY * 2).await;
        if let Some(guard) = mutex.try_acquire().await.unwrap() {
            got = Some((round, lost_at.elapsed(), guard));
            break;
        }
        eprintln!("try_acquire round {round}: refused {:?} after the loss", lost_at.elapsed());
    }
    let (round, after, guard) =
        got.unwrap_or_else(|| panic!("try_acquire never took a free lock: {:?} after the loss", lost_at.elapsed()));
    eprintln!("try_acquire took it in round {round}, {after:?} after the loss");
    guard.release().await.unwrap();
}

/// A brand-new lock path used only through `try_acquire`: the first grant on a path "waits the
/// delay once" — but `try_acquire` never waits, and its refusal is one more unclean deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_alone_on_a_new_path_gets_the_lock_eventually() {
    let path = unique_path("rh-try-new");
    let poller = client().await;
    let mutex = delayed(poller.clone(), &path);
    let started = Instant::now();
    for round in 0..4 {
        if let Some(guard) = mutex.try_acquire().await.unwrap() {
            eprintln!("try_acquire on a new path: granted in round {round}, {:?}", started.elapsed());
            guard.release().await.unwrap();
            return;
        }
        tokio::time::sleep(DELAY * 2).await;
    }
    panic!("a lock nobody ever held was refused to try_acquire for {:?} (4 tries, 2 × delay apart)", started.elapsed());
}

/// `acquire_timeout(0.8 × delay)` long after the loss: the lock has been free for many delays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_shorter_than_the_delay_succeeds_long_after_an_unclean_loss() {
    let path = unique_path("rh-timeout");
    let (doomed, poller) = (client().await, client().await);
    warm_up(&poller, &path).await;
    let _guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let lost_at = Instant::now();
    let mutex = delayed(poller.clone(), &path);
    for round in 0..4 {
        tokio::time::sleep(DELAY * 2).await;
        if let Some(guard) = mutex.acquire_timeout(DELAY * 8 / 10).await.unwrap() {
            eprintln!("acquire_timeout took it in round {round}, {:?} after the loss", lost_at.elapsed());
            guard.release().await.unwrap();
            return;
        }
    }
    panic!("acquire_timeout(0.8 × delay) never took a lock free for {:?}", lost_at.elapsed());
}

/// The same for a semaphore (pool of 1) and `acquire_timeout` shorter than the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_acquire_timeout_succeeds_long_after_an_unclean_loss() {
    let path = unique_path("rh-sem-timeout");
    let (doomed, poller) = (client().await, client().await);
    let sem = |c: &zookeeper_client::Client| {
        InterProcessSemaphoreV2::builder(c.clone(), &path).lock_delay(DELAY).build(1).unwrap()
    };
    sem(&poller).acquire().await.unwrap().release().await.unwrap();
    let _lease = sem(&doomed).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let lost_at = Instant::now();
    let semaphore = sem(&poller);
    for round in 0..4 {
        tokio::time::sleep(DELAY * 2).await;
        if let Some(lease) = semaphore.acquire_timeout(DELAY * 8 / 10).await.unwrap() {
            eprintln!("semaphore acquire_timeout took it in round {round}, {:?} after the loss", lost_at.elapsed());
            lease.release().await.unwrap();
            return;
        }
    }
    panic!("semaphore acquire_timeout(0.8 × delay) never took a lease free for {:?}", lost_at.elapsed());
}

/// Leader election, one-shot: `try_acquire_once` long after the previous leader's session
/// expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latch_try_acquire_once_succeeds_long_after_the_leader_expired() {
    let path = unique_path("rh-latch-try");
    let (doomed, other) = (client().await, client().await);
    let latch =
        |c: &zookeeper_client::Client| LeaderLatch::builder(c.clone(), &path).lock_delay(DELAY).build().unwrap();
    // Warm up: lead once, step down cleanly.
    latch(&other).acquire_once().await.unwrap().release().await.unwrap();
    let _leader = latch(&doomed).acquire_once().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let lost_at = Instant::now();
    for round in 0..4 {
        tokio::time::sleep(DELAY * 2).await;
        if let Some(guard) = latch(&other).try_acquire_once().await.unwrap() {
            eprintln!("try_acquire_once led in round {round}, {:?} after the loss", lost_at.elapsed());
            guard.release().await.unwrap();
            return;
        }
    }
    panic!("try_acquire_once never led an election without a leader for {:?}", lost_at.elapsed());
}

/// Control: one blocking `acquire` (which waits the delay and writes a new mark on its clean
/// release) restores `try_acquire` — the refusals above are not about the lock being held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_unsticks_try_acquire() {
    let path = unique_path("rh-try-unstick");
    let (doomed, poller) = (client().await, client().await);
    warm_up(&poller, &path).await;
    let _guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    tokio::time::sleep(DELAY * 2).await;
    let mutex = delayed(poller.clone(), &path);
    let started = Instant::now();
    mutex.acquire().await.unwrap().release().await.unwrap();
    eprintln!("a blocking acquire 2 × delay after the loss still waited {:?}", started.elapsed());
    assert!(mutex.try_acquire().await.unwrap().is_some(), "try_acquire after a clean release");
}
