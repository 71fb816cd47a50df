//! A ZooKeeper ensemble of containers on a Docker network of its own, with per-server faults.
//!
//! ```no_run
//! # async fn demo() -> Result<(), zk_testcontainers::HarnessError> {
//! use std::time::Duration;
//! use zk_testcontainers::Ensemble;
//!
//! let ensemble = Ensemble::builder().servers(3).tick_time(Duration::from_millis(500)).sync_limit(10).start().await?;
//! let client = ensemble.client(Duration::from_secs(4)).await?;   // connected to any server
//! let leader = ensemble.leader().await?;                        // index of the leader
//! let follower = (leader + 1) % 3;
//! // A zone partition: the follower loses the other servers, its clients stay connected to it.
//! ensemble.partition_from_peers(follower).await?;
//! ensemble.heal(follower).await?;
//! ensemble.kill(leader).await?;       // or stop / pause / isolate (from everyone)
//! ensemble.start_server(leader).await?;
//! # Ok(()) }
//! ```
//!
//! Servers are numbered from 0 (`myid` = index + 1). Each publishes its client port on
//! `127.0.0.1:<port>`, stable across restarts; the servers reach each other by container name on
//! the ensemble's network. Partitions are `iptables` rules in the server's own network namespace
//! (entered with `nsenter`; needs root, `nsenter` and `iptables` on the host): traffic from the
//! host (clients) still flows unless the server is isolated from everyone. Containers are removed
//! when the `Ensemble` is dropped (also when a test panics), the network with the last of them;
//! containers of a killed test process are removed by the harness's reaper.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use zookeeper_client::Client;

use crate::docker::{self, LABEL_HOST, LABEL_PID};
use crate::util::{self, on_bg};
use crate::HarnessError;

/// Builds an [`Ensemble`]; see [`Ensemble::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct EnsembleBuilder {
    servers: usize,
    tick_time: Duration,
    init_limit: u32,
    sync_limit: u32,
    /// Extra `zoo.cfg` entries of single servers, appended after the common ones.
    server_extra: Vec<(usize, String)>,
}

impl EnsembleBuilder {
    /// Extra `zoo.cfg` entries (`key=value`, space separated) for server `i` only, appended after
    /// the common ones, so they win: e.g. `maxSessionTimeout=2000` to give one server a different
    /// session timeout range than the others (as during a rolling configuration change).
    pub fn server_extra(mut self, i: usize, entries: &str) -> Self {
        self.server_extra.push((i, entries.to_owned()));
        self
    }

    /// Number of servers (default 3).
    pub fn servers(mut self, servers: usize) -> Self {
        self.servers = servers;
        self
    }

    /// The servers' `tickTime` (default 500 ms, so session timeouts from 1 s to 60 s are allowed).
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.tick_time = tick;
        self
    }

    /// `initLimit` in ticks (default 10).
    pub fn init_limit(mut self, ticks: u32) -> Self {
        self.init_limit = ticks;
        self
    }

    /// `syncLimit` in ticks (default 5): how long a follower cut off from the leader keeps
    /// serving its clients (`syncLimit × tickTime`), and how long the leader waits for a
    /// follower.
    pub fn sync_limit(mut self, ticks: u32) -> Self {
        self.sync_limit = ticks;
        self
    }

    /// Starts the servers concurrently; returns once a quorum serves (`srvr` says leader or
    /// follower on a majority, one of them the leader).
    pub async fn start(self) -> Result<Ensemble, HarnessError> {
        if self.servers == 0 {
            return Err(HarnessError::docker("starting an ensemble", "it needs at least one server"));
        }
        on_bg(start_on_bg(self)).await
    }
}

/// One server of an [`Ensemble`].
struct Member {
    container: Mutex<Option<Arc<ContainerAsync<GenericImage>>>>,
    id: String,
    addr: String,
}

