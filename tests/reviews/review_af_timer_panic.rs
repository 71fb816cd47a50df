//! Review AF (`7acd60e`: a session timer whose `due` panics is caught, logged, and the batch goes
//! on). The driver survives, but what about the hold whose lease expiry panicked half-way? A
//! lease's `due` runs code that is not the library's: the application's `tracing` subscriber (the
//! `warn!` "the hold's lease ran out" is emitted by `Holds::expire` *after* the hold is marked
//! ended and *before* it is told `Lost(LeaseExpired)` and its node's delete is sent). A subscriber
//! that panics on that event (a writer that fails, a layer with a bug) is enough:
//! - the guard reads `Held` for ever after its lease ran out (`own_state` skips the lease check
//!   once the hold is marked ended), so its holder goes on acting as the lock's holder;
//! - dropping the guard deletes nothing (`release_guard` sees the hold ended already): the lock
//!   node stays for as long as the session lives, and nobody else is ever granted the lock.
//!
//! Current-thread runtimes: the session's timer driver runs on the test's thread, so the
//! thread-local subscriber is the one its `due` logs to.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{InterProcessMutex, LockState, LossReason};

/// A `tracing` writer that panics when it is handed the lease-expiry warning (and swallows
/// everything else).
#[derive(Clone, Copy)]
struct PanicsOnLeaseExpiry;

impl std::io::Write for PanicsOnLeaseExpiry {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if String::from_utf8_lossy(buf).contains("lease ran out") {
            panic!("review AF: the application's log writer failed on the lease-expiry warning (on purpose)");
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn install() -> tracing::subscriber::DefaultGuard {
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(|| PanicsOnLeaseExpiry)
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_default(subscriber)
}

/// The lease runs out, its timer's `due` panics in the subscriber: the guard must still read
/// `Lost(LeaseExpired)` (the lease's promise: "every guard reads Lost from that instant").
#[tokio::test]
async fn af_a_lease_whose_expiry_panicked_still_reads_lost() {
    let _subscriber = install();
    let path = unique_path("raf-lease-panic-state");
    let ours = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lease(Duration::from_millis(300)).build().unwrap();
    let guard = lock.acquire().await.unwrap();
    assert_eq!(guard.state(), LockState::Held);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        guard.state(),
        LockState::Lost(LossReason::LeaseExpired),
        "the lease ran out 1.2 s ago; its timer's due panicked in the subscriber and the guard says it holds"
    );
    drop(guard);
    assert_no_nodes_left_while_open(&client().await, &path, &[ours], Duration::from_secs(10)).await;
}

/// Same panic: once the holder drops its guard, the lock node must go (cleanup promise: no node
/// left while the session is open), and another session must get the lock.
#[tokio::test]
async fn af_a_lease_whose_expiry_panicked_leaves_no_node_once_its_guard_is_dropped() {
    let _subscriber = install();
    let path = unique_path("raf-lease-panic-node");
    let ours = client().await;
    let other = client().await;
    let lock = InterProcessMutex::builder(ours.clone(), &path).lease(Duration::from_millis(300)).build().unwrap();
    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    drop(guard);
    let theirs = InterProcessMutex::new(other.clone(), &path).unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), theirs.acquire()).await;
    let left = children(&other, &path).await;
    assert!(
        matches!(granted, Ok(Ok(_))),
        "another session is not granted the lock 10 s after the lease ran out and the guard was dropped; \
         nodes under the path: {left:?}"
    );
    drop(granted);
    assert_no_nodes_left_while_open(&client().await, &path, &[ours, other], Duration::from_secs(10)).await;
}

/// A layer that panics on the lease-expiry warning of one lock path only, and on the driver's own
/// report of a panicking timer ("a session timer panicked when it fired"): an application
/// subscriber that fails on warnings and errors alike.
struct PanicsOn {
    lock_path: String,
    on_report: bool,
}

#[derive(Default)]
struct Fields {
    message: String,
    lock_path: String,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "lock_path" => self.lock_path = value.to_owned(),
            _ => {},
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "lock_path" => self.lock_path = format!("{value:?}").trim_matches('"').to_owned(),
            _ => {},
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicsOn {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message.contains("lease ran out") && fields.lock_path == self.lock_path {
            panic!("review AF: the subscriber failed on {}'s lease expiry (on purpose)", self.lock_path);
        }
        if self.on_report && fields.message.contains("a session timer panicked") {
            panic!("review AF: the subscriber failed on the driver's report (on purpose)");
        }
    }
}

/// Two leased holds whose timers fire in one batch: the first's `due` panics (its subscriber), and
/// the driver's report of that panic — `tracing::error!` outside the `catch_unwind` — panics too.
/// The driver task dies with the rest of the batch already taken out of the map: the second hold,
/// whose expiry would not panic, is never ended — its node stays while its guard lives, nobody
/// else is granted the lock (the "lease that would never run out" 7acd60e says it fixed).
#[tokio::test]
async fn af_a_panicking_report_of_a_panicking_timer_still_drops_the_rest_of_its_batch() {
    batch(true).await;
}

/// Control: the report does not panic, the batch goes on (what 7acd60e fixed holds).
#[tokio::test]
async fn af_control_a_panicking_timer_alone_does_not_drop_the_rest_of_its_batch() {
    batch(false).await;
}

async fn batch(on_report: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    let first_path = unique_path("raf-batch-first");
    let second_path = unique_path("raf-batch-second");
    let subscriber = tracing_subscriber::registry().with(PanicsOn { lock_path: first_path.clone(), on_report });
    let _subscriber = tracing::subscriber::set_default(subscriber);
    let ours = client().await;
    let other = client().await;
    let lease = Duration::from_millis(300);
    let first = InterProcessMutex::builder(ours.clone(), &first_path).lease(lease).build().unwrap();
    let second = InterProcessMutex::builder(ours.clone(), &second_path).lease(lease).build().unwrap();
    let first_guard = first.acquire().await.unwrap();
    let second_guard = second.acquire().await.unwrap();
    // Both instants pass while this (current-thread) runtime is blocked: one batch, the first's
    // timer first.
    std::thread::sleep(Duration::from_millis(800));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(second_guard.state(), LockState::Lost(LossReason::LeaseExpired));
    // The lease ends the hold with its guard alive: its node goes, another session gets the lock.
    let theirs = InterProcessMutex::new(other.clone(), &second_path).unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), theirs.acquire()).await;
    let left = children(&other, &second_path).await;
    assert!(
        matches!(granted, Ok(Ok(_))),
        "the second hold's lease ran out 1 s ago (its expiry does not panic), yet no other session is \
         granted its lock within 10 s; nodes: {left:?}"
    );
    drop((granted, first_guard, second_guard));
}
