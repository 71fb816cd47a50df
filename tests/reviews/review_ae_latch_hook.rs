//! Review AE (`a802210`: a started `LeaderLatch` keeps no task while it leads; the leadership's
//! loss is told to the latch by a hook on the hold's feed, which spawns the task that queues
//! again). Each test attacks one way a loss reaches the hook:
//! - its node deleted by another session while nobody reads the latch's state (the own-node watch
//!   started by the session alone): it queues again once per loss, one node at a time;
//! - its runtime frozen past the loss deadline, the loss found by a `Debug` of the latch on a
//!   thread outside any runtime (the hook runs there, under the latch's state lock): no deadlock,
//!   and the latch queues again once its runtime runs;
//! - the session monitor stopped with its runtime (another one than the latch's): the latch is
//!   told `MonitorStopped` and leads again;
//! - its lease run out, with `close` swept across the expiry: `close` leaves nothing, nothing
//!   appears after it, and the subscriber's story is consistent.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{InterProcessMutex, LatchEvent, LatchEvents, LeaderLatch, LossReason};

async fn next(events: &mut LatchEvents, what: &str) -> LatchEvent {
    match tokio::time::timeout(Duration::from_secs(20), events.next()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("{what}: the stream ended"),
        Err(_) => panic!("{what}: no event within 20 s"),
    }
}

async fn drain(events: &mut LatchEvents, what: &str) -> Vec<LatchEvent> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
            Ok(Some(event)) => seen.push(event),
            Ok(None) => return seen,
            Err(_) => panic!("{what}: the stream did not end: {seen:?}"),
        }
    }
}

fn sequence(name: &str) -> i64 {
    name[name.len() - 10..].parse().expect("a sequence suffix")
}

fn spin(delay: Duration) {
    let started = Instant::now();
    while started.elapsed() < delay {
        std::hint::spin_loop();
    }
}

