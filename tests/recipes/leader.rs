//! Leader election (`LeaderLatch`, `LeaderSelector`) against a real ZooKeeper: one leader at a
//! time under random release, cancellation and session expiry (the history checker), leadership
//! in queue order, `leader()` / `participants()` / `has_leadership()` agreeing with the holder,
//! a lost leadership told — and a selector's leader future dropped — before the next leader is
//! elected, and nothing left behind.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::history::History;
use common::*;
use rand::Rng;
use zk_recipes::{Error, LatchEvent, LatchEvents, LeaderLatch, LeaderSelector, LockState, LossReason, ManagedClient};
use zk_testcontainers::{expire_session, op, FaultProxy};
use zookeeper_client as zk;

/// The reasons a leadership lost to an expiry is first told with: the connection drops as the
/// server closes the session (`ConnectionSuspended`), refined to `SessionExpired` once the client
/// knows (`LockGuard::state` then says so).
macro_rules! expired_reason {
    () => {
        LossReason::SessionExpired | LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed
    };
}

/// Eight latches on their own sessions join, lead, step down, give up waiting, are cancelled and
/// have their sessions expired at random: at no instant do two of them believe they lead (the
/// history checker: a leadership lasts from `acquire` returning until its holder steps down or is
/// told it lost), fencing tokens increase, `has_leadership()` is true exactly while leading, and
/// no node is left while the sessions are still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_latches_one_leader_at_a_time() {
    let zk = zookeeper().await;
    let path = unique_path("latch-history");
    let history = Arc::new(History::new(&path));
    let clients: Vec<zk::Client> = {
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(client().await);
        }
        clients
    };
    // The sessions the workers run on (each replaced after an expiry), kept open for the final
    // check.
    let sessions = Arc::new(Mutex::new(clients.clone()));
    let expired = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut workers = Vec::new();
    for w in 0..8 {
        let (history, sessions, expired, path) = (history.clone(), sessions.clone(), expired.clone(), path.clone());
        workers.push(tokio::spawn(async move {
            let who = format!("latch-{w}");
            let mut client = sessions.lock().unwrap()[w].clone();
            let mut latch = LeaderLatch::builder(client.clone(), &path).id(who.clone()).build().unwrap();
            let mut leaderships = 0;
            while Instant::now() < deadline {
                let (action, patience, lead_for) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(0..10u32),
                        Duration::from_millis(rng.random_range(20..800)),
                        Duration::from_millis(rng.random_range(0..60)),
                    )
                };
                let leadership = match action {
                    // Cancelled while waiting (or right after being elected).
                    0 => {
                        if let Ok(Ok(leadership)) = tokio::time::timeout(patience / 4, latch.acquire_once()).await {
                            // Elected before the timeout: a leadership like any other, recorded.
                            let hold = history.granted(&who, &leadership);
                            leaderships += 1;
                            history.releasing(hold);
                            drop(leadership);
                        }
                        continue;
                    },
                    1 => latch.try_acquire_once().await,
                    _ => latch.acquire_once_timeout(patience).await,
                };
                let Some(leadership) = leadership.expect("acquire") else {
                    assert!(!latch.has_leadership(), "{who}: has_leadership() without a leadership");
                    continue;
                };
                let hold = history.granted(&who, &leadership);
                leaderships += 1;
                assert!(latch.has_leadership(), "{who}: leading, but has_leadership() is false");
                if action == 2 && expired.load(Ordering::SeqCst) < 2 && w % 2 == 0 {
                    // The session ends under the leadership: revoked, like an operator would.
                    expired.fetch_add(1, Ordering::SeqCst);
                    history.revoked(&who);
                    expire_session(zookeeper().await.connect_string(), &client).await.expect("expire");
                    let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.expect("told");
                    history.lost(hold, reason);
                    assert!(!latch.has_leadership(), "{who}: a lost leadership is not leadership");
                    drop(leadership);
                    client = self::client().await;
                    sessions.lock().unwrap()[w] = client.clone();
                    latch = LeaderLatch::builder(client.clone(), &path).id(who.clone()).build().unwrap();
                    continue;
                }
                tokio::select! {
                    () = tokio::time::sleep(lead_for) => {},
                    reason = leadership.lost() => history.lost(hold, reason),
                }
                history.releasing(hold);
                if action % 2 == 0 {
                    leadership.release().await.expect("step down");
                } else {
                    drop(leadership);
                }
                assert!(!latch.has_leadership(), "{who}: stepped down, but has_leadership() is true");
            }
            leaderships
        }));
    }
    let mut total = 0;
    for worker in workers {
        total += worker.await.expect("worker");
    }
    let summary = history.check(None);
    eprintln!("latches: {total} leaderships, {summary:?}");
    assert!(summary.grants >= 20, "too few leaderships to say anything: {summary:?}");
    let open = sessions.lock().unwrap().clone();
    assert_no_nodes_left_while_open(&client().await, &path, &open, Duration::from_secs(5)).await;
    let _ = zk;
}

