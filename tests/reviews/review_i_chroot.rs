//! Review I: the process-wide tables keyed by (lock path *as the client sees it*, czxid, ctime).
//!
//! `delay.rs` keys its sightings (and `view.rs` its shared views) by the directory string the
//! recipe was given, which is relative to the client's chroot, plus the directory's czxid and
//! ctime. Two *different* znodes created in one `multi` share czxid and ctime (every op of a
//! multi gets the txn's zxid and time). Under two chroots, `/ta/lock` and `/tb/lock` both look
//! like `("/lock", czxid, ctime)`: a sighting made in one is used for the other.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::InterProcessMutex;
use zookeeper_client as zk;

const DELAY: Duration = Duration::from_millis(3000);

fn delayed(client: zk::Client, path: &str) -> InterProcessMutex {
    InterProcessMutex::builder(client, path).lock_delay(DELAY).build().unwrap()
}

/// Creates `<root>/ta/lock` and `<root>/tb/lock` in one multi (same czxid and ctime).
async fn twin_dirs(admin: &zk::Client) -> String {
    let root = unique_path("ri-chroot");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    admin.mkdir(&root, &persistent).await.unwrap();
    let mut multi = admin.new_multi_writer();
    for tenant in ["ta", "tb"] {
        multi.add_create(&format!("{root}/{tenant}"), b"", &persistent).unwrap();
    }
    for tenant in ["ta", "tb"] {
        multi.add_create(&format!("{root}/{tenant}/lock"), b"", &persistent).unwrap();
    }
    multi.commit().await.unwrap();
    let (_, a) = admin.get_data(&format!("{root}/ta/lock")).await.unwrap();
    let (_, b) = admin.get_data(&format!("{root}/tb/lock")).await.unwrap();
    assert_eq!((a.czxid, a.ctime), (b.czxid, b.ctime), "one multi: same czxid and ctime");
    root
}

/// A sighting of tenant A's lock directory makes tenant B's waiter skip the delay after B's
/// holder's session expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighting_in_another_chroot_does_not_shorten_the_delay() {
    init_tracing();
    let admin = client().await;
    let root = twin_dirs(&admin).await;
    let in_a = |c: zk::Client| c.chroot(format!("{root}/ta")).unwrap();
    let in_b = |c: zk::Client| c.chroot(format!("{root}/tb")).unwrap();

    // Tenant A: a holder (the new directory's first acquire pays the delay), lost uncleanly.
    let doomed_a = in_a(client().await);
    let held_a = delayed(doomed_a.clone(), "/lock").acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed_a).await.unwrap();
    // A try_acquire in A is refused (the delay runs): the process remembers it saw 1 unclean loss.
    let poller_a = in_a(client().await);
    assert!(delayed(poller_a.clone(), "/lock").try_acquire().await.unwrap().is_none());
    tokio::time::sleep(DELAY + Duration::from_millis(200)).await;

    // Tenant B, a different directory: its holder's session expires now.
    let doomed_b = in_b(client().await);
    let held_b = delayed(doomed_b.clone(), "/lock").acquire().await.unwrap();
    let next_b = in_b(client().await);
    let expiring = Instant::now();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed_b).await.unwrap();
    let deleted_by = Instant::now();
    eventually(Duration::from_secs(10), "B's holder's node deleted", || async {
        children(&admin, &format!("{root}/tb/lock")).await.is_empty()
    })
    .await;
    let granted =
        tokio::time::timeout(DELAY * 4, delayed(next_b.clone(), "/lock").acquire()).await.expect("granted").unwrap();
    let granted_at = Instant::now();
    eprintln!(
        "B: holder expired within {:?}; next granted {:?} after the expiry began",
        deleted_by - expiring,
        granted_at - expiring
    );
    assert!(
        granted_at - deleted_by >= DELAY,
        "B's next holder granted {:?} after B's holder's unclean loss (delay {DELAY:?})",
        granted_at - deleted_by
    );
    granted.release().await.unwrap();
    drop((held_a, held_b));
}

/// Control: the same steps without tenant A's sighting; B's next holder waits the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_a_sighting_in_the_other_chroot_the_delay_is_waited() {
    let admin = client().await;
    let root = twin_dirs(&admin).await;
    let in_b = |c: zk::Client| c.chroot(format!("{root}/tb")).unwrap();
    let doomed_b = in_b(client().await);
    let held_b = delayed(doomed_b.clone(), "/lock").acquire().await.unwrap();
    let next_b = in_b(client().await);
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed_b).await.unwrap();
    let deleted_by = Instant::now();
    let granted = delayed(next_b.clone(), "/lock").acquire().await.unwrap();
    assert!(deleted_by.elapsed() >= DELAY, "granted {:?} after the loss", deleted_by.elapsed());
    granted.release().await.unwrap();
    drop(held_b);
}

/// The shared view (`view.rs`) has the same key: a waiter in tenant B merges its listing into the
/// view tenant A's waiter made, skips B's holder (its sequence number is below what A's merge
/// "covered"), then finds A's nodes missing under its own chroot and is granted while B's holder
/// still holds. No lock-delay involved: plain mutual exclusion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_chroot_is_not_granted_beside_the_holder() {
    init_tracing();
    let admin = client().await;
    let root = twin_dirs(&admin).await;
    let in_a = |c: zk::Client| c.chroot(format!("{root}/ta")).unwrap();
    let in_b = |c: zk::Client| c.chroot(format!("{root}/tb")).unwrap();
    // A: holder (sequence 0) and a waiter (sequence 1) whose view covers up to 1.
    let held_a = InterProcessMutex::new(in_a(client().await), "/lock").unwrap().acquire().await.unwrap();
    let waiter_a = InterProcessMutex::new(in_a(client().await), "/lock").unwrap();
    let waiting_a = tokio::spawn(async move { waiter_a.acquire().await });
    eventually(Duration::from_secs(10), "A's waiter queued", || async {
        children(&admin, &format!("{root}/ta/lock")).await.len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B: holder at sequence 0; one child created and deleted (sequence 1); B's waiter gets 2.
    let held_b = InterProcessMutex::new(in_b(client().await), "/lock").unwrap().acquire().await.unwrap();
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = admin.create(&format!("{root}/tb/lock/x-"), b"", &eph).await.unwrap();
    admin.delete(&format!("{root}/tb/lock/x-{seq}"), None).await.unwrap();
    let waiter_b = InterProcessMutex::new(in_b(client().await), "/lock").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(3), waiter_b.acquire()).await;
    let still_held = admin.check_stat(&format!("{root}/tb{}", held_b.lock_path())).await.unwrap().is_some();
    if let Ok(Ok(guard)) = &outcome {
        panic!(
            "B's waiter granted {} while B's holder {} still holds (exists: {still_held})",
            guard.lock_path(),
            held_b.lock_path()
        );
    }
    eprintln!("B's waiter: {:?}", outcome.as_ref().map(|r| r.as_ref().map(|_| ())));
    drop((held_a, held_b));
    let _ = tokio::time::timeout(Duration::from_secs(10), waiting_a).await;
}
