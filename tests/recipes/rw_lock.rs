//! `InterProcessReadWriteLock` against a real ZooKeeper: readers share, writers exclude, fairness,
//! the downgrade (Curator 5.5's layout: readers come in, no writer slips in, also one queued before
//! the read node; fenced writes checked by the server; refused in a lost write scope; cancelled
//! without a trace), the upgrade refused, re-entry, a read by the write holder outside a scope
//! refused, no listing per reader on a writer's release, no node left. Exclusion is checked at
//! every grant (`common/inside.rs`), so a grant that comes after a test's fixed window still fails
//! it; the fixed windows stay as extra checks.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::inside::Inside;
use common::*;
use zk_recipes::{Error, FencedWriteError, InterProcessReadWriteLock, LockState, LossReason};
use zk_testcontainers::{op, FaultProxy};

/// A read/write lock on `path` with a session of its own.
async fn rw(path: &str) -> InterProcessReadWriteLock {
    InterProcessReadWriteLock::new(client().await, path).unwrap()
}

/// The node names under `path`, in sequence order (a read node beside a write node first).
async fn queue(path: &str) -> Vec<String> {
    let mut names = children(&client().await, path).await;
    names.sort_by_key(|name| (name[name.len() - 10..].to_owned(), !name.contains("__READ__")));
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_writers_exclude() {
    let path = unique_path("rw-share");
    let (a, b, c) = (rw(&path).await, rw(&path).await, rw(&path).await);
    // Who is inside, checked at every grant (the fixed windows below are extra checks).
    let inside = Inside::new();
    let r1 = a.read_lock().acquire().await.unwrap();
    inside.read_granted("r1");
    let r2 = tokio::time::timeout(Duration::from_secs(10), b.read_lock().acquire())
        .await
        .expect("a second reader is granted while the first holds")
        .unwrap();
    inside.read_granted("r2");
    assert_ne!(r1.fencing_token(), r2.fencing_token());
    assert!(c.write_lock().try_acquire().await.unwrap().is_none(), "a writer is excluded by readers");
    assert!(queue(&path).await.iter().all(|name| name.contains("__READ__")), "try_acquire left its node");
    let writer = tokio::spawn({
        let (write, inside) = (c.write_lock(), inside.clone());
        async move {
            let guard = write.acquire().await.unwrap();
            inside.write_granted("writer");
            guard
        }
    });
    eventually(Duration::from_secs(10), "writer queued", || async { queue(&path).await.len() == 3 }).await;
    inside.read_releasing("r1");
    r1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "writer granted while a reader still holds");
    inside.read_releasing("r2");
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
    inside.write_releasing("writer");
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
    // Who is inside, checked at every grant (the fixed windows below are extra checks).
    let inside = Inside::new();
    let held = holder.write_lock().acquire().await.unwrap();
    inside.write_granted("holder");
    // The waiters' session goes through a (passing) proxy that counts its requests.
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let waiters_client = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let waiting = InterProcessReadWriteLock::new(waiters_client, &path).unwrap();
    let mut readers = Vec::new();
    let spawn_reader = |lock: &InterProcessReadWriteLock, who: String| {
        let (read, inside) = (lock.read_lock(), inside.clone());
        tokio::spawn(async move {
            let guard = read.acquire().await.unwrap();
            inside.read_granted(&who);
            if who == "late-reader" {
                // Fair: queued behind the second writer, it comes in only after that writer.
                inside.granted_after(&who, "second-writer");
            }
            guard
        })
    };
    for i in 0..3 {
        readers.push((format!("reader-{i}"), spawn_reader(&waiting, format!("reader-{i}"))));
        eventually(Duration::from_secs(10), "reader queued", || async {
            queue(&path).await.len() == readers.len() + 1
        })
        .await;
    }
    let second_writer = tokio::spawn({
        let (write, inside) = (rw(&path).await.write_lock(), inside.clone());
        async move {
            let guard = write.acquire().await.unwrap();
            inside.write_granted("second-writer");
            guard
        }
    });
    eventually(Duration::from_secs(10), "writer queued", || async { queue(&path).await.len() == 5 }).await;
    let late_reader = spawn_reader(&waiting, "late-reader".to_owned());
    eventually(Duration::from_secs(10), "late reader queued", || async { queue(&path).await.len() == 6 }).await;
    // Let every waiter set its watches before the handoff.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = proxy.requests();
    inside.write_releasing("holder");
    held.release().await.unwrap();
    let mut granted = Vec::new();
    for (who, reader) in readers {
        granted
            .push((who, tokio::time::timeout(Duration::from_secs(10), reader).await.expect("reader granted").unwrap()));
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
    for (who, guard) in granted {
        inside.read_releasing(&who);
        guard.release().await.unwrap();
    }
    let w = tokio::time::timeout(Duration::from_secs(10), second_writer).await.expect("writer granted").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!late_reader.is_finished(), "a reader was granted while the writer holds");
    inside.write_releasing("second-writer");
    w.release().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), late_reader).await.expect("late reader granted").unwrap();
    inside.read_releasing("late-reader");
    r.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// The downgrade, in Curator 5.5's layout: inside a write scope a read is granted at once with a
