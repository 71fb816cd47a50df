//! Review F: attacks on hold leases (c6879a5): a huge lease panicked (now capped), a hung holder task kept its lease timer from running (now spawned where any worker takes it), `extend` revived a hold that read `Lost(LeaseExpired)` (now final), and a fenced write already sent lands after the loss (documented). A holder whose whole runtime is blocked (its client on another runtime) is the README's limit.
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{FencedWriteError, InterProcessMutex, LockState, LossReason};
use zk_testcontainers::{op, FaultProxy};
use zookeeper_client as zk;

async fn make_counter(client: &zk::Client) -> String {
    let counter = unique_path("rf-counter");
    let mut level = String::new();
    for name in counter.split('/').skip(1) {
        level = format!("{level}/{name}");
        let _ = client.create(&level, b"0", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
    }
    counter
}

/// A huge lease (Duration::MAX) panics: `Instant + Duration` overflows in `Holds::lease`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_huge_lease_panics() {
    let path = unique_path("rf-huge");
    let client = client().await;
    let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
    let m = mutex.clone();
    let res = tokio::spawn(async move { m.acquire_with_lease(Duration::MAX).await.map(|_| ()) }).await;
    println!("acquire_with_lease(Duration::MAX) -> {:?}", res.as_ref().map_err(|e| e.is_panic()));
    let guard = mutex.acquire().await.unwrap();
    let res =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guard.extend(Duration::from_secs(u64::MAX / 2))));
    println!("extend(u64::MAX/2 s) panicked: {}", res.is_err());
    let b = InterProcessMutex::builder(client.clone(), &path).lease(Duration::MAX).build().unwrap();
    drop(guard);
    let res = tokio::spawn(async move { b.acquire().await.map(|_| ()) }).await;
    println!("builder.lease(MAX).acquire() -> panicked: {:?}", res.as_ref().map_err(|e| e.is_panic()).err());
    assert!(res.is_ok(), "builder lease(Duration::MAX) then acquire panicked");
}

/// Same on a multi-thread runtime: the holder's task blocks its worker right after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f3_hung_holder_task_on_multi_thread_runtime() {
    let path = unique_path("rf-hung-mt");
    let (holder_client, waiter_client) = (client().await, client().await);
    let mutex = InterProcessMutex::new(holder_client.clone(), &path).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn(async move {
        let guard = mutex.acquire_with_lease(Duration::from_millis(500)).await.unwrap();
        let _ = tx.send(());
        std::thread::sleep(Duration::from_secs(6));
        drop(guard);
    });
    rx.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "2 s after the grant (lease 500 ms), nodes under the lock (listed by the HOLDER's own client): {:?}",
        children(&holder_client, &path).await
    );
    let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
    let started = Instant::now();
    let got = waiter.acquire_timeout(Duration::from_secs(2)).await.unwrap();
    println!("waiter after {:?}: granted = {}", started.elapsed(), got.is_some());
    let granted = got.is_some();
    drop(got);
    holder.await.unwrap();
    assert!(granted, "lease 500 ms, holder task hung: the waiter was not granted within 4 s");
}

