//! [`InterProcessMutex`]: a fair, re-entrant, cancellation-safe distributed mutex
//! (Curator's `InterProcessMutex`).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tracing::{field, info_span, Instrument};
use zookeeper_client as zk;

use crate::acl::AclList;
use crate::cleanup::retry_unknown;
use crate::client::{RecipeClient, SessionContext};
use crate::driver::StandardDriver;
use crate::engine::{Grant, LockInternals, LockNode, Wait};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::metrics::{self, Outcome};
use crate::naming::MUTEX_LOCK_NAME;
use crate::path::{refuse_reserved, validate_syntax};
use crate::session::HoldFeed;
use crate::state::{LockState, LossPolicy};

/// The `recipe` label of this recipe's metrics.
const RECIPE: &str = "mutex";

const MUTEX_DRIVER: StandardDriver = StandardDriver { lock_name: MUTEX_LOCK_NAME, max_leases: 1 };

/// A fair, re-entrant mutex shared by every process that uses the same ZooKeeper lock path.
///
/// Each acquire queues an `EPHEMERAL_SEQUENTIAL` node `_c_<uuid>-lock-<sequence>` under the lock
/// path (Curator's naming, so Curator's `InterProcessMutex` on the same path contends with this
/// one), and is granted the lock when its node is the first in sequence order. Waiters watch only
/// their immediate predecessor, so a release wakes exactly one waiter. Grants are first come,
/// first served.
///
/// **Re-entrancy is scoped to a critical section.** [`with_lock`](Self::with_lock) acquires the
/// lock and runs a future inside a *lock scope*: any acquire of this mutex made inside that future
/// (directly or in functions it calls, also in futures it polls with `join!` or `select!`)
/// re-enters at once with another [`LockGuard`] of the same hold, counted like Curator's
/// re-entrant acquires; the lock node is deleted when the last guard of the hold is released.
/// Outside a lock scope every acquire queues — also one made by the task that just acquired and
/// handed its guard to another task, one of several futures a task polls at once, one in a
/// task spawned inside a critical section (`tokio::spawn` does not carry the scope), and one in a
/// task that code inside the critical section drives (a `LocalSet`'s `run_until`: the scope
/// belongs to the task polling it, not to whatever runs during that poll): each waits like
/// another process would. So no usage lets two holders overlap; the price is that an acquire
/// of a lock already held outside a scope by the same task waits for itself (as a
/// `std::sync::Mutex` would) — use `acquire_timeout` or `with_lock` where that can happen.
///
/// **Cancel safety.** Every acquire method may be cancelled at any `.await` (dropped,
/// `tokio::time::timeout`, `select!`): the lock node it may have created — even one whose create
/// reply never arrived — is deleted by a background task that retries until the node is gone or
/// the session is dead.
///
/// **Sessions.** A lock is only as good as the ZooKeeper session that holds it. One monitor per
/// session tells every hold when the session is lost, stalled or past its loss deadline (see
/// [`LossPolicy`]). Built on a [`ManagedClient`](crate::ManagedClient), the mutex survives a
/// session expiry: holds report it, and acquires queue again on the new session. Built on a
/// plain `zookeeper_client::Client`, it is dead with that session: acquires fail with
/// [`Error::SessionLost`].
///
/// `InterProcessMutex` is cheap to clone (clones are the same mutex) and is
/// `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zookeeper_client::Client) -> zk_recipes::Result<()> {
/// use std::time::Duration;
/// use zk_recipes::InterProcessMutex;
///
/// let mutex = InterProcessMutex::new(client, "/locks/orders")?;
/// let guard = mutex.acquire().await?;
/// println!("holding {} with fencing token {}", guard.lock_path(), guard.fencing_token());
/// guard.release().await?;
///
/// if let Some(guard) = mutex.acquire_timeout(Duration::from_secs(3)).await? {
///     // ... critical section ...
///     drop(guard); // released in the background
/// }
///
/// // A critical section with re-entry: nested acquires of `mutex` inside re-enter at once.
/// let inner = mutex.clone();
/// let total = mutex.with_lock(|guard| async move {
///     let again = inner.acquire().await?; // re-enters: same hold, same fencing token
///     assert_eq!(again.fencing_token(), guard.fencing_token());
///     Ok::<_, zk_recipes::Error>(42)
/// }).await??;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct InterProcessMutex {
    inner: Arc<MutexInner>,
}

