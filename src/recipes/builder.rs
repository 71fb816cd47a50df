//! The options every lock recipe takes, and their validation: [`LockBuilder`].

use std::marker::PhantomData;
use std::time::Duration;

use zookeeper_client as zk;

use crate::engine::path::{refuse_reserved, validate_syntax};
use crate::engine::LockInternals;
use crate::error::{Error, Result};
use crate::session::acl::AclList;
use crate::session::client::RecipeClient;
use crate::state::LossPolicy;

/// Builds a lock recipe with options: [`MutexBuilder`](crate::MutexBuilder) for an
/// [`InterProcessMutex`](crate::InterProcessMutex) (see
/// [`InterProcessMutex::builder`](crate::InterProcessMutex::builder)). Every lock recipe takes
/// the same options.
#[must_use]
pub struct LockBuilder<R> {
    client: RecipeClient,
    path: String,
    node_data: Vec<u8>,
    acls: Option<Vec<zk::Acl>>,
    loss_policy: LossPolicy,
    max_request_bytes: usize,
    min_session_timeout: Option<Duration>,
    revocable: bool,
    lease: Option<Duration>,
    lock_delay: Option<Duration>,
    recipe: PhantomData<fn() -> R>,
}

impl<R> Clone for LockBuilder<R> {
    fn clone(&self) -> Self {
        LockBuilder {
            client: self.client.clone(),
            path: self.path.clone(),
            node_data: self.node_data.clone(),
            acls: self.acls.clone(),
            loss_policy: self.loss_policy,
            max_request_bytes: self.max_request_bytes,
            min_session_timeout: self.min_session_timeout,
            revocable: self.revocable,
            lease: self.lease,
            lock_delay: self.lock_delay,
            recipe: PhantomData,
        }
    }
}

impl<R> std::fmt::Debug for LockBuilder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockBuilder")
            .field("client", &self.client)
            .field("path", &self.path)
            .field("node_data_len", &self.node_data.len())
            .field("acls", &self.acls.as_ref().map(Vec::len))
            .field("loss_policy", &self.loss_policy)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("min_session_timeout", &self.min_session_timeout)
            .field("revocable", &self.revocable)
            .field("lease", &self.lease)
            .field("lock_delay", &self.lock_delay)
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

/// The node name the server gives a lock node, without its lock name:
/// `_c_<36-char uuid>-<lock name><10 digits>`.
const NODE_NAME_LEN_BESIDES_LOCK_NAME: usize = 3 + 36 + 1 + 10;

