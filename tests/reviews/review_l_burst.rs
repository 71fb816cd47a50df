//! Review L: bursts of acquires that share listings (`engine/listing.rs`, `Setup`): `try_acquire`
//! bursts, two chroots of one directory in one burst, and read/write writers queued behind a
//! downgraded read made by hand (Curator >= 5.5's shape) after the burst listed.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, InterProcessReadWriteLock};
use zookeeper_client as zk;

async fn sessions(n: usize) -> Vec<zk::Client> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client().await);
    }
    out
}

/// 16 `try_acquire`s at once on 16 sessions of a free lock, three rounds: exactly one is granted
/// each round (the lowest node; the others see it ahead), and no node is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_try_acquires_grants_exactly_one() {
    init_tracing();
    let path = unique_path("rl-try-burst");
    let sessions = sessions(16).await;
    let observer = client().await;
    for round in 0..3 {
        let barrier = Arc::new(tokio::sync::Barrier::new(sessions.len()));
        let mut tasks = Vec::new();
        for session in &sessions {
            let mutex = InterProcessMutex::new(session.clone(), &path).unwrap();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                mutex.try_acquire().await.unwrap()
            }));
        }
        let mut granted = Vec::new();
        for task in tasks {
            if let Some(guard) = tokio::time::timeout(Duration::from_secs(30), task).await.expect("no hang").unwrap() {
                granted.push(guard);
            }
        }
        assert_eq!(granted.len(), 1, "round {round}: {} of 16 try_acquires at once were granted", granted.len());
        for guard in granted {
            guard.release().await.unwrap();
        }
    }
    assert_no_nodes_left_while_open(&observer, &path, &sessions, Duration::from_secs(10)).await;
}

/// One burst of 16 acquires of one directory, half through a chroot and half by the full path
/// (one server-side directory, one `Setup` key): one holder at a time, in queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_across_two_chroots_of_one_directory_drains_in_order() {
    init_tracing();
    let root = unique_path("rl-chroot-burst");
    let raw = client().await;
    raw.mkdir(&root, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let full = format!("{root}/lock");
    let held = InterProcessMutex::new(client().await, &full).unwrap().acquire().await.unwrap();
    let mut all = Vec::new();
    let mut tasks = Vec::new();
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    for i in 0..16 {
        let session = client().await;
        all.push(session.clone());
        let mutex = if i % 2 == 0 {
            InterProcessMutex::new(session.chroot(root.clone()).unwrap(), "/lock").unwrap()
        } else {
            InterProcessMutex::new(session, &full).unwrap()
        };
        let (holders, violations, grants) = (holders.clone(), violations.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.acquire().await.expect("acquires");
            if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                violations.fetch_add(1, Ordering::SeqCst);
            }
            grants.lock().unwrap().push(guard.sequence());
            tokio::time::sleep(Duration::from_millis(5)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        }));
    }
    eventually(Duration::from_secs(30), "all queued", || async { children(&raw, &full).await.len() == 17 }).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("drains").unwrap();
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    let grants = grants.lock().unwrap().clone();
    assert!(grants.windows(2).all(|pair| pair[0] < pair[1]), "out of order: {grants:?}");
    assert_no_nodes_left_while_open(&raw, &full, &all, Duration::from_secs(10)).await;
}

/// A write node `W_0` (another process's holder), then a burst of 8 of ours (readers and writers
/// alternating) on 8 sessions, sharing listings. After they listed, that holder downgrades the
/// Curator >= 5.5 way — `_c_<uuid>-__READ__0000000000` created beside `W_0`, then `W_0` deleted.
/// No writer of ours may be granted while that read lives, and readers and writers never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_writers_waits_for_a_read_created_beside_the_write_it_queued_behind() {
    init_tracing();
    let path = unique_path("rl-downgrade-burst");
    let raw = client().await;
    let anyone = zk::Acls::anyone_all();
    raw.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(anyone)).await.unwrap();
    raw.create(&path, b"", &zk::CreateMode::Container.with_acls(anyone)).await.unwrap();
    let w = format!("_c_{}-__WRIT__", uuid::Uuid::new_v4());
    let (_, w_seq) =
        raw.create(&format!("{path}/{w}"), b"", &zk::CreateMode::EphemeralSequential.with_acls(anyone)).await.unwrap();
    let w = format!("{w}{w_seq}");
    let sessions = sessions(8).await;
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writers_in = Arc::new(AtomicUsize::new(0));
    let writers_granted = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, session) in sessions.iter().enumerate() {
        let lock = InterProcessReadWriteLock::new(session.clone(), &path).unwrap();
        let (readers_in, writers_in, writers_granted, violations) =
            (readers_in.clone(), writers_in.clone(), writers_granted.clone(), violations.clone());
        let writer = i % 2 == 1;
        tasks.push(tokio::spawn(async move {
            if writer {
                let guard = lock.write_lock().acquire().await.unwrap();
                writers_granted.fetch_add(1, Ordering::SeqCst);
                if writers_in.fetch_add(1, Ordering::SeqCst) != 0 || readers_in.load(Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                writers_in.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            } else {
                let guard = lock.read_lock().acquire().await.unwrap();
                readers_in.fetch_add(1, Ordering::SeqCst);
                if writers_in.load(Ordering::SeqCst) != 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                readers_in.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    eventually(Duration::from_secs(30), "all queued", || async { children(&raw, &path).await.len() == 9 }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The downgrade: a read beside W_0, then W_0 goes.
    let read = format!("_c_{}-__READ__{w_seq}", uuid::Uuid::new_v4());
    raw.create(&format!("{path}/{read}"), b"", &zk::CreateMode::Ephemeral.with_acls(anyone)).await.unwrap();
    raw.delete(&format!("{path}/{w}"), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let granted_beside_read = writers_granted.load(Ordering::SeqCst);
    raw.delete(&format!("{path}/{read}"), None).await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("drains").unwrap();
    }
    assert_eq!(granted_beside_read, 0, "a writer of ours was granted while the downgraded read {read} lived");
    assert_eq!(violations.load(Ordering::SeqCst), 0, "a reader and a writer (or two writers) at once");
    assert_no_nodes_left_while_open(&raw, &path, &sessions, Duration::from_secs(10)).await;
}