impl std::fmt::Debug for InterProcessMutex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterProcessMutex")
            .field("path", &self.path())
            .field("held_in_this_process", &self.is_acquired_in_this_process())
            .finish_non_exhaustive()
    }
}

pub(crate) struct MutexInner {
    pub(crate) internals: LockInternals,
    /// The holds of this mutex with their guard counts: at most one granted at a time, plus lost
    /// ones whose guards are still alive (a short list; a map would cost more per held lock).
    holds: Mutex<Vec<HoldEntry>>,
    next_hold: std::sync::atomic::AtomicU64,
}

tokio::task_local! {
    /// The lock scopes the current future runs in (innermost last); see [`Scope`] for who may
    /// re-enter them.
    static LOCK_SCOPES: Vec<Scope>;
}

/// One lock scope of [`InterProcessMutex::with_lock`]: which mutex, which hold, and which tokio
/// task is polling the scope's future.
///
/// # Who may re-enter a scope
/// The rule: an acquire of the scope's mutex re-enters the scope's hold only if it sees the scope
/// in `LOCK_SCOPES` **and** the current tokio task (`tokio::task::try_id()`) is the one recorded as
/// polling the scope's future (`owner`). The invariant this keeps:
///
/// > Every re-entering acquire is part of the scope's own future — code it runs, awaits, joins or
/// > selects while it is being polled — and never another task.
///
/// 1. `LOCK_SCOPES` is a task-local: tokio sets it (on this thread) only while the scope's future
///    is polled or dropped, so an acquire that sees the scope runs inside that poll. Besides the
///    scope's own future, that can be a task some executor polls from inside it: a `LocalSet`
///    driven by `run_until`, a runtime's `block_on` under `block_in_place` (the review found the
///    first: a task-local alone let a `LocalSet` task re-enter — two holders). A task spawned onto
///    a runtime runs in a poll of its own and does not see the scope at all.
/// 2. Right before each poll of the scope's future, `with_lock` records the id of the task polling
///    it (`None` when it is polled outside any tokio task, e.g. by `Runtime::block_on`).
/// 3. Tokio sets the current task id for exactly the span of each task's poll and restores the
///    previous one when that poll returns, also for tasks polled inside another's poll (`LocalSet`
///    tasks, tasks of a nested runtime); task ids are unique in the process. So during the poll of
///    the scope's future by task T, code running with T's id is T's own poll — the scope's future
///    and the futures it polls in place with the same context (`join!`, `select!`, `timeout`,
///    a `block_on` it blocks on): they must re-enter, and do. A tokio task driven from inside has
///    its own id, differs from the owner and queues like any other task. Futures joined in place
///    keep re-entering, since nothing but a task poll changes the id.
/// 4. The owner is recorded per poll, not once at entry: a scope future moved to another task
///    between polls has the new task as owner, and the task that entered the scope cannot come
///    back through a later poll by someone else.
///
/// Limit: executors other than tokio's set no task id. Tasks of such an executor (e.g.
/// `futures::executor::LocalPool`) driven from inside a critical section carry the id of the task
/// polling the scope (or none) and cannot be told apart from the scope's own future: do not drive
/// them from inside `with_lock`.
#[derive(Clone)]
struct Scope {
    mutex: Weak<MutexInner>,
    hold: Arc<Hold>,
    owner: Arc<ScopeOwner>,
}

/// The tokio task polling a scope's future now (`None` outside any tokio task).
#[derive(Default)]
struct ScopeOwner(Mutex<Option<tokio::task::Id>>);

