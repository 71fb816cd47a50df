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

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
    static GAP: Gap = Gap::new();
    GAP.grown(boot_minus_monotonic)
}

/// A reading of `CLOCK_BOOTTIME − CLOCK_MONOTONIC` (nanoseconds, signed: in a time namespace the
/// two clocks' offsets may put it below zero), bracketed.
///
/// The two clocks cannot be read at once: `MONOTONIC` is read at `m1`, `BOOTTIME` at `b`, and
/// `MONOTONIC` again at `m2`. `BOOTTIME` was read at a monotonic instant in `[m1, m2]`, so the
/// true gap lies in `[b − m2, b − m1]` (a suspension between two of the reads does not widen it:
/// `MONOTONIC` stops while suspended). Reading the pair once (as this module first did) gives the
/// upper end, and a thread preempted between the two reads turns its preemption, milliseconds on
/// a loaded machine, into "time suspended".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bracket {
    /// `b − m2`: the gap is no smaller.
    low: i64,
    /// `b − m1`: the gap is no larger.
    high: i64,
}

impl Bracket {
    fn width(self) -> u64 {
        self.high.abs_diff(self.low)
    }
}

/// A bracket this narrow is taken at its upper end (below). Three reads of the vDSO clocks take
/// about 80 ns; 99.99 % of brackets measured on a loaded 2-core machine were under 10 µs.
const TIGHT_NANOS: u64 = 20_000;
/// Readings per call while they come out wide (a preemption between reads tens of nanoseconds
/// apart is rare; several in a row mean a machine that barely runs us).
const TRIES: usize = 4;
/// Readings for the baseline, taken once per process, while they come out wide.
const BASELINE_TRIES: usize = 64;

/// The growth of the gap since the first reading, as the monitor's clock adds it.
///
/// *What it promises.* Let `S` be the time the machine spent suspended between the baseline and a
/// reading, `w0` the baseline bracket's width (under `TIGHT_NANOS` unless all `BASELINE_TRIES`
/// readings were preempted) and `w` this call's (under `TIGHT_NANOS` unless all `TRIES` were).
/// The value returned
/// - (a) never decreases, so the monitor's `now()` never goes back, and a request's `answered`
///   is never before its `sent`;
/// - (b) is at most `S + w0 + TIGHT_NANOS`: a preemption longer than `TIGHT_NANOS` is never kept
///   as suspension (the old reading kept any preemption, for the rest of the process);
/// - (c) is at least `S − w` — and `S − w0` once any later call's bracket was tight: a
///   suspension first seen by wide readings only is counted short by the width, milliseconds,
///   until the next tight reading (at the latest the monitor's next wake-up, `0.22 T`).
///
/// What the monitor's proof pays for these: the deadline compares intervals of this clock. An
/// over-count (b) inside an interval makes it look longer: the deadline comes early, which is
/// safe, but the pairing rule (`r_j + G ≤ s_k`) sees a gap that was not there, so it is charged
/// to (A1)'s allowance for jitter, as a scheduling delay would be; it is at most `w0 + 20 µs`,
/// taken once (a step, when the first tight reading after the baseline or after a wide-only
/// suspension lands). An under-count (c) is charged to the deadline's `0.05 T` spare: it needs a
/// real suspension *and* `TRIES` preempted readings in a row, and lasts until a tight one.
///
/// *Why.* The baseline is a bracket's lower end, so later values count at most `w0` too much. A
/// tight reading is kept at its upper end: it over-counts by at most its width, under
/// `TIGHT_NANOS`. A wide one, at its lower end: it cannot over-count at all. The highest value
/// kept is what every caller gets (a); a failed read returns it too.
struct Gap {
    baseline: AtomicI64,
    highest: AtomicU64,
}

impl Gap {
    const UNSET: i64 = i64::MIN;

    const fn new() -> Self {
        Gap { baseline: AtomicI64::new(Self::UNSET), highest: AtomicU64::new(0) }
    }

