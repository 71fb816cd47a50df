//! Apache Curator's lock family (Debian's Curator 5.4 jars) against ours on the same paths,
//! through `tests/interop/CuratorSemaphoreHolder.java`: `InterProcessSemaphoreV2` and ours share a
//! pool without ever exceeding its leases (checked through a log both sides append to, ordered by
//! the ensemble), `InterProcessSemaphoreMutex` both ways, revocation both ways, and a lease holder
//! of ours told it lost its lease before a queued Curator acquirer gets it.
//!
//! kazoo's `Semaphore` uses another layout: a test shows what happens when it is pointed at our path.
//!
//! Needs `java` and Debian's Curator jars: without them the tests say so and pass, unless
//! `REQUIRE_CURATOR=1` (CI), when they fail.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::interop::{curator_available, kazoo_available, Holder};
use common::*;
use zk_recipes::{
    InterProcessMutex, InterProcessSemaphoreMutex, InterProcessSemaphoreV2, LockState, LossReason, Revoker,
};
use zk_testcontainers::FaultProxy;
use zookeeper_client as zk;

const WAIT: Duration = Duration::from_secs(60);

/// Appends an event to the shared log `log` (what the Java helper does): a persistent sequential
/// child, so the ensemble orders every event of every process.
async fn append(client: &zk::Client, log: &str, event: &str) {
    let options = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    client.create(&format!("{log}/e-"), event.as_bytes(), &options).await.expect("append to the log");
}

