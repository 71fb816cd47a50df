//! Review E: InterProcessMultiLock corner cases. A lock path twice in one multi-lock (the same
//! mutex, or the write and the read lock of one read/write lock) hung: its second acquire queued
//! behind its own first node (Curator's mutex re-enters per thread; ours only in a lock scope).
//! It is now refused up front with `Error::InvalidArgument`, and nothing is left behind.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{Error, InterProcessMultiLock, InterProcessMutex, InterProcessReadWriteLock, MultiLockMember};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_mutex_twice_is_refused() {
    let path = unique_path("review-e-multi-dup");
    let client = client().await;
    let mutex = InterProcessMutex::new(client.clone(), &path).unwrap();
    let multi = InterProcessMultiLock::new(vec![mutex.clone(), mutex.clone()]);
    let got = tokio::time::timeout(Duration::from_secs(5), multi.acquire()).await.expect("returns, never hangs");
    assert!(matches!(got, Err(Error::InvalidArgument { .. })), "{got:?}");
    let timed = multi.acquire_timeout(Duration::from_secs(2)).await;
    assert!(matches!(timed, Err(Error::InvalidArgument { .. })), "{timed:?}");
    assert!(children(&client, &path).await.is_empty(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_of_one_rw_lock_is_refused() {
    let path = unique_path("review-e-multi-rw");
    let client = client().await;
    let rw = InterProcessReadWriteLock::new(client.clone(), &path).unwrap();
    let multi =
        InterProcessMultiLock::new(vec![MultiLockMember::from(rw.write_lock()), MultiLockMember::from(rw.read_lock())]);
    let got = multi.acquire_timeout(Duration::from_secs(2)).await;
    assert!(matches!(got, Err(Error::InvalidArgument { .. })), "{got:?}");
    assert!(children(&client, &path).await.is_empty(), "nothing was sent");
}