    fn grown(&self, mut read: impl FnMut() -> Option<Bracket>) -> Duration {
        let highest = || Duration::from_nanos(self.highest.load(Ordering::SeqCst));
        let Some(mut bracket) = read() else { return highest() };
        let tries = if self.baseline.load(Ordering::SeqCst) == Self::UNSET { BASELINE_TRIES } else { TRIES };
        for _ in 1..tries {
            if bracket.width() <= TIGHT_NANOS {
                break;
            }
            match read() {
                Some(again) if again.width() < bracket.width() => bracket = again,
                _ => {},
            }
        }
        let baseline =
            match self.baseline.compare_exchange(Self::UNSET, bracket.low, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => bracket.low,
                Err(baseline) => baseline,
            };
        let gap = if bracket.width() <= TIGHT_NANOS { bracket.high } else { bracket.low };
        let grown = u64::try_from(gap.saturating_sub(baseline)).unwrap_or(0);
        Duration::from_nanos(self.highest.fetch_max(grown, Ordering::SeqCst).max(grown))
    }
}

#[cfg(target_os = "linux")]
fn boot_minus_monotonic() -> Option<Bracket> {
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
        // (`c_long` is `i64` here, `i32` on 32-bit targets.)
        #[allow(clippy::useless_conversion)]
        (status == 0)
            .then(|| i64::from(time.tv_sec).saturating_mul(1_000_000_000).saturating_add(i64::from(time.tv_nsec)))
    };
    let before = read(CLOCK_MONOTONIC)?;
    let boot = read(CLOCK_BOOTTIME)?;
    let after = read(CLOCK_MONOTONIC)?;
    Some(Bracket { low: boot.saturating_sub(after), high: boot.saturating_sub(before) })
}

