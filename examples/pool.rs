//! The lock family at work: a pool of database connections shared by workers, a nightly job that
//! one task takes and another finishes, transfers that need two accounts at once, and a long
//! report that gives its lock back when an operator asks for it.
//!
//! - **Pool** (`InterProcessSemaphoreV2`, 3 leases): six workers, each with its own ZooKeeper
//!   session, take one connection — sometimes two at once (`acquire_many`) — use them and return
//!   them. Checked: never more than 3 in use, and the pool did fill.
//! - **Nightly job** (`InterProcessSemaphoreMutex`): taken by the scheduler task, handed to a
//!   worker task that releases it; meanwhile nobody else gets it, not even the scheduler again.
//! - **Transfers** (`InterProcessMultiLock` over two accounts' `InterProcessMutex`es): concurrent
//!   transfers between the same accounts; checked: no two inside at once, money conserved.
//! - **Revocation** (`revocable(true)` + `Revoker`): a report holds its lock until an operator asks
//!   for it, then finishes and releases; the operator gets the lock next.
//!
//! Exits non-zero if any check fails.
//!
//! ```sh
//! cargo run --example pool                            # starts ZooKeeper in a container
//! ZK_CONNECT=127.0.0.1:2181 cargo run --example pool  # against a running server
//! ```

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zk_recipes::{
    InterProcessMultiLock, InterProcessMutex, InterProcessSemaphoreMutex, InterProcessSemaphoreV2, ManagedClient,
    Revoker,
};
use zk_testcontainers::ZooKeeper;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CONNECTIONS: usize = 3;
const WORKERS: usize = 6;
const JOBS_PER_WORKER: usize = 8;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_server, connect) = match std::env::var("ZK_CONNECT") {
        Ok(connect) => (None, connect),
        Err(_) => {
            let server = ZooKeeper::start().await?;
            let connect = server.connect_string().to_owned();
            (Some(server), connect)
        },
    };
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut failures = Vec::new();
    failures.extend(pool(&connect, &run).await?);
    failures.extend(nightly_job(&connect, &run).await?);
    failures.extend(transfers(&connect, &run).await?);
    failures.extend(report(&connect, &run).await?);
    if failures.is_empty() {
        println!("pool: every check passed");
        Ok(())
    } else {
        for failure in &failures {
            eprintln!("FAILED: {failure}");
        }
        std::process::exit(1);
    }
}

