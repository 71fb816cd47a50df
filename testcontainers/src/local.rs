//! The local-process backend: ZooKeeper from Debian's `libzookeeper-java`, run with `java`.
//!
//! A small `sh` supervisor (its own process group) starts the JVM in the background and reads
//! commands (`stop`, `start`) from a pipe held by this process. When the pipe closes — the
//! `ZooKeeper` value is dropped *or this process dies in any way* — the supervisor kills the
//! JVM and removes the server's temp directory, so servers never outlive the tests.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::util;
use crate::HarnessError;

/// Where Debian installs ZooKeeper's jars.
pub(crate) const JAVA_DIR: &str = "/usr/share/java";

const SUPERVISOR: &str = r#"
dir=$1; shift
run() {
    "$@" >>"$dir/server.log" 2>&1 &
    jpid=$!
    echo "$jpid" >"$dir/java.pid.tmp"
    mv -f "$dir/java.pid.tmp" "$dir/java.pid"
}
run "$@"
while read -r cmd; do
    case "$cmd" in
        stop) kill -9 "$jpid" 2>/dev/null; wait "$jpid" 2>/dev/null; rm -f "$dir/java.pid" ;;
        start) run "$@" ;;
    esac
done
kill -9 "$jpid" 2>/dev/null
wait "$jpid" 2>/dev/null
rm -rf "$dir"
"#;

const LOG4J: &str = "log4j.rootLogger=INFO, CONSOLE\n\
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
log4j.appender.CONSOLE.Target=System.out\n\
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} - %-5p [%t:%C{1}@%L] - %m%n\n";

/// A ZooKeeper JVM run by this process.
pub(crate) struct LocalServer {
    /// Pid of the supervisor, which is also the process group id of the server.
    pub(crate) pid: u32,
    pub(crate) addr: String,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

fn java_binary() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let p = Path::new(&home).join("bin/java");
        if p.is_file() {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("java")).find(|p| p.is_file()))
}

/// Why the local backend cannot be used, if it cannot.
pub(crate) fn unavailable_reason() -> Option<String> {
    if !Path::new(JAVA_DIR).join("zookeeper.jar").is_file() {
        return Some(format!("{JAVA_DIR}/zookeeper.jar not found (apt-get install libzookeeper-java)"));
    }
    if java_binary().is_none() {
        return Some("no `java` in PATH or JAVA_HOME (apt-get install openjdk-17-jre-headless)".into());
    }
    None
}

/// Copies the directory tree `from` into the existing directory `to` (files and directories).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

impl LocalServer {
    /// Starts a fresh server on a free 127.0.0.1 port and waits until it serves; with `seed`,
    /// its data directory starts as a copy of that directory.
    pub(crate) async fn start(seed: Option<&Path>) -> Result<LocalServer, String> {
        if let Some(r) = unavailable_reason() {
            return Err(r);
        }
        let java = java_binary().ok_or("no java")?;
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "zk-testcontainers-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("creating {} failed: {e}", dir.display()))?;
        if let Some(seed) = seed {
            if let Err(e) = copy_dir(seed, &dir.join("data")) {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("copying {} to {} failed: {e}", seed.display(), dir.join("data").display()));
            }
        }
        let port = util::free_port().map_err(|e| e.to_string())?;
        let cfg = format!(
            "tickTime=500\ndataDir={data}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             maxClientCnxns=0\n4lw.commands.whitelist=*\nadmin.enableServer=false\n\
             forceSync=no\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n",
            data = dir.join("data").display()
        );
        std::fs::write(dir.join("zoo.cfg"), cfg)
            .and_then(|_| std::fs::write(dir.join("log4j.properties"), LOG4J))
            .map_err(|e| format!("writing config to {} failed: {e}", dir.display()))?;

        let mut cp = vec![dir.display().to_string()];
        for jar in ["zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-log4j12.jar", "log4j-1.2.jar"] {
            let p = Path::new(JAVA_DIR).join(jar);
            if p.is_file() {
                cp.push(p.display().to_string());
            }
        }

