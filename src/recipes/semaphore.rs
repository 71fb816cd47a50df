//! [`InterProcessSemaphoreV2`] and its [`Lease`]s (Curator's `InterProcessSemaphoreV2`), and
//! [`InterProcessSemaphoreMutex`], a semaphore of one lease (Curator's).
//!
//! Curator's layout and protocol, so Curator and this crate share a semaphore path:
//! - `<path>/locks`: an internal mutex (Curator's `InterProcessMutex`, `_c_<uuid>-lock-<seq>`)
//!   that serialises acquirers; its holder is the only acquirer with a lease node not yet
//!   granted, and the only one that watches `leases`.
//! - `<path>/leases`: one `_c_<uuid>-lease-<seq>` node (`EPHEMERAL_SEQUENTIAL`, the lease's
//!   data) per lease; a lease is granted once a listing after its create shows at most
//!   `max_leases` children. `engine/leases.rs` proves that no more than `max_leases` granted
//!   leases exist at once, whatever the timing.
//!
//! An acquire: take the internal lock (an engine mutex: a handoff there costs no listing), create
//! the lease nodes with a listing pipelined behind them (one round trip when the pool has room),
//! wait on `leases` while it is full, then release the internal lock in the background — the
//! next acquirer is granted by that delete while this one already returns its leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{field, info_span, Instrument};
use zookeeper_client as zk;

use crate::engine::naming::{self, LEASE_NAME, LEASE_QUEUE};
use crate::engine::LockInternals;
use crate::error::{Error, Result};
use crate::hold::fenced::FencedWriter;
use crate::hold::guard::{FencingToken, LockGuard, LossSignal};
use crate::hold::holds::Holds;
use crate::metrics::{self, Outcome};
use crate::recipes::builder::LockBuilder;
use crate::recipes::mutex::InterProcessMutex;
use crate::session::cleanup::retry_unknown;
use crate::session::client::RecipeClient;
use crate::session::monitor::check_runtime;
use crate::state::{LockState, LossReason};

/// The `recipe` label of the semaphore's metrics (its internal lock's: `semaphore_lock`).
const RECIPE: &str = "semaphore";
/// The `recipe` label of the semaphore mutex's metrics.
const MUTEX_RECIPE: &str = "semaphore_mutex";
/// The `recipe` label of a semaphore's internal lock's metrics.
const LOCK_RECIPE: &str = "semaphore_lock";

/// Curator's names of the two directories under a semaphore's path.
const LOCKS_DIR: &str = "locks";
const LEASES_DIR: &str = "leases";

/// A counting semaphore shared by every process that uses the same ZooKeeper path: at most
/// `max_leases` [`Lease`]s are held at once, across all processes and Curator's
/// `InterProcessSemaphoreV2` on the same path.
///
/// Acquirers are served first come, first served: each waits its turn for an internal lock
/// (`<path>/locks`), whose holder creates its lease node in `<path>/leases` and, if the pool is
/// full, waits there until a lease is returned — so only one acquirer at a time watches the
/// pool, and a returned lease wakes exactly one. `max_leases` is a convention among the users of
/// a path, as in Curator: every child of `<path>/leases` counts, however it got there.
///
/// **A lease is a hold.** Like a lock guard it has a state (`Held / Suspended / Lost`), a
/// [`lost`](Lease::lost) future, a loss policy and a fencing token; it is told it was lost —
/// its session past its loss deadline, its node deleted — before ZooKeeper can count one lease
/// fewer for anyone else.
///
/// **Cancel safety.** Every acquire may be cancelled at any `.await` (dropped, a timeout,
/// `select!`): the lease nodes and the internal lock node it may have created are deleted by a
/// background task that retries until they are gone or the session is dead. A timed acquire
/// that runs out returns `Ok(None)` and leaves nothing behind either.
///
/// **Sessions.** On a [`ManagedClient`](crate::ManagedClient) an acquire interrupted by a session
/// expiry starts again on the new session; on a plain `zookeeper_client::Client` it fails with
/// [`Error::SessionLost`].
///
/// Cheap to clone (clones are the same semaphore); `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// use std::time::Duration;
/// use zk_recipes::InterProcessSemaphoreV2;
///
/// let pool = InterProcessSemaphoreV2::new(&client, "/semaphores/db-pool", 3)?;
/// let lease = pool.acquire().await?;
/// // ... at most 3 holders run this at once ...
/// lease.release().await?;
///
/// if let Some(two) = pool.acquire_many_timeout(2, Duration::from_secs(1)).await? {
///     assert_eq!(two.len(), 2);
///     // dropped: both returned in the background
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct InterProcessSemaphoreV2 {
    inner: Arc<SemaphoreInner>,
}

