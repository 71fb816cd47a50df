//! What differs between lock recipes: given the lock nodes ahead of ours, do we hold the lock,
//! and whose deletion do we wait for? (Curator's `LockInternalsDriver`.)
//!
//! # What a driver must satisfy
//! The engine decides from the process's view of the directory (`view.rs`), which may still hold
//! nodes that are in fact gone, never fewer than are alive. So a driver must be *monotone*:
//!
//! > if it grants our node with a set of nodes ahead of it, it grants it with any subset of them.
//!
//! Then a grant from the view is a grant from the truth. A mutex ("nothing ahead"), a semaphore
//! ("fewer than n ahead") and a read lock ("no writer ahead") are monotone; and so is "at once",
//! the downgrade of a write hold to a read. The node a driver waits for must be one ahead of ours
//! whose deletion may change its decision, so that every wake-up is worth a decision.

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

/// Grants at once, whatever is ahead: for an acquire whose right to the lock comes from another
/// hold of the same owner (a read inside a write scope: the downgrade). Monotone trivially.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AtOnce {
    pub queue: Queue,
    pub kind: usize,
}

impl LockDriver for AtOnce {
    fn queue(&self) -> Queue {
        self.queue
    }

    fn kind(&self) -> usize {
        self.kind
    }

    fn decide(&self, _kind: usize, _ahead: &mut dyn Iterator<Item = &LockChild>) -> Decision {
        Decision::Acquired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(sequence: i64) -> LockChild {
        LockChild { name: format!("lock-{sequence:010}"), sequence, kind: 0 }
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