#[cfg(not(target_os = "linux"))]
fn boot_minus_monotonic() -> Option<Bracket> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_read_and_suspension_only_grows() {
        #[cfg(target_os = "linux")]
        assert!(boot_minus_monotonic().is_some(), "CLOCK_BOOTTIME must be readable on Linux");
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

    /// Readings as `(m1, b, m2)`: `MONOTONIC`, `BOOTTIME`, `MONOTONIC` (nanoseconds).
    fn readings(list: &[(i64, i64, i64)]) -> impl FnMut() -> Option<Bracket> + '_ {
        let mut next = list.iter();
        move || next.next().map(|&(m1, b, m2)| Bracket { low: b - m2, high: b - m1 })
    }

    const MS: i64 = 1_000_000;
    const S: i64 = 1_000_000_000;
    const TIGHT: Duration = Duration::from_nanos(TIGHT_NANOS);

    /// Review Y: a thread preempted between the reads of the two clocks counted its preemption as
    /// time suspended, and kept it for the rest of the process.
    #[test]
    fn a_preempted_reading_is_not_kept_as_suspension() {
        let gap = Gap::new();
        // The baseline: the gap is 7 s, read tightly (200 ns between the reads).
        assert_eq!(gap.grown(readings(&[(100 * S, 107 * S + 100, 100 * S + 200)])), Duration::from_nanos(200));
        // Preempted for 5 ms between MONOTONIC and BOOTTIME, every time it tries.
        let preempted = [(101 * S, 108 * S + 5 * MS, 101 * S + 5 * MS + 100); TRIES];
        let grown = gap.grown(readings(&preempted));
        assert!(grown <= 2 * TIGHT, "preemption counted as suspension: {grown:?}");
        // Preempted once, then a tight bracket: that one is taken.
        let grown = gap.grown(readings(&[
            (102 * S, 109 * S + 5 * MS, 102 * S + 5 * MS + 100),
            (102 * S, 109 * S + 100, 102 * S + 200),
        ]));
        assert!(grown <= 2 * TIGHT, "{grown:?}");
        // ... and nothing of the preemption stayed: a later tight reading sees no suspension either.
        let grown = gap.grown(readings(&[(103 * S, 110 * S + 100, 103 * S + 200)]));
        assert!(grown <= 2 * TIGHT, "{grown:?}");
    }

    #[test]
    fn a_suspension_is_counted_and_the_count_never_goes_back() {
        let gap = Gap::new();
        gap.grown(readings(&[(100 * S, 107 * S + 100, 100 * S + 200)]));
        // Suspended for 30 s: the gap is now 37 s.
        let after_suspend = gap.grown(readings(&[(101 * S, 138 * S + 100, 101 * S + 200)]));
        assert!(after_suspend >= Duration::from_secs(30), "{after_suspend:?}");
        assert!(after_suspend <= Duration::from_secs(30) + 2 * TIGHT);
        // A later reading whose brackets all come out wide (its lower end is 5 ms short) and one
        // tight reading that comes out a little lower: neither goes back.
        let wide = gap.grown(readings(&[(102 * S, 139 * S + 100, 102 * S + 5 * MS); TRIES]));
        assert!(wide >= after_suspend, "{wide:?} < {after_suspend:?}");
        let tight = gap.grown(readings(&[(103 * S, 140 * S + 50, 103 * S + 100)]));
        assert!(tight >= wide);
        // Suspended again for 2 s, first seen by wide readings only: counted short by at most the
        // bracket (5 ms), then in full by the next tight one.
        let wide = gap.grown(readings(&[(104 * S, 143 * S + 100, 104 * S + 5 * MS); TRIES]));
        assert!(wide >= Duration::from_secs(32) - Duration::from_millis(5), "{wide:?}");
        let tight = gap.grown(readings(&[(105 * S, 144 * S + 100, 105 * S + 200)]));
        assert!(tight >= Duration::from_secs(32), "{tight:?}");
        // A read that fails: what was counted stays counted.
        assert_eq!(gap.grown(|| None), tight);
        // No readable clock at all: nothing counted.
        assert_eq!(Gap::new().grown(|| None), Duration::ZERO);
    }

    /// A wide bracket is read again, and the narrowest of the tries is the one taken (review Z).
    #[test]
    fn a_wide_reading_is_retried_and_the_narrowest_taken() {
        let gap = Gap::new();
        // The baseline retries past preempted readings too, for a tight one.
        let mut baseline = vec![(100 * S, 107 * S + 100, 100 * S + 5 * MS); BASELINE_TRIES - 1];
        baseline.push((100 * S, 107 * S + 100, 100 * S + 200));
        assert_eq!(gap.grown(readings(&baseline)), Duration::from_nanos(200));
        // Suspended 2 s; the first try is preempted for 5 ms, the second is tight: counted in full.
        let grown =
            gap.grown(readings(&[(101 * S, 110 * S + 100, 101 * S + 5 * MS), (101 * S, 110 * S + 100, 101 * S + 200)]));
        assert!(grown >= Duration::from_secs(2), "{grown:?}");
        // Suspended 4 s more; every try is wide, the second the narrowest (1 ms): short by 1 ms at most.
        let grown = gap.grown(readings(&[
            (102 * S, 115 * S + 100, 102 * S + 5 * MS),
            (102 * S, 115 * S + 100, 102 * S + MS),
            (102 * S, 115 * S + 100, 102 * S + 3 * MS),
            (102 * S, 115 * S + 100, 102 * S + 4 * MS),
        ]));
        assert!(grown >= Duration::from_secs(6) - Duration::from_millis(1), "{grown:?}");
        assert!(grown <= Duration::from_secs(6) + 2 * TIGHT, "{grown:?}");
    }

    /// The real clocks give a bracket the right way round: `MONOTONIC` read before and after.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_real_bracket_is_ordered() {
        for _ in 0..1_000 {
            let bracket = boot_minus_monotonic().expect("CLOCK_BOOTTIME must be readable on Linux");
            assert!(bracket.low <= bracket.high, "{bracket:?}");
        }
    }
}