/// Leadership passes in queue order; `leader()` and `participants()` show the leader's id first
/// and everyone in queue order, and agree with who holds it; the latch stores Curator's layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_in_queue_order() {
    let path = unique_path("latch-order");
    let observer = client().await;
    let mut latches = Vec::new();
    for i in 0..4 {
        latches.push(LeaderLatch::builder(client().await, &path).id(format!("node-{i}")).build().unwrap());
    }
    assert!(latches[0].leader().await.unwrap().is_none(), "nobody leads an empty election");
    let first = latches[0].acquire_once().await.unwrap();
    let mut waiting = Vec::new();
    for (i, latch) in latches.iter().enumerate().skip(1) {
        let latch = latch.clone();
        waiting.push(tokio::spawn(async move { (i, latch.acquire_once().await.unwrap()) }));
        // Queued before the next one joins.
        eventually(Duration::from_secs(5), "queued", || async {
            queued_nodes(&observer, &path, "-latch-").await.len() == i + 1
        })
        .await;
    }
    let nodes = queued_nodes(&observer, &path, "-latch-").await;
    assert!(nodes.iter().all(|n| n.starts_with("_c_") && n.contains("-latch-")), "Curator's layout: {nodes:?}");
    let (data, _) = observer.get_data(&format!("{path}/{}", nodes[0])).await.unwrap();
    assert_eq!(data, b"node-0", "the participant id is the node's data");

    let mut leadership = first;
    let mut tokens = vec![leadership.fencing_token()];
    for expected in 0..4 {
        let leader = latches[3 - expected].leader().await.unwrap().expect("a leader");
        assert_eq!(leader.id(), format!("node-{expected}"));
        assert_eq!(leader.path, leadership.lock_path());
        let participants = latches[0].participants().await.unwrap();
        let ids: Vec<String> = participants.iter().map(|p| p.id()).collect();
        let want: Vec<String> = (expected..4).map(|i| format!("node-{i}")).collect();
        assert_eq!(ids, want, "participants in queue order");
        assert!(participants[0].is_holder && participants[1..].iter().all(|p| !p.is_holder));
        for (i, latch) in latches.iter().enumerate() {
            assert_eq!(latch.has_leadership(), i == expected, "has_leadership of node-{i}");
        }
        leadership.release().await.unwrap();
        if expected == 3 {
            break;
        }
        // Exactly the next in the queue is elected, nobody else: checked at the grant, from the
        // state of everyone else.
        let (next, granted) = tokio::time::timeout(Duration::from_secs(10), waiting.remove(0))
            .await
            .expect("the first in the queue is elected")
            .unwrap();
        assert_eq!(next, expected + 1, "leadership in queue order");
        for (i, latch) in latches.iter().enumerate() {
            assert_eq!(latch.has_leadership(), i == next, "at the grant to node-{next}: has_leadership of node-{i}");
        }
        let holders: Vec<String> =
            latches[0].participants().await.unwrap().into_iter().filter(|p| p.is_holder).map(|p| p.id()).collect();
        assert_eq!(holders, [format!("node-{next}")], "at the grant: one holder, the one granted");
        tokens.push(granted.fencing_token());
        leadership = granted;
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens increase: {tokens:?}");
    assert!(latches[0].leader().await.unwrap().is_none());
    assert_no_nodes_left(&observer, &path).await;
}

/// A leader whose connection stalls is told it lost leadership before the next leader is
/// elected; `has_leadership()` is false from then on although its guard is still held, and the
/// next leader's fencing token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_is_told_before_the_next_is_elected() {
    let zk = zookeeper().await;
    let path = unique_path("latch-stall");
    let t = Duration::from_secs(3);
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let stalled_client = zk.connector().with_session_timeout(t).connect(&proxy.addr()).await.expect("connect");
    let latch = LeaderLatch::builder(stalled_client, &path).id("stalled").build().unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    let next = LeaderLatch::builder(client().await, &path).id("next").build().unwrap();
    let old = leadership.loss_signal();
    let waiting = tokio::spawn({
        let next = next.clone();
        async move {
            let leadership = next.acquire_once().await.unwrap();
            // The old leader's state at the moment of the grant.
            (Instant::now(), leadership, old.reason())
        }
    });
    eventually(Duration::from_secs(5), "next queued", || async { latch.participants().await.unwrap().len() == 2 })
        .await;
    assert!(latch.has_leadership() && !waiting.is_finished(), "queued behind a live leader, not elected");

    let stalled_at = Instant::now();
    proxy.stall();
    let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.expect("told");
    let told_at = Instant::now();
    assert!(matches!(reason, LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed), "{reason:?}");
    assert!(!latch.has_leadership(), "a lost leadership is not leadership, guard or not");
    assert!(matches!(leadership.state(), LockState::Lost(_)));
    let (elected_at, new_leadership, old_at_grant) =
        tokio::time::timeout(Duration::from_secs(15), waiting).await.unwrap().unwrap();
    assert!(old_at_grant.is_some(), "the old leader read as leading at the next grant");
    eprintln!("stall → old leader told {:?}, next elected {:?}", told_at - stalled_at, elected_at - stalled_at);
    assert_within(told_at - stalled_at, t * 2 / 5, "README: connection stalled, Suspended policy: told ≤ 0.4 T");
    assert!(told_at < elected_at, "the old leader learned of the loss only after the next was elected");
    assert!(next.has_leadership() && !latch.has_leadership());
    assert!(leadership.fencing_token() < new_leadership.fencing_token());
    assert_eq!(next.leader().await.unwrap().expect("leader").id(), "next");
    proxy.pass();
    drop(leadership);
    new_leadership.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// A `LeaderSelector` on a managed client whose connection stalls: its leader's future is
/// dropped (not left running) before the other selector's leader starts; after the session
/// expires, the selector queues again on the new session by itself and leads again when the
/// other steps down — never from a node of the old session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_drops_its_leader_on_loss_and_queues_again() {
    let zk = zookeeper().await;
    let path = unique_path("selector-stall");
    let t = Duration::from_secs(3);
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let managed = ManagedClient::builder(proxy.addr()).session_timeout(t).connect().await.expect("managed client");
    let first_session = managed.client().session_id().0;
    let selector = LeaderSelector::builder(&managed, &path).id("a").build().unwrap();
    let dropped = Arc::new(Mutex::new(None));
    let leaderships = Arc::new(Mutex::new(Vec::new()));
    let run_a = tokio::spawn({
        let (selector, dropped, leaderships) = (selector.clone(), dropped.clone(), leaderships.clone());
        async move {
            selector
                .run(|leadership| {
                    let stamp = DropStamp(dropped.clone());
                    leaderships.lock().unwrap().push((leadership.lock_path().to_owned(), leadership.fencing_token()));
                    async move {
                        let _stamp = stamp;
                        let _leadership = leadership;
                        std::future::pending::<()>().await; // leads until it is taken away
                    }
                })
                .await
        }
    });
    eventually(Duration::from_secs(10), "a leads", || async { selector.has_leadership() }).await;

    // The other selector leads for 300 ms each time it is elected, recording when it started.
    let other = LeaderSelector::builder(client().await, &path).id("b").build().unwrap();
    let b_started = Arc::new(Mutex::new(Vec::new()));
    let run_b = tokio::spawn({
        let (other, b_started) = (other.clone(), b_started.clone());
        async move {
            other
                .run(|leadership| {
                    let b_started = b_started.clone();
                    async move {
                        b_started.lock().unwrap().push((Instant::now(), leadership.fencing_token()));
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                })
                .await
        }
    });
    eventually(Duration::from_secs(5), "b queued", || async { other.participants().await.unwrap().len() == 2 }).await;
    assert!(b_started.lock().unwrap().is_empty());

    let stalled_at = Instant::now();
    proxy.stall();
    eventually(Duration::from_secs(15), "b elected", || async { !b_started.lock().unwrap().is_empty() }).await;
    let dropped_at = dropped.lock().unwrap().expect("a's leader future was dropped");
    let (b_at, b_token) = b_started.lock().unwrap()[0];
    eprintln!("stall → a's leader dropped {:?}, b elected {:?}", dropped_at - stalled_at, b_at - stalled_at);
    assert!(dropped_at < b_at, "a's leader future ran on after b was elected");
    assert_within(
        dropped_at - stalled_at,
        t * 2 / 5,
        "README: a LeaderSelector's leader is dropped ≤ 0.4 T after a stall",
    );
    assert!(!selector.has_leadership());

    // The stalled session expires while the proxy holds its traffic; the managed client gets a
    // new session, on which `a` queues again and leads again (b steps down every 300 ms).
    tokio::time::sleep(t + Duration::from_millis(500)).await;
    proxy.pass();
    eventually(Duration::from_secs(20), "a leads again", || async { leaderships.lock().unwrap().len() >= 2 }).await;
    let (node, token) = leaderships.lock().unwrap()[1].clone();
    let owner = client().await.get_data(&node).await.map(|(_, stat)| stat.ephemeral_owner);
    assert!(owner.is_ok_and(|owner| owner != first_session), "a leads again on a node of the new session");
    assert!(token > b_token, "fencing tokens grow across leaders");
    run_a.abort();
    run_b.abort();
    let _ = run_a.await;
    let _ = run_b.await;
    assert_no_nodes_left(&client().await, &path).await;
}