impl ScopeOwner {
    fn set(&self, task: Option<tokio::task::Id>) {
        *crate::session::lock(&self.0) = task;
    }

    fn is(&self, task: Option<tokio::task::Id>) -> bool {
        *crate::session::lock(&self.0) == task
    }
}

/// One hold of the lock: our node, shared by all of its guards, and what the session monitor
/// tells about it.
#[derive(Debug)]
pub(crate) struct Hold {
    id: u64,
    pub(crate) node: LockNode,
    pub(crate) feed: Arc<HoldFeed>,
    /// The session holding the lock (not necessarily the client's current one).
    pub(crate) context: Arc<SessionContext>,
    #[cfg(feature = "metrics")]
    granted: std::time::Instant,
}

#[derive(Debug)]
struct HoldEntry {
    hold: Arc<Hold>,
    guards: usize,
}

/// One process in the lock's queue, as listed by [`InterProcessMutex::participants`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Participant {
    /// Full path of the participant's lock node.
    pub path: String,
    /// The sequence number of its node (queue position order).
    pub sequence: i64,
    /// The bytes stored in its node (see [`MutexBuilder::node_data`]).
    pub data: Vec<u8>,
    /// Whether this participant holds the lock (it is first in the queue).
    pub is_holder: bool,
    /// The ZooKeeper session that owns the node (its `ephemeralOwner`).
    pub session_id: i64,
}

/// Builds an [`InterProcessMutex`] with options; see [`InterProcessMutex::builder`].
#[derive(Clone)]
#[must_use]
pub struct MutexBuilder {
    client: RecipeClient,
    path: String,
    node_data: Vec<u8>,
    acls: Option<Vec<zk::Acl>>,
    loss_policy: LossPolicy,
    max_request_bytes: usize,
    min_session_timeout: Option<Duration>,
}

impl std::fmt::Debug for MutexBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MutexBuilder")
            .field("client", &self.client)
            .field("path", &self.path)
            .field("node_data_len", &self.node_data.len())
            .field("acls", &self.acls.as_ref().map(Vec::len))
            .field("loss_policy", &self.loss_policy)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("min_session_timeout", &self.min_session_timeout)
            .finish()
    }
}

/// ZooKeeper's default request size limit (`jute.maxbuffer`, `0xfffff`).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 0xfffff;

/// What a create request carries besides the node's path and data: headers, the ACL, the mode
/// (about 60 bytes), with room to spare.
const CREATE_OVERHEAD: usize = 256;

/// What a missing level of the lock path adds to the `multi` that creates it with the lock node:
/// the op's header, its path's and data's length prefixes, the mode and the ACL count (about 29
/// bytes), with room to spare; its path and ACL are counted apart.
const MULTI_LEVEL_OVERHEAD: usize = 64;

/// The node name the server gives a lock node: `_c_<36-char uuid>-lock-<10 digits>`.
const LOCK_NODE_NAME_LEN: usize = 3 + 36 + 1 + MUTEX_LOCK_NAME.len() + 10;

impl MutexBuilder {
    /// The largest request the server accepts, in bytes: its `jute.maxbuffer` (default
    /// [`DEFAULT_MAX_REQUEST_BYTES`], 1 MiB − 1). [`build`](Self::build) refuses node data and
    /// lock paths whose create request would exceed it: the server answers such a request by
    /// dropping the connection, which would cost every other hold of the session its lock.
    pub fn max_request_bytes(mut self, limit: usize) -> MutexBuilder {
        self.max_request_bytes = limit;
        self
    }

    /// The smallest session timeout any server of the ensemble may negotiate for the client's
    /// sessions (see [`ManagedClientBuilder::min_session_timeout`](crate::ManagedClientBuilder::min_session_timeout),
    /// which says how to compute it): for a plain `zookeeper_client::Client`, or to go lower
    /// than the managed client's. It applies to the whole session monitor of the sessions this
    /// mutex acquires on (every hold of those sessions counts with the lowest floor stated).
    pub fn min_session_timeout(mut self, floor: Duration) -> MutexBuilder {
        self.min_session_timeout = Some(floor);
        self
    }

