//! Apache Curator's `InterProcessReadWriteLock` — Debian's Curator 5.4 jars, and Curator 5.5+'s
//! read/write lock compiled from its source over them (`common::interop::Curator`) — in child
//! processes on one lock path, through `tests/interop/CuratorRwHolder.java`: Curator against
//! Curator (which checks the holder program: its lines, its grant-time check, its markers), then
//! Curator against our `InterProcessReadWriteLock` — readers of both overlap, a writer of either
//! excludes everyone, fairness across languages, Curator's downgrade (5.4's and 5.5's) with ours
//! queued inside it, and our downgrade with Curator readers and writers queued before and after
//! our read node.
//!
//! Each grant is checked on the granted session right after it (the program prints
//! `ACQUIRED AHEAD <names>` if a node that must be gone is not: for a write grant any node ahead,
//! for a read grant a write node ahead), and while it holds, a holder keeps a marker node
//! `<markers>/read-<pid>` or `write-<pid>`, so the test lists who is inside at one instant.
//!
//! Needs `java` and Debian's Curator jars: without them the tests say so and pass, unless
//! `REQUIRE_CURATOR=1` (CI), when they fail.

use crate::common;

use std::time::Duration;

use common::interop::{curator_available, Curator, Holder};
use common::*;
use zk_recipes::{InterProcessReadWriteLock, LockGuard, LockState};
use zookeeper_client as zk;

const WAIT: Duration = Duration::from_secs(60);

/// The roles (`read`, `write`) of the holders inside, sorted: the marker names without the pid.
async fn inside(markers: &str) -> Vec<String> {
    let mut roles: Vec<String> = children(&client().await, markers)
        .await
        .into_iter()
        .map(|name| name.split('-').next().unwrap_or_default().to_owned())
        .collect();
    roles.sort();
    roles
}

/// Waits until `n` nodes are queued on `path`, the last of them (by sequence) of `kind`.
async fn queued(path: &str, n: usize, kind: &str) {
    let what = format!("{n} nodes queued on {path}, the last {kind}");
    eventually(Duration::from_secs(60), &what, || async {
        let mut names = children(&client().await, path).await;
        names.sort_by_key(|name| name[name.len() - 10..].to_owned());
        names.len() == n && names.last().is_some_and(|name| name.contains(kind))
    })
    .await;
}

/// Two Curator readers hold at once; a Curator writer queued behind them waits for both; a reader
/// queued behind the writer waits for the writer (fair), then gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_readers_share_and_a_curator_writer_excludes() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-curator");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());

    let mut r1 = Holder::curator_rw(connect, &path, "read", WAIT, None, markers);
    let mut r2 = Holder::curator_rw(connect, &path, "read", WAIT, None, markers);
    r1.expect("CONNECTED").await;
    r2.expect("CONNECTED").await;
    r1.expect("ACQUIRED").await;
    r2.expect("ACQUIRED").await;
    assert_eq!(inside(&marker_dir).await, ["read", "read"], "both readers inside at once");

    let mut writer = Holder::curator_rw(connect, &path, "write", WAIT, None, markers);
    writer.expect("CONNECTED").await;
    queued(&path, 3, "__WRIT__").await;
    let mut r3 = Holder::curator_rw(connect, &path, "read", WAIT, Some(Duration::ZERO), markers);
    r3.expect("CONNECTED").await;
    queued(&path, 4, "__READ__").await;
    writer.quiet_for(Duration::from_millis(500), "while two readers hold").await;
    r3.quiet_for(Duration::from_millis(100), "while a writer is queued ahead").await;

    r1.release_now();
    r1.expect("RELEASING").await;
    r1.expect("RELEASED").await;
    writer.quiet_for(Duration::from_millis(300), "while a reader holds").await;
    r2.release_now();
    // Its grant-time check: no read node left ahead.
    writer.expect("ACQUIRED").await;
    r2.expect("RELEASING").await;
    r2.expect("RELEASED").await;
    assert_eq!(inside(&marker_dir).await, ["write"], "the writer alone inside");
    r3.quiet_for(Duration::from_millis(300), "while the writer holds").await;
    writer.release_now();
    writer.expect("RELEASING").await;
    // Its grant-time check: the writer's node is gone.
    r3.expect("ACQUIRED").await;
    writer.expect("RELEASED").await;
    r3.expect("RELEASING").await;
    r3.expect("RELEASED").await;
    for holder in [r1, r2, writer, r3] {
        holder.finish().await;
    }
    assert_no_nodes_left(&client().await, &path).await;
    assert_no_nodes_left(&client().await, &marker_dir).await;
}

