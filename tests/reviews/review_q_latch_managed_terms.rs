//! Review Q (`92da35d`): a started latch on a `ManagedClient` rejoins after an expiry in both of its
//! tasks' lives — while its first term queues (`elect`, before any grant) and, twice, while it
//! leads (then `serve`'s re-queue, boxed; since `a802210` the loss's `rejoin`) — each time on the new session, and `close` then leaves
//! nothing while the session is open.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{LatchEvent, LeaderLatch, LossReason, ManagedClient};
use zk_testcontainers::expire_session;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_latch_rejoins_after_expiries_in_its_first_term_and_while_serving() {
    let zk = zookeeper().await;
    let path = unique_path("rq-managed-terms");
    let observer = client().await;
    let managed =
        ManagedClient::builder(zk.connect_string()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let other_session = client().await;
    let other = LeaderLatch::builder(other_session.clone(), &path).id("other").build().unwrap();
    other.start().unwrap();
    let other_leads = other.await_leadership().await.unwrap();

    let latch = LeaderLatch::builder(&managed, &path).id("m").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let m_session = |participants: Vec<zk_recipes::Participant>| {
        participants.into_iter().find(|p| p.id() == "m").map(|p| p.session_id)
    };
    eventually(Duration::from_secs(5), "m queued", || async {
        m_session(other.participants().await.unwrap()).is_some()
    })
    .await;

    // 1. Expiry while the first term queues: back in the queue on the new session, by itself.
    let mut session = managed.client().session_id().0;
    expire_session(zk.connect_string(), &managed.client()).await.expect("expire");
    eventually(Duration::from_secs(15), "m queued again on its new session (first term)", || async {
        m_session(other.participants().await.unwrap()).is_some_and(|s| s != session)
    })
    .await;
    assert!(events.try_next().is_none(), "no event for a latch that never led");
    drop(other_leads);
    other.close().await.unwrap();
    let leadership = tokio::time::timeout(Duration::from_secs(10), latch.await_leadership()).await.unwrap().unwrap();
    assert!(matches!(events.next().await, Some(LatchEvent::Elected { .. })));

    // 2. and 3. Expiries while leading: `rejoin` queues again on each new session and leads again.
    let mut leadership = leadership;
    for term in 0..2 {
        session = managed.client().session_id().0;
        expire_session(zk.connect_string(), &managed.client()).await.expect("expire");
        let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.expect("told");
        assert_eq!(reason, LossReason::SessionExpired, "term {term}");
        match events.next().await {
            // Told when first lost (a suspended connection, before the expiry is known).
            Some(LatchEvent::NotLeader { reason }) if reason != LossReason::LatchClosed => {},
            other => panic!("term {term}: {other:?}"),
        }
        let next = tokio::time::timeout(Duration::from_secs(15), latch.await_leadership())
            .await
            .unwrap_or_else(|_| panic!("term {term}: the managed latch did not lead again after the expiry"))
            .unwrap();
        assert!(next.fencing_token() > leadership.fencing_token());
        // The expiry may cost more than one leadership (the expiring helper's connection first
        // moves the session away: a suspension, a re-queue and a grant on the still-live session,
        // then the expiry): the events alternate, none `LatchClosed`, up to the leadership held now.
        loop {
            match events.next().await {
                Some(LatchEvent::Elected { lock_path, .. }) if lock_path == next.lock_path() => break,
                Some(LatchEvent::Elected { .. }) => match events.next().await {
                    Some(LatchEvent::NotLeader { reason }) if reason != LossReason::LatchClosed => {},
                    other => panic!("term {term}: after an Elected: {other:?}"),
                },
                other => panic!("term {term}: {other:?}"),
            }
        }
        let holder = latch.leader().await.unwrap().expect("a leader");
        assert_eq!(holder.id(), "m");
        assert_ne!(holder.session_id, session, "term {term}: led from a node of the expired session");
        leadership = next;
    }
    latch.close().await.unwrap();
    assert!(matches!(events.next().await, Some(LatchEvent::NotLeader { reason: LossReason::LatchClosed })));
    assert!(events.next().await.is_none());
    assert_no_nodes_left_while_open(&observer, &path, &[managed.client()], Duration::from_millis(1)).await;
    let _ = managed.close().await;
}
