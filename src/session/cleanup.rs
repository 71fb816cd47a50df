//! Background deletion of lock nodes nobody wants any more.
//!
//! Every lock node this crate creates is owned either by a pending acquire ([`PendingNode`]) or
//! by a held lock. When the owner goes away — a released or dropped guard, an acquire that failed,
//! timed out or whose future was dropped at any `.await` — the node is handed to [`Cleanup`],
//! which deletes it on a task of its own. That task does not depend on the caller's future, and it
//! retries until the node is gone or the session is dead (then the server deletes it).
//!
//! A node whose create reply was never seen is found again by its protection GUID, and deleted
//! only if its `ephemeral_owner` is our session.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, error, warn};
use zookeeper_client as zk;

use crate::error::{session_dead, transient, Error, Result};
use crate::sync::lock;

/// What to delete.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A node whose full path we know from the create reply.
    Path(String),
    /// A node whose create reply was lost: the child of `dir` whose name starts with `protection`
    /// and whose ephemeral owner is our session, if there is one.
    Protected { dir: String, protection: String },
    /// A held node released cleanly, or a node never handed to the application given up, on a
    /// lock with a lock-delay: deleted in one `multi` with a write of its served mark as its
    /// directory's data (`engine/delay.rs`). Should the `multi`
    /// fail, the node is deleted plainly (counted as unclean: the next grant then waits the delay,
    /// which is only ever conservative).
    Released { path: String, served: u32 },
}

impl Target {
    /// The node's path, or its directory when the name is not known.
    fn path(&self) -> &str {
        match self {
            Target::Path(path) | Target::Released { path, .. } => path,
            Target::Protected { dir, .. } => dir,
        }
    }
}

/// How a lock-delay's served mark is spelled in its lock directory's data (`engine/delay.rs`).
const MARK_PREFIX: &[u8] = b"lock-delay served ";

/// The directory data that records the served mark `served` (`engine/delay.rs`, *Served marks*).
pub(crate) fn mark_data(served: u32) -> Vec<u8> {
    let mut data = MARK_PREFIX.to_vec();
    data.extend_from_slice(served.to_string().as_bytes());
    data
}

/// The served mark in a lock directory's data, if it holds one.
pub(crate) fn mark_of(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data.strip_prefix(MARK_PREFIX)?).ok()?.parse().ok()
}

/// `multi(setData(<dir>, <served mark>), delete(<path>))`: a clean release's mark and delete, in
/// one request (what a plain delete costs). `Err(NoNode)` if the node is gone; a failure of the
/// mark alone falls back to an unmarked delete.
async fn marked_delete(client: &zk::Client, path: &str, served: u32) -> std::result::Result<(), zk::Error> {
    let Some((dir, _)) = path.rsplit_once('/') else { return client.delete(path, None).await };
    let dir = if dir.is_empty() { "/" } else { dir };
    let mut writer = client.new_multi_writer();
    let mark = mark_data(served);
    if writer.add_set_data(dir, &mark, None).is_err() || writer.add_delete(path, None).is_err() {
        return client.delete(path, None).await;
    }
    match writer.commit().await {
        Ok(_) => Ok(()),
        Err(zk::MultiWriteError::RequestFailed { source }) => Err(source),
        Err(zk::MultiWriteError::OperationFailed { index: 1, source }) => Err(source),
        // The mark was refused (the directory's ACL): unmarked, the successor waits the delay.
        Err(zk::MultiWriteError::OperationFailed { .. }) => client.delete(path, None).await,
    }
}

/// Deletes unwanted lock nodes in the background. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Cleanup {
    client: zk::Client,
    runtime: Arc<OnceLock<Handle>>,
    /// The background deletions running on this session: by GUID (abandoned attempts whose create
    /// reply never came: their first request is sent only by their task, so nothing the caller
    /// sends after starting one is ordered after its delete), and by path (sent at once, but
    /// retried by their task after a connection loss, possibly after what the caller sent
    /// next). [`searches_done`](Self::searches_done) waits for them. One per session, shared by
    /// every cleanup of it.
    searches: Arc<Searches>,
}

