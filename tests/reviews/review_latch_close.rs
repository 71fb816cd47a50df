//! Review 20's reproductions of `LeaderLatch::close` returning `Ok` while a node of the latch was
//! still on the server (its session open), outside a started latch's task. Each asserts the
//! promise: when `close` returns `Ok`, no node of the latch is left and the latch leads no more —
//! for a one-shot acquire waiting on a latent latch (it fails, its node deleted) and for a
//! `close` retried after a cancelled one (it waits for the same work).

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::LeaderLatch;
use zk_testcontainers::{op, FaultProxy};

/// A latent latch with a one-shot `acquire_once` queued (another latch leads): `close()` returns
/// `Ok` at once — no task, so no wait — with the one-shot's node still queued, and that acquire
/// is later *granted*: a leadership of a closed latch (`has_leadership()` true after `close`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_of_a_latent_latch_leaves_its_queued_one_shot_in_the_election() {
    let path = unique_path("review-latch-one-shot");
    let observer = client().await;
    let leader = LeaderLatch::builder(client().await, &path).id("leader").build().unwrap();
    let leadership = leader.acquire_once().await.unwrap();
    let session = client().await;
    let latch = LeaderLatch::builder(session.clone(), &path).id("x").build().unwrap();
    let waiting = tokio::spawn({
        let latch = latch.clone();
        async move { latch.acquire_once().await }
    });
    eventually(Duration::from_secs(5), "x queued", || async {
        queued_nodes(&observer, &path, "-latch-").await.len() == 2
    })
    .await;
    latch.close().await.unwrap();
    let left = queued_nodes(&observer, &path, "-latch-").await;
    let after_close = left.len();
    leadership.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    let led_after_close = latch.has_leadership();
    println!("after close: {left:?}; the one-shot then: {granted:?}; has_leadership: {led_after_close}");
    assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the session is still open");
    assert_eq!(after_close, 1, "close returned Ok with the latch's queued node still there: {left:?}");
    assert!(!led_after_close, "a closed latch leads");
}

/// A `close()` cancelled while the leader's delete is in flight (here: held 1 s by the proxy), then
/// `close()` again, as a caller retrying after a timeout does: the second call returns `Ok` at
/// once, before the delete is applied — the node is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_retried_after_a_cancelled_one_returns_before_the_node_is_deleted() {
    let zk = zookeeper().await;
    let path = unique_path("review-latch-close-retry");
    let observer = client().await;
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(6)).connect(&proxy.addr()).await.expect("connect");
    let latch = LeaderLatch::builder(session.clone(), &path).id("a").build().unwrap();
    latch.start().unwrap();
    let leadership = latch.await_leadership().await.unwrap();
    drop(leadership);
    proxy.delay_requests(&[op::DELETE], Duration::from_secs(1));
    let first = tokio::time::timeout(Duration::from_millis(100), latch.close()).await;
    assert!(first.is_err(), "the first close is cut short by its timeout");
    latch.close().await.unwrap();
    let left = children(&observer, &path).await;
    assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the session is still open");
    assert!(left.is_empty(), "the retried close returned Ok with {left:?} still there");
}
