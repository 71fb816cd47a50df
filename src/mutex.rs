//! [`InterProcessMutex`]: a fair, re-entrant, cancellation-safe distributed mutex
//! (Curator's `InterProcessMutex`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tracing::{field, info_span, Instrument};
use zookeeper_client as zk;

use crate::cleanup::retry_unknown;
use crate::driver::StandardDriver;
use crate::engine::{Grant, LockInternals, LockNode, Wait};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::naming::MUTEX_LOCK_NAME;
use crate::path::validate_lock_path;
use crate::state::{monitor_hold, HoldState, LockState, LossPolicy, Released};

const MUTEX_DRIVER: StandardDriver = StandardDriver { lock_name: MUTEX_LOCK_NAME, max_leases: 1 };

/// A fair, re-entrant mutex shared by every process that uses the same ZooKeeper lock path.
///
/// Each acquire queues an `EPHEMERAL_SEQUENTIAL` node `_c_<uuid>-lock-<sequence>` under the lock
/// path (Curator's naming, so Curator's `InterProcessMutex` on the same path contends with this
/// one), and is granted the lock when its node is the first in sequence order. Waiters watch only
/// their immediate predecessor, so a release wakes exactly one waiter. Grants are first come,
/// first served.
///
/// **Re-entrancy.** The owner of a hold is the current tokio task (or the current thread when
/// not inside a task). An owner that already holds the lock through this `InterProcessMutex`
/// gets another [`LockGuard`] at once; the lock node is deleted when its last guard is released
/// or dropped. Other tasks — and other `InterProcessMutex` values, even on the same
/// `zookeeper_client::Client` — contend normally, like separate processes. Futures that one task
/// polls concurrently (`join!`, `select!`, `FuturesUnordered`, `for_each_concurrent`) share that
/// task as owner: the second would re-enter the first's hold. Build such mutexes with
/// [`reentrant(false)`](MutexBuilder::reentrant), where every acquire queues.
///
/// **Cancel safety.** Every acquire method may be cancelled at any `.await` (dropped,
/// `tokio::time::timeout`, `select!`): the lock node it may have created — even one whose create
/// reply never arrived — is deleted by a background task that retries until the node is gone or
/// the session is dead.
///
/// **Sessions.** A lock is only as good as the ZooKeeper session that holds it. If the session
/// expires, the `Client` is dead for good: acquires fail with [`Error::SessionLost`], and a new
/// `Client` (and `InterProcessMutex`) is needed.
///
/// `InterProcessMutex` is cheap to clone (clones share re-entrancy state) and is
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
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct InterProcessMutex {
    inner: Arc<MutexInner>,
}

#[derive(Debug)]
pub(crate) struct MutexInner {
    pub(crate) internals: LockInternals,
    /// The holds of this mutex by hold id (at most one granted at a time, plus lost ones whose
    /// guards are still alive).
    holds: Mutex<HashMap<u64, HoldEntry>>,
    next_hold: std::sync::atomic::AtomicU64,
    reentrant: bool,
    loss_policy: LossPolicy,
}

/// Who holds a re-entrant lock: a tokio task, or a thread outside any task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    pub(crate) fn current() -> Owner {
        match tokio::task::try_id() {
            Some(id) => Owner::Task(id),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}

/// One owner's hold of the lock: our node, shared by all of the owner's guards, and what is known
/// about it (kept up to date by a monitor task that ends when the hold is released or lost).
#[derive(Debug)]
pub(crate) struct Hold {
    id: u64,
    pub(crate) node: LockNode,
    pub(crate) owner: Owner,
    pub(crate) state: HoldState,
    /// Notified when the holder first looks at the state (see `state::monitor_hold`).
    pub(crate) interest: Arc<tokio::sync::Notify>,
    /// Notified when the owner's last guard is released.
    released: Arc<Released>,
}

#[derive(Debug)]
struct HoldEntry {
    hold: Arc<Hold>,
    guards: usize,
}

