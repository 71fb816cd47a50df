//! Real ZooKeeper servers for tests.
//!
//! [`ZooKeeper::start`] gives a fresh server, [`ZooKeeper::shared`] one server per test process,
//! [`ZooKeeper::start_with_data_dir`] a fresh server that starts from a data directory (a
//! snapshot) the test crafted.
//! Where the server comes from is decided at run time, in this order:
//!
//! 1. `ZK_CONNECT` is set (e.g. `ZK_CONNECT=127.0.0.1:2181`): that server is used as is
//!    ([`Backend::External`]); the harness does not manage it, so [`ZooKeeper::stop`],
//!    [`ZooKeeper::restart`], [`ZooKeeper::pause`] and [`ZooKeeper::unpause`] return
//!    [`HarnessError::Unsupported`].
//! 2. Docker, through the `testcontainers` crate ([`Backend::Container`]): the image `ZK_IMAGE`
//!    (default `zookeeper:3.9`, the official image) if present; without `ZK_IMAGE`, the offline
//!    image `zk-recipes/zookeeper:3.8-local` if present; else a pull of the image, announced on
//!    stderr and given up after 60 s (a failure is remembered for 10 minutes); else the offline
//!    image, built by `build-image.sh` when missing (announced; 1 to 3 minutes, once per machine,
//!    under a file lock shared by all test processes; needs root and apt; disable with
//!    `ZK_AUTOBUILD=0`).
//! 3. A local JVM from Debian's `libzookeeper-java` ([`Backend::LocalProcess`]).
//!    `REQUIRE_DOCKER=1` turns a failure of step 2 into an error instead.
//! 4. Otherwise [`HarnessError::NoServer`], which says how to get a server.
//!
//! Servers use `tickTime=500` (so session timeouts from 1 s to 60 s are allowed),
//! `maxClientCnxns=0`, all four-letter words, no admin server, `forceSync=no`, TTL nodes
//! enabled and a 500 ms container-node cleanup interval (see [`SERVER_JVM_FLAGS`]).
//!
//! # Cleanup
//! A server from [`ZooKeeper::start`] is stopped and removed when the value is dropped. The
//! [`ZooKeeper::shared`] server lives in a `static` and is never dropped; it is cleaned up when
//! the test process exits: a local JVM by its supervisor, a container by a small reaper process
//! (needs the `docker` CLI). Containers are also labelled `zk-testcontainers.owner-pid=<pid>` and
//! `zk-testcontainers.owner-host=<hostname>`; every test process removes labelled containers
//! whose owner is gone, so even a `kill -9` leaks a container only until the next run
//! (`docker rm -f $(docker ps -aq --filter label=zk-testcontainers.owner-pid)` removes all).
//!
//! # Fault injection
//! [`FaultProxy`] sits between a client and the server and can stall (both ways or only
//! client→server), cut or refuse connections, or lose the reply to a chosen request;
//! [`expire_session`] expires a session on demand.
//!
//! # Ensembles
//! [`Ensemble::start`] (or [`Ensemble::builder`] for `tickTime`, `initLimit`, `syncLimit`) runs
//! several servers as containers on a Docker network of their own, with per-server stop, kill,
//! pause, a zone partition (cut off from the other servers, clients still connected) and
//! isolation from everyone. Ensembles need Docker (no local-process fallback).
//!
//! ```no_run
//! # async fn demo() -> Result<(), zk_testcontainers::HarnessError> {
//! use zk_testcontainers::ZooKeeper;
//! let zk = ZooKeeper::shared().await?;
//! let client = zk.client().await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod docker;
mod ensemble;
mod error;
mod expire;
mod local;
pub mod proxy;
mod util;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use ensemble::{Ensemble, EnsembleBuilder};
pub use error::HarnessError;
pub use proxy::{op, FaultProxy};
/// Re-export of the client crate the harness hands out.
pub use zookeeper_client;

use zookeeper_client::Client;
#[cfg(doc)]
use zookeeper_client::SessionState;

