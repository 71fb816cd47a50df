//! Where recipes get their ZooKeeper session: [`ManagedClient`] (Curator's `CuratorFramework`),
//! which starts a new session by itself after an expiry, or a plain `zookeeper_client::Client`,
//! which does not. Both reach a recipe as a [`RecipeClient`].
//!
//! The recipe side sees a [`SessionContext`] per session — the session's monitor and the cleanup
//! of its nodes — and asks its [`RecipeClient`] for the current one at every acquire attempt. An
//! attempt runs on one session from start to end: a node created by one session is never looked
//! for, adopted or deleted through another.
//!
//! How a managed client follows its sessions (the supervisor task):
//!
//! 1. `connect` establishes the first session, retrying until the connect timeout; state
//!    [`ConnectionState::Connected`].
//! 2. It follows the session's state: a disconnection is [`ConnectionState::Suspended`], the same
//!    session back is [`ConnectionState::Reconnected`].
//! 3. When the session ends (expired, or authentication failed) the state is
//!    [`ConnectionState::Lost`], and a new session is established with backoff, through the same
//!    connector — so with the same auth —, retrying until it succeeds; then
//!    [`ConnectionState::NewSession`]. From then on every acquire runs on the new session; the new
//!    session gets a monitor of its own, whose evidence starts cold (`session.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tracing::{error, info, warn};
use zookeeper_client as zk;

use crate::cleanup::Cleanup;
use crate::error::{Error, Result};
use crate::session::{lock, Session};

/// One ZooKeeper session as recipes use it: its monitor, and the cleanup that deletes our unwanted
/// nodes through the recipe's client (with its chroot).
#[derive(Debug)]
pub(crate) struct SessionContext {
    pub(crate) session: Session,
    pub(crate) cleanup: Arc<Cleanup>,
}

impl SessionContext {
    pub(crate) fn new(client: &zk::Client) -> Arc<SessionContext> {
        let session = Session::of(client);
        let cleanup = Arc::new(Cleanup::new(client.clone(), session.runtime_slot()));
        Arc::new(SessionContext { session, cleanup })
    }

    /// The recipe's client on this session.
    pub(crate) fn client(&self) -> &zk::Client {
        self.cleanup.client()
    }
}

/// The client a recipe runs on: a [`ManagedClient`] (a new session after an expiry, recipes keep
/// working) or a plain `zookeeper_client::Client` (dead for good after an expiry).
///
/// Made with `From`/`Into` from either, owned or borrowed: recipe constructors take
/// `impl Into<RecipeClient>`.
#[derive(Clone)]
pub struct RecipeClient(Source);

impl std::fmt::Debug for RecipeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Source::Fixed(context) => {
                write!(f, "RecipeClient::Plain(session {:#x})", context.client().session_id().0)
            },
            Source::Managed(managed) => write!(f, "RecipeClient::Managed({:?})", managed.inner.hosts),
        }
    }
}

#[derive(Clone)]
enum Source {
    Fixed(Arc<SessionContext>),
    Managed(ManagedClient),
}

impl From<zk::Client> for RecipeClient {
    fn from(client: zk::Client) -> RecipeClient {
        RecipeClient(Source::Fixed(SessionContext::new(&client)))
    }
}

impl From<&zk::Client> for RecipeClient {
    fn from(client: &zk::Client) -> RecipeClient {
        RecipeClient(Source::Fixed(SessionContext::new(client)))
    }
}

impl From<ManagedClient> for RecipeClient {
    fn from(client: ManagedClient) -> RecipeClient {
        RecipeClient(Source::Managed(client))
    }
}

impl From<&ManagedClient> for RecipeClient {
    fn from(client: &ManagedClient) -> RecipeClient {
        RecipeClient(Source::Managed(client.clone()))
    }
}

impl RecipeClient {
    /// The current session.
    pub(crate) fn context(&self) -> Arc<SessionContext> {
        match &self.0 {
            Source::Fixed(context) => context.clone(),
            Source::Managed(managed) => managed.context(),
        }
    }

