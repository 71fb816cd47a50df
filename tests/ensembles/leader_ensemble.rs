//! Leader election on a real 3-server ensemble, with real faults: the leader's server (a
//! follower) cut off from the other servers while its client stays connected to it (the zone
//! partition), under both loss policies and with `syncLimit × tickTime` above and below T; the
//! ZooKeeper leader killed and the majority lost and back under a running election. A
//! `LeaderSelector`'s leader future must be dropped before the next leader starts, and afterwards
//! exactly one participant leads.
//!
//! One test at a time (each starts its own ensemble of three JVMs on a 2-core machine).

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::history::History;
use common::*;
use std::time::Instant;
use zk_recipes::{LeaderSelector, LossPolicy, LossSignal, ManagedClient};
use zk_testcontainers::Ensemble;

use crate::SERIAL;

const TICK: Duration = Duration::from_millis(500);
const T: Duration = Duration::from_secs(4);
/// `syncLimit` of the leader-fault test's ensemble.
const SYNC_LIMIT: u32 = 4;

/// A selector on follower F leads (its future pending until dropped); another on the leader's
/// server waits. F is cut off from its peers. The first leader's future must be dropped before
/// the second starts leading, within the README's bound.
async fn zone_partition_case(ensemble: &Ensemble, policy: LossPolicy) -> (Duration, Duration) {
    let leader = ensemble.leader().await.unwrap();
    let follower = (leader + 1) % 3;
    let path = unique_path("leader-zone");
    let old = LeaderSelector::builder(ensemble.client_of(follower, T).await.unwrap(), &path)
        .id("old")
        .loss_policy(policy)
        .build()
        .unwrap();
    let dropped = Arc::new(Mutex::new(None));
    let signal = Arc::new(Mutex::new(None));
    let old_run = tokio::spawn({
        let (old, dropped, signal) = (old.clone(), dropped.clone(), signal.clone());
        async move {
            old.run(|leadership| {
                signal.lock().unwrap().get_or_insert(leadership.loss_signal());
                let stamp = DropStamp(dropped.clone());
                async move {
                    let _stamp = stamp;
                    std::future::pending::<()>().await;
                }
            })
            .await
        }
    });
    eventually(Duration::from_secs(10), "old leads", || async {
        assert!(!old_run.is_finished(), "the old leader's run ended");
        old.has_leadership()
    })
    .await;
    let observer = ensemble.client_of(leader, T).await.unwrap();
    let next = LeaderSelector::builder(observer.clone(), &path).id("next").loss_policy(policy).build().unwrap();
    let started = Arc::new(Mutex::new(None));
    let next_run = tokio::spawn({
        let (next, started) = (next.clone(), started.clone());
        async move {
            next.run(|_leadership| {
                let started = started.clone();
                async move {
                    started.lock().unwrap().get_or_insert(Instant::now());
                    std::future::pending::<()>().await;
                }
            })
            .await
        }
    });
    eventually(Duration::from_secs(10), "next queued", || async { children(&observer, &path).await.len() == 2 }).await;
    // Its watch is set, and the old leader's session is past its monitor's cold start (0.22 T
    // after the first request: README, *When the holder learns*), so what is measured is the
    // steady state.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cut = Instant::now();
    ensemble.partition_from_peers(follower).await.unwrap();
    eventually(T * 5, "the next leader starts", || async { started.lock().unwrap().is_some() }).await;
    let started_at = started.lock().unwrap().expect("started");
    let dropped_at = dropped.lock().unwrap().expect("the old leader's future was dropped before the next started");
    let reason = signal.lock().unwrap().as_ref().and_then(LossSignal::reason);
    eprintln!(
        "leader zone partition, {policy:?}, T = {T:?}, syncLimit × tick = {:?}: old leader's future dropped ({reason:?}) \
         after {:?}, next leader started after {:?}",
        ensemble.tick_time() * ensemble.sync_limit(),
        dropped_at - cut,
        started_at - cut
    );
    assert!(dropped_at < started_at, "the old leader ran {:?} past the next leader's start", dropped_at - started_at);
    match policy {
        LossPolicy::Suspended => {
            assert_within(dropped_at - cut, T * 2 / 5, "README: zone partition, Suspended: told ≤ 0.4 T")
        },
        _ => assert_within(dropped_at - cut, T * 6 / 10, "README: zone partition, SessionDeadline: told ≤ 0.6 T"),
    }
    assert!(!old.has_leadership() && next.has_leadership());
    ensemble.heal(follower).await.unwrap();
    rejoined(ensemble, follower).await;
    old_run.abort();
    next_run.abort();
    let _ = old_run.await;
    let _ = next_run.await;
    assert_no_nodes_left(&observer, &path).await;
    (dropped_at - cut, started_at - cut)
}

async fn zone_partition(sync_limit: u32) {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let ensemble = ensemble(Ensemble::builder().tick_time(TICK).sync_limit(sync_limit)).await;
    for policy in [LossPolicy::Suspended, LossPolicy::SessionDeadline] {
        zone_partition_case(&ensemble, policy).await;
    }
}

/// syncLimit × tickTime (5 s) above T (4 s): the cut-off follower keeps answering the old
/// leader's pings and reads past the moment the ZooKeeper leader expires its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_the_leaders_server_sync_limit_above_session_timeout() {
    zone_partition(10).await;
}

/// syncLimit × tickTime (2 s) below T: the follower drops its clients first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_partition_of_the_leaders_server_sync_limit_below_session_timeout() {
    zone_partition(4).await;
}

