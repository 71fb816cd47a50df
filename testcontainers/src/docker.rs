//! The container backend: a ZooKeeper container started with `testcontainers`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::util::{self, env_nonempty, on_bg};
use crate::HarnessError;

/// How long a pull may take before the offline image is used instead: a reachable registry
/// delivers the official image (~100 MB) well within it; an unreachable one usually fails at once.
const PULL_LIMIT: Duration = Duration::from_secs(60);

/// The official image used unless `ZK_IMAGE` says otherwise.
pub(crate) const DEFAULT_IMAGE: &str = "zookeeper:3.9";
/// The image `build-image.sh` builds (offline, from Debian packages).
pub(crate) const LOCAL_IMAGE: &str = "zk-recipes/zookeeper:3.8-local";
/// Readiness line, printed by standalone servers of 3.5 … 3.9 (`PrepRequestProcessor (sid:0)
/// started, reconfigEnabled=false`), on stdout with both the official image (logback console
/// appender) and ours (log4j console appender).
pub(crate) const READY_LINE: &str = "PrepRequestProcessor (sid:";
/// The data directory (`dataDir`, `ZOO_DATA_DIR`) of the official image and ours: snapshots
/// (`version-2/snapshot.*`). Transaction logs go to `/datalog`, except in a container started
/// from a seed, which keeps both here (as a local process does).
pub(crate) const DATA_DIR: &str = "/data";
/// Label holding the pid of the process that owns a container.
pub(crate) const LABEL_PID: &str = "zk-testcontainers.owner-pid";
/// Label holding the host name of the machine (pid namespace) of that process.
pub(crate) const LABEL_HOST: &str = "zk-testcontainers.owner-host";

/// The embedded image build script (the same file as `testcontainers/build-image.sh`).
const BUILD_SCRIPT: &str = include_str!("../build-image.sh");

pub(crate) fn script_path() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/build-image.sh").to_string()
}

/// Writes a notice straight to the process's stderr (not captured by the test harness), so a
/// developer sees why a test is slow.
pub(crate) fn notice(msg: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "zk-testcontainers: {msg}");
}

/// A running ZooKeeper container.
pub(crate) struct ContainerServer {
    container: Mutex<Option<Arc<ContainerAsync<GenericImage>>>>,
    pub(crate) id: String,
    pub(crate) image: String,
    pub(crate) addr: String,
}

pub(crate) fn split_image(image: &str) -> (String, String) {
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => (image[..i].to_string(), image[i + 1..].to_string()),
        _ => (image.to_string(), "latest".to_string()),
    }
}

fn docker_err(action: &str) -> impl Fn(testcontainers::TestcontainersError) -> HarnessError + '_ {
    move |e| HarnessError::docker(action, e)
}

impl ContainerServer {
    fn handle(&self) -> Result<Arc<ContainerAsync<GenericImage>>, HarnessError> {
        let guard = self.container.lock().unwrap_or_else(|p| p.into_inner());
        guard.clone().ok_or_else(|| {
            HarnessError::docker(
                "using the container",
                "it was already removed",
                // unreachable in practice: only Drop removes it
            )
        })
    }

    pub(crate) async fn stop(&self) -> Result<(), HarnessError> {
        let c = self.handle()?;
        on_bg(async move { c.stop_with_timeout(Some(5)).await.map_err(docker_err("docker stop")) }).await
    }

    /// Starts the (stopped) container again and waits until it serves on the same address.
    pub(crate) async fn start_again(&self) -> Result<(), HarnessError> {
        let c = self.handle()?;
        let addr = self.addr.clone();
        let what = format!("container {} ({})", short(&self.id), self.image);
        on_bg(async move {
            if !c.is_running().await.map_err(docker_err("docker inspect"))? {
                c.start().await.map_err(docker_err("docker start"))?;
            }
            let timeout = Duration::from_secs(60);
            if let Err(reason) = util::wait_serving(&addr, Instant::now() + timeout).await {
                let log = container_log_tail(&c).await;
                return Err(HarnessError::Startup { what, secs: timeout.as_secs(), reason, log });
            }
            Ok(())
        })
        .await
    }

