//! Apache Curator's `InterProcessMutex` (Java, Debian's Curator 5.4 jars) and ours on the same
//! lock path exclude each other and hand the lock over in queue order.
//!
//! Needs `java` (a JDK, for single-file source launch) and `/usr/share/java/curator-*.jar`
//! (`apt-get install libcurator-recipes-java libcurator-framework-java libcurator-client-java
//! libslf4j-java`). Without them the test says so and passes, unless `REQUIRE_CURATOR=1`
//! (CI sets it and installs them), in which case it fails. The Curator process and its line
//! protocol: `tests/common/interop.rs`, `tests/interop/CuratorHolder.java`.

use crate::common;

use std::time::{Duration, Instant};

use common::interop::{curator_available, Holder};
use common::*;
use zk_recipes::InterProcessMutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_zk_recipes_share_a_lock() {
    if !curator_available() {
        return;
    }
    let zk = zookeeper().await;
    let path = unique_path("curator");

    // We hold it: Curator cannot get it.
    let ours = InterProcessMutex::new(client().await, &path).unwrap();
    let held = ours.acquire().await.unwrap();
    let mut curator = Holder::curator(zk.connect_string(), &path, Duration::from_millis(1500), Duration::ZERO);
    curator.expect("CONNECTED").await;
    curator.expect("TIMEOUT").await;
    curator.finish().await;

    // Curator queues behind us, and one of ours behind Curator: the lock goes us → Curator →
    // ours, and ours waits for Curator's hold of 1.5 s.
    let hold = Duration::from_millis(1500);
    let mut curator = Holder::curator(zk.connect_string(), &path, Duration::from_secs(30), hold);
    curator.expect("CONNECTED").await;
    eventually(Duration::from_secs(30), "Curator queued", || async { ours.participants().await.unwrap().len() == 2 })
        .await;
    let participants = ours.participants().await.unwrap();
    assert!(participants[1].path.contains("/_c_") && participants[1].path.contains("-lock-"), "{participants:?}");
    let curator_node = participants[1].path.clone();
    let next_client = client().await;
    let next = InterProcessMutex::new(next_client.clone(), &path).unwrap();
    let waiter = tokio::spawn(async move {
        let guard = next.acquire().await.unwrap();
        let granted = Instant::now();
        // Read on the granted session, so ordered after whatever granted us: Curator's node
        // must already be gone (no overlap at all, not merely a late grant).
        let curator_node_at_grant = next_client.check_stat(&curator_node).await.unwrap();
        (granted, curator_node_at_grant, guard)
    });
    eventually(Duration::from_secs(10), "ours queued behind Curator", || async {
        ours.participants().await.unwrap().len() == 3
    })
    .await;
    held.release().await.unwrap();
    let curator_acquired = curator.expect("ACQUIRED").await;
    let (granted, curator_node_at_grant, guard) =
        tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("granted").unwrap();
    assert!(curator_node_at_grant.is_none(), "granted while Curator's node still existed: {curator_node_at_grant:?}");
    // And in time: not before Curator's hold was over (its ACQUIRED line is read a little after it
    // was printed, so the documented scheduling slack is allowed, no more).
    assert!(
        granted.duration_since(curator_acquired) + SCHED_SLACK >= hold,
        "granted {:?} after Curator acquired, while Curator holds for {hold:?}",
        granted.duration_since(curator_acquired)
    );
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.finish().await;

    // Curator waits for us.
    let mut curator = Holder::curator(zk.connect_string(), &path, Duration::from_secs(30), Duration::ZERO);
    curator.expect("CONNECTED").await;
    eventually(Duration::from_secs(30), "Curator queued", || async { ours.participants().await.unwrap().len() == 2 })
        .await;
    curator.quiet_for(Duration::from_millis(500), "while we hold the lock").await;
    guard.release().await.unwrap();
    curator.expect("ACQUIRED").await;
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.finish().await;
    assert_no_nodes_left(&client().await, &path).await;
}
