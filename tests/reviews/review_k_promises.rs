//! Review K: the own-node watch driver's promises that should hold.
//! - A watch queued right as the driver runs out of watches (our release fired the last one) is
//!   still driven (no lost wake-up, no watch stranded with the driver marked running).
//! - A released hold is never told a loss; a deletion tells only its own hold.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockState, LossReason};

/// Round after round, the driver's last watch fires (our release) while a new hold's watch is
/// queued (its first state read), at varied offsets: the new hold is still told its deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_queued_as_the_driver_ends_is_driven() {
    let base = unique_path("k-race");
    let admin = client().await;
    let session = client().await;
    for round in 0..40usize {
        let first = InterProcessMutex::new(session.clone(), format!("{base}/{round}-a")).unwrap();
        let second = InterProcessMutex::new(session.clone(), format!("{base}/{round}-b")).unwrap();
        let guard_a = first.acquire().await.unwrap();
        assert_eq!(guard_a.state(), LockState::Held);
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Acquired, its state not read: no watch until the monitor's delay (100 ms).
        let guard_b = second.acquire().await.unwrap();
        let signal_a = guard_a.loss_signal();
        let yields = round % 8;
        let reader = tokio::spawn(async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            assert_eq!(guard_b.state(), LockState::Held);
            guard_b
        });
        guard_a.release().await.unwrap();
        let guard_b = reader.await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        admin.delete(guard_b.lock_path(), None).await.unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), guard_b.lost())
            .await
            .unwrap_or_else(|_| panic!("round {round}: hold B's deletion not told"));
        assert_eq!(reason, LossReason::NodeDeleted);
        assert!(signal_a.is_released());
        assert_eq!(signal_a.reason(), None, "round {round}: a released hold told a loss");
        drop(guard_b);
    }
    for round in 0..40usize {
        assert_no_nodes_left(&admin, &format!("{base}/{round}-a")).await;
        assert_no_nodes_left(&admin, &format!("{base}/{round}-b")).await;
    }
}

/// Many holds read from many tasks at once while the others' nodes are deleted: every deleted
/// hold is told `NodeDeleted`, no other hold is told anything, released ones never a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_watches_tell_only_their_own_hold() {
    let base = unique_path("k-many");
    let admin = client().await;
    let session = client().await;
    for round in 0..3usize {
        let mut tasks = Vec::new();
        for i in 0..40usize {
            let mutex = InterProcessMutex::new(session.clone(), format!("{base}/{round}-{i}")).unwrap();
            tasks.push(tokio::spawn(async move {
                let guard = mutex.acquire().await.unwrap();
                if i % 2 == 0 {
                    let _ = guard.state();
                }
                guard
            }));
        }
        let mut guards = Vec::new();
        for task in tasks {
            guards.push(task.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let doomed: Vec<usize> = (0..40).filter(|i| i % 4 == 1 || i % 4 == 2).collect();
        let deletes = doomed.iter().map(|&i| admin.delete(guards[i].lock_path(), None)).collect::<Vec<_>>();
        for delete in deletes {
            delete.await.unwrap();
        }
        for &i in &doomed {
            let reason = tokio::time::timeout(Duration::from_secs(5), guards[i].lost())
                .await
                .unwrap_or_else(|_| panic!("round {round}: hold {i} not told"));
            assert_eq!(reason, LossReason::NodeDeleted);
        }
        let mut signals = Vec::new();
        for (i, guard) in guards.into_iter().enumerate() {
            if doomed.contains(&i) {
                continue;
            }
            assert_eq!(guard.state(), LockState::Held, "round {round}: hold {i} told another's loss");
            signals.push(guard.loss_signal());
            guard.release().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for signal in signals {
            assert_eq!(signal.reason(), None, "round {round}: released hold told a loss");
        }
    }
    for round in 0..3usize {
        for i in 0..40usize {
            assert_no_nodes_left(&admin, &format!("{base}/{round}-{i}")).await;
        }
    }
}