/// The background deletions running on one session.
#[derive(Debug, Default)]
pub(crate) struct Searches {
    /// Deletions not yet ended: running, or parked.
    running: AtomicUsize,
    /// Notified when `running` drops to 0, and when a deletion is parked.
    done: Notify,
    /// Deletions whose task was dropped unfinished, waiting for a runtime to run them (see
    /// `Search`). Each is counted in `running`.
    parked: Mutex<Vec<Restart>>,
}

impl Searches {
    /// Parks `restart` (its count moves with it), wakes [`Cleanup::searches_done`] to run it, and
    /// asks the session's remembered runtime to run it too.
    fn park(self: &Arc<Self>, mut restart: Restart) {
        // A marked delete started again is a plain one (its `multi` may have been applied).
        if let Target::Released { path, .. } = restart.target {
            restart.target = Target::Path(path);
        }
        debug!(target = ?restart.target, "a lock node's deletion was dropped unfinished; parked to start again");
        let runtime = restart.runtime.clone();
        lock(&self.parked).push(restart);
        self.done.notify_waiters();
        if let Some(runtime) = runtime {
            // Takes one parked deletion (whichever: `searches_done` may have taken this one) when
            // it runs. On a runtime shutting down it is dropped unpolled, owning nothing.
            let searches = self.clone();
            drop(runtime.spawn(async move {
                let parked = lock(&searches.parked).pop();
                if let Some(restart) = parked {
                    searches.resume(restart).await;
                }
            }));
        }
    }

    /// Runs a parked deletion to its end; dropped unfinished, it is parked again.
    async fn resume(self: Arc<Self>, restart: Restart) {
        let (client, target) = (restart.client.clone(), restart.target.clone());
        let mut search = Search { searches: self, unfinished: Some(restart) };
        let result = delete_until_gone(client, target, None).await;
        if let (Ok(()), Some(gone)) = (&result, search.finished()) {
            gone();
        }
    }
}

/// Counts a background deletion for as long as it has not ended (also while its task is dropped
/// unrun), and parks it if its task is dropped before the deletion ended.
///
/// A task is dropped unfinished when its runtime shuts down: a lock's attempt dropped by that
/// shutdown spawns its node's deletion on the current runtime, the one shutting down, which drops
/// it at once (review Q). Were that the end, the node would stay until the session ends and
/// [`Cleanup::searches_done`] would not wait for it (a latch's `close` from another runtime then
/// returned `Ok` with its node there). So the deletion is parked in [`Searches`], still counted,
/// and started again by whichever comes first:
/// - a task spawned on the runtime the session remembered ([`Cleanup::runtime`]'s fallback);
/// - [`Cleanup::searches_done`], which runs parked deletions itself, on the runtime polling it.
///
/// Either may be lost: the remembered runtime may be the one shutting down (it drops the task
/// unpolled, and the deletion stays parked), or a current-thread runtime no longer driven (the
/// task never runs; `searches_done` takes the deletion first). A deletion started again and dropped
/// unfinished once more is parked again. So `searches_done` never returns while a parked deletion
/// has not ended, and it ends it. Without a `searches_done` (no latch `close`), a deletion parked with
/// no live runtime stays parked, and its node goes away when the session ends.
struct Search {
    searches: Arc<Searches>,
    /// What starts the deletion again, until its task ends it (`None` then).
    unfinished: Option<Restart>,
}

/// A deletion to start again if its task is dropped unfinished; `runtime`: the runtime the session
/// remembered, if any.
struct Restart {
    runtime: Option<Handle>,
    client: zk::Client,
    target: Target,
    gone: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restart").field("target", &self.target).finish_non_exhaustive()
    }
}

impl Search {
    /// The deletion ended (whatever its outcome): nothing to start again. The callback to run if
    /// the node is gone, handed back.
    fn finished(&mut self) -> Option<Box<dyn FnOnce() + Send>> {
        self.unfinished.take().and_then(|restart| restart.gone)
    }
}

