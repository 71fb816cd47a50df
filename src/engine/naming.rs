//! Lock node names: Curator's protected naming and parsing of sequence numbers.
//!
//! A lock node is named `_c_<uuid>-lock-<sequence>`: `_c_<uuid>-` is Curator's "protection"
//! prefix (a GUID chosen before the create is sent, so a create whose reply was lost can be found
//! again), `lock-` is the lock name, and `<sequence>` is the 10-digit counter the server appends to
//! `EPHEMERAL_SEQUENTIAL` nodes. Curator's non-protected names (`lock-<sequence>`) are understood
//! too, so Curator and zk-recipes clients can share a lock.
//!
//! The nodes of one lock directory form one queue, ordered by sequence number (one counter, the
//! directory's). A recipe's [`Queue`] names every kind of node that queues there: a mutex's
//! `lock-` (and kazoo's `__lock__`, so a kazoo `Lock` on the same path is seen), a read/write
//! lock's `__READ__` and `__WRIT__`. Anything else in the directory is a foreign child, ignored.
//!
//! # The counter's wrap
//! The counter is the directory's internal `cversion`, a signed 32-bit number bumped by every
//! create of a child (the `cversion` a `Stat` reports counts deletes too: twice the creates minus
//! the children), printed with `%010d`: after `2147483647` the server names the next child
//! `-2147483648`, then counts up through `-0000000001` to `0000000000` (ZooKeeper's Programmer's
//! Guide says so; 2³¹ acquires of one lock path). Every lock in the family assumes that a node
//! created later sorts later, and the wrap breaks it: numerically (ours) and as strings
//! (Curator's and kazoo's sorts, where `-` sorts before any digit), a node created after the wrap
//! sorts *ahead* of every node from before it — of the holder too. So:
//! - **A node of ours with a negative sequence is never granted.** The attempt deletes it and
//!   fails with [`Error::SequenceWrapped`](crate::Error::SequenceWrapped), before any
//!   decision. Nothing of ours is ever held on a negative sequence, so whatever order those
//!   nodes take among themselves (numeric here, reversed as strings) cannot matter.
//! - **A node with a negative sequence from anyone else only delays us**: it sorts ahead of
//!   every non-negative node here, as in Curator's and kazoo's string order, so a waiter of ours
//!   counts it as ahead and waits for it. Ahead of a holder of ours it is a queue jump by that
//!   client (Curator's or kazoo's lock grants it at once, beside our holder): no client can
//!   prevent that; the README's *Limits* says so.
//! - **Recovery**: the directory is a container node (we and Curator create it so). When no
//!   child is left the server deletes it, and the next acquire creates it again with the
//!   counter at 0.

use uuid::Uuid;

/// Curator's prefix for protected (GUID-carrying) nodes.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";
/// The lock name Curator's `InterProcessMutex` uses.
pub(crate) const MUTEX_LOCK_NAME: &str = "lock-";
/// The lock name of kazoo's `Lock` (its nodes are `<hex uuid>__lock__<sequence>`).
pub(crate) const KAZOO_LOCK_NAME: &str = "__lock__";

/// The lock names whose nodes queue together in one lock directory; a node's *kind* is the index
/// of its lock name here.
pub(crate) type Queue = &'static [&'static str];

/// A mutex's queue: Curator's and ours (kind 0), and kazoo's `Lock` (kind 1), which queues in the
/// same directory with the same sequence counter.
pub(crate) const MUTEX_QUEUE: Queue = &[MUTEX_LOCK_NAME, KAZOO_LOCK_NAME];

/// The `_c_<uuid>-` part of a node name, unique to one acquire attempt.
pub(crate) fn protection(guid: &Uuid) -> String {
    format!("{PROTECTED_PREFIX}{}-", guid.as_hyphenated())
}

/// One child of the lock directory that is a lock node. Ordered as in the queue: by sequence
/// number, then by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockChild {
    /// The node name (not the full path).
    pub name: String,
    /// The sequence number the server appended.
    pub sequence: i64,
    /// Its kind: the index of its lock name in the recipe's [`Queue`].
    pub kind: usize,
}

