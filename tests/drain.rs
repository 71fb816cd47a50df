//! Many waiters on one lock: the queue drains in order, without two holders, without listing the
//! directory on every wake-up (requests per handoff stay constant), with bounded memory.
//! Each drain prints what it measured (run with `--nocapture`): enqueue and drain time, requests
//! by type, heap bytes per queued waiter.

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use common::*;
use zk_recipes::{InterProcessMutex, LockState};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

/// Requests by op name sent between two snapshots of the proxy's counters, pings left out.
fn requests_during(before: &BTreeMap<i32, u64>, after: &BTreeMap<i32, u64>) -> BTreeMap<&'static str, u64> {
    let name = |op_code| match op_code {
        op::CREATE | op::CREATE2 => "create",
        op::DELETE => "delete",
        op::EXISTS => "exists",
        op::GET_DATA => "getData",
        op::GET_CHILDREN | op::GET_CHILDREN2 => "getChildren",
        op::REMOVE_WATCHES => "removeWatches",
        op::MULTI => "multi",
        op::SYNC => "sync",
        _ => "other",
    };
    let mut by_name = BTreeMap::new();
    for (&op_code, &count) in after.iter().filter(|(&op_code, _)| op_code != op::PING) {
        let delta = count - before.get(&op_code).copied().unwrap_or(0);
        if delta > 0 {
            *by_name.entry(name(op_code)).or_default() += delta;
        }
    }
    by_name
}

/// Serialises the tests of this binary (they measure process-wide numbers).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Drain {
    enqueue: Duration,
    drain: Duration,
    requests_per_handoff: f64,
    /// Requests of the drain that read the queue or a node (`getChildren`, `exists`), per handoff.
    reads_per_handoff: f64,
    /// Data watches set while the waiters queued, per waiter.
    enqueue_watches_per_waiter: f64,
    bytes_per_waiter: u64,
}