/// A Curator downgrade (write, then read, then the write released) lets a Curator reader in
/// beside its read, and a Curator writer waits for that read: Curator 5.4 (a read node with a
/// sequence number of its own) and 5.5+ (a read node beside the write node).
async fn a_curator_downgrade_shares_its_read_and_excludes_a_writer(version: Curator) {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-downgrade");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());

    let mut downgrade = Holder::curator_rw_of(version, connect, &path, "downgrade", WAIT, None, markers);
    downgrade.expect("CONNECTED").await;
    downgrade.expect("WRITE_ACQUIRED").await;
    downgrade.expect("READ_ACQUIRED").await;
    downgrade.expect("WRITE_RELEASED").await;
    assert_eq!(inside(&marker_dir).await, ["read"]);
    queued(&path, 1, "__READ__").await;

    let mut reader = Holder::curator_rw_of(version, connect, &path, "read", WAIT, None, markers);
    reader.expect("CONNECTED").await;
    reader.expect("ACQUIRED").await;
    assert_eq!(inside(&marker_dir).await, ["read", "read"], "a reader beside the downgraded read");

    let mut writer = Holder::curator_rw_of(version, connect, &path, "write", WAIT, Some(Duration::ZERO), markers);
    writer.expect("CONNECTED").await;
    queued(&path, 3, "__WRIT__").await;
    writer.quiet_for(Duration::from_millis(500), "while two reads hold").await;
    reader.release_now();
    reader.expect("RELEASING").await;
    reader.expect("RELEASED").await;
    writer.quiet_for(Duration::from_millis(300), "while the downgraded read holds").await;
    downgrade.release_now();
    downgrade.expect("RELEASING").await;
    writer.expect("ACQUIRED").await;
    downgrade.expect("RELEASED").await;
    writer.expect("RELEASING").await;
    writer.expect("RELEASED").await;
    for holder in [downgrade, reader, writer] {
        holder.finish().await;
    }
    assert_no_nodes_left(&client().await, &path).await;
    assert_no_nodes_left(&client().await, &marker_dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_5_4_downgrade_shares_its_read_and_excludes_a_writer() {
    a_curator_downgrade_shares_its_read_and_excludes_a_writer(Curator::V5_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_5_5_downgrade_shares_its_read_and_excludes_a_writer() {
    a_curator_downgrade_shares_its_read_and_excludes_a_writer(Curator::V5_5).await;
}

/// Curator 5.5+'s own downgrade (its code, not a simulation) with our reader and writer queued
/// between its write node and the read node it creates beside it: once its write lock is
/// released our reader comes in beside its read, and our writer — which learned of that read
/// node only after it queued, below its own sequence number — waits until the read is released,
/// also after our reader left; then it is granted with nothing ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_reader_and_writer_queued_inside_a_curator_5_5_downgrade() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-curator55-downgrade");
    let marker_dir = path_markers(&path);
    let mut downgrade =
        Holder::curator_rw_of(Curator::V5_5, connect, &path, "downgrade-on-cue", WAIT, None, Some(&marker_dir));
    downgrade.expect("CONNECTED").await;
    downgrade.expect("WRITE_ACQUIRED").await;

    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let reader = tokio::spawn({
        let read = ours.read_lock();
        async move { read.acquire().await.unwrap() }
    });
    queued(&path, 2, "__READ__").await;
    let writer = tokio::spawn({
        let write = ours.write_lock();
        async move { write.acquire().await.unwrap() }
    });
    queued(&path, 3, "__WRIT__").await;

    downgrade.say("downgrade").await;
    downgrade.expect("READ_ACQUIRED").await;
    downgrade.expect("WRITE_RELEASED").await;
    let names = children(&client().await, &path).await;
    assert!(
        names.iter().any(|name| name.contains("__READ__") && name.ends_with("0000000000")),
        "Curator 5.5's read node sits beside its write node (sequence 0): {names:?}"
    );
    let read_guard =
        tokio::time::timeout(Duration::from_secs(10), reader).await.expect("our reader comes in beside").unwrap();
    assert!(blocking_ahead(&ours_client, &path, &read_guard).await.is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writer.is_finished(), "our writer was granted while two reads hold");
    read_guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!writer.is_finished(), "our writer was granted while Curator 5.5's downgraded read holds");

    downgrade.release_now();
    downgrade.expect("RELEASING").await;
    downgrade.expect("RELEASED").await;
    let write_guard = tokio::time::timeout(Duration::from_secs(10), writer).await.expect("our writer granted").unwrap();
    assert!(blocking_ahead(&ours_client, &path, &write_guard).await.is_empty());
    write_guard.release().await.unwrap();
    downgrade.finish().await;
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}

/// As above, with our readers and writers queued in one burst on sessions of their own (as
/// services start): most of them take no listing of their own but one another acquire of the
/// process took, with Curator 5.5's read node not yet in it (`engine/listing.rs`, `Setup`). No
/// writer of ours is granted while that read holds, and every grant — checked on the granted
/// session right after it — has nothing blocking ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_ours_queued_inside_a_curator_5_5_downgrade() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-curator55-burst");
    let marker_dir = path_markers(&path);
    let mut downgrade =
        Holder::curator_rw_of(Curator::V5_5, connect, &path, "downgrade-on-cue", WAIT, None, Some(&marker_dir));
    downgrade.expect("CONNECTED").await;
    downgrade.expect("WRITE_ACQUIRED").await;

    // Our sessions go through a passing proxy that counts their listings.
    let proxy = zk_testcontainers::FaultProxy::start(connect).await.unwrap();
    let mut sessions = Vec::new();
    for _ in 0..8 {
        let connector = zookeeper().await.connector().with_session_timeout(Duration::from_secs(20));
        sessions.push(connector.connect(&proxy.addr()).await.unwrap());
    }
    let listings = || {
        let requests = proxy.requests();
        [zk_testcontainers::op::GET_CHILDREN, zk_testcontainers::op::GET_CHILDREN2]
            .iter()
            .map(|op| requests.get(op).copied().unwrap_or(0))
            .sum::<u64>()
    };
    let before = listings();
    let writers_in = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let lock = InterProcessReadWriteLock::new(session.clone(), &path).unwrap();
        let (session, path, writers_in) = (session.clone(), path.clone(), writers_in.clone());
        let writer = i % 2 == 1;
        tasks.push(tokio::spawn(async move {
            let guard = if writer { lock.write_lock().acquire().await } else { lock.read_lock().acquire().await };
            let guard = guard.unwrap();
            let ahead = blocking_ahead(&session, &path, &guard).await;
            if writer {
                writers_in.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            guard.release().await.unwrap();
            (writer, ahead)
        }));
    }
    eventually(Duration::from_secs(30), "all queued", || async { children(&client().await, &path).await.len() == 9 })
        .await;
    // Every acquire has its listing once it watches its predecessor: wait for the count to settle.
    let mut taken = listings();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        taken = listings();
    }
    let taken = taken - before;
    assert!(taken < 8, "8 acquires at once took {taken} listings: none was shared, the test proves nothing");

    downgrade.say("downgrade").await;
    downgrade.expect("READ_ACQUIRED").await;
    downgrade.expect("WRITE_RELEASED").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        writers_in.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a writer of ours was granted while Curator 5.5's downgraded read holds"
    );
    downgrade.release_now();
    downgrade.expect("RELEASING").await;
    downgrade.expect("RELEASED").await;
    for task in tasks {
        let (writer, ahead) = tokio::time::timeout(Duration::from_secs(30), task).await.expect("granted").unwrap();
        assert!(ahead.is_empty(), "a {} was granted with {ahead:?} ahead", if writer { "writer" } else { "reader" });
    }
    downgrade.finish().await;
    assert_no_nodes_left_while_open(&client().await, &path, &sessions, Duration::from_secs(10)).await;
}

