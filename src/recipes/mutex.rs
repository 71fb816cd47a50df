//! [`InterProcessMutex`]: a fair, re-entrant, cancellation-safe distributed mutex
//! (Curator's `InterProcessMutex`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::{field, info_span, Instrument};
use zookeeper_client as zk;

use crate::engine::driver::{Decision, LockDriver, StandardDriver};
use crate::engine::naming::{LockChild, MUTEX_LOCK_NAME, MUTEX_QUEUE};
use crate::engine::{LockInternals, Wait};
use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::holds::{Hold, Holds};
use crate::hold::scope::{run_in_scope, scope_hold};
use crate::metrics::{self, Outcome};
use crate::recipes::builder::LockBuilder;
use crate::session::cleanup::retry_unknown;
use crate::session::client::RecipeClient;
use crate::session::monitor::check_runtime;
use crate::state::LossReason;
use crate::sync::Record;

/// The `recipe` label of this recipe's metrics.
const RECIPE: &str = "mutex";

pub(crate) static MUTEX_DRIVER: StandardDriver = StandardDriver { queue: MUTEX_QUEUE, kind: 0, max_leases: 1 };

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
/// [`LossPolicy`](crate::LossPolicy)). Built on a [`ManagedClient`](crate::ManagedClient), the mutex survives a
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

struct MutexInner {
    /// The engine, shared with the other lock kinds of the same recipe (a read/write lock's).
    internals: Arc<LockInternals>,
    /// The holds of this mutex; also what identifies it to lock scopes.
    holds: Arc<Holds>,
    /// Who holds the lock, whom a waiter watches.
    driver: &'static dyn LockDriver,
    /// How an acquire outside this lock's own scopes enters (`None`: it queues).
    entry: Option<EntryRule>,
    /// The `recipe` label of its metrics.
    recipe: &'static str,
}

/// How an acquire that is not a re-entry enters the lock, for a lock that is one kind of a recipe
/// with several: a read/write lock's read lock is granted at once beside its write node inside a
/// scope of its write lock (the downgrade), its write lock refuses to be acquired inside a scope
/// of its read lock.
///
/// A rule is a function of the holds of the recipe's other kind (and the lock path, for its
/// errors), kept inline: a boxed rule object was an allocation per lock object (issue 24).
pub(crate) struct EntryRule {
    /// Decides the entry; called when the acquire starts, in the acquiring task (where lock scopes
    /// are seen).
    pub(crate) rule: fn(other: &Arc<Holds>, path: &str) -> Result<Entry>,
    /// The holds of the recipe's other kind.
    pub(crate) other: Arc<Holds>,
}

/// See [`EntryRule`].
pub(crate) enum Entry {
    /// Queue with the lock's driver.
    Queue,
    /// Create a node of the lock's kind *beside* the node of `anchor` (named with its sequence
    /// number, in the same place of the queue), granted at once: a hold downgraded from `anchor`.
    Beside { anchor: Record<Hold> },
}

/// Builds an [`InterProcessMutex`] with options; see [`InterProcessMutex::builder`].
pub type MutexBuilder = LockBuilder<InterProcessMutex>;

impl LockBuilder<InterProcessMutex> {
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
        let internals = Arc::new(self.internals(MUTEX_LOCK_NAME)?);
        Ok(InterProcessMutex::of_kind(internals, Holds::new(RECIPE), &MUTEX_DRIVER, None))
    }

    /// A semaphore's internal lock, its metrics labelled `recipe`: a mutex whose holders and
    /// waiters do not watch their own nodes (`engine/leases.rs`, *The internal lock*).
    pub(crate) fn build_internal_lock(self, recipe: &'static str) -> Result<InterProcessMutex> {
        let internals = Arc::new(self.internals(MUTEX_LOCK_NAME)?.without_own_node_watch());
        Ok(InterProcessMutex::of_kind(internals, Holds::new(recipe), &MUTEX_DRIVER, None))
    }
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
    /// Whether this participant holds the lock by the lock's rule, from the nodes listed ahead
    /// of it: for a mutex, it is first in the queue; for a read lock, no write node is ahead of
    /// it. (A read granted by a downgrade, beside its write node, may be listed `false` while that
    /// write node exists.)
    pub is_holder: bool,
    /// The ZooKeeper session that owns the node (its `ephemeralOwner`).
    pub session_id: i64,
}