/// Default session timeout of [`ZooKeeper::client`] and [`ZooKeeper::connector`].
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// The one scheduling slack timing assertions allow on top of a bound the README publishes:
/// tests assert `bound + SCHED_SLACK`, never a looser bound.
///
/// Why: CI runs on a loaded 2-core machine, where the server JVM(s), the test's tokio workers
/// and other test binaries share two cores; a timer wake-up, a proxy forwarding a byte or a
/// watch event being delivered can each be late by tens of milliseconds, and a few hundred
/// under load (`uptime` above 3). The slack covers that scheduling delay only: a bound missed by
/// more than this is a real miss — change the published number, not the test.
pub const SCHED_SLACK: Duration = Duration::from_millis(250);

/// The image tried first unless `ZK_IMAGE` is set.
pub const DEFAULT_IMAGE: &str = docker::DEFAULT_IMAGE;

/// The image built offline by `build-image.sh` (Debian bookworm + `libzookeeper-java` 3.8).
pub const LOCAL_IMAGE: &str = docker::LOCAL_IMAGE;

/// JVM flags of the servers the harness starts: a modest heap, TTL nodes enabled
/// (`zookeeper.extendedTypesEnabled`), and empty container nodes removed every 500 ms
/// (`znode.container.checkIntervalMs`; the default is 60 s).
pub const SERVER_JVM_FLAGS: &[&str] =
    &["-Xmx512m", "-XX:+UseSerialGC", "-Dzookeeper.extendedTypesEnabled=true", "-Dznode.container.checkIntervalMs=500"];

/// Where a [`ZooKeeper`] server comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A server given by `ZK_CONNECT`; not managed by the harness.
    External,
    /// A Docker container started by the harness.
    Container {
        /// The image it runs.
        image: String,
        /// The container id.
        id: String,
    },
    /// A local JVM started by the harness.
    LocalProcess {
        /// Pid of the supervising process, which is also the process group of the JVM (stable
        /// across [`ZooKeeper::restart`]).
        pid: u32,
    },
}

enum Server {
    External,
    Container(docker::ContainerServer),
    Local(local::LocalServer),
}

/// A running ZooKeeper server for tests. Dropping it stops and removes what it started.
pub struct ZooKeeper {
    connect: String,
    backend: Backend,
    server: Server,
}

impl std::fmt::Debug for ZooKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeper").field("connect", &self.connect).field("backend", &self.backend).finish()
    }
}

fn env_flag(name: &str) -> bool {
    util::env_nonempty(name).map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on")).unwrap_or(false)
}

impl ZooKeeper {
    /// An existing server or ensemble at `connect` (`host:port,...`), as `ZK_CONNECT` gives: the
    /// harness connects to it but does not manage it (no stop, restart or pause).
    pub fn external(connect: &str) -> ZooKeeper {
        ZooKeeper { connect: connect.trim().to_string(), backend: Backend::External, server: Server::External }
    }

    /// Starts a fresh server dedicated to the caller (or uses `ZK_CONNECT`), see the
    /// [crate docs](crate) for the resolution order. Returns once the server serves requests.
    pub async fn start() -> Result<ZooKeeper, HarnessError> {
        if let Some(connect) = util::env_nonempty("ZK_CONNECT") {
            return Ok(ZooKeeper::external(&connect));
        }
        ZooKeeper::start_managed(None).await
    }

