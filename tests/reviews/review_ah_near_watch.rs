//! Review AH (`e4624db`: a queued waiter watches its own node only once its turn is near): a
//! reader behind a writer that is never near, its node deleted unseen, is granted only on a new
//! node; a hold granted without that watch still reports its node deleted.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessReadWriteLock, LockState, LossReason};
use zookeeper_client as zk;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The reader's queue of both tests: three foreign readers, a foreign writer (fourth, never
/// "near"), then our reader, waiting with its watch on the writer set. Returns the raw client, the
/// writer's path, our node's path and the waiting acquire.
async fn reader_behind_far_writer(
    name: &str,
) -> (zk::Client, String, String, tokio::task::JoinHandle<zk_recipes::LockGuard>) {
    let path = unique_path(name);
    let raw = client().await;
    raw.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    for _ in 0..3 {
        foreign_lock_node(&raw, &path, "__READ__").await;
    }
    let writer = foreign_lock_node(&raw, &path, "__WRIT__").await;
    let rw = InterProcessReadWriteLock::new(client().await, &path).unwrap();
    let waiter = tokio::spawn({
        let read = rw.read_lock();
        async move { read.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "queued", || async { children(&raw, &path).await.len() == 5 }).await;
    let ours = format!("{path}/{}", queued_nodes(&raw, &path, "__").await[4]);
    eventually(Duration::from_secs(10), "watches the writer", || async { watchers_of(&writer).await == 1 }).await;
    (raw, writer, ours, waiter)
}

/// A reader waits for the nearest writer, which can be far from the head of the view while only
/// readers are ahead of it: three foreign readers, a foreign writer, then our reader. The writer
/// is fourth, never "near". When it goes, the reader is granted from the view with no own-node
/// watch: it must read its node first (here: deleted meanwhile, unseen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_behind_far_writer_is_not_granted_with_its_node_gone() {
    init_tracing();
    let _alone = SERIAL.lock().await;
    let (raw, writer, ours, waiter) = reader_behind_far_writer("ah-rw-gone").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(watchers_of(&ours).await, 0, "own node watched though the writer is not near");
    raw.delete(&ours, None).await.unwrap();
    raw.delete(&writer, None).await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    assert_ne!(guard.lock_path(), ours, "granted with a deleted node");
    assert!(raw.check_stat(guard.lock_path()).await.unwrap().is_some());
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
}

/// Same queue; the reader's node stays. Granted after a handoff with no own-node watch: the hold
/// must still get one (lazily, from the session monitor) and report a deletion of its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_granted_without_watch_still_reports_its_node_deleted() {
    init_tracing();
    let _alone = SERIAL.lock().await;
    let (raw, writer, ours, waiter) = reader_behind_far_writer("ah-rw-held").await;
    raw.delete(&writer, None).await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    assert_eq!(guard.lock_path(), ours);
    // Deleted at once, before the lazy watch (100 ms) is set: NoNode then.
    raw.delete(&ours, None).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("deletion reported");
    assert_eq!(lost, LossReason::NodeDeleted);
}
