//! Review I: hold leases (`LockBuilder::lease`) and the read/write lock's downgrade.
//!
//! A read downgraded from a write (acquired inside the write scope, beside the write node) is
//! documented lost "as soon as the write hold it came from is lost before it ended"
//! (`Hold::state`), and its fenced writes check the write node too. The write hold's lease is
//! checked against the clock by the write hold's own `state()` only: the read's `state()` reads
//! the write's *feed*, which hears of the lease only when the lease timer has run. Between the
//! lease instant and the timer (a runtime busy or blocked: the case the clock check is for), the
//! write guard reads `Lost(LeaseExpired)` while the read guard reads `Held`, and a fenced write
//! through the read guard — checking the write node, not yet deleted — is applied.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::{FencedWriteError, InterProcessReadWriteLock, LockState, LossReason};
use zookeeper_client as zk;

async fn make_counter(client: &zk::Client) -> String {
    let counter = unique_path("ri-counter");
    client.mkdir(&counter, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    counter
}

/// Current-thread runtime: the lease timer cannot run while the holder's task does not yield.
#[tokio::test]
async fn a_read_downgraded_from_a_write_whose_lease_ran_out_cannot_write_fenced() {
    let observer = client().await;
    let counter = make_counter(&observer).await;
    let path = unique_path("ri-downgrade-lease");
    let lease = Duration::from_millis(600);
    let rw = InterProcessReadWriteLock::builder(client().await, &path).lease(lease).build().unwrap();
    let (read, write) = (rw.read_lock(), rw.write_lock());
    let target = counter.clone();
    let (write_state, read_state, outcome, read_guard) = write
        .with_lock(|write_guard| async move {
            // The downgraded read, with a long lease of its own.
            let read_guard = read.acquire_with_lease(Duration::from_secs(60)).await.unwrap();
            // The holder is busy past the write's lease (the runtime does not run the timer).
            std::thread::sleep(lease + Duration::from_millis(200));
            let write_state = write_guard.state();
            let read_state = read_guard.state();
            let mut writer = read_guard.fenced_writer();
            writer.add_set_data(&target, b"after the write's lease", None).unwrap();
            let outcome = writer.commit().await.map(|_| ());
            (write_state, read_state, outcome, read_guard)
        })
        .await
        .unwrap();
    let data = observer.get_data(&counter).await.unwrap().0;
    eprintln!(
        "write guard: {write_state:?}; read guard then: {read_state:?}, now {:?}; fenced write through the read: {outcome:?}; counter: {:?}",
        read_guard.state(),
        String::from_utf8_lossy(&data)
    );
    assert_eq!(write_state, LockState::Lost(LossReason::LeaseExpired));
    assert!(
        matches!(read_state, LockState::Lost(_)),
        "the downgraded read read {read_state:?} with its write's lease run out"
    );
    assert!(
        matches!(outcome, Err(FencedWriteError::LockLost)),
        "fenced write after the write's lease ran out: {outcome:?}"
    );
    assert_ne!(data, b"after the write's lease", "the fenced write was applied");
    drop(read_guard);
}