    /// Starts a fresh server, like [`ZooKeeper::start`], whose data directory starts as a copy of
    /// `data_dir`: a ZooKeeper `dataDir`, i.e. a `version-2/` directory with a snapshot
    /// (`snapshot.<zxid>`) and possibly transaction logs (`log.<zxid>`). The server loads that
    /// state as its own, so a test can begin where no test could get by requests in its time
    /// (zk-recipes' `tests/interop/WrapSnapshot.java` writes a node whose child counter is just
    /// below the 32-bit wrap). Returns once the server serves requests.
    ///
    /// `data_dir` is only read, and can be reused: a container gets the copy through the Docker
    /// API before its server starts (nothing is mounted, so no file ownership has to match the
    /// container's user) and keeps snapshots and logs together in `/data`; a local process gets
    /// it in its temporary directory. [`ZooKeeper::restart`] keeps the server's current data,
    /// not the seed's. `ZK_CONNECT` is ignored (a server the harness does not manage cannot be
    /// given data); otherwise the server comes from Docker or a local JVM as for
    /// [`ZooKeeper::start`], `REQUIRE_DOCKER=1` included.
    ///
    /// Fails with [`HarnessError::Io`] if `data_dir` has no `version-2/` directory; a server that
    /// does not start on the data (say, a snapshot it cannot read) fails like one that does not
    /// start at all, with the reason.
    pub async fn start_with_data_dir(data_dir: impl AsRef<Path>) -> Result<ZooKeeper, HarnessError> {
        let data_dir = data_dir.as_ref();
        if !data_dir.join("version-2").is_dir() {
            return Err(HarnessError::io(
                format!("seeding a ZooKeeper server with {}", data_dir.display()),
                "it has no version-2/ directory",
                "give a ZooKeeper dataDir: version-2/snapshot.<zxid> (and log.<zxid>) files",
            ));
        }
        ZooKeeper::start_managed(Some(data_dir)).await
    }

    /// A server the harness starts and manages: a container, else a local JVM.
    async fn start_managed(seed: Option<&Path>) -> Result<ZooKeeper, HarnessError> {
        let mut attempts = Vec::new();
        match docker::start(seed.map(Path::to_path_buf)).await {
            Ok(c) => {
                return Ok(ZooKeeper {
                    connect: c.addr.clone(),
                    backend: Backend::Container { image: c.image.clone(), id: c.id.clone() },
                    server: Server::Container(c),
                })
            },
            Err(reason) if env_flag("REQUIRE_DOCKER") => {
                return Err(HarnessError::Docker {
                    action: "starting a ZooKeeper container (REQUIRE_DOCKER=1)".into(),
                    reason,
                    hint: format!(
                        "Make Docker usable (`docker info`) and provide an image: `docker pull {DEFAULT_IMAGE}` \
                         or `sudo {}`; or unset REQUIRE_DOCKER to allow a local java process",
                        docker::script_path()
                    ),
                })
            },
            Err(reason) => attempts.push(format!("  - Docker: {reason}")),
        }

        match local::LocalServer::start(seed).await {
            Ok(l) => {
                static TOLD: AtomicBool = AtomicBool::new(false);
                if !TOLD.swap(true, Ordering::Relaxed) {
                    docker::notice(format!(
                        "using a local java ZooKeeper process (no container: {})",
                        attempts.join("; ").trim_start_matches("  - ")
                    ));
                }
                Ok(ZooKeeper {
                    connect: l.addr.clone(),
                    backend: Backend::LocalProcess { pid: l.pid },
                    server: Server::Local(l),
                })
            },
            Err(reason) => {
                attempts.push(format!("  - local process: {reason}"));
                Err(HarnessError::NoServer {
                    attempts: format!("Tried:\n{}", attempts.join("\n")),
                    script: docker::script_path(),
                })
            },
        }
    }

