//! Soak: 16 sessions on a 3-server ensemble acquire, time out, cancel and release at random — and
//! 4 started leader latches (Curator's lifecycle) on sessions of their own join, wait, lead, step
//! down with `close` and rejoin with a new latch, give up waiting, and rejoin by themselves after
//! a lost leadership, on one election — while a random fault hits the ensemble every few seconds
//! (leader or follower killed, a follower cut off from its peers, a server isolated or paused, a
//! session expired). At the end the history checker (`common/history.rs`) proves that no two
//! holders believed they held the lock at once, that fencing tokens increased, that the fenced
//! counter is exact, and that no node is left — checked while every worker's session is still
//! open, so a node our cleanup leaked is not hidden by the server ending the session. The election
//! gets the same checks (one leader at a time, unless the earlier one was told first; tokens
//! growing; no node left), on every leadership the latches' events report. Also asserted:
//! - no hung waiter: every `acquire_timeout` (and every cancelled acquire) returns by its
//!   patience plus `SCHED_SLACK` (README: `acquire_timeout` returns `Ok(None)` at its timeout,
//!   also without a session), every `try_acquire` within [`try_acquire_bound`] (2 T); so the
//!   longest wait for a grant is at most the longest patience (3 s) plus `SCHED_SLACK`;
//! - when a fault hit a holder (a `Suspended`-policy holder on the faulted server, with at least
//!   0.4 T + `SCHED_SLACK` of its hold left), at least one hold was told a real loss — not a
//!   revocation — before the next grant (the injector aims at such holders when it can);
//! - a session the test closed counts as revoked only if the close took effect.
//!
//! `ZK_SOAK_SECS` sets the duration (default 60 s; `ZK_SOAK_SECS=600 cargo test --test soak --
//! --nocapture` for the long run). Prints a summary line starting with `soak:`.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::history::History;
use common::*;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use zk_recipes::{Error, InterProcessMutex, LatchEvent, LatchEvents, LeaderLatch, LossPolicy, LossReason, LossSignal};
use zk_testcontainers::{expire_session, Ensemble};
use zookeeper_client as zk;

const SESSIONS: usize = 16;

/// Leader latches beside the mutexes, each on a session of its own, on one election path.
const LATCHES: usize = 4;

/// The longest patience of an acquire in the soak.
const MAX_PATIENCE: Duration = Duration::from_millis(3000);

/// `try_acquire` has no timeout of its own: its requests wait while the session has no
/// connection, which the client library gives up on after 1.4 T (then `SessionLost`). An election
/// after a leader kill takes a few seconds more on this machine; 2 T (8 s) covers both.
fn try_acquire_bound(t: Duration) -> Duration {
    t * 2
}

/// A holder a fault may hit: where its hold is, until when, under which policy.
#[derive(Clone, Copy)]
struct Holding {
    session: i64,
    policy: LossPolicy,
    until: Instant,
}

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
    /// The current client of each worker (for session expiry, and kept open until the final
    /// "no node left" check).
    clients: Mutex<Vec<Option<zk::Client>>>,
    errors: Mutex<BTreeMap<String, usize>>,
    /// The current hold of each worker, if any.
    holding: Mutex<Vec<Option<Holding>>>,
    /// Acquires that ran past their bound (hung waiters), described.
    overruns: Mutex<Vec<String>>,
    /// Faults that hit a holder (see the module docs).
    hits: AtomicUsize,
    /// The election the latches run, its history, and each latch worker's current client.
    election: String,
    leaderships: History,
    latch_clients: Mutex<Vec<Option<zk::Client>>>,
    /// What the latch workers did, counted (for the summary).
    latch_steps: Mutex<BTreeMap<&'static str, usize>>,
}

impl Soak {
    fn error(&self, err: &Error) {
        let kind = format!("{err:?}").split([' ', '{', '(']).next().unwrap_or("?").to_owned();
        *self.errors.lock().unwrap().entry(kind).or_default() += 1;
    }

    fn latch_step(&self, what: &'static str) {
        *self.latch_steps.lock().unwrap().entry(what).or_default() += 1;
    }
}

