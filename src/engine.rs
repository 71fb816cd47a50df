//! The lock engine shared by every lock recipe (Curator's `LockInternals`).
//!
//! One acquire attempt, top to bottom:
//!
//! 1. Choose a GUID and arm a [`PendingNode`] *before* anything is sent, so that whatever happens
//!    next — an error, a timeout, the future dropped at any `.await` — the node is deleted.
//! 2. Create `<dir>/_c_<guid>-lock-` as `EPHEMERAL_SEQUENTIAL` and, pipelined behind it on the same
//!    session, list the directory. The server answers a session's requests in order, so the
//!    listing already contains our node: an uncontended acquire costs one round trip.
//!    - The directory is missing: create it (and its parents) as container nodes, try again.
//!    - The create's outcome is unknown (connection lost or stalled before the reply): look for
//!      our GUID among the children (owned by our session) before creating again, so one attempt
//!      never leaves two nodes.
//! 3. Sort the lock nodes by sequence (foreign children are ignored) and ask the driver.
//!    - Acquired: disarm the pending node; the caller now owns it.
//!    - Wait for a predecessor: set a data watch on it (not `exists`, which would leave a watch
//!      behind if it is already gone) and wait for it to change; then list again.
//!    - Our node is not in the listing: someone deleted it; create a new one.

use tracing::{debug, Span};
use uuid::Uuid;
use zookeeper_client as zk;

use crate::cleanup::{find_protected, retry_unknown, Backoff, Cleanup, PendingNode};
use crate::driver::{Decision, LockDriver};
use crate::error::{outcome_unknown, Error, Result};
use crate::naming::{self, LockChild};

/// How many times in a row our node may vanish under us before we give up.
const MAX_NODE_LOSSES: usize = 5;

/// Our lock node, once held.
#[derive(Clone, Debug)]
pub(crate) struct LockNode {
    /// Full path of the node.
    pub path: String,
    /// Sequence number the server appended.
    pub sequence: i64,
    /// The zxid of the node's creation: the fencing token.
    pub czxid: i64,
}

/// Whether an attempt waits for its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Give up (and delete our node) if the lock is not ours at once.
    No,
    /// Wait until the lock is ours. Timeouts wrap the attempt in `tokio::time::timeout`.
    Forever,
}

enum Turn {
    Acquired,
    NotNow,
    NodeGone,
}

/// The engine: a lock directory on one client, with its cleanup.
#[derive(Debug)]
pub(crate) struct LockInternals {
    cleanup: Cleanup,
    dir: String,
    node_data: Vec<u8>,
}

impl LockInternals {
    pub(crate) fn new(client: zk::Client, dir: String, node_data: Vec<u8>) -> LockInternals {
        LockInternals { cleanup: Cleanup::new(client), dir, node_data }
    }

    pub(crate) fn client(&self) -> &zk::Client {
        self.cleanup.client()
    }

    pub(crate) fn dir(&self) -> &str {
        &self.dir
    }

    pub(crate) fn cleanup(&self) -> &Cleanup {
        &self.cleanup
    }

    /// One acquire attempt. `Ok(None)` only with [`Wait::No`] when the lock is taken.
    ///
    /// Cancel safe: dropping the future at any point deletes the node it may have created.
    pub(crate) async fn attempt(&self, driver: &dyn LockDriver, wait: Wait) -> Result<Option<LockNode>> {
        self.cleanup.remember_runtime();
        let protection = naming::protection(&Uuid::new_v4());
        let mut pending = PendingNode::new(self.cleanup.clone(), &self.dir, protection.clone());
        let prefix = format!("{}/{}{}", self.dir, protection, driver.lock_name());
        let mut losses = 0;
        loop {
            let (node, listing) = self.create(&prefix, &protection, driver.lock_name(), &mut pending).await?;
            Span::current().record("sequence", node.sequence);
            match self.wait_for_turn(driver, &node, listing, wait).await? {
                Turn::Acquired => {
                    pending.disarm();
                    return Ok(Some(node));
                },
                Turn::NotNow => {
                    pending.delete_now().await?;
                    return Ok(None);
                },
                Turn::NodeGone => {
                    losses += 1;
                    debug!(path = node.path, losses, "our lock node was deleted while waiting");
                    if losses >= MAX_NODE_LOSSES {
                        return Err(Error::LockNodeDeleted { path: self.dir.clone() });
                    }
                    pending.forget();
                },
            }
        }
    }