async fn pool(connect: &str, run: &str) -> Result<Vec<String>, BoxError> {
    let path = format!("/examples/{run}/db-pool");
    let in_use = Arc::new(AtomicUsize::new(0));
    let (peak, over) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let zk = ManagedClient::connect(connect).await?;
        let pool = InterProcessSemaphoreV2::new(&zk, path.as_str(), CONNECTIONS)?;
        let (in_use, peak, over) = (in_use.clone(), peak.clone(), over.clone());
        workers.push(tokio::spawn(async move {
            for job in 0..JOBS_PER_WORKER {
                let wanted = if (w + job) % 3 == 0 { 2 } else { 1 };
                let leases = pool.acquire_many(wanted).await?;
                let now = in_use.fetch_add(wanted, Ordering::SeqCst) + wanted;
                peak.fetch_max(now, Ordering::SeqCst);
                if now > CONNECTIONS {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await; // the query
                in_use.fetch_sub(wanted, Ordering::SeqCst);
                for lease in leases {
                    lease.release().await?;
                }
            }
            zk.close().await?;
            Ok::<_, BoxError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let (peak, over) = (peak.load(Ordering::SeqCst), over.load(Ordering::SeqCst));
    println!("pool: {WORKERS} workers, {CONNECTIONS} connections, at most {peak} in use at once");
    let mut failures = Vec::new();
    if over > 0 {
        failures.push(format!("pool: more than {CONNECTIONS} connections in use {over} times"));
    }
    if peak != CONNECTIONS {
        failures.push(format!("pool: never full (peak {peak}), the bound was not exercised"));
    }
    Ok(failures)
}

async fn nightly_job(connect: &str, run: &str) -> Result<Vec<String>, BoxError> {
    let path = format!("/examples/{run}/nightly-job");
    let zk = ManagedClient::connect(connect).await?;
    let other = ManagedClient::connect(connect).await?;
    let job = InterProcessSemaphoreMutex::new(&zk, path.as_str())?;
    let rival = InterProcessSemaphoreMutex::new(&other, path.as_str())?;
    let mut failures = Vec::new();
    let lease = job.acquire().await?;
    // Not re-entrant: the scheduler itself cannot take it again, nor can anyone else.
    if job.acquire_timeout(Duration::from_millis(200)).await?.is_some() {
        failures.push("nightly job: the same task got the semaphore mutex twice".to_owned());
    }
    if rival.acquire_timeout(Duration::from_millis(200)).await?.is_some() {
        failures.push("nightly job: another session got it while held".to_owned());
    }
    // The worker task does the job and releases the lock it was handed.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        lease.release().await
    })
    .await??;
    match rival.acquire_timeout(Duration::from_secs(10)).await? {
        Some(lease) => lease.release().await?,
        None => failures.push("nightly job: not free after the worker released it".to_owned()),
    }
    println!("nightly job: handed from the scheduler to a worker, released there, then taken by the next");
    zk.close().await?;
    other.close().await?;
    Ok(failures)
}

async fn transfers(connect: &str, run: &str) -> Result<Vec<String>, BoxError> {
    let accounts = [format!("/examples/{run}/accounts/a"), format!("/examples/{run}/accounts/b")];
    let balance = Arc::new([AtomicI64::new(100), AtomicI64::new(100)]);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tellers = Vec::new();
    for t in 0..3 {
        let zk = ManagedClient::connect(connect).await?;
        // Every teller takes the accounts in the same order (a → b): no two wait for each other.
        let both = InterProcessMultiLock::new(
            accounts.iter().map(|path| InterProcessMutex::new(&zk, path.as_str())).collect::<Result<Vec<_>, _>>()?,
        );
        let (balance, inside, overlaps) = (balance.clone(), inside.clone(), overlaps.clone());
        tellers.push(tokio::spawn(async move {
            for i in 0..5 {
                let held = both.acquire().await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let (from, to) = if (t + i) % 2 == 0 { (0, 1) } else { (1, 0) };
                // A read, a pause, a write: a second teller inside would lose money.
                let (a, b) = (balance[from].load(Ordering::SeqCst), balance[to].load(Ordering::SeqCst));
                tokio::time::sleep(Duration::from_millis(5)).await;
                balance[from].store(a - 10, Ordering::SeqCst);
                balance[to].store(b + 10, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                held.release().await?;
            }
            zk.close().await?;
            Ok::<_, BoxError>(())
        }));
    }
    for teller in tellers {
        teller.await??;
    }
    let total = balance[0].load(Ordering::SeqCst) + balance[1].load(Ordering::SeqCst);
    let overlaps = overlaps.load(Ordering::SeqCst);
    println!("transfers: 15 transfers under one multi-lock; total {total}, overlaps {overlaps}");
    let mut failures = Vec::new();
    if total != 200 || overlaps != 0 {
        failures.push(format!("transfers: total {total} (expected 200), {overlaps} overlaps"));
    }
    Ok(failures)
}

async fn report(connect: &str, run: &str) -> Result<Vec<String>, BoxError> {
    let path = format!("/examples/{run}/report");
    let zk = ManagedClient::connect(connect).await?;
    let operator = ManagedClient::connect(connect).await?;
    let report = InterProcessMutex::builder(&zk, path.as_str()).revocable(true).build()?;
    let guard = report.acquire().await?;
    let asked = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn({
        let asked = asked.clone();
        async move {
            // The long report: it runs until someone asks for the lock, then wraps up.
            guard.revoke_requested().await;
            asked.store(true, Ordering::SeqCst);
            guard.release().await
        }
    });
    // The operator asks whoever holds the lock to give it up, then queues for it.
    let lock = InterProcessMutex::new(&operator, path.as_str())?;
    let holder = lock.participants().await?.into_iter().find(|p| p.is_holder);
    let mut failures = Vec::new();
    match holder {
        Some(holder) => Revoker::attempt_revoke(&operator, &holder.path).await?,
        None => failures.push("report: nobody holds the report lock".to_owned()),
    }
    match lock.acquire_timeout(Duration::from_secs(10)).await? {
        Some(guard) => {
            if !asked.load(Ordering::SeqCst) {
                failures.push("report: the operator got the lock before the report saw the request".to_owned());
            }
            guard.release().await?;
        },
        None => failures.push("report: the holder never gave the lock back".to_owned()),
    }
    running.await??;
    println!("report: asked for its lock, finished, released; the operator took it");
    zk.close().await?;
    operator.close().await?;
    Ok(failures)
}
