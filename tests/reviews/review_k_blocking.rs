//! Review K: one task drives every own-node watch of a session. A holder that blocks its worker
//! thread right after waking that task (reading a fresh hold's state) must not delay what
//! *other* holds on the session are told (with a task per hold, it did not).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{InterProcessMutex, LockState, LossReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_holder_does_not_delay_another_holds_node_deleted() {
    let base = unique_path("k-block");
    let admin = client().await;
    let session = client().await;
    let a = InterProcessMutex::new(session.clone(), format!("{base}/a")).unwrap();
    let guard_a = a.acquire().await.unwrap();
    assert_eq!(guard_a.state(), LockState::Held);
    // A's watch is set and waiting in the driver.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let b = InterProcessMutex::new(session.clone(), format!("{base}/b")).unwrap();
    let (blocking_tx, blocking_rx) = tokio::sync::oneshot::channel();
    let blocker = tokio::spawn(async move {
        let guard_b = b.acquire().await.unwrap();
        // Starts B's watch: wakes the driver, onto this worker (its LIFO slot)...
        assert_eq!(guard_b.state(), LockState::Held);
        blocking_tx.send(()).unwrap();
        // ...which the holder then blocks (a CPU-bound or blocking section under the lock).
        std::thread::sleep(Duration::from_secs(6));
        guard_b
    });
    blocking_rx.await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted_at = Instant::now();
    admin.delete(guard_a.lock_path(), None).await.unwrap();
    let told = tokio::time::timeout(Duration::from_secs(3), guard_a.lost()).await;
    let took = deleted_at.elapsed();
    let guard_b = blocker.await.unwrap();
    guard_b.release().await.unwrap();
    drop(guard_a);
    assert_no_nodes_left(&admin, &format!("{base}/a")).await;
    assert_no_nodes_left(&admin, &format!("{base}/b")).await;
    assert_eq!(
        told.unwrap_or_else(|_| panic!(
            "hold A not told its node was deleted within 3 s while B's holder blocks a worker"
        )),
        LossReason::NodeDeleted
    );
    eprintln!("hold A told after {took:?}");
}
