//! The poison-tolerant lock shared by the crate's process-wide tables (sessions, directory
//! views, listing slots, holds). At the bottom of the crate: every layer may use it.

use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex whose data every update leaves consistent at each step (single map
/// operations, a few field writes), so that a lock poisoned by a panic elsewhere is still usable.
/// Shared by the crate's process-wide tables (sessions, directory views, listing slots).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