impl Member {
    fn handle(&self) -> Result<Arc<ContainerAsync<GenericImage>>, HarnessError> {
        let guard = self.container.lock().unwrap_or_else(|p| p.into_inner());
        guard.clone().ok_or_else(|| HarnessError::docker("using an ensemble container", "it was already removed"))
    }
}

/// A running ZooKeeper ensemble for tests. Dropping it removes its containers and network.
pub struct Ensemble {
    network: String,
    image: String,
    members: Vec<Member>,
    settings: EnsembleBuilder,
}

impl std::fmt::Debug for Ensemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ensemble")
            .field("network", &self.network)
            .field("image", &self.image)
            .field("servers", &self.members.iter().map(|m| m.addr.as_str()).collect::<Vec<_>>())
            .finish()
    }
}

fn docker_err(action: &'static str) -> impl Fn(testcontainers::TestcontainersError) -> HarnessError {
    move |e| HarnessError::docker(action, e)
}

async fn start_on_bg(settings: EnsembleBuilder) -> Result<Ensemble, HarnessError> {
    let docker = testcontainers::core::client::docker_client_instance()
        .await
        .map_err(|e| HarnessError::docker("connecting to Docker", e))?;
    docker.ping().await.map_err(|e| HarnessError::docker("pinging Docker", e))?;
    docker::reap_stale_containers(&docker).await;
    docker::ensure_reaper();
    let image = docker::choose_image(&docker).await.map_err(|e| HarnessError::docker("choosing an image", e))?;

    static ENSEMBLES: AtomicUsize = AtomicUsize::new(0);
    let tag = format!("{}-{}", std::process::id(), ENSEMBLES.fetch_add(1, Ordering::Relaxed));
    let network = format!("zk-testcontainers-{tag}");
    let names: Vec<String> = (1..=settings.servers).map(|id| format!("zk-{tag}-{id}")).collect();
    let servers = names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("server.{}={name}:2888:3888;2181", i + 1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut ports = Vec::new();
    for _ in 0..settings.servers {
        ports.push(util::free_port()?);
    }
    let (repo, tag_name) = docker::split_image(&image);
    let starts = names.iter().zip(&ports).enumerate().map(|(i, (name, port))| {
        let request = GenericImage::new(repo.clone(), tag_name.clone())
            .with_exposed_port(2181.tcp())
            .with_mapped_port(*port, 2181.tcp())
            .with_network(network.clone())
            .with_container_name(name.clone())
            .with_hostname(name.clone())
            .with_env_var("ZOO_MY_ID", (i + 1).to_string())
            .with_env_var("ZOO_SERVERS", servers.clone())
            .with_env_var("ZOO_STANDALONE_ENABLED", "false")
            .with_env_var("ZOO_TICK_TIME", settings.tick_time.as_millis().to_string())
            .with_env_var("ZOO_INIT_LIMIT", settings.init_limit.to_string())
            .with_env_var("ZOO_SYNC_LIMIT", settings.sync_limit.to_string())
            .with_env_var("ZOO_4LW_COMMANDS_WHITELIST", "*")
            .with_env_var("ZOO_MAX_CLIENT_CNXNS", "0")
            .with_env_var("ZOO_ADMINSERVER_ENABLED", "false")
            .with_env_var("ZOO_AUTOPURGE_PURGEINTERVAL", "0")
            .with_env_var("ZOO_CFG_EXTRA", {
                let mut extra = String::from(
                    "forceSync=no maxSessionTimeout=60000 minSessionTimeout=1000 quorumListenOnAllIPs=true \
                     cnxTimeout=1000",
                );
                for (_, entries) in settings.server_extra.iter().filter(|(server, _)| *server == i) {
                    extra.push(' ');
                    extra.push_str(entries);
                }
                extra
            })
            .with_env_var("JVMFLAGS", crate::SERVER_JVM_FLAGS.join(" "))
            .with_label(LABEL_PID, std::process::id().to_string())
            .with_label(LABEL_HOST, util::hostname())
            .with_startup_timeout(Duration::from_secs(120));
        async move { request.start().await }
    });
    let started = futures_join_all(starts.collect()).await;
    let mut members = Vec::new();
    let mut failure = None;
    for (result, port) in started.into_iter().zip(&ports) {
        match result {
            Ok(container) => members.push(Member {
                id: container.id().to_owned(),
                addr: format!("127.0.0.1:{port}"),
                container: Mutex::new(Some(Arc::new(container))),
            }),
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let ensemble = Ensemble { network, image, members, settings };
    if let Some(reason) = failure {
        ensemble.remove_inline().await;
        return Err(HarnessError::docker("starting an ensemble container", reason));
    }
    if let Err(reason) = ensemble.wait_for_quorum_inline(Duration::from_secs(90)).await {
        let log = match ensemble.members.first().map(Member::handle) {
            Some(Ok(c)) => docker::container_log_tail(&c).await,
            _ => String::new(),
        };
        ensemble.remove_inline().await;
        return Err(HarnessError::Startup { what: "ensemble".into(), secs: 90, reason, log });
    }
    Ok(ensemble)
}

/// Awaits all futures, concurrently, in order (a tiny `join_all`).
async fn futures_join_all<T: Send + 'static>(
    futures: Vec<impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(value) => out.push(value),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

impl Ensemble {
    /// A builder: 3 servers, `tickTime` 500 ms, `initLimit` 10, `syncLimit` 5.
    pub fn builder() -> EnsembleBuilder {
        EnsembleBuilder {
            servers: 3,
            tick_time: Duration::from_millis(500),
            init_limit: 10,
            sync_limit: 5,
            server_extra: Vec::new(),
        }
    }

    /// Starts `servers` servers with the default settings (see [`Ensemble::builder`]).
    pub async fn start(servers: usize) -> Result<Ensemble, HarnessError> {
        Ensemble::builder().servers(servers).start().await
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ensemble has no servers (never: [`EnsembleBuilder::start`] needs one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The servers' `tickTime`.
    pub fn tick_time(&self) -> Duration {
        self.settings.tick_time
    }

    /// `syncLimit` in ticks.
    pub fn sync_limit(&self) -> u32 {
        self.settings.sync_limit
    }

    /// A connect string over every server, `"127.0.0.1:P1,127.0.0.1:P2,..."`.
    pub fn connect_string(&self) -> String {
        self.members.iter().map(|m| m.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The client address of server `i`, `"127.0.0.1:PORT"` (stable across restarts).
    pub fn server_addr(&self, i: usize) -> &str {
        &self.members[i].addr
    }

    /// Connects a client over all servers with the given session timeout.
    pub async fn client(&self, session_timeout: Duration) -> Result<Client, HarnessError> {
        connect(&self.connect_string(), session_timeout).await
    }

    /// Connects a client to server `i` only.
    pub async fn client_of(&self, i: usize, session_timeout: Duration) -> Result<Client, HarnessError> {
        connect(self.server_addr(i), session_timeout).await
    }

    /// Server `i`'s answer to a four-letter word (`cons`, `mntr`, `conf`, ...; all are enabled).
    ///
    /// # Errors
    /// [`HarnessError`] if the server does not answer within 2 s.
    pub async fn four_letter_word(&self, i: usize, word: &str) -> Result<String, HarnessError> {
        util::four_letter_word(self.server_addr(i), word, Duration::from_secs(2)).await
    }

    /// `srvr`'s `Mode:` of server `i` (`leader`, `follower`, `standalone`), or `None` if it does
    /// not serve right now.
    pub async fn mode(&self, i: usize) -> Option<String> {
        mode_of(self.server_addr(i)).await
    }

    /// Index of the current leader (asked of every server; fails if none says so within 30 s).
    pub async fn leader(&self) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for i in 0..self.len() {
                if self.mode(i).await.as_deref() == Some("leader") {
                    return Ok(i);
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::docker("finding the ensemble's leader", "no server says it leads"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until a quorum serves again (after a restart or heal), at most `timeout`.
    pub async fn wait_for_quorum(&self, timeout: Duration) -> Result<(), HarnessError> {
        self.wait_for_quorum_inline(timeout).await.map_err(|reason| HarnessError::Startup {
            what: "ensemble quorum".into(),
            secs: timeout.as_secs(),
            reason,
            log: String::new(),
        })
    }

    async fn wait_for_quorum_inline(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut modes = Vec::new();
            for i in 0..self.len() {
                modes.push(self.mode(i).await);
            }
            let leaders = modes.iter().filter(|m| m.as_deref() == Some("leader")).count();
            let serving = modes.iter().filter(|m| matches!(m.as_deref(), Some("leader" | "follower"))).count();
            let standalone = self.len() == 1 && modes[0].as_deref() == Some("standalone");
            if standalone || (leaders == 1 && serving > self.len() / 2) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no serving quorum; modes: {modes:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops server `i` (`docker stop`), keeping its data.
    pub async fn stop(&self, i: usize) -> Result<(), HarnessError> {
        let c = self.members[i].handle()?;
        on_bg(async move { c.stop_with_timeout(Some(5)).await.map_err(docker_err("docker stop")) }).await
    }

    /// Kills server `i` at once (no graceful shutdown), keeping its data.
    pub async fn kill(&self, i: usize) -> Result<(), HarnessError> {
        let c = self.members[i].handle()?;
        on_bg(async move { c.stop_with_timeout(Some(0)).await.map_err(docker_err("docker kill")) }).await
    }

    /// Starts server `i` again after [`stop`](Self::stop) or [`kill`](Self::kill); returns once it
    /// serves (as leader or follower), at most 60 s.
    pub async fn start_server(&self, i: usize) -> Result<(), HarnessError> {
        let c = self.members[i].handle()?;
        on_bg(async move {
            if !c.is_running().await.map_err(docker_err("docker inspect"))? {
                c.start().await.map_err(docker_err("docker start"))?;
            }
            Ok(())
        })
        .await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(self.mode(i).await.as_deref(), Some("leader" | "follower")) {
            if Instant::now() >= deadline {
                return Err(HarnessError::Startup {
                    what: format!("ensemble server {i}"),
                    secs: 60,
                    reason: "did not rejoin the quorum".into(),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Freezes server `i` (`docker pause`): connections stay open, nothing is answered.
    pub async fn pause(&self, i: usize) -> Result<(), HarnessError> {
        let c = self.members[i].handle()?;
        on_bg(async move { c.pause().await.map_err(docker_err("docker pause")) }).await
    }

    /// Resumes server `i` after [`pause`](Self::pause).
    pub async fn unpause(&self, i: usize) -> Result<(), HarnessError> {
        let c = self.members[i].handle()?;
        on_bg(async move { c.unpause().await.map_err(docker_err("docker unpause")) }).await
    }

    /// A zone partition: server `i` can no longer reach the other servers (nor they it), while
    /// its clients stay connected to it. A follower cut off like this keeps answering its
    /// clients' pings and reads for up to `syncLimit × tickTime`.
    pub async fn partition_from_peers(&self, i: usize) -> Result<(), HarnessError> {
        let mut rules = Vec::new();
        for (j, peer) in self.members.iter().enumerate() {
            if j == i {
                continue;
            }
            let ip = self.ip_of(peer).await?;
            rules.push(vec!["-I".into(), "INPUT".into(), "-s".into(), ip.clone(), "-j".into(), "DROP".into()]);
            rules.push(vec!["-I".into(), "OUTPUT".into(), "-d".into(), ip, "-j".into(), "DROP".into()]);
        }
        self.iptables(i, rules).await
    }

    /// Cuts server `i` off from everyone: the other servers and its clients.
    pub async fn isolate(&self, i: usize) -> Result<(), HarnessError> {
        let rule = |chain: &str, dir: &str| {
            vec!["-I".into(), chain.into(), "!".into(), dir.into(), "lo".into(), "-j".into(), "DROP".into()]
        };
        self.iptables(i, vec![rule("INPUT", "-i"), rule("OUTPUT", "-o")]).await
    }

    /// Removes every partition of server `i`.
    pub async fn heal(&self, i: usize) -> Result<(), HarnessError> {
        let flush = |chain: &str| vec!["-F".to_string(), chain.to_string()];
        self.iptables(i, vec![flush("INPUT"), flush("OUTPUT")]).await
    }

    /// Removes every partition of every server.
    pub async fn heal_all(&self) -> Result<(), HarnessError> {
        for i in 0..self.len() {
            self.heal(i).await?;
        }
        Ok(())
    }

    async fn inspect(&self, member: &Member) -> Result<bollard::models::ContainerInspectResponse, HarnessError> {
        let id = member.id.clone();
        on_bg(async move {
            let docker = testcontainers::core::client::docker_client_instance()
                .await
                .map_err(|e| HarnessError::docker("connecting to Docker", e))?;
            docker.inspect_container(&id, None).await.map_err(|e| HarnessError::docker("docker inspect", e))
        })
        .await
    }

    async fn ip_of(&self, member: &Member) -> Result<String, HarnessError> {
        let info = self.inspect(member).await?;
        info.network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&self.network))
            .and_then(|n| n.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| HarnessError::docker("finding a server's address", "it has none on the ensemble network"))
    }

    /// Runs `iptables` rules in server `i`'s network namespace.
    async fn iptables(&self, i: usize, rules: Vec<Vec<String>>) -> Result<(), HarnessError> {
        let info = self.inspect(&self.members[i]).await?;
        let pid = info
            .state
            .and_then(|s| s.pid)
            .filter(|pid| *pid > 0)
            .ok_or_else(|| HarnessError::docker("partitioning a server", "it is not running (start it first)"))?;
        for rule in rules {
            let output = tokio::process::Command::new("nsenter")
                .arg("-t")
                .arg(pid.to_string())
                .arg("-n")
                .arg("iptables")
                .arg("-w")
                .args(&rule)
                .output()
                .await
                .map_err(|e| {
                    HarnessError::io(
                        "running nsenter … iptables",
                        e,
                        "partitions need root, nsenter (util-linux) and iptables on the host",
                    )
                })?;
            if !output.status.success() {
                return Err(HarnessError::io(
                    format!("iptables {} in server {i}'s network namespace", rule.join(" ")),
                    String::from_utf8_lossy(&output.stderr).trim(),
                    "partitions need root, nsenter (util-linux) and iptables on the host",
                ));
            }
        }
        Ok(())
    }

    async fn remove_inline(&self) {
        for member in &self.members {
            let taken = member.container.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(Ok(c)) = taken.map(Arc::try_unwrap) {
                let _ = c.rm().await;
            }
        }
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        let taken: Vec<_> =
            self.members.iter().filter_map(|m| m.container.lock().unwrap_or_else(|p| p.into_inner()).take()).collect();
        if taken.is_empty() {
            return;
        }
        util::block_on_bg(
            async move {
                for c in taken {
                    if let Ok(c) = Arc::try_unwrap(c) {
                        let _ = c.rm().await;
                    }
                }
            },
            Duration::from_secs(60),
        );
    }
}

async fn mode_of(addr: &str) -> Option<String> {
    let answer = util::four_letter_word(addr, "srvr", Duration::from_secs(2)).await.ok()?;
    answer.lines().find_map(|line| line.strip_prefix("Mode:")).map(|mode| mode.trim().to_owned())
}

async fn connect(connect: &str, session_timeout: Duration) -> Result<Client, HarnessError> {
    let fut = Client::connector().with_session_timeout(session_timeout).connect(connect);
    match tokio::time::timeout(session_timeout + Duration::from_secs(10), fut).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(HarnessError::connect(connect, e)),
        Err(_) => Err(HarnessError::connect(connect, "no session in time")),
    }
}