/// A new session on the ensemble, retried while the ensemble is faulted.
async fn connect(soak: Arc<Soak>) -> zk::Client {
    loop {
        match soak.ensemble.client(soak.t).await {
            Ok(client) => return client,
            Err(_) if soak.stop.load(Ordering::SeqCst) => return soak.ensemble.client(soak.t).await.unwrap(),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// A participant of the election, with Curator's lifecycle: a new latch joins (`start`), waits
/// for leadership a random patience at a time (`await_leadership_timeout`, which keeps its place)
/// and now and then gives up and leaves (`close`), leads for a random time, steps down with
/// `close`, and rejoins with a new latch. A leadership lost while leading is followed by the latch
/// rejoining by itself; a latch stopped by its session's end is replaced, on a new session. Every
/// leadership of each latch goes into `soak.leaderships`, recorded from its events by
/// [`record_leaderships`] (also those the worker never waited for: a started latch leads again by
/// itself).
async fn latch_worker(soak: Arc<Soak>, w: usize) {
    let who = format!("latch-{w}");
    let policy = if w.is_multiple_of(2) { LossPolicy::Suspended } else { LossPolicy::SessionDeadline };
    let mut client = connect(soak.clone()).await;
    soak.latch_clients.lock().unwrap()[w] = Some(client.clone());
    let build = |client: &zk::Client| {
        LeaderLatch::builder(client.clone(), &soak.election).id(who.clone()).loss_policy(policy).build().unwrap()
    };
    while !soak.stop.load(Ordering::SeqCst) {
        // A closed latch does not start again: each stay in the election is a latch of its own.
        let latch = build(&client);
        let stepping = Arc::new(Mutex::new(Stepping::default()));
        let recorder = tokio::spawn(record_leaderships(soak.clone(), who.clone(), latch.subscribe(), stepping.clone()));
        latch.start().expect("start a new latch");
        let mut session_lost = false;
        while !soak.stop.load(Ordering::SeqCst) {
            let (patience, lead_for, give_up) = {
                let mut rng = rand::rng();
                (
                    Duration::from_millis(rng.random_range(50..MAX_PATIENCE.as_millis() as u64)),
                    Duration::from_millis(rng.random_range(0..1500)),
                    rng.random_range(0..3u32) == 0,
                )
            };
            match latch.await_leadership_timeout(patience).await {
                Ok(Some(leadership)) => {
                    let lost = tokio::select! {
                        biased;
                        _ = leadership.lost() => true,
                        () = tokio::time::sleep(lead_for) => false,
                    };
                    // Lost: the latch queues again by itself; wait for leadership again.
                    if !lost {
                        soak.latch_step("stepped down");
                        break;
                    }
                    soak.latch_step("lost while leading, stayed");
                },
                // Not elected in time: keep the place, or give up and leave.
                Ok(None) => {
                    if give_up {
                        soak.latch_step("gave up waiting");
                        break;
                    }
                },
                // Stopped: it cannot rejoin (a plain client's session ended).
                Err(err) => {
                    soak.error(&err);
                    soak.latch_step("stopped");
                    session_lost = matches!(err, Error::SessionLost { .. });
                    break;
                },
            }
        }
        // Step down and leave: the current leadership's belief ends now; a leadership reported
        // from here on was never acted on (see `History::elected_while_stepping_down`).
        {
            let mut stepping = stepping.lock().unwrap();
            stepping.closing = Some(Instant::now());
            if let Some(hold) = stepping.current.take() {
                soak.leaderships.releasing(hold);
            }
        }
        match tokio::time::timeout(soak.t * 2, latch.close()).await {
            Ok(Ok(())) => {},
            Ok(Err(err)) => soak.error(&err),
            // The deletes go on in the background (close is cancel safe).
            Err(_) => *soak.errors.lock().unwrap().entry("LatchCloseTimedOut".to_owned()).or_default() += 1,
        }
        drop(latch);
        // The latch's events end with its close.
        tokio::time::timeout(Duration::from_secs(10), recorder)
            .await
            .expect("a latch's events end with its close")
            .expect("recorder");
        if session_lost || client.state().is_terminated() {
            client = connect(soak.clone()).await;
            soak.latch_clients.lock().unwrap()[w] = Some(client.clone());
        }
    }
    if client.state().is_terminated() {
        soak.latch_clients.lock().unwrap()[w] = Some(connect(soak.clone()).await);
    }
}

/// What a latch worker shares with the recorder of its latch's leaderships.
#[derive(Default)]
struct Stepping {
    /// The hold of the leadership recorded last, while it lasts.
    current: Option<usize>,
    /// When the worker began to step down (`close`).
    closing: Option<Instant>,
}

/// Records every leadership of one started latch from its events, as
/// `tests/recipes/leader.rs::started_latches_record_every_leadership_across_expiries` does: each
/// `Elected` is a hold from when it is read, ended when its loss signal resolves (the loss
/// signal rather than the `NotLeader` event that follows it: it is told first) or when the
/// worker steps down. Returns the number of leaderships once the latch's events end.
async fn record_leaderships(
    soak: Arc<Soak>,
    who: String,
    mut events: LatchEvents,
    stepping: Arc<Mutex<Stepping>>,
) -> usize {
    enum Next {
        Lost(LossReason),
        Event(Option<LatchEvent>),
    }
    let history = &soak.leaderships;
    let mut leaderships = 0;
    let mut current: Option<(usize, LossSignal)> = None;
    loop {
        let next = match &current {
            Some((_, loss)) => tokio::select! {
                biased;
                reason = loss.lost() => Next::Lost(reason),
                event = events.next() => Next::Event(event),
            },
            None => Next::Event(events.next().await),
        };
        let ended = match next {
            Next::Lost(reason) | Next::Event(Some(LatchEvent::NotLeader { reason })) => {
                current.take().map(|(hold, _)| (hold, reason))
            },
            Next::Event(Some(LatchEvent::Elected { fencing_token, lock_path, loss })) => {
                leaderships += 1;
                let mut stepping = stepping.lock().unwrap();
                match stepping.closing {
                    Some(at) => {
                        history.elected_while_stepping_down(&who, &lock_path, fencing_token, at);
                        soak.latch_step("elected while stepping down");
                    },
                    None => {
                        let hold = history.elected(&who, &lock_path, fencing_token);
                        stepping.current = Some(hold);
                        current = Some((hold, loss));
                    },
                }
                None
            },
            Next::Event(Some(_)) => None,
            Next::Event(None) => return leaderships,
        };
        if let Some((hold, reason)) = ended {
            history.lost(hold, reason);
            let mut stepping = stepping.lock().unwrap();
            if stepping.current == Some(hold) {
                stepping.current = None;
            }
        }
    }
}

async fn worker(soak: Arc<Soak>, w: usize) {
    let who = format!("session-{w}");
    let policy = if w.is_multiple_of(2) { LossPolicy::Suspended } else { LossPolicy::SessionDeadline };
    let mut client = connect(soak.clone()).await;
    soak.clients.lock().unwrap()[w] = Some(client.clone());
    let mut mutex = InterProcessMutex::builder(client.clone(), &soak.path).loss_policy(policy).build().unwrap();
    while !soak.stop.load(Ordering::SeqCst) {
        let (action, patience, hold_for) = {
            let mut rng = rand::rng();
            // Most holds are short; one in ten lasts long enough (1–5 s) for faults to hit it
            // while it holds, so losses are told and checked too.
            let hold_for = if rng.random_range(0..10u32) == 0 {
                rng.random_range(1000..5000)
            } else {
                rng.random_range(0..150u64)
            };
            (
                rng.random_range(0..10u32),
                Duration::from_millis(rng.random_range(50..MAX_PATIENCE.as_millis() as u64)),
                hold_for,
            )
        };
        let started = Instant::now();
        let (outcome, bound) = match action {
            // try_acquire
            0 => (mutex.try_acquire().await, try_acquire_bound(soak.t)),
            // cancelled: the future is dropped after a random time
            1 | 2 => (
                match tokio::time::timeout(patience, mutex.acquire()).await {
                    Ok(result) => result.map(Some),
                    Err(_) => Ok(None),
                },
                patience + SCHED_SLACK,
            ),
            // acquire with a timeout
            _ => (mutex.acquire_timeout(patience).await, patience + SCHED_SLACK),
        };
        let took = started.elapsed();
        if took > bound {
            let what = match &outcome {
                Ok(Some(_)) => "granted".to_owned(),
                Ok(None) => "not granted".to_owned(),
                Err(err) => format!("{err}"),
            };
            soak.overruns.lock().unwrap().push(format!(
                "{who}: action {action} (patience {patience:?}) returned after {took:?} > {bound:?}: {what}"
            ));
        }
        match outcome {
            Ok(Some(guard)) => {
                let waited = took.as_millis() as u64;
                soak.max_wait_ms.fetch_max(waited, Ordering::Relaxed);
                let index = soak.history.granted(&who, &guard);
                soak.holding.lock().unwrap()[w] = Some(Holding {
                    session: client.session_id().0,
                    policy,
                    until: Instant::now() + Duration::from_millis(hold_for),
                });
                tokio::select! {
                    reason = guard.lost() => soak.history.lost(index, reason),
                    _ = async {
                        soak.history.fenced_increment(&client, &guard, &soak.counter).await;
                        tokio::time::sleep(Duration::from_millis(hold_for)).await;
                    } => soak.history.releasing(index),
                }
                soak.holding.lock().unwrap()[w] = None;
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
    // A session closed by the injector at the very end: a live one for the final check.
    if client.state().is_terminated() {
        soak.clients.lock().unwrap()[w] = Some(connect(soak.clone()).await);
    }
}

/// The session ids connected to server `addr` (its `cons` four-letter word).
async fn sessions_on(addr: &str) -> Vec<i64> {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"cons").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    let Ok(Some(text)) = tokio::time::timeout(Duration::from_secs(2), read).await else { return Vec::new() };
    text.split("sid=0x")
        .skip(1)
        .filter_map(|rest| i64::from_str_radix(rest.split(|c: char| !c.is_ascii_hexdigit()).next()?, 16).ok())
        .collect()
}

/// A `Suspended` holder with at least 0.4 T + `SCHED_SLACK` (+ `margin`) of its hold left, and the
/// server its session is on: a fault on that server must tell it before its hold ends.
async fn hittable_holder(soak: &Soak, margin: Duration) -> Option<(usize, Holding)> {
    let need = soak.t * 2 / 5 + SCHED_SLACK + margin;
    let candidates: Vec<Holding> = soak
        .holding
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .filter(|h| h.policy == LossPolicy::Suspended && h.until > Instant::now() + need)
        .copied()
        .collect();
    for holding in candidates {
        for server in 0..soak.ensemble.len() {
            if sessions_on(soak.ensemble.server_addr(server)).await.contains(&holding.session) {
                return (holding.until > Instant::now() + need).then_some((server, holding));
            }
        }
    }
    None
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
        let mut follower = (leader + 1) % ensemble.len();
        let mut kind = kind;
        // Aim at a holder when there is one (waiting for one up to 2 s, up to 20 s for the first
        // fault, so the loss path is exercised in every run): its server is the one faulted.
        let margin = Duration::from_millis(300);
        let mut target = hittable_holder(&soak, margin).await;
        {
            let wait = if counts.is_empty() { Duration::from_secs(20) } else { Duration::from_secs(2) };
            let deadline = Instant::now() + wait;
            while target.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                target = hittable_holder(&soak, margin).await;
            }
        }
        if let Some((server, _)) = target {
            if server == leader {
                kind = 0;
            } else {
                follower = server;
                kind = kind.clamp(1, 4);
            }
        }
        // Whether the fault (all kinds but the session expiry) lands on a holder that must be told.
        let hit = kind < 5 && {
            let faulted = if kind == 0 { leader } else { follower };
            match target {
                Some((server, holding)) => {
                    server == faulted && holding.until > Instant::now() + soak.t * 2 / 5 + SCHED_SLACK
                },
                None => false,
            }
        };
        if hit {
            soak.hits.fetch_add(1, Ordering::Relaxed);
        }
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
                    // A close the server acts on at once: the victim's holds end when it was
                    // started (see `History::revoked`) — if it took effect. A failed close may
                    // still have been applied (its reply lost): then the client is told Expired.
                    let at = Instant::now();
                    let closed = match expire_session(ensemble.server_addr(leader), &client).await {
                        Ok(()) => true,
                        Err(_) => {
                            let deadline = Instant::now() + soak.t * 2;
                            while !client.state().is_terminated() && Instant::now() < deadline {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            client.state() == zk::SessionState::Expired
                        },
                    };
                    if closed {
                        soak.history.revoked_since(&format!("session-{victim}"), at);
                    }
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
    let election = unique_path("soak-election");
    let soak = Arc::new(Soak {
        ensemble,
        leaderships: History::new(&election),
        election,
        latch_clients: Mutex::new(vec![None; LATCHES]),
        latch_steps: Mutex::new(BTreeMap::new()),
        history: History::new(&path),
        path,
        counter,
        stop: AtomicBool::new(false),
        t,
        max_wait_ms: AtomicU64::new(0),
        clients: Mutex::new(vec![None; SESSIONS]),
        errors: Mutex::new(BTreeMap::new()),
        holding: Mutex::new(vec![None; SESSIONS]),
        overruns: Mutex::new(Vec::new()),
        hits: AtomicUsize::new(0),
    });
    let started = Instant::now();
    let until = started + duration;
    let mut workers: Vec<_> = (0..SESSIONS).map(|w| tokio::spawn(worker(soak.clone(), w))).collect();
    workers.extend((0..LATCHES).map(|w| tokio::spawn(latch_worker(soak.clone(), w))));
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
    // One leader at a time (or the earlier one told first), tokens growing.
    let elections = soak.leaderships.check(None);
    // No node left, while every worker's session is still open (the README: cleanup retries until
    // the node is gone or the session is dead; T for the retries after the ensemble healed).
    let open: Vec<zk::Client> = soak.clients.lock().unwrap().iter().flatten().cloned().collect();
    assert_eq!(open.len(), SESSIONS);
    assert_no_nodes_left_while_open(&admin, &soak.path, &open, t).await;
    let latch_sessions: Vec<zk::Client> = soak.latch_clients.lock().unwrap().iter().flatten().cloned().collect();
    assert_eq!(latch_sessions.len(), LATCHES);
    assert_no_nodes_left_while_open(&admin, &soak.election, &latch_sessions, t).await;
    let hits = soak.hits.load(Ordering::Relaxed);
    let max_wait = Duration::from_millis(soak.max_wait_ms.load(Ordering::Relaxed));
    // Straight to stderr, past the test harness's capture: the summary shows in CI's log too.
    let _ = writeln!(
        std::io::stderr(),
        "soak: {:?} with {SESSIONS} sessions: {} grants, {} fenced writes (counter {value}), losses {:?} ({} told, \
         not revoked), {LATCHES} latches: {} leaderships, losses {:?}, {:?}; faults {:?} ({hits} hit a holder), errors \
         {:?}, max wait {max_wait:?}",
        started.elapsed(),
        summary.grants,
        summary.fenced_writes,
        summary.losses,
        summary.told_losses,
        elections.grants,
        elections.losses,
        soak.latch_steps.lock().unwrap(),
        faults,
        soak.errors.lock().unwrap(),
    );
    drop(open);
    drop(latch_sessions);
    assert!(summary.grants > 0, "nothing was granted");
    assert!(elections.grants > 0, "no latch ever led");
    let overruns = soak.overruns.lock().unwrap().clone();
    assert!(overruns.is_empty(), "hung waiters (past patience + SCHED_SLACK, or try_acquire past 2 T):\n{overruns:#?}");
    assert!(max_wait <= MAX_PATIENCE + SCHED_SLACK, "max wait {max_wait:?} > {MAX_PATIENCE:?} + SCHED_SLACK");
    assert!(hits > 0, "no fault hit a holder: the loss path was not exercised (faults {faults:?})");
    assert!(
        summary.told_losses > 0,
        "{hits} faults hit a holder, but no hold was told a loss (not a revocation) before the next grant"
    );
}