/// `run` returns only for what no retry can fix: a plain client whose session expired
/// (`SessionLost`), and refused ACLs (`NoAuth`); the leader is stepped down and requeued when
/// its future completes, so two selectors alternate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_steps_down_requeues_and_ends_only_when_no_retry_can_fix_it() {
    let zk = zookeeper().await;
    let path = unique_path("selector-alternate");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut runs = Vec::new();
    let mut clients = Vec::new();
    for id in ["x", "y"] {
        let client = client().await;
        clients.push(client.clone());
        let selector = LeaderSelector::builder(client, &path).id(id).build().unwrap();
        let order = order.clone();
        runs.push(tokio::spawn(async move {
            selector
                .run(|leadership| {
                    let order = order.clone();
                    async move {
                        order.lock().unwrap().push((id, leadership.fencing_token()));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
                .await
        }));
    }
    eventually(Duration::from_secs(10), "six leaderships of both", || async {
        let seen = order.lock().unwrap();
        seen.len() >= 6 && seen.iter().any(|(id, _)| *id == "y")
    })
    .await;
    let seen = order.lock().unwrap().clone();
    // x may lead a few times alone before y has joined; from y's first turn on, they alternate.
    let both = seen.iter().position(|(id, _)| *id == "y").unwrap();
    let turns = &seen[both..];
    assert!(turns.len() >= 3, "{seen:?}");
    assert!(turns.windows(2).all(|w| w[0].0 != w[1].0), "each steps down and queues behind the other: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].1 < w[1].1), "fencing tokens grow: {seen:?}");

    // The plain client of x expires: its run ends with SessionLost, y leads on alone.
    expire_session(zk.connect_string(), &clients[0]).await.expect("expire");
    let x = runs.remove(0);
    let ended = tokio::time::timeout(Duration::from_secs(15), x).await.expect("x's run ends").unwrap();
    assert!(matches!(ended, Err(Error::SessionLost { .. })), "{ended:?}");
    let before = order.lock().unwrap().len();
    eventually(Duration::from_secs(5), "y leads on", || async { order.lock().unwrap().len() >= before + 3 }).await;
    runs.remove(0).abort();

    // A path we may not create in: NoAuth, at once.
    let protected = unique_path("selector-acl");
    let owner = client().await;
    owner.create(&protected, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read())).await.unwrap();
    let denied = LeaderSelector::new(client().await, format!("{protected}/election")).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), denied.run(|_| async {})).await.expect("run ends");
    assert!(matches!(ended, Err(Error::NoAuth { .. })), "{ended:?}");
    owner.delete(&protected, None).await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// A `LeaderSelector`'s leadership lasts as long as the leader's future, also when the closure
/// drops the guard it was given at once (`|_leadership| async { .. }`): a participant queued
/// behind it is elected only once the future completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_leads_for_as_long_as_its_future_runs() {
    let path = unique_path("selector-lifetime");
    let selector = LeaderSelector::new(client().await, &path).unwrap();
    let (began_tx, mut began) = tokio::sync::mpsc::unbounded_channel();
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn({
        let selector = selector.clone();
        async move {
            selector
                .run(|_leadership| {
                    // The guard is dropped right here; the future below does not hold it.
                    let (began_tx, ended_tx) = (began_tx.clone(), ended_tx.clone());
                    async move {
                        let _ = began_tx.send(Instant::now());
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        let _ = ended_tx.send(Instant::now());
                        std::future::pending::<()>().await;
                    }
                })
                .await
        }
    });
    let began_at = tokio::time::timeout(Duration::from_secs(10), began.recv()).await.unwrap().unwrap();
    assert!(selector.has_leadership(), "leading while the future runs, its guard dropped or not");
    // A mutex on the same path (a selector is a `lock-` mutex) queues behind the leadership.
    let other = zk_recipes::InterProcessMutex::new(client().await, &path).unwrap();
    assert!(other.try_acquire().await.unwrap().is_none(), "taken while the leader's future runs");
    let ended_at = tokio::time::timeout(Duration::from_secs(10), ended.recv()).await.unwrap().unwrap();
    assert!(ended_at - began_at >= Duration::from_millis(400));
    assert!(selector.has_leadership(), "still leading: the future has not completed");
    run.abort();
    let _ = run.await;
    let granted = tokio::time::timeout(Duration::from_secs(10), other.acquire()).await.expect("granted").unwrap();
    granted.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// On a `ManagedClient`, a leadership lost to a session expiry is `Lost(SessionExpired)`;
/// `has_leadership()` is false from then on, and the latch's next `acquire` leads on the new
/// session — with a node of that session, never one of the expired session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_latch_loses_leadership_to_an_expiry_and_leads_again_on_the_new_session() {
    let zk = zookeeper().await;
    let path = unique_path("latch-expiry");
    let managed =
        ManagedClient::builder(zk.connect_string()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let latch = LeaderLatch::builder(&managed, &path).id("managed").build().unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    let old_session = managed.client().session_id().0;
    let waiter = LeaderLatch::builder(client().await, &path).id("waiter").build().unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire_once().await.unwrap() }
    });
    eventually(Duration::from_secs(5), "waiter queued", || async { latch.participants().await.unwrap().len() == 2 })
        .await;

    expire_session(zk.connect_string(), &managed.client()).await.expect("expire");
    let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.expect("told");
    assert_eq!(reason, LossReason::SessionExpired);
    assert!(!latch.has_leadership(), "a lost leadership is not leadership");
    let waiter_leads = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
    assert!(waiter.has_leadership());
    let waiter_token = waiter_leads.fencing_token();

    // Rejoin: queued on the new session behind the waiter, elected when it steps down.
    let again = tokio::spawn({
        let (latch, waiter, waiter_signal) = (latch.clone(), waiter.clone(), waiter_leads.loss_signal());
        async move {
            let elected = latch.acquire_once().await.unwrap();
            // At the grant: the waiter stepped down.
            assert!(
                waiter_signal.is_released() && !waiter.has_leadership(),
                "rejoined latch elected while the waiter leads"
            );
            elected
        }
    });
    eventually(Duration::from_secs(10), "rejoined", || async { waiter.participants().await.unwrap().len() == 2 }).await;
    let ours = waiter.participants().await.unwrap().into_iter().find(|p| p.id() == "managed").expect("our node");
    assert_ne!(ours.session_id, old_session, "rejoined with a node of the expired session");
    assert_eq!(ours.session_id, managed.client().session_id().0);
    assert!(!latch.has_leadership());
    waiter_leads.release().await.unwrap();
    let leadership = tokio::time::timeout(Duration::from_secs(10), again).await.unwrap().unwrap();
    assert!(latch.has_leadership());
    assert!(leadership.fencing_token() > waiter_token, "fencing tokens grow");
    drop(leadership);
    assert_no_nodes_left(&client().await, &path).await;
}

