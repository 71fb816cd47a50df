//! Other ZooKeeper clients' locks, run as child processes on the test server: Apache Curator's
//! (Java, Debian's Curator 5.4 jars; for the read/write lock also Curator 5.5+'s, see [`Curator`])
//! and kazoo's (Python, Debian's `python3-kazoo`). Each is a
//! small program in `tests/interop/` that prints one line per event — `CONNECTED`, then
//! `ACQUIRED` or `TIMEOUT`, then `RELEASING` and `RELEASED` — which a test reads and awaits.
//!
//! At a grant the mutex programs list the lock directory again on the granted session: a lock
//! node with a lower sequence number that still exists then (a holder the grant overlaps, or a
//! waiter passed over) turns the line into `ACQUIRED AHEAD <names>`. [`nodes_ahead`] is the same
//! check for our grants.
//!
//! Without the runtime a test says so and passes, unless `REQUIRE_CURATOR=1` /
//! `REQUIRE_KAZOO=1` (CI), when it fails.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use zookeeper_client as zk;

/// Debian's Curator jars (`libcurator-*-java`, `libzookeeper-java`, `libslf4j-java`).
pub const CURATOR_JARS: &[&str] = &[
    "/usr/share/java/curator-recipes.jar",
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-nop.jar",
];

/// Which Curator's `InterProcessReadWriteLock` a holder runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curator {
    /// Debian's Curator 5.4.0 jars as they are.
    V5_4,
    /// Curator's current read/write lock (5.5.0 and later: CURATOR-621's downgrade layout): the two
    /// classes it changed, `InterProcessReadWriteLock` and `StandardLockInternalsDriver`, compiled
    /// from Curator's source (vendored unchanged in `tests/interop/curator-5.5/`, Apache-2.0, from
    /// apache/curator 88dee99a; identical since 5.5.0 but for formatting) against the 5.4 jars, and
    /// put ahead of them on the class path. Everything else is Curator 5.4's.
    V5_5,
}

/// The class path for `version`: the 5.5+ classes (compiled once per test binary into its
/// `CARGO_TARGET_TMPDIR`) ahead of Debian's jars.
fn curator_class_path(version: Curator) -> String {
    static CLASSES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let jars = CURATOR_JARS.join(":");
    if version == Curator::V5_4 {
        return jars;
    }
    let classes = CLASSES.get_or_init(|| {
        let out = format!("{}/curator-5.5-rw-{}", env!("CARGO_TARGET_TMPDIR"), std::process::id());
        let sources = ["InterProcessReadWriteLock.java", "StandardLockInternalsDriver.java"]
            .map(|file| source(&format!("curator-5.5/{file}")));
        // The 5.4 jars' own dependencies (guava, slf4j) come from their manifests' Class-Path.
        let compiled = std::process::Command::new("javac")
            .args(["-nowarn", "-cp", &jars, "-d", &out])
            .args(sources)
            .output()
            .expect("run javac (openjdk-17-jdk-headless)");
        assert!(compiled.status.success(), "compile Curator 5.5's read/write lock: {compiled:?}");
        out
    });
    format!("{classes}:{jars}")
}

/// The Python that has Debian's `python3-kazoo` (not whatever `python3` is first on `PATH`).
pub const PYTHON: &str = "/usr/bin/python3";

/// How long a child gets to print its next line: the JVM compiles the source first, and a loaded
/// 2-core machine can be slow at that.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a runtime is there; if not, says so (and the test passes), or panics when the
/// environment variable `require` is `1`.
fn available(ok: bool, require: &str, message: &str) -> bool {
    if !ok {
        assert!(std::env::var(require).as_deref() != Ok("1"), "{require}=1: {message}");
        eprintln!("skipped: {message}");
    }
    ok
}

/// Whether `java` runs and every one of `jars` exists.
fn java_with(jars: &[&str]) -> bool {
    jars.iter().all(|jar| std::path::Path::new(jar).exists())
        && std::process::Command::new("java").arg("-version").output().is_ok_and(|o| o.status.success())
}

/// Whether `java` and the Curator jars are there (see [`available`]: `REQUIRE_CURATOR`).
pub fn curator_available() -> bool {
    available(
        java_with(CURATOR_JARS),
        "REQUIRE_CURATOR",
        "the Curator interop tests need java and Debian's libcurator-*-java, libzookeeper-java, libslf4j-java \
         (apt-get install openjdk-17-jdk-headless libcurator-recipes-java libcurator-framework-java \
         libcurator-client-java libslf4j-java)",
    )
}

