//! The lock on a real 3-server ensemble, with real faults: a holder whose server is cut off from
//! the leader (the zone partition), the leader killed during a stream of handoffs, the majority
//! lost and back. Every test ends with the history checker (`common/history.rs`): no two holders
//! at once unless the earlier one was told first, fencing tokens increasing, fenced writes
//! counted, no lock nodes left.
//!
//! The tests of this file run one at a time (each starts its own ensemble of three JVMs on a
//! 2-core machine).

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::history::History;
use common::*;
use tokio::time::Instant;
use zk_recipes::{Error, InterProcessMutex, LockGuard, LockState, LossPolicy, LossReason};
use zk_testcontainers::Ensemble;
use zookeeper_client as zk;

/// One ensemble test at a time.
use crate::SERIAL;

const TICK: Duration = Duration::from_millis(500);

async fn counter(client: &zk::Client) -> String {
    let path = unique_path("counter");
    client.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    client.set_data(&path, b"0", None).await.unwrap();
    path
}

async fn counter_value(client: &zk::Client, path: &str) -> u64 {
    client.sync(path).await.unwrap();
    String::from_utf8_lossy(&client.get_data(path).await.unwrap().0).parse().unwrap()
}

/// What one zone-partition case measured (from the moment of the partition).
struct ZoneCase {
    told: Duration,
    reason: LossReason,
    granted: Duration,
}

/// A quiet holder connected only to follower F; a waiter on the leader's server. F is cut off
/// from the other servers (its client still connected to it). The holder must be told before the
/// waiter is granted, and its state at the waiter's grant must be `Lost`.
async fn zone_partition_case(ensemble: &Ensemble, policy: LossPolicy, t: Duration) -> ZoneCase {
    let leader = ensemble.leader().await.unwrap();
    let follower = (leader + 1) % 3;
    let path = unique_path("zone");
    let history = History::new(&path);
    let holder_client = ensemble.client_of(follower, t).await.unwrap();
    let holder = InterProcessMutex::builder(holder_client, &path).loss_policy(policy).build().unwrap();
    let guard = Arc::new(holder.acquire().await.unwrap());
    let held = history.granted("holder", &guard);
    assert_eq!(guard.state(), LockState::Held);
    let waiter_client = ensemble.client_of(leader, t).await.unwrap();
    let observer = waiter_client.clone();
    let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
    let waiting = {
        let guard = guard.clone();
        tokio::spawn(async move {
            let granted = waiter.acquire().await.unwrap();
            // Read the holder's state at the moment of the grant.
            (Instant::now(), guard.state(), granted)
        })
    };
    eventually(Duration::from_secs(10), "the waiter queued", || async { children(&observer, &path).await.len() == 2 })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // its watch is set
    let cut = Instant::now();
    ensemble.partition_from_peers(follower).await.unwrap();
    let (told, granted) = tokio::join!(
        async {
            let reason = tokio::time::timeout(t * 3, guard.lost()).await.expect("the holder is told");
            history.lost(held, reason);
            (Instant::now(), reason)
        },
        async { tokio::time::timeout(t * 5, waiting).await.expect("the waiter is granted").unwrap() }
    );
    let ((told_at, reason), (granted_at, state_at_grant, waiter_guard)) = (told, granted);
    let next = history.granted("waiter", &waiter_guard);
    eprintln!(
        "zone partition, {policy:?}, T = {t:?}, syncLimit × tick = {:?}: holder told {reason:?} after {:?}, \
         waiter granted after {:?} (holder's state then: {state_at_grant:?})",
        ensemble.tick_time() * ensemble.sync_limit(),
        told_at - cut,
        granted_at - cut
    );
    assert!(matches!(state_at_grant, LockState::Lost(_)), "the holder still said {state_at_grant:?} at the next grant");
    assert!(told_at < granted_at, "the holder was told {:?} after the next grant", told_at - granted_at);
    // README timing table: told ≤ 0.4 T (Suspended: heartbeats unanswered) or at the deadline,
    // ≤ 0.6 T (SessionDeadline).
    match policy {
        LossPolicy::Suspended => {
            assert_within(told_at - cut, t * 2 / 5, "README: zone partition, Suspended: told ≤ 0.4 T")
        },
        _ => assert_within(told_at - cut, t * 6 / 10, "README: zone partition, SessionDeadline: told ≤ 0.6 T"),
    }
    ensemble.heal(follower).await.unwrap();
    rejoined(ensemble, follower).await;
    history.releasing(next);
    waiter_guard.release().await.unwrap();
    drop(guard);
    history.check(None);
    assert_no_nodes_left(&observer, &path).await;
    ZoneCase { told: told_at - cut, reason, granted: granted_at - cut }
}

