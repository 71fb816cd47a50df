//! ACLs: a lock directory protected with digest auth cannot be queued in, emptied, listed or
//! blocked by anyone else — against a real ZooKeeper. (Auth data in `Debug` and logs:
//! `tests/secrets.rs`.)

use crate::common;

use std::time::Duration;

use common::{client, unique_path, zookeeper};
use zk_recipes::{Error, InterProcessMutex, LockState, ManagedClient};
use zookeeper_client as zk;

const AUTH: &[u8] = b"orders:s3cret-for-acl-test";

/// A lock path at the top level, of its own: a recipe creates missing parents with its ACLs, and a
/// shared `/zkr-tests` created first by one of these tests would keep everyone else out of it
/// (this binary's other modules share the server).
fn top_level_path(name: &str) -> String {
    unique_path(name).replace("/zkr-tests/", "/zkr-tests-")
}

async fn protected_client() -> ManagedClient {
    ManagedClient::builder(zookeeper().await.connect_string())
        .auth("digest", AUTH)
        .acls(zk::Acls::creator_all().to_vec())
        .connect()
        .await
        .unwrap()
}

async fn intruders() -> Vec<(&'static str, zk::Client)> {
    let connect = zookeeper().await.connect_string();
    let other = zk::Client::connector().with_auth("digest", b"intruder:pw").connect(connect).await.unwrap();
    vec![("unauthenticated", client().await), ("another principal", other)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_lock_directory_keeps_others_out() {
    let zk = protected_client().await;
    let path = top_level_path("acl");
    let mutex = InterProcessMutex::new(&zk, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let node = guard.lock_path().to_owned();

    // The directory (created by the recipe) and the lock node carry the creator's digest ACL.
    for created in [&path, &node] {
        let (acls, _) = zk.client().get_acl(created).await.unwrap();
        assert_eq!(acls.len(), 1, "{created}: {acls:?}");
        assert_eq!(acls[0].scheme(), "digest", "{created}: {acls:?}");
        assert!(acls[0].id().starts_with("orders:"), "{created}: {acls:?}");
    }

    for (who, intruder) in intruders().await {
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        // Cannot block the lock with a node of its own ...
        let blocker = format!("{path}/lock-0000000000");
        assert_eq!(intruder.create(&blocker, b"", &persistent).await.unwrap_err(), zk::Error::NoAuth, "{who}");
        // ... nor delete the holder's node, overwrite its data, or list the queue.
        assert_eq!(intruder.delete(&node, None).await.unwrap_err(), zk::Error::NoAuth, "{who}");
        assert_eq!(intruder.set_data(&node, b"mine", None).await.unwrap_err(), zk::Error::NoAuth, "{who}");
        assert_eq!(intruder.list_children(&path).await.unwrap_err(), zk::Error::NoAuth, "{who}");

        // Through the recipe: a clear NoAuth error, and the holder is unharmed.
        let theirs = InterProcessMutex::new(intruder.clone(), &path).unwrap();
        let err = theirs.try_acquire().await.unwrap_err();
        assert!(matches!(err, Error::NoAuth { .. }), "{who}: {err:?}");
        assert!(err.to_string().contains("not authorized"), "{who}: {err}");
        let err = tokio::time::timeout(Duration::from_secs(10), theirs.acquire()).await.unwrap().unwrap_err();
        assert!(matches!(err, Error::NoAuth { .. }), "{who}: {err:?}");
        let err = theirs.participants().await.unwrap_err();
        assert!(matches!(err, Error::NoAuth { .. }), "{who}: {err:?}");
    }
    assert_eq!(guard.state(), LockState::Held);
    assert_eq!(mutex.participants().await.unwrap().len(), 1);

    // The same principal on another session queues normally.
    let colleague = protected_client().await;
    let second = InterProcessMutex::new(&colleague, &path).unwrap();
    assert!(second.try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    let next = second.acquire().await.unwrap();
    next.release().await.unwrap();
}

/// A recipe builder's ACLs override the client's default, also on a plain client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_acls_on_a_plain_client() {
    let connect = zookeeper().await.connect_string();
    let plain = zk::Client::connector().with_auth("digest", AUTH).connect(connect).await.unwrap();
    let path = top_level_path("acl-builder");
    let mutex =
        InterProcessMutex::builder(plain.clone(), &path).acls(zk::Acls::creator_all().to_vec()).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    let (acls, _) = plain.get_acl(guard.lock_path()).await.unwrap();
    assert_eq!(acls[0].scheme(), "digest");
    let (_, outsider) = intruders().await.remove(0);
    assert_eq!(outsider.delete(guard.lock_path(), None).await.unwrap_err(), zk::Error::NoAuth);
    guard.release().await.unwrap();

    // Without auth, `auth` ACLs are refused by the server: a clear error, no node left.
    let unauthenticated = client().await;
    let refused = InterProcessMutex::builder(unauthenticated, top_level_path("acl-invalid"))
        .acls(zk::Acls::creator_all().to_vec())
        .build()
        .unwrap();
    let err = refused.try_acquire().await.unwrap_err();
    assert!(err.to_string().contains("InvalidAcl") || err.to_string().to_lowercase().contains("acl"), "{err}");
}

/// A lock node its own session may not read (the lock's ACLs leave out READ) is watched through
/// its directory: a sibling coming and going leaves the hold `Held` (the watch is set anew and the
/// node still listed), and the node's deletion by someone else makes it `Lost(NodeDeleted)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_node_not_readable_is_watched_through_its_directory() {
    let observer = client().await;
    // Its own top-level directory, readable, so that listings work, while the lock nodes are not.
    let path = top_level_path("acl-unreadable-own");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.create(&path, &[], &persistent).await.unwrap();
    let no_read = vec![zk::Acl::new(
        zk::Permission::WRITE | zk::Permission::CREATE | zk::Permission::DELETE | zk::Permission::ADMIN,
        zk::AuthId::anyone(),
    )];
    let mutex = InterProcessMutex::builder(client().await, &path).acls(no_read).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    assert_eq!(
        observer.get_data(guard.lock_path()).await.unwrap_err(),
        zk::Error::NoAuth,
        "the node must be unreadable"
    );
    // The first look at the state sets the watch (on the directory: the node is not readable).
    assert_eq!(guard.state(), LockState::Held);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A sibling comes and goes: each change of the directory fires the watch, which is set again.
    let sibling = format!("{path}/not-a-lock");
    for _ in 0..3 {
        observer.create(&sibling, &[], &persistent).await.unwrap();
        observer.delete(&sibling, None).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(guard.state(), LockState::Held, "a sibling's coming and going is no loss");

    // Someone else deletes our node: the hold hears of it through the directory.
    observer.delete(guard.lock_path(), None).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost()).await;
    assert_eq!(
        lost.ok(),
        Some(zk_recipes::LossReason::NodeDeleted),
        "the deletion must be heard (state {:?})",
        guard.state()
    );
    drop(guard);
}
