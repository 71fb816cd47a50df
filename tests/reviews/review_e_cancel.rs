//! Review E: cancelling acquires of a semaphore whose pool has room (the grant window: creates,
//! pipelined listing, vouching, internal lock release) leaves no node.

use crate::common;

use std::time::Duration;

use common::*;
use rand::Rng;
use zk_recipes::InterProcessSemaphoreV2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_in_the_grant_window_leave_no_node() {
    let path = unique_path("review-e-cancel");
    let (a, b) = (client().await, client().await);
    let sem_a = InterProcessSemaphoreV2::new(a.clone(), &path, 3).unwrap();
    let sem_b = InterProcessSemaphoreV2::new(b.clone(), &path, 3).unwrap();
    let (mut granted, mut cancelled) = (0, 0);
    for i in 0..300u64 {
        let cut = Duration::from_micros(rand::rng().random_range(0..15000) + (i % 30) * 400);
        let qty = 1 + (i as usize % 3);
        let (x, y) = tokio::join!(
            tokio::time::timeout(cut, sem_a.acquire_many(qty)),
            tokio::time::timeout(cut * 2, sem_b.acquire_many(3 - qty + 1)),
        );
        for r in [x, y] {
            match r {
                Ok(Ok(leases)) => {
                    granted += 1;
                    drop(leases);
                },
                Ok(Err(err)) => panic!("{err}"),
                Err(_) => cancelled += 1,
            }
        }
    }
    eprintln!("granted {granted}, cancelled {cancelled}");
    for dir in ["leases", "locks"] {
        assert_no_nodes_left_while_open(&a, &format!("{path}/{dir}"), &[a.clone(), b.clone()], Duration::from_secs(15))
            .await;
    }
    // Still usable at full size.
    let all = sem_a.acquire_many_timeout(3, Duration::from_secs(10)).await.unwrap().expect("pool free");
    drop(all);
}