/// Review D, item 3 (the contract; Curator's `LeaderLatch` resets onto the new session):
/// a started latch on a `ManagedClient` whose session expires is told `Lost(SessionExpired)`, and
/// is back in the election on the new session by itself — no call to rejoin — and leads again
/// once the other participant steps down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_latch_rejoins_the_election_by_itself_after_an_expiry() {
    let zk = zookeeper().await;
    let path = unique_path("rd-latch-rejoin");
    let managed =
        ManagedClient::builder(zk.connect_string()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let latch = LeaderLatch::builder(&managed, &path).id("managed").build().unwrap();
    latch.start().unwrap();
    let leadership = latch.await_leadership().await.unwrap();
    let old_session = managed.client().session_id().0;
    let waiter_client = client().await;
    let waiter = LeaderLatch::builder(waiter_client.clone(), &path).id("waiter").build().unwrap();
    waiter.start().unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.await_leadership().await.unwrap() }
    });
    eventually(Duration::from_secs(5), "waiter queued", || async { waiter.participants().await.unwrap().len() == 2 })
        .await;

    expire_session(zk.connect_string(), &managed.client()).await.expect("expire");
    let reason = tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.expect("told");
    assert_eq!(reason, LossReason::SessionExpired);
    drop(leadership);
    let waiter_leads = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("waiter elected").unwrap();

    // Nothing is called: the latch is expected to be back in the election on its new session.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rejoined = loop {
        let found = waiter
            .participants()
            .await
            .unwrap()
            .into_iter()
            .any(|p| p.id() == "managed" && p.session_id != old_session);
        if found || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The waiter steps down (a started latch steps down with `close`).
    waiter_leads.release().await.unwrap();
    waiter.close().await.unwrap();
    assert!(
        rejoined,
        "the managed latch did not rejoin the election on its new session by itself (the issue's contract; Curator's \
         LeaderLatch resets onto the new session)"
    );
    eventually(Duration::from_secs(10), "the rejoined latch leads", || async { latch.has_leadership() }).await;
    latch.close().await.unwrap();
    // Checked while both sessions are still open: nothing left by the latches themselves.
    assert_no_nodes_left_while_open(&client().await, &path, &[waiter_client, managed.client()], Duration::from_secs(5))
        .await;
    let _ = managed.close().await;
    assert_no_nodes_left(&client().await, &path).await;
}

/// Curator's lifecycle: a latch starts once, leads until closed; `close` tells every guard of the
/// leadership `Lost(LatchClosed)` and has deleted the node when it returns (checked at once,
/// while the session is open), for a leader and for a queued latch; a close cancelled at its
/// first poll still leaves the election; a closed latch neither starts nor waits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_latch_leads_until_closed_and_close_removes_its_node() {
    let path = unique_path("latch-lifecycle");
    let observer = client().await;
    let session = client().await;
    let latch = LeaderLatch::builder(session.clone(), &path).id("a").build().unwrap();
    assert!(matches!(latch.await_leadership().await, Err(Error::LatchState { .. })), "await before start");
    latch.start().unwrap();
    assert!(matches!(latch.start(), Err(Error::LatchState { .. })), "a latch starts once");
    let leadership = latch.await_leadership().await.unwrap();
    assert!(latch.has_leadership());
    assert_eq!(leadership.state(), LockState::Held);
    let again = latch.await_leadership().await.unwrap();
    assert_eq!(again.lock_path(), leadership.lock_path(), "the same leadership while it lasts");
    drop(again);
    assert!(latch.has_leadership(), "dropping a guard of the leadership does not step down");
    assert!(matches!(latch.acquire_once().await, Err(Error::LatchState { .. })), "one-shot on a started latch");

    // A second latch queued behind it, and a third whose close is cancelled at its first poll.
    let queued = LeaderLatch::builder(session.clone(), &path).id("b").build().unwrap();
    queued.start().unwrap();
    let cancelled = LeaderLatch::builder(session.clone(), &path).id("c").build().unwrap();
    cancelled.start().unwrap();
    eventually(Duration::from_secs(5), "b and c queued", || async {
        queued_nodes(&observer, &path, "-latch-").await.len() == 3
    })
    .await;
    queued.close().await.unwrap();
    let ids: Vec<String> = latch.participants().await.unwrap().iter().map(|p| p.id()).collect();
    assert_eq!(ids, ["a", "c"], "a closed queued latch's node is gone when close returns");
    tokio::select! {
        biased;
        _ = cancelled.close() => {},
        () = std::future::ready(()) => {},
    }
    eventually(Duration::from_secs(5), "a close cancelled at its first poll still leaves", || async {
        queued_nodes(&observer, &path, "-latch-").await.len() == 1
    })
    .await;

    latch.close().await.unwrap();
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LatchClosed), "a guard kept past close is lost");
    assert_eq!(tokio::time::timeout(Duration::from_secs(1), leadership.lost()).await, Ok(LossReason::LatchClosed));
    assert!(!latch.has_leadership());
    assert!(children(&observer, &path).await.is_empty(), "the leader's node is gone when close returns");
    latch.close().await.unwrap();
    assert!(matches!(latch.start(), Err(Error::LatchState { .. })), "a closed latch does not start again");
    assert!(matches!(latch.await_leadership().await, Err(Error::LatchState { .. })));
    leadership.release().await.unwrap();
    assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the session is still open");
}

