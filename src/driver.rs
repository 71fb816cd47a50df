//! What differs between lock recipes: given the lock nodes in queue order and the index of ours,
//! do we hold it, and whose deletion do we wait for? (Curator's `LockInternalsDriver`.)

use crate::naming::LockChild;

/// The decision of a driver for one listing of the lock directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Our node holds the lock.
    Acquired,
    /// Wait until the node at this index (in the same listing) is gone, then look again.
    WaitFor(usize),
}

/// A lock recipe's rule for who holds the lock.
pub(crate) trait LockDriver: Send + Sync {
    /// The name lock nodes of this recipe carry before the sequence number (`lock-`).
    fn lock_name(&self) -> &'static str;

    /// Decides for `children` (lock nodes only, in queue order), our node being `ours`.
    fn decide(&self, children: &[LockChild], ours: usize) -> Decision;
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

    fn decide(&self, _children: &[LockChild], ours: usize) -> Decision {
        if ours < self.max_leases {
            Decision::Acquired
        } else {
            Decision::WaitFor(ours - self.max_leases)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutex_watches_immediate_predecessor() {
        let d = StandardDriver { lock_name: "lock-", max_leases: 1 };
        assert_eq!(d.decide(&[], 0), Decision::Acquired);
        assert_eq!(d.decide(&[], 1), Decision::WaitFor(0));
        assert_eq!(d.decide(&[], 7), Decision::WaitFor(6));
    }
}
