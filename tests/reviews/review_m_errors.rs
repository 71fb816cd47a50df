//! Review M: the error paths of a first acquire of a new lock path now that the `multi` guessing
//! only the directory is missing comes first (b19ca63): a missing chroot (one level and several),
//! a path below an ephemeral node two levels down, a read-only parent, and lock ACLs that forbid
//! creating in the new directory. Each must fail with its clear error, at once (no retry loop),
//! leaving no node and no level behind.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{Error, InterProcessMutex, InterProcessSemaphoreV2};
use zookeeper_client as zk;

async fn fails(mutex: &InterProcessMutex) -> Error {
    let start = std::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), mutex.acquire())
        .await
        .expect("fails at once rather than hanging")
        .expect_err("cannot succeed");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}: {err:?}", start.elapsed());
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_chroot_one_level_and_several() {
    let raw = client().await;
    let base = unique_path("rm-err-chroot");
    raw.mkdir(&base, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let chroot = format!("{base}/missing");
    let session = client().await.chroot(chroot.as_str()).unwrap();
    for path in ["/x", "/a/b", "/a/b/c/d"] {
        let err = fails(&InterProcessMutex::new(session.clone(), path).unwrap()).await;
        assert!(matches!(err, Error::ChrootMissing { .. }), "{path}: {err:?}");
        // try_acquire and acquire_timeout too.
        let mutex = InterProcessMutex::new(session.clone(), path).unwrap();
        let err = mutex.try_acquire().await.expect_err("try_acquire below a missing chroot");
        assert!(matches!(err, Error::ChrootMissing { .. }), "{path} try: {err:?}");
        let err =
            mutex.acquire_timeout(Duration::from_secs(5)).await.expect_err("acquire_timeout below a missing chroot");
        assert!(matches!(err, Error::ChrootMissing { .. }), "{path} timeout: {err:?}");
    }
    let semaphore = InterProcessSemaphoreV2::new(session.clone(), "/sem", 2).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), semaphore.acquire()).await.unwrap().unwrap_err();
    assert!(matches!(err, Error::ChrootMissing { .. }), "semaphore: {err:?}");
    assert!(raw.check_stat(&chroot).await.unwrap().is_none(), "the chroot was created");
    assert!(children(&raw, &base).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_an_ephemeral_node_several_levels_down() {
    let raw = client().await;
    let base = unique_path("rm-err-eph");
    raw.mkdir(&base, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let eph = format!("{base}/eph");
    raw.create(&eph, b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let session = client().await;
    for path in [format!("{eph}/a/b"), format!("{eph}/a/b/c")] {
        let err = fails(&InterProcessMutex::new(session.clone(), &path).unwrap()).await;
        assert!(matches!(err, Error::EphemeralParent { .. }), "{path}: {err:?}");
    }
    assert!(children(&raw, &eph).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_parent_of_a_new_directory() {
    let raw = client().await;
    let base = unique_path("rm-err-acl");
    raw.mkdir(&base, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let ro = format!("{base}/ro");
    raw.create(&ro, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_read())).await.unwrap();
    let session = client().await;
    for path in [format!("{ro}/new"), format!("{ro}/a/b")] {
        let err = fails(&InterProcessMutex::new(session.clone(), &path).unwrap()).await;
        assert!(matches!(err, Error::NoAuth { .. }), "{path}: {err:?}");
        assert!(err.to_string().contains(&path), "{err}");
    }
    assert!(children(&raw, &ro).await.is_empty());
}

/// The lock's own ACLs let nobody create in the directory: the `multi` would create the directory
/// and fail at our node; all or nothing, so the directory must not exist afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_acls_that_forbid_creating_in_the_new_directory() {
    let raw = client().await;
    let base = unique_path("rm-err-lockacl");
    raw.mkdir(&base, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let session = client().await;
    for path in [format!("{base}/new"), format!("{base}/a/b")] {
        let mutex = InterProcessMutex::builder(session.clone(), &path).acls(zk::Acls::anyone_read()).build().unwrap();
        let err = fails(&mutex).await;
        assert!(matches!(err, Error::NoAuth { .. }), "{path}: {err:?}");
    }
    assert!(children(&raw, &base).await.is_empty(), "a level was left: {:?}", children(&raw, &base).await);
}
