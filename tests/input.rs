//! Bad input gets a clear error, never a panic, a hang or harm to other holds; authorization
//! errors are reported as what they are. Includes the review's reproductions (`shared/review`).

mod common;

use std::time::Duration;

use common::*;
use zk_recipes::{Error, FencedWriteError, InterProcessMutex, LockState, LossPolicy, LossReason};
use zookeeper_client as zk;

/// README "Clear errors, no panics": node data over the server's request limit is
/// `Error::TooLarge` at build time — nothing is sent, so no other hold on the client is harmed.
/// (Sent, such a create makes the server drop the session's connection, which under the default
/// `LossPolicy::Suspended` loses every other lock held on that client.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_node_data_is_a_clear_error_and_harms_no_other_hold() {
    init_tracing();
    let client = client().await;
    let other = InterProcessMutex::new(client.clone(), unique_path("big-other")).unwrap();
    let held = other.acquire().await.unwrap();
    assert_eq!(held.state(), LockState::Held);
    let built = InterProcessMutex::builder(client.clone(), unique_path("big")).node_data(vec![b'x'; 1_100_000]).build();
    let err = built.expect_err("1.1 MB of node data must be refused at build time (README: TooLarge, at build time)");
    assert!(matches!(err, Error::TooLarge { what: "node data", size: 1_100_000, .. }), "{err:?}");
    assert!(err.to_string().contains("node data"), "{err}");
    assert_eq!(held.state(), LockState::Held, "an unrelated hold on the same client was lost");
    held.release().await.unwrap();
}

/// README "Clear errors, no panics": a tokio runtime without timers is `Error::Runtime` at
/// acquire (zookeeper-client itself runs fine there: it uses async-io). Before the fix the hold's
/// monitor task panicked at once and the guard said `Held` forever; no node may be left either.
// review: hold_on_a_runtime_without_timers_reports_loss
#[test]
fn acquire_on_a_runtime_without_timers_is_a_clear_error() {
    // The container and an admin client, on a normal runtime.
    let setup = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (connect, admin) = setup.block_on(async {
        let zk = zookeeper().await;
        (zk.connect_string().to_owned(), zk.client().await.unwrap())
    });
    let path = unique_path("no-timers");
    // The application's runtime: IO only (a common builder configuration).
    let app = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_io().build().unwrap();
    let result = app.block_on(async {
        let client = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(4))
            .connect(&connect)
            .await
            .expect("connect on a timer-less runtime");
        let mutex = InterProcessMutex::new(client, &path).unwrap();
        match mutex.acquire().await {
            Ok(guard) => {
                let lock_path = guard.lock_path().to_owned();
                std::mem::forget(guard); // dropping would spawn a cleanup that may also need timers
                Ok(lock_path)
            },
            Err(err) => Err(err),
        }
    });
    assert!(matches!(result, Err(Error::Runtime { .. })), "acquire on a runtime without timers: {result:?}");
    // Refused before anything was created.
    let left = setup.block_on(async { children(&admin, &path).await });
    assert!(left.is_empty(), "nodes left by a refused acquire: {left:?}");
}

/// Same root cause as the oversized node data: a lock path over the server's 1 MB request limit
/// is `Error::TooLarge` at build time (README), not an acquire looping on dropped connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_lock_path_is_a_clear_error() {
    let client = client().await;
    let long = format!("/zkr-tests/{}", "p".repeat(1_100_000));
    let err = InterProcessMutex::new(client.clone(), &long)
        .expect_err("a 1.1 MB lock path must be refused at build time (README: TooLarge, at build time)");
    assert!(matches!(err, Error::TooLarge { what: "lock path", .. }), "{err:?}");
}