    /// When a lost connection means a lost lock; see [`LossPolicy`]. The default is
    /// [`LossPolicy::Suspended`], Curator's standard: any disconnection loses the lock.
    pub fn loss_policy(mut self, policy: LossPolicy) -> MutexBuilder {
        self.loss_policy = policy;
        self
    }

    /// Bytes stored in each lock node this mutex creates, e.g. `host:port` of the holder, so
    /// operators (and [`InterProcessMutex::participants`]) can tell who holds or waits.
    /// Curator's default is the local IP address; ours is empty.
    pub fn node_data(mut self, data: impl Into<Vec<u8>>) -> MutexBuilder {
        self.node_data = data.into();
        self
    }

    /// The ACLs of the nodes this mutex creates: its lock nodes, and the container nodes of a
    /// lock path that does not exist yet. Default: the [`ManagedClient`](crate::ManagedClient)'s
    /// [`acls`](crate::ManagedClientBuilder::acls), or `world:anyone` with all rights on a plain
    /// client (Curator's default).
    ///
    /// Who may queue for, release or block a lock is decided by the ACL of the lock path itself
    /// (create and delete rights live on the parent): protect the lock path, e.g. with
    /// `zookeeper_client::Acls::creator_all()` on an authenticated client. See the README's
    /// Security section.
    pub fn acls(mut self, acls: impl Into<AclList>) -> MutexBuilder {
        self.acls = Some(acls.into().into());
        self
    }