    /// After `ended` was found dead: the session that replaces it, once there is one (waiting for
    /// it if `wait`). `None` for a plain client, which has no other session.
    pub(crate) async fn replacement(&self, ended: &Arc<SessionContext>, wait: bool) -> Option<Arc<SessionContext>> {
        match &self.0 {
            Source::Fixed(_) => None,
            Source::Managed(managed) => managed.replacement(ended, wait).await,
        }
    }

    /// The ACLs recipes give the nodes they create unless told otherwise.
    pub(crate) fn default_acls(&self) -> Vec<zk::Acl> {
        match &self.0 {
            Source::Managed(managed) => managed.inner.acls.clone(),
            Source::Fixed(_) => zk::Acls::anyone_all().to_vec(),
        }
    }
}

/// The condition of a [`ManagedClient`]'s connection, as Curator's `ConnectionState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionState {
    /// The first session was established and is connected.
    Connected,
    /// The connection is lost; the session may still be alive (it is until the ensemble expires
    /// it, T after it last heard of it).
    Suspended,
    /// Connected again to the same session after [`Suspended`](Self::Suspended): ephemeral nodes
    /// and locks held under [`LossPolicy::SessionDeadline`](crate::LossPolicy::SessionDeadline)
    /// whose deadline did not pass survived.
    Reconnected,
    /// The session ended (expired, or authentication failed): its ephemeral nodes, lock nodes
    /// included, are gone. A new session is being established.
    Lost,
    /// A new session was established after [`Lost`](Self::Lost); recipes use it from now on.
    NewSession,
    /// The ensemble refused our authentication for a new session. Final: the managed client
    /// stops establishing sessions, and acquires fail with [`Error::SessionLost`].
    AuthFailed,
}

impl std::fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectionState::Connected => "connected",
            ConnectionState::Suspended => "suspended",
            ConnectionState::Reconnected => "reconnected",
            ConnectionState::Lost => "lost",
            ConnectionState::NewSession => "new session",
            ConnectionState::AuthFailed => "authentication failed (final)",
        })
    }
}

/// A ZooKeeper client that outlives its sessions (Curator's `CuratorFramework`, kazoo's
/// `KazooClient`).
///
/// A `zookeeper_client::Client` is dead once its session expires. A `ManagedClient` then
/// establishes a new session by itself (with backoff, through the same connector, so with the same
/// auth), and every recipe built on it goes on working: a hold lost to the expiry reports
/// [`LossReason::SessionExpired`](crate::LossReason::SessionExpired), an acquire waiting at the time
/// queues again on the new session (at the end of the queue: its place died with its node), and
/// later acquires use the new session. A lock node of an earlier session is never adopted.
///
/// ```no_run
/// # async fn demo() -> zk_recipes::Result<()> {
/// use std::time::Duration;
/// use zk_recipes::{InterProcessMutex, ManagedClient};
///
/// let zk = ManagedClient::builder("zk1:2181,zk2:2181,zk3:2181/app") // a chroot is allowed
///     .session_timeout(Duration::from_secs(10))
///     .connect()
///     .await?;
/// let mutex = InterProcessMutex::new(&zk, "/locks/orders")?;
/// let guard = mutex.acquire().await?;
/// # drop(guard);
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone (clones share the client). The session is closed once the managed client,
/// every clone, and every recipe and guard made from it are dropped.
#[derive(Clone)]
pub struct ManagedClient {
    inner: Arc<Managed>,
}

struct Managed {
    /// The connect string (hosts and chroot; ZooKeeper connect strings carry no credentials).
    hosts: String,
    connector: zk::Connector,
    acls: Vec<zk::Acl>,
    current: Mutex<Arc<SessionContext>>,
    /// Bumped with every new session, and when the supervisor stops.
    generation: watch::Sender<u64>,
    /// Whether the supervisor still runs (establishes new sessions). An acquire waits for a new
    /// session only while it does.
    supervising: AtomicBool,
    state: Mutex<ConnectionState>,
    states: broadcast::Sender<ConnectionState>,
    supervisor: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Some(supervisor) = lock(&self.supervisor).take() {
            supervisor.abort();
        }
    }
}