/// node beside the write node (named with its sequence number). Once the write lock is released,
/// a reader queued behind our write node comes in beside the downgraded read, while no writer —
/// neither one queued between our write node and the read node (which Curator 5.4's downgrade lets
/// in) nor one queued after — is granted while the read lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_lets_readers_in_and_keeps_every_writer_out_while_the_read_lasts() {
    let path = unique_path("rw-downgrade");
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let (read, write) = (ours.read_lock(), ours.write_lock());
    let scoped_read = read.clone();
    let other_client = client().await;
    let other = InterProcessReadWriteLock::new(other_client.clone(), &path).unwrap();
    // Who is inside, checked at every grant (the fixed windows below are extra checks): a writer
    // granted while the downgraded read lasts fails at its grant, however late it comes.
    let inside = Inside::new();
    let spawn_writer = |who: &'static str| {
        let (write, inside) = (other.write_lock(), inside.clone());
        tokio::spawn(async move {
            let guard = write.acquire().await.unwrap();
            inside.write_granted(who);
            guard
        })
    };
    let spawn_reader = |who: &'static str| {
        let (read, inside) = (other.read_lock(), inside.clone());
        tokio::spawn(async move {
            let guard = read.acquire().await.unwrap();
            inside.read_granted(who);
            guard
        })
    };
    let (inner_path, scope_inside) = (path.clone(), inside.clone());
    let (first_reader, first_writer, read_guard, write_token, write_sequence) = write
        .with_lock(|write_guard| async move {
            scope_inside.write_granted("ours");
            // A reader, then a writer, queue between our write node and the read node we are about
            // to create.
            let first_reader = spawn_reader("first-reader");
            eventually(Duration::from_secs(10), "reader queued", || async { queue(&inner_path).await.len() == 2 })
                .await;
            let first_writer = spawn_writer("first-writer");
            eventually(Duration::from_secs(10), "writer queued", || async { queue(&inner_path).await.len() == 3 })
                .await;
            let read_guard = tokio::time::timeout(Duration::from_secs(5), scoped_read.acquire())
                .await
                .expect("the downgrade is granted at once")
                .unwrap();
            scope_inside.downgrade_granted("ours");
            assert_ne!(read_guard.fencing_token(), write_guard.fencing_token(), "the read hold has its own token");
            assert_eq!(read_guard.sequence(), write_guard.sequence(), "the read node sorts at the write node's place");
            let read_name = read_guard.lock_path().rsplit('/').next().unwrap().to_owned();
            let suffix = format!("__READ__{:010}", write_guard.sequence());
            assert!(read_name.starts_with("_c_") && read_name.ends_with(&suffix), "{read_name}");
            assert!(!first_reader.is_finished(), "a reader came in beside our write lock");
            // The scope's end releases the write lock.
            scope_inside.write_releasing("ours");
            (first_reader, first_writer, read_guard, write_guard.fencing_token(), write_guard.sequence())
        })
        .await
        .unwrap();
    // The write scope is over: our write node is gone, the read stays.
    assert!(!write.is_acquired_in_this_process(), "no write guard is left");
    assert!(read.is_acquired_in_this_process());
    let other_read = tokio::time::timeout(Duration::from_secs(10), first_reader)
        .await
        .expect("a reader comes in beside the downgraded read")
        .unwrap();
    let second_writer = spawn_writer("second-writer");
    eventually(Duration::from_secs(10), "second writer queued", || async { queue(&path).await.len() == 4 }).await;
    let names = queue(&path).await;
    assert!(names[0].contains("__READ__") && names[0].ends_with(&format!("{write_sequence:010}")), "{names:?}");
    assert!(names.iter().all(|name| !name.ends_with(&format!("__WRIT__{write_sequence:010}"))), "{names:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!first_writer.is_finished(), "a writer queued before our read node slipped in during the downgrade");
    assert!(!second_writer.is_finished(), "a writer slipped in during the downgrade");
    assert_eq!(read_guard.state(), LockState::Held);
    let mut fenced = read_guard.fenced_writer();
    fenced.add_check_version(&path, -1).unwrap();
    fenced.commit().await.expect("a fenced write through the downgraded read (its write lock released)");

    // The other reader leaves: the downgraded read alone still keeps both writers out.
    inside.read_releasing("first-reader");
    other_read.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!first_writer.is_finished(), "a writer was granted beside the downgraded read");
    inside.read_releasing("ours");
    read_guard.release().await.unwrap();
    let w1 = tokio::time::timeout(Duration::from_secs(10), first_writer).await.expect("first writer granted").unwrap();
    assert!(w1.fencing_token().as_i64() > write_token.as_i64());
    assert!(!second_writer.is_finished());
    inside.write_releasing("first-writer");
    w1.release().await.unwrap();
    let w2 =
        tokio::time::timeout(Duration::from_secs(10), second_writer).await.expect("second writer granted").unwrap();
    inside.write_releasing("second-writer");
    w2.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client, other_client], Duration::from_secs(10))
        .await;
}

