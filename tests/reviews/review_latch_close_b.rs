//! Review 20b's reproductions against `LeaderLatch::close` (commit 8946866). Each asserts a promise
//! of the close rewrite and fails on that commit: (a) once `close` returns `Ok`, no node of the
//! latch is left while its session is open (`close_returns_ok_*`); (b)/(c) a `close` retried after
//! a dropped one waits for the same work (`a_close_retried_outside_tokio_*`); (d) nothing
//! deadlocks (`close_hangs_on_*`).

use crate::common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::*;
use zk_recipes::LeaderLatch;
use zk_testcontainers::{op, FaultProxy};

/// A one-shot acquire whose future is alive but not being polled (kept across a timeout, a common
/// "try for a while, then give up" shape) when `close` is called in the same task: `close` waits
/// for that one-shot to see the close — which it can only do once `close` returned. Deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_hangs_on_a_pending_one_shot_that_is_not_polled() {
    let path = unique_path("review-b-one-shot-unpolled");
    let leader = LeaderLatch::builder(client().await, &path).id("leader").build().unwrap();
    let leadership = leader.acquire_once().await.unwrap();
    let latch = LeaderLatch::builder(client().await, &path).id("x").build().unwrap();
    let mut acquire = pin!(latch.acquire_once());
    // Polled for a while (queued behind the leader), then given up on — but not dropped yet.
    assert!(tokio::time::timeout(Duration::from_millis(500), &mut acquire).await.is_err());
    let closed = tokio::time::timeout(Duration::from_secs(5), latch.close()).await;
    println!("close with the one-shot future still alive: {closed:?}");
    drop(leadership);
    assert!(
        closed.is_ok(),
        "close did not return within 5 s: it waits for a one-shot future only its own caller can poll"
    );
}

/// `acquire_once_timeout` times out (`Ok(None)`: its node is deleted in the background), then
/// `close()`: it returns `Ok` at once — no task, no one-shot in flight, so no wait and no round
/// trip — while the one-shot's node is still on the server (its delete held 2 s by the proxy).
/// The same happens after a cancelled `acquire_once` or a dropped one-shot guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_ok_while_a_timed_out_one_shots_node_is_still_there() {
    let zk = zookeeper().await;
    let path = unique_path("review-b-one-shot-timeout");
    let observer = client().await;
    let leader = LeaderLatch::builder(client().await, &path).id("leader").build().unwrap();
    let leadership = leader.acquire_once().await.unwrap();
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(6)).connect(&proxy.addr()).await.expect("connect");
    let latch = LeaderLatch::builder(session.clone(), &path).id("x").build().unwrap();
    proxy.delay_requests(&[op::DELETE], Duration::from_secs(2));
    let timed_out = latch.acquire_once_timeout(Duration::from_millis(500)).await.unwrap();
    assert!(timed_out.is_none());
    latch.close().await.unwrap();
    let left = queued_nodes(&observer, &path, "-latch-").await;
    assert!(matches!(observer.check_stat("/").await, Ok(Some(_))));
    assert!(!session.state().is_terminated(), "the session is still open");
    drop(leadership);
    assert_eq!(left.len(), 1, "close returned Ok with the latch's node still there: {left:?}");
}

/// A started latch closed outside any tokio runtime (a plain thread: the confirmation runs inline),
/// its first `close` dropped unfinished, then `close` again: the doc says a dropped `close` only
/// stops waiting and the next one waits for the same work; here the next one fails at once
/// ("its close was stopped before it finished"), and every later one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_retried_outside_tokio_after_a_dropped_one_fails() {
    let path = unique_path("review-b-close-no-runtime");
    let latch = LeaderLatch::builder(client().await, &path).id("a").build().unwrap();
    latch.start().unwrap();
    drop(latch.await_leadership().await.unwrap());
    let retried = std::thread::spawn(move || {
        {
            let mut first = Box::pin(latch.close());
            let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
            let polled = first.as_mut().poll(&mut Context::from_waker(&waker));
            assert!(polled.is_pending(), "the first close needs the server");
        }
        block_on(latch.close())
    })
    .join()
    .unwrap();
    println!("retried close: {retried:?}");
    assert!(retried.is_ok(), "a close retried after a dropped one: {retried:?}");
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// A started latch queued behind a leader is closed while the connection breaks: the queued node's
/// delete (sent when the task's acquire is dropped) and `close`'s confirming listing are both cut
/// off and retried, each after its own backoff, on the next connection. `close` counts on the
/// listing being answered after the delete ("a session's requests are answered in order"), but the
/// retries are two independent requests: when the listing's retry goes first, `close` returns `Ok`
/// while the node is still there (its delete held by the proxy). The listing's result is not
/// looked at. Several rounds, as which retry goes first is up to the scheduler. (Cut three times
/// per round, then left alone, so that the delete can go through.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_returns_ok_before_a_retried_delete_of_the_queued_node() {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let zk = zookeeper().await;
    let observer = client().await;
    let mut outcomes = Vec::new();
    for round in 0..8 {
        let path = unique_path("review-b-close-retried-delete");
        let leader = LeaderLatch::builder(client().await, &path).id("leader").build().unwrap();
        let leadership = leader.acquire_once().await.unwrap();
        let leaders_node = leadership.lock_path().rsplit('/').next().unwrap().to_owned();
        let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
        let session =
            zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");
        let latch = LeaderLatch::builder(session.clone(), &path).id("x").build().unwrap();
        latch.start().unwrap();
        eventually(Duration::from_secs(5), "x queued", || async {
            queued_nodes(&observer, &path, "-latch-").await.len() == 2
        })
        .await;
        proxy.delay_requests(&[op::DELETE], Duration::from_secs(3));
        let mut close = tokio::spawn({
            let latch = latch.clone();
            async move { latch.close().await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Cut while the delete is held, a few times (each cut makes both retry); then let the
        // delete through (a delete held 3 s never passes a cut every 700 ms, and a close that
        // waits for it — as it must — would wait for ever).
        let mut cuts = 0;
        let result = loop {
            if cuts < 3 {
                proxy.cut();
                cuts += 1;
            }
            tokio::select! {
                result = &mut close => break result.unwrap(),
                () = tokio::time::sleep(Duration::from_millis(700)) => {},
            }
        };
        let left = queued_nodes(&observer, &path, "-latch-").await;
        let open = !session.state().is_terminated();
        let requests_at_close = proxy.requests();
        println!("round {round}: close {result:?}, then {} node(s) left: {left:?}, session open: {open}", left.len());
        let violated = result.is_ok() && open && left.len() == 2;
        outcomes.push(violated);
        if violated {
            let since = std::time::Instant::now();
            let ours = |nodes: Vec<String>| nodes.into_iter().any(|node| node != leaders_node);
            while ours(queued_nodes(&observer, &path, "-latch-").await) && since.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("the node went {:?} after close returned Ok; requests through the proxy (op: count) when close returned: {requests_at_close:?}, then: {:?}", since.elapsed(), proxy.requests());
        }
        proxy.delay_requests(&[], Duration::ZERO);
        drop(leadership);
        if violated {
            break;
        }
    }
    assert!(!outcomes.contains(&true), "close returned Ok with the queued node still there: {outcomes:?}");
}
