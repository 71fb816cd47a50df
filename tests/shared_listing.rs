//! Acquires of one lock made at once in one process share their listings (`engine/listing.rs`,
//! `Setup`): a burst of N acquires on N sessions takes a few listings, not N listings of about N
//! names each — and still drains in order with one holder at a time, and a stalled session's
//! listing holds nobody else up for long.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// Serialises the tests of this binary (they read server-wide watch counts).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The README's bound (Performance): a burst of acquires of one lock in one process takes at most
/// this many listings for every 8 acquires (a quarter of what one listing each would read).
const LISTINGS_PER_8_ACQUIRES: u64 = 2;

fn listings(requests: &BTreeMap<i32, u64>) -> u64 {
    requests.get(&op::GET_CHILDREN2).copied().unwrap_or(0) + requests.get(&op::GET_CHILDREN).copied().unwrap_or(0)
}

/// A session through `proxy`, with a long timeout (a stall must not end it).
async fn via(proxy: &FaultProxy) -> zk::Client {
    let connector = zookeeper().await.connector().with_session_timeout(Duration::from_secs(30));
    connector.connect(&proxy.addr()).await.expect("connect through the proxy")
}

/// Waits until the proxy's count of listings has not moved for a while: every waiter has its
/// listing (the burst's setup is over).
async fn listings_settled(proxy: &FaultProxy) -> u64 {
    let (mut last, mut stable) = (u64::MAX, 0);
    let start = Instant::now();
    while stable < 4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = listings(&proxy.requests());
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
        assert!(start.elapsed() < Duration::from_secs(60), "listings still being sent after 60 s");
    }
    last
}

/// 1 holder and 32 waiters, each on its own session (as in the peer benchmark's W4), all queued
/// at once: the waiters take at most the published number of listings between them (one each
/// before), and the queue then drains in order, one holder at a time, leaving no node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_many_sessions_shares_a_few_listings() {
    burst_on_many_sessions(false).await;
}

/// The same with every session guessing new lock paths' directories missing (taught by two new
/// paths each: `src/engine/directory_guess.rs`): their guessed `multi`s, refused, send no
/// listing of their own (review AC: 35 listings, each of the whole queue, where the fresh sessions
/// took 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_many_sessions_guessing_new_paths_shares_a_few_listings_too() {
    burst_on_many_sessions(true).await;
}

async fn burst_on_many_sessions(guessing: bool) {
    init_tracing();
    let _alone = SERIAL.lock().await;
    let waiters = 32;
    let path = unique_path("shared-listing");
    let observer = client().await;
    let held = InterProcessMutex::new(client().await, &path).unwrap().acquire().await.unwrap();
    // The waiters' sessions go through a passing proxy that counts their requests by type.
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let mut sessions = Vec::new();
    // Kept: what a session learned lives as long as one of its recipes does.
    let mut teachers = Vec::new();
    for _ in 0..waiters {
        let session = via(&proxy).await;
        for i in 0..if guessing { 2 } else { 0 } {
            let teacher = InterProcessMutex::new(session.clone(), unique_path(&format!("teach-{i}"))).unwrap();
            teacher.acquire().await.unwrap().release().await.unwrap();
            teachers.push(teacher);
        }
        sessions.push(session);
    }
    let before = listings(&proxy.requests());
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for session in &sessions {
        let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
        let (holders, violations, grants) = (holders.clone(), violations.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.acquire().await.expect("waiter acquires");
            if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            grants.lock().unwrap().push(guard.sequence());
            tokio::time::sleep(Duration::from_millis(2)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        }));
    }
    eventually(Duration::from_secs(60), "every waiter queued", || async {
        children(&observer, &path).await.len() == waiters + 1
    })
    .await;
    let taken = listings_settled(&proxy).await - before;
    eprintln!("{waiters} acquires at once on {waiters} sessions (guessing {guessing}) took {taken} listings");
    let bound = (waiters as u64).div_ceil(8) * LISTINGS_PER_8_ACQUIRES;
    assert!(taken <= bound, "{waiters} acquires at once took {taken} listings (published: at most {bound})");

    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("the queue drains").unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), waiters);
    assert!(grants.windows(2).all(|pair| pair[0] < pair[1]), "grants out of queue order: {grants:?}");
    assert_no_nodes_left_while_open(&observer, &path, &sessions, Duration::from_secs(10)).await;
}