/// While the write lock lasts, a downgraded read rests on the write node too: if that node is
/// deleted (by hand, here), the read hold is lost, and a fenced write through it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_read_is_lost_with_its_write_node_while_the_write_lasts() {
    let path = unique_path("rw-downgrade-lost");
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let observed = path.clone();
    let read_guard = ours
        .write_lock()
        .with_lock(|write_guard| async move {
            let read_guard = read.acquire().await.unwrap();
            assert_eq!(queue(&observed).await.len(), 2, "the write node and the read node beside it");
            client().await.delete(write_guard.lock_path(), None).await.unwrap();
            let reason =
                tokio::time::timeout(Duration::from_secs(10), read_guard.lost()).await.expect("the read is told");
            assert_eq!(reason, LossReason::NodeDeleted);
            read_guard
        })
        .await
        .unwrap();
    // Lost is final, also once the write hold has ended.
    assert_eq!(read_guard.state(), LockState::Lost(LossReason::NodeDeleted));
    let mut fenced = read_guard.fenced_writer();
    fenced.add_check_version(&path, -1).unwrap();
    assert!(matches!(fenced.commit().await, Err(FencedWriteError::LockLost)));
    read_guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}

/// A downgraded read's fenced write, while the write lock is held, carries a check of the write
/// node that the *server* evaluates: with our session's traffic held back, the write node is
/// deleted (by hand), the fenced write is sent before our process can hear of it, and the server
/// refuses it — at the check of the write node, since the read node itself still exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_reads_fenced_write_reaches_the_servers_check_of_the_write_node() {
    let path = unique_path("rw-downgrade-fence");
    let target = format!("{path}-target");
    let observer = client().await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    observer.mkdir(&target, &persistent).await.unwrap();
    observer.set_data(&target, b"v1", None).await.unwrap();
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let ours_client = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let (inner_target, inner_proxy) = (target.clone(), &proxy);
    let outcome = ours
        .write_lock()
        .with_lock(|write_guard| async move {
            let read_guard = read.acquire().await.unwrap();
            assert_eq!(read_guard.state(), LockState::Held);
            let multis = inner_proxy.requests().get(&op::MULTI).copied().unwrap_or(0);
            inner_proxy.stall();
            client().await.delete(write_guard.lock_path(), None).await.unwrap();
            let (outcome, sent) = {
                let mut fenced = read_guard.fenced_writer();
                fenced.add_set_data(&inner_target, b"v2", None).unwrap();
                let commit = fenced.commit();
                tokio::pin!(commit);
                assert!(
                    tokio::time::timeout(Duration::from_millis(500), &mut commit).await.is_err(),
                    "answered while stalled"
                );
                inner_proxy.pass();
                let outcome = tokio::time::timeout(Duration::from_secs(10), commit).await.expect("answered");
                // Held back requests are counted once they are read, after the stall.
                let sent = inner_proxy.requests().get(&op::MULTI).copied().unwrap_or(0) - multis;
                (outcome, sent)
            };
            let read_node_exists = client().await.check_stat(read_guard.lock_path()).await.unwrap().is_some();
            read_guard.release().await.unwrap();
            (outcome, sent, read_node_exists)
        })
        .await
        .unwrap();
    let (outcome, sent, read_node_exists) = outcome;
    assert_eq!(sent, 1, "the fenced write was sent to the server (not refused by our process)");
    assert!(read_node_exists, "the read node existed: only the write node's check can refuse");
    assert!(matches!(outcome, Err(FencedWriteError::LockLost)), "{outcome:?}");
    assert_eq!(observer.get_data(&target).await.unwrap().0, b"v1", "nothing was written");
    assert_no_nodes_left_while_open(&observer, &path, &[ours_client], Duration::from_secs(10)).await;
    observer.delete(&target, None).await.unwrap();
}