/// Three selectors on managed clients (every server in their connect strings) lead in turn for
/// 200 ms each while the ZooKeeper leader is killed, then two servers stop (no majority) for
/// longer than T and come back. The history checker proves no two leaderships overlapped (a
/// leadership lasts from its start until its future ended or was dropped); leadership resumes
/// afterwards; and once the leaders stop taking turns, exactly one of the three leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_then_majority_lost_and_back_one_leader() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let ensemble = ensemble(Ensemble::builder().tick_time(TICK).sync_limit(SYNC_LIMIT)).await;
    let path = unique_path("leader-faults");
    let history = Arc::new(History::new(&path));
    // Once set, a leader keeps leading instead of stepping down after 200 ms.
    let stay = Arc::new(AtomicBool::new(false));
    let mut selectors = Vec::new();
    let mut runs = Vec::new();
    for i in 0..3 {
        let managed = ManagedClient::builder(ensemble.connect_string()).session_timeout(T).connect().await.unwrap();
        let selector = LeaderSelector::builder(&managed, &path).id(format!("s{i}")).build().unwrap();
        let (history, stay) = (history.clone(), stay.clone());
        runs.push(tokio::spawn({
            let selector = selector.clone();
            async move {
                selector
                    .run(|leadership| {
                        let (history, stay) = (history.clone(), stay.clone());
                        async move {
                            let hold = history.granted(&format!("s{i}"), &leadership);
                            // Recorded as ended however the future ends: completed or dropped.
                            let _end = End(history.clone(), hold);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            while stay.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                        }
                    })
                    .await
            }
        }));
        selectors.push(selector);
    }
    let grants = || history.check(None).grants;
    eventually(Duration::from_secs(20), "leadership passes around", || async { grants() >= 6 }).await;

    let leader = ensemble.leader().await.unwrap();
    ensemble.kill(leader).await.unwrap();
    let before = grants();
    eventually(Duration::from_secs(30), "leadership resumes after the leader was killed", || async {
        grants() >= before + 3
    })
    .await;
    ensemble.start_server(leader).await.unwrap();
    rejoined(&ensemble, leader).await;

    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    ensemble.kill(a).await.unwrap();
    ensemble.kill(b).await.unwrap();
    // No majority from here until `a` is started again.
    let outage = tokio::time::Instant::now();
    tokio::time::sleep(2 * T).await;
    let outage_end = tokio::time::Instant::now();
    ensemble.start_server(a).await.unwrap();
    // No leader without a majority, over the whole outage (checked once `a` is back, so every
    // grant made before `outage_end` is recorded). A delete committed before the second kill may
    // still reach a waiter after it: the surviving server answers reads and delivers the
    // notifications it has until it notices the lost quorum, at most syncLimit ticks later
    // (`Learner`'s socket timeout; then it drops its clients). Such a grant rests on a delete
    // committed before the outage, so its predecessor's leadership ended before the outage
    // began. After that, nothing can be granted; and every leadership from before has ended
    // within its loss deadline.
    let settled = outage + SYNC_LIMIT * TICK + Duration::from_secs(1);
    let holds = history.holds();
    for (i, hold) in holds.iter().enumerate() {
        let during = hold.granted >= outage && hold.granted <= outage_end;
        assert!(
            !during || hold.granted < settled,
            "{} was elected {:?} into an outage without a majority",
            hold.who,
            hold.granted - outage
        );
        if during {
            let before = i.checked_sub(1).map(|p| &holds[p]);
            let ended = before.and_then(|p| p.ended).map(|(at, _)| at);
            assert!(
                ended.is_some_and(|at| at < outage),
                "{} was elected {:?} into the outage, after a leadership that ended at {:?} (not before the outage)",
                hold.who,
                hold.granted - outage,
                ended.map(|at| at.saturating_duration_since(outage))
            );
        }
        if hold.granted < settled {
            let ended = hold.ended.map(|(at, _)| at);
            assert!(
                ended.is_some_and(|at| at < settled + T),
                "{}'s leadership from before the outage did not end within T of it: {ended:?}",
                hold.who
            );
        }
    }
    ensemble.start_server(b).await.unwrap();
    let back = grants();
    eventually(Duration::from_secs(60), "leadership resumes with the majority back", || async { grants() >= back + 3 })
        .await;

    // The leaders stop taking turns: exactly one leads, the other two wait.
    stay.store(true, Ordering::SeqCst);
    let leading = || selectors.iter().filter(|s| s.has_leadership()).count();
    eventually(Duration::from_secs(10), "one leads", || async { leading() == 1 }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(leading(), 1, "exactly one leader");
    // Every selector back in the queue (one may still be in its retry pause, or a lost node's
    // delete pending).
    eventually(Duration::from_secs(10), "all three in the election", || async {
        selectors[0].participants().await.is_ok_and(|p| p.len() == 3)
    })
    .await;
    let participants = selectors[0].participants().await.unwrap();
    assert_eq!(participants.len(), 3, "{participants:?}");
    assert_eq!(participants.iter().filter(|p| p.is_holder).count(), 1);
    let leader_id = participants[0].id();
    let holder = selectors.iter().position(|s| s.has_leadership()).unwrap();
    assert_eq!(leader_id, format!("s{holder}"), "the leader ZooKeeper shows is the one that leads");
    let summary = history.check(None);
    eprintln!("leader faults: {summary:?}");
    for run in &runs {
        run.abort();
    }
    for run in runs {
        let _ = run.await;
    }
    assert_no_nodes_left(&ensemble.client(T).await.unwrap(), &path).await;
}

/// Records the end of a leadership when dropped.
struct End(Arc<History>, usize);

impl Drop for End {
    fn drop(&mut self) {
        self.0.releasing(self.1);
    }
}
