//! `InterProcessReadWriteLock` against a real ZooKeeper: readers share, writers exclude, fairness,
//! the downgrade (no writer slips in, also one queued before the read node), the upgrade refused,
//! re-entry, loss of a downgraded read, no listing per reader on a writer's release, no node left.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use zk_recipes::{Error, FencedWriteError, InterProcessReadWriteLock, LockState, LossReason};
use zk_testcontainers::{op, FaultProxy};

/// A read/write lock on `path` with a session of its own.
async fn rw(path: &str) -> InterProcessReadWriteLock {
    InterProcessReadWriteLock::new(client().await, path).unwrap()
}

/// The node names under `path`, in sequence order.
async fn queue(path: &str) -> Vec<String> {
    let mut names = children(&client().await, path).await;
    names.sort_by_key(|name| name[name.len() - 10..].to_owned());
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude() {
    let path = unique_path("rw-share");
    let (a, b, c) = (rw(&path).await, rw(&path).await, rw(&path).await);
    let r1 = a.read_lock().acquire().await.unwrap();
    let r2 = tokio::time::timeout(Duration::from_secs(10), b.read_lock().acquire())
        .await
        .expect("a second reader is granted while the first holds")
        .unwrap();
    assert_ne!(r1.fencing_token(), r2.fencing_token());
    assert!(c.write_lock().try_acquire().await.unwrap().is_none(), "a writer is excluded by readers");
    assert!(queue(&path).await.iter().all(|name| name.contains("__READ__")), "try_acquire left its node");
    let writer = tokio::spawn({
        let write = c.write_lock();
        async move { write.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "writer queued", || async { queue(&path).await.len() == 3 }).await;
    r1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "writer granted while a reader still holds");
    r2.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(10), writer).await.expect("writer granted").unwrap();
    assert_eq!(w.state(), LockState::Held);
    // Nobody else while the writer holds: neither a reader nor a writer.
    assert!(a.read_lock().try_acquire().await.unwrap().is_none());
    assert!(b.write_lock().try_acquire().await.unwrap().is_none());
    // The node names are Curator's.
    let names = queue(&path).await;
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("_c_") && names[0].contains("-__WRIT__"), "{names:?}");
    w.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// Fair: a reader queued behind a waiting writer waits for that writer; a writer's release lets in
/// every reader up to the next writer (and no further), each deciding from the process's view of
/// the directory — no listing per reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_lets_the_readers_up_to_the_next_writer_in_without_listings() {
    let path = unique_path("rw-fair");
    let holder = rw(&path).await;
    let held = holder.write_lock().acquire().await.unwrap();
    // The waiters' session goes through a (passing) proxy that counts its requests.
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let waiters_client = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let waiting = InterProcessReadWriteLock::new(waiters_client, &path).unwrap();
    let mut readers = Vec::new();
    let spawn_reader = |lock: &InterProcessReadWriteLock| {
        let read = lock.read_lock();
        tokio::spawn(async move { read.acquire().await.unwrap() })
    };
    for _ in 0..3 {
        readers.push(spawn_reader(&waiting));
        eventually(Duration::from_secs(10), "reader queued", || async {
            queue(&path).await.len() == readers.len() + 1
        })
        .await;
    }
    let second_writer = tokio::spawn({
        let write = rw(&path).await.write_lock();
        async move { write.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "writer queued", || async { queue(&path).await.len() == 5 }).await;
    let late_reader = spawn_reader(&waiting);
    eventually(Duration::from_secs(10), "late reader queued", || async { queue(&path).await.len() == 6 }).await;
    // Let every waiter set its watches before the handoff.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = proxy.requests();
    held.release().await.unwrap();
    let mut granted = Vec::new();
    for reader in readers {
        granted.push(tokio::time::timeout(Duration::from_secs(10), reader).await.expect("reader granted").unwrap());
    }
    let after = proxy.requests();
    let listings: u64 = [op::GET_CHILDREN, op::GET_CHILDREN2]
        .iter()
        .map(|code| after.get(code).copied().unwrap_or(0) - before.get(code).copied().unwrap_or(0))
        .sum();
    let by_op: BTreeMap<_, _> = after
        .iter()
        .filter(|(code, _)| **code != op::PING)
        .map(|(code, count)| (*code, count - before.get(code).copied().unwrap_or(0)))
        .filter(|(_, delta)| *delta > 0)
        .collect();
    eprintln!("three readers let in by one writer's release; their session sent {by_op:?} (op code: count)");
    assert_eq!(listings, 0, "a writer's release made the readers list the directory: {by_op:?}");
    // The second writer and the reader behind it still wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second_writer.is_finished(), "the writer was granted while readers hold");
    assert!(!late_reader.is_finished(), "a reader queued behind a waiting writer was let in ahead of it");
    for guard in granted {
        guard.release().await.unwrap();
    }
    let w = tokio::time::timeout(Duration::from_secs(10), second_writer).await.expect("writer granted").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!late_reader.is_finished(), "a reader was granted while the writer holds");
    w.release().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), late_reader).await.expect("late reader granted").unwrap();
    r.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// The downgrade: inside a write scope a read is granted at once; the write lock is then released,
