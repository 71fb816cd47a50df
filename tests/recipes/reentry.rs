//! Re-entrancy that cannot break exclusion: re-entry only inside a `with_lock` scope; outside
//! one, every acquire queues — a guard moved to another task, several acquires polled by one task
//! (`join!`, `select!`), a task spawned inside a critical section.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{Error, InterProcessMutex, LockState};

/// Counts holders inside the critical section and remembers the most at once.
#[derive(Clone, Default)]
struct Section {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Section {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// README "Re-entrancy that cannot break exclusion": outside a `with_lock` scope every acquire
/// queues, also the acquiring task's after it moved its guard away. Task A acquires and hands the
/// guard to task B (which now works in the critical section); A's next acquire waits for B's
/// release. (The review found it re-entered instead, and A and B held at the same time.)
// review: moved_guard_and_a_new_acquire_by_the_acquiring_task_overlap
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_guard_and_a_new_acquire_by_the_acquiring_task_do_not_overlap() {
    let path = unique_path("moved-reenter");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let in_section = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let guard = mutex.acquire().await.unwrap();
    let worker = {
        let (in_section, most) = (in_section.clone(), most.clone());
        tokio::spawn(async move {
            let now = in_section.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(guard.state(), LockState::Held);
            in_section.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The acquiring task wants the lock again for its next piece of work.
    let started = Instant::now();
    let again = mutex.acquire().await.unwrap();
    let now = in_section.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    let waited = started.elapsed();
    let state = again.state();
    in_section.fetch_sub(1, Ordering::SeqCst);
    drop(again);
    worker.await.unwrap();
    eprintln!("second acquire by the acquiring task returned after {waited:?} with state {state:?}");
    assert_eq!(most.load(Ordering::SeqCst), 1, "two tasks held the lock at once (re-entry through a moved guard)");
}

/// The shape from the field: `loop { let g = m.acquire().await?; tokio::spawn(work(g)); }` runs
/// the iterations one after the other, not all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_spawn_loop_serialises() {
    let path = unique_path("spawn-loop");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let section = Section::default();
    let mut workers = Vec::new();
    for _ in 0..4 {
        let guard = mutex.acquire().await.unwrap();
        let section = section.clone();
        workers.push(tokio::spawn(async move {
            section.enter();
            tokio::time::sleep(Duration::from_millis(150)).await;
            section.leave();
            drop(guard);
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(section.most(), 1, "iterations of an acquire-and-spawn loop overlapped");
    assert_no_nodes_left(&client().await, &path).await;
}

/// `join!` of acquires in one task, outside a scope: they queue like two processes (the second
/// waits for the first's release), never share a hold.
#[tokio::test]
async fn join_of_acquires_outside_a_scope_queues() {
    let path = unique_path("join");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let section = Section::default();
    let work = |delay: u64| {
        let (mutex, section) = (&mutex, section.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let guard = mutex.acquire().await.unwrap();
            section.enter();
            tokio::time::sleep(Duration::from_millis(200)).await;
            section.leave();
            guard.release().await.unwrap();
        }
    };
    tokio::join!(work(0), work(80), work(120));
    assert_eq!(section.most(), 1, "futures of one task shared the lock");

    // Two acquires joined whose guards both live until the join ends: the second waits for the
    // first (as two std mutex locks in one thread would); a timeout shows it, nothing overlaps.
    let (first, second) = tokio::join!(mutex.acquire(), mutex.acquire_timeout(Duration::from_millis(500)));
    let first = first.unwrap();
    assert!(second.unwrap().is_none(), "the second acquire of a join shared the first one's hold");
    first.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// `select!` between two acquires of one task: the loser is cancelled (its node deleted), the
/// winner holds alone.
#[tokio::test]
async fn select_of_acquires_outside_a_scope_leaves_one_holder() {
    let path = unique_path("select");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let observer = client().await;
    let guard = tokio::select! {
        guard = mutex.acquire() => guard.unwrap(),
        guard = mutex.acquire() => guard.unwrap(),
    };
    assert_eq!(guard.state(), LockState::Held);
    eventually(Duration::from_secs(5), "the losing acquire's node is deleted", || async {
        children(&observer, &path).await.len() == 1
    })
    .await;
    assert!(mutex.try_acquire().await.unwrap().is_none(), "an acquire outside a scope re-entered");
    guard.release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
}

/// Inside a scope, futures polled by the scope's task (`join!`) re-enter the scope's hold; a task
/// spawned inside the critical section does not carry the scope and queues until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_reenters_for_joined_futures_but_not_for_spawned_tasks() {
    let path = unique_path("scope");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let spawned_granted = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let (scope_ended, spawned) = mutex
        .with_lock(|guard| {
            let mutex = mutex.clone();
            let spawned_granted = spawned_granted.clone();
            async move {
                let (a, b) = tokio::join!(mutex.acquire(), mutex.acquire());
                let (a, b) = (a.unwrap(), b.unwrap());
                assert_eq!(a.fencing_token(), guard.fencing_token());
                assert_eq!(b.fencing_token(), guard.fencing_token());
                let spawned = tokio::spawn({
                    let mutex = mutex.clone();
                    async move {
                        assert!(!mutex.is_held_in_current_scope(), "tokio::spawn carried the lock scope");
                        let inner = mutex.acquire().await.unwrap();
                        *spawned_granted.lock().unwrap() = Some(Instant::now());
                        inner.release().await.unwrap();
                    }
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(!spawned.is_finished(), "a task spawned in the critical section got the lock");
                drop((a, b));
                (Instant::now(), spawned)
            }
        })
        .await
        .unwrap();
    spawned.await.unwrap();
    let granted = spawned_granted.lock().unwrap().expect("spawned task granted");
    assert!(granted >= scope_ended, "the spawned task was granted before the scope ended");
    assert_no_nodes_left(&client().await, &path).await;
}

/// A re-entrant acquire into a lost hold fails with `LockLost`; outside the scope, acquires queue.
#[tokio::test]
async fn reentry_into_a_lost_hold_is_an_error() {
    let path = unique_path("reenter-lost");
    let admin = client().await;
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let (admin_ref, mutex_ref) = (&admin, &mutex);
    let result = mutex
        .with_lock(|guard| async move {
            admin_ref.delete(guard.lock_path(), None).await.unwrap();
            tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("told");
            mutex_ref.acquire().await.map(|_| ())
        })
        .await
        .unwrap();
    assert!(matches!(result, Err(Error::LockLost { .. })), "{result:?}");
    let guard = mutex.acquire_timeout(Duration::from_secs(5)).await.unwrap().expect("a fresh acquire queues");
    guard.release().await.unwrap();
    assert_no_nodes_left(&admin, &path).await;
}
