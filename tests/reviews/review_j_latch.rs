//! Review J: lock-delay and a leader latch that steps down after a loss.
//!
//! README, *Lock-delay*: "A release by the holder (or a latch's `close`) deletes its node in one
//! `multi` with a write of the lock directory's data [...] Everything else is unclean: [...] a
//! hold whose lease ran out" — the library releasing for a holder that may still be running
//! (`delay.rs`). A started latch whose leadership is lost to its connection (the default policy:
//! a disconnection costs the leadership) drops its leadership and queues again; if the session
//! survives, that drop deletes the node — released by the library, not by the holder, nor by a
//! close. It is marked clean (`Holds::release_guard` → `Hold::end(None)`), so the next participant
//! is elected at once instead of the delay later.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::LeaderLatch;
use zk_testcontainers::FaultProxy;

const DELAY: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_stepping_down_after_its_connection_dropped_is_not_a_clean_release() {
    let zk = zookeeper().await;
    let path = unique_path("rj-latch-step-down");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let a_client =
        zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");
    let (b_client, observer) = (client().await, client().await);
    let latch = |client: &zookeeper_client::Client, id: &str| {
        LeaderLatch::builder(client.clone(), &path).id(id).lock_delay(DELAY).build().unwrap()
    };
    // The first acquire on a new path pays the delay; its clean release marks the directory.
    latch(&observer, "warm").acquire_once().await.unwrap().release().await.unwrap();

    let a = latch(&a_client, "a");
    a.start().unwrap();
    let leadership = a.await_leadership().await.unwrap();
    let signal = leadership.loss_signal();
    let a_session = a_client.session_id().0;
    // The application keeps no guard of its own: it follows the latch (`has_leadership`).
    drop(leadership);
    let b = latch(&b_client, "b");
    b.start().unwrap();
    eventually(Duration::from_secs(10), "b queued", || async {
        queued_nodes(&observer, &path, "-latch-").await.len() == 2
    })
    .await;
    let b_elected = {
        let b = b.clone();
        tokio::spawn(async move {
            let guard = b.await_leadership().await.unwrap();
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cut_at = Instant::now();
    proxy.cut();
    let reason = tokio::time::timeout(Duration::from_secs(10), signal.lost()).await.expect("a told lost");
    let lost_after = cut_at.elapsed();
    let (elected_at, guard) = tokio::time::timeout(DELAY * 4, b_elected).await.expect("b elected").unwrap();
    let a_alive = a_client.session_id().0 == a_session && !a_client.state().is_terminated();
    eprintln!(
        "a lost its leadership ({reason}) {:?} after the cut (session alive: {a_alive}); b elected {:?} after the cut",
        lost_after,
        elected_at - cut_at
    );
    assert!(a_alive, "the session should survive the brief cut");
    assert!(
        elected_at - cut_at >= DELAY,
        "b elected {:?} after a's connection dropped: a's node went without a release by the holder and the delay \
         ({DELAY:?}) was not waited",
        elected_at - cut_at
    );
    drop(guard);
    b.close().await.unwrap();
    a.close().await.unwrap();
}
