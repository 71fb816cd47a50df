//! Review N: the requests a burst of acquires of new lock paths sends, per held lock, the hold's
//! own-node watch included — what `examples/hold_cost` with `BURST=1` claims but once checked only
//! as an upper bound (a hold that never set its watch would pass). Here at a small scale, exactly,
//! by type: since a session guesses new directories missing (`src/engine/directory_guess.rs`,
//! review AC), how many acquires send a plain create first depends on when the first answers come.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockState};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// Locks on new paths under a parent that exists, all acquired at once on one session, each
/// guard's state read once (as `hold_cost` does): per held lock one `multi` (the directory with
/// the node), the listing behind it and the hold's own-node watch (`getData`); an acquire that
/// guessed its directory there also a create (answered `NoNode`) and the listing behind that —
/// at most the session's first window of creates and one more (`hold_cost`'s argument), here all
/// 200 at most; and nothing more once they are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_paths_sends_exactly_its_requests_per_held_lock() {
    const HOLDS: u64 = 200;
    let raw = client().await;
    let parent = unique_path("review-n-burst");
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let mutexes: Vec<_> =
        (0..HOLDS).map(|i| InterProcessMutex::new(session.clone(), format!("{parent}/lock-{i}")).unwrap()).collect();
    let before = proxy.requests();
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
        count(&sent_between(&before, &proxy.requests()), op::GET_DATA) >= HOLDS
    })
    .await;
    // Settled: nothing more is sent for the holds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = sent_between(&before, &proxy.requests());
    let creates = count(&sent, op::CREATE2);
    let mut expected =
        vec![(op::GET_DATA, HOLDS), (op::GET_CHILDREN2, HOLDS + creates), (op::MULTI, HOLDS), (op::CREATE2, creates)];
    expected.retain(|(_, n)| *n > 0);
    expected.sort();
    assert_eq!(sent, expected, "by type, for {HOLDS} held locks");
    assert!(creates <= HOLDS, "{creates} creates");
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