/// Queues `waiters` tasks behind a holder (spread over `sessions` sessions), then drains them.
async fn drain(name: &str, waiters: usize, sessions: usize) -> Drain {
    init_tracing();
    // The heap counter is process-wide: measure one drain at a time, alone.
    let _alone = SERIAL.lock().await;
    let path = unique_path(name);
    // Long sessions: enqueueing thousands of waiters keeps the server busy for a while.
    let patient = || async { zookeeper().await.client_with_timeout(Duration::from_secs(30)).await.unwrap() };
    let observer = patient().await;
    let holder = InterProcessMutex::new(patient().await, &path).unwrap();
    let held = holder.acquire().await.unwrap();
    // The waiters' sessions go through a (passing) proxy that counts their requests by type.
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let mut mutexes = Vec::new();
    for _ in 0..sessions {
        let connector = zookeeper().await.connector().with_session_timeout(Duration::from_secs(30));
        let client = connector.connect(&proxy.addr()).await.unwrap();
        mutexes.push(InterProcessMutex::new(client, &path).unwrap());
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::with_capacity(waiters)));
    let heap_before = counting_alloc::live_heap_bytes();
    let classes_before = counting_alloc::live_by_size();
    let start = Instant::now();
    let requests_at_start = proxy.requests();
    let mut tasks = Vec::with_capacity(waiters);
    for i in 0..waiters {
        let (mutex, holders, violations, grants) =
            (mutexes[i % sessions].clone(), holders.clone(), violations.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.acquire().await.expect("waiter acquires");
            if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            grants.lock().unwrap().push(guard.sequence());
            holders.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }));
    }
    let mut queued = 0;
    while queued < waiters + 1 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A busy server may stall a read for a moment; only the count matters here.
        if let Ok((_, stat)) = observer.get_data(&path).await {
            queued = stat.num_children as usize;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "only {queued} of {} queued", waiters + 1);
    }
    // Queued is not yet waiting: each waiter still has to read its listing and set its watch on
    // its predecessor (and the first few, on their own nodes). Wait until the watch count settles.
    let (mut last, mut stable) = (0, 0);
    while stable < 3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = total_watches().await;
        stable = if now == last && now >= waiters { stable + 1 } else { 0 };
        last = now;
        assert!(start.elapsed() < Duration::from_secs(600), "waiters did not set their watches");
    }
    let enqueue = start.elapsed();
    let bytes_per_waiter = counting_alloc::live_heap_bytes().saturating_sub(heap_before) / waiters as u64;
    let kept: Vec<String> = classes_before
        .iter()
        .zip(counting_alloc::live_by_size())
        .filter(|((_, before), (_, now))| now - before >= waiters as i64 / 2)
        .map(|((size, before), (_, now))| format!("{}x<={size}", (now - before) as f64 / waiters as f64))
        .collect();
    eprintln!("{name}: live allocations per queued waiter, by size class: {kept:?}");

    let requests_before = proxy.requests();
    let enqueue_requests = requests_during(&requests_at_start, &requests_before);
    let drain_start = Instant::now();
    assert_eq!(held.state(), LockState::Held);
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(600), task).await.expect("queue drains").unwrap();
    }
    let drain = drain_start.elapsed();
    let requests = requests_during(&requests_before, &proxy.requests());
    // The session monitors' heartbeats (one `sync` per session every 0.22 T, T = 30 s here) cost
    // per session and second, not per handoff: counted separately (README, Performance).
    let total: u64 = requests.iter().filter(|(name, _)| **name != "sync").map(|(_, count)| count).sum();

    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), waiters);
    assert!(grants.windows(2).all(|pair| pair[0] < pair[1]), "grants out of queue order");
    assert_no_nodes_left(&observer, &path).await;
    let reads = ["getChildren", "exists"].iter().map(|name| requests.get(name).copied().unwrap_or(0)).sum::<u64>();
    let result = Drain {
        enqueue,
        drain,
        requests_per_handoff: total as f64 / waiters as f64,
        reads_per_handoff: reads as f64 / waiters as f64,
        enqueue_watches_per_waiter: enqueue_requests.get("getData").copied().unwrap_or(0) as f64 / waiters as f64,
        bytes_per_waiter,
    };
    eprintln!(
        "{name}: {waiters} waiters over {sessions} sessions: enqueued in {:?}, drained in {:?} ({:.0} handoffs/s), {:.2} requests per handoff {requests:?}, {} heap bytes per queued waiter; enqueue sent {enqueue_requests:?}",
        result.enqueue,
        result.drain,
        waiters as f64 / result.drain.as_secs_f64(),
        result.requests_per_handoff,
        result.bytes_per_waiter
    );
    result
}

/// The published cost of a handoff (README Performance, BENCHMARKS.md): 2.00 requests, the
/// releasing holder's delete and the own-node watch of the waiter its deletion brings near the
/// head (`engine/view.rs`, *Near turns*: set one handoff ahead, where it used to be set while
/// queueing). Two decimals, as published.
const REQUESTS_PER_HANDOFF: f64 = 2.005;
/// Reads of the queue or of a node in a handoff: none; at most 0.5 % of the handoffs may cost
/// one (the rare `exists` check of a waiter granted before its own-node watch was confirmed).
const READS_PER_HANDOFF: f64 = 0.005;
/// Watches set while queueing: one per waiter, on its predecessor; a waiter's own node is watched
/// only once its turn is near, so only the first few waiters watch theirs then (0.5 % allowed).
const ENQUEUE_WATCHES_PER_WAITER: f64 = 1.005;

/// What every drain asserts about its requests.
fn assert_requests(result: &Drain) {
    assert!(
        result.requests_per_handoff <= REQUESTS_PER_HANDOFF,
        "{:.3} requests per handoff (published: 2.00)",
        result.requests_per_handoff
    );
    assert!(
        result.reads_per_handoff <= READS_PER_HANDOFF,
        "{:.3} reads per handoff (published: none): waiters list the directory or check their nodes on wake-up",
        result.reads_per_handoff
    );
    assert!(
        result.enqueue_watches_per_waiter <= ENQUEUE_WATCHES_PER_WAITER,
        "{:.3} watches set per queued waiter: waiters deep in the queue watch their own nodes",
        result.enqueue_watches_per_waiter
    );
}

/// A woken waiter decides from the process's view of the directory instead of listing it again:
/// a handoff reads nothing, and costs the release's delete and one waiter's own-node watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_waiters_drain_in_order_without_relisting() {
    let result = drain("drain-1k", 1000, 4).await;
    assert_requests(&result);
}

