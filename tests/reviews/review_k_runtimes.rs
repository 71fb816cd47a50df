//! Review K: a session used from two tokio runtimes. Every own-node watch of the session is
//! driven by one task, spawned on the runtime of whichever call started it. Before, each hold's
//! watch ran on the runtime of the call that started it.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockGuard, LockState, LossReason};
use zookeeper_client as zk;

/// On another thread, a runtime of its own (`multi`: a 1-worker multi-thread one, else a
/// current-thread one) acquires `path` on `session` and reads the hold's state (which starts the
/// own-node watch driver there, none running). Returns the runtime (idle from then on) and the
/// guard.
fn hold_on_other_runtime(session: zk::Client, path: String, multi: bool) -> (tokio::runtime::Runtime, LockGuard) {
    std::thread::spawn(move || {
        let runtime = if multi {
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
        };
        let guard = runtime.block_on(async move {
            let guard = InterProcessMutex::new(session, path).unwrap().acquire().await.unwrap();
            assert_eq!(guard.state(), LockState::Held);
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard
        });
        (runtime, guard)
    })
    .join()
    .unwrap()
}

/// Releases `guard` on `runtime` and drops the runtime, off any async context.
async fn finish(runtime: tokio::runtime::Runtime, guard: LockGuard) {
    tokio::task::spawn_blocking(move || {
        runtime.block_on(guard.release()).unwrap();
        drop(runtime);
    })
    .await
    .unwrap();
}

/// Starts the session's monitor on this runtime and leaves it lingering (T after the release),
/// with no hold and no own-node watch.
async fn monitor_here(session: &zk::Client, base: &str) {
    let guard = InterProcessMutex::new(session.clone(), format!("{base}/m")).unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// A current-thread runtime that is idle (kept, not driven: e.g. a sync wrapper's `block_on`
/// between calls) started the driver: holds taken on the main runtime must still be watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_on_a_running_runtime_are_watched_while_another_runtime_idles() {
    let base = unique_path("k-idle");
    let admin = client().await;
    let session = client().await;
    monitor_here(&session, &base).await;
    let (other, guard_a) = hold_on_other_runtime(session.clone(), format!("{base}/a"), false);

    let guard_b = InterProcessMutex::new(session.clone(), format!("{base}/b")).unwrap().acquire().await.unwrap();
    assert_eq!(guard_b.state(), LockState::Held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin.delete(guard_b.lock_path(), None).await.unwrap();
    let told = tokio::time::timeout(Duration::from_secs(5), guard_b.lost()).await;
    drop(guard_b);
    finish(other, guard_a).await;
    assert_no_nodes_left(&admin, &format!("{base}/a")).await;
    assert_eq!(
        told.unwrap_or_else(|_| panic!("hold B (main runtime) never told its node was deleted")),
        LossReason::NodeDeleted
    );
}

/// Another runtime that started the driver shuts down: holds of the main runtime (whose
/// monitor runs here) stay `Held` and watched; a watch started afterwards starts a new driver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_runtime_shutting_down_does_not_lose_this_runtimes_holds() {
    let base = unique_path("k-shutdown");
    let admin = client().await;
    let session = client().await;
    monitor_here(&session, &base).await;
    let (other, guard_a) = hold_on_other_runtime(session.clone(), format!("{base}/a"), true);

    let guard_b = InterProcessMutex::new(session.clone(), format!("{base}/b")).unwrap().acquire().await.unwrap();
    assert_eq!(guard_b.state(), LockState::Held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The other runtime goes away (its hold A with it: A's node stays until the session ends or
    // A's guard is dropped).
    tokio::task::spawn_blocking(move || drop(other)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_after_shutdown = guard_b.state();
    // Whatever B was told: a new hold's watch must start a new driver (the flag was reset).
    let guard_c = InterProcessMutex::new(session.clone(), format!("{base}/c")).unwrap().acquire().await.unwrap();
    assert_eq!(guard_c.state(), LockState::Held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin.delete(guard_c.lock_path(), None).await.unwrap();
    let c_told = tokio::time::timeout(Duration::from_secs(5), guard_c.lost()).await;
    let a_state = guard_a.state();
    drop(guard_c);
    guard_b.release().await.unwrap();
    tokio::task::spawn_blocking(move || drop(guard_a)).await.unwrap();
    drop(session);
    assert_eq!(c_told.expect("a watch after the shutdown is driven (new driver)"), LossReason::NodeDeleted);
    eprintln!("hold A (of the runtime shut down) reads {a_state:?}");
    assert_eq!(b_after_shutdown, LockState::Held, "hold B (this runtime's) lost because another runtime shut down");
}