/// Whether `/usr/bin/python3` can import kazoo (see [`available`]: `REQUIRE_KAZOO`).
pub fn kazoo_available() -> bool {
    let kazoo = std::process::Command::new(PYTHON)
        .args(["-c", "import kazoo"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    available(
        kazoo,
        "REQUIRE_KAZOO",
        "the kazoo interop tests need `/usr/bin/python3 -c 'import kazoo'` to work (apt-get install python3-kazoo)",
    )
}

/// Debian's ZooKeeper server classes (`libzookeeper-java`; `zookeeper.jar`'s manifest brings
/// `zookeeper-jute.jar`, `slf4j-api.jar` and the rest) and a silent SLF4J binding
/// (`libslf4j-java`), for `tests/interop/WrapSnapshot.java`.
pub const ZOOKEEPER_SERVER_JARS: &[&str] = &["/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-nop.jar"];

/// Whether `java` and [`ZOOKEEPER_SERVER_JARS`] are there for [`sequence_wrap_server`] (see
/// [`available`]: `REQUIRE_CURATOR`, which CI sets, as for the other Java helpers).
pub fn snapshot_writer_available() -> bool {
    available(
        java_with(ZOOKEEPER_SERVER_JARS),
        "REQUIRE_CURATOR",
        "the sequence wrap fixture writes its server's snapshot with java and Debian's ZooKeeper server classes \
         (apt-get install openjdk-17-jdk-headless libzookeeper-java libslf4j-java)",
    )
}

/// A fresh ZooKeeper server (container or local JVM, [`ZooKeeper::start_with_data_dir`]) on
/// which the persistent node `dir` (one level, e.g. `/wrap`) exists without children, with the
/// stored child counter (`cversion`) `cversion`: the server names the next sequential child of
/// `dir` `<prefix><cversion>` (`%010d` of a Java `int`). Nothing else is on the server but
/// `/zookeeper`. Dropping the value removes the server.
///
/// Near the wrap, ZooKeeper 3.8 does not simply count on (`tests/recipes/sequence_wrap.rs` pins it):
/// from `i32::MAX - 1`, creates made one at a time get `…2147483646`, `…2147483647`, then
/// `…2147483647` again and again (the stored counter is only ever raised, so it stays at the
/// maximum); `…-2147483648` only for a create prepared while the `…2147483647` one is still in
/// flight, e.g. the second create of a `multi`. A `cversion` of 0 or less (`i32::MIN`: the
/// counter just past the wrap, a state servers stored before ZOOKEEPER-3249) gives every create
/// a negative name, counting up: `…-2147483648`, `…-2147483647`, …
///
/// Creating 2³¹ children to get there is out of the question, so the server's state is crafted:
/// `tests/interop/WrapSnapshot.java` builds the tree with ZooKeeper 3.8's own `DataTree` (from
/// Debian's `libzookeeper-java`), for a positive `cversion` the way the server applies creates,
/// and writes it with `FileTxnSnapLog.save` as `version-2/snapshot.<zxid>` of a data directory
/// in `CARGO_TARGET_TMPDIR`; the server starts on a copy of it and loads it as its own. The
/// directory is removed once the server runs. Panics if any of it fails; call
/// [`snapshot_writer_available`] first.
///
/// [`ZooKeeper::start_with_data_dir`]: zk_testcontainers::ZooKeeper::start_with_data_dir
pub async fn sequence_wrap_server(dir: &str, cversion: i32) -> zk_testcontainers::ZooKeeper {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let data_dir = std::path::PathBuf::from(format!(
        "{}/sequence-wrap-{}-{}",
        env!("CARGO_TARGET_TMPDIR"),
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&data_dir);
    let written = Command::new("java")
        .args(["-cp", &ZOOKEEPER_SERVER_JARS.join(":"), &source("WrapSnapshot.java")])
        .arg(&data_dir)
        .args([dir, &cversion.to_string()])
        .output()
        .await
        .expect("run java (openjdk-17-jdk-headless)");
    assert!(
        written.status.success(),
        "WrapSnapshot.java failed ({}): {}",
        written.status,
        String::from_utf8_lossy(&written.stderr)
    );
    let server = zk_testcontainers::ZooKeeper::start_with_data_dir(&data_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    server.unwrap_or_else(|err| {
        panic!("a ZooKeeper server on the snapshot {}: {err}", String::from_utf8_lossy(&written.stdout).trim())
    })
}

/// Whether kazoo's `Lock` is told about Curator-format nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KazooPatterns {
    /// `extra_lock_patterns=["-lock-"]`: it queues behind `_c_<uuid>-lock-<seq>` nodes.
    CuratorNodes,
    /// kazoo's default: it sees only its own `<uuid>__lock__<seq>` nodes.
    KazooOnly,
}

fn source(name: &str) -> String {
    format!("{}/tests/interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

/// A lock holder in a child process, and the lines it prints.
pub struct Holder {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Holder {
    /// Curator's `InterProcessMutex` on `path` (`tests/interop/CuratorHolder.java`): waits up to
    /// `wait` for the lock, holds it for `hold`.
    pub fn curator(connect: &str, path: &str, wait: Duration, hold: Duration) -> Holder {
        let jars = CURATOR_JARS.join(":");
        let args = ["-cp", &jars, &source("CuratorHolder.java"), connect, path, &millis(wait), &millis(hold)];
        Holder::spawn("Curator", "java", &args)
    }

    /// Curator's `InterProcessReadWriteLock` on `path` (`tests/interop/CuratorRwHolder.java`) in
    /// `mode` (`read`, `write` or `downgrade`): waits up to `wait`, holds for `hold` (`None`: until
    /// [`release_now`](Holder::release_now)). With `markers`, it keeps an ephemeral node
    /// `<markers>/read-<pid>` or `write-<pid>` while it holds the read or write lock.
    pub fn curator_rw(
        connect: &str,
        path: &str,
        mode: &str,
        wait: Duration,
        hold: Option<Duration>,
        markers: Option<&str>,
    ) -> Holder {
        Holder::curator_rw_of(Curator::V5_4, connect, path, mode, wait, hold, markers)
    }

    /// [`curator_rw`](Holder::curator_rw) with the read/write lock of Curator `version` (also
    /// mode `downgrade-on-cue`: the downgrade waits for a [`say`](Holder::say) after
    /// `WRITE_ACQUIRED` before it acquires the read lock).
    pub fn curator_rw_of(
        version: Curator,
        connect: &str,
        path: &str,
        mode: &str,
        wait: Duration,
        hold: Option<Duration>,
        markers: Option<&str>,
    ) -> Holder {
        let class_path = curator_class_path(version);
        let hold = hold.map_or_else(|| "-1".to_owned(), millis);
        let mut args =
            vec!["-cp".into(), class_path, source("CuratorRwHolder.java"), connect.into(), path.into(), mode.into()];
        args.extend([millis(wait), hold]);
        args.extend(markers.map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Holder::spawn(&format!("Curator {version:?} {mode}"), "java", &args)
    }

    /// Curator's `LeaderLatch` (`mode` `latch`) or `LeaderSelector` (`selector`) on the election
    /// `path` with participant `id` (`tests/interop/CuratorLeader.java`): keeps the ephemeral node
    /// `<markers>/leader` while it leads, steps down when [`release_now`](Holder::release_now) is
    /// called; [`say`](Holder::say)`("who")` makes it print `SEES <the leader's id>`.
    pub fn curator_leader(connect: &str, path: &str, id: &str, mode: &str, markers: &str) -> Holder {
        let jars = CURATOR_JARS.join(":");
        let args = ["-cp", &jars, &source("CuratorLeader.java"), connect, path, id, mode, markers];
        Holder::spawn(&format!("Curator {mode}"), "java", &args)
    }

    /// Curator's lock family on `path` (`tests/interop/CuratorSemaphoreHolder.java`): `mode`
    /// `semaphore` (an `InterProcessSemaphoreV2` of `max` leases) or `mutex` (an
    /// `InterProcessSemaphoreMutex`) for `rounds` rounds, each waiting up to `wait` and holding
    /// for `hold` (`None`: until a line on its input), appending `enter`/`exit` events to the
    /// shared `log` (a path, or `-` for none); `revocable` (a revocable `InterProcessMutex`) or
    /// `revoke` (Curator's `Revoker` on the lock node `path`).
    #[allow(clippy::too_many_arguments)]
    pub fn curator_family(
        connect: &str,
        path: &str,
        mode: &str,
        max: usize,
        wait: Duration,
        hold: Option<Duration>,
        rounds: usize,
        log: &str,
    ) -> Holder {
        let jars = CURATOR_JARS.join(":");
        let hold = hold.map_or_else(|| "-1".to_owned(), millis);
        let (max, wait, rounds) = (max.to_string(), millis(wait), rounds.to_string());
        let args = [
            "-cp",
            &jars,
            &source("CuratorSemaphoreHolder.java"),
            connect,
            path,
            mode,
            &max,
            &wait,
            &hold,
            &rounds,
            log,
        ];
        Holder::spawn(&format!("Curator {mode}"), "java", &args)
    }

    /// kazoo's `Lock` on `path` (`tests/interop/kazoo_holder.py`): waits up to `wait`, holds for
    /// `hold`.
    pub fn kazoo(connect: &str, path: &str, wait: Duration, hold: Duration, patterns: KazooPatterns) -> Holder {
        let script = source("kazoo_holder.py");
        let mut args = vec!["-u", &script, connect, path];
        let (wait, hold) = (millis(wait), millis(hold));
        args.extend([&*wait, &*hold]);
        if patterns == KazooPatterns::KazooOnly {
            args.push("--no-extra-patterns");
        }
        Holder::spawn("kazoo", PYTHON, &args)
    }

    /// kazoo's `Semaphore` on `path` with `max_leases` (`tests/interop/kazoo_semaphore.py`): prints
    /// `ACQUIRED` or `TIMEOUT` (after `timeout`), then `CHILDREN <names>` (the children of `path`),
    /// and releases.
    pub fn kazoo_semaphore(connect: &str, path: &str, max_leases: usize, timeout: Duration) -> Holder {
        let script = source("kazoo_semaphore.py");
        let (max, timeout) = (max_leases.to_string(), format!("{:.3}", timeout.as_secs_f64()));
        Holder::spawn("kazoo Semaphore", PYTHON, &["-u", &script, connect, path, &max, &timeout])
    }

    fn spawn(what: &str, program: &str, args: &[&str]) -> Holder {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("start {what} ({program}): {err}"));
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Holder { what: what.to_owned(), child, stdin, lines }
    }

    /// The next line it prints, within [`LINE_TIMEOUT`].
    pub async fn next(&mut self) -> String {
        match tokio::time::timeout(LINE_TIMEOUT, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("no line from the {} process: {other:?}", self.what),
        }
    }

    /// Reads the next line, which must be `want`; returns when it was read.
    pub async fn expect(&mut self, want: &str) -> Instant {
        let line = self.next().await;
        assert_eq!(line, want, "{} printed {line:?}, expected {want:?}", self.what);
        Instant::now()
    }

    /// Writes `line` to its standard input.
    pub async fn say(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        let stdin = self.stdin.as_mut().unwrap_or_else(|| panic!("the {} process has no input left", self.what));
        stdin.write_all(format!("{line}\n").as_bytes()).await.expect("write to the child");
        stdin.flush().await.expect("flush");
    }

    /// Ends a hold of no set length (closes its standard input).
    pub fn release_now(&mut self) {
        assert!(self.stdin.take().is_some(), "the {} process was told to release already", self.what);
    }

    /// Asserts that it prints nothing for `period` (it is waiting).
    pub async fn quiet_for(&mut self, period: Duration, why: &str) {
        let early = tokio::time::timeout(period, self.lines.next_line()).await;
        assert!(early.is_err(), "{} printed {early:?} {why}", self.what);
    }

    /// Waits for it to exit, successfully.
    pub async fn finish(mut self) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the {} process exits", self.what));
        assert!(status.expect("exit status").success(), "the {} process failed", self.what);
    }
}

/// The lock names whose nodes queue in a mutex's directory: Curator's and ours, kazoo's.
const MUTEX_LOCK_NAMES: &[&str] = &["lock-", "__lock__"];

/// The sequence number of a mutex lock node of any of the three implementations; `None` for
/// anything else.
pub fn lock_sequence(name: &str) -> Option<i64> {
    MUTEX_LOCK_NAMES.iter().find_map(|lock_name| {
        let digits = &name[name.rfind(lock_name)? + lock_name.len()..];
        let unsigned = digits.strip_prefix('-').unwrap_or(digits);
        if unsigned.len() != 10 || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    })
}

/// The lock nodes in `dir` with a lower sequence number than `own` (a node name or path), read
/// on `client`. Read on the session a grant was made to, right after it, this must be empty:
/// otherwise the grant overlapped a holder ahead, or passed over a waiter.
pub async fn nodes_ahead(client: &zk::Client, dir: &str, own: &str) -> Vec<String> {
    let own = own.rsplit('/').next().unwrap_or(own);
    let ours = lock_sequence(own).unwrap_or_else(|| panic!("{own} is not a lock node"));
    let mut ahead: Vec<String> = super::children(client, dir)
        .await
        .into_iter()
        .filter(|child| lock_sequence(child).is_some_and(|sequence| sequence < ours))
        .collect();
    ahead.sort();
    ahead
}
