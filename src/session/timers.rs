//! A session's timers: instants on the session's clock at which something of the session must be
//! looked at again (a hold's lease running out), all driven by one task of the session while any
//! is set — not a task each (issue 24: a task per leased hold kept 384 B of heap, and 0.7 KB
//! resident, beside the hold).
//!
//! A timer is a key in one ordered map, with a weak reference to what it calls: 10,000 leased
//! holds cost 10,000 map entries, and nothing runs while no instant passes. Whoever sets a timer
//! cancels it when it is no longer wanted (a hold that ends), so the map holds only live timers.
//!
//! # The driver is never stalled by the thread that set a timer
//! A timer set by a task on a runtime worker may start or wake the driver task from that worker:
//! it would sit in the worker's LIFO slot, which no other worker steals from, and a holder that
//! then blocks its thread (the hung holder a lease exists for) would stall every timer of the
//! session. The caller moves it out ([`Session::set_timer`](super::monitor::Session::set_timer),
//! as for the own-node watch driver: review K).
//!
//! # Which runtime
//! The driver runs on the runtime of the caller that started it (a lease's holder), as a task per
//! lease did. A session used from several runtimes shares one driver: should its runtime shut
//! down while timers set from another remain, those wait for the next timer set on the session
//! (a lease that ran out still reads `Lost(LeaseExpired)` on its holder's side; its node goes
//! when that timer is set or its guards are dropped).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::sync::lock;

/// What a timer calls once its instant has passed.
pub(crate) trait Due: Send + Sync {
    /// The timer `key` fired: its instant has passed by the session's clock. Called outside every
    /// lock of the timers, so it may set or cancel timers.
    fn due(self: Arc<Self>, key: TimerKey);
}

/// A timer: its instant, and a number that tells it from every other timer of the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TimerKey(Instant, u64);

impl TimerKey {
    /// When it fires, on the session's clock.
    pub(crate) fn at(self) -> Instant {
        self.0
    }
}

/// A session's timers, and whether their driver task runs.
#[derive(Default)]
pub(crate) struct Timers {
    queue: Mutex<Queue>,
    /// Wakes the driver: a timer was set before the instant it sleeps until.
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    timers: BTreeMap<TimerKey, Weak<dyn Due>>,
    next: u64,
    /// The driver task runs (or is spawned and about to).
    running: bool,
    /// The instant the driver sleeps until, if it sleeps on one: a timer set before it must wake
    /// the driver. (While it runs the timers that fired, it reads the map again before sleeping.)
    sleeping_until: Option<Instant>,
}

/// What the caller of [`Timers::set`] or [`Timers::cancel`] must do for the driver.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Nothing: it runs and will see the new timer in time.
    Nothing,
    /// It was woken: move it off this worker.
    Woken,
    /// Spawn `drive`: no driver runs.
    Spawn,
}

impl Timers {
    /// Sets a timer at `at` that calls `due`; `now` is the session's clock now.
    pub(crate) fn set(&self, at: Instant, due: Weak<dyn Due>, now: Instant) -> (TimerKey, Start) {
        let mut queue = lock(&self.queue);
        let key = TimerKey(at, queue.next);
        queue.next += 1;
        queue.timers.insert(key, due);
        if !std::mem::replace(&mut queue.running, true) {
            return (key, Start::Spawn);
        }
        // Earlier than the driver sleeps until, or the driver overslept it: a suspended machine's
        // sleep stretches tokio's timers, not the session's clock (review AD).
        if queue.sleeping_until.is_some_and(|until| at < until || until <= now) {
            queue.sleeping_until = Some(at);
            drop(queue);
            // Keeps a permit if the driver is between reading the map and waiting.
            self.wake.notify_one();
            return (key, Start::Woken);
        }
        (key, Start::Nothing)
    }

    /// Cancels the timer `key`, if it has not fired. The last one cancelled wakes the driver, which
    /// then ends: it would otherwise sleep until the cancelled instant (an hour's lease), the
    /// session's state kept alive with it.
    pub(crate) fn cancel(&self, key: TimerKey) -> Start {
        let mut queue = lock(&self.queue);
        if queue.timers.remove(&key).is_none() || !queue.timers.is_empty() || queue.sleeping_until.is_none() {
            return Start::Nothing;
        }
        queue.sleeping_until = None;
        drop(queue);
        self.wake.notify_one();
        Start::Woken
    }

    /// Timers set and not yet fired or cancelled.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.queue).timers.len()
    }
}

/// The driver's task, made before it is spawned: marks the driver stopped if its task ends before
/// it finished — a runtime shutting down drops it mid-sleep, or before its first poll (review AD:
/// a driver dropped unpolled left the timers "running" for good) —, so that the next timer set
/// spawns it again.
pub(crate) struct Driver<S: Send + Sync + 'static> {
    owner: Arc<S>,
    timers: fn(&S) -> &Timers,
    now: fn(&S) -> Instant,
    finished: bool,
}

