//! Review H: is `deletes − version` (src/engine/delay.rs, *Counting deletions without a mark*)
//! exact on the ZooKeeper 3.8 server the tests run? Each step below changes a lock directory in
//! one way and checks the count moved by exactly what the design says: +1 per deletion without
//! a mark, 0 for a marked one (`multi(setData(dir), delete(child))`), 0 for anything that did not
//! delete (failed multis, refused creates), whoever deleted (an operator, a session's close, the
//! container and TTL reapers), and the same count after a server restart.

mod common;

use std::time::{Duration, Instant};

use common::*;
use zk_recipes::InterProcessMutex;
use zk_testcontainers::ZooKeeper;
use zookeeper_client as zk;

const DELAY: Duration = Duration::from_millis(1500);

/// The design's count (a copy of `delay::unmarked`, which is private).
fn unmarked(stat: &zk::Stat) -> Option<u32> {
    let children = u32::try_from(stat.num_children).ok()?;
    let creates = (stat.cversion as u32).wrapping_add(children) / 2;
    let deletes = creates.checked_sub(children)?;
    deletes.checked_sub(u32::try_from(stat.version).ok()?)
}

async fn count(client: &zk::Client, dir: &str) -> u32 {
    let (_, stat) = client.get_data(dir).await.unwrap();
    unmarked(&stat).unwrap_or_else(|| panic!("counts do not add up: {stat:?}"))
}

fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn mark(n: u32) -> Vec<u8> {
    format!("lock-delay served {n}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_moves_by_exactly_the_unmarked_deletions() {
    let admin = client().await;
    let root = unique_path("rh-count");
    let _ = admin.create("/zkr-tests", b"", &persistent()).await;
    admin.create(&root, b"", &persistent()).await.unwrap();
    let dir = format!("{root}/lock");
    admin.create(&dir, b"", &persistent()).await.unwrap();
    let mut expected = 0;
    assert_eq!(count(&admin, &dir).await, expected);

    // An operator's delete: +1.
    let child = format!("{dir}/a");
    admin.create(&child, b"", &persistent()).await.unwrap();
    admin.delete(&child, None).await.unwrap();
    expected += 1;
    assert_eq!(count(&admin, &dir).await, expected, "plain delete");

    // A marked delete: 0.
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = admin.create(&format!("{dir}/x-"), b"", &eph).await.unwrap();
    let seq_path = format!("{dir}/x-{seq}");
    let mut multi = admin.new_multi_writer();
    multi.add_set_data(&dir, &mark(1), None).unwrap();
    multi.add_delete(&seq_path, None).unwrap();
    multi.commit().await.unwrap();
    assert_eq!(count(&admin, &dir).await, expected, "marked delete");

    // A failed multi that would have created (sequential) and deleted: 0.
    admin.create(&child, b"", &persistent()).await.unwrap();
    let mut multi = admin.new_multi_writer();
    multi.add_create(&format!("{dir}/y-"), b"", &eph).unwrap();
    multi.add_delete(&child, None).unwrap();
    multi.add_check_version(&format!("{dir}/missing"), 0).unwrap();
    assert!(multi.commit().await.is_err());
    let mut multi = admin.new_multi_writer();
    multi.add_set_data(&dir, &mark(7), None).unwrap();
    multi.add_delete(&format!("{dir}/missing"), None).unwrap();
    assert!(multi.commit().await.is_err());
    assert_eq!(count(&admin, &dir).await, expected, "failed multis");

    // A refused create (exists): 0. A multi creating two and deleting one: +1 (the existing one).
    assert!(admin.create(&child, b"", &persistent()).await.is_err());
    let mut multi = admin.new_multi_writer();
    multi.add_create(&format!("{dir}/b"), b"", &persistent()).unwrap();
    multi.add_create(&format!("{dir}/c"), b"", &persistent()).unwrap();
    multi.add_delete(&child, None).unwrap();
    multi.commit().await.unwrap();
    expected += 1;
    assert_eq!(count(&admin, &dir).await, expected, "multi: two creates, one delete");

    // Create and delete in one multi, marked: 0; unmarked: +1.
    let mut multi = admin.new_multi_writer();
    multi.add_create(&format!("{dir}/d"), b"", &persistent()).unwrap();
    multi.add_delete(&format!("{dir}/d"), None).unwrap();
    multi.add_set_data(&dir, &mark(2), None).unwrap();
    multi.commit().await.unwrap();
    assert_eq!(count(&admin, &dir).await, expected, "create+delete+mark in one multi");
    let mut multi = admin.new_multi_writer();
    multi.add_create(&format!("{dir}/e"), b"", &persistent()).unwrap();
    multi.add_delete(&format!("{dir}/e"), None).unwrap();
    multi.commit().await.unwrap();
    expected += 1;
    assert_eq!(count(&admin, &dir).await, expected, "create+delete in one multi");

    // A session's ephemerals deleted by the server when it expires: +2.
    let doomed = client().await;
    doomed.create(&format!("{dir}/f-"), b"", &eph).await.unwrap();
    doomed.create(&format!("{dir}/g-"), b"", &eph).await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    expected += 2;
    eventually(Duration::from_secs(10), "expired ephemerals gone", || async { count(&admin, &dir).await == expected })
        .await;

    // A container child reaped once empty (after having had a child): +1.
    let container = format!("{dir}/h");
    admin.create(&container, b"", &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all())).await.unwrap();
    admin.create(&format!("{container}/k"), b"", &persistent()).await.unwrap();
    admin.delete(&format!("{container}/k"), None).await.unwrap();
    expected += 1;
    eventually(Duration::from_secs(15), "container reaped", || async {
        admin.check_stat(&container).await.unwrap().is_none()
    })
    .await;
    assert_eq!(count(&admin, &dir).await, expected, "container reaped");

    // A TTL child reaped: +1.
    let ttl = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()).with_ttl(Duration::from_millis(500));
    match admin.create(&format!("{dir}/t"), b"", &ttl).await {
        Ok(_) => {
            expected += 1;
            eventually(Duration::from_secs(15), "TTL node reaped", || async {
                admin.check_stat(&format!("{dir}/t")).await.unwrap().is_none()
            })
            .await;
            assert_eq!(count(&admin, &dir).await, expected, "TTL reaped");
        },
        Err(err) => eprintln!("TTL nodes not enabled: {err}"),
    }
    // The remaining children b, c: still there, still not counted.
    let (_, stat) = admin.get_data(&dir).await.unwrap();
    eprintln!("final stat: {stat:?}, unmarked {expected}");
    assert_eq!(stat.num_children, 2);
}