/// The lock path is an existing persistent node with data (not a container): works normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_path_that_is_a_node_with_data_works() {
    let path = unique_path("file");
    let admin = client().await;
    admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    admin
        .create(&path, &vec![b'd'; 500_000], &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await
        .unwrap();
    let a = InterProcessMutex::new(client().await, &path).unwrap();
    let b = InterProcessMutex::new(client().await, &path).unwrap();
    let held = a.acquire().await.unwrap();
    assert!(b.try_acquire().await.unwrap().is_none());
    let waiter = tokio::spawn(async move { b.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    assert_eq!(a.participants().await.unwrap().len(), 1);
    got.release().await.unwrap();
    assert_eq!(admin.get_data(&path).await.unwrap().0.len(), 500_000);
}

/// With the size check raised past what the server accepts (a wrong `max_request_bytes`), the
/// server drops the connection at every create: the acquire ends with an error after a bounded
/// number of tries instead of looping, and a hold on the same client that rides out short
/// disconnections keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_dropped_by_the_server_every_time_is_an_error_not_a_loop() {
    init_tracing();
    let client = client().await;
    let other = InterProcessMutex::builder(client.clone(), unique_path("big-other"))
        .loss_policy(LossPolicy::SessionDeadline)
        .build()
        .unwrap();
    let held = other.acquire().await.unwrap();
    let big = InterProcessMutex::builder(client.clone(), unique_path("big"))
        .max_request_bytes(4 << 20)
        .node_data(vec![b'x'; 1_100_000])
        .build()
        .expect("the limit was raised");
    let outcome = tokio::time::timeout(Duration::from_secs(20), big.acquire()).await;
    let err = outcome.expect("acquire still retrying after 20 s").expect_err("an oversized create cannot succeed");
    eprintln!("oversized create with a raised limit: {err}");
    assert!(err.to_string().contains("dropped"), "{err}");
    eventually(Duration::from_secs(5), "the other hold is held again", || async { held.state() == LockState::Held })
        .await;
    held.release().await.unwrap();
}

/// A fenced write the server refuses for ACLs is `NoAuth`, not `LockLost`: the lock is still held.
#[tokio::test]
async fn fenced_write_refused_by_acls_is_no_auth_and_the_lock_is_still_held() {
    let admin = client().await;
    let protected = unique_path("read-only");
    admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    admin.create(&protected, b"v1", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read())).await.unwrap();
    let path = unique_path("fenced-noauth");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let mut write = guard.fenced_writer();
    write.add_set_data(&protected, b"v2", None).unwrap();
    let result = write.commit().await;
    assert!(matches!(result, Err(FencedWriteError::NoAuth { index: Some(0) })), "{result:?}");
    assert_eq!(guard.state(), LockState::Held);
    assert_eq!(admin.get_data(&protected).await.unwrap().0, b"v1");
    guard.release().await.unwrap();
}

/// A node ahead of ours that we may not read (a foreign child named like a lock node, with
/// creator-only ACLs, as another library might create). ZooKeeper sends no watch event about a
/// node to a session that may not read it, so its directory's children are watched instead: the
/// acquire waits for it (no error, no retry loop) and is granted once it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_predecessor_is_watched_and_waited_for() {
    init_tracing();
    let admin = client().await;
    admin.auth("digest", b"owner:secret").await.unwrap();
    let path = unique_path("unreadable");
    admin.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let blocker = format!("{path}/lock-0000000000");
    admin.create(&blocker, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())).await.unwrap();
    let other = client().await;
    assert_eq!(other.get_data(&blocker).await.unwrap_err(), zk::Error::NoAuth, "the blocker must be unreadable");
    let mutex = InterProcessMutex::new(other, &path).unwrap();
    let waiter = tokio::spawn(async move { mutex.acquire().await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiter.is_finished(), "granted (or failed) while an unreadable node is ahead");
    admin.delete(&blocker, None).await.unwrap();
    let guard =
        tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("granted once it went").unwrap().unwrap();
    assert_eq!(guard.state(), LockState::Held);
    guard.release().await.unwrap();
    assert_no_nodes_left(&admin, &path).await;
}

/// A create refused by the server (`NoAuth`) created nothing: cleanup does not go looking for a
/// node, and logs no warning about one.
#[test]
fn refused_create_logs_nothing_about_a_node_that_never_existed() {
    // One thread: every task (cleanup included) logs through this subscriber.
    let (capture, _default) = common::LogCapture::install(tracing::Level::DEBUG);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let admin = client().await;
        let path = unique_path("refused");
        admin.mkdir("/zkr-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
        admin.create(&path, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read())).await.unwrap();
        let mutex = InterProcessMutex::new(client().await, &path).unwrap();
        let err = mutex.acquire().await.unwrap_err();
        assert!(matches!(err, Error::NoAuth { .. }), "{err:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
    let logs = capture.text();
    assert!(!logs.contains("cannot delete"), "a warning about a node that never existed:\n{logs}");
    assert!(!logs.contains("abandoned acquire"), "cleanup went looking for a node that never existed:\n{logs}");
}

/// A hold whose session monitor stops (its runtime shuts down) is lost, not `Held` for ever.
#[test]
fn hold_whose_runtime_shut_down_is_lost() {
    let setup = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let connect = setup.block_on(async { zookeeper().await.connect_string().to_owned() });
    let path = unique_path("runtime-gone");
    let app = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let guard = app.block_on(async {
        let client =
            zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(&connect).await.unwrap();
        InterProcessMutex::new(client, &path).unwrap().acquire().await.unwrap()
    });
    assert_eq!(guard.state(), LockState::Held);
    drop(app);
    assert_eq!(guard.state(), LockState::Lost(LossReason::MonitorStopped));
    drop(guard);
}

/// `acquire_timeout` on a runtime without timers is the same clear error as `acquire`, not a
/// panic from the timeout's timer.
#[test]
fn acquire_timeout_on_a_runtime_without_timers_is_a_clear_error() {
    let setup = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let connect = setup.block_on(async { zookeeper().await.connect_string().to_owned() });
    let app = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_io().build().unwrap();
    let result = app.block_on(async {
        let client =
            zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(&connect).await.unwrap();
        let mutex = InterProcessMutex::new(client, unique_path("no-timers-timeout")).unwrap();
        mutex.acquire_timeout(Duration::from_secs(1)).await.map(|guard| guard.is_some())
    });
    assert!(matches!(result, Err(Error::Runtime { .. })), "{result:?}");
}
