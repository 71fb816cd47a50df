//! The ensemble harness against real servers: quorum, leader, stop/start, zone partition, heal.
//! Needs Docker (and root for partitions); skipped with a message when Docker is not usable and
//! REQUIRE_DOCKER is not set.

use std::time::{Duration, Instant};

use zk_testcontainers::zookeeper_client::{Acls, CreateMode, SessionState};
use zk_testcontainers::{Ensemble, HarnessError};

mod common;

use common::unique;

async fn ensemble(builder: zk_testcontainers::EnsembleBuilder) -> Option<Ensemble> {
    match builder.start().await {
        Ok(ensemble) => Some(ensemble),
        Err(err) if std::env::var("REQUIRE_DOCKER").is_ok_and(|v| v == "1") => panic!("no ensemble: {err}"),
        Err(err) => {
            eprintln!("skipped: no ensemble ({err})");
            None
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_elect_a_leader_and_replicate() -> Result<(), HarnessError> {
    let Some(ensemble) = ensemble(Ensemble::builder()).await else { return Ok(()) };
    assert_eq!(ensemble.len(), 3);
    let leader = ensemble.leader().await?;
    // Ready means a quorum serves; the third server joins shortly after.
    let deadline = Instant::now() + Duration::from_secs(60);
    let modes = loop {
        let modes = futures_modes(&ensemble).await;
        if modes.iter().filter(|m| m.as_deref() == Some("follower")).count() == 2 || Instant::now() > deadline {
            break modes;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("modes: {modes:?}, leader {leader}, connect {}", ensemble.connect_string());
    assert_eq!(modes.iter().filter(|m| m.as_deref() == Some("follower")).count(), 2, "{modes:?}");
    // A write through one server is read through another.
    let a = ensemble.client_of((leader + 1) % 3, Duration::from_secs(4)).await?;
    let b = ensemble.client_of((leader + 2) % 3, Duration::from_secs(4)).await?;
    let path = unique("ensemble");
    a.create(&path, b"x", &CreateMode::Persistent.with_acls(Acls::anyone_all())).await.unwrap();
    b.sync(&path).await.unwrap();
    assert_eq!(b.get_data(&path).await.unwrap().0, b"x");
    Ok(())
}

async fn futures_modes(ensemble: &Ensemble) -> Vec<Option<String>> {
    let mut modes = Vec::new();
    for i in 0..ensemble.len() {
        modes.push(ensemble.mode(i).await);
    }
    modes
}

/// A follower partitioned from its peers keeps its clients connected (and answers their reads)
/// for about syncLimit × tickTime, then gives up; its clients' `sync` is not answered meanwhile.
/// Healing brings it back as a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_a_follower_then_heal() -> Result<(), HarnessError> {
    let Some(ensemble) = ensemble(Ensemble::builder().sync_limit(6)).await else { return Ok(()) };
    let leader = ensemble.leader().await?;
    let follower = (leader + 1) % 3;
    let client = ensemble.client_of(follower, Duration::from_secs(10)).await?;
    ensemble.partition_from_peers(follower).await?;
    let cut = Instant::now();
    // Reads are still answered by the cut-off follower...
    client.check_stat("/").await.expect("a cut-off follower still answers reads");
    // ... but a sync needs the leader.
    let sync = tokio::time::timeout(Duration::from_millis(1500), client.sync("/")).await;
    assert!(!matches!(sync, Ok(Ok(()))), "a follower cut off from the leader answered a sync");
    // The follower gives up after about syncLimit × tickTime (3 s) and drops its clients.
    let mut states = client.state_watcher();
    let dropped = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if states.changed().await != SessionState::SyncConnected {
                return Instant::now();
            }
        }
    })
    .await
    .expect("the cut-off follower dropped its clients");
    eprintln!("cut-off follower dropped its clients after {:?}", dropped - cut);
    // The other two still form a quorum.
    let others = ensemble.client_of(leader, Duration::from_secs(4)).await?;
    others.sync("/").await.unwrap();
    ensemble.heal(follower).await?;
    ensemble.wait_for_quorum(Duration::from_secs(60)).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ensemble.mode(follower).await.as_deref() != Some("follower") {
        assert!(Instant::now() < deadline, "the healed server did not rejoin");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Stop and kill servers: the ensemble serves while a majority runs, and a restarted server
/// rejoins on the same client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kill_and_restart_servers() -> Result<(), HarnessError> {
    let Some(ensemble) = ensemble(Ensemble::builder()).await else { return Ok(()) };
    let leader = ensemble.leader().await?;
    ensemble.kill(leader).await?;
    ensemble.wait_for_quorum(Duration::from_secs(60)).await?;
    let new_leader = ensemble.leader().await?;
    assert_ne!(new_leader, leader);
    let client = ensemble.client(Duration::from_secs(4)).await?;
    client.sync("/").await.unwrap();
    ensemble.start_server(leader).await?;
    let other = (new_leader + 1..new_leader + 3).map(|i| i % 3).find(|i| *i != leader).unwrap_or(leader);
    ensemble.stop(other).await?;
    ensemble.isolate(leader).await?;
    // One of three serving: no quorum, a sync is not answered.
    let lone = ensemble.client_of(new_leader, Duration::from_secs(4)).await;
    if let Ok(lone) = lone {
        let sync = tokio::time::timeout(Duration::from_secs(2), lone.sync("/")).await;
        assert!(!matches!(sync, Ok(Ok(()))), "a minority answered a sync");
    }
    ensemble.heal(leader).await?;
    ensemble.start_server(other).await?;
    ensemble.wait_for_quorum(Duration::from_secs(60)).await?;
    Ok(())
}
