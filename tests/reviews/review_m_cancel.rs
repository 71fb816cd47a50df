//! Review M: an acquire of a brand-new lock path dropped at any point (4bf92f8 moved awaits into
//! boxes and the shared listing out of `create`; b19ca63 added the `multi` with the directory and
//! the listing behind it) leaves no lock node while the sessions are open, and no level of the
//! lock path that never had a child (a container that never had a child is never reaped).
//!
//! Cancellation points are spread by timeouts of growing length, with the proxy slowing or losing
//! chosen requests so that they land before, during and after the `multi` and its listing.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// Every level of `path` below `parent` that exists had a child once (`cversion > 0`): none was
/// created alone. Also waits for the lock nodes to go.
async fn assert_clean(raw: &zk::Client, parent: &str, path: &str, open: &[zk::Client]) {
    assert_no_nodes_left_while_open(raw, path, open, Duration::from_secs(15)).await;
    let mut level = parent.to_owned();
    for part in path[parent.len() + 1..].split('/') {
        level = format!("{level}/{part}");
        if let Some(stat) = raw.check_stat(&level).await.unwrap() {
            assert!(stat.cversion > 0 || stat.num_children > 0, "{level} exists and never had a child: {stat:?}");
        }
    }
}

fn path_of(parent: &str, i: usize) -> String {
    match i % 3 {
        0 => format!("{parent}/c{i}"),
        1 => format!("{parent}/c{i}/lock"),
        _ => format!("{parent}/c{i}/x/lock"),
    }
}

/// Three sessions each start an acquire of the same new path, dropped after a growing timeout
/// (0 to 32 ms in 400 µs steps): some are dropped before the create, some between the create's
/// `NoNode` and the `multi`, some while the `multi` or its listing are out, some granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_first_acquires_leave_nothing() {
    let raw = client().await;
    let parent = unique_path("rm-cancel");
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let sessions = vec![client().await, client().await, client().await];
    let (mut granted, mut dropped) = (0, 0);
    let count = 80;
    for i in 0..count {
        let path = path_of(&parent, i);
        let limit = Duration::from_micros(400 * i as u64);
        let mut tasks = Vec::new();
        for (s, session) in sessions.iter().enumerate() {
            let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
            tasks.push(tokio::spawn(async move {
                let outcome = if s == 2 {
                    tokio::time::timeout(limit, mutex.try_acquire()).await.map(|r| r.unwrap())
                } else {
                    tokio::time::timeout(limit, mutex.acquire()).await.map(|r| Some(r.unwrap()))
                };
                match outcome {
                    Ok(Some(guard)) => {
                        guard.release().await.unwrap();
                        (1, 0)
                    },
                    Ok(None) => (0, 0),
                    Err(_) => (0, 1),
                }
            }));
        }
        for task in tasks {
            let (g, d) = task.await.unwrap();
            granted += g;
            dropped += d;
        }
    }
    eprintln!("granted {granted}, dropped {dropped}");
    assert!(dropped > 0 && granted > 0, "the timeouts never or always cut: granted {granted}, dropped {dropped}");
    for i in 0..count {
        assert_clean(&raw, &parent, &path_of(&parent, i), &sessions).await;
    }
    // And the paths are usable at once by another session.
    let fresh = client().await;
    for i in 0..count {
        let mutex = InterProcessMutex::new(fresh.clone(), path_of(&parent, i)).unwrap();
        let guard = mutex.try_acquire().await.unwrap().expect("nothing left ahead of a fresh session");
        guard.release().await.unwrap();
    }
}

/// Through a proxy that slows (or loses the reply of) the `multi` or the listings, acquires of
/// new paths dropped after timeouts spread over the slowed window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_first_acquires_around_a_slow_or_lost_multi_leave_nothing() {
    let raw = client().await;
    let parent = unique_path("rm-cancel-proxy");
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    let other = client().await;
    let mut paths = Vec::new();
    let (mut granted, mut dropped) = (0, 0);
    for (mode, fault) in ["delay multi", "delay listing", "lose multi reply", "lose listing reply"].iter().enumerate() {
        for step in 0..16 {
            let i = mode * 100 + step;
            let path = path_of(&parent, i);
            paths.push(path.clone());
            match mode {
                0 => proxy.delay_requests(&[op::MULTI], Duration::from_millis(20)),
                1 => proxy.delay_requests(&[op::GET_CHILDREN2], Duration::from_millis(20)),
                2 => proxy.drop_reply_to_next(&[op::MULTI]),
                _ => proxy.drop_reply_to_next(&[op::GET_CHILDREN2]),
            }
            let limit = Duration::from_millis(3 * step as u64);
            let ours = InterProcessMutex::new(session.clone(), &path).unwrap();
            // Another session races for the same new path, unhindered.
            let theirs = InterProcessMutex::new(other.clone(), &path).unwrap();
            let (a, b) = tokio::join!(
                tokio::time::timeout(limit, ours.acquire()),
                tokio::time::timeout(limit + Duration::from_millis(1), theirs.acquire()),
            );
            for outcome in [a, b] {
                match outcome {
                    Ok(guard) => {
                        guard.unwrap_or_else(|err| panic!("{fault} step {step}: {err:?}")).release().await.unwrap();
                        granted += 1;
                    },
                    Err(_) => dropped += 1,
                }
            }
            proxy.delay_requests(&[], Duration::ZERO);
            proxy.drop_reply_to_next(&[]);
            // Let a cut connection come back before the next step.
            eventually(Duration::from_secs(10), "reconnected", || async {
                session.state() == zk::SessionState::SyncConnected
            })
            .await;
        }
    }
    eprintln!("granted {granted}, dropped {dropped}");
    assert!(dropped > 0 && granted > 0, "the timeouts never or always cut: granted {granted}, dropped {dropped}");
    for path in &paths {
        assert_clean(&raw, &parent, path, &[session.clone(), other.clone()]).await;
    }
}