impl std::fmt::Debug for ManagedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedClient")
            .field("hosts", &self.inner.hosts)
            .field("session", &format_args!("{:#x}", self.client().session_id().0))
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// Builds a [`ManagedClient`]; see [`ManagedClient::builder`].
#[must_use]
#[derive(Clone)]
pub struct ManagedClientBuilder {
    hosts: String,
    connector: Option<zk::Connector>,
    session_timeout: Option<Duration>,
    connect_timeout: Duration,
    auth: Vec<(String, Vec<u8>)>,
    acls: Vec<zk::Acl>,
}

impl std::fmt::Debug for ManagedClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Auth data is never shown: only the schemes.
        let schemes: Vec<&str> = self.auth.iter().map(|(scheme, _)| scheme.as_str()).collect();
        f.debug_struct("ManagedClientBuilder")
            .field("hosts", &self.hosts)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("auth_schemes", &schemes)
            .field("acls", &self.acls.len())
            .finish_non_exhaustive()
    }
}

/// How long the first connect keeps trying by default (Curator's default connection timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

impl ManagedClientBuilder {
    /// The session timeout to ask the servers for (they bound it by their `minSessionTimeout` and
    /// `maxSessionTimeout`). Defaults to the connector's (6 s for `zookeeper_client`'s).
    pub fn session_timeout(mut self, timeout: Duration) -> ManagedClientBuilder {
        self.session_timeout = Some(timeout);
        self
    }

    /// How long [`connect`](Self::connect) keeps trying to establish the first session before it
    /// fails. Default [`DEFAULT_CONNECT_TIMEOUT`] (15 s). Later sessions are retried without
    /// limit.
    pub fn connect_timeout(mut self, timeout: Duration) -> ManagedClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// Authentication (`addauth`) sent on every connection of every session, e.g.
    /// `.auth("digest", b"user:password")`. Never logged, never shown by `Debug`.
    pub fn auth(mut self, scheme: impl Into<String>, auth: impl Into<Vec<u8>>) -> ManagedClientBuilder {
        self.auth.push((scheme.into(), auth.into()));
        self
    }

    /// The ACLs recipes give the nodes they create (lock nodes and the container parents of lock
    /// paths), unless a recipe's builder says otherwise. Default: `world:anyone` with all rights,
    /// Curator's default. See the README's Security section for what to choose.
    pub fn acls(mut self, acls: impl Into<Vec<zk::Acl>>) -> ManagedClientBuilder {
        self.acls = acls.into();
        self
    }

    /// The `zookeeper_client::Connector` every session is established with (TLS, SASL, read-only,
    /// ...). [`session_timeout`](Self::session_timeout) and [`auth`](Self::auth) are applied on
    /// top of it.
    pub fn connector(mut self, connector: zk::Connector) -> ManagedClientBuilder {
        self.connector = Some(connector);
        self
    }

    /// Establishes the first session (retrying until the connect timeout) and starts following
    /// it. Must be called within a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Connect`] naming the hosts if no session could be established in time,
    /// [`Error::Runtime`] outside a tokio runtime with timers.
    pub async fn connect(self) -> Result<ManagedClient> {
        crate::session::check_runtime()?;
        let mut connector = self.connector.unwrap_or_else(zk::Client::connector);
        if let Some(timeout) = self.session_timeout {
            connector = connector.with_session_timeout(timeout);
        }
        for (scheme, auth) in &self.auth {
            connector = connector.with_auth(scheme, auth);
        }
        let client = first_session(&connector, &self.hosts, self.connect_timeout).await?;
        info!(
            hosts = self.hosts,
            session = format_args!("{:#x}", client.session_id().0),
            "ZooKeeper session established"
        );
        crate::metrics::session_created();
        let context = SessionContext::new(&client);
        let (states, _) = broadcast::channel(64);
        let inner = Arc::new(Managed {
            hosts: self.hosts,
            connector,
            acls: self.acls,
            current: Mutex::new(context.clone()),
            generation: watch::Sender::new(0),
            supervising: AtomicBool::new(true),
            state: Mutex::new(ConnectionState::Connected),
            states,
            supervisor: Mutex::new(None),
        });
        let supervisor = tokio::spawn(supervise(Arc::downgrade(&inner), client));
        *lock(&inner.supervisor) = Some(supervisor.abort_handle());
        Ok(ManagedClient { inner })
    }
}