impl Drop for Search {
    fn drop(&mut self) {
        if let Some(restart) = self.unfinished.take() {
            // Still counted, now by the parked deletion.
            self.searches.park(restart);
        } else if self.searches.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.searches.done.notify_waiters();
        }
    }
}

impl Cleanup {
    /// Deletes through `client`, on the current runtime or the one remembered in `runtime`
    /// (shared by everything on one session).
    pub(crate) fn new(client: zk::Client, runtime: Arc<OnceLock<Handle>>, searches: Arc<Searches>) -> Cleanup {
        if let Ok(handle) = Handle::try_current() {
            let _ = runtime.set(handle);
        }
        Cleanup { client, runtime, searches }
    }

    /// Resolves once no background deletion runs on this cleanup's session (started by any recipe
    /// on it, by GUID or by path): every node given to a cleanup before is deleted then, or the
    /// session is dead. Runs the deletions parked by a runtime's shutdown itself (see `Search`).
    /// Cancel safe: a parked deletion it was running is parked again.
    pub(crate) async fn searches_done(&self) {
        let mut resumed = FuturesUnordered::new();
        loop {
            let done = self.searches.done.notified();
            tokio::pin!(done);
            // Registered before the count is read: a drop to 0 (or a park) in between is not
            // missed.
            done.as_mut().enable();
            let parked = std::mem::take(&mut *lock(&self.searches.parked));
            resumed.extend(parked.into_iter().map(|restart| self.searches.clone().resume(restart)));
            if self.searches.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            if resumed.is_empty() {
                done.await;
            } else {
                tokio::select! {
                    () = &mut done => {},
                    _ = resumed.next() => {},
                }
            }
        }
    }

    /// The current runtime, else the one remembered for this session (`None` if neither).
    pub(crate) fn runtime(&self) -> Option<Handle> {
        Handle::try_current().ok().or_else(|| self.runtime.get().cloned())
    }

    pub(crate) fn client(&self) -> &zk::Client {
        &self.client
    }

    /// Remembers the current runtime, so a guard dropped outside of it can still clean up.
    pub(crate) fn remember_runtime(&self) {
        if self.runtime.get().is_none() {
            if let Ok(handle) = Handle::try_current() {
                let _ = self.runtime.set(handle);
            }
        }
    }

    /// Starts deleting `target` on a task of its own; awaiting the handle is optional.
    ///
    /// The first delete request of a known path is sent before this returns, so it is ordered
    /// before anything the caller sends next on the session (a release followed by the next
    /// acquire costs no extra round trip, and the next listing no longer shows the old node).
    pub(crate) fn delete(&self, target: Target) -> Option<JoinHandle<Result<()>>> {
        self.delete_and_forget(target, None)
    }

    /// Starts deleting `target` like [`delete`](Self::delete), and calls `gone` once it is gone
    /// (not when the deletion fails). The session layer knows paths, not lock nodes: the engine
    /// uses `gone` to tell its view of the directory.
    pub(crate) fn delete_then(
        &self,
        target: Target,
        gone: impl FnOnce() + Send + 'static,
    ) -> Option<JoinHandle<Result<()>>> {
        self.delete_and_forget(target, Some(Box::new(gone)))
    }

    fn delete_and_forget(
        &self,
        target: Target,
        gone: Option<Box<dyn FnOnce() + Send>>,
    ) -> Option<JoinHandle<Result<()>>> {
        let handle = Handle::try_current().ok().or_else(|| self.runtime.get().cloned());
        let Some(handle) = handle else {
            warn!(?target, "no tokio runtime to delete a lock node on; it goes away when the session ends");
            return None;
        };
        let client = self.client.clone();
        // Counted until the node is gone (or the session dead): `searches_done` waits for every
        // deletion on the session, by GUID or by path (one retried after a connection loss
        // included).
        self.searches.running.fetch_add(1, Ordering::SeqCst);
        // Parked to start again should this task be dropped unfinished (see `Search`).
        let restart =
            Restart { runtime: self.runtime.get().cloned(), client: client.clone(), target: target.clone(), gone };
        let mut search = Search { searches: self.searches.clone(), unfinished: Some(restart) };
        let first: Option<FirstDelete> = match &target {
            Target::Path(path) => Some(Box::pin(client.delete(path, None))),
            // Sent by the task (the `multi` borrows the client): a release marked for a
            // lock-delay is not ordered before what the caller sends next.
            Target::Released { .. } | Target::Protected { .. } => None,
        };
        Some(handle.spawn(async move {
            let result = delete_until_gone(client, target, first).await;
            if let (Ok(()), Some(gone)) = (&result, search.finished()) {
                gone();
            }
            result
        }))
    }
}