    pub(crate) async fn pause(&self) -> Result<(), HarnessError> {
        let c = self.handle()?;
        on_bg(async move { c.pause().await.map_err(docker_err("docker pause")) }).await
    }

    pub(crate) async fn unpause(&self) -> Result<(), HarnessError> {
        let c = self.handle()?;
        on_bg(async move { c.unpause().await.map_err(docker_err("docker unpause")) }).await
    }
}

impl Drop for ContainerServer {
    fn drop(&mut self) {
        let taken = self.container.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(c) = taken {
            util::block_on_bg(
                async move {
                    match Arc::try_unwrap(c) {
                        Ok(c) => {
                            let _ = c.rm().await;
                        },
                        // Someone still holds it (cannot happen: all users borrow &self); its
                        // own Drop removes the container.
                        Err(arc) => drop(arc),
                    }
                },
                Duration::from_secs(30),
            );
        }
    }
}

pub(crate) fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

pub(crate) async fn container_log_tail(c: &ContainerAsync<GenericImage>) -> String {
    let out = c.stdout_to_vec().await.unwrap_or_default();
    let err = c.stderr_to_vec().await.unwrap_or_default();
    let text = format!("{}{}", String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    if text.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- container log (last lines) ---\n{}", util::tail(&text, 30))
    }
}

/// Tries to start a ZooKeeper container; with `seed`, its data directory ([`DATA_DIR`]) starts
/// as a copy of that host directory. `Err` carries the reason Docker could not be used (the
/// caller falls back or reports it).
pub(crate) async fn start(seed: Option<PathBuf>) -> Result<ContainerServer, String> {
    on_bg(async move { Ok(start_on_bg(seed).await) }).await.map_err(|e| e.to_string())?
}

async fn start_on_bg(seed: Option<PathBuf>) -> Result<ContainerServer, String> {
    let docker = testcontainers::core::client::docker_client_instance()
        .await
        .map_err(|e| format!("Docker is not available: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
        Ok(Ok(_)) => {},
        Ok(Err(e)) => return Err(format!("Docker is not available (ping failed: {e})")),
        Err(_) => return Err("Docker is not available (ping timed out after 10 s)".into()),
    }

    reap_stale_containers(&docker).await;
    ensure_reaper();

    let image = choose_image(&docker).await?;

    let mut last_err = String::new();
    for _attempt in 0..3 {
        let port = util::free_port().map_err(|e| e.to_string())?;
        match start_container(&image, port, seed.as_deref()).await {
            Ok(server) => return Ok(server),
            Err(e) => {
                let retry = e.contains("port is already allocated") || e.contains("address already in use");
                last_err = e;
                if !retry {
                    break;
                }
            },
        }
    }
    Err(last_err)
}

/// Whether an absent image may be pulled from a registry (`ZK_PULL=1`; off by default).
fn pulls_allowed() -> bool {
    std::env::var("ZK_PULL").map(|v| v.trim() == "1").unwrap_or(false)
}

async fn image_exists(docker: &bollard::Docker, image: &str) -> bool {
    docker.inspect_image(image).await.is_ok()
}

pub(crate) async fn choose_image(docker: &bollard::Docker) -> Result<String, String> {
    let explicit = env_nonempty("ZK_IMAGE");
    let wanted = explicit.clone().unwrap_or_else(|| DEFAULT_IMAGE.to_string());
    if image_exists(docker, &wanted).await {
        return Ok(wanted);
    }
    // Without an explicit ZK_IMAGE, an offline image built earlier beats a pull.
    if explicit.is_none() && image_exists(docker, LOCAL_IMAGE).await {
        return Ok(LOCAL_IMAGE.to_string());
    }
    // A failed pull is remembered for 10 minutes (across test processes: `cargo test` runs
    // one process per test target) so that an unreachable registry costs its timeout once.
    let marker =
        std::env::temp_dir().join(format!("zk-testcontainers-pull-failed-{}", wanted.replace(['/', ':', '@'], "_")));
    let recent_failure = std::fs::metadata(&marker)
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|m| m.elapsed().ok())
        .filter(|age| *age < Duration::from_secs(600))
        .and_then(|_| std::fs::read_to_string(&marker).ok());
    let pull_err = if !pulls_allowed() {
        // A test reaches only loopback and the containers it starts: a registry is another
        // address, so a pull is made only when asked for.
        "pulls are off; ZK_PULL=1 allows one".to_string()
    } else if let Some(previous) = recent_failure {
        format!("{} (remembered from a previous attempt; delete {} to retry now)", previous.trim(), marker.display())
    } else {
        let (name, tag) = split_image(&wanted);
        notice(format!(
            "image {wanted} is not present locally: pulling it (giving up after {} s; a failed pull is remembered \
             for 10 minutes, then {LOCAL_IMAGE} is used or built offline)",
            PULL_LIMIT.as_secs()
        ));
        let pull = tokio::time::timeout(PULL_LIMIT, GenericImage::new(name, tag).pull_image()).await;
        let e = match pull {
            Ok(Ok(_)) => return Ok(wanted),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("pull timed out after {} s", PULL_LIMIT.as_secs()),
        };
        notice(format!("pulling {wanted} failed: {e}"));
        let _ = std::fs::write(&marker, &e);
        e
    };
    let why = format!("image {wanted} is not present locally and cannot be pulled ({pull_err})");
    if explicit.is_some() && wanted != LOCAL_IMAGE {
        notice(format!("WARNING: ZK_IMAGE={wanted} is unusable: {why}; trying {LOCAL_IMAGE} instead"));
    }
    if image_exists(docker, LOCAL_IMAGE).await {
        return Ok(LOCAL_IMAGE.to_string());
    }
    autobuild(docker, &why).await?;
    Ok(LOCAL_IMAGE.to_string())
}

