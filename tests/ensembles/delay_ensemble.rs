//! Lock-delay on a real 3-server ensemble under a zone partition (issue 23), with the history
//! checker: a holder whose server is cut off from the leader vanishes without a clean release
//! when the leader expires its session; the waiter, on the leader's side, is granted no sooner
//! than the delay after that delete — seen by an observer watching the holder's node on the
//! leader — and the holder was told before. A clean release on the same path first (so the grant
//! cannot wait on a missing mark alone), and both loss policies.

use crate::common;
use crate::SERIAL;

use std::time::Duration;

use common::history::History;
use common::*;
use tokio::time::Instant;
use zk_recipes::{InterProcessMutex, LossPolicy, LossReason};
use zk_testcontainers::Ensemble;

const DELAY: Duration = Duration::from_secs(3);
/// Scheduling on a loaded 2-core machine, a round trip or two, and the observer's own event.
const SLACK: Duration = Duration::from_millis(1000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_the_leader_delays_the_next_grant_after_its_session_expires() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let t = Duration::from_secs(4);
    let ensemble = ensemble(Ensemble::builder().tick_time(Duration::from_millis(500)).sync_limit(10)).await;
    for policy in [LossPolicy::Suspended, LossPolicy::SessionDeadline] {
        let leader = ensemble.leader().await.unwrap();
        let follower = (leader + 1) % 3;
        let path = unique_path("delay-zone");
        let history = History::new(&path);
        let holder_client = ensemble.client_of(follower, t).await.unwrap();
        let waiter_client = ensemble.client_of(leader, t).await.unwrap();
        let observer = ensemble.client_of(leader, t).await.unwrap();
        let delayed = |client: &zookeeper_client::Client| {
            InterProcessMutex::builder(client.clone(), &path).loss_policy(policy).lock_delay(DELAY).build().unwrap()
        };
        // A clean release first: its mark vouches for the path, so what follows waits on the
        // unclean loss alone.
        delayed(&holder_client).acquire().await.unwrap().release().await.unwrap();
        let guard = delayed(&holder_client).acquire().await.unwrap();
        let held = history.granted("holder", &guard);
        let only = children(&observer, &path).await;
        assert_eq!(only.len(), 1, "{only:?}");
        let holder_node = format!("{path}/{}", only[0]);
        let waiter = delayed(&waiter_client);
        let waiting = tokio::spawn(async move {
            let granted = waiter.acquire().await.unwrap();
            (Instant::now(), granted)
        });
        eventually(Duration::from_secs(10), "the waiter queued", || async {
            children(&observer, &path).await.len() == 2
        })
        .await;
        // The leader's view of the holder's node: its deletion, when the leader expires the session.
        let (stat, deleted) = observer.check_and_watch_stat(&holder_node).await.unwrap();
        assert!(stat.is_some(), "the holder's node");
        let cut = Instant::now();
        ensemble.partition_from_peers(follower).await.unwrap();
        let reason = tokio::time::timeout(t * 3, guard.lost()).await.expect("the holder is told");
        let told_at = Instant::now();
        history.lost(held, reason);
        assert!(matches!(reason, LossReason::SessionDeadlinePassed | LossReason::ConnectionSuspended), "{reason:?}");
        let event = tokio::time::timeout(t * 3, deleted.changed()).await.expect("the leader deletes the node");
        let deleted_at = Instant::now();
        assert_eq!(event.event_type, zookeeper_client::EventType::NodeDeleted);
        let (granted_at, next) = tokio::time::timeout(t * 5, waiting).await.expect("the waiter is granted").unwrap();
        let next_index = history.granted("waiter", &next);
        eprintln!(
            "holder cut off ({policy:?}, T = {t:?}, delay {DELAY:?}): told {reason:?} after {:?}, node deleted after {:?}, waiter granted after {:?}",
            told_at - cut,
            deleted_at - cut,
            granted_at - cut
        );
        assert!(told_at < granted_at, "told {:?} after the next grant", told_at - granted_at);
        // The observer saw the delete no earlier than the server made it; the waiter, on the same
        // server, no earlier than the observer less scheduling: the delay is served from the delete.
        assert!(
            granted_at - deleted_at >= DELAY - Duration::from_millis(100),
            "granted {:?} after the unclean loss's delete",
            granted_at - deleted_at
        );
        assert_within(granted_at - deleted_at, DELAY + SLACK, "granted within the slack of the delay");
        ensemble.heal(follower).await.unwrap();
        rejoined(&ensemble, follower).await;
        history.releasing(next_index);
        next.release().await.unwrap();
        drop(guard);
        history.check(None);
        assert_no_nodes_left_while_open(
            &observer,
            &path,
            &[observer.clone(), waiter_client.clone()],
            Duration::from_secs(20),
        )
        .await;
    }
}
