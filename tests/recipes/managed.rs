//! `ManagedClient`: recipes outlive session expiry, a server restart, and keep no node of an old
//! session — against a real ZooKeeper.

use crate::common;

use std::time::{Duration, Instant};

use common::{assert_no_nodes_left, assert_within, children, client, eventually, init_tracing, unique_path, zookeeper};
use zk_recipes::{ConnectionState, Error, InterProcessMutex, LockState, LossPolicy, LossReason, ManagedClient};
use zk_testcontainers::{expire_session, ZooKeeper};
use zookeeper_client as zk;

const T: Duration = Duration::from_secs(4);

async fn managed(connect_string: &str) -> ManagedClient {
    ManagedClient::builder(connect_string).session_timeout(T).connect().await.expect("managed client connects")
}

/// The session id that owns the (ephemeral) node `path`, if it exists.
async fn owner(client: &zk::Client, path: &str) -> Option<i64> {
    client.check_stat(path).await.unwrap().map(|stat| stat.ephemeral_owner)
}

/// Collects the state changes a watcher sees until `until` is seen (or 30 s pass).
async fn states_until(
    watcher: &mut zk_recipes::ConnectionStateWatcher,
    until: ConnectionState,
) -> Vec<ConnectionState> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Ok(Some(state)) = tokio::time::timeout_at(deadline, watcher.changed()).await {
        seen.push(state);
        if state == until {
            break;
        }
    }
    seen
}

/// The headline: under a held lock the session expires; the hold says
/// `Lost(SessionExpired)`, and the *same* mutex acquires again within 0.5 T (README, Sessions)
/// with no user code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_under_a_held_lock() {
    init_tracing();
    let server = zookeeper().await;
    for policy in [LossPolicy::Suspended, LossPolicy::SessionDeadline] {
        let zk = managed(server.connect_string()).await;
        assert_eq!(zk.state(), ConnectionState::Connected);
        let mut watcher = zk.state_watcher();
        let path = unique_path("managed-expiry");
        let mutex = InterProcessMutex::builder(&zk, &path).loss_policy(policy).build().unwrap();
        let guard = mutex.acquire().await.unwrap();
        let old_session = zk.client().session_id().0;
        let old_node = guard.lock_path().to_owned();

        let expired_at = Instant::now();
        expire_session(server.connect_string(), &zk.client()).await.unwrap();
        eventually(2 * T, "the hold reports Lost(SessionExpired)", || async {
            guard.state() == LockState::Lost(LossReason::SessionExpired)
        })
        .await;
        let again = tokio::time::timeout(2 * T, mutex.acquire()).await.expect("acquired again within 2 T").unwrap();
        let reacquired_in = expired_at.elapsed();
        assert_within(reacquired_in, T / 2, "README Sessions: after an expiry, acquired again within 0.5 T");

        let current = zk.client();
        assert_ne!(current.session_id().0, old_session, "a new session");
        assert_eq!(owner(&current, again.lock_path()).await, Some(current.session_id().0));
        assert_eq!(owner(&current, &old_node).await, None, "the old session's node is gone");
        assert!(guard.fencing_token() < again.fencing_token());
        let states = states_until(&mut watcher, ConnectionState::NewSession).await;
        assert!(states.contains(&ConnectionState::Lost), "{states:?}");
        assert_eq!(states.last(), Some(&ConnectionState::NewSession), "{states:?}");
        assert_eq!(zk.state(), ConnectionState::NewSession);

        // The lost guard's release is harmless and touches nothing of the new hold.
        drop(guard);
        assert_eq!(again.state(), LockState::Held);
        assert_eq!(mutex.participants().await.unwrap().len(), 1);
        again.release().await.unwrap();
        assert_no_nodes_left(&client().await, &path).await;
        eprintln!("{policy:?}: acquired again {reacquired_in:?} after the expiry");
    }
}

/// An acquire waiting while its session expires queues again on the new session and is granted
/// there; its old node (of the dead session) is never granted nor left queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waiting_during_expiry_completes_on_the_new_session() {
    init_tracing();
    let server = zookeeper().await;
    let path = unique_path("managed-waiting");
    let observer = client().await;
    let holder = InterProcessMutex::new(client().await, &path).unwrap();
    let held = holder.acquire().await.unwrap();

    let zk = managed(server.connect_string()).await;
    let waiter = InterProcessMutex::new(&zk, &path).unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire().await;
        (waiter, guard)
    });
    eventually(Duration::from_secs(10), "waiter queued", || async { children(&observer, &path).await.len() == 2 })
        .await;
    let old_session = zk.client().session_id().0;
    let old_nodes = children(&observer, &path).await;
    expire_session(server.connect_string(), &zk.client()).await.unwrap();

    // Re-queued on the new session: two nodes again, the second of the new session.
    eventually(3 * T, "waiter queued again on a new session", || async {
        let current = zk.client().session_id().0;
        if current == old_session {
            return false;
        }
        let nodes = children(&observer, &path).await;
        let mut owners = Vec::new();
        for node in &nodes {
            owners.extend(owner(&observer, &format!("{path}/{node}")).await);
        }
        nodes.len() == 2 && owners.contains(&current) && !owners.contains(&old_session)
    })
    .await;
    assert!(!waiting.is_finished(), "still waiting for the holder");
    held.release().await.unwrap();
    let (waiter, guard) = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("granted").unwrap();
    let guard = guard.unwrap();
    assert_eq!(owner(&observer, guard.lock_path()).await, Some(zk.client().session_id().0));
    for node in old_nodes {
        assert_ne!(format!("{path}/{node}"), guard.lock_path(), "no node of the old session is granted");
    }
    assert_eq!(waiter.participants().await.unwrap().len(), 1);
    guard.release().await.unwrap();
    assert_no_nodes_left(&observer, &path).await;
}

