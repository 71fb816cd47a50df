//! Background deletion of lock nodes nobody wants any more.
//!
//! Every lock node this crate creates is owned either by a pending acquire ([`PendingNode`]) or
//! by a held lock. When the owner goes away — a released or dropped guard, an acquire that failed,
//! timed out or whose future was dropped at any `.await` — the node is handed to [`Cleanup`],
//! which deletes it on a task of its own. That task does not depend on the caller's future, and it
//! retries until the node is gone or the session is dead (then the server deletes it). Should the
//! task itself never end — its runtime shut down, or no longer driven — the deletion is run again
//! elsewhere, and a latch's `close` runs it itself ([`Deletion`]).
//!
//! A node whose create reply was never seen is found again by its protection GUID, and deleted
//! only if its `ephemeral_owner` is our session.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

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
    /// directory's data (`engine/delay.rs`), or, for a give-up that read no mark (`None`), of no
    /// mark (empty data: the deletion is not counted as unclean, and the directory still shows no
    /// mark). Should the `multi` fail, the node is deleted plainly (counted as unclean: the next
    /// grant then waits the delay, which is only ever conservative).
    Released { path: String, served: Option<u32> },
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
/// one request (what a plain delete costs); with no mark (`None`), empty data. `Err(NoNode)` if
/// the node is gone; a failure of the mark alone falls back to an unmarked delete.
async fn marked_delete(client: &zk::Client, path: &str, served: Option<u32>) -> std::result::Result<(), zk::Error> {
    let Some((dir, _)) = path.rsplit_once('/') else { return client.delete(path, None).await };
    let dir = if dir.is_empty() { "/" } else { dir };
    let mut writer = client.new_multi_writer();
    let mark = served.map(mark_data).unwrap_or_default();
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

/// The background deletions of one session that have not ended, shared by every cleanup of it.
#[derive(Debug, Default)]
pub(crate) struct Searches {
    /// By id.
    running: Mutex<HashMap<u64, Arc<Deletion>>>,
    next_id: AtomicU64,
    /// Notified when a deletion ends, and when one is orphaned.
    done: Notify,
}

/// One background deletion, run by its own task and, should that task stall or be dropped, by
/// others ([`Runner`]).
///
/// # Why every deletion ends while someone waits for it
///
/// [`Cleanup::searches_done`] (a latch's `close`) must return only once every deletion started
/// before it ended — the node is gone, or the session is dead — and must return then. A deletion
/// is run by its task, on the current runtime or the one the session remembered. That task may
/// never end: its runtime shuts down and drops it unfinished (a lock's attempt dropped by that
/// shutdown spawns its node's deletion on the runtime shutting down, review Q), or its runtime
/// is alive but no longer driven (a guard dropped outside any runtime spawns on the remembered
/// one, review R). So the deletion is not the task's: it is an entry here, counted until some
/// runner ends it, and any runner may end it (deleting a node twice, or looking for a GUID twice,
/// is harmless: the second finds it gone — and never finds another node in its place, however
/// late it runs. Every lock node's name carries a GUID, and no create uses a GUID again once a
/// node of it had a known path: an attempt whose node was found deleted creates its next one
/// with a new GUID (review S: one that kept its GUID could make its own old path again in a lock
/// directory deleted and made again, whose sequence numbers start over). So no other node, of any
/// session, ever has a path we delete. (A GUID is reused only to retry a create whose outcome was
/// unknown: no node of it had a known path, and it is looked for by GUID and session.)
/// - A deletion whose every runner was dropped unfinished is *orphaned*: `searches_done` is woken
///   and runs it at once, and a runner is spawned on the remembered runtime too. (Dropped
///   unpolled, by a runtime shutting down, that runner owns nothing and orphans nothing.)
/// - A deletion not ended [`STALLED`] after it started is run by one `searches_done` as well,
///   beside its task: that task may sit on a runtime nobody drives. While that `searches_done` is
///   polled it keeps the deletion to itself; should it stop being polled (its runtime no longer
///   driven), another takes the deletion up a second later. (The cost: a delete whose reply takes
///   over a second, a connection loss included, is sent once more while a latch closes.)
///
/// So a `searches_done` that is polled runs every deletion started before it that has not ended,
/// orphaned or stalled, to its end itself, and returns only when none of them is left. Without a `searches_done`, an
/// orphaned deletion with no live runtime waits, and its node goes away when the session ends.
struct Deletion {
    id: u64,
    client: zk::Client,
    /// What to delete. (Run by another runner than its first, a marked delete is a plain one: its
    /// `multi` may have been applied, and an unmarked release only makes the next grant wait.)
    target: Target,
    /// When a `searches_done` may run it beside its runners (see [`STALLED`]): a second after it
    /// started; kept a second ahead by the `searches_done` that runs it, for as long as that one
    /// is polled. So concurrent `searches_done`s do not each run every stalled deletion (reviews S
    /// and T), yet one that took it up and is no longer polled holds it up for a second only.
    due: Mutex<Instant>,
    /// Runners alive (polled or not).
    runners: AtomicUsize,
    /// Run by the first runner to end the deletion with the node gone.
    gone: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The runtime the session remembered, where an orphaned deletion is started again.
    runtime: Option<Handle>,
}

impl std::fmt::Debug for Deletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deletion").field("id", &self.id).field("target", &self.target).finish_non_exhaustive()
    }
}

