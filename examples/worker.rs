//! A small job service: several workers, each with its own ZooKeeper session, process jobs under
//! per-job locks `/jobs/<id>` and write results, fenced by the lock's token, into a toy store.
//! Workers contain no reconnection code: a [`ManagedClient`] gives them a new session after an
//! expiry, and their mutexes keep working. A slow fourth worker reaches ZooKeeper through a
//! proxy whose traffic is stalled while it works on a job: it is told its lock is lost, abandons
//! the job (its work future is dropped through an owned `LossSignal`), and another worker redoes
//! it.
//!
//! ```sh
//! cargo run --example worker          # starts ZooKeeper, expires a worker's session, restarts
//!                                     # ZooKeeper and stalls a holder mid-run; checks every job
//!                                     # got done and the stalled holder was told
//! ZK_CONNECT=127.0.0.1:2181 cargo run --example worker   # against a running server, no faults
//! ```
//! Ctrl-C stops the workers cleanly: each finishes or abandons its current job and releases its
//! lock before exiting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use zk_recipes::{ConnectionState, FencingToken, InterProcessMutex, ManagedClient};
use zk_testcontainers::{expire_session, FaultProxy, ZooKeeper};

const WORKERS: usize = 3;
const JOBS: u32 = 60;
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
/// The worker behind the fault proxy: slow, so a stall hits it while it holds a job's lock.
const SLOW_WORKER: &str = "worker-slow";
const SLOW_JOB: Duration = Duration::from_secs(3);

/// A toy result store that, like any resource guarded by a lock should, rejects a write carrying a
/// fencing token lower than the highest it has seen for that job.
#[derive(Default)]
struct Store {
    results: Mutex<HashMap<u32, (FencingToken, String)>>,
    stale_writes: AtomicU64,
}

impl Store {
    fn is_done(&self, job: u32) -> bool {
        self.results.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&job)
    }

    fn write(&self, job: u32, token: FencingToken, result: String) -> bool {
        let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        if results.get(&job).is_some_and(|(highest, _)| *highest > token) {
            self.stale_writes.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        results.insert(job, (token, result));
        true
    }
}

#[derive(Default)]
struct Counters {
    processed: AtomicU64,
    lost: AtomicU64,
    new_sessions: AtomicU64,
    /// The job the slow worker holds the lock of right now (`u64::MAX`: none).
    slow_holding: AtomicU64,
    /// The job the slow worker abandoned when it was told its lock was lost (`u64::MAX`: none).
    slow_abandoned: AtomicU64,
}

