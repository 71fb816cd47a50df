//! Review C (fourth review): `ManagedClient::close()` as a gate, and a timeout floor that counts
//! from the moment it is stated. The test names are the review's (they name the defect each
//! reproduced); each test's doc says what it asserts.
//!
//! - An acquire in flight when `close()` runs fails with `Error::Closed`, or its guard reads
//!   `Lost` once `close()` returned (never `Held` while another client is granted).
//! - A service that closes its managed client during an acquire and exits leaves no node of its
//!   session behind (`close()` sends no create after its listing, and ends the session).
//! - A `min_session_timeout` floor stated while the session's monitor already runs is counted with
//!   at once: the holder is told before the next holder is granted.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::*;
use zk_recipes::{Error, InterProcessMutex, LockState, LossPolicy, ManagedClient};
use zookeeper_client as zk;

/// How many times the two `close()` races are tried: each trial hits the race with probability
/// 1/2 (the order in which `select!` polls its branches), so all miss it with 1/4096.
const TRIALS: usize = 12;

async fn ensure_tests_root(admin: &zk::Client) {
    let _ = admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
}

/// Polls `fut` exactly once; `Some(output)` if that poll finished it. Lets a test order what two
/// futures send: requests are sent when they are made (zookeeper-client queues them at once).
async fn poll_once<F>(fut: &mut F) -> Option<F::Output>
where
    F: Future + Unpin,
{
    std::future::poll_fn(|cx| match Pin::new(&mut *fut).poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Asserts: an acquire in flight when `close()` begins fails with `Error::Closed`, or returns a
/// guard that reads `Lost` right after `close()` returned (its node deleted, another client about
/// to be granted). A dozen trials (the interleaving differs between them).
#[tokio::test]
async fn an_acquire_granted_while_close_runs_reads_held_after_close_deleted_its_node() {
    let server = zookeeper().await;
    let admin = client().await;
    ensure_tests_root(&admin).await;
    let mut granted_during_close = 0;
    for trial in 0..TRIALS {
        let path = unique_path("close-grant-race");
        // The lock path exists: the acquire's first request is the create of its node.
        admin.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
        let zk = ManagedClient::builder(server.connect_string())
            .session_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        let mutex = InterProcessMutex::new(&zk, &path).unwrap();
        let mut acquire = Box::pin(mutex.acquire());
        // One poll: our node's create and the listing behind it are sent.
        assert!(poll_once(&mut acquire).await.is_none(), "the first poll only sends the create");
        // Another client queues behind our node.
        let waiter = InterProcessMutex::new(client().await, &path).unwrap();
        let waiting = tokio::spawn(async move {
            let granted = waiter.acquire().await;
            (Instant::now(), granted)
        });
        eventually(Duration::from_secs(10), "our node and the waiter's are queued", || async {
            children(&admin, &path).await.len() == 2
        })
        .await;
        // Our create's reply and listing are in (not read yet: the acquire is not polled).
        tokio::time::sleep(Duration::from_millis(100)).await;

        // The service shuts down: close() begins (flag set, holds told, getEphemerals sent) ...
        let mut close = Box::pin(zk.close());
        assert!(poll_once(&mut close).await.is_none(), "close waits for its getEphemerals");
        // ... while the acquire in flight is polled again.
        let acquired = acquire.await;
        close.await.expect("close confirms the deletion of every node of the session");
        let closed_at = Instant::now();
        match acquired {
            Err(Error::Closed { .. }) => {
                // The promised outcome. Our node was deleted by close(): the waiter gets the lock.
                let (_, granted) =
                    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("waiter granted").unwrap();
                granted.unwrap().release().await.unwrap();
            },
            Err(other) => panic!("trial {trial}: the acquire in flight failed with {other:?}, not Error::Closed"),
            Ok(guard) => {
                granted_during_close += 1;
                // Read at once after close() returned: close() has confirmed our node deleted.
                let state_after_close = guard.state();
                let (granted_at, granted) =
                    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("waiter granted").unwrap();
                let other_holder = granted.expect("the waiter on another client is granted");
                let state_at_grant = guard.state();
                let node_exists = admin.check_stat(guard.lock_path()).await.unwrap().is_some();
                eprintln!(
                    "trial {trial}: acquire() returned Ok after close() began; its guard read {state_after_close:?} right \
                     after close() returned (node exists: {node_exists}); another client was granted {:?} after \
                     close() returned; the guard then read {state_at_grant:?}",
                    granted_at.saturating_duration_since(closed_at)
                );
                other_holder.release().await.unwrap();
                assert!(
                    matches!(state_after_close, LockState::Lost(_)),
                    "trial {trial}: an acquire in flight during close() returned a guard (docs: it fails with \
                     Error::Closed; holds are told Lost(SessionClosed)), close() deleted its node, and the guard \
                     read {state_after_close:?} while the next waiter on another client was being granted"
                );
                drop(guard);
            },
        }
        let _ = admin.delete(&path, None).await;
    }
    eprintln!("{granted_during_close} of {TRIALS} trials had the acquire granted during close()");
}

/// What a service does on its way out, on a runtime of its own: it closes its managed client
/// while an acquire (another part of the service) is in flight, and exits (the runtime is
/// dropped) as soon as `close()` returns.
struct Exited {
    session: i64,
    acquire_failed_closed: bool,
    acquire: String,
    closed: zk_recipes::Result<()>,
    /// A clone of the session's client, kept by the caller: dropping the last one while its
    /// runtime still ran could send a `closeSession` and hide a leftover node.
    _client: zk::Client,
}

fn service_closes_during_an_acquire_then_exits(connect: String, path: String) -> Exited {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let exited = runtime.block_on(async move {
        let zk = ManagedClient::builder(connect).session_timeout(Duration::from_secs(20)).connect().await.unwrap();
        let session_client = zk.client();
        let mutex = InterProcessMutex::new(&zk, &path).unwrap();
        let mut acquire = Box::pin(mutex.acquire());
        // 1. The create of our node is sent (the lock path does not exist: NoNode) with a listing.
        assert!(poll_once(&mut acquire).await.is_none());
        tokio::time::sleep(Duration::from_millis(300)).await;
        // 2. The NoNode is read; the levels of the lock path are checked (pipelined checks).
        assert!(poll_once(&mut acquire).await.is_none());
        tokio::time::sleep(Duration::from_millis(300)).await;
        // 3. close() begins: the flag is set, its getEphemerals is sent (nothing of ours exists).
        let mut close = Box::pin(zk.close());
        assert!(poll_once(&mut close).await.is_none());
        // 4. The acquire is polled again: either it sees the flag first, or its attempt reads the
        //    checks and sends the multi (lock path + our node) before it sees the flag.
        let acquired = acquire.await;
        let closed = close.await;
        Exited {
            session: session_client.session_id().0,
            acquire_failed_closed: matches!(acquired, Err(Error::Closed { .. })),
            acquire: format!("{acquired:?}"),
            closed,
            _client: session_client,
        }
    });
    // The service exits once close() has returned.
    drop(runtime);
    exited
}

/// Asserts: `close()` returns `Ok`, the acquire in flight fails with `Error::Closed`, and 1 s after
/// the service exited its session owns no node under the lock path (not one created after
/// `close()` listed the session's nodes either).
#[test]
fn close_then_exit_leaves_the_node_an_in_flight_acquire_created_after_closes_listing() {
    let main = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (connect, admin) = main.block_on(async {
        let admin = client().await;
        ensure_tests_root(&admin).await;
        (zookeeper().await.connect_string().to_owned(), admin)
    });
    let mut leaked = 0;
    for trial in 0..TRIALS {
        // A lock path that does not exist yet: the acquire creates it together with its node.
        let path = unique_path("close-exit-race");
        let exited = service_closes_during_an_acquire_then_exits(connect.clone(), path.clone());
        let left = main.block_on(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            nodes_of_session(&admin, &path, exited.session).await
        });
        eprintln!(
            "trial {trial}: acquire -> {}; close -> {:?}; 1 s after the service exited, its session (T = 20 s) \
             still owns {left:?} under {path}",
            exited.acquire, exited.closed
        );
        assert!(exited.closed.is_ok(), "trial {trial}: close() failed: {:?}", exited.closed);
        assert!(exited.acquire_failed_closed, "trial {trial}: the acquire in flight returned {}", exited.acquire);
        if !left.is_empty() {
            leaked += 1;
        }
        assert!(
            left.is_empty(),
            "trial {trial}: close() returned Ok ('every ephemeral node of the session is deleted and the deletion \
             confirmed'), the service exited, and its session still owns {left:?} under {path}: the acquire in \
             flight sent its create after close()'s getEphemerals; the next acquirer waits for the session timeout"
        );
    }
    eprintln!("{leaked} of {TRIALS} trials leaked a node");
}

/// One ensemble at a time (three JVMs each on a 2-core machine).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Asserts: with the README's configuration for servers whose limits differ (`min_session_timeout`
/// = the smallest timeout any server negotiates), stated on a session whose monitor already runs
/// for another lock of the same client, the holder is told it lost the lock before the next
/// holder is granted, after a zone partition of its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_floor_stated_while_the_session_monitor_runs_is_not_counted_until_its_old_deadline() {
    let _serial = SERIAL.lock().await;
    init_tracing();
    let t = Duration::from_secs(10);
    let floor = Duration::from_secs(2);
    // Server B negotiates at most 2 s; the client negotiated 10 s elsewhere and was moved onto B.
    let MovedToB { ensemble, leader, b, client: holder_client, a_door: _a_door } =
        client_moved_to_a_server_with_a_lower_limit(t).await;
    let holder_client_session = holder_client.session().id().0;
    let holder_session_client = holder_client.clone();

    // Another lock of the same client, built without the floor: the session monitor starts and
    // heartbeats with the 10 s negotiated at the first connect.
    let early = InterProcessMutex::new(holder_client.clone(), unique_path("floor-early")).unwrap();
    let early_guard = early.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The lock under test, built as the README prescribes (B's maxSessionTimeout as the floor).
    let path = unique_path("floor-late");
    let holder = InterProcessMutex::builder(holder_client, &path)
        .loss_policy(LossPolicy::SessionDeadline)
        .min_session_timeout(floor)
        .build()
        .unwrap();
    let guard = Arc::new(holder.acquire().await.unwrap());
    let holder_session = holder_client_session;
    let waiter_client = ensemble.client_of(leader, t).await.unwrap();
    let observer = waiter_client.clone();
    let waiter = InterProcessMutex::new(waiter_client, &path).unwrap();
    let waiting = {
        let guard = guard.clone();
        tokio::spawn(async move {
            let granted = waiter.acquire().await.unwrap();
            (Instant::now(), guard.state(), granted)
        })
    };
    eventually(Duration::from_secs(10), "the waiter queued", || async { children(&observer, &path).await.len() == 2 })
        .await;
    // B (and the holder's connection with it) is cut off from the other servers.
    let cut = Instant::now();
    ensemble.partition_from_peers(b).await.unwrap();
    let (told, granted) = tokio::join!(
        async {
            let reason = tokio::time::timeout(t * 3, guard.lost()).await.ok();
            (Instant::now(), reason)
        },
        async { tokio::time::timeout(t * 5, waiting).await }
    );
    let ((told_at, reason), granted) = (told, granted);
    let Ok(granted) = granted else {
        // Say what the server shows before failing: whether the holder's node (and session) is
        // still there, as the leader's client sees it, or the waiter missed its deletion.
        let left = children(&observer, &path).await;
        let mut owners = Vec::new();
        for child in &left {
            let node = format!("{path}/{child}");
            owners.push(observer.check_stat(&node).await.map(|stat| stat.map(|stat| stat.ephemeral_owner)));
        }
        let mut on = Vec::new();
        for i in 0..ensemble.len() {
            if connected_to(&ensemble, i, &holder_session_client).await {
                on.push(i);
            }
        }
        panic!(
            "the waiter was not granted within {:?} of the cut; the holder was told {reason:?} {:?} after the cut and \
             reads {:?}; the lock's children now: {left:?}, their ephemeral owners {owners:?}; the holder's session \
             {:#x} is connected to server(s) {on:?} (B is {b})",
            t * 5,
            told_at.saturating_duration_since(cut),
            guard.state(),
            holder_session
        );
    };
    let (granted_at, state_at_grant, waiter_guard) = granted.expect("the waiter's task");
    eprintln!(
        "floor stated late: holder told {reason:?} {:?} after the cut; waiter granted {:?} after the cut; the \
         holder's state at the grant: {state_at_grant:?}",
        told_at.saturating_duration_since(cut),
        granted_at.saturating_duration_since(cut)
    );
    ensemble.heal(b).await.unwrap();
    let _ = waiter_guard.release().await;
    drop(early_guard);
    assert!(
        told_at < granted_at,
        "holder (min_session_timeout {floor:?}, stated after another lock of its client had started the session \
         monitor) told {:?} AFTER the next grant; its state at the grant: {state_at_grant:?}",
        told_at.saturating_duration_since(granted_at)
    );
}