impl Participant {
    /// The participant id stored in the node: its data as UTF-8 (invalid bytes replaced), e.g.
    /// the `id` of a [`LeaderLatch`](crate::LeaderLatch) or Curator's participant id.
    pub fn id(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

impl InterProcessMutex {
    /// One kind of lock on `internals`' lock path: its own holds and scopes, nodes queued with
    /// `driver`, acquires entering by `entry`.
    pub(crate) fn of_kind(
        internals: Arc<LockInternals>,
        holds: Arc<Holds>,
        driver: &'static dyn LockDriver,
        entry: Option<EntryRule>,
    ) -> InterProcessMutex {
        let recipe = holds.recipe();
        InterProcessMutex { inner: Arc::new(MutexInner { internals, holds, driver, entry, recipe }) }
    }

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
        LockBuilder::new(client.into(), path.into())
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
            if let Some(guard) = self.acquire_with(Wait::Forever, None, None).await? {
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
        self.acquire_with(Wait::No, None, None).await
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
        self.acquire_with(Wait::Forever, Some(timeout), None).await
    }

    /// Waits until the lock is held, with a hold lease of `lease` (Redisson's `lock(leaseTime)`):
    /// unless [`extend`](LockGuard::extend)ed, the hold ends `Lost(LeaseExpired)` `lease` after the
    /// grant and the library releases the lock (see [`MutexBuilder::lease`]). Overrides the
    /// builder's lease for this acquire; a re-entry moves the end of the hold's lease (all guards
    /// of a hold share one) to `lease` from now, or gives the hold one.
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.acquire_with(Wait::Forever, None, Some(lease)).await? {
                return Ok(guard);
            }
        }
    }