/// A started latch keeps its place in the election after a lost leadership by queueing again — a
/// different task from the one that queued it first (the first ends at the grant) — and `close()`
/// or dropping the latch still leaves the election from there: the requeued node is gone when
/// `close` returns (checked while the latch's session is open), and a dropped latch's soon after.
/// Fails if the task that serves the latch after its first grant is not the one `close` stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_requeued_after_a_loss_leaves_the_election_on_close_and_on_drop() {
    let path = unique_path("latch-requeued");
    let observer = client().await;
    let (a_session, b_session, c_session) = (client().await, client().await, client().await);
    let a = LeaderLatch::builder(a_session.clone(), &path).id("a").build().unwrap();
    let b = LeaderLatch::builder(b_session.clone(), &path).id("b").build().unwrap();
    let c = LeaderLatch::builder(c_session.clone(), &path).id("c").build().unwrap();
    a.start().unwrap();
    let leadership = a.await_leadership().await.unwrap();
    b.start().unwrap();
    eventually(Duration::from_secs(5), "b queued", || async { a.participants().await.unwrap().len() == 2 }).await;
    c.start().unwrap();
    eventually(Duration::from_secs(5), "c queued", || async { a.participants().await.unwrap().len() == 3 }).await;
    // a's leadership taken (its node deleted by another session): it queues again, behind c; then
    // b's, the next leader's, and b queues again behind a.
    let b_leadership = {
        observer.delete(leadership.lock_path(), None).await.unwrap();
        b.await_leadership().await.unwrap()
    };
    eventually(Duration::from_secs(5), "a queued again", || async { a.participants().await.unwrap().len() == 3 }).await;
    observer.delete(b_leadership.lock_path(), None).await.unwrap();
    drop(c.await_leadership().await.unwrap()); // (dropping a guard of a latch's leadership does not step down)
    eventually(Duration::from_secs(5), "b queued again", || async { a.participants().await.unwrap().len() == 3 }).await;
    assert_eq!(leadership.state(), LockState::Lost(LossReason::NodeDeleted));
    let ids: Vec<String> = a.participants().await.unwrap().iter().map(|p| p.id()).collect();
    assert_eq!(ids, ["c", "a", "b"], "a and b each queued again after their loss");

    a.close().await.unwrap();
    let ids: Vec<String> = c.participants().await.unwrap().iter().map(|p| p.id()).collect();
    assert_eq!(ids, ["c", "b"], "a requeued latch's node is gone when close returns");
    drop(b);
    eventually(Duration::from_secs(5), "a dropped requeued latch leaves the election", || async {
        queued_nodes(&observer, &path, "-latch-").await.len() == 1
    })
    .await;
    for session in [&a_session, &b_session] {
        assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the sessions are still open");
    }
    c.close().await.unwrap();
    assert!(children(&observer, &path).await.is_empty());
}

/// `close()` of a started latch whose create was sent but not yet answered: the attempt is
/// abandoned, the node its create makes is deleted by its GUID in the background, and `close()`
/// returns only after that delete (checked at once by another session, while the latch's session
/// is open). The proxy holds the create, and later the delete, for a second each: a close that
/// did not wait for the deletion by GUID returns a second before the node is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_before_the_create_is_answered_returns_after_the_node_is_deleted() {
    const HOLD: Duration = Duration::from_secs(1);
    let zk = zookeeper().await;
    let path = unique_path("latch-close-unanswered");
    let observer = client().await;
    observer.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(6)).connect(&proxy.addr()).await.expect("connect");
    let latch = LeaderLatch::builder(session.clone(), &path).id("a").build().unwrap();
    let creates = |proxy: &FaultProxy| {
        let requests = proxy.requests();
        [op::CREATE, op::CREATE2].iter().map(|op| requests.get(op).copied().unwrap_or(0)).sum::<u64>()
    };
    proxy.delay_requests(&[op::CREATE, op::CREATE2, op::DELETE], HOLD);
    latch.start().unwrap();
    eventually(Duration::from_secs(5), "the latch's create reached the proxy", || async { creates(&proxy) == 1 }).await;
    let sent = Instant::now();
    latch.close().await.unwrap();
    let closed = sent.elapsed();
    let left = children(&observer, &path).await;
    assert!(left.is_empty(), "close returned {closed:?} after the create was sent, with {left:?} still there");
    assert!(!latch.has_leadership());
    assert!(matches!(session.check_stat("/").await, Ok(Some(_))), "the session is still open");
    assert!(creates(&proxy) == 1, "close sent no create of its own");
}

