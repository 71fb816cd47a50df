//! The session layer: ZooKeeper sessions and what lives and dies with them.
//!
//! - [`client`]: the clients recipes run on ([`RecipeClient`](client::RecipeClient), the
//!   [`ManagedClient`](client::ManagedClient) that replaces an expired session) and the per-session
//!   context every acquire and hold carries.
//! - [`monitor`]: one monitor per session, which turns connection state and leader-confirmed
//!   heartbeats into each hold's `Held / Suspended / Lost`.
//! - [`watch`]: data watches on nodes.
//! - [`cleanup`]: deletion of nodes nobody wants any more, by path or by protection GUID and
//!   owner, retried until they are gone or the session is dead.
//! - [`timers`]: instants on the session's clock (its holds' leases), one task for all of them.
//! - [`clock`], [`acl`]: the suspend-aware clock the loss deadline runs on; ACL lists.
//!
//! This layer knows paths and sessions, not lock nodes or queues: nothing here imports from the
//! engine or the recipes above it.

pub(crate) mod acl;
pub(crate) mod cleanup;
pub(crate) mod client;
pub(crate) mod clock;
pub(crate) mod monitor;
pub(crate) mod timers;
pub(crate) mod watch;
