//! An acquire of a lock path whose directory does not exist yet — the first acquire of every lock
//! a service takes at start: its node is created in one `multi` with the directory, a listing
//! pipelined behind it, and its czxid taken from that listing (`created_with_directory` in
//! `src/engine/mod.rs`). What it sends is counted at a proxy; acquirers racing to create one new
//! directory still exclude each other.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// A persistent parent nobody used before: the lock paths of a test go below it.
async fn parent(raw: &zk::Client, name: &str) -> String {
    let parent = unique_path(name);
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    parent
}

/// README (Performance): an acquire of a lock path whose parent exists but whose directory does
/// not sends its create (answered `NoNode`), the listing pipelined behind it (`NoNode` too), a
/// `multi` creating the directory with its node and a listing pipelined behind that — 4 requests
/// in 2 round trips, no check of the path's levels, no read of the node — and holds the lock with
/// the node's czxid as its fencing token. After two such acquires the session guesses new paths
/// missing (`src/engine/directory_guess.rs`): the `multi` and its listing only, 2 requests in one
/// round trip. Two existing directories then cost the refused `multi` first (4 requests), and the
/// guess is back: a create and its listing. Every acquire holds its lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_lock_path_costs_a_create_a_multi_and_two_listings_until_the_session_learns_it() {
    let raw = client().await;
    let parent = parent(&raw, "new-path").await;
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    // (the directory exists, creates, multis, listings), in order on one session.
    let steps = [
        (false, 1, 1, 2),
        (false, 1, 1, 2),
        (false, 0, 1, 1),
        (false, 0, 1, 1),
        (true, 1, 1, 2),
        (true, 1, 1, 2),
        (true, 1, 0, 1),
        (false, 1, 1, 2),
    ];
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    // Kept: what a session learned lives as long as one of its recipes does.
    let mut mutexes = Vec::new();
    for (i, (exists, creates, multis, listings)) in steps.into_iter().enumerate() {
        let path = format!("{parent}/lock-{i}");
        if exists {
            raw.create(&path, &[], &persistent).await.unwrap();
        }
        let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
        let before = proxy.requests();
        let guard = mutex.acquire().await.unwrap();
        let sent = sent_between(&before, &proxy.requests());
        assert_eq!(count(&sent, op::CREATE2), creates, "step {i}: creates: {sent:?}");
        assert_eq!(count(&sent, op::MULTI), multis, "step {i}: multis: {sent:?}");
        assert_eq!(count(&sent, op::GET_CHILDREN2), listings, "step {i}: a listing behind each: {sent:?}");
        assert_eq!(count(&sent, op::EXISTS), 0, "step {i}: no check of the path's levels: {sent:?}");
        assert_eq!(count(&sent, op::GET_DATA), 0, "step {i}: the node's czxid is not read: {sent:?}");
        let total: u64 = sent.iter().map(|(_, n)| n).sum();
        assert_eq!(total, creates + multis + listings, "step {i}: {sent:?}");
        // It holds the lock: its node is the directory's only child, and a second session waits.
        let listed = children(&raw, &path).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].ends_with(&format!("{:010}", guard.sequence())), "{listed:?}");
        // The fencing token is the node's czxid (from the listing behind a `multi`).
        let (_, stat) = raw.get_data(&format!("{path}/{}", listed[0])).await.unwrap();
        assert_eq!(guard.fencing_token().as_i64(), stat.czxid);
        let other = InterProcessMutex::new(client().await, &path).unwrap();
        assert!(other.try_acquire().await.unwrap().is_none(), "a second session was granted beside the first");
        guard.release().await.unwrap();
        let next = other.acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("granted after the release");
        next.release().await.unwrap();
        mutexes.push(mutex);
    }
    for i in 0..steps.len() {
        assert_no_nodes_left_while_open(
            &raw,
            &format!("{parent}/lock-{i}"),
            std::slice::from_ref(&session),
            Duration::from_secs(10),
        )
        .await;
    }
}

