//! A small history checker for fault tests, one per lock path: every hold is recorded from the
//! moment its acquire returned until its holder stopped believing in it (released it, or was told
//! it is lost) — the interval in which an application acts as the holder.
//!
//! Checked at the end:
//! - no two holds overlap, unless the earlier holder was told `Lost` before the later one was
//!   granted (then its belief ended first, and the intervals do not overlap);
//! - fencing tokens increase in grant order;
//! - a counter written only through fenced writes equals the number of fenced writes that
//!   succeeded, give or take those whose outcome is unknown (the connection broke before the
//!   reply, or the holder stopped waiting): no write reported as refused was applied. Each write
//!   is a read followed by a fenced write of the value + 1 with the read version, so a write by
//!   a second holder in between fails with `BadVersion`, which panics at once.
//!
//! A session the test closes itself (`expire_session`: a `closeSession` sent with the session's
//! credentials, which the server acts on at once, not a timeout) has its locks revoked at that
//! instant, like an operator deleting the node: the server deletes the nodes and grants the next
//! waiter while the holder's client is only just noticing. No client can be told before the server
//! acts on someone else's `closeSession`, so a hold of a revoked session counts as ended when the
//! test started the close ([`History::revoked`]). The guarantee under test is about sessions
//! that expire because the ensemble stopped hearing from them, which the fault injection causes
//! in every other way.
//!
//! A grant is recorded when `acquire` returned, a release before `release` is called, a loss
//! when `lost()` resolved: scheduling delays (milliseconds) can shorten a recorded interval
//! against the server's view, not lengthen it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use zk_recipes::{FencedWriteError, FencingToken, LockGuard, LossReason};
use zookeeper_client as zk;

/// One hold, as its holder saw it.
#[derive(Clone, Debug)]
pub struct HoldRecord {
    pub who: String,
    pub token: i64,
    pub granted: Instant,
    /// When the holder stopped believing it holds the lock, and why (`None`: released).
    pub ended: Option<(Instant, Option<LossReason>)>,
}

pub struct History {
    /// The lock path all holds are of.
    path: String,
    holds: Mutex<Vec<HoldRecord>>,
    fenced_ok: Mutex<u64>,
    fenced_unknown: Mutex<u64>,
    /// Sessions the test closed itself: by whom, when the close was started.
    revocations: Mutex<Vec<(String, Instant)>>,
    /// Closes of a session by the test that a hold of it may have been granted during: from the
    /// start of the close until it was confirmed (see [`History::revoked_during`]).
    revoked_windows: Mutex<Vec<(String, Instant, Instant)>>,
}

/// What a history check found (it panics on a violation).
#[derive(Debug, Default)]
pub struct Summary {
    pub grants: usize,
    /// Holds told they lost the lock, by reason (revoked ones included).
    pub losses: BTreeMap<String, usize>,
    /// Holds told a loss before any revocation of their session: real losses, told by the
    /// library (the overlap check has already proved each was told before the next grant).
    pub told_losses: usize,
    pub fenced_writes: u64,
    pub fenced_unknown: u64,
}

impl History {
    /// A history of the lock at `path`.
    pub fn new(path: &str) -> History {
        History {
            path: path.to_owned(),
            holds: Mutex::default(),
            fenced_ok: Mutex::default(),
            fenced_unknown: Mutex::default(),
            revocations: Mutex::default(),
            revoked_windows: Mutex::default(),
        }
    }

    /// The test is about to close `who`'s session itself (call before `expire_session`): its
    /// holds are revoked from now on (see the module docs).
    pub fn revoked(&self, who: &str) {
        self.revoked_since(who, Instant::now());
    }

    /// The test closed `who`'s session itself, starting at `at` (record it only once the close
    /// is known to have taken effect: a failed close revokes nothing).
    pub fn revoked_since(&self, who: &str, at: Instant) {
        self.revocations.lock().unwrap().push((who.to_owned(), at));
    }

    /// The test closed `who`'s session itself between `from` (before it began) and `until` (once
    /// the close was confirmed): a hold of `who` granted in between — on the session being closed
    /// (a `LeaderLatch` requeues at once on the same session when the close takes its connection
    /// away) — counts as revoked at its grant, like one granted before `from`.
    pub fn revoked_during(&self, who: &str, from: Instant, until: Instant) {
        self.revoked_since(who, from);
        self.revoked_windows.lock().unwrap().push((who.to_owned(), from, until));
    }

    /// Every hold recorded so far, in the order of their grants.
    #[allow(dead_code)] // not every test binary using the history looks at single holds
    pub fn holds(&self) -> Vec<HoldRecord> {
        self.holds.lock().unwrap().clone()
    }

    /// Records a grant; returns the hold's index.
    pub fn granted(&self, who: &str, guard: &LockGuard) -> usize {
        self.elected(who, guard.lock_path(), guard.fencing_token())
    }

    /// Records a grant reported by its node and fencing token (a `LeaderLatch`'s
    /// `LatchEvent::Elected`); returns the hold's index.
    pub fn elected(&self, who: &str, lock_path: &str, token: FencingToken) -> usize {
        self.record(
            HoldRecord { who: who.to_owned(), token: token.as_i64(), granted: Instant::now(), ended: None },
            lock_path,
        )
    }

