//! Review reproduction (`shared/review/review_timeout.rs`): `Client::session_timeout()` is a
//! snapshot taken at the first connect. A later server may negotiate a smaller timeout on
//! reconnection (a different `maxSessionTimeout`/`tickTime`, e.g. during a rolling configuration
//! change); the leader then expires the session after the smaller timeout.
//!
//! Run under the configuration the README recommends for servers whose limits differ: the holder
//! states the smallest timeout any server may negotiate (`MutexBuilder::min_session_timeout`, here
//! server B's `maxSessionTimeout`, 2 s), and the session monitor counts with it — so the holder is
//! told before the next grant although the client asked for 10 s and first got 10 s.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::history::History;
use common::*;
use tokio::time::Instant;
use zk_recipes::{InterProcessMutex, LossPolicy};

async fn case(policy: LossPolicy) {
    init_tracing();
    let t = Duration::from_secs(10);
    // Server B negotiates at most 2 s; the client negotiated 10 s elsewhere and was moved onto B.
    let MovedToB { ensemble, leader, b, client: holder_client, a_door: _a_door } =
        client_moved_to_a_server_with_a_lower_limit(t).await;

    let path = unique_path("renegotiated");
    let history = Arc::new(History::new(&path));
    // The smallest timeout any server of this ensemble negotiates for a 10 s request: B's 2 s.
    let holder = InterProcessMutex::builder(holder_client, &path)
        .loss_policy(policy)
        .min_session_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = Arc::new(holder.acquire().await.unwrap());
    let held = history.granted("holder", &guard);
    let waiter_client = ensemble.client_of(leader, t).await.unwrap();
    let observer = waiter_client.clone();
    let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
    let waiting = {
        let guard = guard.clone();
        let history = history.clone();
        tokio::spawn(async move {
            let granted = waiter.acquire().await.unwrap();
            let at = Instant::now();
            let state = guard.state();
            let next = history.granted("waiter", &granted);
            (at, state, granted, next)
        })
    };
    eventually(Duration::from_secs(10), "the waiter queued", || async { children(&observer, &path).await.len() == 2 })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cut = Instant::now();
    ensemble.partition_from_peers(b).await.unwrap();
    let (told, granted) = tokio::join!(
        async {
            // Only a loss the holder was told is recorded.
            let reason = tokio::time::timeout(t * 3, guard.lost()).await.ok();
            if let Some(reason) = reason {
                history.lost(held, reason);
            } else {
                eprintln!("holder NOT told within 3 T; its state: {:?}", guard.state());
            }
            (Instant::now(), reason)
        },
        async {
            let r = tokio::time::timeout(t * 5, waiting).await.expect("the waiter is granted").unwrap();
            eprintln!("waiter granted after {:?}, holder's state then: {:?}", r.0 - cut, r.1);
            r
        }
    );
    let ((told_at, reason), (granted_at, state_at_grant, waiter_guard, next)) = (told, granted);
    eprintln!(
        "renegotiated timeout, {policy:?}: holder told {reason:?} after {:?}; waiter granted after {:?}; holder's state at the grant: {state_at_grant:?}",
        told_at - cut,
        granted_at - cut
    );
    history.releasing(next);
    ensemble.heal(b).await.unwrap();
    waiter_guard.release().await.unwrap();
    let reason = reason.expect("the holder is told within 3 T");
    assert!(told_at < granted_at, "holder told {:?} AFTER the next grant", told_at - granted_at);
    assert!(
        matches!(state_at_grant, zk_recipes::LockState::Lost(_)),
        "the holder's state when the next holder was granted: {state_at_grant:?}"
    );
    // The README's bound: the deadline is `E + 0.8 T` with T the floor and `E` before the cut.
    let floor = Duration::from_secs(2);
    assert_within(told_at - cut, floor * 4 / 5, &format!("holder told ({reason:?}) within 0.8 × the floor of the cut"));
    history.check(None);
}

/// One ensemble at a time (three JVMs each on a 2-core machine).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renegotiated_timeout_session_deadline() {
    let _serial = SERIAL.lock().await;
    case(LossPolicy::SessionDeadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renegotiated_timeout_suspended() {
    let _serial = SERIAL.lock().await;
    case(LossPolicy::Suspended).await;
}
