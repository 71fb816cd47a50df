//! Data watches on nodes: the one primitive both the acquire loop (watching a predecessor and
//! our own node) and the session monitor (watching a held node) wait on.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::{debug, warn};
use zookeeper_client as zk;

use crate::error::{session_dead, transient};
use crate::session::cleanup::{Backoff, Cleanup};

/// How many times a watch refused by the server (`NoAuth`, ...) is retried before giving up.
const MAX_WATCH_REFUSALS: usize = 3;

/// A data watch on a lock node, resolving when it fires. The watch request is sent when the
/// future is first polled.
pub(crate) struct NodeWatch {
    /// Whether the server confirmed the watch (and so that the node existed then).
    armed: Armed,
    /// `None`: a watch not sent ([`never`](Self::never), [`unset`](Self::unset)).
    fired: Option<WatchFuture>,
}

/// What [`NodeWatch::is_armed`] reads.
enum Armed {
    /// A watch never sent that counts as armed ([`NodeWatch::never`]).
    Always,
    /// A watch not sent (yet) ([`NodeWatch::unset`]).
    Not,
    /// Set once the server confirmed the watch.
    Flag(Arc<AtomicBool>),
    /// A watch whose confirmation nobody reads ([`watch_sibling`]): never armed.
    Untracked,
}

/// The future of a watch, boxed.
pub(crate) type WatchFuture = Pin<Box<dyn Future<Output = Watched> + Send + 'static>>;

impl NodeWatch {
    /// A watch that is never sent and never fires, counted as armed: for a node whose deletion
    /// its owner does not need to hear of (see `LockInternals::without_own_node_watch`).
    pub(crate) fn never() -> NodeWatch {
        NodeWatch { armed: Armed::Always, fired: None }
    }

    /// A watch not sent (yet), which never fires and is not armed: a queued waiter's own-node
    /// watch until its turn is near (`engine/mod.rs`, `wait_for_turn`).
    pub(crate) fn unset() -> NodeWatch {
        NodeWatch { armed: Armed::Not, fired: None }
    }

    /// Whether this is an [`unset`](Self::unset) watch.
    pub(crate) fn is_unset(&self) -> bool {
        matches!(self.armed, Armed::Not)
    }

    /// The watch as a plain future (its "armed" flag no longer needed); `None` for a watch never
    /// sent, which would never resolve (review K: queued with the session's own-node watches,
    /// every semaphore acquire's internal-lock hold kept one for as long as the runtime ran).
    pub(crate) fn into_future(self) -> Option<WatchFuture> {
        self.fired
    }

    /// Whether the server has confirmed the watch (and so that the node existed then).
    pub(crate) fn is_armed(&self) -> bool {
        match &self.armed {
            Armed::Always => true,
            Armed::Not | Armed::Untracked => false,
            Armed::Flag(armed) => armed.load(Ordering::SeqCst),
        }
    }
}