/// The marker directory of the lock at `path`.
fn path_markers(path: &str) -> String {
    format!("{path}-inside")
}

/// The nodes of the read/write lock in `dir` ahead of our guard's node that its grant must have
/// seen gone, read on `client` (the granted session, right after the grant): for a writer every
/// node ahead, for a reader every write node ahead.
async fn blocking_ahead(client: &zk::Client, dir: &str, guard: &LockGuard) -> Vec<String> {
    let writer = guard.lock_path().contains("-__WRIT__");
    children(client, dir)
        .await
        .into_iter()
        .filter(|name| name[name.len() - 10..].parse::<i64>().is_ok_and(|sequence| sequence < guard.sequence()))
        .filter(|name| writer || name.contains("__WRIT__"))
        .collect()
}

/// Our readers and Curator's share; a Curator writer queued behind them waits for both; our
/// writer queued behind it waits for it; a Curator reader queued behind our writer waits for it
/// (fair, across languages); nobody is granted with a blocking node still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_zk_recipes_readers_share_and_writers_exclude() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-mixed");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();

    let our_read = ours.read_lock().acquire().await.unwrap();
    let mut curator_reader = Holder::curator_rw(connect, &path, "read", WAIT, None, markers);
    curator_reader.expect("CONNECTED").await;
    curator_reader.expect("ACQUIRED").await;
    assert_eq!(our_read.state(), LockState::Held, "our reader beside Curator's");
    assert_eq!(inside(&marker_dir).await, ["read"]);

    let mut curator_writer = Holder::curator_rw(connect, &path, "write", WAIT, None, markers);
    curator_writer.expect("CONNECTED").await;
    queued(&path, 3, "__WRIT__").await;
    let our_writer = tokio::spawn({
        let (write, path, client) = (ours.write_lock(), path.clone(), ours_client.clone());
        async move {
            let guard = write.acquire().await.unwrap();
            let ahead = blocking_ahead(&client, &path, &guard).await;
            (guard, ahead)
        }
    });
    queued(&path, 4, "__WRIT__").await;
    curator_writer.quiet_for(Duration::from_millis(500), "while two readers (ours and Curator's) hold").await;
    our_read.release().await.unwrap();
    curator_writer.quiet_for(Duration::from_millis(300), "while Curator's reader holds").await;
    curator_reader.release_now();
    curator_reader.expect("RELEASING").await;
    curator_writer.expect("ACQUIRED").await;
    curator_reader.expect("RELEASED").await;
    assert_eq!(inside(&marker_dir).await, ["write"], "Curator's writer alone inside");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!our_writer.is_finished(), "our writer granted while Curator's writer holds");

    curator_writer.release_now();
    curator_writer.expect("RELEASING").await;
    let (our_write, ahead) =
        tokio::time::timeout(WAIT, our_writer).await.expect("our writer granted after Curator's").unwrap();
    assert!(ahead.is_empty(), "our writer granted with {ahead:?} still ahead");
    curator_writer.expect("RELEASED").await;
    // A Curator reader queued behind our writer waits for it.
    let mut late_reader = Holder::curator_rw(connect, &path, "read", WAIT, Some(Duration::ZERO), markers);
    late_reader.expect("CONNECTED").await;
    queued(&path, 2, "__READ__").await;
    late_reader.quiet_for(Duration::from_millis(500), "while our writer holds").await;
    our_write.release().await.unwrap();
    late_reader.expect("ACQUIRED").await;
    late_reader.expect("RELEASING").await;
    late_reader.expect("RELEASED").await;
    for holder in [curator_reader, curator_writer, late_reader] {
        holder.finish().await;
    }
    assert_no_nodes_left(&client().await, &path).await;
}