    /// Validates the path and the sizes and builds the mutex. Nothing is sent to ZooKeeper until
    /// the first acquire.
    ///
    /// The path is checked as the server will see it, with the client's chroot in front: a path
    /// in `/zookeeper` (reserved by the server) is refused on a client without a chroot and
    /// accepted under one (the server sees `<chroot>/zookeeper/...`).
    ///
    /// # Errors
    /// [`Error::InvalidPath`] for a path ZooKeeper would refuse, [`Error::TooLarge`] when a lock
    /// node's create request would exceed [`max_request_bytes`](Self::max_request_bytes): the
    /// path with the client's chroot, the data, and the creates of the lock path's levels, which
    /// are sent with the lock node's when they are missing (so the longer the path, the less
    /// node data fits).
    pub fn build(self) -> Result<InterProcessMutex> {
        validate_syntax(&self.path)?;
        // The client prepends its chroot to every path it sends (`path()` is "/" without one).
        let chroot = match self.client.context().client().path() {
            "/" => String::new(),
            chroot => chroot.to_owned(),
        };
        refuse_reserved(&self.path, &format!("{chroot}{}", self.path))?;
        let limit = self.max_request_bytes;
        let acls = self.acls.unwrap_or_else(|| self.client.default_acls());
        // Each ACL: its permissions, and the scheme and id with their lengths.
        let acl_size: usize = acls.iter().map(|acl| 12 + acl.scheme().len() + acl.id().len()).sum();
        // The path the server receives: chroot, lock path, '/', node name.
        let server_path_len = chroot.len() + self.path.len();
        // Missing levels of the lock path are created in the same request (a `multi`, see
        // `engine.rs`): count every level, each with the chroot in front, as if all were missing.
        let levels_size: usize = (self.path.match_indices('/').skip(1).map(|(at, _)| at))
            .chain(std::iter::once(self.path.len()))
            .map(|level_len| chroot.len() + level_len + MULTI_LEVEL_OVERHEAD + acl_size)
            .sum();
        let path_size = server_path_len + 1 + LOCK_NODE_NAME_LEN + CREATE_OVERHEAD + acl_size + levels_size;
        if path_size > limit {
            return Err(Error::TooLarge { what: "lock path", size: server_path_len, limit });
        }
        if path_size + self.node_data.len() > limit {
            return Err(Error::TooLarge { what: "node data", size: self.node_data.len(), limit });
        }
        let internals = LockInternals::new(
            self.client,
            self.path,
            self.node_data,
            acls,
            self.loss_policy,
            self.min_session_timeout,
        );
        Ok(InterProcessMutex {
            inner: Arc::new(MutexInner {
                internals,
                holds: Mutex::new(Vec::new()),
                next_hold: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }
}

impl InterProcessMutex {
    /// A mutex on the lock path `path` (absolute, relative to the client's chroot if any).
    ///
    /// Missing parents are created as container nodes on the first acquire, in one `multi` with
    /// its lock node (so the server removes them once empty, also after a cancelled acquire).
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it
    /// is too long for the server (see [`MutexBuilder::build`]).
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<InterProcessMutex> {
        Self::builder(client, path).build()
    }

    /// A builder for a mutex with options.
    ///
    /// ```no_run
    /// # fn demo(client: zookeeper_client::Client) -> zk_recipes::Result<()> {
    /// let mutex = zk_recipes::InterProcessMutex::builder(client, "/locks/orders")
    ///     .node_data(b"host-a:4242".to_vec())
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> MutexBuilder {
        MutexBuilder {
            client: client.into(),
            path: path.into(),
            node_data: Vec::new(),
            acls: None,
            loss_policy: LossPolicy::default(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            min_session_timeout: None,
        }
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        self.inner.internals.dir()
    }

    /// Waits until the lock is held and returns a guard for it.
    ///
    /// Inside a [`with_lock`](Self::with_lock) scope of this mutex, returns at once with another
    /// guard of the scope's hold (re-entry). Keeps waiting across disconnections.
    ///
    /// Cancel safe: if the future is dropped, no lock node is left behind.
    ///
    /// # Errors
    /// [`Error::SessionLost`] if the session expires (or the client is closed),
    /// [`Error::LockLost`] on re-entry into a scope whose hold was lost, [`Error::NoAuth`] when
    /// ACLs refuse us, [`Error::Runtime`] on a tokio runtime without timers, and
    /// [`Error::ZooKeeper`] for other failures.
    pub async fn acquire(&self) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.acquire_with(Wait::Forever, None).await? {
                return Ok(guard);
            }
        }
    }

    /// Takes the lock if it is free right now; `Ok(None)` if another holder or an earlier waiter
    /// is ahead of us — and also, at once, while the connection is down (a
    /// [`ManagedClient`](crate::ManagedClient)'s [`Suspended`](crate::ConnectionState::Suspended))
    /// or when it goes down during the call: the session may still be alive, but the lock cannot
    /// be taken now (a node the call may have created is deleted in the background). On a
    /// `ManagedClient` between an expiry and the new session, fails with [`Error::SessionLost`]
    /// instead of waiting for the session. Never waits for a holder nor for a connection (it
    /// does talk to ZooKeeper: a create, a listing and, when the lock is taken, a delete).
    /// Re-enters inside a lock scope, like `acquire`.
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::No, None).await
    }

    /// Waits at most `timeout` for the lock; `Ok(None)` if it was not granted in time — also when
    /// a [`ManagedClient`](crate::ManagedClient) had no session for the whole time (its
    /// [`state`](crate::ManagedClient::state) tells the two apart). Our queued node is then
    /// deleted in the background.
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::Forever, Some(timeout)).await
    }

    /// Acquires the lock, runs `critical_section` inside a lock scope, and releases the lock when
    /// it completes (or is cancelled). `critical_section` gets a guard of the hold (for its
    /// fencing token, `lost()`, `fenced_writer()`); any acquire of this mutex made while it runs —
    /// in it or in anything it awaits — re-enters the same hold at once (re-entry counts, as in
    /// Curator). Tasks it spawns, and tasks of an executor it drives (a `LocalSet`), are outside
    /// the scope and queue like anyone else: re-entry is for the tokio task polling the scope's
    /// future (tasks of executors other than tokio's, driven from inside, cannot be told apart
    /// from it: do not drive them in a critical section).
    ///
    /// The lock node is deleted once the last guard of the hold is gone: guards moved out of the
    /// scope keep the lock held. The release is sent before this returns (and completes in the
    /// background), so a later acquire on the same client queues behind it.
    ///
    /// Cancel safe: dropping the future releases the lock in the background.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); once the lock is held, the output of `critical_section` is
    /// returned whatever happens to the lock — watch `guard.lost()` inside to stop early.
    pub async fn with_lock<F, Fut, T>(&self, critical_section: F) -> Result<T>
    where
        F: FnOnce(LockGuard) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire().await?;
        let for_section = self.reenter_hold(&guard.hold)?.ok_or_else(|| self.released_meanwhile())?;
        let mut scopes = LOCK_SCOPES.try_with(Clone::clone).unwrap_or_default();
        let owner = Arc::new(ScopeOwner::default());
        scopes.push(Scope { mutex: Arc::downgrade(&self.inner), hold: guard.hold.clone(), owner: owner.clone() });
        let mut scoped = std::pin::pin!(LOCK_SCOPES.scope(scopes, critical_section(for_section)));
        // Who may re-enter: the task polling the scope's future, recorded at every poll (`Scope`).
        let output = std::future::poll_fn(|cx| {
            owner.set(tokio::task::try_id());
            scoped.as_mut().poll(cx)
        })
        .await;
        drop(guard);
        Ok(output)
    }

    async fn acquire_with(&self, wait: Wait, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        let started = std::time::Instant::now();
        if let Some(hold) = self.scope_hold() {
            if let Some(guard) = self.reenter_hold(&hold)? {
                metrics::acquire(RECIPE, Outcome::Reentered, started.elapsed());
                return Ok(Some(guard));
            }
        }
        let result = self.queue(wait, timeout).await;
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) if timeout.is_some() => Outcome::TimedOut,
            Ok(None) => Outcome::NotAvailable,
            Err(_) => Outcome::Failed,
        };
        metrics::acquire(RECIPE, outcome, started.elapsed());
        result
    }

    /// An acquire that queues a node (no re-entry).
    async fn queue(&self, wait: Wait, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        let span = info_span!("acquire", lock_path = %self.path(), sequence = field::Empty);
        let attempt = self.inner.internals.attempt(&MUTEX_DRIVER, wait).instrument(span);
        let node = match timeout {
            None => attempt.await?,
            Some(timeout) => {
                // The timeout's timer would panic on a runtime without timers: say so instead.
                crate::session::check_runtime()?;
                tokio::time::timeout(timeout, attempt).await.unwrap_or(Ok(None))?
            },
        };
        Ok(node.map(|grant| self.register(grant)))
    }

    fn holds(&self) -> MutexGuard<'_, Vec<HoldEntry>> {
        // A panic while holding this std mutex cannot leave the map inconsistent (every update is
        // a single insert/remove/increment), so a poisoned lock is still usable.
        self.inner.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The hold of the innermost lock scope of this mutex the current future runs in, if the
    /// current task is the one polling that scope's future (see [`Scope`] for why).
    fn scope_hold(&self) -> Option<Arc<Hold>> {
        let me = Arc::as_ptr(&self.inner);
        let task = tokio::task::try_id();
        LOCK_SCOPES
            .try_with(|scopes| {
                scopes
                    .iter()
                    .rev()
                    .find(|scope| scope.mutex.as_ptr() == me && scope.owner.is(task))
                    .map(|scope| scope.hold.clone())
            })
            .ok()
            .flatten()
    }

    /// Another guard of `hold` (re-entry); fails if the hold was lost, `None` if every guard of
    /// it is already released (its node is gone: it cannot be re-entered).
    fn reenter_hold(&self, hold: &Arc<Hold>) -> Result<Option<LockGuard>> {
        if let LockState::Lost(reason) = hold.context.session.state(&hold.feed) {
            return Err(Error::LockLost { path: self.path().to_owned(), reason });
        }
        let mut holds = self.holds();
        let Some(entry) = holds.iter_mut().find(|entry| entry.hold.id == hold.id) else {
            return Ok(None);
        };
        entry.guards += 1;
        Ok(Some(LockGuard::new(self.inner.clone(), hold.clone())))
    }

    fn released_meanwhile(&self) -> Error {
        Error::LockLost { path: self.path().to_owned(), reason: crate::state::LossReason::NodeDeleted }
    }

    fn register(&self, Grant { node, feed, context, handoff }: Grant) -> LockGuard {
        if handoff {
            metrics::handoff(RECIPE);
        }
        let id = self.inner.next_hold.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hold = Arc::new(Hold {
            id,
            node,
            feed,
            context,
            #[cfg(feature = "metrics")]
            granted: std::time::Instant::now(),
        });
        self.holds().push(HoldEntry { hold: hold.clone(), guards: 1 });
        LockGuard::new(self.inner.clone(), hold)
    }

    /// Lists everyone queued on this lock path, holder first, with the data of their nodes.
    /// Nodes that are not lock nodes are left out.
    ///
    /// # Errors
    /// [`Error::NoAuth`] if we may not list the lock path or read a node, [`Error::SessionLost`]
    /// if the session is dead, [`Error::ZooKeeper`] for other failures.
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        let internals = &self.inner.internals;
        let context = internals.context();
        let client = context.client();
        let children = internals.sorted_children(MUTEX_LOCK_NAME).await?;
        let paths: Vec<String> = children.iter().map(|c| format!("{}/{}", internals.dir(), c.name)).collect();
        // All reads are sent before any reply is awaited.
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(path)).collect();
        let mut participants = Vec::with_capacity(children.len());
        for ((child, path), read) in children.iter().zip(&paths).zip(reads) {
            let (data, stat) = match read.await {
                Ok(read) => read,
                Err(zk::Error::NoNode) => continue,
                Err(_) => match retry_unknown(|| client.get_data(path)).await {
                    Ok(read) => read,
                    Err(zk::Error::NoNode) => continue,
                    Err(err) => return Err(Error::zk("read lock node", path, err)),
                },
            };
            let is_holder = participants.is_empty();
            participants.push(Participant {
                path: path.clone(),
                sequence: child.sequence,
                data,
                is_holder,
                session_id: stat.ephemeral_owner,
            });
        }
        Ok(participants)
    }

    /// Whether any task in this process holds the lock through this mutex (or its clones).
    pub fn is_acquired_in_this_process(&self) -> bool {
        !self.holds().is_empty()
    }

    /// Whether the current future runs inside a [`with_lock`](Self::with_lock) scope of this
    /// mutex, in the task polling that scope (where acquires re-enter).
    pub fn is_held_in_current_scope(&self) -> bool {
        self.scope_hold().is_some()
    }
}

impl MutexInner {
    /// Drops one guard of `hold`; returns the node to delete when it was the hold's last.
    pub(crate) fn release_guard(&self, hold: &Arc<Hold>) -> Option<LockNode> {
        let mut holds = self.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = holds.iter().position(|entry| entry.hold.id == hold.id)?;
        let entry = &mut holds[at];
        entry.guards -= 1;
        if entry.guards > 0 {
            return None;
        }
        // Released: what happens to the node from now on is no loss. (Told before the node's
        // delete is sent, so the monitor hears of the release before the deletion.)
        hold.context.session.release(&hold.feed);
        #[cfg(feature = "metrics")]
        metrics::hold_ended(RECIPE, hold.granted.elapsed());
        Some(holds.swap_remove(at).hold.node.clone())
    }
}