/// Curator's `await(timeout)`: a timed wait that runs out keeps the latch in the election, in its
/// place — the same node, ahead of those queued after it — and it is elected from that place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_wait_for_leadership_keeps_the_latch_in_its_place() {
    let path = unique_path("latch-await-timeout");
    let observer = client().await;
    let latches: Vec<LeaderLatch> = {
        let mut latches = Vec::new();
        for id in ["a", "b", "c"] {
            let latch = LeaderLatch::builder(client().await, &path).id(id).build().unwrap();
            latch.start().unwrap();
            // Queued in this order.
            let queued = latches.len() + 1;
            eventually(Duration::from_secs(5), "queued", || async {
                queued_nodes(&observer, &path, "-latch-").await.len() == queued
            })
            .await;
            latches.push(latch);
        }
        latches
    };
    let leadership = latches[0].await_leadership().await.unwrap();
    let b_node = latches[0].participants().await.unwrap()[1].clone();
    assert_eq!(b_node.id(), "b");
    let waited = latches[1].await_leadership_timeout(Duration::from_millis(300)).await.unwrap();
    assert!(waited.is_none(), "b does not lead while a does");
    assert!(latches[0].has_leadership() && !latches[1].has_leadership());
    let after: Vec<(String, String)> =
        latches[0].participants().await.unwrap().into_iter().map(|p| (p.id(), p.path)).collect();
    assert_eq!(after[1], ("b".to_owned(), b_node.path.clone()), "b kept its node and its place: {after:?}");
    // Cancelled waits keep the place too.
    let _ = tokio::time::timeout(Duration::from_millis(50), latches[1].await_leadership()).await;

    latches[0].close().await.unwrap();
    let elected = tokio::time::timeout(Duration::from_secs(10), latches[1].await_leadership()).await.unwrap().unwrap();
    // At b's grant (the 300 ms timed wait above is a fixed window): a no longer leads.
    assert!(!latches[0].has_leadership(), "at b's grant, a still leads");
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LatchClosed), "at b's grant, a's guard");
    assert_eq!(elected.lock_path(), b_node.path, "elected from the place it kept");
    assert!(!latches[2].has_leadership(), "at b's grant, c does not lead");
    drop(leadership);
    drop(elected);
    for latch in &latches {
        latch.close().await.unwrap();
    }
    let left = children(&observer, &path).await;
    assert!(left.is_empty(), "{left:?}");
}

/// Asking a latch that already leads for leadership again fails at once with `AlreadyLeading`
/// (never a wait behind its own node); once it stepped down, it may acquire again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquiring_a_latch_that_already_leads_is_an_error() {
    let path = unique_path("latch-already-leading");
    let latch = LeaderLatch::builder(client().await, &path).id("a").build().unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    let clone = latch.clone();
    for again in [
        tokio::time::timeout(Duration::from_secs(2), clone.acquire_once()).await.map(|r| r.map(drop)),
        tokio::time::timeout(Duration::from_secs(2), clone.try_acquire_once()).await.map(|r| r.map(drop)),
        tokio::time::timeout(Duration::from_secs(2), clone.acquire_once_timeout(Duration::from_secs(1)))
            .await
            .map(|r| r.map(drop)),
    ] {
        let again = again.expect("answered at once, not a wait behind its own node");
        assert!(matches!(again, Err(Error::AlreadyLeading { .. })), "{again:?}");
    }
    assert!(matches!(latch.start(), Err(Error::LatchState { .. })), "no start while a one-shot leadership is held");
    assert_eq!(latch.participants().await.unwrap().len(), 1, "nothing was queued");
    leadership.release().await.unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    leadership.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// A subscriber sees every change, in order: elected, not leader after an expiry (the managed
/// latch rejoins by itself), elected again on the new session with a larger fencing token, not
/// leader when closed — and then the end of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_every_leadership_change() {
    let zk = zookeeper().await;
    let path = unique_path("latch-events");
    let managed =
        ManagedClient::builder(zk.connect_string()).session_timeout(Duration::from_secs(4)).connect().await.unwrap();
    let latch = LeaderLatch::builder(&managed, &path).id("a").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let Some(LatchEvent::Elected { fencing_token: first, lock_path, loss }) = next(&mut events).await else {
        panic!("elected first")
    };
    assert!(!loss.is_lost());
    let other_client = client().await;
    let other = LeaderLatch::builder(other_client.clone(), &path).id("b").build().unwrap();
    other.start().unwrap();
    let mut other_events = other.subscribe();
    eventually(Duration::from_secs(5), "b queued", || async { latch.participants().await.unwrap().len() == 2 }).await;
    // A late subscriber starts with the current leadership.
    let mut late = latch.subscribe();
    assert!(matches!(late.try_next(), Some(LatchEvent::Elected { fencing_token, .. }) if fencing_token == first));
    drop(late);

    expire_session(zk.connect_string(), &managed.client()).await.expect("expire");
    let event = next(&mut events).await;
    // Told at the first sign (the connection drops as the session ends), refined later.
    assert!(matches!(event, Some(LatchEvent::NotLeader { reason: expired_reason!() })), "{event:?}");
    assert!(loss.is_lost(), "the elected event's loss signal says it too");
    let event = next(&mut other_events).await;
    let Some(LatchEvent::Elected { fencing_token: b_token, .. }) = event else { panic!("b elected: {event:?}") };
    assert!(b_token > first);
    // Rejoined by itself: elected again when b closes.
    eventually(Duration::from_secs(15), "a rejoined", || async { other.participants().await.unwrap().len() == 2 })
        .await;
    other.close().await.unwrap();
    let event = next(&mut other_events).await;
    assert!(matches!(event, Some(LatchEvent::NotLeader { reason: LossReason::LatchClosed })), "{event:?}");
    assert!(next(&mut other_events).await.is_none(), "b's stream ends with its close");
    let event = next(&mut events).await;
    let Some(LatchEvent::Elected { fencing_token: again, lock_path: again_path, .. }) = event else {
        panic!("a elected again: {event:?}")
    };
    assert!(again > b_token, "fencing tokens grow");
    assert_ne!(again_path, lock_path, "a new node");
    let owner = other_client.get_data(&again_path).await.unwrap().1.ephemeral_owner;
    assert_eq!(owner, managed.client().session_id().0, "on the new session");
    latch.close().await.unwrap();
    let event = next(&mut events).await;
    assert!(matches!(event, Some(LatchEvent::NotLeader { reason: LossReason::LatchClosed })), "{event:?}");
    assert!(next(&mut events).await.is_none(), "the stream ends with the close");
    assert_no_nodes_left_while_open(&other_client, &path, &[managed.client()], Duration::from_secs(5)).await;
    let _ = managed.close().await;
}

