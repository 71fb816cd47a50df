//! The lock family's contract (`family-contract.md` of issue 22), verbatim: the names a user's
//! program relies on. It is compiled, with `client` a `ManagedClient` (the contract allows a plain
//! client too: [`contract_on_a_plain_client`]); it is not run — it awaits `lease.lost()`, which
//! resolves only when the lease is lost. The behaviour behind each line is tested in
//! `tests/recipes/semaphore.rs` and `tests/recipes/lock_family.rs`.
#![allow(dead_code, unused_variables, clippy::no_effect_underscore_binding)]

use std::time::Duration;
use zk_recipes::ManagedClient;
use zk_recipes::{
    InterProcessMultiLock, InterProcessMutex, InterProcessSemaphoreMutex, InterProcessSemaphoreV2, Lease, LockState,
    Revoker,
};

async fn contract(client: ManagedClient) -> zk_recipes::Result<()> {
    // Semaphore with leases (Curator's InterProcessSemaphoreV2 layout: <path>/locks and <path>/leases,
    // lease nodes `_c_<uuid>-lease-<10 digits>`, node data = optional bytes).
    // `client` is `&ManagedClient` or a `zookeeper_client::Client` (like InterProcessMutex::new).
    let sem = InterProcessSemaphoreV2::new(&client, "/sem/pool", 3)?; // max leases, fixed
    let lease: Lease = sem.acquire().await?; // one lease, waits
    let leases: Vec<Lease> = sem.acquire_many(2).await?; // all or nothing
    let one: Option<Lease> = sem.acquire_timeout(Duration::from_secs(1)).await?;
    let many: Option<Vec<Lease>> = sem.acquire_many_timeout(2, Duration::from_secs(1)).await?;
    let _: LockState = lease.state(); // Held / Suspended / Lost(reason), like a lock guard
    let _reason = lease.lost().await; // resolves when the lease can no longer be trusted
    let _path: &str = lease.node_path();
    lease.release().await?; // or drop: returned in the background
    let _nodes: Vec<String> = sem.participant_nodes().await?; // lease node paths

    // Not re-entrant mutex (Curator: a semaphore with one lease); its guard may be released by any task.
    let m = InterProcessSemaphoreMutex::new(&client, "/locks/job")?;
    let g = m.acquire().await?; // a second acquire, even from the same task, waits
    let _: Option<_> = m.acquire_timeout(Duration::from_millis(500)).await?;
    g.release().await?;

    // All-or-nothing over several locks, one deadline for the whole acquire, released in reverse order.
    let multi = InterProcessMultiLock::new(vec![
        InterProcessMutex::new(&client, "/a")?,
        InterProcessMutex::new(&client, "/b")?,
    ]);
    let all = multi.acquire().await?;
    let _: Option<_> = multi.acquire_timeout(Duration::from_secs(1)).await?;
    all.release().await?;

    // Revocation (Curator's protocol: the string `__REVOKE__` written as the lock node's data).
    let mutex = InterProcessMutex::builder(&client, "/locks/r").revocable(true).build()?;
    let guard = mutex.acquire().await?;
    let _ = guard.revoke_requested().await; // resolves when someone asks for the lock back
    Revoker::attempt_revoke(&client, guard.lock_path()).await?; // ask the holder of that node

    Ok(())
}

/// The same constructors on a plain `zookeeper_client::Client`.
async fn contract_on_a_plain_client(client: zk_recipes::zookeeper_client::Client) -> zk_recipes::Result<()> {
    let sem = InterProcessSemaphoreV2::new(&client, "/sem/pool", 3)?;
    let m = InterProcessSemaphoreMutex::new(&client, "/locks/job")?;
    let multi = InterProcessMultiLock::new(vec![
        InterProcessMutex::new(&client, "/a")?,
        InterProcessMutex::new(&client, "/b")?,
    ]);
    let mutex = InterProcessMutex::builder(&client, "/locks/r").revocable(true).build()?;
    Revoker::attempt_revoke(&client, "/locks/r/x").await?;
    Ok(())
}

#[test]
fn futures_and_guards_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + 'static>() {}
    send_static::<zk_recipes::Lease>();
    send_static::<zk_recipes::MultiLockGuard>();
    let client: Option<ManagedClient> = None;
    if let Some(client) = client {
        send(&contract(client));
    }
}