async fn zone_partition(sync_limit: u32) {
    zone_partition_with(TICK, sync_limit, Duration::from_secs(4)).await;
}

async fn zone_partition_with(tick: Duration, sync_limit: u32, t: Duration) {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let ensemble = ensemble(Ensemble::builder().tick_time(tick).sync_limit(sync_limit)).await;
    for policy in [LossPolicy::Suspended, LossPolicy::SessionDeadline] {
        let case = zone_partition_case(&ensemble, policy, t).await;
        assert!(case.told < case.granted);
        if policy == LossPolicy::SessionDeadline && tick * sync_limit > t {
            // The connection never drops: only the deadline can tell.
            assert_eq!(case.reason, LossReason::SessionDeadlinePassed);
        }
    }
}

/// syncLimit × tickTime (5 s) above T (4 s): the cut-off follower keeps answering the holder's
/// pings and reads past the moment the leader expires the session. Only the leader-confirmed
/// deadline (and, under `Suspended`, unanswered heartbeats) can tell the holder in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_a_quiet_holder_sync_limit_above_session_timeout() {
    zone_partition(10).await;
}

/// syncLimit × tickTime (2 s) below T (4 s): the follower drops its clients before the leader can
/// expire the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_a_quiet_holder_sync_limit_below_session_timeout() {
    zone_partition(4).await;
}

/// ZooKeeper's sample configuration: `tickTime` 2 s with T = 6 s — the largest tick the loss
/// deadline's assumption (A1) allows (`tickTime ≤ T/3`), where its margins are thinnest: the leader
/// collects a follower's session touches only every `tickTime/2` = 1 s, and `syncLimit × tickTime`
/// (the sample's 5 ticks, 10 s) is far above T, so the cut-off follower keeps answering the
/// holder's pings and reads past the moment the leader expires the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_a_quiet_holder_tick_time_at_a_third_of_the_session_timeout() {
    zone_partition_with(Duration::from_secs(2), 5, Duration::from_secs(6)).await;
}