/// The next event of `events`, within 20 s.
async fn next(events: &mut LatchEvents) -> Option<LatchEvent> {
    tokio::time::timeout(Duration::from_secs(20), events.next()).await.expect("an event in time")
}

/// On a plain client, a started latch whose session expired cannot rejoin: it stops, with the
/// reason — `NotLeader(SessionExpired)`, then `Stopped(SessionLost)`; `await_leadership` fails
/// with `SessionLost` from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_on_a_plain_client_stops_when_its_session_expires() {
    let zk = zookeeper().await;
    let path = unique_path("latch-plain-expiry");
    let plain = client().await;
    let latch = LeaderLatch::builder(plain.clone(), &path).id("plain").build().unwrap();
    latch.start().unwrap();
    let leadership = latch.await_leadership().await.unwrap();
    let mut events = latch.subscribe();
    assert!(matches!(events.next().await, Some(LatchEvent::Elected { .. })));
    expire_session(zk.connect_string(), &plain).await.expect("expire");
    // The expiry first takes the connection away (the expiring client attaches to the session):
    // under the default policy the leadership is lost at once and the latch may queue again on the
    // still-living session, and lead, before the server expires it. Whatever came before, the
    // stream ends with the loss and then the stop.
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("told and stopped");
        let stopped = matches!(event, Some(LatchEvent::Stopped { .. }) | None);
        seen.push(event);
        if stopped {
            break;
        }
    }
    let n = seen.len();
    assert!(n >= 2, "{seen:?}");
    assert!(matches!(seen[n - 2], Some(LatchEvent::NotLeader { reason: expired_reason!() })), "{seen:?}");
    assert!(matches!(seen[n - 1], Some(LatchEvent::Stopped { error: Error::SessionLost { .. } })), "{seen:?}");
    assert!(events.next().await.is_none());
    assert!(!latch.has_leadership());
    assert_eq!(leadership.state(), LockState::Lost(LossReason::SessionExpired));
    let awaited = latch.await_leadership().await;
    assert!(matches!(awaited, Err(Error::SessionLost { .. })), "{awaited:?}");
    latch.close().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// Two started latches on one session and `path`: the leader (with its leadership) and one queued
/// behind it.
async fn leader_and_queued(path: &str) -> (zookeeper_client::Client, LeaderLatch, zk_recipes::LockGuard, LeaderLatch) {
    let session = client().await;
    let leader = LeaderLatch::builder(session.clone(), path).id("leader").build().unwrap();
    leader.start().unwrap();
    let leadership = leader.await_leadership().await.unwrap();
    let queued = LeaderLatch::builder(session.clone(), path).id("queued").build().unwrap();
    queued.start().unwrap();
    eventually(Duration::from_secs(5), "queued", || async { leader.participants().await.unwrap().len() == 2 }).await;
    (session, leader, leadership, queued)
}

/// Dropping every clone of a started latch leaves the election, leader or queued: no node is left
/// while the session is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_started_latch_leaves_the_election() {
    let path = unique_path("latch-dropped");
    let (session, leader, leadership, queued) = leader_and_queued(&path).await;
    drop(leader);
    drop(queued);
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LatchClosed), "a dropped latch stepped down");
    drop(leadership);
    assert_no_nodes_left_while_open(&client().await, &path, &[session], Duration::from_secs(5)).await;
}

/// A latch's clones share it: dropping one (also the original) while another lives changes
/// nothing — the leader keeps its leadership and the queued latch its place — and only the last
/// clone's drop leaves the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_one_clone_of_a_started_latch_keeps_it_in_the_election() {
    let path = unique_path("latch-clone-dropped");
    let (session, leader, leadership, queued) = leader_and_queued(&path).await;
    let (leader_clone, queued_clone) = (leader.clone(), queued.clone());
    drop(leader);
    drop(queued_clone);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leadership.state(), LockState::Held, "dropping one clone stepped the leader down");
    assert!(leader_clone.has_leadership());
    assert_eq!(leader_clone.participants().await.unwrap().len(), 2, "dropping one clone left the election");
    // The queued latch still queues: it leads once the leader steps down.
    drop(leadership);
    leader_clone.close().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), queued.await_leadership()).await.unwrap().unwrap();
    assert_eq!(next.state(), LockState::Held);
    drop(queued);
    assert_eq!(next.state(), LockState::Lost(LossReason::LatchClosed), "the last clone's drop steps down");
    drop(next);
    assert_no_nodes_left_while_open(&client().await, &path, &[session], Duration::from_secs(5)).await;
}

/// Three started latches on managed clients; the leader's session is expired four times. Every
/// leadership — the rejoined ones included — is recorded from the subscribers' events: no two
/// overlap (a leader is told before the next is elected), fencing tokens grow, and every latch
/// led again after rejoining by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_latches_record_every_leadership_across_expiries() {
    let zk = zookeeper().await;
    let path = unique_path("latch-rejoin-history");
    let history = Arc::new(History::new(&path));
    let mut managed = Vec::new();
    let mut latches = Vec::new();
    let mut recorders = Vec::new();
    for i in 0..3 {
        let client = ManagedClient::builder(zk.connect_string())
            .session_timeout(Duration::from_secs(4))
            .connect()
            .await
            .unwrap();
        let latch = LeaderLatch::builder(&client, &path).id(format!("latch-{i}")).build().unwrap();
        let mut events = latch.subscribe();
        let history = history.clone();
        let who = format!("latch-{i}");
        recorders.push(tokio::spawn(async move {
            let mut elected = 0;
            while let Some(event) = events.next().await {
                if let LatchEvent::Elected { fencing_token, lock_path, loss } = event {
                    elected += 1;
                    let hold = history.elected(&who, &lock_path, fencing_token);
                    let history = history.clone();
                    tokio::spawn(async move { history.lost(hold, loss.lost().await) });
                }
            }
            elected
        }));
        latch.start().unwrap();
        managed.push(client);
        latches.push(latch);
    }
    for _ in 0..4 {
        let leader = {
            let mut leader = None;
            eventually(Duration::from_secs(20), "a leader", || {
                leader = latches.iter().position(LeaderLatch::has_leadership);
                let found = leader.is_some();
                async move { found }
            })
            .await;
            leader.unwrap()
        };
        let closing = tokio::time::Instant::now();
        expire_session(zk.connect_string(), &managed[leader].client()).await.expect("expire");
        // Revoked from the start of the close; a leadership the latch took again on the same
        // session while the close was under way (it requeues at once when the close takes its
        // connection away) is revoked too.
        history.revoked_during(&format!("latch-{leader}"), closing, tokio::time::Instant::now());
        eventually(Duration::from_secs(10), "told", || async { !latches[leader].has_leadership() }).await;
    }
    // Everyone back in the election on its current session.
    eventually(Duration::from_secs(20), "all rejoined", || async {
        latches[0].participants().await.map(|p| p.len() == 3).unwrap_or(false)
    })
    .await;
    let open: Vec<zk::Client> = managed.iter().map(ManagedClient::client).collect();
    for latch in &latches {
        // The leader's belief ends with `Lost(LatchClosed)`, recorded like any loss.
        latch.close().await.unwrap();
    }
    let mut elected = 0;
    for recorder in recorders {
        elected += recorder.await.unwrap();
    }
    let summary = history.check(None);
    eprintln!("{elected} leaderships: {summary:?}");
    assert!(elected >= 5, "four expiries: at least five leaderships, rejoined ones included ({elected})");
    assert_no_nodes_left_while_open(&client().await, &path, &open, Duration::from_secs(5)).await;
    for client in &managed {
        let _ = client.close().await;
    }
}