struct SemaphoreInner {
    /// The internal lock on `<path>/locks`.
    lock: InterProcessMutex,
    /// The engine of the `<path>/leases` directory.
    leases: Arc<LockInternals>,
    /// The leases held through this semaphore in this process.
    holds: Arc<Holds>,
    max_leases: usize,
    path: String,
    recipe: &'static str,
}

impl std::fmt::Debug for InterProcessSemaphoreV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterProcessSemaphoreV2")
            .field("path", &self.inner.path)
            .field("max_leases", &self.inner.max_leases)
            .finish_non_exhaustive()
    }
}

/// Builds an [`InterProcessSemaphoreV2`] with options; see [`InterProcessSemaphoreV2::builder`].
/// The options apply to the lease nodes (their data, ACLs, loss policy) and to the internal
/// lock's nodes (ACLs, loss policy; no data).
pub type SemaphoreBuilder = LockBuilder<InterProcessSemaphoreV2>;

impl LockBuilder<InterProcessSemaphoreV2> {
    /// Validates the path, the sizes and `max_leases` and builds the semaphore. Nothing is sent to
    /// ZooKeeper until the first acquire.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `max_leases` is 0; otherwise as
    /// [`MutexBuilder::build`](crate::MutexBuilder::build), for the lease nodes' path
    /// `<path>/leases`.
    pub fn build(self, max_leases: usize) -> Result<InterProcessSemaphoreV2> {
        InterProcessSemaphoreV2::from_builder(self, max_leases, RECIPE)
    }
}