    /// Waits at most `timeout` for the lock, then holds it with a lease of `lease` (Redisson's
    /// `tryLock(waitTime, leaseTime)`); `Ok(None)` if it was not granted in time.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout_with_lease(&self, timeout: Duration, lease: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::Forever, Some(timeout), Some(lease)).await
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
        let holds = &self.inner.holds;
        let for_section = LockGuard::reentered(holds, &guard.hold)?.ok_or_else(|| self.released_meanwhile())?;
        let output = run_in_scope(holds, guard.hold.clone(), critical_section(for_section)).await;
        drop(guard);
        Ok(output)
    }

    #[allow(clippy::manual_async_fn)] // an `async` block keeps the arguments once (`queue`)
    fn acquire_with(
        &self,
        wait: Wait,
        timeout: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + '_ {
        async move {
            let started = std::time::Instant::now();
            if let Some(hold) = scope_hold(&self.inner.holds) {
                if let Some(guard) = LockGuard::reentered(&self.inner.holds, &hold)? {
                    metrics::acquire(self.inner.recipe, Outcome::Reentered, started.elapsed());
                    // A lease asked for on re-entry moves the hold's lease (shared by its guards).
                    if let Some(lease) = lease {
                        guard.extend(lease)?;
                    }
                    return Ok(Some(guard));
                }
            }
            // Only the anchor is kept across the await (an `Entry` result would be, at its 72 bytes,
            // in every queued waiter's future: matched as a temporary, never bound to a name).
            let anchor = match self
                .inner
                .entry
                .as_ref()
                .map_or(Ok(Entry::Queue), |rule| (rule.rule)(&rule.other, self.path()))
            {
                Ok(Entry::Queue) => None,
                Ok(Entry::Beside { anchor }) => Some(anchor),
                Err(err) => {
                    metrics::acquire(self.inner.recipe, Outcome::Failed, started.elapsed());
                    return Err(err);
                },
            };
            let result = self.queue(anchor, wait, timeout, lease).await;
            let outcome = match &result {
                Ok(Some(_)) => Outcome::Acquired,
                Ok(None) if timeout.is_some() => Outcome::TimedOut,
                Ok(None) => Outcome::NotAvailable,
                Err(_) => Outcome::Failed,
            };
            metrics::acquire(self.inner.recipe, outcome, started.elapsed());
            result
        }
    }

    /// An acquire that queues a node with the lock's driver (no re-entry) — or, with `anchor`,
    /// creates one beside the anchor's node and is granted at once (a downgrade from it).
    /// An `async` block over the arguments, not an `async fn`, which would keep them twice in
    /// every queued waiter's future (rust-lang/rust#62958; issue 24).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn queue(
        &self,
        anchor: Option<Record<Hold>>,
        wait: Wait,
        timeout: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + '_ {
        async move {
            let driver = self.inner.driver;
            let span = info_span!(
                "acquire",
                lock_path = %self.path(),
                lock = driver.lock_name(),
                beside = anchor.as_ref().map(|anchor| anchor.node.sequence),
                sequence = field::Empty
            );
            let internals = &self.inner.internals;
            // Pinned where it lives: moved into the timeout instead, it would be laid out twice in this
            // future (every queued waiter's memory).
            let node = {
                let attempt = std::pin::pin!(async {
                    match &anchor {
                        None => internals.attempt(driver, wait).await,
                        // Boxed: a downgrade is rare, and its state would otherwise be laid out beside
                        // the common attempt's in every acquire's future (every queued waiter's memory).
                        Some(anchor) => {
                            Box::pin(internals.attempt_beside(driver, &anchor.node, &anchor.context, wait)).await
                        },
                    }
                }
                .instrument(span));
                match timeout {
                    None => attempt.await?,
                    Some(timeout) => {
                        // The timeout's timer would panic on a runtime without timers: say so instead.
                        check_runtime()?;
                        // Boxed (the timer, not the attempt): laid out beside the attempt, it would
                        // grow every queued waiter's future, with a timeout or not.
                        Box::pin(tokio::time::timeout(timeout, attempt)).await.unwrap_or(Ok(None))?
                    },
                }
            };
            let Some(guard) = node.map(|grant| LockGuard::granted(&self.inner.holds, grant, anchor)) else {
                return Ok(None);
            };
            // The hold's lease (this acquire's, else the lock's), from the grant.
            if let Some(lease) = lease.or(self.inner.internals.hold_lease()) {
                guard.extend(lease)?;
            }
            Ok(Some(guard))
        }
    }

    fn released_meanwhile(&self) -> Error {
        Error::LockLost { path: self.path().to_owned(), reason: LossReason::NodeDeleted }
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
        let children = internals.sorted_children(self.inner.driver.queue()).await?;
        let paths: Vec<String> = children.iter().map(|c| format!("{}/{}", internals.dir(), c.name)).collect();
        // All reads are sent before any reply is awaited.
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(path)).collect();
        let mut participants = Vec::with_capacity(children.len());
        let mut present: Vec<&LockChild> = Vec::with_capacity(children.len());
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
            // Whether the driver grants it the lock with the nodes listed ahead of it.
            let is_holder =
                self.inner.driver.decide(child.kind, &mut present.iter().rev().copied()) == Decision::Acquired;
            present.push(child);
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

    /// Waits for the background deletions by GUID of abandoned attempts (whose create reply never
    /// came), then one round trip on the current session (a listing of the lock path): answered
    /// after every request sent on the session before it, such as the delete of an abandoned node
    /// whose path was known.
    /// A runtime for background work of this lock (see `LockInternals::runtime`).
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.inner.internals.runtime()
    }

    pub(crate) async fn round_trip(&self) -> Result<()> {
        self.inner.internals.settled().await;
        self.inner.internals.sorted_children(self.inner.driver.queue()).await.map(drop)
    }

    /// The holds of this lock in this process.
    pub(crate) fn holds(&self) -> &Holds {
        &self.inner.holds
    }

    /// Whether any task in this process holds the lock through this mutex (or its clones).
    pub fn is_acquired_in_this_process(&self) -> bool {
        !self.inner.holds.is_empty()
    }

    /// Whether the current future runs inside a [`with_lock`](Self::with_lock) scope of this
    /// mutex, in the task polling that scope (where acquires re-enter).
    pub fn is_held_in_current_scope(&self) -> bool {
        scope_hold(&self.inner.holds).is_some()
    }
}
