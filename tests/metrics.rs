//! The `metrics` feature: every documented metric is recorded, with its labels, against a real
//! ZooKeeper (`cargo test --features metrics --test metrics`; `.ci/run` runs it).
#![cfg(feature = "metrics")]

mod common;

use std::time::Duration;

use common::{client, eventually, unique_path, zookeeper};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use zk_recipes::{
    InterProcessMutex, InterProcessReadWriteLock, LeaderLatch, LeaderSelector, LossReason, ManagedClient,
};
use zk_testcontainers::expire_session;

/// One recorded metric: its name, its labels, its value.
type Metric = (String, Vec<(String, String)>, DebugValue);

/// What was recorded since the last call (the debugging recorder drains on snapshot).
struct Recorded(Vec<Metric>);

impl Recorded {
    fn take(snapshotter: &Snapshotter) -> Recorded {
        Recorded(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
                    (key.name().to_owned(), labels, value)
                })
                .collect(),
        )
    }

    fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = &'a DebugValue> + 'a {
        self.0
            .iter()
            .filter(move |(n, l, _)| {
                n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| value)
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels).map(|v| if let DebugValue::Counter(n) = v { *n } else { 0 }).sum()
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.matching(name, labels)
            .flat_map(|v| if let DebugValue::Histogram(xs) = v { xs.iter().map(|x| x.0).collect() } else { Vec::new() })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_is_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");
    let server = zookeeper().await;
    let mutex_label = ("recipe", "mutex");

    // A managed client establishes its first session.
    let zk = ManagedClient::builder(server.connect_string())
        .session_timeout(Duration::from_secs(4))
        .connect()
        .await
        .unwrap();
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.counter("zk_recipes_sessions_created_total", &[]), 1);

    // Outcomes: acquired, not_available, timed_out, reentered.
    let path = unique_path("metrics");
    let mutex = InterProcessMutex::new(&zk, &path).unwrap();
    let other = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert!(other.try_acquire().await.unwrap().is_none());
    assert!(other.acquire_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    let recorded = Recorded::take(&snapshotter);
    for outcome in ["acquired", "not_available", "timed_out"] {
        let labels = [mutex_label, ("outcome", outcome)];
        assert_eq!(recorded.counter("zk_recipes_acquires_total", &labels), 1, "{outcome}");
        assert_eq!(recorded.samples("zk_recipes_acquire_wait_seconds", &labels).len(), 1, "{outcome}");
    }
    let timed_out = recorded.samples("zk_recipes_acquire_wait_seconds", &[("outcome", "timed_out")]);
    assert!(timed_out[0] >= 0.2, "{timed_out:?}");

    // A handoff to a waiter, and the hold time of the released hold.
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap().unwrap();
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.counter("zk_recipes_handoffs_total", &[mutex_label]), 1);
    let held = recorded.samples("zk_recipes_hold_seconds", &[mutex_label]);
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0] >= 0.5, "held through try_acquire, the 200 ms timeout and the 300 ms pause: {held:?}");

    // Re-entry inside a lock scope.
    handed.release().await.unwrap();
    let inner = mutex.clone();
    mutex.with_lock(|_guard| async move { inner.acquire().await.map(drop) }).await.unwrap().unwrap();
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.counter("zk_recipes_acquires_total", &[("outcome", "reentered")]), 1);

    // A loss: another client deletes our node.
    let guard = mutex.acquire().await.unwrap();
    client().await.delete(guard.lock_path(), None).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.unwrap();
    assert_eq!(reason, LossReason::NodeDeleted);
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.counter("zk_recipes_locks_lost_total", &[("reason", "node_deleted")]), 1);
    drop(guard);

    // A failed acquire, and a new session after an expiry.
    expire_session(server.connect_string(), &zk.client()).await.unwrap();
    let mut sessions = 0;
    eventually(Duration::from_secs(15), "a second session recorded", || {
        sessions += Recorded::take(&snapshotter).counter("zk_recipes_sessions_created_total", &[]);
        std::future::ready(sessions == 1)
    })
    .await;
    let invalid = InterProcessMutex::new(client().await, format!("{path}/child-of-a-sequential")).unwrap();
    let holder = invalid.acquire().await.unwrap();
    let below_ephemeral = InterProcessMutex::new(client().await, holder.lock_path()).unwrap();
    assert!(below_ephemeral.acquire().await.is_err());
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(recorded.counter("zk_recipes_acquires_total", &[("outcome", "failed")]), 1);
    holder.release().await.unwrap();

    // The two locks of a read/write lock record under their own labels: a read, then a write
    // handed over by it.
    let rw_path = unique_path("metrics-rw");
    let readers = InterProcessReadWriteLock::new(client().await, &rw_path).unwrap();
    let writers = InterProcessReadWriteLock::new(client().await, &rw_path).unwrap();
    let read = readers.read_lock().acquire().await.unwrap();
    let writer = tokio::spawn({
        let write = writers.write_lock();
        async move { write.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    read.release().await.unwrap();
    let write = tokio::time::timeout(Duration::from_secs(10), writer).await.unwrap().unwrap().unwrap();
    write.release().await.unwrap();
    let recorded = Recorded::take(&snapshotter);
    for recipe in ["read_lock", "write_lock"] {
        let acquired = [("recipe", recipe), ("outcome", "acquired")];
        assert_eq!(recorded.counter("zk_recipes_acquires_total", &acquired), 1, "{recipe}");
        assert_eq!(recorded.samples("zk_recipes_hold_seconds", &[("recipe", recipe)]).len(), 1, "{recipe}");
    }
    assert_eq!(recorded.counter("zk_recipes_handoffs_total", &[("recipe", "write_lock")]), 1);
    // A mutex's holds are not leaderships.
    assert_eq!(recorded.counter("zk_recipes_leadership_changes_total", &[]), 0);

    // Leader election: a latch's leadership stepped down, another lost; a selector's leadership.
    let election = unique_path("metrics-election");
    let latch = LeaderLatch::builder(client().await, &election).id("a").build().unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    leadership.release().await.unwrap();
    let leadership = latch.acquire_once().await.unwrap();
    client().await.delete(leadership.lock_path(), None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), leadership.lost()).await.unwrap();
    drop(leadership);
    let recorded = Recorded::take(&snapshotter);
    let latch_label = ("recipe", "leader_latch");
    assert_eq!(recorded.counter("zk_recipes_leadership_changes_total", &[latch_label, ("change", "elected")]), 2);
    assert_eq!(recorded.counter("zk_recipes_leadership_changes_total", &[latch_label, ("change", "stepped_down")]), 1);
    assert_eq!(recorded.counter("zk_recipes_leadership_changes_total", &[latch_label, ("change", "lost")]), 1);
    let led = recorded.samples("zk_recipes_leader_seconds", &[latch_label]);
    assert_eq!(led.len(), 2, "{led:?}");
    assert!(led.iter().any(|secs| *secs >= 0.2), "the first leadership lasted 200 ms: {led:?}");

    let selector = LeaderSelector::new(client().await, unique_path("metrics-selector")).unwrap();
    let (led_tx, mut led_rx) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move {
        selector
            .run(|_leadership| {
                let led_tx = led_tx.clone();
                async move {
                    let _ = led_tx.send(());
                    std::future::pending::<()>().await;
                }
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), led_rx.recv()).await.unwrap();
    run.abort();
    let _ = run.await;
    let recorded = Recorded::take(&snapshotter);
    let selector_label = ("recipe", "leader_selector");
    assert_eq!(recorded.counter("zk_recipes_leadership_changes_total", &[selector_label, ("change", "elected")]), 1);
    assert_eq!(
        recorded.counter("zk_recipes_leadership_changes_total", &[selector_label, ("change", "stepped_down")]),
        1
    );
}
