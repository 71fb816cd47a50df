//! What differs between lock recipes: given the lock nodes ahead of ours, do we hold the lock,
//! and whose deletion do we wait for? (Curator's `LockInternalsDriver`.)
//!
//! # What a driver must satisfy
//! The engine decides from the process's view of the directory (`view.rs`), which may still hold
//! nodes that are in fact gone, never fewer than are alive. So a driver must be *monotone*:
//!
//! > if it grants our node with a set of nodes ahead of it, it grants it with any subset of them.
//!
//! Then a grant from the view is a grant from the truth — for the nodes the view can know of. A
//! mutex ("nothing ahead"), a semaphore ("fewer than n ahead") and a read lock ("no writer ahead")
//! are monotone. The node a driver waits for must be one ahead of ours whose deletion may change
//! its decision, so that every wake-up is worth a decision.
//!
//! A queue whose nodes may be created *beside* another (a downgraded read, named with the sequence
//! number of the write node it comes from) has nodes the view may not know of: a driver of such a
//! queue says so ([`LockDriver::admits_nodes_beside`]) and names the grants that a listing must
//! confirm ([`LockDriver::confirm_grant`]); `view.rs`, *Nodes created beside another*, proves
//! that this suffices.

use crate::engine::naming::{LockChild, Queue};

/// The decision of a driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Our node holds the lock.
    Acquired,
    /// Wait until this node (ahead of ours) is gone, then decide again.
    WaitFor(LockChild),
}

/// A lock recipe's rule for who holds the lock.
pub(crate) trait LockDriver: Send + Sync {
    /// The kinds of node that queue in the lock directory.
    fn queue(&self) -> Queue;

    /// The kind of node this driver's acquires create (an index into [`queue`](Self::queue)).
    fn kind(&self) -> usize;

    /// The lock name of the nodes this driver's acquires create.
    fn lock_name(&self) -> &'static str {
        self.queue()[self.kind()]
    }

    /// Decides for a node of kind `kind` from the lock nodes ahead of it, nearest first. Drivers
    /// read only as far as they need, so a decision usually costs O(1) however long the queue is.
    /// Monotone (module docs).
    fn decide(&self, kind: usize, ahead_nearest_first: &mut dyn Iterator<Item = &LockChild>) -> Decision;

    /// Whether a node of this queue may be created *beside* another — named with the sequence
    /// number of a node alive at its creation instead of getting its own from the server (a
    /// downgraded read: Curator ≥ 5.5's and ours) — and so appear below sequence numbers already
    /// listed. False unless a recipe creates such nodes in this queue (a mutex's never has them).
    fn admits_nodes_beside(&self) -> bool {
        false
    }

    /// Whether a grant of our node of kind `kind`, decided from the view, must first be confirmed
    /// by a new listing: `ahead` are the nodes ahead of ours in the latest listing we took. True
    /// only if a node created beside one of them since could block us (`view.rs`, *Nodes created
    /// beside another*).
    fn confirm_grant(&self, _kind: usize, _ahead: &[LockChild]) -> bool {
        false
    }
}

/// Curator's `StandardLockInternalsDriver`: the first `max_leases` nodes hold the lock, and
/// everyone else waits for the node `max_leases` places ahead of it. A mutex has one lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StandardDriver {
    pub queue: Queue,
    pub kind: usize,
    pub max_leases: usize,
}

impl LockDriver for StandardDriver {
    fn queue(&self) -> Queue {
        self.queue
    }

    fn kind(&self) -> usize {
        self.kind
    }

    fn decide(&self, _kind: usize, ahead_nearest_first: &mut dyn Iterator<Item = &LockChild>) -> Decision {
        match ahead_nearest_first.nth(self.max_leases.saturating_sub(1)) {
            None => Decision::Acquired,
            Some(blocker) => Decision::WaitFor(blocker.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(sequence: i64) -> LockChild {
        LockChild { name: format!("lock-{sequence:010}").into(), sequence, kind: 0 }
    }

    #[test]
    fn mutex_watches_immediate_predecessor() {
        let d = StandardDriver { queue: &["lock-"], kind: 0, max_leases: 1 };
        let ahead = [child(3), child(2), child(1)];
        assert_eq!(d.decide(0, &mut [].iter()), Decision::Acquired);
        assert_eq!(d.decide(0, &mut ahead.iter()), Decision::WaitFor(child(3)));
    }

    #[test]
    fn leases_wait_for_the_node_max_leases_ahead() {
        let d = StandardDriver { queue: &["lease-"], kind: 0, max_leases: 2 };
        assert_eq!(d.decide(0, &mut [child(1)].iter()), Decision::Acquired);
        assert_eq!(d.decide(0, &mut [child(5), child(4), child(1)].iter()), Decision::WaitFor(child(4)));
    }
}