/// Alone in the election, nobody reading its state (no `has_leadership`, `await_leadership` or
/// loss signal: only the subscription), the latch's node is deleted by another session right
/// after every grant. Each deletion must be heard (the own-node watch, started by the session
/// without a reader) and answered by exactly one new node: the directory never lists two nodes,
/// and consecutive nodes' sequence numbers differ by exactly 1 (a delete does not move the
/// directory's counter; a second create, even one deleted at once, would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deletion_of_the_leaders_node_requeues_it_exactly_once() {
    let observer = client().await;
    let session = client().await;
    let path = unique_path("rae-node-deleted");
    // A child that is no latch's keeps the directory (else a container) from being deleted by
    // the server whenever it is empty, which would restart its sequence counter.
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let keep = format!("{path}/keep");
    match observer.create("/zkr-tests", &[], &persistent).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {},
        Err(err) => panic!("create /zkr-tests: {err}"),
    }
    observer.create(&path, &[], &persistent).await.unwrap();
    observer.create(&keep, &[], &persistent).await.unwrap();
    let latch = LeaderLatch::builder(session.clone(), &path).id("ae").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let watching = Arc::new(AtomicBool::new(true));
    let max_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = tokio::spawn({
        let (observer, path, watching, max_seen) = (observer.clone(), path.clone(), watching.clone(), max_seen.clone());
        async move {
            while watching.load(Ordering::SeqCst) {
                let n = queued_nodes(&observer, &path, "-latch-").await.len();
                max_seen.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut previous: Option<String> = None;
    for term in 0..12u32 {
        let LatchEvent::Elected { lock_path, .. } = next(&mut events, &format!("term {term}: elected")).await else {
            panic!("term {term}: expected Elected")
        };
        let name = lock_path.rsplit('/').next().unwrap().to_owned();
        if let Some(previous) = &previous {
            assert_eq!(
                sequence(&name) - sequence(previous),
                1,
                "term {term}: {previous} then {name}: more than one create per loss"
            );
        }
        assert_eq!(
            queued_nodes(&observer, &path, "-latch-").await,
            std::slice::from_ref(&name),
            "term {term}: one node, ours"
        );
        observer.delete(&lock_path, None).await.unwrap();
        let event = next(&mut events, &format!("term {term}: told")).await;
        assert!(matches!(event, LatchEvent::NotLeader { reason: LossReason::NodeDeleted }), "term {term}: {event:?}");
        previous = Some(name);
    }
    watching.store(false, Ordering::SeqCst);
    watcher.await.unwrap();
    assert!(max_seen.load(Ordering::SeqCst) <= 1, "two nodes of one latch listed at once");
    latch.close().await.unwrap();
    assert!(queued_nodes(&observer, &path, "-latch-").await.is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(queued_nodes(&observer, &path, "-latch-").await.is_empty(), "a node appeared after close");
    observer.delete(&keep, None).await.unwrap();
    observer.delete(&path, None).await.unwrap();
}

/// The latch (and the session monitor, which its first acquire started) run on a current-thread
/// runtime whose thread is then blocked past the loss deadline; the session itself stays alive
/// (the client was connected on the test's runtime). A plain thread, outside any runtime, formats
/// the latch with `Debug` — which reads `has_leadership` under the latch's state lock — until it
/// reads the leadership lost: the loss is told there, and the hook runs on that thread under that
/// lock. It must return at once (no deadlock), and once the frozen runtime runs again the latch
/// must be told `NotLeader(SessionDeadlinePassed)` and lead again with a new node, alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_found_by_a_debug_outside_any_runtime_requeues_the_latch_once_its_runtime_runs() {
    let observer = client().await;
    let session = client().await;
    let path = unique_path("rae-frozen");
    let (latch_tx, latch_rx) = std::sync::mpsc::channel::<(LeaderLatch, LatchEvents)>();
    let (freeze_tx, freeze_rx) = std::sync::mpsc::channel::<Duration>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let side = std::thread::spawn({
        let (session, path) = (session.clone(), path.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let latch = LeaderLatch::builder(session, &path).id("frozen").build().unwrap();
                let events = latch.subscribe();
                latch.start().unwrap();
                drop(latch.await_leadership().await.unwrap());
                latch_tx.send((latch.clone(), events)).unwrap();
                let freeze = freeze_rx.recv().unwrap();
                // Everything on this runtime stops: the latch, the monitor, the own-node watches.
                std::thread::sleep(freeze);
                let _ = stop_rx.await;
                latch.close().await.unwrap();
            });
        }
    });
    let (latch, mut events) = tokio::task::spawn_blocking(move || latch_rx.recv().unwrap()).await.unwrap();
    let LatchEvent::Elected { lock_path: first, .. } = next(&mut events, "first term").await else { panic!() };
    let t = session.session_timeout();
    freeze_tx.send(t * 2).unwrap();
    let frozen_at = Instant::now();
    // Outside any runtime: format until the leadership reads lost (the deadline passes within T).
    let reader = std::thread::spawn({
        let latch = latch.clone();
        move || loop {
            let started = Instant::now();
            let text = format!("{latch:?}");
            assert!(started.elapsed() < Duration::from_secs(1), "Debug took {:?}", started.elapsed());
            if text.contains("has_leadership: false") {
                return Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let told = tokio::time::timeout(t * 3, tokio::task::spawn_blocking(move || reader.join()))
        .await
        .expect("the reader deadlocked (or never read the loss)")
        .unwrap()
        .expect("the reader panicked");
    assert!(told < frozen_at + t * 2, "read the loss only after the runtime ran again");
    // The runtime runs again after `2 T`: the latch is told, queues again and leads again.
    let event = next(&mut events, "told after the freeze").await;
    assert!(matches!(event, LatchEvent::NotLeader { reason: LossReason::SessionDeadlinePassed }), "{event:?}");
    let LatchEvent::Elected { lock_path: second, .. } = next(&mut events, "second term").await else {
        panic!("expected Elected")
    };
    assert_ne!(first, second);
    eventually(Duration::from_secs(10), "only the new node left", || async {
        children(&observer, &path).await == [second.rsplit('/').next().unwrap().to_owned()]
    })
    .await;
    assert!(latch.has_leadership());
    stop_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || side.join()).await.unwrap().expect("the side thread panicked");
    assert!(children(&observer, &path).await.is_empty());
    drop(latch);
}

/// The session monitor runs on another runtime than the latch (a mutex's acquire started it
/// there), and that runtime is shut down while the latch leads: the hold is told
/// `Lost(MonitorStopped)` from the shutdown, on that runtime's thread. The latch (on the test's
/// runtime) is told `NotLeader(MonitorStopped)`, queues again — restarting the monitor here — and
/// leads again, alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_stopped_with_its_runtime_requeues_a_latch_on_another_runtime() {
    let observer = client().await;
    let session = client().await;
    let path = unique_path("rae-monitor-stopped");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (shut_tx, shut_rx) = std::sync::mpsc::channel::<()>();
    let side = std::thread::spawn({
        let (session, mutex_path) = (session.clone(), unique_path("rae-monitor-first"));
        move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            runtime.block_on(async move {
                // The session's first acquire: its monitor runs on this runtime.
                let mutex = InterProcessMutex::new(session, &mutex_path).unwrap();
                mutex.acquire().await.unwrap().release().await.unwrap();
            });
            ready_tx.send(()).unwrap();
            shut_rx.recv().unwrap();
            drop(runtime);
        }
    });
    tokio::task::spawn_blocking(move || ready_rx.recv().unwrap()).await.unwrap();
    let latch = LeaderLatch::builder(session.clone(), &path).id("ae").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let LatchEvent::Elected { lock_path: first, .. } = next(&mut events, "first term").await else { panic!() };
    shut_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || side.join()).await.unwrap().expect("the side runtime's shutdown panicked");
    let event = next(&mut events, "told").await;
    assert!(matches!(event, LatchEvent::NotLeader { reason: LossReason::MonitorStopped }), "{event:?}");
    let LatchEvent::Elected { lock_path: second, .. } = next(&mut events, "second term").await else {
        panic!("expected Elected")
    };
    assert_ne!(first, second);
    eventually(Duration::from_secs(10), "only the new node left", || async {
        children(&observer, &path).await == [second.rsplit('/').next().unwrap().to_owned()]
    })
    .await;
    assert!(latch.has_leadership());
    latch.close().await.unwrap();
    assert!(children(&observer, &path).await.is_empty());
}

/// A leased latch (300 ms): `close` (even rounds) or the drop of its last clone (odd rounds) at
/// moments swept across the first lease's end — before it, as the lease timer tells the hook, as
/// the re-queue runs, after the second grant. `close` returns `Ok` with no node of the latch left;
/// no node appears afterwards; the subscriber's story is `Elected`, then `NotLeader(LeaseExpired)`
/// and maybe one more `Elected`, ended by `NotLeader(LatchClosed)` only after an `Elected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_or_drop_across_a_lease_expiry_leaves_nothing() {
    let observer = client().await;
    let session = client().await;
    let lease = Duration::from_millis(300);
    for round in 0..30u32 {
        let path = unique_path("rae-lease-close");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).lease(lease).build().unwrap();
        let mut events = latch.subscribe();
        latch.start().unwrap();
        let LatchEvent::Elected { .. } = next(&mut events, &format!("round {round}")).await else { panic!() };
        // 250 .. ~400 ms after the grant was told.
        tokio::time::sleep(Duration::from_millis(250)).await;
        spin(Duration::from_micros(u64::from(round % 15) * 10_000));
        if round % 2 == 0 {
            tokio::time::timeout(Duration::from_secs(20), latch.close())
                .await
                .unwrap_or_else(|_| panic!("round {round}: close did not return"))
                .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
            let left = children(&observer, &path).await;
            assert!(left.is_empty(), "round {round}: close returned Ok with {left:?} left");
        } else {
            drop(latch);
            eventually(Duration::from_secs(5), "a dropped latch leaves", || async {
                children(&observer, &path).await.is_empty()
            })
            .await;
        }
        let seen = drain(&mut events, &format!("round {round}")).await;
        let story: Vec<&str> = seen
            .iter()
            .map(|event| match event {
                LatchEvent::Elected { .. } => "E",
                LatchEvent::NotLeader { reason: LossReason::LeaseExpired } => "L",
                LatchEvent::NotLeader { reason: LossReason::LatchClosed } => "C",
                other => panic!("round {round}: {other:?}"),
            })
            .collect();
        // After the first `Elected` (taken above): lease-ended terms, each maybe followed by a
        // new one, and the close of a leading latch only.
        let ok = matches!(
            story.as_slice(),
            [] | ["C"] | ["L"] | ["L", "E", "C"] | ["L", "E", "L"] | ["L", "E", "L", "E", "C"]
        );
        assert!(ok, "round {round}: story after the first Elected: {story:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(children(&observer, &path).await.is_empty(), "round {round}: a node appeared after the latch left");
        assert!(!session.state().is_terminated());
    }
}