async fn first_session(connector: &zk::Connector, hosts: &str, timeout: Duration) -> Result<zk::Client> {
    let now = tokio::time::Instant::now();
    // A timeout too large for the clock means "for ever" (a year is as good).
    let give_up = now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
    let mut backoff = Duration::from_millis(50);
    let mut last = String::from("no attempt finished in time");
    loop {
        match tokio::time::timeout_at(give_up, connector.clone().connect(hosts)).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(err @ (zk::Error::BadArguments(_) | zk::Error::AuthFailed))) => {
                return Err(Error::Connect { hosts: hosts.to_owned(), reason: err.to_string() })
            },
            Ok(Err(err)) => last = err.to_string(),
            Err(_) => {},
        }
        let now = tokio::time::Instant::now();
        if now + backoff >= give_up {
            return Err(Error::Connect {
                hosts: hosts.to_owned(),
                reason: format!("gave up after {timeout:?}: {last}"),
            });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

impl ManagedClient {
    /// A builder for a managed client of the ensemble `hosts` (a ZooKeeper connect string, e.g.
    /// `"zk1:2181,zk2:2181,zk3:2181/app"`; a chroot suffix is allowed and must exist).
    pub fn builder(hosts: impl Into<String>) -> ManagedClientBuilder {
        ManagedClientBuilder {
            hosts: hosts.into(),
            connector: None,
            session_timeout: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            auth: Vec::new(),
            acls: zk::Acls::anyone_all().to_vec(),
        }
    }

    /// Connects with the default options; see [`ManagedClientBuilder::connect`].
    ///
    /// # Errors
    /// As [`ManagedClientBuilder::connect`].
    pub async fn connect(hosts: impl Into<String>) -> Result<ManagedClient> {
        Self::builder(hosts).connect().await
    }

    /// The current session's `zookeeper_client::Client`, for direct ZooKeeper operations. After
    /// an expiry it is dead; call this again to get the new session's.
    ///
    /// Build recipes on the managed client itself (`InterProcessMutex::new(&zk, ..)`), not on
    /// this: a recipe built on a plain `Client` stays on its session and does not recover.
    pub fn client(&self) -> zk::Client {
        self.context().client().clone()
    }

    /// The connection's condition now (its latest change).
    pub fn state(&self) -> ConnectionState {
        *lock(&self.inner.state)
    }

    /// A stream of the connection's state changes, from now on.
    pub fn state_watcher(&self) -> ConnectionStateWatcher {
        ConnectionStateWatcher { receiver: self.inner.states.subscribe(), managed: Arc::downgrade(&self.inner) }
    }

    /// The ACLs recipes built on this client give their nodes by default.
    pub fn acls(&self) -> &[zk::Acl] {
        &self.inner.acls
    }

    fn context(&self) -> Arc<SessionContext> {
        lock(&self.inner.current).clone()
    }

    async fn replacement(&self, ended: &Arc<SessionContext>, wait: bool) -> Option<Arc<SessionContext>> {
        let mut generation = self.inner.generation.subscribe();
        loop {
            let current = self.context();
            if !Arc::ptr_eq(&current, ended) {
                return Some(current);
            }
            // The supervisor gone (it gave up, or its runtime shut down), no session will come.
            if !wait || !self.inner.supervising.load(Ordering::SeqCst) {
                return None;
            }
            if generation.changed().await.is_err() {
                return None;
            }
        }
    }
}

impl Managed {
    fn publish(&self, state: ConnectionState) {
        *lock(&self.state) = state;
        match state {
            ConnectionState::Suspended | ConnectionState::Lost => {
                warn!(hosts = self.hosts, %state, "ZooKeeper connection state")
            },
            _ => info!(hosts = self.hosts, %state, "ZooKeeper connection state"),
        }
        // No receivers is fine.
        let _ = self.states.send(state);
    }
}

/// Marks the supervisor stopped however its task ends (given up, aborted, its runtime shut down),
/// and wakes acquires waiting for a new session so they fail instead of waiting for ever.
struct Supervising(Weak<Managed>);

impl Drop for Supervising {
    fn drop(&mut self) {
        if let Some(managed) = self.0.upgrade() {
            managed.supervising.store(false, Ordering::SeqCst);
            managed.generation.send_modify(|generation| *generation += 1);
        }
    }
}

/// Follows the managed client's sessions (see the module docs), until the client is dropped or
/// authentication is refused.
async fn supervise(managed: Weak<Managed>, mut client: zk::Client) {
    let _supervising = Supervising(managed.clone());
    loop {
        let mut states = client.state_watcher();
        let mut seen = states.state();
        if seen == zk::SessionState::Disconnected {
            if let Some(managed) = managed.upgrade() {
                managed.publish(ConnectionState::Suspended);
            }
        }
        let ended = loop {
            if seen.is_terminated() {
                break seen;
            }
            let state = states.changed().await;
            let Some(managed) = managed.upgrade() else { return };
            match state {
                zk::SessionState::Disconnected if state != seen => managed.publish(ConnectionState::Suspended),
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    if state == seen {
                        // Down and up again between two looks.
                        managed.publish(ConnectionState::Suspended);
                    }
                    managed.publish(ConnectionState::Reconnected);
                },
                _ => {},
            }
            seen = state;
        };
        let session = client.session_id().0;
        drop(client);
        {
            let Some(managed) = managed.upgrade() else { return };
            warn!(hosts = managed.hosts, session = format_args!("{session:#x}"), state = %ended, "ZooKeeper session ended; establishing a new one");
            managed.publish(ConnectionState::Lost);
        }
        let mut backoff = Duration::from_millis(50);
        client = loop {
            let Some((connector, hosts)) = managed.upgrade().map(|m| (m.connector.clone(), m.hosts.clone())) else {
                return;
            };
            match tokio::time::timeout(SESSION_ATTEMPT_LIMIT, connector.connect(&hosts)).await {
                Ok(Ok(client)) => break client,
                Ok(Err(zk::Error::AuthFailed)) => {
                    error!(hosts, "ZooKeeper refused our authentication; no more sessions will be established");
                    if let Some(managed) = managed.upgrade() {
                        managed.publish(ConnectionState::AuthFailed);
                    }
                    return;
                },
                Ok(Err(err)) => warn!(hosts, %err, "cannot establish a new ZooKeeper session yet"),
                Err(_) => warn!(hosts, "cannot establish a new ZooKeeper session yet (timed out)"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        };
        let Some(managed) = managed.upgrade() else { return };
        info!(
            hosts = managed.hosts,
            session = format_args!("{:#x}", client.session_id().0),
            "new ZooKeeper session established"
        );
        crate::metrics::session_created();
        *lock(&managed.current) = SessionContext::new(&client);
        managed.generation.send_modify(|generation| *generation += 1);
        managed.publish(ConnectionState::NewSession);
    }
}

/// How long one attempt to establish a new session may take before it is started again (the
/// client library gives up by itself after about a session timeout).
const SESSION_ATTEMPT_LIMIT: Duration = Duration::from_secs(60);

/// Receives a [`ManagedClient`]'s connection state changes, in order; see
/// [`ManagedClient::state_watcher`].
#[derive(Debug)]
pub struct ConnectionStateWatcher {
    receiver: broadcast::Receiver<ConnectionState>,
    managed: Weak<Managed>,
}

impl ConnectionStateWatcher {
    /// Waits for the next state change and returns it; `None` once the managed client is gone.
    /// A watcher more than 64 changes behind skips to the current state.
    ///
    /// Cancel safe: a change is not lost if the future is dropped before it resolves.
    pub async fn changed(&mut self) -> Option<ConnectionState> {
        loop {
            match self.receiver.recv().await {
                Ok(state) => return Some(state),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(managed) = self.managed.upgrade() {
                        self.receiver = managed.states.subscribe();
                        return Some(*lock(&managed.state));
                    }
                },
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