async fn start_container(image: &str, port: u16, seed: Option<&Path>) -> Result<ContainerServer, String> {
    let (name, tag) = split_image(image);
    let mut req = GenericImage::new(name, tag)
        .with_wait_for(WaitFor::message_on_either_std(READY_LINE))
        .with_exposed_port(2181.tcp())
        .with_mapped_port(port, 2181.tcp())
        .with_env_var("ZOO_TICK_TIME", "500")
        .with_env_var("ZOO_4LW_COMMANDS_WHITELIST", "*")
        .with_env_var("ZOO_MAX_CLIENT_CNXNS", "0")
        .with_env_var("ZOO_ADMINSERVER_ENABLED", "false")
        .with_env_var("ZOO_AUTOPURGE_PURGEINTERVAL", "0")
        .with_env_var("ZOO_CFG_EXTRA", "forceSync=no maxSessionTimeout=60000 minSessionTimeout=1000")
        .with_env_var("JVMFLAGS", crate::SERVER_JVM_FLAGS.join(" "))
        .with_label(LABEL_PID, std::process::id().to_string())
        .with_label(LABEL_HOST, util::hostname())
        .with_startup_timeout(Duration::from_secs(120));
    if let Some(seed) = seed {
        // Copied into the created container before it starts (a tar through the Docker API):
        // nothing of the host is mounted, so the host directory is neither changed nor chowned,
        // and the container is free to own the copy (the official image's entrypoint chowns
        // its data directories to its `zookeeper` user; ours runs as root). Snapshots and
        // transaction logs in one directory, as in a dataDir without a dataLogDir: ZooKeeper
        // refuses to start on a snapshot directory with logs in it when the two differ.
        req = req
            .with_env_var("ZOO_DATA_DIR", DATA_DIR)
            .with_env_var("ZOO_DATA_LOG_DIR", DATA_DIR)
            .with_copy_to(DATA_DIR, seed.to_path_buf());
    }
    let container = req.start().await.map_err(|e| format!("starting a container from {image} failed: {e}"))?;

    let host = match container.get_host().await {
        Ok(h) => h.to_string(),
        Err(_) => "127.0.0.1".to_string(),
    };
    let host = if host == "localhost" { "127.0.0.1".to_string() } else { host };
    let addr = format!("{host}:{port}");
    let id = container.id().to_string();
    let server =
        ContainerServer { container: Mutex::new(Some(Arc::new(container))), id, image: image.to_string(), addr };
    // The log line came before the listener necessarily accepted: make sure it serves.
    if let Err(reason) = util::wait_serving(&server.addr, Instant::now() + Duration::from_secs(30)).await {
        // Dropping `server` here would block this (harness) runtime thread: remove inline.
        let c = server.handle().map_err(|e| e.to_string())?;
        let log = container_log_tail(&c).await;
        drop(c);
        let taken = server.container.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Ok(c)) = taken.map(Arc::try_unwrap) {
            let _ = c.rm().await;
        }
        return Err(format!(
            "container from {image} logged readiness but does not serve on {}: {reason}{log}",
            server.addr
        ));
    }
    Ok(server)
}