impl Ord for LockChild {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.sequence.cmp(&other.sequence).then_with(|| self.name.cmp(&other.name))
    }
}

impl PartialOrd for LockChild {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Parses the sequence number of a lock node name: the digits after the last `lock_name`.
///
/// Returns `None` for anything else (a foreign child), which must never block or grant the lock.
pub(crate) fn parse_sequence(name: &str, lock_name: &str) -> Option<i64> {
    let at = name.rfind(lock_name)?;
    let digits = &name[at + lock_name.len()..];
    let unsigned = digits.strip_prefix('-').unwrap_or(digits);
    if unsigned.len() < 10 || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The sequence number and kind of a node of `queue` named `name`; `None` for a foreign child.
pub(crate) fn parse_child(name: &str, queue: Queue) -> Option<(i64, usize)> {
    queue.iter().enumerate().find_map(|(kind, lock_name)| parse_sequence(name, lock_name).map(|seq| (seq, kind)))
}

/// Keeps the nodes of `queue` among `children` and orders them by sequence number (queue order).
pub(crate) fn sort_lock_children(children: Vec<String>, queue: Queue) -> Vec<LockChild> {
    let mut nodes: Vec<LockChild> = children
        .into_iter()
        .filter_map(|name| parse_child(&name, queue).map(|(sequence, kind)| LockChild { name, sequence, kind }))
        .collect();
    nodes.sort();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_curator_names() {
        assert_eq!(parse_sequence("_c_9f1b2c3d-aaaa-bbbb-cccc-0123456789ab-lock-0000000042", "lock-"), Some(42));
        assert_eq!(parse_sequence("lock-0000000007", "lock-"), Some(7));
        assert_eq!(parse_sequence("lock-0000000000000000009", "lock-"), Some(9));
        assert_eq!(parse_sequence("lock--2147483648", "lock-"), Some(-2147483648));
    }

    #[test]
    fn ignores_foreign_children() {
        for name in
            ["foo", "lock-", "lock-12", "lock-abcdefghij", "lock-000000001x", "__lock__0000000001", "lease-0000000001"]
        {
            assert_eq!(parse_sequence(name, "lock-"), None, "{name}");
        }
    }

    #[test]
    fn sorts_by_sequence_not_name() {
        let children = vec![
            "_c_b-lock-0000000003".to_string(),
            "junk".to_string(),
            "_c_a-lock-0000000010".to_string(),
            "lock-0000000001".to_string(),
        ];
        let sorted = sort_lock_children(children, &["lock-"]);
        let names: Vec<_> = sorted.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["lock-0000000001", "_c_b-lock-0000000003", "_c_a-lock-0000000010"]);
    }

    #[test]
    fn a_queue_of_several_kinds() {
        let children = vec![
            "_c_b-__WRIT__0000000003".to_string(),
            "_c_a-__READ__0000000001".to_string(),
            "_c_c-lock-0000000002".to_string(),
        ];
        let sorted = sort_lock_children(children, &["__READ__", "__WRIT__"]);
        let kinds: Vec<_> = sorted.iter().map(|c| (c.sequence, c.kind)).collect();
        assert_eq!(kinds, [(1, 0), (3, 1)]);
        let kazoo = "0f1e2d3c4b5a69788796a5b4c3d2e1f0__lock__0000000007";
        assert_eq!(parse_child(kazoo, MUTEX_QUEUE), Some((7, 1)));
        assert_eq!(parse_child("_c_x-lock-0000000008", MUTEX_QUEUE), Some((8, 0)));
        assert_eq!(parse_child("_c_x-__READ__0000000008", MUTEX_QUEUE), None);
    }

    #[test]
    fn protection_is_curator_shaped() {
        let guid = Uuid::nil();
        assert_eq!(protection(&guid), "_c_00000000-0000-0000-0000-000000000000-");
    }
}
