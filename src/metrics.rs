//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, behind the `metrics` feature
//! (without it these functions compile to nothing). Names and labels are part of the public
//! contract; the README's Observability section lists them.

use std::time::Duration;

#[cfg(feature = "metrics")]
use crate::state::LossReason;

/// Every name this crate records under.
#[cfg(feature = "metrics")]
pub(crate) mod names {
    pub const ACQUIRES: &str = "zk_recipes_acquires_total";
    pub const ACQUIRE_WAIT: &str = "zk_recipes_acquire_wait_seconds";
    pub const HOLD_TIME: &str = "zk_recipes_hold_seconds";
    pub const HANDOFFS: &str = "zk_recipes_handoffs_total";
    pub const LOSSES: &str = "zk_recipes_locks_lost_total";
    pub const SESSIONS: &str = "zk_recipes_sessions_created_total";
    pub const LEADERSHIP_CHANGES: &str = "zk_recipes_leadership_changes_total";
    pub const LEADER_TIME: &str = "zk_recipes_leader_seconds";
}

/// The `recipe` label of a `LeaderLatch`'s metrics.
pub(crate) const LEADER_LATCH: &str = "leader_latch";
/// The `recipe` label of a `LeaderSelector`'s metrics.
pub(crate) const LEADER_SELECTOR: &str = "leader_selector";

/// Whether the holds of `recipe` are leaderships (recorded under the leadership names too).
#[cfg(feature = "metrics")]
fn is_leadership(recipe: &str) -> bool {
    recipe == LEADER_LATCH || recipe == LEADER_SELECTOR
}

/// How an acquire call ended (the `outcome` label).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    /// Granted a new hold.
    Acquired,
    /// Re-entered a hold of its lock scope.
    Reentered,
    /// `try_acquire`: the lock was taken.
    NotAvailable,
    /// `acquire_timeout`: not granted in time.
    TimedOut,
    /// Failed with an error.
    Failed,
}

impl Outcome {
    #[cfg(feature = "metrics")]
    fn label(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Reentered => "reentered",
            Outcome::NotAvailable => "not_available",
            Outcome::TimedOut => "timed_out",
            Outcome::Failed => "failed",
        }
    }
}

/// An acquire call of `recipe` ended after `waited`.
pub(crate) fn acquire(recipe: &'static str, outcome: Outcome, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let outcome = outcome.label();
        metrics::counter!(names::ACQUIRES, "recipe" => recipe, "outcome" => outcome).increment(1);
        metrics::histogram!(names::ACQUIRE_WAIT, "recipe" => recipe, "outcome" => outcome).record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (recipe, outcome, waited);
}

/// A hold of `recipe` was granted: for a leader election, this process became the leader.
pub(crate) fn granted(recipe: &'static str) {
    #[cfg(feature = "metrics")]
    if is_leadership(recipe) {
        metrics::counter!(names::LEADERSHIP_CHANGES, "recipe" => recipe, "change" => "elected").increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = recipe;
}

/// A grant after waiting for a predecessor (a handoff from one holder to the next).
pub(crate) fn handoff(recipe: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::HANDOFFS, "recipe" => recipe).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = recipe;
}

/// A hold of `recipe` was released after `held` (`lost` if it had been lost first): for a leader
/// election, this process stepped down or lost leadership.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn hold_ended(recipe: &'static str, held: Duration, lost: bool) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!(names::HOLD_TIME, "recipe" => recipe).record(held.as_secs_f64());
        if is_leadership(recipe) {
            let change = if lost { "lost" } else { "stepped_down" };
            metrics::counter!(names::LEADERSHIP_CHANGES, "recipe" => recipe, "change" => change).increment(1);
            metrics::histogram!(names::LEADER_TIME, "recipe" => recipe).record(held.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (recipe, held, lost);
}

/// A hold was told it lost its lock.
#[cfg(feature = "metrics")]
pub(crate) fn lost(reason: LossReason) {
    let reason = match reason {
        LossReason::SessionExpired => "session_expired",
        LossReason::SessionClosed => "session_closed",
        LossReason::AuthFailed => "auth_failed",
        LossReason::ConnectionSuspended => "connection_suspended",
        LossReason::SessionDeadlinePassed => "session_deadline_passed",
        LossReason::NodeDeleted => "node_deleted",
        LossReason::MonitorStopped => "monitor_stopped",
        LossReason::LatchClosed => "latch_closed",
        LossReason::LeaseExpired => "lease_expired",
    };
    metrics::counter!(names::LOSSES, "reason" => reason).increment(1);
}

/// A hold was told it lost its lock.
#[cfg(not(feature = "metrics"))]
pub(crate) fn lost(_reason: crate::state::LossReason) {}

/// A [`ManagedClient`](crate::ManagedClient) established a session.
pub(crate) fn session_created() {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::SESSIONS).increment(1);
}
