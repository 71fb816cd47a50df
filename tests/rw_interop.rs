//! Apache Curator's `InterProcessReadWriteLock` (Java, Debian's Curator 5.4 jars) in child
//! processes on one lock path, through `tests/interop/CuratorRwHolder.java`: Curator against
//! Curator (which checks the holder program: its lines, its grant-time check, its markers), then
//! Curator against our `InterProcessReadWriteLock` — readers of both overlap, a writer of either
//! excludes everyone, fairness across languages, and our downgrade with Curator writers queued
//! before and after our read node.
//!
//! Each grant is checked on the granted session right after it (the program prints
//! `ACQUIRED AHEAD <names>` if a node that must be gone is not: for a write grant any node ahead,
//! for a read grant a write node ahead), and while it holds, a holder keeps a marker node
//! `<markers>/read-<pid>` or `write-<pid>`, so the test lists who is inside at one instant.
//!
//! Needs `java` and Debian's Curator jars: without them the tests say so and pass, unless
//! `REQUIRE_CURATOR=1` (CI), when they fail.

mod common;

use std::time::Duration;

use common::interop::{curator_available, Holder};
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
/// beside its read, and a Curator writer waits for that read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_downgrade_shares_its_read_and_excludes_a_writer() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-downgrade");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());

    let mut downgrade = Holder::curator_rw(connect, &path, "downgrade", WAIT, None, markers);
    downgrade.expect("CONNECTED").await;
    downgrade.expect("WRITE_ACQUIRED").await;
    downgrade.expect("READ_ACQUIRED").await;
    downgrade.expect("WRITE_RELEASED").await;
    assert_eq!(inside(&marker_dir).await, ["read"]);
    queued(&path, 1, "__READ__").await;

    let mut reader = Holder::curator_rw(connect, &path, "read", WAIT, None, markers);
    reader.expect("CONNECTED").await;
    reader.expect("ACQUIRED").await;
    assert_eq!(inside(&marker_dir).await, ["read", "read"], "a reader beside the downgraded read");

    let mut writer = Holder::curator_rw(connect, &path, "write", WAIT, Some(Duration::ZERO), markers);
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

/// Our downgrade with Curator writers queued before our read node (between our write and read
/// nodes: Curator 5.4's own downgrade lets that one in) and after it: neither is granted while our
/// downgraded read lasts; a Curator reader queued meanwhile waits too (our write node stays until
/// the read ends). Then each is granted in queue order with nothing blocking ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_downgrade_keeps_curator_writers_out() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("rw-mixed-downgrade");
    let marker_dir = path_markers(&path);
    let markers = Some(marker_dir.as_str());
    let ours = InterProcessReadWriteLock::new(client().await, &path).unwrap();
    let read = ours.read_lock();

    let (mut writer_before, read_guard) = ours
        .write_lock()
        .with_lock(|_write| {
            let path = path.clone();
            let marker_dir = marker_dir.clone();
            async move {
                let mut writer_before =
                    Holder::curator_rw(connect, &path, "write", WAIT, Some(Duration::ZERO), Some(&marker_dir));
                writer_before.expect("CONNECTED").await;
                queued(&path, 2, "__WRIT__").await;
                let read_guard = tokio::time::timeout(Duration::from_secs(5), read.acquire())
                    .await
                    .expect("the downgrade is granted at once")
                    .unwrap();
                (writer_before, read_guard)
            }
        })
        .await
        .unwrap();
    assert_eq!(read_guard.state(), LockState::Held);
    let mut writer_after = Holder::curator_rw(connect, &path, "write", WAIT, Some(Duration::ZERO), markers);
    writer_after.expect("CONNECTED").await;
    queued(&path, 4, "__WRIT__").await;
    let mut reader = Holder::curator_rw(connect, &path, "read", WAIT, Some(Duration::ZERO), markers);
    reader.expect("CONNECTED").await;
    queued(&path, 5, "__READ__").await;
    writer_before.quiet_for(Duration::from_millis(700), "(queued before our read node) during our downgrade").await;
    writer_after.quiet_for(Duration::from_millis(100), "during our downgrade").await;
    reader.quiet_for(Duration::from_millis(100), "behind our kept write node").await;
    assert!(inside(&marker_dir).await.is_empty(), "nobody of Curator's inside during our downgrade");

    read_guard.release().await.unwrap();
    // Each grant is checked by the holder itself: nothing blocking left ahead.
    writer_before.expect("ACQUIRED").await;
    writer_before.expect("RELEASING").await;
    writer_before.expect("RELEASED").await;
    writer_after.expect("ACQUIRED").await;
    writer_after.expect("RELEASING").await;
    writer_after.expect("RELEASED").await;
    reader.expect("ACQUIRED").await;
    reader.expect("RELEASING").await;
    reader.expect("RELEASED").await;
    for holder in [writer_before, writer_after, reader] {
        holder.finish().await;
    }
    assert_no_nodes_left(&client().await, &path).await;
}