/// The server is down for longer than the session timeout: the client gives the session up, the
/// managed client establishes a new one once the server is back, and recipes work on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_longer_than_t_then_a_new_session() {
    init_tracing();
    let server = ZooKeeper::start().await.expect("a dedicated ZooKeeper");
    let zk = managed(server.connect_string()).await;
    let mut watcher = zk.state_watcher();
    let path = unique_path("managed-restart");
    let mutex = InterProcessMutex::new(&zk, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let old_session = zk.client().session_id().0;

    server.stop().await.unwrap();
    // The client library declares the session expired after 1.4 T without a connection.
    tokio::time::sleep(T * 2).await;
    assert!(matches!(guard.state(), LockState::Lost(_)), "{:?}", guard.state());
    // No session now: `try_acquire` says so at once instead of waiting for one; `acquire` waits.
    let err = tokio::time::timeout(Duration::from_secs(5), mutex.try_acquire()).await.expect("no hang").unwrap_err();
    assert!(matches!(err, Error::SessionLost { .. }), "{err:?}");
    let waiting = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.acquire().await }
    });
    server.restart().await.unwrap();
    let states = states_until(&mut watcher, ConnectionState::NewSession).await;
    assert_eq!(states.first(), Some(&ConnectionState::Suspended), "{states:?}");
    assert!(states.contains(&ConnectionState::Lost), "{states:?}");
    assert_eq!(states.last(), Some(&ConnectionState::NewSession), "{states:?}");
    assert_ne!(zk.client().session_id().0, old_session);
    assert_eq!(guard.state(), LockState::Lost(LossReason::SessionExpired));

    let again = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(again.state(), LockState::Held);
    drop(guard);
    assert_eq!(mutex.participants().await.unwrap().len(), 1, "only the new session's node");
    again.release().await.unwrap();
    assert_no_nodes_left(&zk.client(), &path).await;
}

/// The first connect retries until its timeout, then fails naming the hosts; refused
/// authentication fails it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_connect_gives_up_naming_the_hosts() {
    // A port nobody listens on, held for the whole test.
    let (_held, port) = common::refusing_port();
    let hosts = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let err = ManagedClient::builder(&hosts).connect_timeout(Duration::from_secs(2)).connect().await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains(&hosts), "{err}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "{took:?}");
}

/// A chroot in the connect string is honoured; a missing one gives a clear error at acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chroot_in_the_connect_string() {
    let server = zookeeper().await;
    let root = unique_path("managed-chroot");
    let plain = client().await;
    plain.mkdir(&root, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let zk = managed(&format!("{}{root}", server.connect_string())).await;
    let mutex = InterProcessMutex::new(&zk, "/locks/a").unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert_eq!(children(&plain, &format!("{root}/locks/a")).await.len(), 1);
    guard.release().await.unwrap();

    let missing = managed(&format!("{}{root}/missing", server.connect_string())).await;
    let err = InterProcessMutex::new(&missing, "/locks/a").unwrap().acquire().await.unwrap_err();
    assert!(matches!(err, Error::ChrootMissing { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_authentication_fails_the_first_connect_at_once() {
    let server = zookeeper().await;
    let started = Instant::now();
    // ZooKeeper has no provider for this scheme: it answers AuthFailed and closes the session.
    let err = ManagedClient::builder(server.connect_string())
        .auth("no-such-scheme", b"whatever")
        .connect_timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(!format!("{err:?}").contains("whatever"), "{err:?}");
}

/// `ManagedClientBuilder::min_session_timeout`: the floor is what every hold of the managed
/// client's sessions counts with. T = 10 s negotiated, a floor of 2 s stated; the connection
/// stalls (a partition: nothing reaches the server, nothing comes back): under
/// `LossPolicy::SessionDeadline` the holder is told `Lost(SessionDeadlinePassed)` within 0.8 × the
/// floor of the stall (the README's deadline, `E + 0.8 T` with `E` before the stall). Without the
/// floor counted, the holder was told 3.1 s after the stall here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_client_floor_is_what_its_holds_count_with() {
    init_tracing();
    let zk = zookeeper().await;
    let proxy = zk_testcontainers::FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let (t, floor) = (Duration::from_secs(10), Duration::from_secs(2));
    let managed = ManagedClient::builder(proxy.addr())
        .session_timeout(t)
        .min_session_timeout(floor)
        .connect()
        .await
        .expect("managed client connects");
    assert_eq!(managed.client().session_timeout(), t, "the server negotiated the T asked for");
    let path = unique_path("managed-floor");
    let mutex = InterProcessMutex::builder(&managed, &path).loss_policy(LossPolicy::SessionDeadline).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(guard.state(), LockState::Held);
    let stalled = Instant::now();
    proxy.stall();
    let reason = tokio::time::timeout(t, guard.lost()).await.expect("told within T");
    let told = stalled.elapsed();
    eprintln!("floor {floor:?} (T = {t:?}): told {reason:?} {told:?} after the stall");
    assert_eq!(reason, LossReason::SessionDeadlinePassed);
    assert_within(told, floor * 4 / 5, "told within 0.8 × the floor of the stall");
    proxy.pass();
    drop(guard);
    let _ = managed.close().await;
}