/// A session whose listing is held up on its way (15 s), while it is the listing the burst's other
/// acquires may join, holds them up for at most the published patience (twice an acquire's create
/// round trip, at most 1 s, for each of the two listings of other sessions it may join): they have
/// their listings and wait with their watches set long before that listing is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_held_up_on_another_session_does_not_hold_up_the_others() {
    init_tracing();
    let _alone = SERIAL.lock().await;
    let waiters = 8;
    let path = unique_path("shared-listing-stall");
    let observer = client().await;
    let held = InterProcessMutex::new(client().await, &path).unwrap().acquire().await.unwrap();
    // An acquire that stays setting up (its connection stalled): the next acquire of the lock is
    // not the only one, so it shares its listing.
    let stalled_proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let stalled_session = via(&stalled_proxy).await;
    let stalled = InterProcessMutex::new(stalled_session.clone(), &path).unwrap();
    stalled_proxy.stall();
    let stalled_acquire = tokio::spawn(async move { stalled.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Its create goes through; the listing it then sends for the others is held up for 15 s.
    let slow_proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let slow_session = via(&slow_proxy).await;
    let slow = InterProcessMutex::new(slow_session.clone(), &path).unwrap();
    slow_proxy.delay_requests(&[op::GET_CHILDREN, op::GET_CHILDREN2], Duration::from_secs(15));
    let slow_acquire = tokio::spawn(async move { slow.acquire().await });
    eventually(Duration::from_secs(10), "the slow session's node", || async {
        children(&observer, &path).await.len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listings_sent = listings(&slow_proxy.requests());
    assert_eq!(listings_sent, 1, "the slow session sent its listing (the others' to join)");

    let watches_before = total_watches().await;
    let mut sessions = Vec::new();
    let mut tasks = Vec::new();
    let start = Instant::now();
    for _ in 0..waiters {
        let session = client().await;
        let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
        sessions.push(session);
        tasks.push(tokio::spawn(async move { mutex.acquire().await.expect("waiter acquires").release().await }));
    }
    // A waiter that has its listing watches its predecessor; the two whose predecessors are among
    // the first three nodes (the slow session's and the first waiter's: `NEAR` in
    // `engine/view.rs`) watch their own nodes too.
    let near_the_head = 2;
    eventually(Duration::from_secs(30), "every waiter set its watches", || async {
        total_watches().await >= watches_before + waiters + near_the_head
    })
    .await;
    // Patience 1 s, twice, plus setting up 8 waiters on a loaded machine (2 s).
    assert_within(start.elapsed(), Duration::from_secs(2) + Duration::from_secs(2), "the others' setup");
    assert_eq!(listings(&slow_proxy.requests()), 1);
    assert!(!slow_acquire.is_finished() && !stalled_acquire.is_finished(), "the test proves nothing");
    // Heal the slow link (its session would otherwise time out each request for good), let
    // the holder go: the slow session is granted first, the others after it in turn.
    slow_proxy.delay_requests(&[], Duration::ZERO);
    held.release().await.unwrap();
    let slow_guard = tokio::time::timeout(Duration::from_secs(60), slow_acquire).await.expect("granted").unwrap();
    slow_guard.unwrap().release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("granted").unwrap().unwrap();
    }
    stalled_acquire.abort();
    stalled_proxy.pass();
    let _ = stalled_acquire.await;
    let mut open = sessions;
    open.extend([stalled_session, slow_session]);
    assert_no_nodes_left_while_open(&observer, &path, &open, Duration::from_secs(20)).await;
}
