//! Review AG (`0e2070e`, read only; these tests written with the fixes): what the application's
//! code inside `Hold::end` may do to a hold its owner ends, and a lock-delay mark nobody waited for.
//! - B1: a `tracing` subscriber (or metrics recorder) that panics between the hold's loss and its
//!   node's delete left the node in place, the hold already ended and untracked: nothing deleted
//!   it while the session lived. The delete is now sent however `Hold::end` ends.
//! - B2: in that unwind, the loss hook (a started latch queueing again) ran too; a second panic
//!   there aborted the process. The hook is now guarded while unwinding.
//! - B3: a lock directory created with a mark as its data (a copy made by a tool) counted as
//!   served: the first grant stood at once, though nobody waited after seeing the directory.
//!
//! Current-thread runtimes: the session's timers run on the test's thread, so the thread-local
//! subscriber is the one a lease's expiry reports to.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LeaderLatch, LockState, LossReason};

/// A layer that panics when a span named in `names` is created for `lock_path` (spans without a
/// `lock_path` field: for any path), once `armed`.
struct PanicsOnSpans {
    names: &'static [&'static str],
    lock_path: String,
    armed: Arc<AtomicBool>,
}

#[derive(Default)]
struct LockPath(Option<String>);

impl tracing::field::Visit for LockPath {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "lock_path" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "lock_path" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicsOnSpans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if !self.armed.load(Ordering::SeqCst) || !self.names.contains(&attrs.metadata().name()) {
            return;
        }
        let mut path = LockPath::default();
        attrs.record(&mut path);
        if path.0.as_deref().is_none_or(|path| path.starts_with(&self.lock_path)) {
            panic!("review AG: the subscriber failed on a {} span (on purpose)", attrs.metadata().name());
        }
    }
}

fn install(names: &'static [&'static str], lock_path: &str) -> (tracing::subscriber::DefaultGuard, Arc<AtomicBool>) {
    use tracing_subscriber::layer::SubscriberExt;
    let armed = Arc::new(AtomicBool::new(false));
    let layer = PanicsOnSpans { names, lock_path: lock_path.to_owned(), armed: armed.clone() };
    (tracing::subscriber::set_default(tracing_subscriber::registry().with(layer)), armed)
}

/// B1: a mutex hold whose lease runs out while the subscriber panics on its `release` span: the
/// guard reads `Lost(LeaseExpired)` and the node is deleted while the session is open.
#[tokio::test]
async fn ag_a_panic_in_the_release_span_of_an_expired_lease_still_deletes_the_node() {
    let path = unique_path("rag-release-panic");
    let (_subscriber, armed) = install(&["release"], &path);
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lease(Duration::from_millis(300)).build().unwrap();
    let guard = lock.acquire().await.unwrap();
    armed.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(guard.state(), LockState::Lost(LossReason::LeaseExpired));
    assert_no_nodes_left_while_open(&client().await, &path, std::slice::from_ref(&ours), Duration::from_secs(10)).await;
    armed.store(false, Ordering::SeqCst);
    drop(guard);
}

/// B2: a started latch whose leadership's lease runs out while the subscriber panics on the
/// `release` span and on the latch's own span (its requeue's task): the process survives (a
/// second panic while unwinding aborted it), and the lost node is deleted.
#[tokio::test]
async fn ag_a_second_panic_in_the_latch_hook_while_unwinding_does_not_abort() {
    let path = unique_path("rag-latch-panic");
    let (_subscriber, armed) = install(&["release", "leader_latch"], &path);
    let ours = client().await;
    let latch = LeaderLatch::builder(ours.clone(), &path).lease(Duration::from_millis(300)).build().unwrap();
    latch.start().unwrap();
    let leadership = tokio::time::timeout(Duration::from_secs(10), latch.await_leadership()).await.unwrap().unwrap();
    let first = leadership.lock_path().to_owned();
    armed.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(leadership.state(), LockState::Lost(LossReason::LeaseExpired));
    drop(leadership);
    let (dir, name) = first.rsplit_once('/').unwrap();
    let observer = client().await;
    eventually(Duration::from_secs(10), "the lost leadership's node deleted", || async {
        !children(&observer, dir).await.iter().any(|child| child == name)
    })
    .await;
    armed.store(false, Ordering::SeqCst);
    latch.close().await.unwrap();
}

/// B3: a lock directory created with a mark as its data (as a tool copying a lock path would):
/// a `try_acquire` with a lock-delay is not granted at once; nobody waited after seeing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_a_mark_the_directory_was_created_with_does_not_count() {
    let path = unique_path("rag-copied-mark");
    let admin = client().await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    match admin.create("/zkr-tests", &[], &persistent).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {},
        Err(err) => panic!("create /zkr-tests: {err}"),
    }
    admin.create(&path, b"lock-delay served 1", &persistent).await.unwrap();
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lock_delay(Duration::from_secs(20)).build().unwrap();
    let tried = lock.try_acquire().await.unwrap();
    let granted = tried.is_some();
    drop(tried);
    assert!(!granted, "granted at once on a directory created with a mark nobody waited for");
    assert_no_nodes_left_while_open(&admin, &path, std::slice::from_ref(&ours), Duration::from_secs(10)).await;
}