/// A session that guesses new lock paths missing sends the `multi` with the directory first. For a
/// directory that exists but whose parent it may not create in, the server answers `NoAuth`, not
/// `NodeExists`: the plain create follows, and the lock is granted as to a session with the other
/// guess (`directory_guess.rs`, *Only what is sent first*).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guessed_multi_refused_for_the_parents_acl_still_acquires() {
    let raw = client().await;
    let parent = parent(&raw, "guess-acl").await;
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let session = zookeeper().await.connector().connect(&proxy.addr()).await.unwrap();
    // Two new lock paths: the session now guesses the next directory missing (while one of its
    // recipes lives).
    let mut mutexes = Vec::new();
    for i in 0..2 {
        let mutex = InterProcessMutex::new(session.clone(), format!("{parent}/new-{i}")).unwrap();
        mutex.acquire().await.unwrap().release().await.unwrap();
        mutexes.push(mutex);
    }
    // A directory anyone may create in, below a parent nobody may create in.
    let closed = format!("{parent}/closed");
    let read_only = vec![zk::Acl::new(zk::Permission::READ | zk::Permission::ADMIN, zk::AuthId::anyone())];
    raw.create(&closed, &[], &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let lock_path = format!("{closed}/lock");
    raw.create(&lock_path, &[], &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    raw.set_acl(&closed, &read_only, None).await.unwrap();
    let mutex = InterProcessMutex::new(session.clone(), &lock_path).unwrap();
    let before = proxy.requests();
    let guard = mutex.acquire_timeout(Duration::from_secs(10)).await.unwrap().expect("granted");
    let sent = sent_between(&before, &proxy.requests());
    assert_eq!(count(&sent, op::MULTI), 1, "the guessed multi, refused: {sent:?}");
    assert_eq!(count(&sent, op::CREATE2), 1, "then the plain create: {sent:?}");
    assert_eq!(children(&raw, &lock_path).await.len(), 1);
    guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&raw, &lock_path, std::slice::from_ref(&session), Duration::from_secs(10)).await;
}

/// Several levels missing: the `multi` guessing only the directory fails without effect, the
/// levels are looked up, and one `multi` creates them all with the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_below_missing_levels_creates_them_with_its_node() {
    let raw = client().await;
    let parent = parent(&raw, "new-levels").await;
    let session = client().await;
    let path = format!("{parent}/a/b/lock");
    let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert_eq!(children(&raw, &path).await.len(), 1);
    let (_, stat) = raw.get_data(&format!("{parent}/a")).await.unwrap();
    assert_eq!(stat.ephemeral_owner, 0, "a level of the lock path is not ephemeral");
    guard.release().await.unwrap();
    assert_no_nodes_left_while_open(&raw, &path, &[session], Duration::from_secs(10)).await;
}

/// Acquirers on four sessions race to create one new lock path, round after round: one `multi`
/// creates the directory, the others find it there and queue plainly — and are granted only in
/// turn. Would a node created after the directory be taken for its first child, two would hold
/// the lock at once here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquirers_racing_on_a_new_lock_path_exclude_each_other() {
    let raw = client().await;
    let parent = parent(&raw, "new-race").await;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(client().await);
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    for round in 0..25 {
        let path = format!("{parent}/lock-{round}");
        let start = Arc::new(tokio::sync::Barrier::new(sessions.len()));
        let mut tasks = Vec::new();
        for session in &sessions {
            let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
            let (start, holders, violations) = (start.clone(), holders.clone(), violations.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let guard = mutex.acquire().await.unwrap();
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }));
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(30), task).await.expect("every racer granted in turn").unwrap();
        }
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders of a new lock path at once");
    for round in 0..25 {
        assert_no_nodes_left_while_open(&raw, &format!("{parent}/lock-{round}"), &sessions, Duration::from_secs(10))
            .await;
    }
}
