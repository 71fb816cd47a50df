//! What a holder knows about its lock: [`LockState`], why it was lost ([`LossReason`]), and when
//! a disconnection counts as a loss ([`LossPolicy`]). The session monitor (`session/monitor.rs`) keeps
//! every hold's state up to date.

/// Whether a lock is still held, as far as this process can tell.
///
/// Deliberately not `#[non_exhaustive]`: these three states are the lock's contract, and a
/// `match` on them should stay exhaustive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Held: the ZooKeeper leader was heard from recently enough that it cannot have expired the
    /// session, our node exists (as far as its watch told us), and — under
    /// [`LossPolicy::Suspended`] — the connection is up and answering.
    Held,
    /// The connection is down but, under [`LossPolicy::SessionDeadline`], the session's loss
    /// deadline has not passed: the lock is probably still ours. Only that policy reports this
    /// state (a connection that is up but stops answering stays `Held` until the deadline).
    Suspended,
    /// The lock can no longer be trusted. Final: a lost guard never returns to `Held`. The reason
    /// may become more precise once: a hold lost to its connection or its deadline reports
    /// [`LossReason::SessionExpired`] once the session is known to have expired.
    Lost(LossReason),
}

impl std::fmt::Display for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockState::Held => f.write_str("held"),
            LockState::Suspended => f.write_str("suspended (connection lost, session deadline not passed)"),
            LockState::Lost(reason) => write!(f, "lost: {reason}"),
        }
    }
}

/// Why a lock was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The session expired: the server has deleted our node and may have granted the lock to
    /// someone else.
    SessionExpired,
    /// The client was closed (all its clones dropped); the server deletes our node when the
    /// session times out.
    SessionClosed,
    /// The client failed authentication; the session is unusable.
    AuthFailed,
    /// The connection was lost, or no heartbeat was answered on it for 0.4 × the session timeout,
    /// and the policy is [`LossPolicy::Suspended`]. If the same session comes back, our node is
    /// deleted so the next waiter gets the lock.
    ConnectionSuspended,
    /// The session's loss deadline passed: the ZooKeeper leader has not confirmed the session
    /// recently enough, so it may expire it soon (this is declared before it can). Under either
    /// policy; it is what catches a server cut off from the leader that keeps answering us. If
    /// the same session comes back, our node is deleted.
    SessionDeadlinePassed,
    /// Our lock node was deleted by another client (an operator, a revocation tool).
    NodeDeleted,
    /// The task that watches the session stopped before the hold was released (the tokio runtime
    /// shut down, or a panic): nobody can vouch for the lock any more.
    MonitorStopped,
    /// The recipe holding the lock was closed by its owner while this guard was still alive
    /// ([`LeaderLatch::close`](crate::LeaderLatch::close)): it stepped down and deleted its node.
    LatchClosed,
    /// The hold's lease ran out ([`LockBuilder::lease`](crate::LockBuilder::lease),
    /// [`LockGuard::extend`](crate::LockGuard::extend)): the library released the lock — told
    /// first, then its node deleted — although the holder had not.
    LeaseExpired,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::SessionExpired => "the ZooKeeper session expired",
            LossReason::SessionClosed => "the ZooKeeper client was closed",
            LossReason::AuthFailed => "the ZooKeeper client failed authentication",
            LossReason::ConnectionSuspended => "the connection to ZooKeeper was lost (LossPolicy::Suspended)",
            LossReason::SessionDeadlinePassed => {
                "the ZooKeeper leader has not confirmed the session recently enough (loss deadline passed)"
            },
            LossReason::NodeDeleted => "our lock node was deleted by another client",
            LossReason::MonitorStopped => "the session monitor stopped (runtime shutdown or panic)",
            LossReason::LatchClosed => "the LeaderLatch was closed (it left the election)",
            LossReason::LeaseExpired => "the hold's lease ran out (it was not extended): the lock was released",
        })
    }
}

/// When a lost connection means a lost lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossPolicy {
    /// Curator's standard policy: the lock is [`LockState::Lost`] at the first of: the connection
    /// is lost, no heartbeat was answered on it for 0.4 × the session timeout T (a stalled or
    /// one-way connection), or the session's loss deadline passed. A short network blip costs
    /// the lock.
    #[default]
    Suspended,
    /// Ride out short disconnections: the lock is [`LockState::Suspended`] while the connection is
    /// down and `Held` again if it comes back in time, but it is
    /// [`LossReason::SessionDeadlinePassed`] once the session's loss deadline passes.
    ///
    /// Under both policies the deadline is `E + 0.8 × T` (on a clock that counts time suspended), where `E` is a
    /// moment at which the ZooKeeper *leader* — the only server that expires sessions — provably
    /// knew our session was alive: the session monitor sends a `sync` (which a follower must pass
    /// to the leader) 0.22 T after each answer and derives `E` from the answers, allowing for how
    /// late a follower passes session activity to the leader. The loss is declared before the
    /// leader can expire the session. The argument and its assumptions (the server's
    /// `tickTime ≤ T/3`, the same session timeout negotiated by every server unless
    /// `min_session_timeout` states the smallest, clock rates within 3 %) are in the README, "What happens when the
    /// session is lost", and in the source of the session monitor.
    SessionDeadline,
}
