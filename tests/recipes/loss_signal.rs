//! The owned loss signal (`LockGuard::loss_signal`), `?` on fenced writes, and `acls` taking
//! `zookeeper_client`'s own `Acls` — against a real ZooKeeper.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{Error, FencedWriteError, InterProcessMutex, LockGuard, LossReason};
use zookeeper_client as zk;

/// A spawned worker stops when the hold is lost (an operator deletes our node), told through a
/// handle it owns; the owner meanwhile keeps the guard and can still `release` it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_worker_is_told_through_an_owned_signal() {
    let admin = client().await;
    let path = unique_path("signal");
    let guard = InterProcessMutex::new(client().await, &path).unwrap().acquire().await.unwrap();
    let signal = guard.loss_signal();
    assert!(!signal.is_lost());
    let worker = tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(30)) => None,
            reason = signal.lost() => Some(reason),
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    admin.delete(guard.lock_path(), None).await.unwrap();
    let told = tokio::time::timeout(Duration::from_secs(5), worker).await.expect("the worker is told").unwrap();
    assert_eq!(told, Some(LossReason::NodeDeleted));
    assert_eq!(guard.loss_signal().reason(), Some(LossReason::NodeDeleted));
    // The guard was never borrowed by the worker: the owner releases it as usual.
    guard.release().await.unwrap();
    assert_no_nodes_left(&admin, &path).await;
}

/// A clean release never resolves the signal, and the signal says it was released; the owner can
/// `select!` on the signal and then release the guard in the same loop (no borrow of the guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_release_never_resolves_the_signal() {
    let admin = client().await;
    let path = unique_path("signal-release");
    let mutex = InterProcessMutex::new(client().await, &path).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let signal = guard.loss_signal();
    let copy = signal.clone();
    let mut guard = Some(guard);
    for round in 0..3 {
        tokio::select! {
            reason = signal.lost() => panic!("lost ({reason}) in round {round}"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                if round == 1 {
                    guard.take().unwrap().release().await.unwrap();
                }
            },
        }
    }
    assert!(copy.is_released());
    assert!(!copy.is_lost());
    assert!(
        tokio::time::timeout(Duration::from_secs(1), copy.lost()).await.is_err(),
        "a released hold's signal resolved"
    );
    assert_no_nodes_left(&admin, &path).await;
}

async fn write_fenced(guard: &LockGuard, path: &str) -> zk_recipes::Result<()> {
    let mut write = guard.fenced_writer();
    write.add_set_data(path, b"x", None)?;
    write.commit().await?;
    Ok(())
}

/// `?` on a fenced write in a function returning `zk_recipes::Result` (`From<FencedWriteError>`),
/// and `acls` taking `zookeeper_client::Acls` as they come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_errors_convert_and_acls_take_zk_acls() {
    let admin = client().await;
    let path = unique_path("fenced-into");
    let target = unique_path("fenced-into-target");
    admin.mkdir(&target, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let mutex = InterProcessMutex::builder(client().await, &path).acls(zk::Acls::anyone_all()).build().unwrap();
    let guard = mutex.acquire().await.unwrap();
    write_fenced(&guard, &target).await.expect("a fenced write while held");
    admin.delete(guard.lock_path(), None).await.unwrap();
    let err = write_fenced(&guard, &target).await.unwrap_err();
    assert!(matches!(err, Error::FencedWrite(FencedWriteError::LockLost)), "{err:?}");
    assert!(err.to_string().contains("lock is lost"), "{err}");
    drop(guard);
    assert_no_nodes_left(&admin, &path).await;
}
