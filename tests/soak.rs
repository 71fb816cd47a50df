//! Soak: 16 sessions on a 3-server ensemble acquire, time out, cancel and release at random while
//! a random fault hits the ensemble every few seconds (leader or follower killed, a follower cut
//! off from its peers, a server isolated or paused, a session expired). At the end the history
//! checker (`common/history.rs`) proves that no two holders believed they held the lock at once,
//! that fencing tokens increased, that the fenced counter is exact, and that no node is left.
//!
//! `ZK_SOAK_SECS` sets the duration (default 60 s; `ZK_SOAK_SECS=600 cargo test --test soak --
//! --nocapture` for the long run). Prints a summary line starting with `soak:`.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::history::History;
use common::*;
use rand::Rng;
use tokio::time::Instant;
use zk_recipes::{Error, InterProcessMutex, LossPolicy};
use zk_testcontainers::{expire_session, Ensemble};
use zookeeper_client as zk;

const SESSIONS: usize = 16;

fn soak_duration() -> Duration {
    let secs = std::env::var("ZK_SOAK_SECS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(60);
    Duration::from_secs(secs)
}

/// Shared by the workers and the fault injector.
struct Soak {
    ensemble: Ensemble,
    path: String,
    counter: String,
    history: History,
    stop: AtomicBool,
    t: Duration,
    max_wait_ms: AtomicU64,
    /// The current client of each worker (for session expiry).
    clients: Mutex<Vec<Option<zk::Client>>>,
    errors: Mutex<BTreeMap<String, usize>>,
}

impl Soak {
    fn error(&self, err: &Error) {
        let kind = format!("{err:?}").split([' ', '{', '(']).next().unwrap_or("?").to_owned();
        *self.errors.lock().unwrap().entry(kind).or_default() += 1;
    }
}

async fn worker(soak: Arc<Soak>, w: usize) {
    let who = format!("session-{w}");
    let policy = if w.is_multiple_of(2) { LossPolicy::Suspended } else { LossPolicy::SessionDeadline };
    let connect = |soak: Arc<Soak>| async move {
        loop {
            match soak.ensemble.client(soak.t).await {
                Ok(client) => return client,
                Err(_) if soak.stop.load(Ordering::SeqCst) => return soak.ensemble.client(soak.t).await.unwrap(),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    };
    let mut client = connect(soak.clone()).await;
    soak.clients.lock().unwrap()[w] = Some(client.clone());
    let mut mutex = InterProcessMutex::builder(client.clone(), &soak.path).loss_policy(policy).build().unwrap();
    while !soak.stop.load(Ordering::SeqCst) {
        let (action, patience, hold_for) = {
            let mut rng = rand::rng();
            // Most holds are short; one in ten lasts long enough (0.5–3 s) for faults to hit it
            // while it holds, so losses are told and checked too.
            let hold_for =
                if rng.random_range(0..10u32) == 0 { rng.random_range(500..3000) } else { rng.random_range(0..150u64) };
            (rng.random_range(0..10u32), Duration::from_millis(rng.random_range(50..3000)), hold_for)
        };
        let started = Instant::now();
        let outcome = match action {
            // try_acquire
            0 => mutex.try_acquire().await,
            // cancelled: the future is dropped after a random time
            1 | 2 => match tokio::time::timeout(patience, mutex.acquire()).await {
                Ok(result) => result.map(Some),
                Err(_) => Ok(None),
            },
            // acquire with a timeout
            _ => mutex.acquire_timeout(patience).await,
        };
        match outcome {
            Ok(Some(guard)) => {
                let waited = started.elapsed().as_millis() as u64;
                soak.max_wait_ms.fetch_max(waited, Ordering::Relaxed);
                let index = soak.history.granted(&who, &guard);
                tokio::select! {
                    reason = guard.lost() => soak.history.lost(index, reason),
                    _ = async {
                        soak.history.fenced_increment(&client, &guard, &soak.counter).await;
                        tokio::time::sleep(Duration::from_millis(hold_for)).await;
                    } => soak.history.releasing(index),
                }
                if hold_for % 2 == 0 {
                    let _ = tokio::time::timeout(soak.t * 2, guard.release()).await;
                } else {
                    drop(guard);
                }
            },
            Ok(None) => {},
            Err(err @ Error::SessionLost { .. }) => {
                soak.error(&err);
                client = connect(soak.clone()).await;
                soak.clients.lock().unwrap()[w] = Some(client.clone());
                mutex = InterProcessMutex::builder(client.clone(), &soak.path).loss_policy(policy).build().unwrap();
            },
            Err(err) => {
                soak.error(&err);
                tokio::time::sleep(Duration::from_millis(100)).await;
            },
        }
    }
}

/// Injects one random fault every few seconds, healing each before the next.
async fn faults(soak: Arc<Soak>, until: Instant) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    let ensemble = &soak.ensemble;
    while Instant::now() + Duration::from_secs(8) < until {
        let (kind, pause, settle, victim) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..6u32),
                Duration::from_millis(rng.random_range(2000..5000)),
                Duration::from_millis(rng.random_range(1000..3000)),
                rng.random_range(0..SESSIONS),
            )
        };
        tokio::time::sleep(settle).await;
        let Ok(leader) = ensemble.leader().await else { continue };
        let follower = (leader + 1) % ensemble.len();
        let name = match kind {
            0 => {
                ensemble.kill(leader).await.unwrap();
                tokio::time::sleep(pause).await;
                ensemble.start_server(leader).await.unwrap();
                "leader killed"
            },
            1 => {
                ensemble.kill(follower).await.unwrap();
                tokio::time::sleep(pause).await;
                ensemble.start_server(follower).await.unwrap();
                "follower killed"
            },
            2 => {
                ensemble.partition_from_peers(follower).await.unwrap();
                tokio::time::sleep(pause).await;
                ensemble.heal(follower).await.unwrap();
                "follower cut off from its peers"
            },
            3 => {
                ensemble.isolate(follower).await.unwrap();
                tokio::time::sleep(pause).await;
                ensemble.heal(follower).await.unwrap();
                "server isolated"
            },
            4 => {
                ensemble.pause(follower).await.unwrap();
                tokio::time::sleep(pause).await;
                ensemble.unpause(follower).await.unwrap();
                "server paused"
            },
            _ => {
                let client = soak.clients.lock().unwrap()[victim].clone();
                if let Some(client) = client {
                    // A close the server acts on at once: the victim's holds end now (see
                    // `History::revoked`).
                    soak.history.revoked(&format!("session-{victim}"));
                    let _ = expire_session(ensemble.server_addr(leader), &client).await;
                }
                "session expired"
            },
        };
        *counts.entry(name).or_default() += 1;
        let _ = ensemble.wait_for_quorum(Duration::from_secs(60)).await;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    init_tracing();
    let duration = soak_duration();
    let t = Duration::from_secs(4);
    let ensemble = ensemble(Ensemble::builder()).await;
    let admin = ensemble.client(t).await.unwrap();
    let path = unique_path("soak");
    let counter = unique_path("soak-counter");
    admin.mkdir(&counter, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    admin.set_data(&counter, b"0", None).await.unwrap();
    drop(admin);
    let soak = Arc::new(Soak {
        ensemble,
        history: History::new(&path),
        path,
        counter,
        stop: AtomicBool::new(false),
        t,
        max_wait_ms: AtomicU64::new(0),
        clients: Mutex::new(vec![None; SESSIONS]),
        errors: Mutex::new(BTreeMap::new()),
    });
    let started = Instant::now();
    let until = started + duration;
    let workers: Vec<_> = (0..SESSIONS).map(|w| tokio::spawn(worker(soak.clone(), w))).collect();
    let faults = faults(soak.clone(), until).await;
    tokio::time::sleep_until(until).await;
    soak.stop.store(true, Ordering::SeqCst);
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(60), worker).await.expect("a worker did not stop").unwrap();
    }
    soak.ensemble.heal_all().await.unwrap();
    soak.ensemble.wait_for_quorum(Duration::from_secs(60)).await.unwrap();
    let admin = soak.ensemble.client(t).await.unwrap();
    admin.sync(&soak.counter).await.unwrap();
    let value: u64 = String::from_utf8_lossy(&admin.get_data(&soak.counter).await.unwrap().0).parse().unwrap();
    let summary = soak.history.check(Some(value));
    // Every session's nodes go, at the latest when their sessions end.
    soak.clients.lock().unwrap().clear();
    eventually(t * 3, "no lock nodes left", || async { children(&admin, &soak.path).await.is_empty() }).await;
    // Straight to stderr, past the test harness's capture: the summary shows in CI's log too.
    let _ = writeln!(
        std::io::stderr(),
        "soak: {:?} with {SESSIONS} sessions: {} grants, {} fenced writes (counter {value}), losses {:?}, faults {:?}, \
         errors {:?}, max wait {} ms",
        started.elapsed(),
        summary.grants,
        summary.fenced_writes,
        summary.losses,
        faults,
        soak.errors.lock().unwrap(),
        soak.max_wait_ms.load(Ordering::Relaxed)
    );
    assert!(summary.grants > 0, "nothing was granted");
}
