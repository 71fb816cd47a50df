//! What a holder knows about its lock: [`LockState`], why it was lost ([`LossReason`]), and when
//! a disconnection counts as a loss ([`LossPolicy`]).
//!
//! Every hold has a small monitor task that turns the session's state
//! (`Client::state_watcher`), a data watch on our own lock node and, under
//! [`LossPolicy::SessionDeadline`], a local session deadline into the hold's [`LockState`].
//!
//! The watch on our own node costs a request, so it is set only once the holder shows interest
//! ([`LockGuard::state`](crate::LockGuard::state), `lost`, `fenced_writer`) or after
//! [`OWN_NODE_WATCH_DELAY`]: a short critical section costs no more than the create, the listing
//! and the delete it cannot avoid.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::cleanup::{Cleanup, Target};
use crate::engine::{watch_node, NodeWatch, Watched};

/// Whether a lock is still held, as far as this process can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Held: the session is connected (or, under [`LossPolicy::SessionDeadline`], was heard from
    /// recently enough that the server cannot have expired it) and our node exists.
    Held,
    /// The connection is down but, under [`LossPolicy::SessionDeadline`], the session deadline has
    /// not passed: the lock is probably still ours. Only that policy reports this state.
    Suspended,
    /// The lock can no longer be trusted. Final: a lost guard never returns to `Held`.
    Lost(LossReason),
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
    /// The connection was lost or stalled, and the policy is [`LossPolicy::Suspended`]. If the
    /// same session comes back, our node is deleted so the next waiter gets the lock.
    ConnectionSuspended,
    /// Under [`LossPolicy::SessionDeadline`]: no reply from the server for 3/4 of the negotiated
    /// session timeout, so the server may expire the session at any moment. If the same session
    /// comes back, our node is deleted.
    SessionDeadlinePassed,
    /// Our lock node was deleted by another client (an operator, a revocation tool).
    NodeDeleted,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::SessionExpired => "the ZooKeeper session expired",
            LossReason::SessionClosed => "the ZooKeeper client was closed",
            LossReason::AuthFailed => "the ZooKeeper client failed authentication",
            LossReason::ConnectionSuspended => "the connection to ZooKeeper was lost (LossPolicy::Suspended)",
            LossReason::SessionDeadlinePassed => "no reply from ZooKeeper for 3/4 of the session timeout",
            LossReason::NodeDeleted => "our lock node was deleted by another client",
        })
    }
}

/// When a lost connection means a lost lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossPolicy {
    /// Curator's standard policy: the moment the connection is lost (or stalls long enough for
    /// the client to notice), the lock is [`LockState::Lost`]. Safe without any assumption about
    /// clocks; the price is that a short network blip costs the lock.
    #[default]
    Suspended,
    /// Tolerate short disconnections: the lock is [`LockState::Suspended`] while disconnected and
    /// `Held` again if the connection comes back in time, but it is declared
    /// [`LossReason::SessionDeadlinePassed`] once `last reply from the server + 0.75 × negotiated
    /// session timeout` has passed on the monotonic clock — before the server can have expired the
    /// session, because the server measures expiry from the last request it received from us,
    /// which is no earlier than that request's send time. To keep "last reply" fresh, the monitor
    /// sends a small read (`exists` on our node) every fifth of the session timeout while the
    /// lock is held. Assumes the local clock does not run more than ~25% slower than the server's.
    SessionDeadline,
}

/// Set once, when the owner's last guard of a hold is released (before the node's delete is
/// sent): from then on nothing that happens to the node is a loss.
#[derive(Debug, Default)]
pub(crate) struct Released {
    flag: std::sync::atomic::AtomicBool,
    notify: Notify,
}

