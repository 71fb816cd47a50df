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
//!    session gets a monitor of its own, whose evidence starts cold (`session/monitor.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tracing::{debug, error, info, warn};
use zookeeper_client as zk;

use crate::error::{Error, Result};
use crate::session::acl::AclList;
use crate::session::cleanup::{retry_unknown, Cleanup};
use crate::session::monitor::{check_runtime, Session};
use crate::sync::lock;

/// [`SessionContext::through_gate`] on a managed client's flag (`None`: a plain client).
fn through_gate<T>(closed: Option<&watch::Receiver<bool>>, send: impl FnOnce() -> T) -> std::result::Result<T, Closed> {
    let Some(closed) = closed else { return Ok(send()) };
    // Held while `send` runs: `close()`'s write of the flag waits for it.
    let closed = closed.borrow();
    if *closed {
        return Err(Closed);
    }
    Ok(send())
}

/// The managed client was closed: the create was not sent (see [`SessionContext::through_gate`]).
#[derive(Debug)]
pub(crate) struct Closed;

/// One ZooKeeper session as recipes use it: its monitor, and the cleanup that deletes our unwanted
/// nodes through the recipe's client (with its chroot).
#[derive(Debug)]
pub(crate) struct SessionContext {
    pub(crate) session: Session,
    pub(crate) cleanup: Arc<Cleanup>,
    /// A managed client's "closed" flag (`None` for a plain client, which cannot be closed).
    closed: Option<watch::Receiver<bool>>,
    /// What this session's acquires found of their lock paths' directories lately: the engine's
    /// guess whether the next one exists (`engine::directory_guess`). A hint that decides what an
    /// acquire sends first, never what it is granted.
    pub(crate) directory_guess: AtomicU8,
}

impl SessionContext {
    /// The context of `client`'s session: a plain client's (`owner` 0, shared by every plain
    /// client of the session) or a managed client's (`owner` its id; see `session/monitor.rs`,
    /// *Identity*), whose sessions none may negotiate a timeout below `min_session_timeout`.
    pub(crate) fn new(
        client: &zk::Client,
        owner: u64,
        min_session_timeout: Option<Duration>,
        closed: Option<watch::Receiver<bool>>,
    ) -> Arc<SessionContext> {
        let session = Session::of(client, owner);
        session.min_session_timeout(min_session_timeout);
        let cleanup = Arc::new(Cleanup::new(client.clone(), session.runtime_slot(), session.searches()));
        Arc::new(SessionContext { session, cleanup, closed, directory_guess: AtomicU8::new(0) })
    }

    /// Whether the managed client this session belongs to was closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.as_ref().is_some_and(|closed| *closed.borrow())
    }

    /// Sends a create of a node of the session through the *close gate*: `send` runs unless the
    /// managed client is closed, and must only make requests (`zookeeper-client` queues a request
    /// on the session when it is made, before its future is polled), never wait.
    ///
    /// The gate: `send` runs while this holds a read of the "closed" flag, and
    /// [`ManagedClient::close`] sets the flag with a write, which waits for every read in
    /// progress. So each create either saw the flag set and was not sent, or was queued before
    /// `close()` set it — and so before `close()`'s `getEphemerals`, which the server answers
    /// after it (one session's requests are answered in order): every node an acquire creates is
    /// in that listing, or was never created.
    pub(crate) fn through_gate<T>(&self, send: impl FnOnce() -> T) -> std::result::Result<T, Closed> {
        through_gate(self.closed.as_ref(), send)
    }

    /// Resolves once the managed client is closed (never for a plain client). Cancel safe.
    pub(crate) async fn closed(&self) {
        match self.closed.clone() {
            // Boxed: this future is laid out in every acquire's (every queued waiter's memory),
            // where the wait would take 144 bytes, and most clients are plain (one box an acquire
            // on a managed one).
            Some(mut closed) => {
                let _ = Box::pin(closed.wait_for(|closed| *closed)).await;
            },
            None => std::future::pending().await,
        }
    }

    /// The recipe's client on this session.
    pub(crate) fn client(&self) -> &zk::Client {
        self.cleanup.client()
    }
}

/// The owner of plain clients' session monitors (see `session/monitor.rs`, *Identity*).
const PLAIN: u64 = 0;

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
        RecipeClient(Source::Fixed(plain_context(&client)))
    }
}