/// The README's heap per queued waiter (Performance; BENCHMARKS.md, Requests), debug build: 3,091 B
/// (1,000 waiters) and 3,177–3,273 B (10,000) measured on 2026-11-28, thirteenth session (4,957–5,197 B
/// before deep waiters stopped watching their own nodes; issue 24 asks 3.1).
const PUBLISHED_BYTES_PER_WAITER: u64 = 3_300;
/// The README's drain rate, debug build on this project's 2-core machine as it is now: 546–558/s
/// on 2026-11-28 (thirteenth session), quiet, beside 621–766/s for the build before own-node
/// watches moved into the drain (1,350/s was issue 17's, on a faster machine).
const PUBLISHED_HANDOFFS_PER_S: f64 = 550.0;

/// 10,000 waiters drain in order at two requests per handoff and no read; each queued waiter holds at most the
/// published heap (+10 %: the allocator's rounding varies a little between runs), and the drain
/// runs at least at a fifth of the published rate (the README's floor for a loaded or slow
/// machine, a liveness bound: CI runs it beside release builds, at a load of 13, where it drained
/// at 244/s; a drain that relists is caught by the request counts, not by this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_drain_in_order() {
    let waiters = 10_000;
    let result = drain("drain-10k", waiters, 4).await;
    assert_requests(&result);
    assert!(
        result.bytes_per_waiter <= PUBLISHED_BYTES_PER_WAITER * 11 / 10,
        "{} heap bytes per queued waiter (published: {PUBLISHED_BYTES_PER_WAITER} + 10 %)",
        result.bytes_per_waiter
    );
    let rate = waiters as f64 / result.drain.as_secs_f64();
    assert!(
        rate >= PUBLISHED_HANDOFFS_PER_S / 5.0,
        "{rate:.0} handoffs/s (published: about {PUBLISHED_HANDOFFS_PER_S}, at least a fifth) (load: {})",
        load_average()
    );
}

/// Other processes' nodes below us whose deletion this process never saw: a woken waiter must
/// not be granted while one of them is still alive, and finds out about the dead ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_deleted_unseen_are_checked_before_a_grant() {
    let _alone = SERIAL.lock().await;
    let path = unique_path("unseen");
    let raw = client().await;
    raw.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    // Two "foreign" Curator-style nodes queued ahead of us, not watched by anyone in this process.
    let mut foreign = Vec::new();
    for _ in 0..2 {
        foreign.push(foreign_lock_node(&raw, &path, "lock-").await);
    }
    for order in [[1, 0], [0, 1]] {
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        let waiter = tokio::spawn(async move { mutex.acquire().await.unwrap() });
        eventually(Duration::from_secs(10), "queued", || async { children(&raw, &path).await.len() == 3 }).await;
        // Delete the first foreign node: with order [1, 0] that is our immediate predecessor
        // while the holder is still alive — we must keep waiting.
        raw.delete(&foreign[order[0]], None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "granted while a node ahead of us is alive");
        raw.delete(&foreign[order[1]], None).await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
        assert_eq!(children(&raw, &path).await.len(), 1);
        guard.release().await.unwrap();
        // Queue two new foreign nodes for the next round.
        foreign.clear();
        for _ in 0..2 {
            foreign.push(foreign_lock_node(&raw, &path, "lock-").await);
        }
    }
}

/// How near the head a waiter's predecessor is when the waiter sets its own-node watch: among
/// the first `NEAR` nodes (`engine/view.rs`, *Near turns*).
const NEAR: usize = 3;