    /// Creates our node (step 2), returning it and the pipelined listing when that succeeded.
    async fn create(
        &self,
        prefix: &str,
        protection: &str,
        lock_name: &str,
        pending: &mut PendingNode,
    ) -> Result<(LockNode, Option<Vec<String>>)> {
        let client = self.client();
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let mut backoff = Backoff::new();
        let mut outcome_was_unknown = false;
        loop {
            if outcome_was_unknown {
                // A previous create may have been applied: find it before creating again.
                match find_protected(client, &self.dir, protection).await {
                    Ok(Some(found)) => {
                        let sequence = naming::parse_sequence(&found.name, lock_name).unwrap_or(i64::MAX);
                        debug!(path = found.path, "found our lock node by GUID after an unknown create outcome");
                        pending.created(found.path.clone());
                        let node = LockNode { path: found.path, sequence, czxid: found.stat.czxid };
                        return Ok((node, None));
                    },
                    Ok(None) => outcome_was_unknown = false,
                    Err(err) if outcome_unknown(&err) => {
                        backoff.wait().await;
                        continue;
                    },
                    Err(err) => return Err(Error::zk("list", &self.dir, err)),
                }
            }
            // Both requests are sent now, in this order; only then do we wait for replies.
            let create = client.create(prefix, &self.node_data, &options);
            let listing = client.list_children(&self.dir);
            match create.await {
                Ok((stat, sequence)) => {
                    let path = format!("{prefix}{sequence}");
                    pending.created(path.clone());
                    let czxid = if stat.is_invalid() { self.czxid_of(&path).await? } else { stat.czxid };
                    let listing = listing.await.ok();
                    return Ok((LockNode { path, sequence: sequence.into_i64(), czxid }, listing));
                },
                Err(zk::Error::NoNode) => {
                    drop(listing);
                    self.create_parents().await?;
                },
                Err(err) if outcome_unknown(&err) => {
                    debug!(%err, "lock node create outcome unknown");
                    outcome_was_unknown = true;
                    backoff.wait().await;
                },
                Err(err) => return Err(Error::zk("create lock node in", &self.dir, err)),
            }
        }
    }

    /// The czxid of `path`, for servers too old to return a stat from create.
    async fn czxid_of(&self, path: &str) -> Result<i64> {
        retry_unknown(|| self.client().get_data(path))
            .await
            .map(|(_, stat)| stat.czxid)
            .map_err(|err| Error::zk("read lock node", path, err))
    }

    /// Creates the lock directory and its missing ancestors as container nodes (which the server
    /// deletes once they are empty again), tolerating concurrent creation.
    async fn create_parents(&self) -> Result<()> {
        let options = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        match retry_unknown(|| self.client().mkdir(&self.dir, &options)).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode) => Err(Error::ChrootMissing { path: self.dir.clone() }),
            Err(zk::Error::NoAuth) => Err(Error::NoAuth { op: "create the lock path", path: self.dir.clone() }),
            Err(err) => Err(Error::zk("create the lock path", &self.dir, err)),
        }
    }

    /// Lists the lock nodes of the directory in queue order (step 3's input).
    pub(crate) async fn sorted_children(&self, lock_name: &str) -> Result<Vec<LockChild>> {
        match retry_unknown(|| self.client().list_children(&self.dir)).await {
            Ok(children) => Ok(naming::sort_lock_children(children, lock_name)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(err) => Err(Error::zk("list", &self.dir, err)),
        }
    }

    /// Step 3: waits until the driver says our node holds the lock.
    async fn wait_for_turn(
        &self,
        driver: &dyn LockDriver,
        node: &LockNode,
        mut listing: Option<Vec<String>>,
        wait: Wait,
    ) -> Result<Turn> {
        let name = &node.path[self.dir.len() + 1..];
        loop {
            let children = match listing.take() {
                Some(children) => naming::sort_lock_children(children, driver.lock_name()),
                None => self.sorted_children(driver.lock_name()).await?,
            };
            let Some(ours) = children.iter().position(|child| child.name == name) else {
                return Ok(Turn::NodeGone);
            };
            let predecessor = match driver.decide(&children, ours) {
                Decision::Acquired => return Ok(Turn::Acquired),
                Decision::WaitFor(_) if wait == Wait::No => return Ok(Turn::NotNow),
                Decision::WaitFor(index) => format!("{}/{}", self.dir, children[index].name),
            };
            debug!(predecessor, "waiting for predecessor");
            match self.client().get_and_watch_data(&predecessor).await {
                Ok((_, _, watcher)) => {
                    let event = watcher.changed().await;
                    if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                        return Err(Error::SessionLost {
                            path: self.dir.clone(),
                            state: event.session_state.to_string(),
                        });
                    }
                },
                // Already gone, or the connection broke: look again.
                Err(zk::Error::NoNode) => {},
                Err(err) if outcome_unknown(&err) => {},
                Err(err) => return Err(Error::zk("watch predecessor", &predecessor, err)),
            }
        }
    }
}