impl<S: Send + Sync + 'static> Driver<S> {
    /// The driver of the timers `timers` finds in `owner`, `now` reading the session's clock. Make
    /// it when [`Timers::set`] says [`Start::Spawn`], and spawn [`drive`](Self::drive) (dropped
    /// instead, it lets the next timer set spawn a driver).
    pub(crate) fn new(owner: Arc<S>, timers: fn(&S) -> &Timers, now: fn(&S) -> Instant) -> Driver<S> {
        Driver { owner, timers, now, finished: false }
    }

    /// Fires each timer whose instant has passed, in order, and sleeps until the next. Ends once
    /// none is set; [`Timers::set`] says when to spawn a driver again.
    pub(crate) async fn drive(mut self) {
        let owner = self.owner.clone();
        let this = (self.timers)(&owner);
        loop {
            let (fired, sleep) = {
                let mut queue = lock(&this.queue);
                let now = (self.now)(&owner);
                let mut fired = Vec::new();
                while let Some(entry) = queue.timers.first_entry() {
                    if entry.key().at() > now {
                        break;
                    }
                    fired.push(entry.remove_entry());
                }
                let next = queue.timers.first_key_value().map(|(key, _)| key.at());
                if fired.is_empty() && next.is_none() {
                    // Marked stopped in the same step that saw the map empty: a timer set after
                    // it spawns a new driver.
                    queue.running = false;
                    queue.sleeping_until = None;
                    self.finished = true;
                    return;
                }
                queue.sleeping_until = if fired.is_empty() { next } else { None };
                (fired, next.map(|next| next.saturating_duration_since(now)))
            };
            if !fired.is_empty() {
                for (key, due) in fired {
                    let Some(due) = due.upgrade() else { continue };
                    // Already out of the map, the timers after it in this batch would never fire
                    // were a panic in one to end the driver here (a lease that never runs out): it
                    // is reported, and the batch goes on.
                    // The report is guarded too: it runs the application's `tracing` subscriber
                    // (review AF).
                    let fired = std::panic::AssertUnwindSafe(|| due.due(key));
                    if std::panic::catch_unwind(fired).is_err() {
                        let report = || {
                            tracing::error!(
                                ?key,
                                "a session timer panicked when it fired; the others fire all the same"
                            )
                        };
                        let _ = std::panic::catch_unwind(report);
                    }
                }
                continue;
            }
            let Some(sleep) = sleep else { continue };
            // The session's clock counts a suspended machine's sleep and tokio's timers do not:
            // woken late after a suspension, the map is read against the session's clock all the
            // same (and a timer set meanwhile wakes the driver: `Timers::set`).
            tokio::select! {
                () = tokio::time::sleep(sleep) => {},
                () = this.wake.notified() => {},
            }
        }
    }
}

