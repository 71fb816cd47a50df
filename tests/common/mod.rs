//! Shared helpers for the integration tests: a real ZooKeeper through `zk-testcontainers`.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use zk_testcontainers::ZooKeeper;
pub use zk_testcontainers::SCHED_SLACK;
use zookeeper_client as zk;

/// The test binary's ZooKeeper server (started once per process).
pub async fn zookeeper() -> &'static ZooKeeper {
    match ZooKeeper::shared().await {
        Ok(zk) => zk,
        Err(err) => panic!("no ZooKeeper for tests: {err}"),
    }
}

/// A new session on the test server.
pub async fn client() -> zk::Client {
    zookeeper().await.client().await.expect("connect to ZooKeeper")
}

/// A local port that refuses connections for as long as the returned socket lives: bound but never
/// listening, so nothing else (a proxy, another test's port-0 bind) can take it meanwhile, as it
/// could a port bound and released (review AA).
pub fn refusing_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind(([127, 0, 0, 1], 0).into()).expect("bind 127.0.0.1:0");
    let port = socket.local_addr().expect("its address").port();
    (socket, port)
}

/// Requests sent between two snapshots of the proxy's counters, by op code (pings and the session
/// monitor's `sync` heartbeats left out).
pub fn sent_between(
    before: &std::collections::BTreeMap<i32, u64>,
    after: &std::collections::BTreeMap<i32, u64>,
) -> Vec<(i32, u64)> {
    after
        .iter()
        .filter(|(&code, _)| code != zk_testcontainers::op::PING && code != zk_testcontainers::op::SYNC)
        .map(|(&code, &count)| (code, count - before.get(&code).copied().unwrap_or(0)))
        .filter(|(_, delta)| *delta > 0)
        .collect()
}

/// How many requests of `code` a [`sent_between`] list holds.
pub fn count(sent: &[(i32, u64)], code: i32) -> u64 {
    sent.iter().find(|(c, _)| *c == code).map_or(0, |(_, n)| *n)
}

/// A lock path nobody used before.
pub fn unique_path(name: &str) -> String {
    format!("/zkr-tests/{name}-{}", uuid::Uuid::new_v4().simple())
}

/// The children of `path` (empty if it does not exist).
pub async fn children(client: &zk::Client, path: &str) -> Vec<String> {
    match client.list_children(path).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(err) => panic!("list {path}: {err}"),
    }
}