/// Under the default policy a cut connection costs the leadership (`ConnectionSuspended`): the
/// hook is told by the session monitor, and the latch queues again on the same session once the
/// connection is back — once per loss. After each loss the directory must settle on exactly one
/// node of the latch (the old one deleted, one new one), never list three, and a second session's
/// observer must see the latch leading again with a new node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cut_connection_requeues_the_latch_once() {
    let zk = zookeeper().await;
    let observer = client().await;
    let proxy = zk_testcontainers::FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let session =
        zk.connector().with_session_timeout(Duration::from_secs(20)).connect(&proxy.addr()).await.expect("connect");
    let path = unique_path("rae-cut");
    let latch = LeaderLatch::builder(session.clone(), &path).id("ae").build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    let watching = Arc::new(AtomicBool::new(true));
    let max_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = tokio::spawn({
        let (observer, path, watching, max_seen) = (observer.clone(), path.clone(), watching.clone(), max_seen.clone());
        async move {
            while watching.load(Ordering::SeqCst) {
                let n = queued_nodes(&observer, &path, "-latch-").await.len();
                max_seen.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let LatchEvent::Elected { lock_path: mut current, .. } = next(&mut events, "first term").await else { panic!() };
    for cut in 0..4u32 {
        proxy.cut();
        let event = next(&mut events, &format!("cut {cut}: told")).await;
        assert!(
            matches!(event, LatchEvent::NotLeader { reason: LossReason::ConnectionSuspended }),
            "cut {cut}: {event:?}"
        );
        let LatchEvent::Elected { lock_path, .. } = next(&mut events, &format!("cut {cut}: elected again")).await
        else {
            panic!("cut {cut}: expected Elected")
        };
        assert_ne!(lock_path, current, "cut {cut}");
        let name = lock_path.rsplit('/').next().unwrap().to_owned();
        eventually(Duration::from_secs(10), "the new node alone", || async {
            queued_nodes(&observer, &path, "-latch-").await == [name.clone()]
        })
        .await;
        current = lock_path;
    }
    watching.store(false, Ordering::SeqCst);
    watcher.await.unwrap();
    assert_eq!(session.session_id(), session.session_id());
    assert!(!session.state().is_terminated());
    let max_seen = max_seen.load(Ordering::SeqCst);
    assert!(max_seen <= 1, "{max_seen} nodes of one latch listed at once");
    latch.close().await.unwrap();
    assert!(queued_nodes(&observer, &path, "-latch-").await.is_empty());
}

/// A latch whose leases are so short (100 µs) that each leadership is lost around its handover:
/// sometimes before `hand_over` sets the hook (the handover queues again itself: about a third to
/// a half of the terms, counted with a scratch `eprintln!`), sometimes just after (the lease
/// timer calls the hook, maybe while the handover still runs). Over many terms
/// the story alternates `Elected`, `NotLeader(LeaseExpired)` with a new node each term, never two
/// nodes of the latch listed at once (the hook is called once the lost node's delete is sent:
/// `Session::relinquish`; before, 2 of 25 runs saw two), a newer node each term; `close` then
/// leaves nothing, and nothing appears after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lost_around_every_handover_requeue_once_per_term() {
    let observer = client().await;
    let session = client().await;
    let path = unique_path("rae-short-lease");
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    match observer.create("/zkr-tests", &[], &persistent).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {},
        Err(err) => panic!("create /zkr-tests: {err}"),
    }
    observer.create(&path, &[], &persistent).await.unwrap();
    let keep = format!("{path}/keep");
    observer.create(&keep, &[], &persistent).await.unwrap();
    let latch =
        LeaderLatch::builder(session.clone(), &path).id("short").lease(Duration::from_micros(100)).build().unwrap();
    let mut events = latch.subscribe();
    let watching = Arc::new(AtomicBool::new(true));
    let max_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = tokio::spawn({
        let (observer, path, watching, max_seen) = (observer.clone(), path.clone(), watching.clone(), max_seen.clone());
        async move {
            while watching.load(Ordering::SeqCst) {
                let n = queued_nodes(&observer, &path, "-latch-").await.len();
                max_seen.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    latch.start().unwrap();
    let mut paths: Vec<String> = Vec::new();
    for term in 0..60u32 {
        let event = next(&mut events, &format!("term {term}: elected")).await;
        if let LatchEvent::Stopped { error: zk_recipes::Error::LockLost { reason: LossReason::LeaseExpired, .. } } =
            &event
        {
            // The lease ran out inside the acquire, before it returned (`LockGuard::extend` at the
            // grant failed): the latch stops. Older than `a802210`; see
            // `a_lease_that_runs_out_inside_the_acquire_stops_the_latch`.
            eprintln!("term {term}: stopped by a lease run out inside the acquire");
            break;
        }
        let LatchEvent::Elected { lock_path, .. } = event else { panic!("term {term}: expected Elected: {event:?}") };
        let event = next(&mut events, &format!("term {term}: lost")).await;
        assert!(matches!(event, LatchEvent::NotLeader { reason: LossReason::LeaseExpired }), "term {term}: {event:?}");
        paths.push(lock_path);
    }
    latch.close().await.unwrap();
    watching.store(false, Ordering::SeqCst);
    watcher.await.unwrap();
    let sequences: Vec<i64> = paths.iter().map(|path| sequence(path)).collect();
    // Each term's node is newer than the last. Not always the next one: an acquire whose lease ran
    // out inside it (before it returned) is retried (`retry_may_fix`, this review's defect 1), and
    // its node makes no term. Never two nodes at once: asserted below.
    assert!(sequences.windows(2).all(|pair| pair[1] > pair[0]), "a term's node older than the last: {sequences:?}");
    let max_seen = max_seen.load(Ordering::SeqCst);
    assert!(max_seen <= 1, "{max_seen} nodes of one latch listed at once");
    assert!(queued_nodes(&observer, &path, "-latch-").await.is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(queued_nodes(&observer, &path, "-latch-").await.is_empty(), "a node appeared after close");
    observer.delete(&keep, None).await.unwrap();
    observer.delete(&path, None).await.unwrap();
}

/// A started latch whose lease runs out before its acquire returns — here a zero lease, which
/// has run out at the grant; in general any lease shorter than a preemption between the grant
/// and `LockGuard::extend` in `InterProcessMutex::queue` (`src/recipes/mutex.rs`) — is a lost
/// leadership like any other: the latch queues again. (It failed the acquire with
/// `LockLost(LeaseExpired)`, which `retry_may_fix` took for an error no retry can fix: the latch
/// *stopped* for good, which its docs promise only for an ended session, a closed client or a
/// refused node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_inside_the_acquire_does_not_stop_the_latch() {
    let session = client().await;
    let path = unique_path("rae-zero-lease");
    let latch = LeaderLatch::builder(session.clone(), &path).id("zero").lease(Duration::ZERO).build().unwrap();
    let mut events = latch.subscribe();
    latch.start().unwrap();
    // Each term is lost at its grant: the latch queues again (after the retry pause) for as long
    // as it is started, and never stops.
    let watched = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match events.next().await {
                Some(LatchEvent::Stopped { error }) => return error,
                Some(_) => {},
                None => panic!("the stream ended"),
            }
        }
    })
    .await;
    assert!(watched.is_err(), "a lease run out at the grant stopped the started latch: {watched:?}");
    latch.close().await.unwrap();
    assert_no_nodes_left_while_open(&client().await, &path, &[session], Duration::from_secs(5)).await;
}
