//! Lock node names: Curator's protected naming and parsing of sequence numbers.
//!
//! A lock node is named `_c_<uuid>-lock-<sequence>`: `_c_<uuid>-` is Curator's "protection"
//! prefix (a GUID chosen before the create is sent, so a create whose reply was lost can be found
//! again), `lock-` is the lock name, and `<sequence>` is the 10-digit counter the server appends to
//! `EPHEMERAL_SEQUENTIAL` nodes. Curator's non-protected names (`lock-<sequence>`) are understood
//! too, so Curator and zk-recipes clients can share a lock.

use uuid::Uuid;

/// Curator's prefix for protected (GUID-carrying) nodes.
pub(crate) const PROTECTED_PREFIX: &str = "_c_";
/// The lock name Curator's `InterProcessMutex` uses.
pub(crate) const MUTEX_LOCK_NAME: &str = "lock-";

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

/// Keeps the lock nodes among `children` and orders them by sequence number (queue order).
pub(crate) fn sort_lock_children(children: Vec<String>, lock_name: &str) -> Vec<LockChild> {
    let mut nodes: Vec<LockChild> = children
        .into_iter()
        .filter_map(|name| parse_sequence(&name, lock_name).map(|sequence| LockChild { name, sequence }))
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
        let sorted = sort_lock_children(children, "lock-");
        let names: Vec<_> = sorted.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["lock-0000000001", "_c_b-lock-0000000003", "_c_a-lock-0000000010"]);
    }

    #[test]
    fn protection_is_curator_shaped() {
        let guid = Uuid::nil();
        assert_eq!(protection(&guid), "_c_00000000-0000-0000-0000-000000000000-");
    }
}