/// A server restart (the log replayed; a dedicated server) keeps the count and the mark: a lock
/// whose last release was clean is not delayed after the restart, and one whose last holder was
/// lost uncleanly still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_count_and_the_marks() {
    let server = ZooKeeper::start().await.expect("a dedicated server");
    let connect = server.connect_string().to_owned();
    let new_client = || async { server.client().await.unwrap() };
    let admin = new_client().await;
    let clean = unique_path("rh-restart-clean");
    let unclean = unique_path("rh-restart-unclean");
    let mutex = |c: &zk::Client, p: &str| InterProcessMutex::builder(c.clone(), p).lock_delay(DELAY).build().unwrap();
    for _ in 0..5 {
        mutex(&admin, &clean).acquire().await.unwrap().release().await.unwrap();
        mutex(&admin, &unclean).acquire().await.unwrap().release().await.unwrap();
    }
    // Noise in the directories: a waiter that gives up (unmarked) then clean releases after it.
    let blocker = mutex(&admin, &clean).acquire().await.unwrap();
    assert!(mutex(&new_client().await, &clean).acquire_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    blocker.release().await.unwrap();
    mutex(&admin, &clean).acquire().await.unwrap().release().await.unwrap();
    let doomed = new_client().await;
    let _lost = mutex(&doomed, &unclean).acquire().await.unwrap();
    zk_testcontainers::expire_session(&connect, &doomed).await.unwrap();
    let before_clean = admin.get_data(&clean).await.unwrap();
    let before_unclean = admin.get_data(&unclean).await.unwrap();
    eprintln!("before restart: clean {:?} unclean {:?}", unmarked(&before_clean.1), unmarked(&before_unclean.1));
    drop(admin);

    server.restart().await.expect("restart");
    let after = new_client().await;
    let after_clean = after.get_data(&clean).await.unwrap();
    let after_unclean = after.get_data(&unclean).await.unwrap();
    assert_eq!(before_clean.0, after_clean.0);
    assert_eq!(
        (before_clean.1.cversion, before_clean.1.version, before_clean.1.num_children),
        (after_clean.1.cversion, after_clean.1.version, after_clean.1.num_children)
    );
    assert_eq!(
        (before_unclean.1.cversion, before_unclean.1.version, before_unclean.1.num_children),
        (after_unclean.1.cversion, after_unclean.1.version, after_unclean.1.num_children)
    );
    let started = Instant::now();
    mutex(&after, &clean).acquire().await.unwrap().release().await.unwrap();
    let clean_wait = started.elapsed();
    let started = Instant::now();
    mutex(&after, &unclean).acquire().await.unwrap().release().await.unwrap();
    let unclean_wait = started.elapsed();
    eprintln!("after restart: clean path waited {clean_wait:?}, unclean path waited {unclean_wait:?}");
    assert!(clean_wait < DELAY / 2, "a clean path waited {clean_wait:?} after a restart");
    assert!(unclean_wait >= DELAY, "an unclean loss was forgotten by the restart: waited {unclean_wait:?}");
}
