//! Review E: the lease bound and "told before taken" under connection faults, checked by an
//! in-process oracle: at each grant, the leases other workers still believe they hold (state
//! `Held` or `Suspended`) plus the new ones must not exceed `max_leases`. Six workers, each
//! session behind its own fault proxy (T = 3 s, half `Suspended`, half `SessionDeadline`), take
//! one or two leases with timeouts while random proxies are cut, stalled (both ways or upstream
//! only, 0.1–5 s: some long enough to expire the session) or drop a create's reply; plain clients
//! and `ManagedClient`s. `REVIEW_E_SECS` (30 s each by default) sets how long the chaos runs.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rand::Rng;
use zk_recipes::{InterProcessSemaphoreV2, Lease, LockState, LossPolicy};
use zk_testcontainers::FaultProxy;

const MAX: usize = 3;
const WORKERS: usize = 6;
const T: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Registry {
    /// (worker, lease) of every lease a worker holds now.
    leases: Mutex<Vec<(usize, Arc<Lease>)>>,
    violations: AtomicUsize,
    grants: AtomicUsize,
    errors: AtomicUsize,
    timeouts: AtomicUsize,
}

impl Registry {
    fn enter(&self, worker: usize, new: &[Arc<Lease>]) {
        let mut all = self.leases.lock().unwrap();
        let believed: Vec<String> = all
            .iter()
            .filter(|(_, l)| !matches!(l.state(), LockState::Lost(_)))
            .map(|(w, l)| format!("w{w}:{}:{:?}", l.node_path().rsplit('-').next().unwrap(), l.state()))
            .collect();
        if believed.len() + new.len() > MAX {
            self.violations.fetch_add(1, Ordering::SeqCst);
            eprintln!(
                "VIOLATION: worker {worker} granted {:?} while others believe they hold {believed:?}",
                new.iter().map(|l| l.node_path().rsplit('-').next().unwrap().to_owned()).collect::<Vec<_>>()
            );
        }
        for lease in new {
            all.push((worker, lease.clone()));
        }
        self.grants.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self, worker: usize) {
        self.leases.lock().unwrap().retain(|(w, _)| *w != worker);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_bound_and_told_before_taken() {
    chaos(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_bound_and_told_before_taken_managed() {
    chaos(true).await;
}

async fn chaos(managed: bool) {
    init_tracing();
    let zk = zookeeper().await;
    let path = unique_path("review-e-chaos");
    let registry = Arc::new(Registry::default());
    let mut proxies = Vec::new();
    for _ in 0..WORKERS {
        proxies.push(Arc::new(FaultProxy::start(zk.connect_string()).await.expect("proxy")));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    let open: Arc<Mutex<Vec<zk_testcontainers::zookeeper_client::Client>>> = Arc::default();
    let managed_open: Arc<Mutex<Vec<zk_recipes::ManagedClient>>> = Arc::default();
    for (w, proxy) in proxies.iter().enumerate() {
        let (proxy, registry, path, stop) = (proxy.clone(), registry.clone(), path.clone(), stop.clone());
        let open = open.clone();
        let managed_open = managed_open.clone();
        tasks.push(tokio::spawn(async move {
            let policy = if w % 2 == 0 { LossPolicy::Suspended } else { LossPolicy::SessionDeadline };
            if managed {
                let client = loop {
                    match zk_recipes::ManagedClient::builder(proxy.addr()).session_timeout(T).connect().await {
                        Ok(c) => break c,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                };
                let sem = InterProcessSemaphoreV2::builder(&client, &path).loss_policy(policy).build(MAX).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    let (qty, wait) = {
                        let mut rng = rand::rng();
                        (if rng.random_bool(0.3) { 2 } else { 1 }, Duration::from_millis(rng.random_range(50..3000)))
                    };
                    match sem.acquire_many_timeout(qty, wait).await {
                        Ok(Some(leases)) => {
                            let leases: Vec<Arc<Lease>> = leases.into_iter().map(Arc::new).collect();
                            registry.enter(w, &leases);
                            let hold = Duration::from_millis(rand::rng().random_range(10..300));
                            let first = leases[0].clone();
                            tokio::select! {
                                _ = tokio::time::sleep(hold) => {},
                                _ = first.lost() => {},
                            }
                            registry.leave(w);
                            for lease in leases {
                                if let Ok(lease) = Arc::try_unwrap(lease) {
                                    let _ = tokio::time::timeout(Duration::from_secs(5), lease.release()).await;
                                }
                            }
                        },
                        Ok(None) => {
                            registry.timeouts.fetch_add(1, Ordering::SeqCst);
                        },
                        Err(err) => {
                            registry.errors.fetch_add(1, Ordering::SeqCst);
                            eprintln!("w{w} acquire failed: {err}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        },
                    }
                }
                managed_open.lock().unwrap().push(client);
                return;
            }
            while !stop.load(Ordering::SeqCst) {
                let client = match zk.connector().with_session_timeout(T).connect(&proxy.addr()).await {
                    Ok(c) => c,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    },
                };
                let sem =
                    InterProcessSemaphoreV2::builder(client.clone(), &path).loss_policy(policy).build(MAX).unwrap();
                while !stop.load(Ordering::SeqCst) && !client.state().is_terminated() {
                    let (qty, wait) = {
                        let mut rng = rand::rng();
                        (if rng.random_bool(0.3) { 2 } else { 1 }, Duration::from_millis(rng.random_range(50..3000)))
                    };
                    match sem.acquire_many_timeout(qty, wait).await {
                        Ok(Some(leases)) => {
                            let leases: Vec<Arc<Lease>> = leases.into_iter().map(Arc::new).collect();
                            registry.enter(w, &leases);
                            let hold = Duration::from_millis(rand::rng().random_range(10..300));
                            let first = leases[0].clone();
                            tokio::select! {
                                _ = tokio::time::sleep(hold) => {},
                                _ = first.lost() => {},
                            }
                            registry.leave(w);
                            for lease in leases {
                                if let Ok(lease) = Arc::try_unwrap(lease) {
                                    let _ = tokio::time::timeout(Duration::from_secs(5), lease.release()).await;
                                }
                            }
                        },
                        Ok(None) => {
                            registry.timeouts.fetch_add(1, Ordering::SeqCst);
                        },
                        Err(err) => {
                            registry.errors.fetch_add(1, Ordering::SeqCst);
                            tracing::debug!(w, %err, "acquire failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        },
                    }
                }
                drop(sem);
                if stop.load(Ordering::SeqCst) {
                    open.lock().unwrap().push(client);
                }
            }
        }));
    }
    // Chaos: random faults on random proxies.
    let chaos = {
        let proxies = proxies.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let pause = Duration::from_millis(rand::rng().random_range(100..800));
                tokio::time::sleep(pause).await;
                let p = rand::rng().random_range(0..proxies.len());
                let kind = rand::rng().random_range(0..4);
                let len = Duration::from_millis(rand::rng().random_range(100..5000));
                let proxy = proxies[p].clone();
                tokio::spawn(async move {
                    match kind {
                        0 => proxy.cut(),
                        1 => {
                            proxy.stall();
                            tokio::time::sleep(len).await;
                            proxy.pass();
                        },
                        2 => {
                            proxy.stall_upstream();
                            tokio::time::sleep(len).await;
                            proxy.pass();
                        },
                        _ => proxy.drop_reply_to_next(&[zk_testcontainers::op::CREATE2, zk_testcontainers::op::CREATE]),
                    }
                });
            }
        })
    };
    let secs: u64 = std::env::var("REVIEW_E_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::SeqCst);
    chaos.await.unwrap();
    for p in &proxies {
        p.drop_reply_to_next(&[]);
        p.pass();
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    eprintln!(
        "grants {} timeouts {} errors {} violations {}",
        registry.grants.load(Ordering::SeqCst),
        registry.timeouts.load(Ordering::SeqCst),
        registry.errors.load(Ordering::SeqCst),
        registry.violations.load(Ordering::SeqCst)
    );
    assert_eq!(registry.violations.load(Ordering::SeqCst), 0);
    // Leases were granted under the faults: the oracle had something to check.
    assert!(registry.grants.load(Ordering::SeqCst) >= 20, "too few grants to check anything");
    tokio::time::sleep(T * 2).await;
    let open: Vec<_> = open.lock().unwrap().iter().filter(|c| !c.state().is_terminated()).cloned().collect();
    eprintln!("{} managed clients", managed_open.lock().unwrap().len());
    eprintln!("{} sessions still open", open.len());
    let observer = client().await;
    for dir in ["leases", "locks"] {
        let dir = format!("{path}/{dir}");
        let left = children(&observer, &dir).await;
        eprintln!("{dir}: {left:?}");
        assert_no_nodes_left_while_open(&observer, &dir, &open, Duration::from_secs(15)).await;
    }
}