impl<S: Send + Sync + 'static> Drop for Driver<S> {
    fn drop(&mut self) {
        if !self.finished {
            let mut queue = lock(&(self.timers)(&self.owner).queue);
            queue.running = false;
            queue.sleeping_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[derive(Default)]
    struct Owner {
        timers: Timers,
    }

    struct Counter {
        fired: AtomicUsize,
        keys: Mutex<Vec<TimerKey>>,
    }

    impl Due for Counter {
        fn due(self: Arc<Self>, key: TimerKey) {
            self.fired.fetch_add(1, Ordering::SeqCst);
            lock(&self.keys).push(key);
        }
    }

    fn start(owner: &Arc<Owner>, start: Start) {
        if start == Start::Spawn {
            tokio::spawn(Driver::new(owner.clone(), |owner| &owner.timers, |_| Instant::now()).drive());
        }
    }

    impl Timers {
        fn set_now(&self, at: Instant, due: Weak<dyn Due>) -> (TimerKey, Start) {
            self.set(at, due, Instant::now())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_dropped_before_its_first_poll_lets_the_next_timer_spawn_one() {
        let owner = Arc::new(Owner::default());
        let counter = Arc::new(Counter { fired: AtomicUsize::new(0), keys: Mutex::new(Vec::new()) });
        let due = Arc::downgrade(&counter) as Weak<dyn Due>;
        let (_, spawn) = owner.timers.set_now(Instant::now() + Duration::from_secs(1), due.clone());
        assert_eq!(spawn, Start::Spawn);
        // As a runtime shutting down drops a task it never polled.
        drop(Driver::new(owner.clone(), |owner| &owner.timers, |_| Instant::now()));
        let (_, again) = owner.timers.set_now(Instant::now() + Duration::from_secs(2), due);
        assert_eq!(again, Start::Spawn, "the dropped driver left the timers marked running");
        start(&owner, again);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(counter.fired.load(Ordering::SeqCst), 2, "both timers fired");
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_set_after_the_driver_overslept_wakes_it() {
        let owner = Arc::new(Owner::default());
        let counter = Arc::new(Counter { fired: AtomicUsize::new(0), keys: Mutex::new(Vec::new()) });
        let due = Arc::downgrade(&counter) as Weak<dyn Due>;
        let base = Instant::now();
        let (_, spawn) = owner.timers.set_now(base + Duration::from_secs(60), due.clone());
        start(&owner, spawn);
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The session's clock jumped past what the driver sleeps until (a suspension): a timer
        // set now, later than that, still wakes it.
        let (_, woken) = owner.timers.set(base + Duration::from_secs(61), due, base + Duration::from_secs(3600));
        assert_eq!(woken, Start::Woken);
    }

    #[tokio::test(start_paused = true)]
    async fn fires_in_order_skips_cancelled_and_stops_when_none_is_left() {
        let owner = Arc::new(Owner::default());
        let counter = Arc::new(Counter { fired: AtomicUsize::new(0), keys: Mutex::new(Vec::new()) });
        let due: Weak<dyn Due> = Arc::downgrade(&counter) as Weak<dyn Due>;
        let base = Instant::now();
        let (late, first) = owner.timers.set_now(base + Duration::from_secs(30), due.clone());
        assert_eq!(first, Start::Spawn);
        start(&owner, first);
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Earlier than the one the driver sleeps until: it is woken.
        let (early, woken) = owner.timers.set_now(base + Duration::from_secs(10), due.clone());
        assert_eq!(woken, Start::Woken);
        let (cancelled, _) = owner.timers.set_now(base + Duration::from_secs(20), due.clone());
        assert_eq!(owner.timers.cancel(cancelled), Start::Nothing, "others are set");
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(*lock(&counter.keys), vec![early]);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(*lock(&counter.keys), vec![early, late]);
        assert_eq!(owner.timers.len(), 0);
        assert!(!lock(&owner.timers.queue).running, "the driver ends once no timer is set");
        // And starts again.
        let (again, spawn) = owner.timers.set_now(Instant::now() + Duration::from_secs(1), due);
        assert_eq!(spawn, Start::Spawn);
        start(&owner, spawn);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*lock(&counter.keys), vec![early, late, again]);
        // The last timer cancelled ends the driver at once.
        let (hour, spawn) =
            owner.timers.set_now(Instant::now() + Duration::from_secs(3600), Arc::downgrade(&counter) as Weak<dyn Due>);
        start(&owner, spawn);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(owner.timers.cancel(hour), Start::Woken);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!lock(&owner.timers.queue).running, "the driver ends once its last timer is cancelled");
        assert_eq!(*lock(&counter.keys), vec![early, late, again]);
    }

    /// Panics when it fires.
    struct Panics;

    impl Due for Panics {
        fn due(self: Arc<Self>, _key: TimerKey) {
            panic!("a timer's due panicked (on purpose)");
        }
    }

    /// A timer whose `due` panics does not cost the timers that fire in the same batch after it,
    /// nor later ones: the driver goes on.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_timer_does_not_drop_the_others_of_its_batch() {
        let owner = Arc::new(Owner::default());
        let counter = Arc::new(Counter { fired: AtomicUsize::new(0), keys: Mutex::new(Vec::new()) });
        let panics = Arc::new(Panics);
        let at = Instant::now() + Duration::from_secs(1);
        // Set first: the lowest key of the batch, fired first.
        let (_, spawn) = owner.timers.set_now(at, Arc::downgrade(&panics) as Weak<dyn Due>);
        start(&owner, spawn);
        let (second, _) = owner.timers.set_now(at, Arc::downgrade(&counter) as Weak<dyn Due>);
        let (third, _) = owner.timers.set_now(at, Arc::downgrade(&counter) as Weak<dyn Due>);
        let (later, _) = owner.timers.set_now(at + Duration::from_secs(1), Arc::downgrade(&counter) as Weak<dyn Due>);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(*lock(&counter.keys), vec![second, third, later]);
        assert_eq!(owner.timers.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_whose_owner_is_gone_is_dropped_when_it_fires() {
        let owner = Arc::new(Owner::default());
        let counter = Arc::new(Counter { fired: AtomicUsize::new(0), keys: Mutex::new(Vec::new()) });
        let (_, start_it) =
            owner.timers.set_now(Instant::now() + Duration::from_secs(1), Arc::downgrade(&counter) as Weak<dyn Due>);
        start(&owner, start_it);
        drop(counter);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(owner.timers.len(), 0);
        assert!(!lock(&owner.timers.queue).running);
    }
}
