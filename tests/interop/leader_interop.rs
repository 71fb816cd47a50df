//! Leader election across languages: Apache Curator's `LeaderLatch` and `LeaderSelector` (Java,
//! Debian's Curator 5.4 jars, `tests/interop/CuratorLeader.java`) in a child process on the same
//! election path as ours. Every leader, of either language, keeps the ephemeral node
//! `<markers>/leader` while it leads and creates it when elected: a second leader at once would
//! fail to create it (Curator's program then prints `TWO LEADERS`, ours panics). Leadership must
//! pass both ways, in queue order, and each side must see the other's participant id as the
//! leader's.

use crate::common;

use std::time::Duration;

use common::interop::{curator_available, Holder};
use common::*;
use zk_recipes::{LeaderLatch, LeaderSelector, LockGuard};
use zookeeper_client as zk;

/// Creates the marker of a leader of ours, on its own session: fails if another leader has it.
async fn lead(client: &zk::Client, markers: &str) {
    let created = client
        .create(&format!("{markers}/leader"), b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()))
        .await;
    assert!(created.is_ok(), "two leaders at once: our leader found the marker taken ({created:?})");
}

async fn step_down(client: &zk::Client, markers: &str) {
    client.delete(&format!("{markers}/leader"), None).await.expect("our leader's marker");
}

async fn markers_dir(client: &zk::Client) -> String {
    let markers = unique_path("leader-markers");
    client.mkdir(&markers, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    markers
}

/// Ours leads, Curator's `LeaderLatch` joins and sees our id as the leader's; leadership passes
/// to Curator when ours steps down, and back to ours (queued behind Curator's) when Curator's
/// closes; never two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_latch_and_ours_elect_one_leader() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("latch-interop");
    let ours_client = client().await;
    let markers = markers_dir(&ours_client).await;
    let ours = LeaderLatch::builder(ours_client.clone(), &path).id("rust-0").build().unwrap();

    ours.start().unwrap();
    let leadership = ours.await_leadership().await.unwrap();
    lead(&ours_client, &markers).await;
    let mut curator = Holder::curator_leader(connect, &path, "java-1", "latch", &markers);
    curator.expect("CONNECTED").await;
    eventually(Duration::from_secs(10), "Curator queued", || async {
        queued_nodes(&ours_client, &path, "-latch-").await.len() == 2
    })
    .await;
    curator.say("who").await;
    curator.expect("SEES rust-0").await;
    let ids: Vec<String> = ours.participants().await.unwrap().iter().map(|p| p.id()).collect();
    assert_eq!(ids, ["rust-0", "java-1"]);
    curator.quiet_for(Duration::from_millis(500), "while ours leads").await;

    // Ours steps down: Curator's is elected; a second latch of ours queues behind it.
    step_down(&ours_client, &markers).await;
    ours.close().await.unwrap();
    assert_eq!(leadership.state(), zk_recipes::LockState::Lost(zk_recipes::LossReason::LatchClosed));
    drop(leadership);
    curator.expect("LEADER").await;
    assert_eq!(ours.leader().await.unwrap().expect("a leader").id(), "java-1", "we see Curator's id");
    assert!(!ours.has_leadership());
    let second_client = client().await;
    let second = LeaderLatch::builder(second_client.clone(), &path).id("rust-2").build().unwrap();
    second.start().unwrap();
    let waiting = tokio::spawn({
        let second = second.clone();
        async move { second.await_leadership().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "ours queued", || async {
        queued_nodes(&ours_client, &path, "-latch-").await.len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "ours elected while Curator's leads");

    curator.release_now();
    curator.expect("RELEASED").await;
    let leadership: LockGuard = tokio::time::timeout(Duration::from_secs(30), waiting).await.unwrap().unwrap();
    lead(&second_client, &markers).await;
    assert!(second.has_leadership());
    step_down(&second_client, &markers).await;
    drop(leadership);
    second.close().await.unwrap();
    curator.finish().await;
    assert_no_nodes_left(&ours_client, &path).await;
}

/// Curator's `LeaderSelector` leads first, ours (`run`) is elected when it steps down and leads
/// until told to stop; Curator's, queued meanwhile, is elected after ours steps down; each sees
/// the other's id; never two leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_selector_and_ours_elect_one_leader() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("selector-interop");
    let ours_client = client().await;
    let markers = markers_dir(&ours_client).await;

    let mut first = Holder::curator_leader(connect, &path, "java-a", "selector", &markers);
    first.expect("CONNECTED").await;
    first.expect("LEADER").await;

    let selector = LeaderSelector::builder(ours_client.clone(), &path).id("rust-b").build().unwrap();
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let first_time = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let run = tokio::spawn({
        let (selector, client, markers, stop) = (selector.clone(), ours_client.clone(), markers.clone(), stop.clone());
        async move {
            selector
                .run(|leadership| {
                    let (client, markers, stop, elected_tx) =
                        (client.clone(), markers.clone(), stop.clone(), elected_tx.clone());
                    let first = first_time.swap(false, std::sync::atomic::Ordering::SeqCst);
                    async move {
                        if !first {
                            // Elected again (queued behind Curator's second) once the test is
                            // done with the election: lead until aborted.
                            return std::future::pending::<()>().await;
                        }
                        lead(&client, &markers).await;
                        let _ = elected_tx.send(leadership.fencing_token());
                        stop.notified().await;
                        step_down(&client, &markers).await;
                        // The future ends: the selector steps down and queues again.
                    }
                })
                .await
        }
    });
    eventually(Duration::from_secs(10), "ours queued", || async {
        queued_nodes(&ours_client, &path, "-lock-").await.len() == 2
    })
    .await;
    assert_eq!(selector.leader().await.unwrap().expect("a leader").id(), "java-a", "we see Curator's id");
    first.say("who").await;
    first.expect("SEES java-a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(elected.try_recv().is_err(), "ours elected while Curator's leads");

    first.release_now();
    first.expect("RELEASED").await;
    tokio::time::timeout(Duration::from_secs(30), elected.recv()).await.expect("ours elected").expect("token");
    assert!(selector.has_leadership());
    let mut second = Holder::curator_leader(connect, &path, "java-c", "selector", &markers);
    second.expect("CONNECTED").await;
    eventually(Duration::from_secs(10), "Curator queued", || async {
        queued_nodes(&ours_client, &path, "-lock-").await.len() == 2
    })
    .await;
    second.say("who").await;
    second.expect("SEES rust-b").await;
    second.quiet_for(Duration::from_millis(500), "while ours leads").await;

    stop.notify_one();
    second.expect("LEADER").await;
    second.release_now();
    second.expect("RELEASED").await;
    run.abort();
    let _ = run.await;
    first.finish().await;
    second.finish().await;
    assert_no_nodes_left(&ours_client, &path).await;
}