/// One process in the lock's queue, as listed by [`InterProcessMutex::participants`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Participant {
    /// Full path of the participant's lock node.
    pub path: String,
    /// The sequence number of its node (queue position order).
    pub sequence: i64,
    /// The bytes stored in its node (see [`MutexBuilder::node_data`]).
    pub data: Vec<u8>,
    /// Whether this participant holds the lock (it is first in the queue).
    pub is_holder: bool,
}

/// Builds an [`InterProcessMutex`] with options; see [`InterProcessMutex::builder`].
#[derive(Debug)]
#[must_use]
pub struct MutexBuilder {
    client: zk::Client,
    path: String,
    node_data: Vec<u8>,
    loss_policy: LossPolicy,
    reentrant: bool,
}

impl MutexBuilder {
    /// Whether an acquire by a task that already holds the lock through this mutex returns at
    /// once with another guard (re-entry, the default, as Curator's `InterProcessMutex`), or
    /// queues like any other acquire (as Curator's `InterProcessSemaphoreMutex`).
    ///
    /// Turn re-entry off when one task runs several acquiring futures concurrently — `join!`,
    /// `select!`, `FuturesUnordered`, `StreamExt::for_each_concurrent`: they all have the same
    /// owner (the task), so with re-entry the second would share the first's hold.
    pub fn reentrant(mut self, reentrant: bool) -> MutexBuilder {
        self.reentrant = reentrant;
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

    /// Validates the path and builds the mutex. Nothing is sent to ZooKeeper until the first
    /// acquire.
    pub fn build(self) -> Result<InterProcessMutex> {
        validate_lock_path(&self.path)?;
        let internals = LockInternals::new(self.client, self.path, self.node_data);
        Ok(InterProcessMutex {
            inner: Arc::new(MutexInner {
                internals,
                holds: Mutex::new(HashMap::new()),
                next_hold: std::sync::atomic::AtomicU64::new(0),
                reentrant: self.reentrant,
                loss_policy: self.loss_policy,
            }),
        })
    }
}

impl InterProcessMutex {
    /// A mutex on the lock path `path` (absolute, relative to the client's chroot if any).
    ///
    /// Fails with [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path. Missing parents
    /// are created as container nodes on the first acquire.
    pub fn new(client: zk::Client, path: impl Into<String>) -> Result<InterProcessMutex> {
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
    pub fn builder(client: zk::Client, path: impl Into<String>) -> MutexBuilder {
        MutexBuilder {
            client,
            path: path.into(),
            node_data: Vec::new(),
            loss_policy: LossPolicy::default(),
            reentrant: true,
        }
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        self.inner.internals.dir()
    }

    /// Waits until the lock is held and returns a guard for it.
    ///
    /// Returns at once with another guard if the current task already holds the lock through
    /// this mutex (re-entry). Keeps waiting across disconnections; fails if the session expires.
    ///
    /// Cancel safe: if the future is dropped, no lock node is left behind.
    pub async fn acquire(&self) -> Result<LockGuard> {
        loop {
            if let Some(guard) = self.acquire_with(Wait::Forever, None).await? {
                return Ok(guard);
            }
        }
    }

    /// Takes the lock if it is free right now; `Ok(None)` if another holder or an earlier waiter
    /// is ahead of us. Never waits for a holder (it does talk to ZooKeeper: a create, a listing
    /// and, when the lock is taken, a delete).
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::No, None).await
    }