/// Loss wins a race with work: a selector's leader whose next step is ready when the runtime
/// freezes (its only thread blocked past the loss deadline, as in a SIGSTOP or a long GC pause)
/// is dropped without taking that step — whichever task the runtime polls first after the freeze.
/// Runs on a current-thread runtime: the leader's task is queued to run before the session
/// monitor's timer is even looked at.
#[tokio::test]
async fn a_frozen_selector_leader_takes_no_step_after_its_loss_deadline() {
    let zk = zookeeper().await;
    let path = unique_path("selector-freeze");
    let t = Duration::from_secs(2);
    let frozen = zk.connector().with_session_timeout(t).connect(zk.connect_string()).await.expect("connect");
    let selector = LeaderSelector::new(frozen, &path).unwrap();
    let go = Arc::new(tokio::sync::Notify::new());
    let steps = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(Mutex::new(None));
    let run = tokio::spawn({
        let (selector, go, steps, dropped) = (selector.clone(), go.clone(), steps.clone(), dropped.clone());
        async move {
            selector
                .run(|_leadership| {
                    let (go, steps, stamp) = (go.clone(), steps.clone(), DropStamp(dropped.clone()));
                    async move {
                        let _stamp = stamp;
                        loop {
                            go.notified().await;
                            steps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
                .await
        }
    });
    eventually(Duration::from_secs(10), "leads", || async { selector.has_leadership() }).await;
    // Without a freeze, a step is taken.
    go.notify_one();
    eventually(Duration::from_secs(5), "one step", || async { steps.load(Ordering::SeqCst) == 1 }).await;

    // The next step is made ready, then the thread blocks for T (> the loss deadline, 0.8 T).
    tokio::spawn({
        let go = go.clone();
        async move {
            go.notify_one();
            std::thread::sleep(t);
        }
    })
    .await
    .unwrap();
    eventually(Duration::from_secs(5), "the leader's future dropped", || async { dropped.lock().unwrap().is_some() })
        .await;
    assert_eq!(steps.load(Ordering::SeqCst), 1, "the leader took a step after its loss deadline had passed");
    run.abort();
    let _ = run.await;
}

/// A started latch whose leadership's lease runs out is told `NotLeader(LeaseExpired)` and queues
/// again by itself, as after any other loss: it leads again with a new node and a larger fencing
/// token, and again loses that leadership to its lease. (The lease's end is told to the latch by
/// the session — the hold ended by its owner — not by a task waiting on the loss.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_latch_whose_lease_runs_out_queues_again() {
    let path = unique_path("latch-lease-requeue");
    let session = client().await;
    let latch =
        LeaderLatch::builder(session.clone(), &path).id("leased").lease(Duration::from_millis(600)).build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let mut terms = Vec::new();
    while terms.len() < 3 {
        let Some(LatchEvent::Elected { fencing_token, lock_path, .. }) = next(&mut events).await else {
            panic!("elected (term {})", terms.len() + 1)
        };
        let event = next(&mut events).await;
        assert!(matches!(event, Some(LatchEvent::NotLeader { reason: LossReason::LeaseExpired })), "{event:?}");
        terms.push((fencing_token, lock_path));
    }
    assert!(terms.windows(2).all(|pair| pair[1].0 > pair[0].0), "fencing tokens grow: {terms:?}");
    assert!(terms.windows(2).all(|pair| pair[1].1 != pair[0].1), "a new node each term: {terms:?}");
    latch.close().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[session], Duration::from_secs(5)).await;
}

/// A started latch runs a task only while it queues (issue 24: a task per latch was 512 B of
/// every leading latch's memory): fifty latches leading on one session leave no task of theirs
/// alive. (Counted on this test's runtime, where the latches' and the session's tasks run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leading_latches_keep_no_task() {
    let session = client().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    // The session's own tasks (monitor, own-node watches) started by a first leadership.
    let first = LeaderLatch::builder(session.clone(), unique_path("latch-no-task")).build().unwrap();
    first.start().unwrap();
    drop(first.await_leadership().await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = metrics.num_alive_tasks();
    let latches: Vec<LeaderLatch> =
        (0..50).map(|_| LeaderLatch::builder(session.clone(), unique_path("latch-no-task")).build().unwrap()).collect();
    for latch in &latches {
        latch.start().unwrap();
    }
    for latch in &latches {
        drop(tokio::time::timeout(Duration::from_secs(20), latch.await_leadership()).await.expect("leads").unwrap());
    }
    // The own-node watches are set 100 ms after the grants: by the session's one task.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leading = metrics.num_alive_tasks();
    assert!(latches.iter().all(LeaderLatch::has_leadership));
    assert!(leading < before + 10, "{leading} tasks alive with 50 latches leading, {before} with one");
    for latch in latches.iter().chain([&first]) {
        latch.close().await.unwrap();
    }
}