impl Future for NodeWatch {
    type Output = Watched;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Watched> {
        match self.fired.as_mut() {
            Some(fired) => fired.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

/// Sets a data watch on `path` and waits for it to fire. Connection trouble while setting it is
/// retried; the client re-registers set watches after a reconnection by itself.
///
/// Keep the returned future until it fires where possible: dropping an armed watch makes the
/// client send a request to remove it.
pub(crate) fn watch_node(cleanup: Arc<Cleanup>, path: Arc<str>) -> NodeWatch {
    let armed = Arc::new(AtomicBool::new(false));
    let fired = Box::pin(watch_once(cleanup, NodePath::Path(path), Some(armed.clone())));
    NodeWatch { armed: Armed::Flag(armed), fired: Some(fired) }
}

/// [`watch_node`] on the node `name` beside the node at `sibling` (in its directory), without the
/// "armed" flag: for a watch whose owner only waits for it to fire (a waiter's predecessor), so
/// [`NodeWatch::is_armed`] stays false. Neither the path nor the flag is allocated (issue 24).
pub(crate) fn watch_sibling(cleanup: Arc<Cleanup>, sibling: Arc<str>, name: Arc<str>) -> NodeWatch {
    let fired = Box::pin(watch_once(cleanup, NodePath::Sibling { sibling, name }, None));
    NodeWatch { armed: Armed::Untracked, fired: Some(fired) }
}

/// Where a watched node is.
enum NodePath {
    Path(Arc<str>),
    /// The node `name` in the directory of the node at `sibling`.
    Sibling {
        sibling: Arc<str>,
        name: Arc<str>,
    },
}

impl NodePath {
    fn path(&self) -> Cow<'_, str> {
        match self {
            NodePath::Path(path) => Cow::Borrowed(path),
            NodePath::Sibling { sibling, name } => {
                let dir = sibling.rsplit_once('/').map_or("", |(dir, _)| dir);
                Cow::Owned(format!("{dir}/{name}"))
            },
        }
    }
}

/// [`watch_node`]'s future; `set` is set once the server confirmed the watch.
///
/// Setting the watch (the request, its retries) runs in a box of its own, freed once the watch
/// is set: what is kept while waiting for the event is the client's watcher and little else.
/// An `async` block over the arguments, not an `async fn`, which would keep them twice
/// (rust-lang/rust#62958).
#[allow(clippy::manual_async_fn)] // on purpose: see above
fn watch_once(
    cleanup: Arc<Cleanup>,
    path: NodePath,
    set: Option<Arc<AtomicBool>>,
) -> impl Future<Output = Watched> + Send + 'static {
    async move {
        // A node we may not read (its ACL) cannot be watched: ZooKeeper sends no event about it
        // to a session without READ. Its directory's children are watched instead.
        let mut readable = true;
        loop {
            let watcher = match Box::pin(async {
                let path = path.path();
                tracing::trace!(path = &*path, "setting a data watch");
                arm(&cleanup, &path, &mut readable).await
            })
            .await
            {
                Ok(watcher) => watcher,
                Err(watched) => return watched,
            };
            // Only a data watch on the node itself orders its deletion before later events of
            // the session (see `wait_for_turn`); a directory watch does not.
            if let Some(set) = &set {
                set.store(readable, Ordering::SeqCst);
            }
            if let Some(watched) = Watched::from_event(watcher.changed().await) {
                return watched;
            }
        }
    }
}

impl Watched {
    /// What an event of a watch set by [`arm`] reports; `None` when the node's directory changed
    /// (a children watch: the node may still be listed, arm again).
    pub(crate) fn from_event(event: zk::WatchedEvent) -> Option<Watched> {
        match event.event_type {
            zk::EventType::NodeDeleted => Some(Watched::Deleted),
            zk::EventType::Session if event.session_state.is_terminated() => {
                Some(Watched::SessionDead(event.session_state))
            },
            zk::EventType::NodeChildrenChanged => None,
            _ => Some(Watched::Other),
        }
    }
}

/// Sets a data watch on `path` (a children watch on its directory once the node proved not
/// `readable`), retrying connection trouble; `Err` with what to report when there is nothing to
/// wait for (the node is gone, the session dead, the watch refused). Its event is read with
/// [`Watched::from_event`].
pub(crate) async fn arm(cleanup: &Cleanup, path: &str, readable: &mut bool) -> Result<zk::OneshotWatcher, Watched> {
    let client = cleanup.client();
    let mut backoff = Backoff::new();
    let mut refusals = 0;
    loop {
        let watched = if *readable {
            client.get_and_watch_data(path).await.map(|(_, _, watcher)| Some(watcher))
        } else {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("/", path));
            let dir = if dir.is_empty() { "/" } else { dir };
            client
                .list_and_watch_children(dir)
                .await
                .map(|(children, watcher)| children.iter().any(|child| child == name).then_some(watcher))
        };
        match watched {
            Ok(Some(watcher)) => return Ok(watcher),
            // Gone (a children watch left armed is removed with its watcher).
            Ok(None) | Err(zk::Error::NoNode) => return Err(Watched::Deleted),
            Err(zk::Error::NoAuth) if *readable => {
                debug!(path, "lock node not readable; watching its directory instead");
                *readable = false;
            },
            Err(err) if transient(&err) => backoff.wait().await,
            Err(err) if session_dead(&err) => return Err(Watched::SessionDead(client.state())),
            Err(err) => {
                refusals += 1;
                if refusals >= MAX_WATCH_REFUSALS {
                    return Err(Watched::Refused(err));
                }
                warn!(path, %err, "cannot watch lock node; retrying");
                backoff.wait().await;
            },
        }
    }
}

/// What a data watch on a lock node reported.
pub(crate) enum Watched {
    /// The node is gone.
    Deleted,
    /// The session ended (expired, closed, authentication failed).
    SessionDead(zk::SessionState),
    /// Something else changed (data); watch again if still interested.
    Other,
    /// The server refused the watch repeatedly (`NoAuth`, ...).
    Refused(zk::Error),
}
