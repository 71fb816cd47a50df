//! What differs between lock recipes: given the lock nodes ahead of ours, do we hold the lock,
//! and whose deletion do we wait for? (Curator's `LockInternalsDriver`.)

use crate::engine::naming::LockChild;

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
    /// The name lock nodes of this recipe carry before the sequence number (`lock-`).
    fn lock_name(&self) -> &'static str;

    /// Decides from the lock nodes ahead of ours, nearest first. Drivers read only as far as
    /// they need, so a decision usually costs O(1) however long the queue is.
    fn decide(&self, ahead_nearest_first: &mut dyn Iterator<Item = &LockChild>) -> Decision;
}

/// Curator's `StandardLockInternalsDriver`: the first `max_leases` nodes hold the lock, and
/// everyone else waits for the node `max_leases` places ahead of it. A mutex has one lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StandardDriver {
    pub lock_name: &'static str,
    pub max_leases: usize,
}

impl LockDriver for StandardDriver {
    fn lock_name(&self) -> &'static str {
        self.lock_name
    }

    fn decide(&self, ahead_nearest_first: &mut dyn Iterator<Item = &LockChild>) -> Decision {
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
        LockChild { name: format!("lock-{sequence:010}"), sequence }
    }

    #[test]
    fn mutex_watches_immediate_predecessor() {
        let d = StandardDriver { lock_name: "lock-", max_leases: 1 };
        let ahead = [child(3), child(2), child(1)];
        assert_eq!(d.decide(&mut [].iter()), Decision::Acquired);
        assert_eq!(d.decide(&mut ahead.iter()), Decision::WaitFor(child(3)));
    }

    #[test]
    fn leases_wait_for_the_node_max_leases_ahead() {
        let d = StandardDriver { lock_name: "lease-", max_leases: 2 };
        assert_eq!(d.decide(&mut [child(1)].iter()), Decision::Acquired);
        assert_eq!(d.decide(&mut [child(5), child(4), child(1)].iter()), Decision::WaitFor(child(4)));
    }
}