/// A waiter deep in the queue does not watch its own node (`engine/view.rs`, *Near turns*): it
/// costs a request and memory, and the waiter has no use for it until its turn is near. Its node
/// deleted meanwhile, it must still not be granted with it: it finds out once the nodes ahead of
/// it go, and queues again. A waiter whose predecessor is near the head watches its node at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_waiter_watches_its_node_once_its_turn_is_near_and_is_not_granted_with_it_gone() {
    let _alone = SERIAL.lock().await;
    let path = unique_path("deep");
    let raw = client().await;
    raw.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    // Foreign Curator-style nodes queued ahead of us: this process sees none of their deletions
    // but through its waiter's watch on its predecessor.
    let queue_foreign = |count: usize| {
        let (raw, path) = (raw.clone(), path.clone());
        async move {
            let mut foreign = Vec::new();
            for _ in 0..count {
                foreign.push(foreign_lock_node(&raw, &path, "lock-").await);
            }
            foreign
        }
    };
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();

    // Fourth behind three foreign nodes: its predecessor is third, near the head (`NEAR` in
    // `engine/view.rs`): watched at once.
    let foreign = queue_foreign(NEAR).await;
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "queued", || async { children(&raw, &path).await.len() == NEAR + 1 }).await;
    let ours = format!("{path}/{}", queued_nodes(&raw, &path, "-lock-").await[NEAR]);
    eventually(Duration::from_secs(10), "a waiter near the head watches its own node", || async {
        watchers_of(&ours).await == 1
    })
    .await;
    let mut multi = raw.new_multi_writer();
    for node in &foreign {
        multi.add_delete(node, None).unwrap();
    }
    multi.commit().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    guard.release().await.unwrap();

    // Fifth behind four: its predecessor is fourth, not near: no watch on its own node.
    let foreign = queue_foreign(NEAR + 1).await;
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.acquire().await.unwrap() }
    });
    eventually(Duration::from_secs(10), "queued", || async { children(&raw, &path).await.len() == NEAR + 2 }).await;
    let ours = format!("{path}/{}", queued_nodes(&raw, &path, "-lock-").await[NEAR + 1]);
    eventually(Duration::from_secs(10), "the waiter watches its predecessor", || async {
        watchers_of(&foreign[NEAR]).await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(watchers_of(&ours).await, 0, "a waiter deep in the queue watches its own node");
    // Its node goes unseen by this process, then every node ahead of it at once.
    raw.delete(&ours, None).await.unwrap();
    let mut multi = raw.new_multi_writer();
    for node in &foreign {
        multi.add_delete(node, None).unwrap();
    }
    multi.commit().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted").unwrap();
    assert_ne!(guard.lock_path(), ours, "granted with a deleted node");
    assert!(raw.check_stat(guard.lock_path()).await.unwrap().is_some(), "granted with a node that does not exist");
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
    assert_no_nodes_left(&raw, &path).await;
}

/// A waiter in the middle of the queue gives up: its successor, woken by that deletion, must
/// keep waiting for the holder and the remaining waiter ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_predecessor_does_not_grant() {
    let _alone = SERIAL.lock().await;
    let path = unique_path("abandoned");
    let observer = client().await;
    let holder = InterProcessMutex::new(client().await, &path).unwrap();
    let held = holder.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, patience) in [None, Some(Duration::from_millis(600)), None].into_iter().enumerate() {
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = match patience {
                Some(patience) => match mutex.acquire_timeout(patience).await.unwrap() {
                    Some(guard) => guard,
                    None => return,
                },
                None => mutex.acquire().await.unwrap(),
            };
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
        }));
        eventually(Duration::from_secs(10), "queued", || async { children(&observer, &path).await.len() == i + 2 })
            .await;
    }
    // The middle waiter times out and its node goes; the last one is woken by that deletion and
    // must not be granted: it watches its new predecessor, the first waiter's node, instead. That
    // watch is awaited on the server's watch table (`wchp`), not slept for; only then is the
    // absence of a grant meaningful.
    let middle = tasks.remove(1);
    tokio::time::timeout(Duration::from_secs(10), middle).await.expect("the middle waiter gave up").unwrap();
    eventually(Duration::from_secs(10), "the middle waiter's node is gone", || async {
        children(&observer, &path).await.len() == 3
    })
    .await;
    let first_waiter = holder.participants().await.unwrap()[1].path.clone();
    // Its own session's watch on it, and the last waiter's.
    eventually(Duration::from_secs(10), "the last waiter watches the first waiter's node", || async {
        watchers_of(&first_waiter).await >= 2
    })
    .await;
    assert_eq!(children(&observer, &path).await.len(), 3);
    assert!(order.lock().unwrap().is_empty(), "granted while the holder holds the lock");
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 2]);
    assert_no_nodes_left(&observer, &path).await;
}