/// How long after its start a deletion not ended is also run by [`Cleanup::searches_done`]. Its
/// task normally ends it within a round trip; one retrying across a connection loss is helped to
/// no harm (one more delete, queued until the connection is back).
const STALLED: Duration = Duration::from_secs(1);

/// One runner of a [`Deletion`]: its task, a task started again, or a `searches_done`. Dropped
/// before it ended the deletion, it orphans the deletion if it was the last runner.
struct Runner {
    searches: Arc<Searches>,
    deletion: Arc<Deletion>,
}

impl Runner {
    fn new(searches: Arc<Searches>, deletion: Arc<Deletion>) -> Runner {
        deletion.runners.fetch_add(1, Ordering::SeqCst);
        Runner { searches, deletion }
    }

    /// Runs the deletion to its end, and ends it for every runner: as its first runner
    /// (`Some(first)`: its first request if already sent), or again (`None`).
    async fn run(self, first: Option<Option<FirstDelete>>) -> Result<()> {
        let deletion = &self.deletion;
        let (target, sent) = match (first, &deletion.target) {
            (Some(sent), target) => (target.clone(), sent),
            // Again: plain (see `Deletion::target`).
            (None, Target::Released { path, .. }) => (Target::Path(path.clone()), None),
            (None, target) => (target.clone(), None),
        };
        let result = delete_until_gone(deletion.client.clone(), target, sent).await;
        self.searches.end(deletion, result.is_ok());
        result
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if self.deletion.runners.fetch_sub(1, Ordering::SeqCst) == 1 && self.searches.is_running(self.deletion.id) {
            self.searches.orphaned(&self.deletion);
        }
    }
}

impl Searches {
    fn is_running(&self, id: u64) -> bool {
        lock(&self.running).contains_key(&id)
    }

    /// Ends `deletion` (the first call only): no longer counted; `gone` runs if the node is gone.
    fn end(&self, deletion: &Deletion, node_gone: bool) {
        if lock(&self.running).remove(&deletion.id).is_none() {
            return;
        }
        let gone = lock(&deletion.gone).take();
        if let (true, Some(gone)) = (node_gone, gone) {
            gone();
        }
        // Each `searches_done` waits for the deletions started before it (cheap without waiters).
        self.done.notify_waiters();
    }