/// A first delete already sent (a plain one, or a clean release's marked one).
type FirstDelete = std::pin::Pin<Box<dyn Future<Output = std::result::Result<(), zk::Error>> + Send>>;

/// Deletes `target`, retrying while the outcome is unknown, until it is gone or the session is
/// dead. `first` is a delete of the target's path already sent. (A retry of a marked delete is a
/// plain one.)
async fn delete_until_gone(client: zk::Client, target: Target, mut first: Option<FirstDelete>) -> Result<()> {
    let mut backoff = Backoff::new();
    let mut marked = matches!(target, Target::Released { .. });
    loop {
        let result = match (first.take(), &target) {
            (Some(sent), _) => sent.await,
            (None, Target::Released { path, served }) if std::mem::take(&mut marked) => {
                marked_delete(&client, path, *served).await
            },
            (None, Target::Path(path) | Target::Released { path, .. }) => client.delete(path, None).await,
            (None, Target::Protected { dir, protection }) => match find_protected(&client, dir, protection).await {
                // Deleted: look again, in case a create of the same attempt was applied late.
                Ok(Some(found)) => match client.delete(&found.path, None).await {
                    Ok(()) | Err(zk::Error::NoNode) => continue,
                    Err(err) => Err(err),
                },
                Ok(None) => Ok(()),
                Err(err) => Err(err),
            },
        };
        match result {
            Ok(()) | Err(zk::Error::NoNode) => {
                debug!(?target, "lock node deleted");
                return Ok(());
            },
            // Expired or closed: the server has deleted (or is deleting) the session's nodes.
            Err(err @ (zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                debug!(?target, %err, "session is gone; so are its lock nodes");
                return Ok(());
            },
            // The client is unusable, but the server keeps the session — and the node — until it
            // times out: not "deleted".
            Err(err) if session_dead(&err) => {
                warn!(?target, %err, "client unusable; the lock node goes away when its session times out");
                return Err(Error::zk("delete", target.path(), err));
            },
            Err(err) if transient(&err) => {
                debug!(?target, %err, "retrying lock node deletion");
                backoff.wait().await;
            },
            Err(err) => {
                error!(lock_node = target.path(), %err, "cannot delete lock node; it goes away when its session ends");
                return Err(Error::zk("delete", target.path(), err));
            },
        }
    }
}

/// A lock node found by its protection GUID.
#[derive(Debug)]
pub(crate) struct Found {
    pub path: String,
    pub name: String,
    pub stat: zk::Stat,
}

/// Finds the child of `dir` whose name starts with `protection` and which belongs to our session.
///
/// `Ok(None)` when there is none (also when `dir` itself is gone).
pub(crate) async fn find_protected(
    client: &zk::Client,
    dir: &str,
    protection: &str,
) -> std::result::Result<Option<Found>, zk::Error> {
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => return Ok(None),
        Err(err) => return Err(err),
    };
    let session = client.session_id().0;
    for name in children.into_iter().filter(|name| name.starts_with(protection)) {
        let path = format!("{dir}/{name}");
        match client.get_data(&path).await {
            Ok((_, stat)) if stat.ephemeral_owner == session => return Ok(Some(Found { path, name, stat })),
            Ok((_, stat)) => {
                warn!(
                    path,
                    owner = stat.ephemeral_owner,
                    "a node carries our GUID but belongs to another session; leaving it alone"
                )
            },
            Err(zk::Error::NoNode) => {},
            Err(err) => return Err(err),
        }
    }
    Ok(None)
}