/// Workers on separate sessions hand the lock around; the leader is killed in the middle. No two
/// holders overlap, fencing tokens increase, the fenced counter is exact, and the queue keeps
/// draining under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_during_a_stream_of_handoffs() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let t = Duration::from_secs(6);
    let ensemble = Arc::new(ensemble(Ensemble::builder()).await);
    let admin = ensemble.client(t).await.unwrap();
    let path = unique_path("leader-kill");
    let counter = counter(&admin).await;
    let history = Arc::new(History::new(&path));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (ensemble, history, stop, path, counter) =
            (ensemble.clone(), history.clone(), stop.clone(), path.clone(), counter.clone());
        workers.push(tokio::spawn(async move {
            let who = format!("worker-{w}");
            let mut client = ensemble.client(t).await.unwrap();
            let mut mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
            while !stop.load(Ordering::SeqCst) {
                match mutex.acquire_timeout(t * 3).await {
                    Ok(Some(guard)) => hold(&history, &who, &client, guard, &counter).await,
                    Ok(None) => {},
                    Err(Error::SessionLost { .. }) => {
                        client = ensemble.client(t).await.unwrap();
                        mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
                    },
                    Err(err) => eprintln!("{who}: acquire failed: {err}"),
                }
            }
            // The worker's session stays open until the "no node left" check: closing it would
            // delete its nodes whether or not our cleanup did.
            client
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = history.check(None).grants;
    let leader = ensemble.leader().await.unwrap();
    let killed = Instant::now();
    ensemble.kill(leader).await.unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after_kill = history.check(None).grants - before;
    ensemble.start_server(leader).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let mut clients = Vec::new();
    for worker in workers {
        clients.push(tokio::time::timeout(t * 4, worker).await.expect("worker stops").unwrap());
    }
    let value = counter_value(&admin, &counter).await;
    let summary = history.check(Some(value));
    eprintln!(
        "leader killed {:?} into the run: {before} grants before, {after_kill} in the 20 s after; {summary:?}",
        killed.elapsed()
    );
    assert!(before > 5, "handoffs before the kill: {before}");
    assert!(after_kill > 5, "the queue stopped draining after the leader was killed ({after_kill} grants)");
    // No node left while every worker's session is still open: released, dropped and cancelled
    // acquires were cleaned up by us, not by the server ending the sessions.
    assert_no_nodes_left_while_open(&admin, &path, &clients, t).await;
}

/// Holds the lock for a moment: a fenced increment, unless the lock is lost first.
async fn hold(history: &History, who: &str, client: &zk::Client, guard: LockGuard, counter: &str) {
    let index = history.granted(who, &guard);
    tokio::select! {
        reason = guard.lost() => history.lost(index, reason),
        _ = async {
            history.fenced_increment(client, &guard, counter).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        } => history.releasing(index),
    }
    drop(guard);
}

/// Two of three servers stop: no grant while the majority is gone, and every holder is told;
/// when they are back, the lock makes progress within a few T.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_lost_then_back() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let t = Duration::from_secs(4);
    let ensemble = ensemble(Ensemble::builder()).await;
    let admin = ensemble.client(t).await.unwrap();
    let (one, two) = (unique_path("majority-a"), unique_path("majority-b"));
    let histories = [History::new(&one), History::new(&two)];
    let holders = [
        InterProcessMutex::builder(ensemble.client(t).await.unwrap(), &one).build().unwrap(),
        InterProcessMutex::builder(ensemble.client(t).await.unwrap(), &two)
            .loss_policy(LossPolicy::SessionDeadline)
            .build()
            .unwrap(),
    ];
    let mut guards = Vec::new();
    for (holder, history) in holders.iter().zip(&histories) {
        let guard = holder.acquire().await.unwrap();
        guards.push((history, history.granted("holder", &guard), guard));
    }
    // The waiter queues behind the `SessionDeadline` holder, whose node stays until its session
    // ends: only a leader with a quorum can end it.
    let waiter = InterProcessMutex::new(ensemble.client(t).await.unwrap(), &two).unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire().await;
        (Instant::now(), guard)
    });
    eventually(Duration::from_secs(10), "the waiter queued", || async { children(&admin, &two).await.len() == 2 })
        .await;
    let leader = ensemble.leader().await.unwrap();
    let down = [(leader + 1) % 3, (leader + 2) % 3];
    let stopped = Instant::now();
    for i in down {
        ensemble.kill(i).await.unwrap();
    }
    for (history, index, guard) in &guards {
        let reason = tokio::time::timeout(t * 2, guard.lost()).await.expect("every holder is told");
        history.lost(*index, reason);
        eprintln!("majority lost: holder told {reason:?} after {:?}", stopped.elapsed());
    }
    tokio::time::sleep(t).await;
    // No grant without a majority. (The waiter may give up: its client declares the session
    // expired after 1.4 T without a connection.)
    let gave_up = if waiting.is_finished() {
        let (_, result) = waiting.await.unwrap();
        let err = result.expect_err("granted while the majority was gone");
        eprintln!("the waiter gave up while the majority was gone: {err}");
        None
    } else {
        Some(waiting)
    };
    let restarted = Instant::now();
    for i in down {
        ensemble.start_server(i).await.unwrap();
    }
    ensemble.wait_for_quorum(Duration::from_secs(60)).await.unwrap();
    // Progress: the waiter, or (if its session could not survive) a fresh client, is granted.
    let from_waiter = match gave_up {
        Some(waiting) => match tokio::time::timeout(t * 4, waiting).await.expect("progress within a few T").unwrap() {
            (at, Ok(guard)) => Some((at, guard)),
            (_, Err(err)) => {
                eprintln!("the waiter's session did not survive ({err})");
                None
            },
        },
        None => None,
    };
    let granted = match from_waiter {
        Some(granted) => granted,
        None => {
            let fresh = InterProcessMutex::new(ensemble.client(t).await.unwrap(), &two).unwrap();
            let guard = tokio::time::timeout(t * 4, fresh.acquire()).await.expect("progress within a few T").unwrap();
            (Instant::now(), guard)
        },
    };
    eprintln!(
        "majority back after {:?} down: granted {:?} after the restart",
        restarted - stopped,
        granted.0 - restarted
    );
    let next = histories[1].granted("waiter", &granted.1);
    histories[1].releasing(next);
    granted.1.release().await.unwrap();
    drop(guards);
    for history in &histories {
        history.check(None);
    }
    // (The admin session did not survive either.)
    let observer = ensemble.client(t).await.unwrap();
    assert_no_nodes_left(&observer, &one).await;
    assert_no_nodes_left(&observer, &two).await;
}