    /// Waits at most `timeout` for the lock; `Ok(None)` if it was not granted in time. Our queued
    /// node is then deleted in the background.
    ///
    /// Cancel safe, like [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(Wait::Forever, Some(timeout)).await
    }

    async fn acquire_with(&self, wait: Wait, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        let owner = Owner::current();
        if self.inner.reentrant {
            if let Some(guard) = self.reenter(owner)? {
                return Ok(Some(guard));
            }
        }
        let span = info_span!("acquire", lock_path = %self.path(), sequence = field::Empty);
        let attempt = self.inner.internals.attempt(&MUTEX_DRIVER, wait).instrument(span);
        let node = match timeout {
            None => attempt.await?,
            Some(timeout) => tokio::time::timeout(timeout, attempt).await.unwrap_or(Ok(None))?,
        };
        Ok(node.map(|grant| self.register(owner, grant)))
    }

    fn holds(&self) -> MutexGuard<'_, HashMap<u64, HoldEntry>> {
        // A panic while holding this std mutex cannot leave the map inconsistent (every update is
        // a single insert/remove/increment), so a poisoned lock is still usable.
        self.inner.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn reenter(&self, owner: Owner) -> Result<Option<LockGuard>> {
        let mut holds = self.holds();
        let lost = |entry: &HoldEntry| match *entry.hold.state.borrow() {
            LockState::Lost(reason) => Some(reason),
            _ => None,
        };
        // The owner's live hold, if any; else tell about a lost one.
        let mut mine = holds.values_mut().filter(|entry| entry.hold.owner == owner);
        let Some(entry) = mine.find(|entry| lost(entry).is_none()) else {
            return match holds.values().filter(|entry| entry.hold.owner == owner).find_map(lost) {
                Some(reason) => Err(Error::LockLost { path: self.path().to_owned(), reason }),
                None => Ok(None),
            };
        };
        entry.guards += 1;
        Ok(Some(LockGuard::new(self.inner.clone(), entry.hold.clone())))
    }

    fn register(&self, owner: Owner, Grant { node, own_watch }: Grant) -> LockGuard {
        let state: HoldState = Arc::new(tokio::sync::watch::Sender::new(LockState::Held));
        let interest = Arc::new(tokio::sync::Notify::new());
        let released = Arc::new(Released::default());
        tokio::spawn(monitor_hold(
            self.inner.internals.cleanup().clone(),
            node.path.clone(),
            state.clone(),
            self.inner.loss_policy,
            interest.clone(),
            released.clone(),
            own_watch,
        ));
        let id = self.inner.next_hold.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let hold = Arc::new(Hold { id, node, owner, state, interest, released });
        self.holds().insert(id, HoldEntry { hold: hold.clone(), guards: 1 });
        LockGuard::new(self.inner.clone(), hold)
    }

    /// Lists everyone queued on this lock path, holder first, with the data of their nodes.
    /// Nodes that are not lock nodes are left out.
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        let internals = &self.inner.internals;
        let client = internals.client();
        let children = internals.sorted_children(MUTEX_LOCK_NAME).await?;
        let paths: Vec<String> = children.iter().map(|c| format!("{}/{}", internals.dir(), c.name)).collect();
        // All reads are sent before any reply is awaited.
        let reads: Vec<_> = paths.iter().map(|path| client.get_data(path)).collect();
        let mut participants = Vec::with_capacity(children.len());
        for ((child, path), read) in children.iter().zip(&paths).zip(reads) {
            let data = match read.await {
                Ok((data, _)) => data,
                Err(zk::Error::NoNode) => continue,
                Err(_) => match retry_unknown(|| client.get_data(path)).await {
                    Ok((data, _)) => data,
                    Err(zk::Error::NoNode) => continue,
                    Err(err) => return Err(Error::zk("read lock node", path, err)),
                },
            };
            let is_holder = participants.is_empty();
            participants.push(Participant { path: path.clone(), sequence: child.sequence, data, is_holder });
        }
        Ok(participants)
    }

    /// Whether any task in this process holds the lock through this mutex (or its clones).
    pub fn is_acquired_in_this_process(&self) -> bool {
        !self.holds().is_empty()
    }

    /// Whether the current task (or thread, outside a task) holds the lock through this mutex.
    pub fn is_owned_by_current_task(&self) -> bool {
        let owner = Owner::current();
        self.holds().values().any(|entry| entry.hold.owner == owner)
    }
}

impl MutexInner {
    /// Drops one guard of `hold`; returns the node to delete when it was the owner's last.
    pub(crate) fn release_guard(&self, hold: &Arc<Hold>) -> Option<LockNode> {
        let mut holds = self.holds.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = holds.get_mut(&hold.id)?;
        entry.guards -= 1;
        if entry.guards > 0 {
            return None;
        }
        // Released: what happens to the node from now on is no loss. (Notified before the node's
        // delete is sent, so the monitor hears of the release before the deletion.)
        hold.released.set();
        holds.remove(&hold.id).map(|entry| entry.hold.node.clone())
    }
}