impl InterProcessSemaphoreV2 {
    /// A semaphore of `max_leases` leases on `path` (absolute, relative to the client's chroot if
    /// any). Every user of the path must agree on `max_leases`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `max_leases` is 0, [`Error::InvalidPath`] or
    /// [`Error::TooLarge`] for a path ZooKeeper would refuse.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>, max_leases: usize) -> Result<Self> {
        Self::builder(client, path).build(max_leases)
    }

    /// A builder for a semaphore with options (node data, ACLs, loss policy, ...); finish it with
    /// [`build(max_leases)`](SemaphoreBuilder::build).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> SemaphoreBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    fn from_builder<R>(builder: LockBuilder<R>, max_leases: usize, recipe: &'static str) -> Result<Self> {
        let path = builder.path().to_owned();
        if max_leases == 0 {
            return Err(Error::InvalidArgument { path, reason: "a semaphore needs at least one lease".into() });
        }
        // The path itself first, so that its errors name it rather than `<path>/leases`.
        builder.child::<()>("").node_data(Vec::new()).internals(LEASE_NAME)?;
        let leases = Arc::new(builder.child::<()>(LEASES_DIR).internals(LEASE_NAME)?);
        let lock = builder
            .child::<InterProcessMutex>(LOCKS_DIR)
            .node_data(Vec::new())
            .internal()
            .build_internal_lock(LOCK_RECIPE)?;
        let holds = Holds::new(recipe);
        Ok(InterProcessSemaphoreV2 {
            inner: Arc::new(SemaphoreInner { lock, leases, holds, max_leases, path, recipe }),
        })
    }

    /// The semaphore's path.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// How many leases the semaphore has.
    pub fn max_leases(&self) -> usize {
        self.inner.max_leases
    }

    /// Waits for one lease.
    ///
    /// Cancel safe: if the future is dropped, no lease node and no internal lock node is left.
    ///
    /// # Errors
    /// [`Error::SessionLost`] if the session ends on a plain client (a
    /// [`ManagedClient`](crate::ManagedClient) starts again on its new session),
    /// [`Error::Closed`], [`Error::NoAuth`] when ACLs refuse us, [`Error::ZooKeeper`] for other
    /// failures.
    pub async fn acquire(&self) -> Result<Lease> {
        let mut leases = self.acquire_leases(1, None, None).await?.unwrap_or_default();
        leases.pop().ok_or_else(|| self.no_lease())
    }

    /// Waits for `qty` leases, all or nothing: they are granted together, by one acquirer's
    /// turn, so two `acquire_many` never each hold part of what they need while waiting for the
    /// rest.
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `qty` is 0 or more than the semaphore's leases (it would
    /// wait for ever); otherwise as [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, qty: usize) -> Result<Vec<Lease>> {
        Ok(self.acquire_leases(qty, None, None).await?.unwrap_or_default())
    }

    /// Waits at most `timeout` for one lease; `Ok(None)` if none was granted in time (what the
    /// attempt created is then deleted in the background).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Lease>> {
        Ok(self.acquire_leases(1, Some(timeout), None).await?.and_then(|mut leases| leases.pop()))
    }

    /// Waits at most `timeout` for `qty` leases, all or nothing; `Ok(None)` if they were not
    /// granted in time.
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire_many_timeout(&self, qty: usize, timeout: Duration) -> Result<Option<Vec<Lease>>> {
        self.acquire_leases(qty, Some(timeout), None).await
    }

    /// Waits for one lease, held with a hold lease of `lease`: unless
    /// [`extend`](Lease::extend)ed, it is `Lost(LeaseExpired)` and returned `lease` after the grant
    /// (see [`SemaphoreBuilder::lease`](crate::LockBuilder::lease)). Overrides the builder's lease.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with_lease(&self, lease: Duration) -> Result<Lease> {
        let mut leases = self.acquire_leases(1, None, Some(lease)).await?.unwrap_or_default();
        leases.pop().ok_or_else(|| self.no_lease())
    }

    /// The paths of the nodes in `<path>/leases` — the leases held or being granted, by anyone —
    /// lease nodes in sequence order, any other child after them.
    ///
    /// # Errors
    /// [`Error::NoAuth`] if we may not list the path, [`Error::SessionLost`] if the session is
    /// dead, [`Error::ZooKeeper`] for other failures.
    pub async fn participant_nodes(&self) -> Result<Vec<String>> {
        let leases = &self.inner.leases;
        let context = leases.context();
        let dir = leases.dir();
        let mut names = match retry_unknown(|| context.client().list_children(dir)).await {
            Ok(names) => names,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(err) => return Err(Error::zk("list", dir, err)),
        };
        names.sort_by_key(|name| naming::parse_child(name, LEASE_QUEUE).map_or((1, 0), |(seq, _)| (0, seq)));
        Ok(names.into_iter().map(|name| format!("{dir}/{name}")).collect())
    }

    /// Whether any lease taken through this semaphore (or its clones) in this process is held.
    pub fn is_acquired_in_this_process(&self) -> bool {
        !self.inner.holds.is_empty()
    }

    fn no_lease(&self) -> Error {
        Error::LockLost { path: self.inner.path.clone(), reason: LossReason::NodeDeleted }
    }

    async fn acquire_leases(
        &self,
        qty: usize,
        timeout: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Vec<Lease>>> {
        let started = Instant::now();
        if qty == 0 || qty > self.inner.max_leases {
            return Err(Error::InvalidArgument {
                path: self.inner.path.clone(),
                reason: format!("cannot acquire {qty} leases of a semaphore of {}", self.inner.max_leases),
            });
        }
        let span = info_span!("acquire", lock_path = %self.inner.path, lock = LEASE_NAME, qty, sequence = field::Empty);
        // Pinned where it lives (as in the mutex: a future moved into the timeout is laid out twice).
        let attempt = std::pin::pin!(async { self.attempt(qty, lease).await.map(Some) }.instrument(span));
        let result = match timeout {
            None => attempt.await,
            // The timeout's timer would panic on a runtime without timers: say so instead.
            Some(timeout) => match check_runtime() {
                Ok(()) => tokio::time::timeout(timeout, attempt).await.unwrap_or(Ok(None)),
                Err(err) => Err(err),
            },
        };
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) => Outcome::TimedOut,
            Err(_) => Outcome::Failed,
        };
        metrics::acquire(self.inner.recipe, outcome, started.elapsed());
        result
    }

    /// Takes the internal lock, then the leases under it (see the module docs); again from the
    /// start if the internal lock is lost meanwhile or its session ends (a managed client's
    /// next session).
    async fn attempt(&self, qty: usize, lease: Option<Duration>) -> Result<Vec<Lease>> {
        let inner = &self.inner;
        loop {
            let lock = inner.lock.acquire().await?;
            let context = lock.hold.context.clone();
            let leases = inner.leases.attempt_leases(&context, qty, inner.max_leases, &lock.hold.node.path).await;
            match leases {
                Ok(grants) => {
                    // The internal lock is released in the background: its delete is sent now, and
                    // the next acquirer is granted by it while we return.
                    drop(lock);
                    let leases: Vec<Lease> = grants.into_iter().map(|grant| Lease::new(&inner.holds, grant)).collect();
                    // Each lease's hold lease (this acquire's, else the semaphore's), from the grant.
                    if let Some(duration) = lease.or(inner.leases.hold_lease()) {
                        for granted in &leases {
                            granted.extend(duration)?;
                        }
                    }
                    return Ok(leases);
                },
                // The lock went with the session; a managed client queues again on its next one
                // (a plain client's next acquire of the lock fails with this error).
                Err(Error::SessionLost { .. }) => continue,
                // The internal lock's node was deleted while we waited: someone else may hold the
                // lock now and wait beside us. Our lease nodes are gone (deleted when the attempt
                // returned); queue again.
                Err(Error::LockLost { .. }) => {
                    tracing::debug!(
                        path = inner.path,
                        "the semaphore's internal lock was lost while waiting for leases; starting again"
                    );
                    continue;
                },
                Err(err) => return Err(err),
            }
        }
    }
}