    /// Every runner of `deletion` was dropped before it ended: wakes `searches_done` to run it,
    /// and starts a runner on the remembered runtime.
    fn orphaned(self: &Arc<Self>, deletion: &Arc<Deletion>) {
        debug!(target = ?deletion.target, "a lock node's deletion was dropped unfinished; starting it again");
        self.done.notify_waiters();
        if let Some(runtime) = &deletion.runtime {
            // The runner is made when the task first runs: dropped unpolled, it owns nothing.
            let (searches, deletion) = (self.clone(), deletion.clone());
            drop(runtime.spawn(async move {
                if searches.is_running(deletion.id) {
                    let _ = Runner::new(searches, deletion).run(None).await;
                }
            }));
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

    /// Resolves once every background deletion started on this cleanup's session before the call
    /// (by any recipe on it, by GUID or by path) has ended: every node given to a cleanup before
    /// is deleted then, or the session is dead. Deletions started later are not waited for (on a
    /// busy session there may always be one; review T). Runs itself every such deletion orphaned,
    /// or stalled [`STALLED`] (see [`Deletion`]). Cancel safe: a deletion only it was running is
    /// orphaned again.
    pub(crate) async fn searches_done(&self) {
        let searches = &self.searches;
        // Ids are handed out in order: those below this were started before the call.
        let horizon = searches.next_id.load(Ordering::SeqCst);
        let mut running_here: HashSet<u64> = HashSet::new();
        let mut runs = FuturesUnordered::new();
        loop {
            let done = searches.done.notified();
            tokio::pin!(done);
            // Registered before `running` is read: an end, or an orphaning, in between is not
            // missed.
            done.as_mut().enable();
            let now = Instant::now();
            // While this call runs a deletion, nobody else needs to: its `due` is kept a second
            // ahead, and this loop comes round at least every half second to keep it so. A call
            // no longer polled stops keeping it, and another takes the deletion up a second later.
            let mut next_wake: Option<Instant> = (!running_here.is_empty()).then(|| now + STALLED / 2);
            let help: Vec<Arc<Deletion>> = {
                let running = lock(&searches.running);
                let mut before = running.values().filter(|deletion| deletion.id < horizon).peekable();
                if before.peek().is_none() {
                    return;
                }
                before
                    .filter(|deletion| {
                        let mut due = lock(&deletion.due);
                        if running_here.contains(&deletion.id) {
                            *due = now + STALLED;
                            return false;
                        }
                        if deletion.runners.load(Ordering::SeqCst) == 0 || *due <= now {
                            *due = now + STALLED;
                            return true;
                        }
                        next_wake = Some(next_wake.map_or(*due, |next| next.min(*due)));
                        false
                    })
                    .cloned()
                    .collect()
            };
            for deletion in help {
                debug!(target = ?deletion.target, "running a lock node's deletion left unfinished");
                running_here.insert(deletion.id);
                runs.push(Runner::new(searches.clone(), deletion).run(None));
            }
            let wake = async {
                match next_wake {
                    Some(at) => pause(at.saturating_duration_since(Instant::now())).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut done => {},
                Some(_) = runs.next() => {},
                () = wake => {},
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
        let current = Handle::try_current().ok();
        let outside_runtime = current.is_none();
        let Some(handle) = current.or_else(|| self.runtime.get().cloned()) else {
            warn!(?target, "no tokio runtime to delete a lock node on; it goes away when the session ends");
            return None;
        };
        let client = self.client.clone();
        let first: Option<FirstDelete> = match &target {
            Target::Path(path) => Some(Box::pin(client.delete(path, None))),
            // Sent by the task (the `multi` borrows the client), below.
            Target::Released { .. } | Target::Protected { .. } => None,
        };
        // Counted until some runner ends it (see `Deletion`): `searches_done` waits for every
        // deletion on the session, by GUID or by path (one retried after a connection loss
        // included).
        let id = self.searches.next_id.fetch_add(1, Ordering::Relaxed);
        let released = matches!(target, Target::Released { .. });
        let deletion = Arc::new(Deletion {
            id,
            client,
            target,
            due: Mutex::new(Instant::now() + STALLED),
            runners: AtomicUsize::new(0),
            gone: Mutex::new(gone),
            runtime: self.runtime.get().cloned(),
        });
        // Counted as run before it is listed: a `searches_done` that saw it listed with no runner
        // would take it for orphaned and send a needless delete (seen once in CI, 1,001 deletes
        // for 1,000 releases).
        let runner = Runner::new(self.searches.clone(), deletion.clone());
        lock(&self.searches.running).insert(id, deletion);
        let task = runner.run(Some(first));
        if released && outside_runtime {
            // A clean release marked for a lock-delay, outside any runtime: its `multi` is sent
            // now, by a first poll here, so the node goes even if the runtime the task is spawned
            // on is not driven (review R). (On a runtime, it is sent when the task first runs: a
            // release so marked is not ordered before what the caller sends next.)
            let mut task = Box::pin(task);
            let mut context = Context::from_waker(Waker::noop());
            if let Poll::Ready(result) = task.as_mut().poll(&mut context) {
                return Some(handle.spawn(std::future::ready(result)));
            }
            return Some(handle.spawn(task));
        }
        Some(handle.spawn(task))
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

    /// Cancel safe; also outside any runtime ([`pause`]).
    pub(crate) async fn wait(&mut self) {
        pause(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}

/// Sleeps `duration`. Cancel safe. Should it ever be polled outside any runtime (a latch's
/// confirmation is polled there only when the session remembers no runtime, and then has no
/// deletion to run), a thread of its own keeps the time rather than a panic.
async fn pause(duration: Duration) {
    if Handle::try_current().is_ok() {
        tokio::time::sleep(duration).await;
    } else {
        let (woken, wake) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            std::thread::sleep(duration);
            let _ = woken.send(());
        });
        let _ = wake.await;
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
    /// The attempt's node prefix (its directory and GUID), shared with the attempt.
    prefix: NodePrefix,
    /// The node's path once known, shared with the attempt's node.
    path: Option<Arc<str>>,
    armed: bool,
    /// A create of this attempt may have been sent (see [`not_sent_yet`](Self::not_sent_yet)).
    sent: bool,
    /// A create of this attempt had an unknown outcome: a node with its GUID may exist.
    maybe_applied: bool,
    /// On a lock with a lock-delay, what a give-up writes as it deletes the node: a served mark,
    /// or no mark (`Some(None)`) when it read none (a node never handed to the application ended
    /// no hold: `engine/delay.rs`, *Give-ups and waits cut short*). `None`: a plain delete.
    give_up_mark: Option<Option<u32>>,
}

/// `<dir>/<protection><lock name>`: what the creates of one acquire attempt name their node
/// from. Once the node's path is known, the prefix is read from that path (which begins with
/// it): a queued waiter keeps one copy of either (issue 24).
#[derive(Clone, Debug)]
pub(crate) struct NodePrefix {
    /// The prefix, or a path that begins with it.
    text: Arc<str>,
    /// Where the directory ends (the `/` after it).
    dir_end: u32,
    /// Where the protection (`_c_<guid>-`) ends.
    protection_end: u32,
    /// Where the prefix ends.
    end: u32,
}

impl NodePrefix {
    /// (Offsets as `u32`: every queued waiter keeps one of these in its pending node. A path
    /// longer than 4 GiB cannot be sent to ZooKeeper; its offsets saturate, and the server
    /// refuses it.)
    pub(crate) fn new(dir: &str, protection: &str, lock_name: &str) -> NodePrefix {
        let text: Arc<str> = format!("{dir}/{protection}{lock_name}").into();
        let at = |offset: usize| u32::try_from(offset).unwrap_or(u32::MAX);
        NodePrefix {
            dir_end: at(dir.len()),
            protection_end: at(dir.len() + 1 + protection.len()),
            end: at(text.len()),
            text,
        }
    }

    /// The whole prefix: a sequential create's path.
    pub(crate) fn as_str(&self) -> &str {
        self.text.get(..self.end as usize).unwrap_or_default()
    }

    /// The lock directory.
    pub(crate) fn dir(&self) -> &str {
        self.text.get(..self.dir_end as usize).unwrap_or_default()
    }

    /// The attempt's protection, `_c_<guid>-`.
    pub(crate) fn protection(&self) -> &str {
        self.text.get(self.dir_end as usize + 1..self.protection_end as usize).unwrap_or_default()
    }

    /// Reads the prefix from `path` from now on, if it begins with it (one allocation less).
    fn share(&mut self, path: &Arc<str>) {
        if path.starts_with(self.as_str()) {
            self.text = path.clone();
        }
    }
}

impl PendingNode {
    pub(crate) fn new(cleanup: Arc<Cleanup>, prefix: NodePrefix) -> PendingNode {
        PendingNode { cleanup, prefix, path: None, armed: true, sent: true, maybe_applied: false, give_up_mark: None }
    }

    /// A give-up deletes the node (once its path is known) with a write of `served` as its
    /// directory's data, in one `multi`: `served` must be a mark read from the directory instance
    /// the node is in, or `None` — no mark — when none was read (`engine/delay.rs`, *Give-ups and
    /// waits cut short*).
    pub(crate) fn give_up_with_mark(&mut self, served: Option<u32>) {
        self.give_up_mark = Some(served);
    }

    /// Nothing of this attempt is sent yet: dropped before [`sending`](Self::sending), it looks
    /// for nothing (an acquire cancelled while it waits for a place in the session's window of
    /// creates would otherwise start a listing of the directory in the background, for a node
    /// that cannot exist: review W). Every create of such a pending node must call `sending`
    /// first.
    pub(crate) fn not_sent_yet(mut self) -> PendingNode {
        self.sent = false;
        self
    }

    /// A create of this attempt is about to be sent (before the request is made).
    pub(crate) fn sending(&mut self) {
        self.sent = true;
    }

    /// A create's outcome was unknown: it may have been applied (now or later).
    pub(crate) fn maybe_applied(&mut self) {
        self.maybe_applied = true;
    }

    /// Records the node's path once the create reply (or a GUID search) told us.
    pub(crate) fn created(&mut self, path: Arc<str>) {
        self.prefix.share(&path);
        self.path = Some(path);
    }

    /// The attempt's node prefix.
    pub(crate) fn prefix(&self) -> &NodePrefix {
        &self.prefix
    }

    /// Gives up the node whose path we know (it was found deleted; if it is not, it is deleted
    /// now), so that the next create starts afresh.
    pub(crate) fn abandon_node(&mut self) {
        if let Some(path) = self.path.take() {
            self.cleanup.delete(Target::Path(path.to_string()));
        }
    }

    /// Replaced by a pending node of its own for the attempt's next create, once
    /// [`abandon_node`](Self::abandon_node) gave up the node whose path it knew: dropped, it
    /// still looks for a node with its GUID should a create of unknown outcome have been applied.
    pub(crate) fn retire(mut self) {
        if !self.maybe_applied && self.path.is_none() {
            self.armed = false;
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
            (Some(path), Some(served)) => Target::Released { path: path.to_string(), served },
            (Some(path), None) => Target::Path(path.to_string()),
            (None, _) => {
                Target::Protected { dir: self.prefix.dir().to_owned(), protection: self.prefix.protection().to_owned() }
            },
        }
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if self.armed && self.sent {
            debug!(target = ?self.target(), "abandoned acquire: deleting its lock node in the background");
            self.cleanup.delete(self.target());
        }
    }
}