/// A downgrade inside a write scope whose hold is lost is refused at once and queues nothing:
/// when our process knows of the loss, and when only the server does (the `multi` that creates
/// the read node checks the write node first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_inside_a_lost_write_scope_is_refused() {
    let path = unique_path("rw-downgrade-refused");
    let observer = client().await;
    // A persistent lock directory: a container emptied by the deletion could be reaped, and a
    // create refused for that would hide what is tested.
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    observer.mkdir(&path, &persistent).await.unwrap();
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let ours_client = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    // Known lost.
    let (inner_path, inner_read) = (path.clone(), read.clone());
    ours.write_lock()
        .with_lock(|write_guard| async move {
            client().await.delete(write_guard.lock_path(), None).await.unwrap();
            let reason = tokio::time::timeout(Duration::from_secs(10), write_guard.lost()).await.expect("told");
            assert_eq!(reason, LossReason::NodeDeleted);
            let refused = tokio::time::timeout(Duration::from_secs(5), inner_read.acquire()).await.expect("at once");
            assert!(matches!(refused, Err(Error::LockLost { .. })), "{refused:?}");
            assert!(queue(&inner_path).await.is_empty(), "the refused downgrade queued a node");
        })
        .await
        .unwrap();
    // Lost at the server only: our traffic is held back while the write node is deleted.
    let (inner_path, inner_proxy) = (path.clone(), &proxy);
    ours.write_lock()
        .with_lock(|write_guard| async move {
            inner_proxy.stall();
            client().await.delete(write_guard.lock_path(), None).await.unwrap();
            let acquire = read.acquire();
            tokio::pin!(acquire);
            assert!(tokio::time::timeout(Duration::from_millis(500), &mut acquire).await.is_err());
            inner_proxy.pass();
            let refused = tokio::time::timeout(Duration::from_secs(10), acquire).await.expect("answered");
            assert!(matches!(refused, Err(Error::LockLost { .. })), "{refused:?}");
            assert!(queue(&inner_path).await.is_empty(), "the refused downgrade created a read node");
        })
        .await
        .unwrap();
    assert_no_nodes_left_while_open(&observer, &path, &[ours_client], Duration::from_secs(10)).await;
}