/// Starts (once per process) a tiny reaper process, in its own process group, that removes
/// every container labelled with this process's pid when this process dies in any way (its
/// stdin pipe closes: normal exit, panic, `kill -9`). It is started before the first container
/// is created, so a container is covered even while it is starting. Needs the `docker` CLI;
/// without it, leftovers are removed by the next test process (`reap_stale_containers`).
pub(crate) fn ensure_reaper() {
    static REAPER: OnceLock<Option<Mutex<Child>>> = OnceLock::new();
    REAPER.get_or_init(|| {
        use std::os::unix::process::CommandExt;
        if !which("docker") || !which("sh") {
            return None;
        }
        Command::new("sh")
            .arg("-c")
            .arg(
                "read _ignored; \
                 ids=$(docker ps -aq --filter \"label=$1=$2\" --filter \"label=$3=$4\" 2>/dev/null); \
                 [ -n \"$ids\" ] && docker rm -f -v $ids >/dev/null 2>&1; \
                 nets=$(docker network ls -q --filter \"name=zk-testcontainers-$2-\" 2>/dev/null); \
                 [ -n \"$nets\" ] && docker network rm $nets >/dev/null 2>&1; exit 0",
            )
            .arg("zk-testcontainers-reaper")
            .arg(LABEL_PID)
            .arg(std::process::id().to_string())
            .arg(LABEL_HOST)
            .arg(util::hostname())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .ok()
            .map(Mutex::new)
    });
}

pub(crate) fn which(cmd: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file())).unwrap_or(false)
}

/// Removes containers labelled by this harness whose owning process (on this host) is gone.
/// Runs once per process.
pub(crate) async fn reap_stale_containers(docker: &bollard::Docker) {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
        let filters: HashMap<&str, Vec<&str>> = HashMap::from([("label", vec![LABEL_PID])]);
        let opts = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let Ok(list) = docker.list_containers(Some(opts)).await else {
            return;
        };
        let me = util::hostname();
        let my_pid = std::process::id().to_string();
        let mut removed = 0;
        for c in list {
            let (Some(id), Some(labels)) = (c.id, c.labels) else {
                continue;
            };
            let (Some(pid), Some(host)) = (labels.get(LABEL_PID), labels.get(LABEL_HOST)) else {
                continue;
            };
            if host != &me || pid == &my_pid {
                continue;
            }
            if pid.parse::<i32>().map(util::pid_alive).unwrap_or(false) {
                continue;
            }
            let opts = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
            if docker.remove_container(&id, Some(opts)).await.is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            notice(format!("removed {removed} leftover ZooKeeper container(s) of test processes that no longer run"));
        }
    })
    .await;
}

/// Process-wide memory of the automatic build: it runs at most once per process.
static BUILD: tokio::sync::Mutex<Option<Result<(), String>>> = tokio::sync::Mutex::const_new(None);