/// Our downgrade (a read node beside our write node, Curator 5.5's layout) with Curator: a Curator
/// reader and a Curator writer queue between our write node and our read node (Curator 5.4's own
/// downgrade would let that writer in), then, after our write lock is released, another writer and
/// a reader. The first reader comes in beside our read; neither writer, nor the reader behind
/// them, is granted while our downgraded read lasts. Then each is granted in queue order with
/// nothing blocking ahead (each holder checks its own grant).
async fn our_downgrade_lets_curator_readers_in_and_keeps_curator_writers_out(version: Curator) {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-mixed-downgrade");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let holder =
        |mode: &str, hold: Option<Duration>| Holder::curator_rw_of(version, connect, &path, mode, WAIT, hold, markers);

    let (mut reader_before, mut writer_before, read_guard) = ours
        .write_lock()
        .with_lock(|_write| {
            let path = path.clone();
            async move {
                // The reader queues first, then the writer (two JVMs started at once may create
                // their nodes in either order, and a reader behind the writer would wait for it).
                let mut reader_before = holder("read", None);
                reader_before.expect("CONNECTED").await;
                queued(&path, 2, "__READ__").await;
                let mut writer_before = holder("write", Some(Duration::ZERO));
                writer_before.expect("CONNECTED").await;
                queued(&path, 3, "__WRIT__").await;
                let read_guard = tokio::time::timeout(Duration::from_secs(5), read.acquire())
                    .await
                    .expect("the downgrade is granted at once")
                    .unwrap();
                (reader_before, writer_before, read_guard)
            }
        })
        .await
        .unwrap();
    assert_eq!(read_guard.state(), LockState::Held);
    reader_before.expect("ACQUIRED").await;
    let mut writer_after = holder("write", Some(Duration::ZERO));
    writer_after.expect("CONNECTED").await;
    queued(&path, 4, "__WRIT__").await;
    let mut reader_after = holder("read", Some(Duration::ZERO));
    reader_after.expect("CONNECTED").await;
    queued(&path, 5, "__READ__").await;
    writer_before.quiet_for(Duration::from_millis(700), "(queued before our read node) during our downgrade").await;
    writer_after.quiet_for(Duration::from_millis(100), "during our downgrade").await;
    reader_after.quiet_for(Duration::from_millis(100), "behind a waiting writer").await;
    assert_eq!(inside(&marker_dir).await, ["read"], "only Curator's first reader is inside, beside our read");
    reader_before.release_now();
    reader_before.expect("RELEASING").await;
    reader_before.expect("RELEASED").await;
    writer_before.quiet_for(Duration::from_millis(500), "while our downgraded read holds alone").await;

    read_guard.release().await.unwrap();
    writer_before.expect("ACQUIRED").await;
    writer_before.expect("RELEASING").await;
    writer_before.expect("RELEASED").await;
    writer_after.expect("ACQUIRED").await;
    writer_after.expect("RELEASING").await;
    writer_after.expect("RELEASED").await;
    reader_after.expect("ACQUIRED").await;
    reader_after.expect("RELEASING").await;
    reader_after.expect("RELEASED").await;
    for holder in [reader_before, writer_before, writer_after, reader_after] {
        holder.finish().await;
    }
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_downgrade_with_curator_5_4() {
    our_downgrade_lets_curator_readers_in_and_keeps_curator_writers_out(Curator::V5_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_downgrade_with_curator_5_5() {
    our_downgrade_lets_curator_readers_in_and_keeps_curator_writers_out(Curator::V5_5).await;
}

/// A Curator writer queued *before* a Curator reader, both between our write node and our
/// downgraded read: the writer waits for our read.
async fn curator_writer_queued_first_waits_for_our_downgraded_read(version: Curator) {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-writer-first");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());
    let ours_client = client().await;
    let ours = InterProcessReadWriteLock::new(ours_client.clone(), &path).unwrap();
    let read = ours.read_lock();
    let holder =
        |mode: &str, hold: Option<Duration>| Holder::curator_rw_of(version, connect, &path, mode, WAIT, hold, markers);
    let (mut writer, read_guard) = ours
        .write_lock()
        .with_lock(|_write| {
            let path = path.clone();
            let writer = holder("write", Some(Duration::ZERO));
            async move {
                let mut writer = writer;
                writer.expect("CONNECTED").await;
                queued(&path, 2, "__WRIT__").await;
                let read_guard = read.acquire().await.unwrap();
                (writer, read_guard)
            }
        })
        .await
        .unwrap();
    writer.quiet_for(Duration::from_millis(1500), "queued before our downgraded read, which still holds").await;
    read_guard.release().await.unwrap();
    writer.expect("ACQUIRED").await;
    writer.expect("RELEASING").await;
    writer.expect("RELEASED").await;
    writer.finish().await;
    assert_no_nodes_left_while_open(&client().await, &path, &[ours_client], Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_5_4_writer_queued_during_our_write_waits_for_our_downgraded_read() {
    curator_writer_queued_first_waits_for_our_downgraded_read(Curator::V5_4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_5_5_writer_queued_during_our_write_waits_for_our_downgraded_read() {
    curator_writer_queued_first_waits_for_our_downgraded_read(Curator::V5_5).await;
}
