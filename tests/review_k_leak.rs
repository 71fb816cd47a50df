//! Review K: nothing the own-node watches keep grows without bound over many acquire/release
//! cycles. A semaphore's internal lock does not watch its nodes: its holds are handed
//! `NodeWatch::never()`, which `track` passes on to the own-node watch driver.

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::time::Duration;

use common::*;
use counting_alloc::live_heap_bytes;
use zk_recipes::{InterProcessMutex, InterProcessSemaphoreV2};

const WARM: usize = 100;
const CYCLES: usize = 600;

async fn settled_heap() -> i64 {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    live_heap_bytes() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_cycles_keep_no_heap() {
    let base = unique_path("k-leak");
    let admin = client().await;
    let session = client().await;

    let mutex = InterProcessMutex::new(session.clone(), format!("{base}/mutex")).unwrap();
    let semaphore = InterProcessSemaphoreV2::new(session.clone(), format!("{base}/sem"), 2).unwrap();
    for _ in 0..WARM {
        mutex.acquire().await.unwrap().release().await.unwrap();
        semaphore.acquire().await.unwrap().release().await.unwrap();
    }

    let before = settled_heap().await;
    for _ in 0..CYCLES {
        let guard = mutex.acquire().await.unwrap();
        let _ = guard.state();
        guard.release().await.unwrap();
    }
    let after_mutex = settled_heap().await;
    for _ in 0..CYCLES {
        let lease = semaphore.acquire().await.unwrap();
        let _ = lease.state();
        lease.release().await.unwrap();
    }
    let after_semaphore = settled_heap().await;

    let per_mutex_cycle = (after_mutex - before) / CYCLES as i64;
    let per_semaphore_cycle = (after_semaphore - after_mutex) / CYCLES as i64;
    eprintln!("heap kept per cycle: mutex {per_mutex_cycle} B, semaphore {per_semaphore_cycle} B");
    assert_no_nodes_left(&admin, &format!("{base}/mutex")).await;
    // (A mutex cycle measures 40-110 B here: buffers still growing, not a per-hold record.)
    assert!(per_mutex_cycle < 250, "a mutex acquire/release cycle keeps {per_mutex_cycle} B");
    // A hold of the semaphore's internal lock hands the driver `NodeWatch::never()`: a future
    // that never ends (~530 B with its retained `HoldFeed`), kept until the runtime ends.
    assert!(per_semaphore_cycle < 250, "a semaphore acquire/release cycle keeps {per_semaphore_cycle} B");
}
