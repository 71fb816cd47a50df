//! Time for the session monitor's loss deadline: a clock that keeps counting while the machine is
//! suspended.
//!
//! The deadline compares how long ago the leader last vouched for our session with the session
//! timeout. The leader's clock runs on while *this* machine (or VM) is suspended, but
//! `CLOCK_MONOTONIC` — what `std::time::Instant` and `tokio::time::Instant` count — stops. After a
//! resume, a deadline counted on it would still lie ahead although the leader may have expired the
//! session long ago, and a hold would say `Held`.
//!
//! So the monitor reads time as `Instant::now() + suspended()`: the monotonic clock plus every
//! suspension since the process started. On Linux, `suspended()` is the growth of
//! `CLOCK_BOOTTIME − CLOCK_MONOTONIC` (the two differ exactly by the time spent suspended; both
//! are slewed alike by NTP). A suspension therefore moves this clock forward by its length, and
//! all evidence older than the gap is, correctly, that much older: a deadline that passed while
//! suspended has passed when the machine resumes. Timers are still set on the monotonic clock
//! ([`Clock::monotonic`]); the monitor re-reads this clock whenever it wakes (at the latest at
//! its next heartbeat, `0.22 T`) and every `state()` call reads it, so a resumed holder is told at
//! once when it looks, and within a heartbeat period when it does not.
//!
//! Elsewhere `suspended()` is zero (documented in the README's Limits): macOS's monotonic clock
//! also stops during sleep, and no suspend-counting clock is read there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The monitor's clock: monotonic time plus the time the machine spent suspended.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    /// Suspension faked by tests (nanoseconds), added to the real one.
    #[cfg(test)]
    pub(crate) fake_suspend_nanos: AtomicU64,
}

impl Clock {
    /// Now, counting suspended time.
    pub(crate) fn now(&self) -> Instant {
        Instant::now() + self.suspended()
    }

    /// When the monotonic clock (tokio's timers) reaches the instant `at` of this clock, as far as
    /// we can tell now (a later suspension makes it sooner, never later).
    pub(crate) fn monotonic(&self, at: Instant) -> Instant {
        at.checked_sub(self.suspended()).unwrap_or(at)
    }

    /// The time the machine spent suspended since the process first asked.
    pub(crate) fn suspended(&self) -> Duration {
        #[cfg(test)]
        let fake = Duration::from_nanos(self.fake_suspend_nanos.load(Ordering::SeqCst));
        #[cfg(not(test))]
        let fake = Duration::ZERO;
        suspended_since_start() + fake
    }
}

/// How much `CLOCK_BOOTTIME − CLOCK_MONOTONIC` grew since the first call; never decreases.
fn suspended_since_start() -> Duration {
    static BASELINE: AtomicU64 = AtomicU64::new(u64::MAX);
    static HIGHEST: AtomicU64 = AtomicU64::new(0);
    let Some(gap) = boot_minus_monotonic_nanos() else { return Duration::ZERO };
    let baseline = match BASELINE.compare_exchange(u64::MAX, gap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => gap,
        Err(baseline) => baseline,
    };
    // The two clocks are read one after the other: jitter of a few microseconds either way. The
    // gap itself only grows, so keep the highest value seen.
    let grown = gap.saturating_sub(baseline);
    Duration::from_nanos(HIGHEST.fetch_max(grown, Ordering::SeqCst).max(grown))
}

#[cfg(target_os = "linux")]
fn boot_minus_monotonic_nanos() -> Option<u64> {
    use std::ffi::{c_int, c_long};

    /// `struct timespec` of the platform's default ABI (`time_t` and `long` are both `long`).
    #[repr(C)]
    struct Timespec {
        tv_sec: c_long,
        tv_nsec: c_long,
    }
    const CLOCK_MONOTONIC: c_int = 1;
    const CLOCK_BOOTTIME: c_int = 7;
    extern "C" {
        fn clock_gettime(clock: c_int, time: *mut Timespec) -> c_int;
    }
    let read = |clock| {
        let mut time = Timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `clock_gettime` (POSIX, in the C library std links) writes one `timespec`
        // through a valid, exclusive pointer to a `repr(C)` struct of that layout, and reads
        // nothing else.
        let status = unsafe { clock_gettime(clock, &mut time) };
        (status == 0).then(|| {
            u64::try_from(time.tv_sec).unwrap_or(0).saturating_mul(1_000_000_000)
                + u64::try_from(time.tv_nsec).unwrap_or(0)
        })
    };
    let monotonic = read(CLOCK_MONOTONIC)?;
    let boot = read(CLOCK_BOOTTIME)?;
    Some(boot.saturating_sub(monotonic))
}

#[cfg(not(target_os = "linux"))]
fn boot_minus_monotonic_nanos() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_read_and_suspension_only_grows() {
        #[cfg(target_os = "linux")]
        assert!(boot_minus_monotonic_nanos().is_some(), "CLOCK_BOOTTIME must be readable on Linux");
        let clock = Clock::default();
        let first = clock.suspended();
        // Not suspended while the test runs (microseconds of read jitter are absorbed).
        assert!(first < Duration::from_millis(50), "{first:?}");
        let before = clock.now();
        clock.fake_suspend_nanos.store(5_000_000_000, Ordering::SeqCst);
        let after = clock.now();
        assert!(after - before >= Duration::from_secs(5));
        assert!(clock.suspended() >= Duration::from_secs(5));
        // A timer for an instant of this clock fires that much earlier on the monotonic clock.
        let at = after + Duration::from_secs(1);
        assert!(clock.monotonic(at) <= Instant::now() + Duration::from_secs(1));
    }
}