fn autobuild_blocker() -> Option<String> {
    if std::env::var("ZK_AUTOBUILD").map(|v| v.trim() == "0").unwrap_or(false) {
        return Some("ZK_AUTOBUILD=0".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (debootstrap needs root)".into());
    }
    if !which("bash") {
        return Some("bash is not installed".into());
    }
    if !which("debootstrap") && !which("apt-get") {
        return Some("neither debootstrap nor apt-get is available".into());
    }
    None
}

async fn autobuild(docker: &bollard::Docker, why: &str) -> Result<(), String> {
    let script = script_path();
    if let Some(blocker) = autobuild_blocker() {
        return Err(format!(
            "{why}; {LOCAL_IMAGE} does not exist and cannot be built automatically here ({blocker}); \
             build it with `sudo {script}`"
        ));
    }
    let mut memo = BUILD.lock().await;
    if let Some(result) = memo.as_ref() {
        return result.clone();
    }
    let result = autobuild_locked(docker, why, &script).await;
    *memo = Some(result.clone());
    result
}

async fn autobuild_locked(docker: &bollard::Docker, why: &str, script: &str) -> Result<(), String> {
    let tmp = std::env::temp_dir();
    let lock_path = tmp.join("zk-testcontainers-build.lock");
    let failed_marker = tmp.join("zk-testcontainers-build.failed");

    let lock_path2 = lock_path.clone();
    let waiting = tokio::time::sleep(Duration::from_millis(300));
    tokio::pin!(waiting);
    let acquire = tokio::task::spawn_blocking(move || util::FileLock::acquire(&lock_path2));
    tokio::pin!(acquire);
    let lock = tokio::select! {
        r = &mut acquire => r,
        _ = &mut waiting => {
            notice(format!(
                "waiting for another test process that is building {LOCAL_IMAGE} (lock {})",
                lock_path.display()
            ));
            acquire.await
        }
    };
    let _lock = lock.map_err(|e| format!("waiting for the build lock failed: {e}"))?.map_err(|e| e.to_string())?;

    if image_exists(docker, LOCAL_IMAGE).await {
        return Ok(());
    }
    if let Ok(meta) = std::fs::metadata(&failed_marker) {
        let recent = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .map(|age| age < Duration::from_secs(15 * 60))
            .unwrap_or(false);
        if recent {
            let detail = std::fs::read_to_string(&failed_marker).unwrap_or_default();
            return Err(format!(
                "{why}; building {LOCAL_IMAGE} failed less than 15 minutes ago ({}); not retrying. \
                 Run `sudo {script}` to see why, or delete {} to retry automatically",
                detail.trim(),
                failed_marker.display()
            ));
        }
    }

    notice(format!(
        "{why}, and {LOCAL_IMAGE} does not exist: building it now with {script} \
         (Debian + libzookeeper-java via debootstrap, about 370 MB; 1 to 3 minutes, once per machine; \
         set ZK_AUTOBUILD=0 to disable)"
    ));
    let script_file: PathBuf = tmp.join(format!("zk-testcontainers-build-image-{}.sh", std::process::id()));
    std::fs::write(&script_file, BUILD_SCRIPT).map_err(|e| format!("writing {} failed: {e}", script_file.display()))?;
    let started = Instant::now();
    let status = tokio::task::spawn_blocking({
        let script_file = script_file.clone();
        move || {
            Command::new("bash")
                .arg(&script_file)
                .arg(LOCAL_IMAGE)
                .stdin(Stdio::null())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit())
                .status()
        }
    })
    .await;
    let _ = std::fs::remove_file(&script_file);
    let outcome = match status {
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => Err(format!("build-image.sh exited with {s}")),
        Ok(Err(e)) => Err(format!("running bash failed: {e}")),
        Err(e) => Err(format!("build task failed: {e}")),
    };
    match outcome {
        Ok(()) if image_exists(docker, LOCAL_IMAGE).await => {
            let _ = std::fs::remove_file(&failed_marker);
            notice(format!("built {LOCAL_IMAGE} in {} s", started.elapsed().as_secs()));
            Ok(())
        },
        Ok(()) => {
            Err(format!("build-image.sh succeeded but {LOCAL_IMAGE} does not exist; run `sudo {script}` by hand"))
        },
        Err(e) => {
            let _ = std::fs::write(&failed_marker, &e);
            Err(format!("{why}; building {LOCAL_IMAGE} failed: {e} (output above). Run `sudo {script}` by hand"))
        },
    }
}
