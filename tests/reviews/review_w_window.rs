//! Review W (of the session's window of creates, `session/monitor.rs`, *A window of creates*):
//! an acquire cancelled while it waits for a place in the window has sent nothing, so it leaves
//! nothing to look for. Before the fix its pending node, armed before the wait, started a GUID
//! search (a `getChildren` of the lock directory) in the background for each such acquire: with
//! thousands queued (a burst of `acquire_timeout`s, or a `close()`), as many listings at once,
//! ahead of the heartbeats the window keeps clear.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::op;
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_while_it_waits_for_a_place_in_the_window_sends_nothing() {
    init_tracing();
    let (proxy, session) = proxied_session(Duration::from_secs(30)).await;
    let observer = client().await;
    let parent = unique_path("window-cancel");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.mkdir(&parent, &persistent).await.unwrap();
    // More acquires than the window has places (512), then the ones cancelled while they wait.
    let (filling, cancelled) = (600, 50);
    let paths: Vec<String> = (0..filling + cancelled).map(|i| format!("{parent}/lock-{i}")).collect();
    for path in &paths {
        observer.create(path, &[], &persistent).await.unwrap();
    }
    // The first create is held at the proxy, and every request behind it: no create is answered,
    // so every place stays taken.
    proxy.delay_requests(&[op::CREATE2], Duration::from_secs(3));
    let spawn = |path: &String| {
        let mutex = InterProcessMutex::new(session.clone(), path).unwrap();
        tokio::spawn(async move { mutex.acquire().await })
    };
    let filling_acquires: Vec<_> = paths[..filling].iter().map(spawn).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting: Vec<_> = paths[filling..].iter().map(spawn).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for acquire in &waiting {
        acquire.abort();
    }
    for acquire in waiting {
        assert!(acquire.await.is_err_and(|err| err.is_cancelled()), "still waiting for a place when cancelled");
    }
    proxy.delay_requests(&[], Duration::ZERO);
    let mut guards = Vec::new();
    for acquire in filling_acquires {
        guards.push(acquire.await.unwrap().unwrap());
    }
    // A background search would have been queued at the cancel, behind the held creates: sent by now.
    let searches = proxy.requests().get(&op::GET_CHILDREN).copied().unwrap_or(0);
    // Only the filling acquires sent creates: the cancelled ones were waiting for a place (not
    // merely slower to start on a loaded machine).
    let creates = proxy.requests().get(&op::CREATE2).copied().unwrap_or(0);
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(creates, filling as u64, "creates sent: the cancelled acquires must not have had a place");
    assert_eq!(searches, 0, "listings of a lock directory by GUID (getChildren) for acquires that sent nothing");
    for path in &paths {
        assert_no_nodes_left_while_open(&observer, path, std::slice::from_ref(&session), Duration::from_secs(10)).await;
    }
}