/// Polls `check` until it is true, panicking with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        if start.elapsed() > limit {
            panic!("not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the lock directory `path` has no children left (or is gone).
pub async fn assert_no_nodes_left(client: &zk::Client, path: &str) {
    eventually(Duration::from_secs(10), &format!("{path} has no lock nodes left"), || async {
        children(client, path).await.is_empty()
    })
    .await;
}

/// "No node left" checked while the sessions that queued and held are still open, so that a
/// node our cleanup leaked cannot be hidden by the server deleting a closed session's ephemeral
/// nodes. Cleanup runs in the background and retries until the node is gone (README, No leaked
/// nodes): the nodes get `limit` to go. Every session must still be alive afterwards.
pub async fn assert_no_nodes_left_while_open(observer: &zk::Client, path: &str, open: &[zk::Client], limit: Duration) {
    let start = Instant::now();
    loop {
        let left = children(observer, path).await;
        if left.is_empty() {
            break;
        }
        if start.elapsed() > limit {
            let mut owners = Vec::new();
            for child in &left {
                let stat = observer.check_stat(&format!("{path}/{child}")).await.ok().flatten();
                let owner = stat.map_or(0, |stat| stat.ephemeral_owner);
                // Whether the node's session is one of `open` (and in what state), or another one
                // (a session the test did not keep open, or one that ended with its node left).
                let among = match open.iter().find(|client| client.session_id().0 == owner) {
                    Some(client) => format!("open, {}", client.state()),
                    None => "not among the open sessions".to_owned(),
                };
                let czxid = stat.map(|stat| stat.czxid);
                owners.push(format!("{child} (session {owner:#x}: {among}; czxid {czxid:?})"));
            }
            panic!("lock nodes left under {path} after {limit:?} while their sessions are open: {owners:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for client in open {
        assert!(
            !client.state().is_terminated(),
            "session {:#x} ended before the check: its nodes may have gone with it",
            client.session_id().0
        );
    }
}

/// Everything `tracing` logs on this thread while its guard lives, every target, up to a level:
/// for tests that check what is (not) logged. Run the code under test on a current-thread
/// runtime, so every task logs on this thread.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn install(level: tracing::Level) -> (LogCapture, tracing::subscriber::DefaultGuard) {
        let capture = LogCapture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (capture, tracing::subscriber::set_default(subscriber))
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Asserts that `elapsed` is within `bound` (a number the README publishes) plus the documented
/// [`SCHED_SLACK`], naming the README's claim on failure.
#[track_caller]
pub fn assert_within(elapsed: Duration, bound: Duration, claim: &str) {
    assert!(
        elapsed <= bound + SCHED_SLACK,
        "{claim}: took {elapsed:?}, bound {bound:?} + SCHED_SLACK {SCHED_SLACK:?} (load: {})",
        load_average()
    );
}

/// The 1-minute load average (for failure messages: the bound may be rerun once above 3).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().next().unwrap_or("?").to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// The children of `path` that are lock nodes of the given session (its `ephemeral_owner`).
pub async fn nodes_of_session(observer: &zk::Client, path: &str, session: i64) -> Vec<String> {
    let mut owned = Vec::new();
    for child in children(observer, path).await {
        if let Ok(Some(stat)) = observer.check_stat(&format!("{path}/{child}")).await {
            if stat.ephemeral_owner == session {
                owned.push(child);
            }
        }
    }
    owned
}

/// Installs a tracing subscriber once (RUST_LOG controls it).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
/// The lock nodes in `path` whose name contains `lock_name` (`-latch-`, `-lock-`), in queue order
/// (by their 10-digit sequence suffix).
pub async fn queued_nodes(client: &zk::Client, path: &str, lock_name: &str) -> Vec<String> {
    let mut nodes: Vec<String> = children(client, path).await.into_iter().filter(|n| n.contains(lock_name)).collect();
    nodes.sort_by_key(|name| name[name.len().saturating_sub(10)..].to_owned());
    nodes
}

/// Records the instant it is dropped: put in a leader's future, it says when that future was
/// dropped (or completed).
pub struct DropStamp(pub std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

impl Drop for DropStamp {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

pub mod history;
pub mod inside;
pub mod interop;

/// Waits until server `i` of `ensemble` serves as a follower (or leader) again after a heal.
pub async fn rejoined(ensemble: &zk_testcontainers::Ensemble, i: usize) {
    ensemble.wait_for_quorum(Duration::from_secs(60)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(ensemble.mode(i).await.as_deref(), Some("follower" | "leader")) {
        assert!(Instant::now() < deadline, "server {i} did not rejoin");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A 3-server ensemble for this test (Docker required in CI: REQUIRE_DOCKER=1).
pub async fn ensemble(builder: zk_testcontainers::EnsembleBuilder) -> zk_testcontainers::Ensemble {
    match builder.start().await {
        Ok(ensemble) => ensemble,
        Err(err) => panic!("no ZooKeeper ensemble for tests: {err}"),
    }
}

/// Whether `client`'s session is connected to server `i` of `ensemble` (its `cons`).
pub async fn connected_to(ensemble: &zk_testcontainers::Ensemble, i: usize, client: &zk::Client) -> bool {
    let id = format!("{:x}", client.session_id().0);
    match ensemble.four_letter_word(i, "cons").await {
        Ok(text) => text.contains(&format!("sid=0x{id}")),
        Err(_) => false,
    }
}

/// The setup of a renegotiated session timeout (`review_timeout.rs`, `review_c.rs`): a 3-server
/// ensemble whose server B negotiates at most 2 s (the others up to 60 s), and a client that
/// negotiated T on another server, A, and was then moved onto B; the client stays on B.
///
/// The client reaches A only through a proxy, which refuses it once the client moved: the tests
/// partition B and count on the leader expiring the session, and a client that could return to A
/// would (its connection to B times out after 0.4 × B's 2 s once B holds a request for the
/// leader) and keep the session alive before the leader expires it — seen on a loaded machine,
/// where the holder then rightly kept its lock and the waiter waited for 5 T.
pub struct MovedToB {
    pub ensemble: zk_testcontainers::Ensemble,
    pub leader: usize,
    /// B's index (B is never the leader).
    pub b: usize,
    pub client: zk::Client,
    /// The client's only way to A: refusing since the client moved to B (kept open so no other
    /// listener takes its port).
    pub a_door: zk_testcontainers::FaultProxy,
}

/// See [`MovedToB`].
pub async fn client_moved_to_a_server_with_a_lower_limit(t: Duration) -> MovedToB {
    let b = 1;
    let builder = zk_testcontainers::Ensemble::builder().sync_limit(10).server_extra(b, "maxSessionTimeout=2000");
    let ensemble = ensemble(builder).await;
    let mut leader = ensemble.leader().await.unwrap();
    if leader == b {
        ensemble.kill(b).await.unwrap();
        ensemble.start_server(b).await.unwrap();
        leader = ensemble.leader().await.unwrap();
    }
    let a = 3 - leader - b;
    eprintln!("leader {leader}, A {a} (max 60 s), B {b} (max 2 s)");
    let a_door = zk_testcontainers::FaultProxy::start(ensemble.server_addr(a)).await.unwrap();
    // First connect to A (B unreachable), so the client negotiates T.
    ensemble.isolate(b).await.unwrap();
    let connect = format!("{},{}", a_door.addr(), ensemble.server_addr(b));
    let client = zk::Client::connector().with_session_timeout(t).connect(&connect).await.unwrap();
    assert!(connected_to(&ensemble, a, &client).await);
    ensemble.heal(b).await.unwrap();
    rejoined(&ensemble, b).await;
    // Move the client to B: close its way to A for good.
    a_door.refuse(true);
    a_door.cut();
    let moved = Instant::now();
    while !connected_to(&ensemble, b, &client).await {
        assert!(moved.elapsed() < Duration::from_secs(30), "client did not move to B");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "client on B after {:?}; client.session_timeout() still says {:?}",
        moved.elapsed(),
        client.session_timeout()
    );
    MovedToB { ensemble, leader, b, client, a_door }
}

/// A session with timeout `t` connected through a new proxy to the shared server, for tests that
/// inject faults between them (asserts the server granted `t`).
pub async fn proxied_session(t: Duration) -> (zk_testcontainers::FaultProxy, zk::Client) {
    let zk = zookeeper().await;
    let proxy = zk_testcontainers::FaultProxy::start(zk.connect_string()).await.unwrap();
    let session = zk.connector().with_session_timeout(t).connect(&proxy.addr()).await.unwrap();
    assert_eq!(session.session_timeout(), t, "the timings of the test are for T = {t:?}");
    (proxy, session)
}

/// `Total watches` from the server's `wchs`.
pub async fn total_watches() -> usize {
    let wchs = zookeeper().await.four_letter_word("wchs").await.expect("wchs");
    wchs.lines()
        .find_map(|line| line.strip_prefix("Total watches:").map(|v| v.trim().parse::<usize>()))
        .expect("Total watches in wchs")
        .expect("a number")
}

/// Queues a foreign Curator-style lock node `_c_<uuid>-<lock_name><seq>` in `path` on `raw`'s
/// session (ephemeral sequential, open ACL); its full path.
pub async fn foreign_lock_node(raw: &zk::Client, path: &str, lock_name: &str) -> String {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{path}/_c_{}-{lock_name}", uuid::Uuid::new_v4());
    let (_, seq) = raw.create(&prefix, b"", &ephemeral).await.unwrap();
    format!("{prefix}{seq}")
}

/// How many sessions watch `path`, from the server's `wchp` (watches by path).
pub async fn watchers_of(path: &str) -> usize {
    let wchp = zookeeper().await.four_letter_word("wchp").await.expect("wchp");
    let mut lines = wchp.lines().skip_while(|line| line.trim() != path);
    lines.next();
    lines.take_while(|line| line.starts_with(char::is_whitespace)).count()
}

/// How long a started `LeaderLatch` takes to lead here, on `session` (`start` → `await_leadership`
/// on a new path): the median of `runs`, for tests that time a close or a drop across a grant.
pub async fn latch_grant_time(session: &zk::Client, runs: usize) -> Duration {
    let mut grants = Vec::new();
    for _ in 0..runs.max(1) {
        let latch = zk_recipes::LeaderLatch::new(session.clone(), unique_path("latch-grant-time")).unwrap();
        let started = Instant::now();
        latch.start().unwrap();
        drop(latch.await_leadership().await.unwrap());
        grants.push(started.elapsed());
        latch.close().await.unwrap();
    }
    grants.sort();
    grants[grants.len() / 2]
}

/// Runs `future` to completion on the calling thread, outside any tokio runtime (for code that
/// must work without one).
pub fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// A current-thread runtime to drop guards on and then never drive again: the deletions those
/// drops spawn on it never run (see [`stuck_deletions`]).
pub fn stuck_runtime() -> std::sync::Arc<tokio::runtime::Runtime> {
    std::sync::Arc::new(tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime"))
}

/// Acquires `count` mutexes on `session` (each on a path of its own) and drops their guards at
/// the end of a `block_on` of `stuck`, which is never driven again: the deletions those drops
/// spawn never run. Their first deletes are sent at the drop, so the nodes go, but each deletion
/// stays counted (`session/cleanup.rs`, `Deletion`) until a latch's `close` runs it.
pub async fn stuck_deletions(session: &zk::Client, count: usize, stuck: &std::sync::Arc<tokio::runtime::Runtime>) {
    let mut acquiring = Vec::new();
    for _ in 0..count {
        let mutex = zk_recipes::InterProcessMutex::new(session.clone(), unique_path("stuck")).expect("a mutex");
        acquiring.push(tokio::spawn(async move { mutex.acquire().await.expect("acquire") }));
    }
    let mut held = Vec::new();
    for guard in acquiring {
        held.push(guard.await.expect("an acquire task"));
    }
    let stuck = stuck.clone();
    tokio::task::spawn_blocking(move || stuck.block_on(async move { drop(held) })).await.expect("the drops");
}
