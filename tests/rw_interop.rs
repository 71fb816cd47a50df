//! Apache Curator's `InterProcessReadWriteLock` (Java, Debian's Curator 5.4 jars) in child
//! processes on one lock path, through `tests/interop/CuratorRwHolder.java`: Curator against
//! Curator, which checks the holder program (its lines, its grant-time check, its markers) that
//! the interop tests of our read/write lock against Curator's use.
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