/// A downgrade cancelled after its `multi` was sent, with the reply not seen yet, leaves no node:
/// the read node (not sequential, named with the write node's number) is found by its GUID and
/// deleted while the session is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_downgrade_leaves_no_node() {
    let path = unique_path("rw-downgrade-cancel");
    let observer = client().await;
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let ours_client = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let inner_proxy = &proxy;
    ours.write_lock()
        .with_lock(|_write_guard| async move {
            let multis = inner_proxy.requests().get(&op::MULTI).copied().unwrap_or(0);
            inner_proxy.stall();
            let mut acquire = Box::pin(read.acquire());
            assert!(tokio::time::timeout(Duration::from_millis(500), &mut acquire).await.is_err());
            // Cancelled before its reply could arrive (none can while stalled).
            drop(acquire);
            inner_proxy.pass();
            // Held back requests are counted once they are read, after the stall.
            eventually(Duration::from_secs(10), "the downgrade's multi reached the server", || async {
                inner_proxy.requests().get(&op::MULTI).copied().unwrap_or(0) > multis
            })
            .await;
        })
        .await
        .unwrap();
    assert_no_nodes_left_while_open(&observer, &path, &[ours_client], Duration::from_secs(10)).await;
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
    // Who is inside, checked at every grant.
    let inside = Inside::new();
    let held = writer.write_lock().acquire().await.unwrap();
    inside.write_granted("writer");
    let reader_client = client().await;
    let reader = InterProcessReadWriteLock::new(reader_client.clone(), &path).unwrap();
    assert!(reader.read_lock().acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let read = reader.read_lock();
    let waiting = tokio::spawn({
        let inside = inside.clone();
        async move {
            let acquired = read.acquire().await;
            if acquired.is_ok() {
                inside.read_granted("cancelled-reader");
            }
            acquired
        }
    });
    eventually(Duration::from_secs(10), "reader queued", || async { queue(&path).await.len() == 2 }).await;
    waiting.abort();
    // Cancelled while waiting, or its grant (before the abort took effect) was checked.
    if let Err(err) = waiting.await {
        if err.is_panic() {
            std::panic::resume_unwind(err.into_panic());
        }
    }
    let observer = client().await;
    assert_no_nodes_left_while_open_except(&observer, &path, 1).await;
    inside.write_releasing("writer");
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

/// Curator's downgrade idiom outside a scope — `write.acquire()` then `read.acquire()` by the
/// same task — fails at once with `UnscopedDowngrade` and queues nothing (it would wait for its
/// own write node); a read by another task queues behind the write lock as usual, and the
/// holder's read succeeds once its write guard is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_by_the_write_holder_outside_a_scope_is_refused_at_once() {
    let path = unique_path("rw-unscoped-downgrade");
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let (read, write) = (ours.read_lock(), ours.clone().write_lock());
    // Who is inside, checked at every grant (the fixed window below is an extra check).
    let inside = Inside::new();
    let write_guard = write.acquire().await.unwrap();
    inside.write_granted("ours");
    let started = std::time::Instant::now();
    let refused =
        tokio::time::timeout(Duration::from_secs(5), ours.clone().read_lock().acquire()).await.expect("at once");
    assert!(matches!(refused, Err(Error::UnscopedDowngrade { .. })), "{refused:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(queue(&path).await.len(), 1, "the refused read queued a node");
    let other_task = tokio::spawn({
        let (read, inside) = (read.clone(), inside.clone());
        async move {
            let guard = read.acquire().await.unwrap();
            inside.read_granted("other-task");
            guard
        }
    });
    eventually(Duration::from_secs(10), "the other task's read queued", || async { queue(&path).await.len() == 2 })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!other_task.is_finished(), "another task's read was granted beside our write lock");
    inside.write_releasing("ours");
    write_guard.release().await.unwrap();
    let shared = tokio::time::timeout(Duration::from_secs(10), other_task).await.expect("granted").unwrap();
    let own = tokio::time::timeout(Duration::from_secs(10), read.acquire()).await.expect("granted").unwrap();
    inside.read_granted("own");
    inside.read_releasing("own");
    own.release().await.unwrap();
    inside.read_releasing("other-task");
    shared.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}

/// A read lock kept alone — its read/write lock and every write handle dropped — still sees a write
/// guard that outlived every write handle: its holder's unscoped read is refused at once, and once
/// the write is released the read is granted as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_lock_kept_alone_still_sees_a_write_guard_that_outlived_its_handles() {
    let path = unique_path("rw-read-alone");
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let write_guard = ours.write_lock().acquire().await.unwrap();
    drop(ours);
    let refused = tokio::time::timeout(Duration::from_secs(5), read.acquire()).await.expect("at once");
    assert!(matches!(refused, Err(Error::UnscopedDowngrade { .. })), "{refused:?}");
    write_guard.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), read.acquire()).await.expect("granted").unwrap();
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}