/// Retries `op` while its outcome is unknown (connection lost or stalled) or the server throttled
/// it; the client queues requests while disconnected, so each retry waits for the connection to
/// come back.
pub(crate) async fn retry_unknown<T, F, Fut>(mut op: F) -> std::result::Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, zk::Error>>,
{
    let mut backoff = Backoff::new();
    loop {
        match op().await {
            Err(err) if transient(&err) => backoff.wait().await,
            result => return result,
        }
    }
}

/// Exponential backoff from 20 ms to 1 s between retries.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff(Duration::from_millis(20))
    }

    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}

/// The lock node of an acquire in progress. If the acquire does not complete — an error, a
/// timeout, `try_acquire` finding the lock taken, or its future dropped at any `.await` — dropping
/// this hands the node to [`Cleanup`]. It is armed before the create is sent, so even a node whose
/// create reply was never seen is found (by GUID) and deleted.
pub(crate) struct PendingNode {
    /// The session's cleanup, shared (a clone of it copies the client: part of every queued
    /// waiter's future).
    cleanup: Arc<Cleanup>,
    dir: String,
    protection: String,
    path: Option<String>,
    armed: bool,
    /// A create of this attempt had an unknown outcome: a node with its GUID may exist.
    maybe_applied: bool,
    /// On a lock with a lock-delay, the served mark a give-up writes as it deletes the node (a
    /// node never handed to the application ended no hold: `engine/delay.rs`, *Give-ups and
    /// waits cut short*).
    give_up_mark: Option<u32>,
}

impl PendingNode {
    pub(crate) fn new(cleanup: Arc<Cleanup>, dir: &str, protection: String) -> PendingNode {
        PendingNode {
            cleanup,
            dir: dir.to_owned(),
            protection,
            path: None,
            armed: true,
            maybe_applied: false,
            give_up_mark: None,
        }
    }

    /// A give-up deletes the node (once its path is known) with a write of `served` as its
    /// directory's data, in one `multi`: `served` must be a mark read from the directory instance
    /// the node is in, or 0 (`engine/delay.rs`, *Give-ups and waits cut short*).
    pub(crate) fn give_up_with_mark(&mut self, served: u32) {
        self.give_up_mark = Some(served);
    }

    /// A create's outcome was unknown: it may have been applied (now or later).
    pub(crate) fn maybe_applied(&mut self) {
        self.maybe_applied = true;
    }

    /// Records the node's path once the create reply (or a GUID search) told us.
    pub(crate) fn created(&mut self, path: String) {
        self.path = Some(path);
    }

    /// Gives up the node whose path we know (it was found deleted; if it is not, it is deleted
    /// now), so that the next create starts afresh.
    pub(crate) fn abandon_node(&mut self) {
        if let Some(path) = self.path.take() {
            self.cleanup.delete(Target::Path(path));
        }
    }

    /// The acquire succeeded: the held lock owns the node now.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    /// The last create was refused by the server: unless an earlier one of this attempt may
    /// have been applied, there is no node to delete.
    pub(crate) fn never_created(&mut self) {
        if !self.maybe_applied && self.path.is_none() {
            self.armed = false;
        }
    }

    /// Deletes the node now and waits for the deletion (used by `try_acquire`).
    pub(crate) async fn delete_now(mut self) -> Result<()> {
        self.armed = false;
        match self.cleanup.delete(self.target()) {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }

    fn target(&self) -> Target {
        match (&self.path, self.give_up_mark) {
            (Some(path), Some(served)) => Target::Released { path: path.clone(), served },
            (Some(path), None) => Target::Path(path.clone()),
            (None, _) => Target::Protected { dir: self.dir.clone(), protection: self.protection.clone() },
        }
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if self.armed {
            debug!(target = ?self.target(), "abandoned acquire: deleting its lock node in the background");
            self.cleanup.delete(self.target());
        }
    }
}
