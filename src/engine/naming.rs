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
//! # The counter's end
//! The counter is the directory's stored `cversion`, a signed 32-bit number bumped by every create
//! of a child (the `cversion` a `Stat` reports is another number: twice the creates minus the
//! children), printed with `%010d`. It runs out after 2³¹ creates under one lock path, and then
//! the server breaks the rule every lock in the family rests on — a node created later sorts
//! later:
//! - A ZooKeeper 3.6+ server (ZOOKEEPER-3249: applying a create only ever raises the stored
//!   counter) names every create after `…2147483647` `…2147483647` again: sequence numbers repeat,
//!   and the order among equal numbers is the names' (random GUIDs), not arrival.
//! - A create prepared while the one named `…2147483647` is still being applied — the next op of
//!   a `multi`, or another session's create at that moment —, and every create on older servers,
//!   is named `-2147483648` and up (`-000000001` is -1): ahead of every node from before, the holder's too, both
//!   numerically (ours) and as strings (Curator's and kazoo's sorts, where `-` sorts before any
//!   digit).
//!
//! `tests/recipes/sequence_wrap.rs` pins both on a real server started from a crafted snapshot. So:
//! - **A node of ours whose sequence is not in `0..2147483647` is never granted**
//!   ([`in_counter_range`]): the attempt deletes it and fails with
//!   [`Error::SequenceWrapped`](crate::Error::SequenceWrapped) before any decision. The last
//!   number, 2147483647, is refused too: the first node to get it is unique, but a later one may
//!   get it again and sort ahead. Every node of ours that is held or waits therefore has a unique
//!   sequence below every number a later create can get, repeated or wrapped — except a wrapped
//!   one, which sorts ahead of it:
//! - **A node at or past the counter's end from anyone else only delays us**: a repeated
//!   `…2147483647` sorts after every node of ours that can hold, and a negative one sorts ahead
//!   of every non-negative node, here as in Curator's and kazoo's string order: a waiter of ours
//!   that lists the directory counts it as ahead and waits for it. But that client's own lock
//!   grants it at once, as the first node in its order, beside our holder or beside a waiter of
//!   ours granted from its view (which never sees nodes created after its last listing): a queue
//!   jump no client can prevent; the README's *Limits* says so.
//! - **Recovery**: a directory we (or Curator) created is a container node: when no child is
//!   left the server deletes it (`ContainerManager`: empty, and a stored counter above 0, which
//!   3.6+ keeps), and the next acquire creates it again with the counter at 0. A persistent one
//!   (made by kazoo's `ensure_path` or by hand), or a negative counter left by an older server,
//!   is never reaped: it must be deleted by hand, and until then every acquire fails (a latch or
//!   selector keeps retrying).

use std::sync::Arc;

use uuid::Uuid;

/// Curator's prefix for protected (GUID-carrying) nodes.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";
/// The lock name Curator's `InterProcessMutex` uses.
pub(crate) const MUTEX_LOCK_NAME: &str = "lock-";
/// The name of a lease node of Curator's `InterProcessSemaphoreV2` (`<path>/leases/_c_<uuid>-lease-<seq>`).
pub(crate) const LEASE_NAME: &str = "lease-";
/// The lock name of kazoo's `Lock` (its nodes are `<hex uuid>__lock__<sequence>`).
pub(crate) const KAZOO_LOCK_NAME: &str = "__lock__";

/// The lock names whose nodes queue together in one lock directory; a node's *kind* is the index
/// of its lock name here.
pub(crate) type Queue = &'static [&'static str];

/// A mutex's queue: Curator's and ours (kind 0), and kazoo's `Lock` (kind 1), which queues in the
/// same directory with the same sequence counter.
pub(crate) const MUTEX_QUEUE: Queue = &[MUTEX_LOCK_NAME, KAZOO_LOCK_NAME];

/// The lease nodes of a semaphore's `leases` directory (a count, not a queue: every child counts).
pub(crate) const LEASE_QUEUE: Queue = &[LEASE_NAME];

/// The `_c_<uuid>-` part of a node name, unique to one acquire attempt.
pub(crate) fn protection(guid: &Uuid) -> String {
    format!("{PROTECTED_PREFIX}{}-", guid.as_hyphenated())
}

/// One child of the lock directory that is a lock node. Ordered as in the queue: by sequence
/// number, then by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LockChild {
    /// The node name (not the full path).
    pub name: Arc<str>,
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

/// Whether a node of ours with this sequence number may be granted: below the end of the
/// directory's 32-bit counter, where sequence numbers are unique and grow (see *The counter's
/// end* above).
pub(crate) fn in_counter_range(sequence: i64) -> bool {
    (0..i64::from(i32::MAX)).contains(&sequence)
}

/// Parses the sequence number of a lock node name: the digits after the last `lock_name`.
///
/// Returns `None` for anything else (a foreign child), which must never block or grant the lock.
pub(crate) fn parse_sequence(name: &str, lock_name: &str) -> Option<i64> {
    let at = name.rfind(lock_name)?;
    let digits = &name[at + lock_name.len()..];
    // `%010d`: ten characters at least, the sign of a negative number (after the wrap) included.
    let (unsigned, width) = match digits.strip_prefix('-') {
        Some(unsigned) => (unsigned, 9),
        None => (digits, 10),
    };
    if unsigned.len() < width || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
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
        .filter_map(|name| {
            parse_child(&name, queue).map(|(sequence, kind)| LockChild { name: name.into(), sequence, kind })
        })
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
        assert_eq!(parse_sequence("lock--000000001", "lock-"), Some(-1), "Java's %010d of -1");
        assert_eq!(parse_sequence("lock--00000001", "lock-"), None);
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
        let names: Vec<_> = sorted.iter().map(|c| &*c.name).collect();
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