impl<R> LockBuilder<R> {
    pub(crate) fn new(client: RecipeClient, path: String) -> LockBuilder<R> {
        LockBuilder {
            client,
            path,
            node_data: Vec::new(),
            acls: None,
            loss_policy: LossPolicy::default(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            min_session_timeout: None,
            revocable: false,
            lease: None,
            lock_delay: None,
            recipe: PhantomData,
        }
    }

    /// The largest request the server accepts, in bytes: its `jute.maxbuffer` (default
    /// [`DEFAULT_MAX_REQUEST_BYTES`], 1 MiB − 1). [`build`](Self::build) refuses node data and
    /// lock paths whose create request would exceed it: the server answers such a request by
    /// dropping the connection, which would cost every other hold of the session its lock.
    pub fn max_request_bytes(mut self, limit: usize) -> LockBuilder<R> {
        self.max_request_bytes = limit;
        self
    }

    /// The smallest session timeout any server of the ensemble may negotiate for the client's
    /// sessions (see [`ManagedClientBuilder::min_session_timeout`](crate::ManagedClientBuilder::min_session_timeout),
    /// which says how to compute it): for a plain `zookeeper_client::Client`, or to go lower
    /// than the managed client's. It applies to the whole session monitor of the sessions this
    /// lock acquires on (every hold of those sessions counts with the lowest floor stated).
    pub fn min_session_timeout(mut self, floor: Duration) -> LockBuilder<R> {
        self.min_session_timeout = Some(floor);
        self
    }

    /// When a lost connection means a lost lock; see [`LossPolicy`]. The default is
    /// [`LossPolicy::Suspended`], Curator's standard: any disconnection loses the lock.
    pub fn loss_policy(mut self, policy: LossPolicy) -> LockBuilder<R> {
        self.loss_policy = policy;
        self
    }

    /// Bytes stored in each lock node this lock creates, e.g. `host:port` of the holder, so
    /// operators (and [`InterProcessMutex::participants`](crate::InterProcessMutex::participants)) can tell who holds or waits.
    /// Curator's default is the local IP address; ours is empty.
    pub fn node_data(mut self, data: impl Into<Vec<u8>>) -> LockBuilder<R> {
        self.node_data = data.into();
        self
    }

    /// The ACLs of the nodes this lock creates: its lock nodes, and the container nodes of a
    /// lock path that does not exist yet. Default: the [`ManagedClient`](crate::ManagedClient)'s
    /// [`acls`](crate::ManagedClientBuilder::acls), or `world:anyone` with all rights on a plain
    /// client (Curator's default).
    ///
    /// Who may queue for, release or block a lock is decided by the ACL of the lock path itself
    /// (create and delete rights live on the parent): protect the lock path, e.g. with
    /// `zookeeper_client::Acls::creator_all()` on an authenticated client. See the README's
    /// Security section.
    pub fn acls(mut self, acls: impl Into<AclList>) -> LockBuilder<R> {
        self.acls = Some(acls.into().into());
        self
    }

    /// The same options for another recipe on the child `name` of this path (a semaphore's
    /// `locks` and `leases`), or on this very path with `name` empty.
    pub(crate) fn child<T>(&self, name: &str) -> LockBuilder<T> {
        let path = if name.is_empty() {
            self.path.clone()
        } else if self.path == "/" {
            format!("/{name}")
        } else {
            format!("{}/{name}", self.path)
        };
        LockBuilder {
            client: self.client.clone(),
            path,
            node_data: self.node_data.clone(),
            acls: self.acls.clone(),
            loss_policy: self.loss_policy,
            max_request_bytes: self.max_request_bytes,
            min_session_timeout: self.min_session_timeout,
            revocable: self.revocable,
            lease: self.lease,
            lock_delay: self.lock_delay,
            recipe: PhantomData,
        }
    }

    /// The options of a recipe's internal lock (a semaphore's): neither revocable nor leased —
    /// those apply to the recipe's own holds.
    pub(crate) fn internal(mut self) -> LockBuilder<R> {
        self.revocable = false;
        self.lease = None;
        self.lock_delay = None;
        self
    }

    /// The path as given.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    /// Makes the lock's nodes revocable (Curator's `makeRevocable`): a holder can then learn,
    /// through [`LockGuard::revoke_requested`](crate::LockGuard::revoke_requested), that someone
    /// asked for the lock with [`Revoker::attempt_revoke`](crate::Revoker::attempt_revoke) (or
    /// Curator's `Revoker`), which writes the bytes `__REVOKE__` as the node's data. Revocation
    /// is advisory, as in Curator: the holder decides whether and when to release.
    ///
    /// Revocable nodes are created with empty data, so [`node_data`](Self::node_data) cannot be
    /// combined with it (`build` fails with [`Error::InvalidArgument`]).
    pub fn revocable(mut self, revocable: bool) -> LockBuilder<R> {
        self.revocable = revocable;
        self
    }

    /// Gives every hold of this lock a lease (Redisson's `leaseTime`): `lease` after the grant the
    /// hold ends `Lost(LeaseExpired)` and the library releases the lock — told first, then the node
    /// deleted — unless [`extend`](crate::LockGuard::extend) moved the end. A holder that hangs or
    /// forgets its guard then keeps the lock no longer than the lease, which the session alone
    /// cannot promise (its heartbeats come from the client, not from your code). Acquires can set
    /// their own (`acquire_with_lease`). Default: none.
    pub fn lease(mut self, lease: Duration) -> LockBuilder<R> {
        self.lease = Some(lease);
        self
    }

    /// A lock-delay for this lock path (Chubby's, Consul's): when a node in the lock directory
    /// disappears *without a clean release* — its session expired or was closed, someone deleted
    /// it, its hold lease ran out — no hold is granted until `delay` after the acquirer read the
    /// directory showing it (an acquire that finds the lock free waits too, once, unless a later
    /// clean release vouched for it). A waiter that gives up ended no hold and is not counted;
    /// `try_acquire` finds the lock unavailable while the delay runs and takes it once the delay
    /// since the process first saw the loss has passed. It protects a resource that cannot check
    /// fencing tokens from a holder that was paused or partitioned and does not know yet, for up to
    /// `delay`. A clean release is marked in the same request as its delete (a `multi` writing a
    /// count as the lock directory's data), so it costs no request and is never delayed. Every
    /// lock recipe takes it — the mutex, leader election, both modes of a read/write lock, the
    /// semaphores' leases (on their `leases` directory). Every user of the path should set the same
    /// delay; Curator's and kazoo's releases cannot mark and count as unclean. The lock directory
    /// is created persistent and its data is reserved for the mark; the first acquire on a new path
    /// waits the delay once. How the rule is proved: `src/engine/delay.rs`. See the README's
    /// *Lock-delay*. Default: none.
    pub fn lock_delay(mut self, delay: Duration) -> LockBuilder<R> {
        self.lock_delay = Some(delay);
        self
    }

    /// Validates the path and the sizes (see [`MutexBuilder::build`](crate::MutexBuilder::build))
    /// and makes the engine of a recipe whose longest lock name is `longest_lock_name`.
    pub(crate) fn internals(self, longest_lock_name: &str) -> Result<LockInternals> {
        validate_syntax(&self.path)?;
        if self.revocable && !self.node_data.is_empty() {
            return Err(Error::InvalidArgument {
                path: self.path,
                reason: "a revocable lock's nodes carry no data (a revocation request is written as their data): drop node_data or revocable".into(),
            });
        }
        // The client prepends its chroot to every path it sends (`path()` is "/" without one).
        let chroot = match self.client.context().client().path() {
            "/" => String::new(),
            chroot => chroot.to_owned(),
        };
        refuse_reserved(&self.path, &format!("{chroot}{}", self.path))?;
        let limit = self.max_request_bytes;
        let acls = self.acls.map_or_else(|| self.client.default_acls(), std::sync::Arc::from);
        // Each ACL: its permissions, and the scheme and id with their lengths.
        let acl_size: usize = acls.iter().map(|acl| 12 + acl.scheme().len() + acl.id().len()).sum();
        // The path the server receives: chroot, lock path, '/', node name.
        let server_path_len = chroot.len() + self.path.len();
        // Missing levels of the lock path are created in the same request (a `multi`, see
        // `engine/mod.rs`): count every level, each with the chroot in front, as if all were missing.
        let levels_size: usize = (self.path.match_indices('/').skip(1).map(|(at, _)| at))
            .chain(std::iter::once(self.path.len()))
            .map(|level_len| chroot.len() + level_len + MULTI_LEVEL_OVERHEAD + acl_size)
            .sum();
        let path_size = server_path_len
            + 1
            + NODE_NAME_LEN_BESIDES_LOCK_NAME
            + longest_lock_name.len()
            + CREATE_OVERHEAD
            + acl_size
            + levels_size;
        if path_size > limit {
            return Err(Error::TooLarge { what: "lock path", size: server_path_len, limit });
        }
        if path_size + self.node_data.len() > limit {
            return Err(Error::TooLarge { what: "node data", size: self.node_data.len(), limit });
        }
        let (revocable, lease, lock_delay) = (self.revocable, self.lease, self.lock_delay);
        Ok(LockInternals::new(self.client, self.path, self.node_data, acls, self.loss_policy, self.min_session_timeout)
            .revocable(revocable)
            .lease(lease)
            .lock_delay(lock_delay))
    }
}
