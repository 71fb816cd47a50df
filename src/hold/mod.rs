//! The hold layer, shared by every recipe: what a granted lock is to its owner.
//!
//! - [`holds`]: a hold (one granted node, shared by the guards of re-entrant acquires) and the
//!   table of a lock's holds, which the recipe owns; when a hold's node is deleted.
//! - [`guard`]: [`LockGuard`](guard::LockGuard), the handle every recipe's acquire returns, with
//!   its fencing token, state, loss signal and release.
//! - [`fenced`]: ZooKeeper writes fenced by a hold.
//! - [`scope`]: lock scopes, where acquires re-enter a hold instead of queueing.
//!
//! Above the engine (a hold is made from the engine's grant), below the recipes: no recipe's
//! private state is reached from here.

pub(crate) mod fenced;
pub(crate) mod guard;
pub(crate) mod holds;
pub(crate) mod scope;
