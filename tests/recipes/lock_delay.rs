//! Lock-delay (issue 23; Chubby's, Consul's) against a real ZooKeeper: a holder that vanishes
//! without a clean release — its session closed by the server, its hold lease run out, a Curator
//! holder (which cannot mark) — makes the next holder wait the delay, measured from the server's
//! delete; a clean release is not delayed and costs its releaser no request (counted at a proxy);
//! an acquire that finds the lock free after an unclean loss waits too; the read/write lock and
//! the semaphore take it too (a writer after a reader's unclean loss, a lease freed by one).

use crate::common;

use std::time::{Duration, Instant};

use common::interop::{curator_available, Holder};
use common::*;
use zk_recipes::{InterProcessMutex, InterProcessReadWriteLock, InterProcessSemaphoreV2, LossReason};
use zk_testcontainers::{op, FaultProxy};

const DELAY: Duration = Duration::from_millis(1500);
/// Scheduling on a loaded 2-core machine plus a round trip or two.
const SLACK: Duration = Duration::from_millis(600);

fn delayed(client: zookeeper_client::Client, path: &str) -> InterProcessMutex {
    InterProcessMutex::builder(client, path).lock_delay(DELAY).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holders_successor_waits_the_delay_from_the_servers_delete() {
    init_tracing();
    let path = unique_path("delay-expired");
    let (doomed, next) = (client().await, client().await);
    warm_up(&next, &path).await;
    let guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    let waiter = delayed(next.clone(), &path);
    let waiting = tokio::spawn(async move {
        let granted = waiter.acquire().await.unwrap();
        (Instant::now(), granted)
    });
    eventually(Duration::from_secs(10), "queued", || async { children(&next, &path).await.len() == 2 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closing = Instant::now();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let deleted_by = Instant::now();
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    eprintln!(
        "expired holder: the server closed the session within {:?}; next granted {:?} after",
        deleted_by - closing,
        granted_at - closing
    );
    // The server deleted the node between `closing` and `deleted_by`: the grant is at least the
    // delay after the delete, so after `closing`, and within the slack of it, so of `deleted_by`
    // (an expiry can take longer than the delay on a loaded machine: CI once took over 1.5 s).
    assert!(granted_at - closing >= DELAY, "granted {:?} after the close", granted_at - closing);
    assert_within(granted_at - deleted_by, DELAY + SLACK, "granted within the slack of the delay");
    granted.release().await.unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_release_is_not_delayed_and_costs_no_request() {
    let zk = zookeeper().await;
    let path = unique_path("delay-clean");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let releaser = zk.connector().connect(&proxy.addr()).await.expect("connect");
    let next = client().await;
    let guard = delayed(releaser.clone(), &path).acquire().await.unwrap();
    let waiter = delayed(next.clone(), &path);
    let waiting = tokio::spawn(async move {
        let granted = waiter.acquire().await.unwrap();
        (Instant::now(), granted)
    });
    eventually(Duration::from_secs(10), "queued", || async { children(&next, &path).await.len() == 2 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent_before = proxy.requests();
    let released = Instant::now();
    guard.release().await.unwrap();
    let sent_after = proxy.requests();
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    assert!(
        granted_at - released < DELAY / 2,
        "a clean release delayed the next holder by {:?}",
        granted_at - released
    );
    // The release is one request (a `multi`: the mark and the delete), as a plain delete would be.
    // (Pings and the session monitor's heartbeats, `sync`, may be sent meanwhile: review AA.)
    assert_eq!(sent_between(&sent_before, &sent_after), [(op::MULTI, 1)], "{sent_before:?} → {sent_after:?}");
    granted.release().await.unwrap();
    // Found free after a clean release: not delayed either.
    let started = Instant::now();
    let again = delayed(next.clone(), &path).acquire().await.unwrap();
    assert!(started.elapsed() < DELAY / 2, "an acquire after a clean release waited {:?}", started.elapsed());
    again.release().await.unwrap();
    assert_no_nodes_left_while_open(&next, &path, &[next.clone(), releaser.clone()], Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_finding_the_lock_free_after_an_unclean_loss_waits() {
    let path = unique_path("delay-free");
    let (doomed, later) = (client().await, client().await);
    warm_up(&later, &path).await;
    let guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let started = Instant::now();
    let mutex = delayed(later.clone(), &path);
    // try_acquire does not wait: the lock is not available now.
    assert!(mutex.try_acquire().await.unwrap().is_none());
    let granted = mutex.acquire().await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= DELAY, "found free {waited:?} after an unclean loss");
    assert_within(waited, DELAY + SLACK, "waited the delay, from when it looked");
    granted.release().await.unwrap();
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_ran_out_counts_as_unclean() {
    let path = unique_path("delay-lease");
    let (holder, next) = (client().await, client().await);
    warm_up(&next, &path).await;
    let lease = Duration::from_millis(600);
    let guard = InterProcessMutex::builder(holder.clone(), &path).lock_delay(DELAY).lease(lease).build().unwrap();
    let guard = guard.acquire().await.unwrap();
    let waiter = delayed(next.clone(), &path);
    let waiting = tokio::spawn(async move {
        let granted = waiter.acquire().await.unwrap();
        (Instant::now(), granted)
    });
    let reason = tokio::time::timeout(lease + SLACK * 2, guard.lost()).await.expect("told");
    let told = Instant::now();
    assert_eq!(reason, LossReason::LeaseExpired);
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    // The library's delete follows the telling; the grant is the delay after that delete.
    assert!(
        granted_at - told >= DELAY - Duration::from_millis(100),
        "granted {:?} after the lease ran out",
        granted_at - told
    );
    granted.release().await.unwrap();
    drop(guard);
    assert_no_nodes_left_while_open(&next, &path, &[next.clone(), holder.clone()], Duration::from_secs(10)).await;
}

/// Curator's `InterProcessMutex` cannot mark its release: its successor of ours waits the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_predecessors_release_counts_as_unclean() {
    if !curator_available() {
        return;
    }
    let path = unique_path("delay-curator");
    let ours = client().await;
    warm_up(&ours, &path).await;
    let mut curator = Holder::curator(
        zookeeper().await.connect_string(),
        &path,
        Duration::from_secs(60),
        Duration::from_millis(1000),
    );
    curator.expect("CONNECTED").await;
    curator.expect("ACQUIRED").await;
    let ours = delayed(ours, &path);
    let waiting = tokio::spawn(async move {
        let granted = ours.acquire().await.unwrap();
        (Instant::now(), granted)
    });
    curator.expect("RELEASING").await;
    let released = curator.expect("RELEASED").await;
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    assert!(
        granted_at - released >= DELAY - Duration::from_millis(100),
        "granted {:?} after Curator's release",
        granted_at - released
    );
    assert_within(granted_at - released, DELAY + SLACK, "granted within the slack of the delay");
    granted.release().await.unwrap();
    curator.finish().await;
}

/// A missing lock directory counts as unclean: the server reaps an empty container, so a
/// directory left empty by an unclean loss could vanish before the next acquire (review G). A lock
/// with a delay creates its directory persistent, so only the first acquire on a new path pays
/// the delay; a directory deleted anyway (reaped, or by hand) is delayed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_directory_counts_as_unclean_and_the_directory_is_kept() {
    let path = unique_path("delay-dir");
    let (first, admin) = (client().await, client().await);
    let started = Instant::now();
    let guard = delayed(first.clone(), &path).acquire().await.unwrap();
    assert!(started.elapsed() >= DELAY, "the first acquire on a new path waited only {:?}", started.elapsed());
    let stat = admin.check_stat(&path).await.unwrap().expect("the lock directory");
    assert_eq!(stat.ephemeral_owner, 0, "the directory of a lock with a delay is persistent, not a container");
    guard.release().await.unwrap();
    // Kept, and a clean release leaves no delay behind.
    let started = Instant::now();
    delayed(first.clone(), &path).acquire().await.unwrap().release().await.unwrap();
    assert!(started.elapsed() < DELAY / 2, "waited {:?} after a clean release", started.elapsed());
    // An unclean loss, then the directory gone (as a reaped container would be): still delayed.
    let doomed = client().await;
    let guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    admin.delete(&path, None).await.unwrap();
    let started = Instant::now();
    delayed(first.clone(), &path).acquire().await.unwrap().release().await.unwrap();
    assert!(
        started.elapsed() >= DELAY,
        "granted {:?} after an unclean loss and a vanished directory",
        started.elapsed()
    );
    drop(guard);
}

fn rw(client: zookeeper_client::Client, path: &str) -> InterProcessReadWriteLock {
    InterProcessReadWriteLock::builder(client, path).lock_delay(DELAY).build().unwrap()
}

/// Takes and cleanly releases the lock once: the first acquire on a new path pays the delay (no
/// mark yet), and its clean release leaves a mark that later grants can rest on — without it a
/// test of an unclean loss would pass on the missing mark alone.
async fn warm_up(client: &zookeeper_client::Client, path: &str) {
    delayed(client.clone(), path).acquire().await.unwrap().release().await.unwrap();
}

/// Spawns an acquire of `mutex` and stamps the instant it is granted.
fn stamped(mutex: InterProcessMutex) -> tokio::task::JoinHandle<(Instant, zk_recipes::LockGuard)> {
    tokio::spawn(async move {
        let granted = mutex.acquire().await.unwrap();
        (Instant::now(), granted)
    })
}

/// Spawns an acquire of one lease and stamps the instant it is granted.
fn stamped_lease(semaphore: InterProcessSemaphoreV2) -> tokio::task::JoinHandle<(Instant, zk_recipes::Lease)> {
    tokio::spawn(async move {
        let granted = semaphore.acquire().await.unwrap();
        (Instant::now(), granted)
    })
}

/// A read/write lock with a delay: a writer queued behind two readers, one of whose sessions the
/// server closes, is granted the delay after that delete even though the other reader releases
/// cleanly first; readers and writers handed the lock by clean releases (readers released
/// together, whose marks overwrite each other) are not delayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_delays_a_writer_after_a_readers_unclean_loss() {
    let path = unique_path("delay-rw");
    let (warm, doomed, reader, writer) = (client().await, client().await, client().await, client().await);
    // The first acquire on a new path pays the delay; a clean release then vouches for it.
    rw(warm.clone(), &path).write_lock().acquire().await.unwrap().release().await.unwrap();

    // Clean releases only: two readers, then a writer queued behind them, released together.
    let (r1, r2) = (rw(doomed.clone(), &path).read_lock(), rw(reader.clone(), &path).read_lock());
    let started = Instant::now();
    let (g1, g2) = (r1.acquire().await.unwrap(), r2.acquire().await.unwrap());
    assert!(started.elapsed() < DELAY / 2, "readers after a clean release waited {:?}", started.elapsed());
    let waiting = stamped(rw(writer.clone(), &path).write_lock());
    eventually(Duration::from_secs(10), "queued", || async { children(&writer, &path).await.len() == 3 }).await;
    let released = Instant::now();
    let (a, b) = tokio::join!(g1.release(), g2.release());
    a.unwrap();
    b.unwrap();
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    assert!(granted_at - released < DELAY / 2, "a writer after clean read releases waited {:?}", granted_at - released);
    let waiting = stamped(rw(reader.clone(), &path).read_lock());
    eventually(Duration::from_secs(10), "queued", || async { children(&writer, &path).await.len() == 2 }).await;
    let released = Instant::now();
    granted.release().await.unwrap();
    let (granted_at, read) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    assert!(
        granted_at - released < DELAY / 2,
        "a reader after a clean write release waited {:?}",
        granted_at - released
    );
    read.release().await.unwrap();

    // One reader lost uncleanly while the other releases cleanly: the writer waits.
    let g1 = rw(doomed.clone(), &path).read_lock().acquire().await.unwrap();
    let g2 = rw(reader.clone(), &path).read_lock().acquire().await.unwrap();
    let waiting = stamped(rw(writer.clone(), &path).write_lock());
    eventually(Duration::from_secs(10), "queued", || async { children(&writer, &path).await.len() == 3 }).await;
    let closing = Instant::now();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let deleted_by = Instant::now();
    g2.release().await.unwrap();
    let (granted_at, granted) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    eprintln!("reader lost: writer granted {:?} after the close", granted_at - closing);
    assert!(granted_at - closing >= DELAY, "a writer granted {:?} after a reader's unclean loss", granted_at - closing);
    assert_within(granted_at - deleted_by, DELAY + SLACK, "granted within the slack of the delay");
    granted.release().await.unwrap();
    drop(g1);
    assert_no_nodes_left_while_open(
        &writer,
        &path,
        &[writer.clone(), reader.clone(), warm.clone()],
        Duration::from_secs(10),
    )
    .await;
}

/// A semaphore with a delay: with the pool full, a lease whose session the server closes makes
/// room only the delay after that delete; a lease returned cleanly hands over at once and costs its
/// releaser one request (the marked delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_delays_the_lease_freed_by_an_unclean_loss() {
    let zk = zookeeper().await;
    let path = unique_path("delay-sem");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let releaser = zk.connector().connect(&proxy.addr()).await.expect("connect");
    let (doomed, next) = (client().await, client().await);
    let semaphore = |client: &zookeeper_client::Client| {
        InterProcessSemaphoreV2::builder(client.clone(), &path).lock_delay(DELAY).build(2).unwrap()
    };
    // The first acquire on a new path pays the delay; a clean release then vouches for it.
    semaphore(&next).acquire().await.unwrap().release().await.unwrap();
    let leases = format!("{path}/leases");

    // Clean: the pool full, a lease returned; the waiter is granted at once.
    let kept = semaphore(&doomed).acquire().await.unwrap();
    let started = Instant::now();
    let returned = semaphore(&releaser).acquire().await.unwrap();
    assert!(started.elapsed() < DELAY / 2, "a lease after a clean release waited {:?}", started.elapsed());
    let waiting = stamped_lease(semaphore(&next));
    eventually(Duration::from_secs(10), "queued", || async { children(&next, &leases).await.len() == 3 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent_before = proxy.requests();
    let released = Instant::now();
    returned.release().await.unwrap();
    let sent_after = proxy.requests();
    let (granted_at, lease) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    assert!(granted_at - released < DELAY / 2, "a lease after a clean return waited {:?}", granted_at - released);
    // (Pings and the session monitor's heartbeats, `sync`, may be sent meanwhile: review AA.)
    assert_eq!(sent_between(&sent_before, &sent_after), [(op::MULTI, 1)], "{sent_before:?} → {sent_after:?}");

    // Unclean: the pool full again, the doomed lease's session closed by the server.
    let waiting = stamped_lease(semaphore(&releaser));
    eventually(Duration::from_secs(10), "queued", || async { children(&next, &leases).await.len() == 3 }).await;
    let closing = Instant::now();
    zk_testcontainers::expire_session(zk.connect_string(), &doomed).await.unwrap();
    let deleted_by = Instant::now();
    let (granted_at, second) = tokio::time::timeout(DELAY * 4, waiting).await.expect("granted").unwrap();
    eprintln!("lease lost: waiter granted {:?} after the close", granted_at - closing);
    assert!(granted_at - closing >= DELAY, "a lease granted {:?} after an unclean loss", granted_at - closing);
    assert_within(granted_at - deleted_by, DELAY + SLACK, "granted within the slack of the delay");
    drop(kept);
    lease.release().await.unwrap();
    second.release().await.unwrap();
    assert_no_nodes_left_while_open(&next, &leases, &[next.clone(), releaser.clone()], Duration::from_secs(10)).await;
}

/// How many children of `path` were ever deleted without a mark (`engine/delay.rs`: deletes
/// from `cversion` and `numChildren`, less the data's `version`).
async fn unmarked(client: &zookeeper_client::Client, path: &str) -> i64 {
    let (_, stat) = client.get_data(path).await.unwrap();
    let (children, cversion) = (i64::from(stat.num_children), i64::from(stat.cversion));
    (cversion + children) / 2 - children - i64::from(stat.version)
}

/// A waiter that gives up (here an `acquire_timeout` shorter than the delay) after an unclean
/// loss ended no hold: its node goes with a mark that keeps the directory's count of unclean
/// deletions where it was — one more unclean deletion would keep every later acquire that does not
/// wait the delay out from ever being granted (review H). Its mark must not hide the loss: the
/// next acquirer, on another session, is still granted only the delay after the server's delete;
/// and the wait cut short counts toward it (the process saw the count when the waiter did), so it
/// waits only the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_giving_up_keeps_the_count_and_hides_no_loss() {
    let path = unique_path("delay-give-up");
    let (doomed, quitter, next) = (client().await, client().await, client().await);
    warm_up(&next, &path).await;
    let guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    let closing = Instant::now();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let deleted_by = Instant::now();
    let after_loss = unmarked(&next, &path).await;
    assert_eq!(after_loss, 1, "the expired holder's deletion is counted");
    let gave_up = delayed(quitter.clone(), &path).acquire_timeout(DELAY / 4).await.unwrap();
    assert!(gave_up.is_none(), "granted within a quarter of the delay after an unclean loss");
    eventually(Duration::from_secs(10), "the quitter's node gone", || async {
        children(&next, &path).await.is_empty()
    })
    .await;
    assert_eq!(unmarked(&next, &path).await, after_loss, "a give-up counted as an unclean end of a hold");
    let (granted_at, granted) =
        tokio::time::timeout(DELAY * 4, stamped(delayed(next.clone(), &path))).await.expect("granted").unwrap();
    eprintln!("after a give-up: granted {:?} after the close", granted_at - closing);
    assert!(
        granted_at - closing >= DELAY,
        "granted {:?} after the close: the give-up's mark hid the loss",
        granted_at - closing
    );
    assert_within(granted_at - deleted_by, DELAY + SLACK, "the wait cut short counted toward the next");
    granted.release().await.unwrap();
    drop(guard);
    assert_no_nodes_left_while_open(&next, &path, &[next.clone(), quitter.clone()], Duration::from_secs(10)).await;
}

/// Polls `mutex` with `try_acquire` every tenth of the delay until granted; fails if not granted
/// within four delays of `since`.
async fn poll_until_granted(mutex: &InterProcessMutex, since: Instant) -> zk_recipes::LockGuard {
    loop {
        if let Some(granted) = mutex.try_acquire().await.unwrap() {
            return granted;
        }
        assert!(since.elapsed() < DELAY * 4, "a poll never granted: {:?} since the loss", since.elapsed());
        tokio::time::sleep(DELAY / 10).await;
    }
}

/// `try_acquire` never waits, but a poll is granted once the delay since the process first saw
/// the unclean loss's count has passed — never before the delay after the server's delete, and
/// not halfway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_is_granted_after_the_delay_and_not_before() {
    let path = unique_path("delay-poll");
    let (doomed, poller) = (client().await, client().await);
    warm_up(&poller, &path).await;
    let guard = delayed(doomed.clone(), &path).acquire().await.unwrap();
    let closing = Instant::now();
    zk_testcontainers::expire_session(zookeeper().await.connect_string(), &doomed).await.unwrap();
    let deleted_by = Instant::now();
    let mutex = delayed(poller.clone(), &path);
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted at once after an unclean loss");
    tokio::time::sleep(DELAY / 2).await;
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted halfway through the delay");
    let granted = poll_until_granted(&mutex, closing).await;
    let granted_at = Instant::now();
    eprintln!("poll: granted {:?} after the close", granted_at - closing);
    assert!(granted_at - closing >= DELAY, "granted {:?} after the close", granted_at - closing);
    assert_within(granted_at - deleted_by, DELAY + SLACK, "a poll granted once the delay is over");
    granted.release().await.unwrap();
    drop(guard);
    assert_no_nodes_left_while_open(&poller, &path, std::slice::from_ref(&poller), Duration::from_secs(10)).await;
}

/// On a new path (a missing directory counts as unclean), `try_acquire` polls are refused until
/// the delay since the process first saw the directory has passed, then granted: a refused poll's
/// give-up writes no mark (it read none), so it neither vouches for the directory's past (review
/// AF: it wrote mark 0, and the next poll was granted at once) nor counts as unclean (which would
/// keep every later poll out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_new_path_is_granted_after_the_delay_and_not_before() {
    let path = unique_path("delay-poll-new");
    let (poller, admin) = (client().await, client().await);
    let mutex = delayed(poller.clone(), &path);
    let first_seen = Instant::now();
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted at once on a new path");
    let (data, _) = admin.get_data(&path).await.unwrap();
    assert!(data.is_empty(), "a refused poll left the directory a mark: {:?}", String::from_utf8_lossy(&data));
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted right after a refused poll");
    tokio::time::sleep(DELAY / 2).await;
    assert!(mutex.try_acquire().await.unwrap().is_none(), "granted halfway through the delay");
    let granted = poll_until_granted(&mutex, first_seen).await;
    assert!(first_seen.elapsed() >= DELAY, "granted {:?} after the first poll", first_seen.elapsed());
    granted.release().await.unwrap();
    // Its clean release leaves the mark its grant established: the next acquire is not delayed.
    let started = Instant::now();
    mutex.acquire().await.unwrap().release().await.unwrap();
    assert!(started.elapsed() < DELAY / 2, "waited {:?} after a clean release", started.elapsed());
    assert_no_nodes_left_while_open(&admin, &path, std::slice::from_ref(&poller), Duration::from_secs(10)).await;
}