/// A lease of an [`InterProcessSemaphoreV2`] (or the hold of an [`InterProcessSemaphoreMutex`]):
/// one node in `<path>/leases`.
///
/// Returned with [`release`](Self::release), or by dropping it (in the background: the node is
/// deleted by a task that retries until it is gone or the session is dead). Like a lock guard it
/// knows its [`state`](Self::state) and resolves [`lost`](Self::lost) when it can no longer be
/// trusted. It may be moved to, and released from, any task. `Send + Sync + 'static`.
#[must_use = "dropping the lease returns it"]
pub struct Lease {
    guard: LockGuard,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("node", &self.node_path())
            .field("state", &self.guard.hold.feed.current())
            .finish_non_exhaustive()
    }
}

impl Lease {
    fn new(holds: &Arc<Holds>, grant: crate::engine::Grant) -> Lease {
        Lease { guard: LockGuard::granted(holds, grant, None) }
    }

    /// Full path of the lease node, e.g. `/sem/pool/leases/_c_<uuid>-lease-0000000007`.
    pub fn node_path(&self) -> &str {
        self.guard.lock_path()
    }

    /// What this process knows about the lease now: `Held`, `Suspended` (only under
    /// [`LossPolicy::SessionDeadline`](crate::LossPolicy::SessionDeadline)) or `Lost(reason)`,
    /// which is final.
    pub fn state(&self) -> LockState {
        self.guard.state()
    }

    /// Resolves once the lease can no longer be trusted, with the reason — before ZooKeeper can
    /// count it gone for any other acquirer. Cancel safe; any number of tasks may wait.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// An owned handle on this lease's loss (see [`LockGuard::loss_signal`]).
    pub fn loss_signal(&self) -> LossSignal {
        self.guard.loss_signal()
    }

