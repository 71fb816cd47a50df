//! Review N: the requests a burst of acquires of new lock paths sends, per held lock, the hold's
//! own-node watch included — what `examples/hold_cost` with `BURST=1` claims (CHANGELOG: "exactly
//! 5 requests per lock") but checks only as an upper bound (`requests_per_hold > 5` fails; a hold
//! that never set its watch, 4, would pass). Here at a small scale, exactly.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockState};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// Requests other than pings and the monitor's `sync` heartbeats seen at `proxy`, and its
/// `getData`s.
fn sent(proxy: &FaultProxy) -> (u64, u64) {
    let requests = proxy.requests();
    let all = requests.iter().filter(|(&code, _)| code != op::PING && code != op::SYNC).map(|(_, n)| n).sum();
    (all, requests.get(&op::GET_DATA).copied().unwrap_or(0))
}

/// Locks on new paths under a parent that exists, all acquired at once on one session, each
/// guard's state read once (as `hold_cost` does): 4 requests per acquire and the hold's own-node
/// watch (`getData`), 5 per held lock, and nothing more once they are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_paths_sends_exactly_five_requests_per_held_lock() {
    const HOLDS: u64 = 200;
    let raw = client().await;
    let parent = unique_path("review-n-burst");
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let mutexes: Vec<_> =
        (0..HOLDS).map(|i| InterProcessMutex::new(session.clone(), format!("{parent}/lock-{i}")).unwrap()).collect();
    let (all_before, gets_before) = sent(&proxy);
    let handles: Vec<_> = mutexes
        .iter()
        .map(|mutex| {
            tokio::spawn({
                let mutex = mutex.clone();
                async move { mutex.acquire().await.unwrap() }
            })
        })
        .collect();
    let mut guards = Vec::new();
    for handle in handles {
        let guard = handle.await.unwrap();
        assert_eq!(guard.state(), LockState::Held);
        guards.push(guard);
    }
    eventually(Duration::from_secs(20), "every hold's own-node watch set", || async {
        sent(&proxy).1 - gets_before >= HOLDS
    })
    .await;
    // Settled: nothing more is sent for the holds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (all, gets) = sent(&proxy);
    assert_eq!(gets - gets_before, HOLDS, "one own-node watch per hold");
    assert_eq!(
        all - all_before,
        5 * HOLDS,
        "{:.2} requests per held lock (published: 5): {:?}",
        (all - all_before) as f64 / HOLDS as f64,
        proxy.requests()
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    for i in 0..HOLDS {
        assert_no_nodes_left_while_open(
            &raw,
            &format!("{parent}/lock-{i}"),
            std::slice::from_ref(&session),
            Duration::from_secs(10),
        )
        .await;
    }
}
