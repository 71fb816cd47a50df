//! Lock-delay (Chubby's, Consul's; `LockBuilder::lock_delay`): when a holder's node disappears
//! without a clean release, the next holder is granted only `delay` later.
//!
//! # Marking a clean release
//! A hold of a lock with a lock-delay that ends cleanly — released by its owner, or a latch
//! closed — deletes its node in one `multi` with a write of the node's name as the lock
//! directory's data (`session/cleanup.rs`, `Target::Released`): one request, as a plain delete.
//! Everything else deletes without the mark: an expired or closed session (the server deletes the
//! node), an operator's delete, a hold whose lease ran out (the library released it for a holder
//! that may still be running), and Curator's and kazoo's releases, which know nothing of it.
//!
//! # The waiter's rule
//! A waiter granted because the node it watched (its predecessor) was deleted reads the lock
//! directory's data (one read, only on such locks): if it names that node, the release was clean
//! and the grant stands; otherwise it waits `delay` from the moment it saw the deletion, watching
//! its own node, then takes the lock.
//! - *A mark names the node it was written for*: node names are unique (GUIDs), and the mark and
//!   the delete are one transaction, so a directory naming `P` means `P` was released cleanly.
//! - *Nobody overwrites it before we read it*: marks are written only by clean releases of granted
//!   holds; once we are granted no node ahead of ours is left, and no node behind ours can have
//!   been granted. (A waiter that gives up deletes its node unmarked; it was never a holder.)
//! - *Conservative everywhere else*: an unreadable directory, or a grant not preceded by a
//!   deletion we saw, counts as unclean. A delay is never skipped for an unclean release; a clean
//!   one is delayed only if its mark cannot be read.
//!
//! # An acquire that finds the lock free
//! It reads the directory's stat in the same round trip as its create (sent before it). A clean
//! release's mark and delete share one transaction id, so the directory's `mzxid` (its data's
//! last write) equals its `pzxid` (its children's last change) when the last change of its
//! children was a clean release. If `pzxid` is later, children came and went since: with none
//! left ahead of ours, at least one node was deleted without a mark — an unclean loss, or a waiter
//! that gave up (indistinguishable here) — and the acquire waits `delay` from now (it cannot know
//! when that was). A directory that does not exist counts as unclean too: it may have been
//! reaped by the server (a container, left empty by an unclean loss) — so a lock with a delay
//! creates its directory *persistent* (never reaped), and only the first acquire on a new path
//! pays the delay. The directory's data is the mark's: nothing else may write it.
//!
//! Only exclusive locks take a lock-delay (a mutex, leader election): with several holders at
//! once (readers, leases) one holder's clean release proves nothing about another's, so the
//! read/write lock and the semaphores refuse it.
//! `try_acquire` does not wait: the lock is not available now.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::{OnSession, Turn};
use crate::error::{session_dead, Error, Result};
use crate::session::cleanup::retry_unknown;
use crate::session::watch::{NodeWatch, Watched};

/// The lock directory's data and stat read before our create, if the lock has a lock-delay.
pub(super) type Before = Option<std::result::Result<(Vec<u8>, zk::Stat), zk::Error>>;

/// Whether the directory, read before our create (`before`), shows a node deleted without a mark
/// since the last clean release (module docs, *An acquire that finds the lock free*).
pub(super) fn unclean_since_last_release(before: &Before) -> bool {
    match before {
        None => false,
        // Missing: never used — or reaped by the server (a container) once an unclean loss left
        // it empty, which cannot be told apart. Conservative: the first acquire on a new path
        // waits the delay once (the directory is then created persistent, and stays).
        Some(Err(zk::Error::NoNode)) => true,
        Some(Ok((_, stat))) => stat.pzxid > stat.mzxid,
        // Unreadable: conservative.
        Some(Err(_)) => true,
    }
}

impl OnSession<'_> {
    /// Whether the lock directory marks `gone` (the node whose deletion granted us) as released
    /// cleanly.
    pub(super) async fn released_cleanly(&self, gone: &str) -> Result<bool> {
        match retry_unknown(|| self.context.client().get_data(&self.lock.dir)).await {
            Ok((data, _)) => Ok(data == gone.as_bytes()),
            Err(err) if session_dead(&err) => Err(self.session_lost(err.to_string())),
            // Unreadable: conservative.
            Err(_) => Ok(false),
        }
    }

    /// Waits until `delay` after `since`, watching our node (`own_watch`, set again if its data
    /// changes): `Some(NodeGone)` if it goes meanwhile.
    pub(super) async fn serve_delay(
        &self,
        node_path: &str,
        since: Instant,
        delay: Duration,
        own_watch: &mut NodeWatch,
    ) -> Result<Option<Turn>> {
        tracing::debug!(
            path = node_path,
            ?delay,
            "lock-delay: the previous holder's node went without a clean release"
        );
        let until = since + delay;
        loop {
            tokio::select! {
                biased;
                event = &mut *own_watch => match event {
                    Watched::Deleted => return Ok(Some(Turn::NodeGone)),
                    Watched::SessionDead(state) => return Err(self.session_lost(state.to_string())),
                    Watched::Refused(err) => return Err(Error::zk("watch the lock node", node_path, err)),
                    Watched::Other => *own_watch = self.watch(node_path),
                },
                () = tokio::time::sleep_until(until) => return Ok(None),
            }
        }
    }
}