/// and no writer — neither one queued before our read node (between our write and read nodes,
/// which Curator 5.4 lets in) nor one queued after it — is granted while the read lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_every_writer_out_while_the_read_lasts() {
    let path = unique_path("rw-downgrade");
    let ours = rw(&path).await;
    let (read, write) = (ours.read_lock(), ours.write_lock());
    let scoped_read = read.clone();
    let other = rw(&path).await;
    let spawn_writer = || {
        let write = other.write_lock();
        tokio::spawn(async move { write.acquire().await.unwrap() })
    };
    let inner_path = path.clone();
    let (first_writer, read_guard, write_token) = write
        .with_lock(|write_guard| async move {
            // A writer queues between our write node and the read node we are about to create.
            let first_writer = spawn_writer();
            eventually(Duration::from_secs(10), "writer queued", || async { queue(&inner_path).await.len() == 2 })
                .await;
            let read_guard = tokio::time::timeout(Duration::from_secs(5), scoped_read.acquire())
                .await
                .expect("the downgrade is granted at once")
                .unwrap();
            assert_ne!(read_guard.fencing_token(), write_guard.fencing_token(), "the read hold has its own token");
            (first_writer, read_guard, write_guard.fencing_token())
        })
        .await
        .unwrap();
    // The write scope is over: our write guards are gone, the read stays.
    assert!(!write.is_acquired_in_this_process(), "no write guard is left");
    assert!(read.is_acquired_in_this_process());
    let second_writer = spawn_writer();
    eventually(Duration::from_secs(10), "second writer queued", || async { queue(&path).await.len() == 4 }).await;
    let names = queue(&path).await;
    assert!(names[0].contains("__WRIT__") && names[2].contains("__READ__"), "{names:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!first_writer.is_finished(), "a writer queued before our read node slipped in during the downgrade");
    assert!(!second_writer.is_finished(), "a writer slipped in during the downgrade");
    assert_eq!(read_guard.state(), LockState::Held);
    let mut fenced = read_guard.fenced_writer();
    fenced.add_check_version(&path, -1).unwrap();
    fenced.commit().await.expect("a fenced write through the downgraded read");

    read_guard.release().await.unwrap();
    let w1 = tokio::time::timeout(Duration::from_secs(10), first_writer).await.expect("first writer granted").unwrap();
    assert!(w1.fencing_token().as_i64() > write_token.as_i64());
    assert!(!second_writer.is_finished());
    w1.release().await.unwrap();
    let w2 =
        tokio::time::timeout(Duration::from_secs(10), second_writer).await.expect("second writer granted").unwrap();
    w2.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// A downgraded read rests on the write node: if that node is deleted (by hand, here), the read
/// hold is lost, and a fenced write through it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_read_is_lost_with_its_write_node() {
    let path = unique_path("rw-downgrade-lost");
    let ours = rw(&path).await;
    let read = ours.read_lock();
    let read_guard = ours.write_lock().with_lock(|_| async move { read.acquire().await.unwrap() }).await.unwrap();
    let names = queue(&path).await;
    assert_eq!(names.len(), 2, "the write node stays while the downgraded read lasts: {names:?}");
    let write_node = format!("{path}/{}", names[0]);
    assert!(write_node.contains("__WRIT__"));
    client().await.delete(&write_node, None).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), read_guard.lost()).await.expect("the read is told");
    assert_eq!(reason, LossReason::NodeDeleted);
    assert_eq!(read_guard.state(), LockState::Lost(LossReason::NodeDeleted));
    let mut fenced = read_guard.fenced_writer();
    fenced.add_check_version(&path, -1).unwrap();
    assert!(matches!(fenced.commit().await, Err(FencedWriteError::LockLost)));
    read_guard.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// An upgrade (a write acquire inside a read scope) fails at once and queues nothing; re-entry
/// works for both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_is_refused_and_reentry_works() {
    let path = unique_path("rw-upgrade");
    let ours = rw(&path).await;
    let (read, write) = (ours.read_lock(), ours.write_lock());
    let observed_path = path.clone();
    let inner_read = read.clone();
    read.with_lock(|guard| async move {
        let again = inner_read.acquire().await.unwrap();
        assert_eq!(again.fencing_token(), guard.fencing_token(), "read re-entry");
        let started = std::time::Instant::now();
        let upgrade = tokio::time::timeout(Duration::from_secs(5), write.acquire()).await.expect("never waits");
        assert!(matches!(upgrade, Err(Error::Upgrade { .. })), "{upgrade:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(queue(&observed_path).await.len(), 1, "the refused upgrade queued a node");
        assert!(write.try_acquire().await.is_err());
    })
    .await
    .unwrap();
    let write = ours.write_lock();
    let inner_write = write.clone();
    write
        .with_lock(|guard| async move {
            let again = inner_write.acquire().await.unwrap();
            assert_eq!(again.fencing_token(), guard.fencing_token(), "write re-entry");
        })
        .await
        .unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// A read acquire that times out behind a writer, and one whose future is dropped, leave nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_and_cancelled_reads_leave_no_node() {
    let path = unique_path("rw-cancel");
    let writer = rw(&path).await;
    let held = writer.write_lock().acquire().await.unwrap();
    let reader_client = client().await;
    let reader = InterProcessReadWriteLock::new(reader_client.clone(), &path).unwrap();
    assert!(reader.read_lock().acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let read = reader.read_lock();
    let waiting = tokio::spawn(async move { read.acquire().await });
    eventually(Duration::from_secs(10), "reader queued", || async { queue(&path).await.len() == 2 }).await;
    waiting.abort();
    let observer = client().await;
    assert_no_nodes_left_while_open_except(&observer, &path, 1).await;
    held.release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
    drop(reader_client);
}

/// Waits until only `expected` nodes remain under `path` (the sessions that could leak are open).
async fn assert_no_nodes_left_while_open_except(observer: &zookeeper_client::Client, path: &str, expected: usize) {
    eventually(Duration::from_secs(10), "abandoned read node deleted", || async {
        children(observer, path).await.len() == expected
    })
    .await;
}