impl From<&zk::Client> for RecipeClient {
    fn from(client: &zk::Client) -> RecipeClient {
        RecipeClient(Source::Fixed(plain_context(client)))
    }
}

/// Plain clients' contexts by session and chroot (every plain client of one session with one
/// chroot is the same: one connection, paths sent the same way).
type PlainContexts = Mutex<HashMap<(i64, String), Weak<SessionContext>>>;

fn plain_contexts() -> &'static PlainContexts {
    static CONTEXTS: OnceLock<PlainContexts> = OnceLock::new();
    CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The context recipes on the plain client `client` run on: one per session and chroot, shared
/// by every recipe value built on them (a context of its own — a cleanup with a client clone — cost
/// each recipe value about 250 B: issue 24).
fn plain_context(client: &zk::Client) -> Arc<SessionContext> {
    let key = (client.session_id().0, client.path().to_owned());
    let mut contexts = lock(plain_contexts());
    if let Some(context) = contexts.get(&key).and_then(Weak::upgrade) {
        return context;
    }
    contexts.retain(|_, context| context.strong_count() > 0);
    let context = SessionContext::new(client, PLAIN, None, None);
    contexts.insert(key, Arc::downgrade(&context));
    context
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

    /// The ACLs recipes give the nodes they create unless told otherwise: shared, not copied
    /// into every lock object (issue 24: 56 B per lock).
    pub(crate) fn default_acls(&self) -> Arc<[zk::Acl]> {
        match &self.0 {
            Source::Managed(managed) => managed.inner.acls.clone(),
            Source::Fixed(_) => {
                static ANYONE_ALL: OnceLock<Arc<[zk::Acl]>> = OnceLock::new();
                ANYONE_ALL.get_or_init(|| zk::Acls::anyone_all().to_vec().into()).clone()
            },
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
    /// [`ManagedClient::close`] was called. Final: acquires fail with [`Error::Closed`].
    Closed,
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
            ConnectionState::Closed => "closed (final)",
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
    /// This managed client's id, unique in the process: the owner of its sessions' monitors.
    id: u64,
    /// The smallest session timeout any server may negotiate (see
    /// [`ManagedClientBuilder::min_session_timeout`]).
    min_session_timeout: Option<Duration>,
    /// The connect string (hosts and chroot; ZooKeeper connect strings carry no credentials).
    hosts: String,
    connector: zk::Connector,
    acls: Arc<[zk::Acl]>,
    current: Mutex<Arc<SessionContext>>,
    /// Bumped with every new session, and when the supervisor stops.
    generation: watch::Sender<u64>,
    /// Whether the supervisor still runs (establishes new sessions). An acquire waits for a new
    /// session only while it does.
    supervising: AtomicBool,
    state: Mutex<ConnectionState>,
    states: broadcast::Sender<ConnectionState>,
    supervisor: Mutex<Option<tokio::task::AbortHandle>>,
    /// Set by [`ManagedClient::close`]; also the close gate (`SessionContext::through_gate`).
    closed: watch::Sender<bool>,
    /// The outcome of [`ManagedClient::close`]'s work, once done.
    close_outcome: watch::Sender<Option<Result<()>>>,
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
    min_session_timeout: Option<Duration>,
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
            .field("min_session_timeout", &self.min_session_timeout)
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

    /// The smallest session timeout any server of the ensemble may negotiate for this client:
    /// `min` over the servers of `max(minSessionTimeout, min(maxSessionTimeout, T))`, `T` the
    /// requested [`session_timeout`](Self::session_timeout). Set it when the servers' timeout
    /// limits (or `tickTime`, from which the defaults derive) differ, or may differ during a
    /// rolling change: a server clamps the timeout again whenever the client reconnects to it, and
    /// the leader then expires the session by the new value, which the client library does not
    /// report. The session monitor counts every hold's loss deadline with the smaller of this and
    /// the timeout negotiated at connect, so a holder is told before the leader can expire its
    /// session whichever server it moves to. Unset, every server is assumed to negotiate the same
    /// timeout (README, Guarantees). A [`MutexBuilder::min_session_timeout`](crate::MutexBuilder::min_session_timeout)
    /// lower still wins for the sessions that recipe runs on.
    pub fn min_session_timeout(mut self, floor: Duration) -> ManagedClientBuilder {
        self.min_session_timeout = Some(floor);
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
    pub fn acls(mut self, acls: impl Into<AclList>) -> ManagedClientBuilder {
        self.acls = acls.into().into();
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
        check_runtime()?;
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
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(PLAIN + 1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let closed = watch::Sender::new(false);
        let context = SessionContext::new(&client, id, self.min_session_timeout, Some(closed.subscribe()));
        let (states, _) = broadcast::channel(64);
        let inner = Arc::new(Managed {
            id,
            min_session_timeout: self.min_session_timeout,
            hosts: self.hosts,
            connector,
            acls: self.acls.into(),
            current: Mutex::new(context.clone()),
            generation: watch::Sender::new(0),
            supervising: AtomicBool::new(true),
            state: Mutex::new(ConnectionState::Connected),
            states,
            supervisor: Mutex::new(None),
            closed,
            close_outcome: watch::Sender::new(None),
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
                return Err(Error::Connect { hosts: hosts.to_owned(), reason: err.to_string(), source: None })
            },
            Ok(Err(err)) => last = err.to_string(),
            Err(_) => {},
        }
        let now = tokio::time::Instant::now();
        if now + backoff >= give_up {
            // The client library reports only that no attempt succeeded: find out why the hosts
            // cannot be reached (bounded: one short attempt per host).
            let unreachable = unreachable_host(hosts).await;
            let reason = match &unreachable {
                Some((host, err)) => format!("gave up after {timeout:?}: {last}; {host}: {err}"),
                None => format!("gave up after {timeout:?}: {last} (the hosts accept TCP connections)"),
            };
            return Err(Error::Connect {
                hosts: hosts.to_owned(),
                reason,
                source: unreachable.map(|(_, err)| Arc::new(err)),
            });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Deletes every ephemeral node of `client`'s session until the server lists none (what a
/// `closeSession` would do, with the session kept). Acquires were cancelled before: a create sent
/// before is answered before our listing (one session's requests are answered in order), so it is
/// listed; nothing new is created after.
async fn delete_ephemerals(client: &zk::Client) -> Result<()> {
    let failed = |err| Error::zk("delete the session's nodes on close", "/", err);
    loop {
        let nodes = retry_unknown(|| client.list_ephemerals("/")).await.map_err(failed)?;
        if nodes.is_empty() {
            return Ok(());
        }
        for node in &nodes {
            match retry_unknown(|| client.delete(node, None)).await {
                Ok(()) | Err(zk::Error::NoNode) => {},
                Err(err) => return Err(failed(err)),
            }
        }
    }
}

/// Tries to end `client`'s session with a `closeSession` the server confirms, each step within
/// `timeout` (logged, not failed, if it cannot: the session then ends when the server expires it).
///
/// `zookeeper-client` sends `closeSession` only when the last `Client` of a session is dropped, and
/// recipes, guards and the application keep clones. So a second connection attaches to the session
/// (its id and password) and is dropped at once: that sends `closeSession`, and its state turns
/// `Closed` once the server answered (committed) it. The server closes the first connection — at
/// the attach if it is the same server, at the commit otherwise — and the first client learns on
/// reconnecting that the session is gone.
///
/// Best effort: the first client reconnects at once when the attach closes its connection, and
/// its attach closes ours in turn; should that go on (measured: for over 10 s in some runs on one
/// server), the attach gives up after `timeout`. The session's nodes are confirmed deleted by then
/// (`close()` does that first); the session itself lives on while a clone of its client does.
async fn end_session(connector: &zk::Connector, hosts: &str, client: &zk::Client, timeout: Duration) {
    let session = format!("{:#x}", client.session_id().0);
    let attach = connector.clone().with_session(client.session().clone()).connect(hosts);
    let closer = match tokio::time::timeout(timeout, attach).await {
        Ok(Ok(closer)) => closer,
        // Expired meanwhile: ended already.
        Ok(Err(zk::Error::SessionExpired)) => return,
        Ok(Err(err)) => {
            warn!(%session, %err, "close: could not attach to the session to end it; the server expires it");
            return;
        },
        Err(_) => {
            warn!(%session, "close: could not attach to the session to end it in time; the server expires it");
            return;
        },
    };
    let mut states = closer.state_watcher();
    drop(closer);
    let ended = tokio::time::timeout(timeout, async {
        let mut state = states.state();
        while !state.is_terminated() {
            state = states.changed().await;
        }
        state
    })
    .await;
    match ended {
        Ok(state) => debug!(%session, %state, "close: session ended"),
        Err(_) => warn!(%session, "close: closeSession not confirmed in time; the server expires the session"),
    }
}

/// The first host of the connect string `hosts` that cannot be reached over TCP, with why: its
/// name does not resolve, the connection is refused, or it times out (1 s). `None` if every host
/// accepts a connection (the trouble is then ZooKeeper's, not the network's).
async fn unreachable_host(hosts: &str) -> Option<(String, std::io::Error)> {
    use std::net::{TcpStream, ToSocketAddrs};
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|host| host.rsplit_once("://").map_or(host, |(_, rest)| rest))
        .map(|host| host.split('/').next().unwrap_or(host).trim().to_owned())
        .filter(|host| !host.is_empty())
        .collect();
    // Name resolution and connect block: off the runtime's worker threads.
    let probe = tokio::task::spawn_blocking(move || {
        hosts.into_iter().find_map(|host| {
            let with_port = if host.contains(':') { host.clone() } else { format!("{host}:2181") };
            let addrs = match with_port.to_socket_addrs() {
                Ok(addrs) => addrs.collect::<Vec<_>>(),
                Err(err) => {
                    let err = std::io::Error::new(err.kind(), format!("cannot resolve the host name: {err}"));
                    return Some((host, err));
                },
            };
            let mut last = None;
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(_) => return None,
                    Err(err) => last = Some(err),
                }
            }
            let err = last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"));
            Some((host, std::io::Error::new(err.kind(), format!("cannot connect: {err}"))))
        })
    });
    probe.await.ok().flatten()
}

impl ManagedClient {
    /// A builder for a managed client of the ensemble `hosts` (a ZooKeeper connect string, e.g.
    /// `"zk1:2181,zk2:2181,zk3:2181/app"`; a chroot suffix is allowed and must exist).
    pub fn builder(hosts: impl Into<String>) -> ManagedClientBuilder {
        ManagedClientBuilder {
            hosts: hosts.into(),
            connector: None,
            session_timeout: None,
            min_session_timeout: None,
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

    /// Closes the managed client (Curator's `close()`, kazoo's `stop()`) and ends its session.
    ///
    /// - Every acquire in flight either returned before the close began listing the session's
    ///   nodes — its hold is then told [`LossReason::SessionClosed`](crate::LossReason::SessionClosed)
    ///   before its node is deleted — or fails with [`Error::Closed`] without sending a create
    ///   (a node it created earlier is deleted with the others). Nothing is granted or tracked
    ///   once the close has begun.
    /// - Every hold is told `Lost(SessionClosed)`; then every ephemeral node of the session — lock
    ///   nodes and any of your own — is deleted and the deletion confirmed with the server
    ///   (`getEphemerals`), so the next acquirer on another client is granted at once rather than
    ///   after the session timeout.
    /// - Then, best effort, the session ends with a `closeSession` the server confirms: should any
    ///   node of the session have escaped the deletes, the server deletes it now, and every
    ///   `zookeeper_client::Client` of the session — also a [`client`](Self::client) copy you
    ///   kept — sees the session end. (A second connection attaches to the session to send it, and
    ///   the session's own client may keep taking the session back; after `min(T/4, 2 s)` a
    ///   step is given up, and the session then lives until the last clone of its client — the
    ///   managed client's included — is dropped: the nodes are gone already.)
    ///
    /// No new session is established; later acquires fail with [`Error::Closed`];
    /// [`state`](Self::state) is [`ConnectionState::Closed`]. Idempotent: every `close()` — also
    /// one called while another runs, or after — returns when the work is done, with its outcome.
    ///
    /// Cancel safe: once polled, the client is closed, and the work runs to its end in the
    /// background even if every `close()` future is dropped.
    ///
    /// # Errors
    /// [`Error::ZooKeeper`] (or [`Error::SessionLost`]) if the nodes could not be confirmed
    /// deleted within the session timeout (the server is unreachable): they go when the server
    /// expires the session. The client is closed all the same.
    pub async fn close(&self) -> Result<()> {
        // The close gate (`SessionContext::through_gate`): this write of the flag waits for every
        // create being sent, and no create is sent after it.
        let first = !self.inner.closed.send_replace(true);
        let mut outcome = self.inner.close_outcome.subscribe();
        if first {
            if let Some(supervisor) = lock(&self.inner.supervisor).take() {
                supervisor.abort();
            }
            self.inner.supervising.store(false, Ordering::SeqCst);
            self.inner.generation.send_modify(|generation| *generation += 1);
            self.inner.publish(ConnectionState::Closed);
            // The work runs to its end whoever waits for it: every `close()` waits for its
            // outcome, and none can cancel it.
            // Should the task never finish (its runtime shuts down, a panic), the guard records
            // that as the outcome: no `close()` waits for ever.
            struct Outcome(Arc<Managed>, Option<Result<()>>);
            impl Drop for Outcome {
                fn drop(&mut self) {
                    let result = self.1.take().unwrap_or_else(|| Err(Error::Closed { path: "/".to_owned() }));
                    self.0.close_outcome.send_replace(Some(result));
                }
            }
            impl Outcome {
                fn set(mut self, result: Result<()>) {
                    self.1 = Some(result);
                }
            }
            let outcome_guard = Outcome(self.inner.clone(), None);
            tokio::spawn(async move {
                let result = outcome_guard.0.close_session().await;
                outcome_guard.set(result);
            });
        }
        let done = outcome.wait_for(Option::is_some).await;
        match done.as_deref() {
            Ok(Some(result)) => result.clone(),
            // Unreachable: the outcome is set before its sender (in `Managed`) can go.
            _ => Err(Error::Closed { path: "/".to_owned() }),
        }
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
    /// [`ManagedClient::close`]'s work, once: tell the holds, delete the session's nodes and
    /// confirm it, end the session.
    async fn close_session(&self) -> Result<()> {
        let context = lock(&self.current).clone();
        // Told before any node is deleted, and nothing is tracked from now on.
        context.session.close_holds();
        let client = context.client().clone();
        if client.state().is_terminated() {
            return Ok(());
        }
        let timeout = client.session_timeout();
        match tokio::time::timeout(timeout, delete_ephemerals(&client)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(Error::ZooKeeper {
                    op: "delete the session's nodes on close",
                    path: "/".to_owned(),
                    source: zk::Error::Timeout,
                })
            },
        }
        // Best effort, and briefly: the nodes are confirmed deleted already.
        end_session(&self.connector, &self.hosts, &client, (timeout / 4).min(Duration::from_secs(2))).await;
        Ok(())
    }

    fn publish(&self, state: ConnectionState) {
        {
            let mut current = lock(&self.state);
            // `Closed` is final: a supervisor step racing the close publishes nothing after it —
            // the event is sent under the same lock, so the stream has the order of the state.
            if *current == ConnectionState::Closed {
                return;
            }
            *current = state;
            // No receivers is fine.
            let _ = self.states.send(state);
        }
        match state {
            ConnectionState::Suspended | ConnectionState::Lost => {
                warn!(hosts = self.hosts, %state, "ZooKeeper connection state")
            },
            _ => info!(hosts = self.hosts, %state, "ZooKeeper connection state"),
        }
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
        // Under a read of the closed flag (no await in between): a `close()` either comes after
        // the new session is current — and closes it — or before, and the new session is
        // dropped here unused (its last client dropped: `closeSession`).
        let closed = managed.closed.borrow();
        if *closed {
            return;
        }
        *lock(&managed.current) =
            SessionContext::new(&client, managed.id, managed.min_session_timeout, Some(managed.closed.subscribe()));
        managed.generation.send_modify(|generation| *generation += 1);
        managed.publish(ConnectionState::NewSession);
        drop(closed);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The close gate: `close()`'s write of the flag returns only after a create being sent
    /// through the gate was sent, and no create goes through after it.
    #[test]
    fn close_waits_for_a_create_being_sent_and_none_is_sent_after() {
        let flag = watch::Sender::new(false);
        let gate = flag.subscribe();
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            through_gate(Some(&gate), || {
                entered_tx.send(()).unwrap();
                // A create being marshalled and queued, slowly.
                std::thread::sleep(Duration::from_millis(300));
                std::time::Instant::now()
            })
            .expect("open when the send began")
        });
        entered_rx.recv().unwrap();
        assert!(!flag.send_replace(true), "the first close");
        let closed_at = std::time::Instant::now();
        let sent_at = sender.join().unwrap();
        assert!(sent_at <= closed_at, "close() went on while a create was being sent");
        let gate = flag.subscribe();
        assert!(through_gate(Some(&gate), || ()).is_err(), "a create went through after the close");
        assert!(through_gate(None, || ()).is_ok(), "a plain client has no gate");
    }
}