/// Replays the log: the most leases believed held at once, and how many grants each side had.
async fn replay(client: &zk::Client, log: &str) -> (usize, usize, usize) {
    let mut names = children(client, log).await;
    names.sort();
    let (mut inside, mut peak, mut curator, mut ours) = (0usize, 0usize, 0, 0);
    for name in names {
        let (data, _) = client.get_data(&format!("{log}/{name}")).await.unwrap();
        let event = String::from_utf8(data).unwrap();
        if let Some(who) = event.strip_prefix("enter ") {
            inside += 1;
            peak = peak.max(inside);
            if who.starts_with("curator-") {
                curator += 1;
            } else {
                ours += 1;
            }
        } else {
            assert!(event.starts_with("exit "), "{event}");
            inside -= 1;
        }
    }
    assert_eq!(inside, 0, "every grant was returned");
    (peak, curator, ours)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_ours_share_a_pool_without_exceeding_it() {
    if !curator_available() {
        return;
    }
    const MAX: usize = 2;
    const ROUNDS: usize = 12;
    let connect = zookeeper().await.connect_string();
    let path = unique_path("sem-interop");
    let log = format!("{path}-log");
    let observer = client().await;
    // The log, with its parents (plain persistent nodes; the log is read after the run).
    let mut level = String::new();
    for name in log.split('/').skip(1) {
        level = format!("{level}/{name}");
        match observer.create(&level, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await {
            Ok(_) | Err(zk::Error::NodeExists) => {},
            Err(err) => panic!("create {level}: {err}"),
        }
    }
    let hold = Duration::from_millis(25);
    let mut curators: Vec<Holder> = (0..2)
        .map(|_| Holder::curator_family(connect, &path, "semaphore", MAX, WAIT, Some(hold), ROUNDS, &log))
        .collect();
    for curator in &mut curators {
        curator.expect("CONNECTED").await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut sessions = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = client().await;
        sessions.push(client.clone());
        let semaphore = InterProcessSemaphoreV2::new(client.clone(), &path, MAX).unwrap();
        let (stop, log) = (stop.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::SeqCst) {
                let lease = semaphore.acquire().await.unwrap();
                let me = format!("ours-{i}-{round}");
                append(&client, &log, &format!("enter {me}")).await;
                tokio::time::sleep(hold).await;
                assert_eq!(lease.state(), LockState::Held);
                append(&client, &log, &format!("exit {me}")).await;
                lease.release().await.unwrap();
                round += 1;
            }
        }));
    }
    for curator in &mut curators {
        for _ in 0..ROUNDS {
            let line = curator.next().await;
            assert!(line.starts_with("ACQUIRED _c_") && line.contains("-lease-"), "{line}");
            curator.expect("RELEASING").await;
            curator.expect("RELEASED").await;
        }
        curator.expect("DONE").await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    for curator in curators {
        curator.finish().await;
    }
    let (peak, curator_grants, our_grants) = replay(&observer, &log).await;
    eprintln!("peak {peak}, Curator grants {curator_grants}, ours {our_grants}");
    assert!(peak <= MAX, "{peak} leases held at once, max {MAX}");
    assert_eq!(peak, MAX, "the pool never filled: the check could not fail");
    assert_eq!(curator_grants, 2 * ROUNDS);
    assert!(our_grants > 0);
    for dir in ["leases", "locks"] {
        assert_no_nodes_left_while_open(&observer, &format!("{path}/{dir}"), &sessions, Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_mutex_is_shared_with_curator_both_ways() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("sem-mutex-interop");
    let client = client().await;
    let ours = InterProcessSemaphoreMutex::new(client.clone(), &path).unwrap();

    // Curator holds: we wait, and get it when Curator releases.
    let mut curator = Holder::curator_family(connect, &path, "mutex", 1, WAIT, None, 1, "-");
    curator.expect("CONNECTED").await;
    curator.expect("ACQUIRED").await;
    assert!(ours.acquire_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let waiting = tokio::spawn({
        let ours = ours.clone();
        async move {
            let lease = ours.acquire().await.unwrap();
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted while Curator holds");
    curator.release_now();
    let releasing = curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.expect("DONE").await;
    curator.finish().await;
    let (granted, lease) = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert!(granted > releasing - Duration::from_millis(50) || granted >= releasing);

    // We hold: Curator waits, and gets it when we release.
    let mut curator = Holder::curator_family(connect, &path, "mutex", 1, WAIT, Some(Duration::ZERO), 1, "-");
    curator.expect("CONNECTED").await;
    curator.quiet_for(Duration::from_millis(800), "while we hold the semaphore mutex").await;
    lease.release().await.unwrap();
    curator.expect("ACQUIRED").await;
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.expect("DONE").await;
    curator.finish().await;
    for dir in ["leases", "locks"] {
        assert_no_nodes_left_while_open(
            &client,
            &format!("{path}/{dir}"),
            std::slice::from_ref(&client),
            Duration::from_secs(10),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_works_both_ways_with_curator() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let client = client().await;

    // Curator's Revoker asks our revocable holder.
    let path = unique_path("revoke-interop-ours");
    let mutex = InterProcessMutex::builder(client.clone(), &path).revocable(true).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), guard.revoke_requested()).await.is_err());
    let mut revoker = Holder::curator_family(connect, guard.lock_path(), "revoke", 1, WAIT, None, 1, "-");
    revoker.expect("CONNECTED").await;
    revoker.expect("REVOKED").await;
    revoker.finish().await;
    tokio::time::timeout(Duration::from_secs(10), guard.revoke_requested()).await.expect("Curator's request seen");
    assert_eq!(guard.state(), LockState::Held, "advisory");
    guard.release().await.unwrap();

    // Our Revoker asks Curator's revocable holder.
    let path = unique_path("revoke-interop-curator");
    let mut curator = Holder::curator_family(connect, &path, "revocable", 1, WAIT, None, 1, "-");
    curator.expect("CONNECTED").await;
    curator.expect("ACQUIRED").await;
    let participants = InterProcessMutex::new(client.clone(), &path).unwrap().participants().await.unwrap();
    let holder = participants.iter().find(|p| p.is_holder).expect("Curator holds");
    Revoker::attempt_revoke(&client, &holder.path).await.unwrap();
    curator.expect("REVOKE_REQUESTED").await;
    curator.release_now();
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.finish().await;
}

/// A lease holder of ours whose connection stalls is told it lost the lease before a Curator
/// acquirer waiting for the pool is granted it (after the ensemble expired our session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_lease_holder_is_told_before_a_curator_waiter_gets_the_lease() {
    if !curator_available() {
        return;
    }
    let zk = zookeeper().await;
    let path = unique_path("sem-told-curator");
    let t = Duration::from_secs(3);
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let stalled = zk.connector().with_session_timeout(t).connect(&proxy.addr()).await.expect("connect");
    let semaphore = InterProcessSemaphoreV2::new(stalled, &path, 1).unwrap();
    let lease = semaphore.acquire().await.unwrap();
    let mut curator =
        Holder::curator_family(zk.connect_string(), &path, "semaphore", 1, WAIT, Some(Duration::ZERO), 1, "-");
    curator.expect("CONNECTED").await;
    // Curator's waiter holds the internal lock and has its lease node in `leases`: two children.
    let observer = client().await;
    eventually(WAIT, "Curator waits in the pool", || async {
        children(&observer, &format!("{path}/leases")).await.len() == 2
    })
    .await;
    let stalled_at = Instant::now();
    proxy.stall();
    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost()).await.expect("told");
    let told_at = Instant::now();
    assert!(matches!(reason, LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed), "{reason:?}");
    let line = curator.next().await;
    let granted_at = Instant::now();
    assert!(line.starts_with("ACQUIRED "), "{line}");
    eprintln!("stall → told {:?}, Curator granted {:?}", told_at - stalled_at, granted_at - stalled_at);
    assert_within(told_at - stalled_at, t * 2 / 5, "README: connection stalled, Suspended policy: told ≤ 0.4 T");
    assert!(told_at < granted_at, "told only after Curator was granted the lease");
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.expect("DONE").await;
    curator.finish().await;
    proxy.pass();
    drop(lease);
}

/// kazoo 2.8's `Semaphore` cannot share a path with ours (or Curator's): it counts every child of
/// `<path>` — our `locks` and `leases` directories included — and queues on `<path>-__lock__`, so
/// it neither sees our leases nor is seen: with max 3 it is granted beside our holder of a
/// semaphore of 1 (two holders); with max 2 it waits while anyone queues on ours (our two
/// directories fill it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_semaphore_does_not_see_our_leases() {
    if !kazoo_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("sem-kazoo");
    let client = client().await;
    let ours = InterProcessSemaphoreV2::new(client.clone(), &path, 1).unwrap();
    let lease = ours.acquire().await.unwrap();
    // Max 3: kazoo counts our directories as holders and takes a lease of its own. `leases` holds
    // our lease node; `locks` is an empty container once our acquire is done, and the server
    // (checking every 500 ms here) may have reaped it by the time kazoo lists: either way kazoo
    // is granted beside our holder.
    let mut kazoo = Holder::kazoo_semaphore(connect, &path, 3, Duration::from_secs(10));
    kazoo.expect("ACQUIRED").await;
    let line = kazoo.next().await;
    let names: Vec<&str> = line.strip_prefix("CHILDREN ").expect("children").split(',').collect();
    assert!(names.contains(&"leases"), "{names:?}");
    let kazoo_own: Vec<&&str> = names.iter().filter(|name| **name != "leases" && **name != "locks").collect();
    assert_eq!(kazoo_own.len(), 1, "kazoo's own lease node beside our directories: {names:?}");
    // Our semaphore of 1 is still held by us, and sees nothing of kazoo's lease.
    assert_eq!(lease.state(), LockState::Held);
    assert_eq!(ours.participant_nodes().await.unwrap(), vec![lease.node_path().to_owned()]);
    kazoo.finish().await;
    // Max 2, while an acquirer of ours waits (holding the internal lock, so `locks` is not empty
    // and the server keeps it): our two directories alone fill it.
    let waiter = tokio::spawn({
        let ours = ours.clone();
        async move { ours.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "our acquirer waits", || async {
        children(&client, &format!("{path}/leases")).await.len() == 2
    })
    .await;
    let mut kazoo = Holder::kazoo_semaphore(connect, &path, 2, Duration::from_millis(1500));
    kazoo.expect("TIMEOUT").await;
    kazoo.next().await;
    kazoo.finish().await;
    lease.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap().release().await.unwrap();
}

/// The internal lock's waiters do not watch their own nodes (one request less per acquire): a
/// waiter whose queued lock node is deleted by someone else is granted the internal lock when its
/// predecessor goes, beside the rightful holder — here a Curator acquirer in another process (in
/// one process the shared directory view would notice the deletion). That costs no lease too
/// many (a grant rests on the count, not on the lock) and no stall: both wait in the full pool,
/// each counting the other's lease node, until ours sees its lock node gone, gives its lease node
/// up and queues again; then both are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_granted_the_lock_beside_curator_after_its_node_was_deleted_backs_off() {
    if !curator_available() {
        return;
    }
    let connect = zookeeper().await.connect_string();
    let path = unique_path("sem-false-grant");
    let (h, a, b, admin) = (client().await, client().await, client().await, client().await);
    let locks = format!("{path}/locks");
    let holder = InterProcessSemaphoreV2::new(h.clone(), &path, 1).unwrap();
    let lease = holder.acquire().await.unwrap();
    // A holds the internal lock and waits in the full pool.
    let first = tokio::spawn({
        let s = InterProcessSemaphoreV2::new(a.clone(), &path, 1).unwrap();
        async move {
            let lease = s.acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            lease.release().await.unwrap();
        }
    });
    eventually(WAIT, "A waits in the pool", || async { children(&admin, &format!("{path}/leases")).await.len() == 2 })
        .await;
    // B queues behind A; its lock node is then deleted behind its back.
    let second = tokio::spawn({
        let s = InterProcessSemaphoreV2::new(b.clone(), &path, 1).unwrap();
        async move { s.acquire().await.unwrap().release().await.unwrap() }
    });
    eventually(WAIT, "B queued", || async { children(&admin, &locks).await.len() == 2 }).await;
    let mut queued = children(&admin, &locks).await;
    queued.sort_by_key(|name| name[name.len() - 10..].to_owned());
    admin.delete(&format!("{locks}/{}", queued[1]), None).await.unwrap();
    // Curator queues behind A (B's node is gone).
    let mut curator =
        Holder::curator_family(connect, &path, "semaphore", 1, WAIT, Some(Duration::from_millis(50)), 1, "-");
    curator.expect("CONNECTED").await;
    eventually(WAIT, "Curator queued", || async { children(&admin, &locks).await.len() == 2 }).await;
    lease.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), first).await.expect("A served").unwrap();
    let line = curator.next().await;
    assert!(line.starts_with("ACQUIRED "), "{line}");
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.expect("DONE").await;
    curator.finish().await;
    tokio::time::timeout(Duration::from_secs(20), second).await.expect("B served").unwrap();
    for dir in ["leases", "locks"] {
        assert_no_nodes_left_while_open(
            &admin,
            &format!("{path}/{dir}"),
            &[h.clone(), a.clone(), b.clone()],
            Duration::from_secs(10),
        )
        .await;
    }
}