    /// The server shared by all tests of this process: started on first use, never stopped
    /// (it is cleaned up when the process exits, see the [crate docs](crate#cleanup)).
    ///
    /// Safe to call from many `#[tokio::test]`s at once, each with its own runtime. If starting
    /// it fails, every call returns that same error. Tests that stop, restart or pause the
    /// server must use [`ZooKeeper::start`] instead.
    pub async fn shared() -> Result<&'static ZooKeeper, HarnessError> {
        static SHARED: tokio::sync::OnceCell<Result<ZooKeeper, HarnessError>> = tokio::sync::OnceCell::const_new();
        SHARED.get_or_init(ZooKeeper::start).await.as_ref().map_err(Clone::clone)
    }

    /// The connect string, `"127.0.0.1:PORT"` (or the value of `ZK_CONNECT`). Stable across
    /// [`ZooKeeper::restart`].
    pub fn connect_string(&self) -> &str {
        &self.connect
    }

    /// Where this server comes from.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Connects a client with a 4 s session timeout.
    pub async fn client(&self) -> Result<Client, HarnessError> {
        self.client_with_timeout(DEFAULT_SESSION_TIMEOUT).await
    }

    /// Connects a client with the given session timeout (the server allows 1 s … 60 s).
    pub async fn client_with_timeout(&self, session_timeout: Duration) -> Result<Client, HarnessError> {
        let fut = Client::connector().with_session_timeout(session_timeout).connect(&self.connect);
        match tokio::time::timeout(session_timeout + Duration::from_secs(10), fut).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(HarnessError::connect(&self.connect, e)),
            Err(_) => Err(HarnessError::connect(
                &self.connect,
                format!("no session within {} s", (session_timeout + Duration::from_secs(10)).as_secs()),
            )),
        }
    }

    /// A client connector with the default 4 s session timeout; connect it to
    /// [`ZooKeeper::connect_string`] or to a [`FaultProxy::addr`].
    pub fn connector(&self) -> zookeeper_client::Connector {
        Client::connector().with_session_timeout(DEFAULT_SESSION_TIMEOUT)
    }

    fn unsupported(&self, op: &'static str) -> HarnessError {
        HarnessError::Unsupported { op, addr: self.connect.clone() }
    }

    /// Stops the server (container stop / JVM kill), keeping its data. Clients see the
    /// connection drop; [`ZooKeeper::restart`] brings it back.
    pub async fn stop(&self) -> Result<(), HarnessError> {
        match &self.server {
            Server::External => Err(self.unsupported("stop")),
            Server::Container(c) => c.stop().await,
            Server::Local(l) => l.stop().await,
        }
    }

    /// Stops the server (if running) and starts it again on the same address with the same
    /// data; returns once it serves requests. Sessions survive if the server is back within
    /// their timeout.
    pub async fn restart(&self) -> Result<(), HarnessError> {
        match &self.server {
            Server::External => Err(self.unsupported("restart")),
            Server::Container(c) => {
                c.stop().await?;
                c.start_again().await
            },
            Server::Local(l) => {
                l.stop().await?;
                l.start_again().await
            },
        }
    }

    /// Freezes the server (`docker pause` / `SIGSTOP`): connections stay open but nothing is
    /// answered.
    pub async fn pause(&self) -> Result<(), HarnessError> {
        match &self.server {
            Server::External => Err(self.unsupported("pause")),
            Server::Container(c) => c.pause().await,
            Server::Local(l) => l.pause(),
        }
    }

    /// Resumes a server frozen by [`ZooKeeper::pause`].
    pub async fn unpause(&self) -> Result<(), HarnessError> {
        match &self.server {
            Server::External => Err(self.unsupported("unpause")),
            Server::Container(c) => c.unpause().await,
            Server::Local(l) => l.unpause(),
        }
    }

    /// Sends a four-letter word (`"ruok"`, `"mntr"`, `"srvr"`, `"cons"`, …) and returns the
    /// server's full answer.
    pub async fn four_letter_word(&self, cmd: &str) -> Result<String, HarnessError> {
        util::four_letter_word(&self.connect, cmd, Duration::from_secs(10)).await
    }
}

/// Expires `client`'s session on demand, like Curator's `KillSession`: a second connection
/// resumes the session with the same id and password and closes it. Returns once the server
/// has answered that `closeSession` (or reports the session as already gone). The server drops
/// the session's connections, so `client` then observes [`SessionState::Expired`] on its next
/// reconnect; this function waits up to 5 s for that (without failing if it does not happen,
/// e.g. when `client` is cut off by a [`FaultProxy`]).
///
/// Only the first host of `connect_string` is used.
pub async fn expire_session(connect_string: &str, client: &Client) -> Result<(), HarnessError> {
    expire::expire_session(connect_string, client).await
}
