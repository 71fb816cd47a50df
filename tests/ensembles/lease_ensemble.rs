//! Hold leases on a real 3-server ensemble under a zone partition (issue 23), with the history
//! checker: a leased holder whose server is cut off from the leader is told — by its lease or by
//! its loss deadline, whichever comes first — before the waiter is granted, and its fenced writes
//! are refused from then on; the library's delete cannot be committed through the cut-off server,
//! so the waiter is granted once the leader expired the holder's session.

use crate::common;
use crate::SERIAL;

use std::sync::Arc;
use std::time::Duration;

use common::history::History;
use common::*;
use tokio::time::Instant;
use zk_recipes::{FencedWriteError, InterProcessMutex, LockState, LossPolicy, LossReason};
use zk_testcontainers::Ensemble;
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_holder_cut_off_from_the_leader_is_told_first_and_cannot_write() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let t = Duration::from_secs(4);
    let lease = Duration::from_millis(1200);
    let ensemble = ensemble(Ensemble::builder().tick_time(Duration::from_millis(500)).sync_limit(10)).await;
    for policy in [LossPolicy::Suspended, LossPolicy::SessionDeadline] {
        let leader = ensemble.leader().await.unwrap();
        let follower = (leader + 1) % 3;
        let path = unique_path("lease-zone");
        let history = History::new(&path);
        let holder_client = ensemble.client_of(follower, t).await.unwrap();
        let counter = format!("{path}-counter");
        let mut level = String::new();
        for name in counter.split('/').skip(1) {
            level = format!("{level}/{name}");
            let _ =
                holder_client.create(&level, b"0", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
        }
        let holder =
            InterProcessMutex::builder(holder_client.clone(), &path).loss_policy(policy).lease(lease).build().unwrap();
        let guard = Arc::new(holder.acquire().await.unwrap());
        let held = history.granted("holder", &guard);
        let waiter_client = ensemble.client_of(leader, t).await.unwrap();
        let observer = waiter_client.clone();
        let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
        let waiting = tokio::spawn(async move {
            let granted = waiter.acquire().await.unwrap();
            (Instant::now(), granted)
        });
        eventually(Duration::from_secs(10), "the waiter queued", || async {
            children(&observer, &path).await.len() == 2
        })
        .await;
        let cut = Instant::now();
        ensemble.partition_from_peers(follower).await.unwrap();
        let reason = tokio::time::timeout(t * 3, guard.lost()).await.expect("the holder is told");
        let told_at = Instant::now();
        history.lost(held, reason);
        assert!(
            matches!(
                reason,
                LossReason::LeaseExpired | LossReason::SessionDeadlinePassed | LossReason::ConnectionSuspended
            ),
            "{reason:?}"
        );
        assert!(matches!(guard.state(), LockState::Lost(_)));
        // Refused locally, nothing sent.
        let mut writer = guard.fenced_writer();
        writer.add_set_data(&counter, b"1", None).unwrap();
        assert!(matches!(writer.commit().await, Err(FencedWriteError::LockLost)));
        let (granted_at, next) = tokio::time::timeout(t * 5, waiting).await.expect("the waiter is granted").unwrap();
        let next_index = history.granted("waiter", &next);
        eprintln!(
            "leased holder cut off ({policy:?}, lease {lease:?}, T = {t:?}): told {reason:?} after {:?}, waiter granted after {:?}",
            told_at - cut,
            granted_at - cut
        );
        assert!(told_at < granted_at, "told {:?} after the next grant", told_at - granted_at);
        ensemble.heal(follower).await.unwrap();
        rejoined(&ensemble, follower).await;
        assert_eq!(observer.get_data(&counter).await.unwrap().0, b"0", "a write of the lost holder was applied");
        history.releasing(next_index);
        next.release().await.unwrap();
        drop(guard);
        history.check(None);
        assert_no_nodes_left(&observer, &path).await;
    }
}