        use std::os::unix::process::CommandExt;
        let child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("zk-testcontainers-supervisor")
            .arg(&dir)
            .arg(&java)
            .args(crate::SERVER_JVM_FLAGS)
            .arg(format!("-Dlog4j.configuration=file:{}", dir.join("log4j.properties").display()))
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-cp")
            .arg(cp.join(":"))
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("spawning sh/java failed: {e}"))?;
        let server =
            LocalServer { pid: child.id(), addr: format!("127.0.0.1:{port}"), dir, child: Mutex::new(Some(child)) };
        server.wait_ready().await.map_err(|e| e.to_string())?;
        Ok(server)
    }

    fn what(&self) -> String {
        format!("local java process group {} ({})", self.pid, self.dir.display())
    }

    fn log_tail(&self) -> String {
        match std::fs::read_to_string(self.dir.join("server.log")) {
            Ok(t) if !t.trim().is_empty() => {
                format!("\n--- {} (last lines) ---\n{}", self.dir.join("server.log").display(), util::tail(&t, 30))
            },
            _ => String::new(),
        }
    }

    fn java_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("java.pid")).ok().and_then(|s| s.trim().parse().ok())
    }

    fn send(&self, cmd: &str) -> Result<(), HarnessError> {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let stdin = guard.as_mut().and_then(|c| c.stdin.as_mut()).ok_or_else(|| {
            HarnessError::io(
                format!("sending '{cmd}' to the supervisor of {}", self.what()),
                "it is gone",
                "this is a bug in zk-testcontainers",
            )
        })?;
        stdin.write_all(format!("{cmd}\n").as_bytes()).and_then(|_| stdin.flush()).map_err(|e| {
            HarnessError::io(
                format!("sending '{cmd}' to the supervisor of {}", self.what()),
                e,
                "the supervisor process died; look at the server log",
            )
        })
    }

    async fn wait_ready(&self) -> Result<(), HarnessError> {
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        let fail = |reason: String| HarnessError::Startup {
            what: self.what(),
            secs: timeout.as_secs(),
            reason,
            log: self.log_tail(),
        };
        // The JVM must exist...
        let pid = loop {
            if let Some(pid) = self.java_pid() {
                break pid;
            }
            if Instant::now() >= deadline {
                return Err(fail("the supervisor did not start java".into()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // ...and serve.
        loop {
            let remaining = Instant::now() + Duration::from_millis(500);
            match util::wait_serving(&self.addr, remaining.min(deadline)).await {
                Ok(()) => return Ok(()),
                Err(_) if util::pid_alive(pid) && Instant::now() < deadline => continue,
                Err(reason) if util::pid_alive(pid) => return Err(fail(reason)),
                Err(_) => return Err(fail("java exited".into())),
            }
        }
    }

    /// Kills the JVM (SIGKILL), keeping its data directory.
    pub(crate) async fn stop(&self) -> Result<(), HarnessError> {
        self.send("stop")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.dir.join("java.pid").exists() {
            if Instant::now() >= deadline {
                return Err(HarnessError::io(
                    format!("stopping {}", self.what()),
                    "java did not exit within 30 s",
                    "look for a hung java process",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Starts the JVM again (same config, port and data) and waits until it serves.
    pub(crate) async fn start_again(&self) -> Result<(), HarnessError> {
        if self.java_pid().is_none() {
            self.send("start")?;
        }
        self.wait_ready().await
    }

    fn signal_java(&self, sig: i32, op: &str) -> Result<(), HarnessError> {
        let pid = self.java_pid().ok_or_else(|| {
            HarnessError::io(format!("{op} {}", self.what()), "the server is stopped", "call restart() first")
        })?;
        // SAFETY: plain kill(2).
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(HarnessError::io(
                format!("{op} java pid {pid}"),
                std::io::Error::last_os_error(),
                "the server process is gone; look at the server log",
            ));
        }
        Ok(())
    }

    pub(crate) fn pause(&self) -> Result<(), HarnessError> {
        self.signal_java(libc::SIGSTOP, "pausing (SIGSTOP)")
    }

    pub(crate) fn unpause(&self) -> Result<(), HarnessError> {
        self.signal_java(libc::SIGCONT, "resuming (SIGCONT)")
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = child {
            // Closing stdin makes the supervisor kill java and remove the directory.
            drop(child.stdin.take());
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        // SAFETY: kill the whole process group we created.
                        unsafe { libc::killpg(self.pid as i32, libc::SIGKILL) };
                        let _ = child.wait();
                        break;
                    },
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