    /// Records a leadership reported only once its holder had begun to step down at `at` (a
    /// started `LeaderLatch` elected just before its `close` took effect, the event read after
    /// `at`): the holder never acted on it, and `close` ends it (`Lost(LatchClosed)` is told before
    /// the node's delete is sent, so before anyone else can be elected). Recorded as granted and
    /// ended at `at`, a point of its real interval but for two cases, neither of which can make
    /// the check fail wrongly: granted after `at`, in the microseconds before the close took
    /// effect (too short for another leader to be granted and step down in between); or lost
    /// before `at` (within the recorder's scheduling delay, like every loss recorded here), whose
    /// node outlives the loss by seconds (a loss is told before the session can expire).
    pub fn elected_while_stepping_down(&self, who: &str, lock_path: &str, token: FencingToken, at: Instant) -> usize {
        let hold = HoldRecord { who: who.to_owned(), token: token.as_i64(), granted: at, ended: Some((at, None)) };
        self.record(hold, lock_path)
    }

    fn record(&self, hold: HoldRecord, lock_path: &str) -> usize {
        assert!(
            lock_path.starts_with(&format!("{}/", self.path)),
            "{lock_path} is not a hold of {}: one History per lock path",
            self.path
        );
        let mut holds = self.holds.lock().unwrap();
        holds.push(hold);
        holds.len() - 1
    }

    /// The holder is about to release: its belief ends now.
    pub fn releasing(&self, hold: usize) {
        let mut holds = self.holds.lock().unwrap();
        if holds[hold].ended.is_none() {
            holds[hold].ended = Some((Instant::now(), None));
        }
    }

    /// The holder was told the lock is lost.
    pub fn lost(&self, hold: usize, reason: LossReason) {
        let mut holds = self.holds.lock().unwrap();
        if holds[hold].ended.is_none() {
            holds[hold].ended = Some((Instant::now(), Some(reason)));
        }
    }

    /// Increments the counter at `counter` through a fenced write; `true` if it was applied.
    pub async fn fenced_increment(&self, client: &zk::Client, guard: &LockGuard, counter: &str) -> bool {
        let Ok(Ok((data, stat))) = tokio::time::timeout(Duration::from_secs(5), client.get_data(counter)).await else {
            return false;
        };
        let value: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
        let mut write = guard.fenced_writer();
        write.add_set_data(counter, (value + 1).to_string().as_bytes(), Some(stat.version)).unwrap();
        // Counted as of unknown outcome while in flight: if this future is dropped (the holder
        // was told it lost the lock meanwhile), the write may still be applied.
        *self.fenced_unknown.lock().unwrap() += 1;
        let outcome = tokio::time::timeout(Duration::from_secs(5), write.commit()).await;
        let known = |ok: bool| {
            *self.fenced_unknown.lock().unwrap() -= 1;
            if ok {
                *self.fenced_ok.lock().unwrap() += 1;
            }
            ok
        };
        match outcome {
            Ok(Ok(_)) => known(true),
            Ok(Err(FencedWriteError::LockLost)) => known(false),
            // May or may not have been applied.
            Ok(Err(FencedWriteError::Request { .. })) | Err(_) => false,
            // A version mismatch would mean another holder wrote in between: the check catches it.
            Ok(Err(err)) => panic!("fenced write failed: {err}"),
        }
    }

    /// Checks the history (panicking with the offending holds) and the fenced counter's value.
    pub fn check(&self, counter_value: Option<u64>) -> Summary {
        let mut holds = self.holds.lock().unwrap().clone();
        holds.sort_by_key(|hold| hold.granted);
        let revocations = self.revocations.lock().unwrap().clone();
        let windows = self.revoked_windows.lock().unwrap().clone();
        let end = |hold: &HoldRecord| {
            if windows.iter().any(|(who, from, until)| *who == hold.who && (*from..=*until).contains(&hold.granted)) {
                return Some(hold.granted);
            }
            let revoked =
                revocations.iter().filter(|(who, at)| *who == hold.who && *at >= hold.granted).map(|(_, at)| *at).min();
            match (hold.ended.map(|(at, _)| at), revoked) {
                (Some(ended), Some(revoked)) => Some(ended.min(revoked)),
                (ended, revoked) => ended.or(revoked),
            }
        };
        for (i, earlier) in holds.iter().enumerate() {
            for later in &holds[i + 1..] {
                let overlaps = end(earlier).is_none_or(|ended| ended > later.granted);
                assert!(
                    !overlaps,
                    "two holders believed they held the lock at once:\n  {earlier:?}\n  {later:?}\n(the earlier one \
                     was not told Lost before the later grant)"
                );
            }
        }
        for pair in holds.windows(2) {
            assert!(pair[0].token < pair[1].token, "fencing tokens do not increase in grant order: {pair:?}");
        }
        let fenced_writes = *self.fenced_ok.lock().unwrap();
        let fenced_unknown = *self.fenced_unknown.lock().unwrap();
        if let Some(value) = counter_value {
            assert!(
                (fenced_writes..=fenced_writes + fenced_unknown).contains(&value),
                "the fenced counter ({value}) differs from the successful fenced writes ({fenced_writes}, and \
                 {fenced_unknown} of unknown outcome)"
            );
        }
        let mut losses = BTreeMap::new();
        let mut told_losses = 0;
        for hold in &holds {
            if let Some((told, Some(reason))) = hold.ended {
                *losses.entry(format!("{reason:?}")).or_default() += 1;
                if end(hold) == Some(told) {
                    told_losses += 1;
                }
            }
        }
        Summary { grants: holds.len(), losses, told_losses, fenced_writes, fenced_unknown }
    }
}