impl Released {
    pub(crate) fn set(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn is_set(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// How long a hold nobody asked about goes without a watch on its own node.
pub(crate) const OWN_NODE_WATCH_DELAY: Duration = Duration::from_millis(100);

/// The shared, watchable state of one hold.
pub(crate) type HoldState = Arc<watch::Sender<LockState>>;

/// Sets `state` to lost (once; `Lost` is final) and logs why.
fn declare_lost(state: &HoldState, path: &str, reason: LossReason) {
    let changed = state.send_if_modified(|current| {
        if matches!(current, LockState::Lost(_)) {
            return false;
        }
        *current = LockState::Lost(reason);
        true
    });
    if changed {
        warn!(lock_node = path, %reason, "lock lost");
    }
}

fn set_state(state: &HoldState, new: LockState) {
    state.send_if_modified(|current| {
        if matches!(current, LockState::Lost(_)) || *current == new {
            return false;
        }
        debug!(from = ?current, to = ?new, "lock state");
        *current = new;
        true
    });
}

fn terminal_reason(state: zk::SessionState) -> LossReason {
    match state {
        zk::SessionState::AuthFailed => LossReason::AuthFailed,
        zk::SessionState::Closed => LossReason::SessionClosed,
        _ => LossReason::SessionExpired,
    }
}

type Pending<'a, T> = Option<Pin<Box<dyn Future<Output = T> + Send + 'a>>>;

async fn poll_watch(watch: &mut Option<NodeWatch>) -> Watched {
    match watch.as_mut() {
        Some(watch) => watch.await,
        None => std::future::pending().await,
    }
}

async fn poll_pending<T>(future: &mut Pending<'_, T>) -> T {
    match future.as_mut() {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Watches one hold until it is lost or released.
///
/// `interest` is notified when the holder first looks at the state; the watch on our own node is
/// set then, or after [`OWN_NODE_WATCH_DELAY`].
pub(crate) async fn monitor_hold(
    cleanup: Cleanup,
    path: String,
    state: HoldState,
    policy: LossPolicy,
    interest: Arc<Notify>,
    released: Arc<Released>,
    own_watch: Option<NodeWatch>,
) {
    let client = cleanup.client().clone();
    let mut session = client.state_watcher();
    let timeout = client.session_timeout();
    let allowance = timeout * 3 / 4;
    // The grant was decided on a reply (or watch event) from the server just now.
    let mut last_reply = Instant::now();
    let mut heartbeat_every = tokio::time::interval_at(last_reply + timeout / 5, timeout / 5);
    heartbeat_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeat: Pending<'_, (Instant, Result<Option<zk::Stat>, zk::Error>)> = None;
    let mut watching = own_watch.is_some();
    let mut node_watch: Option<NodeWatch> = own_watch;
    let mut connected;
    let watch_at = last_reply + OWN_NODE_WATCH_DELAY;

    let lost = loop {
        if released.is_set() {
            // Our own delete fires the watch on our node: wait for it rather than dropping it
            // armed, which would cost a request to remove it.
            if let Some(watch) = node_watch.take() {
                let _ = tokio::time::timeout(timeout, watch).await;
            }
            return;
        }
        let session_state = session.state();
        match session_state {
            s if s.is_terminated() => break terminal_reason(s),
            zk::SessionState::SyncConnected => {
                connected = true;
                set_state(&state, LockState::Held);
            },
            _ => {
                connected = false;
                match policy {
                    LossPolicy::Suspended => break LossReason::ConnectionSuspended,
                    LossPolicy::SessionDeadline => set_state(&state, LockState::Suspended),
                }
            },
        }
        if watching && node_watch.is_none() {
            node_watch = Some(watch_node(client.clone(), path.clone()));
        }
        let deadline = last_reply + allowance;
        tokio::select! {
            biased;
            _ = released.notify.notified() => {},
            _ = session.changed() => {},
            _ = interest.notified(), if !watching => watching = true,
            _ = tokio::time::sleep_until(watch_at), if !watching => watching = true,
            event = poll_watch(&mut node_watch) => {
                node_watch = None;
                match event {
                    Watched::Deleted => break LossReason::NodeDeleted,
                    Watched::SessionDead(state) => break terminal_reason(state),
                    Watched::Other => {},
                }
            },
            _ = heartbeat_every.tick(), if policy == LossPolicy::SessionDeadline && connected && heartbeat.is_none() => {
                let sent = Instant::now();
                let exists = client.check_stat(&path);
                heartbeat = Some(Box::pin(async move { (sent, exists.await) }));
            },
            (sent, result) = poll_pending(&mut heartbeat) => {
                heartbeat = None;
                match result {
                    Ok(Some(_)) => last_reply = last_reply.max(sent),
                    Ok(None) => break LossReason::NodeDeleted,
                    Err(err) if crate::error::session_dead(&err) => break terminal_reason(client.state()),
                    Err(_) => {},
                }
            },
            _ = tokio::time::sleep_until(deadline), if policy == LossPolicy::SessionDeadline => {
                break LossReason::SessionDeadlinePassed
            },
        }
    };
    if released.is_set() {
        // Released while the loss was being noticed: the deletion was our own.
        return;
    }
    declare_lost(&state, &path, lost);
    if matches!(lost, LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed) {
        // We told the holder it lost the lock; if the same session comes back, nobody must wait
        // for our node. The delete queues until the connection is back, or fails harmlessly if
        // the session is gone.
        cleanup.delete(Target::Path(path));
    }
}