    /// The `czxid` of the lease node. For a semaphore mutex it orders holders, like a lock's;
    /// for a semaphore of several leases it only orders leases, not holders of any one resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// A ZooKeeper transaction fenced by this lease: nothing is written once its node is gone
    /// (see [`FencedWriter`]).
    pub fn fenced_writer(&self) -> FencedWriter<'_> {
        self.guard.fenced_writer()
    }

    /// Moves the end of this lease's hold lease to `duration` from now, or gives it one (see
    /// [`LockGuard::extend`]): when it runs out, the lease is `Lost(LeaseExpired)` and returned.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lease is already lost or returned.
    pub fn extend(&self, duration: Duration) -> Result<()> {
        self.guard.extend(duration)
    }

    /// How long the lease stays certain if ZooKeeper answers nothing more (see
    /// [`LockGuard::certain_for`]).
    pub fn certain_for(&self) -> Option<Duration> {
        self.guard.certain_for()
    }

    /// Returns the lease: deletes its node and waits until ZooKeeper confirms (retrying across
    /// connection loss); `Ok` if the session died first.
    ///
    /// Cancel safe: if this future is dropped, the deletion still completes in the background.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

/// A mutex that is **not re-entrant**: a semaphore of one lease (Curator's
/// `InterProcessSemaphoreMutex`, same layout, so the two share a path).
///
/// Unlike [`InterProcessMutex`], a second acquire waits even in the task that holds the lock (so
/// [`acquire_timeout`](Self::acquire_timeout) there returns `Ok(None)`), and the [`Lease`] it
/// returns may be released by any task — the lock belongs to whoever has the lease, not to a
/// task or a scope.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// let job = zk_recipes::InterProcessSemaphoreMutex::new(&client, "/locks/nightly-job")?;
/// let lease = job.acquire().await?;
/// tokio::spawn(async move {
///     // ... the work, in another task, which returns the lock when done ...
///     lease.release().await
/// });
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InterProcessSemaphoreMutex {
    semaphore: InterProcessSemaphoreV2,
}

/// Builds an [`InterProcessSemaphoreMutex`] with options; see
/// [`InterProcessSemaphoreMutex::builder`].
pub type SemaphoreMutexBuilder = LockBuilder<InterProcessSemaphoreMutex>;

impl LockBuilder<InterProcessSemaphoreMutex> {
    /// Validates the path and the sizes and builds the mutex. Nothing is sent until the first
    /// acquire.
    ///
    /// # Errors
    /// As [`SemaphoreBuilder::build`].
    pub fn build(self) -> Result<InterProcessSemaphoreMutex> {
        Ok(InterProcessSemaphoreMutex { semaphore: InterProcessSemaphoreV2::from_builder(self, 1, MUTEX_RECIPE)? })
    }
}

impl InterProcessSemaphoreMutex {
    /// A semaphore mutex on `path`.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] or [`Error::TooLarge`] for a path ZooKeeper would refuse.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<Self> {
        Self::builder(client, path).build()
    }

    /// A builder for a semaphore mutex with options.
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> SemaphoreMutexBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        self.semaphore.path()
    }

    /// Waits until the lock is held. Cancel safe: nothing is left behind if the future is dropped.
    ///
    /// # Errors
    /// As [`InterProcessSemaphoreV2::acquire`].
    pub async fn acquire(&self) -> Result<Lease> {
        self.semaphore.acquire().await
    }

    /// Waits at most `timeout`; `Ok(None)` if the lock was not granted in time.
    ///
    /// # Errors
    /// As [`InterProcessSemaphoreV2::acquire`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Lease>> {
        self.semaphore.acquire_timeout(timeout).await
    }

    /// Whether the lock is held through this mutex (or its clones) in this process.
    pub fn is_acquired_in_this_process(&self) -> bool {
        self.semaphore.is_acquired_in_this_process()
    }

    /// The semaphore of one lease this mutex is.
    pub fn semaphore(&self) -> &InterProcessSemaphoreV2 {
        &self.semaphore
    }
}