/// extend racing the clock: check_live passes, the thread is preempted past `until`, others see
/// `Lost(LeaseExpired)`, then the extend stores a new `until` and the hold reads `Held` again.
/// The timer is kept from running (its runtime is blocked) so the race is seen cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_extend_revives_a_hold_that_read_lost() {
    let path = unique_path("rf-revive");
    let client = zookeeper()
        .await
        .connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(zookeeper().await.connect_string())
        .await
        .unwrap();
    let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let guard = Arc::new(mutex.acquire_with_lease(Duration::from_secs(3600)).await.unwrap());
            tx.send(guard.clone()).unwrap();
            // Blocks the runtime of the lease timer.
            done_rx.recv().unwrap();
            drop(guard);
        });
    });
    let guard = rx.recv().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let revivals = Arc::new(AtomicUsize::new(0));
    let losts = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for _ in 0..4 {
        let (guard, stop) = (guard.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = guard.extend(Duration::from_micros(300));
            }
        }));
    }
    for _ in 0..1 {
        let (guard, stop, revivals, losts) = (guard.clone(), stop.clone(), revivals.clone(), losts.clone());
        threads.push(std::thread::spawn(move || {
            let mut was_lost = false;
            while !stop.load(Ordering::Relaxed) {
                match guard.state() {
                    LockState::Lost(LossReason::LeaseExpired) => {
                        if !was_lost {
                            losts.fetch_add(1, Ordering::Relaxed);
                        }
                        was_lost = true;
                    },
                    LockState::Held if was_lost => {
                        revivals.fetch_add(1, Ordering::Relaxed);
                        was_lost = false;
                    },
                    _ => {},
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    println!(
        "observed Lost {} times, then Held again {} times",
        losts.load(Ordering::Relaxed),
        revivals.load(Ordering::Relaxed)
    );
    println!("final state {:?}", guard.state());
    drop(guard);
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(revivals.load(Ordering::Relaxed), 0, "state() read Held after it read Lost(LeaseExpired)");
}

/// A fenced write committed just before the lease runs out, on a slow link: the guard reports
/// Lost (state and lost()) at the lease instant, yet the server applies the write afterwards and
/// commit() returns Ok (review F). Kept as the documented behaviour: checked when sent; a write
/// started after the loss is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f5_fenced_write_in_flight_applied_after_lost() {
    let path = unique_path("rf-inflight");
    let observer = client().await;
    let counter = make_counter(&observer).await;
    let proxy = FaultProxy::start(zookeeper().await.connect_string()).await.unwrap();
    let connector = zookeeper().await.connector().with_session_timeout(Duration::from_secs(20));
    let holder_client = connector.connect(&proxy.addr()).await.unwrap();
    let mutex = InterProcessMutex::new(holder_client.clone(), &path).unwrap();
    let lease = Duration::from_millis(1000);
    let guard = Arc::new(mutex.acquire_with_lease(lease).await.unwrap());
    let granted = Instant::now();
    proxy.delay_requests(&[op::MULTI], Duration::from_millis(1500));
    // Sent half a lease before it runs out (100 ms before, a loaded machine overslept the lease:
    // the precondition read `Lost`), answered 1.5 s later, after the loss.
    tokio::time::sleep(lease / 2).await;
    assert_eq!(guard.state(), LockState::Held);
    let g = guard.clone();
    let c = counter.clone();
    let commit = tokio::spawn(async move {
        let mut w = g.fenced_writer();
        w.add_set_data(&c, b"late", None).unwrap();
        let r = w.commit().await;
        (Instant::now(), r.map(|_| ()))
    });
    let reason = guard.lost().await;
    let told = Instant::now();
    println!("told {reason:?} at {:?} after grant; state now {:?}", told - granted, guard.state());
    assert_eq!(reason, LossReason::LeaseExpired);
    let data_at_told = observer.get_data(&counter).await.unwrap().0;
    let (done, r) = commit.await.unwrap();
    let data = observer.get_data(&counter).await.unwrap().0;
    println!(
        "data when told: {:?}; commit finished {:?} after told: {:?}; data now {:?}",
        String::from_utf8_lossy(&data_at_told),
        done - told,
        r,
        String::from_utf8_lossy(&data)
    );
    proxy.delay_requests(&[], Duration::ZERO);
    // Documented (`LockGuard::extend`): a fenced write is checked when it is sent, and one sent
    // before the lease ran out may still be applied after `lost()` resolved — before the
    // library's delete, which follows it on the same session, so no later holder's write comes
    // between. A write started after the loss is refused and never applied.
    let _ = r;
    let mut late = guard.fenced_writer();
    late.add_set_data(&counter, b"after", None).unwrap();
    assert!(matches!(late.commit().await, Err(FencedWriteError::LockLost)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_ne!(observer.get_data(&counter).await.unwrap().0, b"after", "a write started after the loss was applied");
}

/// A released hold with a long lease leaves its timer task sleeping until the lease instant:
/// tasks pile up with the number of acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f6_released_leases_leave_timer_tasks_behind() {
    let path = unique_path("rf-tasks");
    let client = client().await;
    let mutex = InterProcessMutex::builder(client.clone(), &path).lease(Duration::from_secs(3600)).build().unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let g = mutex.acquire().await.unwrap();
    g.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = metrics.num_alive_tasks();
    for _ in 0..200 {
        let g = mutex.acquire().await.unwrap();
        g.release().await.unwrap();
    }
    // Each release's delete runs as a task until its reply; on a loaded machine some are still
    // running after a fixed pause. A timer task left behind sleeps for the hour's lease (CI saw 28
    // of 200 alive: timers that had started before their hold was released, which nothing woke):
    // waiting up to 20 s tells the two apart.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let mut after = metrics.num_alive_tasks();
    while after >= before + 5 && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = metrics.num_alive_tasks();
    }
    println!("alive tasks before {before}, after 200 leased acquire/release: {after} ({:?} later)", started.elapsed());
    assert!(after < before + 5, "{} tasks left alive by 200 released holds", after - before);
}

/// Duration::ZERO: acquire_with_lease returns a guard already lost?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f7_zero_lease() {
    let path = unique_path("rf-zero");
    let client = client().await;
    let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
    let r = mutex.acquire_with_lease(Duration::ZERO).await;
    match &r {
        Ok(g) => println!("acquire_with_lease(ZERO) -> Ok(guard), state {:?}", g.state()),
        Err(e) => println!("acquire_with_lease(ZERO) -> Err({e})"),
    }
    drop(r);
    assert_no_nodes_left_while_open(&client, &path, std::slice::from_ref(&client), Duration::from_secs(10)).await;
}

/// f4 repeated: many holds, each a chance for an extend preempted between its check and its store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4b_extend_revival_repeated() {
    let client = zookeeper()
        .await
        .connector()
        .with_session_timeout(Duration::from_secs(30))
        .connect(zookeeper().await.connect_string())
        .await
        .unwrap();
    let total_revivals = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut rounds = 0;
    while Instant::now() < deadline {
        rounds += 1;
        let path = unique_path("rf-revive2");
        let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let guard = Arc::new(mutex.acquire_with_lease(Duration::from_secs(3600)).await.unwrap());
                tx.send(guard.clone()).unwrap();
                done_rx.recv().unwrap();
                drop(guard);
            });
        });
        let guard = rx.recv().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for _ in 0..4 {
            let (guard, stop) = (guard.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if guard.extend(Duration::from_micros(100)).is_err() {
                        std::thread::yield_now();
                    }
                }
            }));
        }
        let (g, st, rv) = (guard.clone(), stop.clone(), total_revivals.clone());
        let observer = std::thread::spawn(move || {
            let mut was_lost = false;
            let until = Instant::now() + Duration::from_millis(600);
            while Instant::now() < until {
                match g.state() {
                    LockState::Lost(LossReason::LeaseExpired) => was_lost = true,
                    LockState::Held if was_lost => {
                        rv.fetch_add(1, Ordering::Relaxed);
                        was_lost = false;
                    },
                    _ => {},
                }
            }
            st.store(true, Ordering::Relaxed);
        });
        observer.join().unwrap();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        done_tx.send(()).unwrap();
        holder.join().unwrap();
    }
    println!(
        "{rounds} rounds: state read Held after Lost(LeaseExpired) {} times",
        total_revivals.load(Ordering::Relaxed)
    );
    assert_eq!(total_revivals.load(Ordering::Relaxed), 0);
}