async fn worker(
    name: String,
    zk: ManagedClient,
    store: Arc<Store>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) -> zk_recipes::Result<()> {
    let mut mutexes: HashMap<u32, InterProcessMutex> = HashMap::new();
    let offset = name.bytes().map(u32::from).sum::<u32>();
    loop {
        let pending: Vec<u32> = (0..JOBS).map(|i| (i + offset) % JOBS).filter(|job| !store.is_done(*job)).collect();
        if pending.is_empty() || *stop.borrow() {
            return Ok(());
        }
        for job in pending {
            if *stop.borrow() {
                return Ok(());
            }
            let mutex = match mutexes.get(&job) {
                Some(mutex) => mutex.clone(),
                None => {
                    let mutex =
                        InterProcessMutex::builder(&zk, format!("/jobs/{job}")).node_data(name.clone()).build()?;
                    mutexes.insert(job, mutex.clone());
                    mutex
                },
            };
            // Another worker has it (or no session right now, after an expiry): try the next job.
            // `acquire_timeout` waits for a new session within its timeout; `try_acquire` would
            // fail with `SessionLost` until there is one.
            let guard = match mutex.acquire_timeout(Duration::from_millis(200)).await {
                Ok(Some(guard)) => guard,
                Ok(None) => continue,
                // A job service logs and moves on (a create cut off by a restart several times in
                // a row, ACLs changed under it, ...); the job is retried in the next round.
                Err(err) => {
                    eprintln!("{name}: job {job}: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                },
            };
            if store.is_done(job) {
                continue;
            }
            let slow = name == SLOW_WORKER;
            let work =
                tokio::time::sleep(if slow { SLOW_JOB } else { Duration::from_millis(100 + u64::from(job % 5) * 25) });
            let loss = guard.loss_signal();
            if slow {
                counters.slow_holding.store(u64::from(job), Ordering::SeqCst);
            }
            tokio::select! {
                _ = work => {
                    let result = format!("job {job} by {name}");
                    if store.write(job, guard.fencing_token(), result) {
                        counters.processed.fetch_add(1, Ordering::Relaxed);
                    }
                },
                reason = loss.lost() => {
                    counters.lost.fetch_add(1, Ordering::Relaxed);
                    if slow {
                        counters.slow_abandoned.store(u64::from(job), Ordering::SeqCst);
                    }
                    eprintln!("{name}: lock of job {job} lost ({reason}); abandoning it");
                },
                _ = stop.changed() => {},
            }
            if slow {
                counters.slow_holding.store(u64::MAX, Ordering::SeqCst);
            }
            // A release can fail only when the session is unusable; the node then goes with it.
            if let Err(err) = guard.release().await {
                eprintln!("{name}: release of job {job}: {err}");
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let zookeeper = ZooKeeper::start().await?;
    let connect = zookeeper.connect_string().to_owned();
    println!("ZooKeeper at {connect}");

    let store = Arc::new(Store::default());
    let counters = Arc::new(Counters::default());
    counters.slow_holding.store(u64::MAX, Ordering::SeqCst);
    counters.slow_abandoned.store(u64::MAX, Ordering::SeqCst);
    let inject = std::env::var_os("ZK_CONNECT").is_none();
    // The slow worker's connection goes through a proxy the fault injection can stall.
    let proxy = FaultProxy::start(&connect).await?;
    let (stop_tx, stop) = watch::channel(false);
    let mut clients = Vec::new();
    let mut workers = Vec::new();
    for i in 0..=WORKERS {
        let (name, hosts) = match i {
            WORKERS => (SLOW_WORKER.to_owned(), proxy.addr()),
            _ => (format!("worker-{i}"), connect.clone()),
        };
        let zk = ManagedClient::builder(hosts).session_timeout(SESSION_TIMEOUT).connect().await?;
        let mut states = zk.state_watcher();
        let counted = counters.clone();
        let label = name.clone();
        tokio::spawn(async move {
            while let Some(state) = states.changed().await {
                eprintln!("{label}: connection {state}");
                if state == ConnectionState::NewSession {
                    counted.new_sessions.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        clients.push(zk.clone());
        workers.push(tokio::spawn(worker(name, zk, store.clone(), counters.clone(), stop.clone())));
    }

    let started = Instant::now();
    // Only against a server of our own: expire one worker's session, then restart ZooKeeper.
    // Returns whether they were injected; an injection that failed is an error, so a run that
    // claims to have survived them cannot pass without them.
    let expired_session = clients[0].client().session_id().0;
    let faults = async {
        if !inject {
            return Ok::<_, Box<dyn std::error::Error>>(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        eprintln!("-- expiring worker-0's session");
        expire_session(&connect, &clients[0].client())
            .await
            .map_err(|err| format!("could not expire the session: {err}"))?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        eprintln!("-- restarting ZooKeeper");
        zookeeper.restart().await.map_err(|err| format!("could not restart ZooKeeper: {err}"))?;
        // Stall the slow worker's traffic while it holds a job's lock: it must be told (within
        // 0.4 T) and abandon the job, which another worker then does.
        let deadline = Instant::now() + Duration::from_secs(60);
        while counters.slow_holding.load(Ordering::SeqCst) == u64::MAX {
            if Instant::now() > deadline {
                return Err("the slow worker never held a lock".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // (An earlier loss — the restart's — does not count.)
        counters.slow_abandoned.store(u64::MAX, Ordering::SeqCst);
        let job = counters.slow_holding.load(Ordering::SeqCst);
        eprintln!("-- stalling {SLOW_WORKER}'s connection while it holds job {job}");
        proxy.stall();
        let deadline = Instant::now() + SESSION_TIMEOUT;
        while counters.slow_abandoned.load(Ordering::SeqCst) != job && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        proxy.pass();
        if counters.slow_abandoned.load(Ordering::SeqCst) != job {
            return Err(format!("{SLOW_WORKER} was not told within T that it lost the lock of job {job}").into());
        }
        Ok(())
    };
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("Ctrl-C: stopping workers (each releases its lock)");
            let _ = stop_tx.send(true);
        }
    });
    let all_done = async {
        for worker in &mut workers {
            worker.await??;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let (done, injected) = tokio::join!(all_done, faults);
    done?;
    injected?;
    if inject {
        // worker-0 must be on a new session, and its ManagedClient must have said so.
        let deadline = Instant::now() + SESSION_TIMEOUT * 2;
        while counters.new_sessions.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if counters.new_sessions.load(Ordering::Relaxed) == 0 {
            return Err("the expired session was not followed by ConnectionState::NewSession".into());
        }
        if clients[0].client().session_id().0 == expired_session {
            return Err("worker-0 is still on the session that was expired".into());
        }
        let abandoned = counters.slow_abandoned.load(Ordering::SeqCst);
        if counters.lost.load(Ordering::Relaxed) == 0 || abandoned == u64::MAX {
            return Err("no holder was told its lock was lost".into());
        }
        match store.results.lock().unwrap_or_else(|p| p.into_inner()).get(&(abandoned as u32)) {
            Some((_, by)) if !by.ends_with(SLOW_WORKER) => eprintln!("job {abandoned}, abandoned, was done: {by}"),
            other => return Err(format!("job {abandoned} abandoned by {SLOW_WORKER}, then {other:?}").into()),
        }
    }
    let stopped = *stop.borrow();
    // A clean exit: every node of every worker's session goes now, not a session timeout later.
    for zk in &clients {
        zk.close().await?;
    }

    let done = (0..JOBS).filter(|job| store.is_done(*job)).count();
    println!(
        "{{\"jobs\":{JOBS},\"done\":{done},\"processed\":{},\"stale_writes_rejected\":{},\"locks_lost\":{},\"new_sessions\":{},\"secs\":{:.1}}}",
        counters.processed.load(Ordering::Relaxed),
        store.stale_writes.load(Ordering::Relaxed),
        counters.lost.load(Ordering::Relaxed),
        counters.new_sessions.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if !stopped && done != JOBS as usize {
        return Err(format!("only {done} of {JOBS} jobs done").into());
    }
    Ok(())
}
