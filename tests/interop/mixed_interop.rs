//! Three implementations of ZooKeeper's lock recipe on one lock path: kazoo's `Lock` (Python,
//! Debian's kazoo 2.8), Curator's `InterProcessMutex` (Java, Debian's Curator 5.4) and our
//! `InterProcessMutex`; and `zookeeper-client`'s own `Client::lock` against ours.
//!
//! # Why they order one queue the same way
//!
//! Every lock node is an `EPHEMERAL_SEQUENTIAL` child of the lock directory, and the server
//! appends the *directory's* counter to its name (`%010d`; one counter per parent, bumped by
//! every child created there, whatever its name). So the sequence numbers of all implementations'
//! nodes are unique and increase in the order the creates were applied: one queue. Each
//! implementation then orders the children it recognises by that number and waits for the node
//! right before its own:
//!
//! - ours (`src/engine/naming.rs`): keeps the nodes with a lock name of its queue — `lock-`
//!   (`_c_<uuid>-lock-<seq>`, Curator's and ours) and kazoo's `__lock__` — and sorts them by the
//!   sequence number parsed after the last lock name;
//! - kazoo 2.8 (`kazoo/recipe/lock.py`): names its nodes `<hex uuid>__lock__<seq>`; keeps the
//!   children matching `(?:__lock__|<extra patterns>)(-?\d{10})$` and sorts them by the captured
//!   sequence *string*, which for 10-digit zero-padded numbers is numeric order. With
//!   `extra_lock_patterns=["-lock-"]` it sees Curator-format nodes; without, it does not, and it
//!   is granted over a Curator-format holder (`kazoo_without_extra_patterns_ignores_a_curator_format_holder`);
//! - Curator 5.4 (`LockInternals.getSortedChildren`, `StandardLockInternalsDriver`): does not
//!   filter; it sorts *every* child by the substring after its last `lock-` (string order), the
//!   whole name when there is none, and waits for the child before its own. For Curator-format
//!   nodes that is the sequence number. A kazoo node has no `lock-` (`__lock__`), so its key is
//!   its whole name, `<32 hex digits>__lock__<seq>`, which sorts after every 10-digit sequence
//!   (unless the uuid starts with nine zeros): Curator puts every kazoo node *behind* every
//!   Curator-format node. So the three agree only while no kazoo node is queued ahead of a
//!   Curator node; when one is, Curator passes it over and overlaps kazoo's hold
//!   (`curator_passes_over_a_kazoo_node_queued_ahead`).
//!
//! (After 2^31 creates in one directory the counter wraps to negative numbers; kazoo and Curator
//! compare those as strings, ours as numbers. Not tested.)
//!
//! # What is checked
//!
//! A grant is checked on the session it was made to, right after it: the lock directory is listed
//! and no lock node with a lower sequence number may still exist — not the holder ahead (that
//! would be an overlap) and no waiter ahead (that would be a grant out of queue order). Our
//! grants are checked by the test ([`nodes_ahead`]), kazoo's and Curator's by their programs in
//! `tests/interop/`, which print `ACQUIRED AHEAD <names>` instead of `ACQUIRED` when the check
//! fails.
//!
//! Needs `/usr/bin/python3` with kazoo (`apt-get install python3-kazoo`) and, for the tests with
//! Curator, `java` and Debian's Curator jars: without them a test says so and passes, unless
//! `REQUIRE_KAZOO=1` / `REQUIRE_CURATOR=1` (CI), when it fails.

use crate::common;

use std::time::{Duration, Instant};

use common::interop::{curator_available, kazoo_available, nodes_ahead, Holder, KazooPatterns};
use common::*;
use zk_recipes::{InterProcessMutex, LockState};
use zookeeper_client as zk;

/// Waits until `n` nodes are queued on `mutex`'s path and returns them (paths, in queue order).
async fn queued(mutex: &InterProcessMutex, n: usize, what: &str) -> Vec<String> {
    eventually(Duration::from_secs(60), what, || async { mutex.participants().await.unwrap().len() == n }).await;
    mutex.participants().await.unwrap().into_iter().map(|p| p.path).collect()
}

fn is_curator_format(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(|name| name.starts_with("_c_") && name.contains("-lock-"))
}

fn is_kazoo_format(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(|name| name.len() == 32 + 8 + 10 && &name[32..40] == "__lock__")
}

/// The name of a node (the last part of its path).
fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Ours, then Curator, kazoo and ours again queue on one path: the lock goes to each in exactly
/// that order, each grant made only after every node ahead was gone. Before that, kazoo times out
/// while we hold, and after it kazoo waits for us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_curator_and_zk_recipes_share_one_queue() {
    if !(kazoo_available() && curator_available()) {
        return;
    }
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let path = unique_path("mixed");
    let first = InterProcessMutex::new(client().await, &path).unwrap();
    let held = first.acquire().await.unwrap();

    // kazoo sees our node and gives up after its wait (removing its own node).
    let mut kazoo =
        Holder::kazoo(connect, &path, Duration::from_millis(1000), Duration::ZERO, KazooPatterns::CuratorNodes);
    kazoo.expect("CONNECTED").await;
    kazoo.expect("TIMEOUT").await;
    kazoo.finish().await;
    assert_eq!(queued(&first, 1, "kazoo's node removed").await, [held.lock_path()]);

    // Queue: ours (holding), Curator, kazoo, ours.
    let hold = Duration::from_millis(1500);
    let mut curator = Holder::curator(connect, &path, Duration::from_secs(60), hold);
    curator.expect("CONNECTED").await;
    queued(&first, 2, "Curator queued").await;
    let mut kazoo = Holder::kazoo(connect, &path, Duration::from_secs(60), hold, KazooPatterns::CuratorNodes);
    kazoo.expect("CONNECTED").await;
    queued(&first, 3, "kazoo queued").await;
    let last_client = client().await;
    let last = InterProcessMutex::new(last_client.clone(), &path).unwrap();
    let waiter = tokio::spawn({
        let path = path.clone();
        async move {
            let guard = last.acquire().await.unwrap();
            let granted = Instant::now();
            // Read on the granted session, so after whatever granted us.
            let ahead = nodes_ahead(&last_client, &path, guard.lock_path()).await;
            (guard, granted, ahead)
        }
    });
    let queue = queued(&first, 4, "ours queued last").await;
    assert_eq!(queue[0], held.lock_path());
    assert!(is_curator_format(&queue[1]), "Curator's node: {queue:?}");
    assert!(is_kazoo_format(&queue[2]), "kazoo's node: {queue:?}");
    assert!(is_curator_format(&queue[3]), "our node: {queue:?}");

    // Nobody is granted while we hold.
    curator.quiet_for(Duration::from_millis(300), "while we hold the lock").await;
    kazoo.quiet_for(Duration::from_millis(300), "while we hold the lock").await;
    assert!(!waiter.is_finished(), "ours granted while we hold the lock");

    // Curator → kazoo → ours. Each grant checks that no node ahead exists any more: Curator's
    // that ours is gone, kazoo's that Curator's (and ours) is, ours that kazoo's is.
    held.release().await.unwrap();
    curator.expect("ACQUIRED").await;
    curator.expect("RELEASING").await;
    let kazoo_acquired = kazoo.expect("ACQUIRED").await;
    curator.expect("RELEASED").await;
    kazoo.expect("RELEASING").await;
    let (guard, granted, ahead) =
        tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("ours granted").unwrap();
    assert_eq!(ahead, Vec::<String>::new(), "ours granted while nodes ahead of {} still existed", guard.lock_path());
    // And in time: not before kazoo's hold was over (its ACQUIRED line is read a little after it
    // was printed, so the documented scheduling slack is allowed, no more).
    let after_kazoo = granted.duration_since(kazoo_acquired);
    assert!(after_kazoo + SCHED_SLACK >= hold, "granted {after_kazoo:?} after kazoo acquired, kazoo holds {hold:?}");
    kazoo.expect("RELEASED").await;
    curator.finish().await;
    kazoo.finish().await;

    // kazoo waits for us.
    let mut kazoo = Holder::kazoo(connect, &path, Duration::from_secs(60), Duration::ZERO, KazooPatterns::CuratorNodes);
    kazoo.expect("CONNECTED").await;
    queued(&first, 2, "kazoo queued").await;
    kazoo.quiet_for(Duration::from_millis(500), "while we hold the lock").await;
    guard.release().await.unwrap();
    kazoo.expect("ACQUIRED").await;
    kazoo.expect("RELEASING").await;
    kazoo.expect("RELEASED").await;
    kazoo.finish().await;
    assert_no_nodes_left(&client().await, &path).await;
}

/// The unsafe row: kazoo's `Lock` without `extra_lock_patterns` does not see a Curator-format
/// node (ours here; Curator's are named alike) and is granted while its holder holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_without_extra_patterns_ignores_a_curator_format_holder() {
    if !kazoo_available() {
        return;
    }
    let zk = zookeeper().await;
    let path = unique_path("kazoo-plain");
    let ours = InterProcessMutex::new(client().await, &path).unwrap();
    let held = ours.acquire().await.unwrap();
    let mut kazoo =
        Holder::kazoo(zk.connect_string(), &path, Duration::from_secs(60), Duration::ZERO, KazooPatterns::KazooOnly);
    kazoo.expect("CONNECTED").await;
    // Its grant-time listing shows our node, still there, ahead of its own: both hold.
    let line = kazoo.next().await;
    assert_eq!(line, format!("ACQUIRED AHEAD {}", name(held.lock_path())), "kazoo without extra patterns");
    assert_eq!(held.state(), LockState::Held);
    kazoo.expect("RELEASING").await;
    kazoo.expect("RELEASED").await;
    kazoo.finish().await;
    // The other way round is safe: we queue behind a kazoo node (tests/recipes/mutex.rs).
    held.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// The unsafe row for Curator: ours holding, then kazoo, Curator and ours queued. Curator sorts
/// kazoo's node behind its own, so when ours releases, kazoo and Curator are both granted. Ours,
/// last, still waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_passes_over_a_kazoo_node_queued_ahead() {
    if !(kazoo_available() && curator_available()) {
        return;
    }
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let path = unique_path("curator-kazoo");
    let first = InterProcessMutex::new(client().await, &path).unwrap();
    let held = first.acquire().await.unwrap();
    // kazoo holds for long enough that Curator's grant-time listing, right after its grant, still
    // finds kazoo's node, even on a loaded machine.
    let kazoo_hold = Duration::from_secs(5);
    let mut kazoo = Holder::kazoo(connect, &path, Duration::from_secs(60), kazoo_hold, KazooPatterns::CuratorNodes);
    kazoo.expect("CONNECTED").await;
    let kazoo_node = queued(&first, 2, "kazoo queued").await.pop().unwrap();
    assert!(is_kazoo_format(&kazoo_node), "{kazoo_node}");
    let mut curator = Holder::curator(connect, &path, Duration::from_secs(60), Duration::ZERO);
    curator.expect("CONNECTED").await;
    queued(&first, 3, "Curator queued").await;
    let last_client = client().await;
    let last = InterProcessMutex::new(last_client.clone(), &path).unwrap();
    let waiter = tokio::spawn({
        let path = path.clone();
        async move {
            let guard = last.acquire().await.unwrap();
            let ahead = nodes_ahead(&last_client, &path, guard.lock_path()).await;
            (guard, ahead)
        }
    });
    queued(&first, 4, "ours queued last").await;

    held.release().await.unwrap();
    kazoo.expect("ACQUIRED").await;
    // Curator does not wait for kazoo's node, queued ahead of its own.
    let line = curator.next().await;
    assert_eq!(line, format!("ACQUIRED AHEAD {}", name(&kazoo_node)), "Curator behind a kazoo node");
    curator.expect("RELEASING").await;
    curator.expect("RELEASED").await;
    curator.finish().await;
    // Ours waits for kazoo too (it watches Curator's node, then finds kazoo's ahead).
    kazoo.expect("RELEASING").await;
    let (guard, ahead) = tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("ours granted").unwrap();
    assert_eq!(ahead, Vec::<String>::new(), "ours granted while nodes ahead still existed");
    kazoo.expect("RELEASED").await;
    kazoo.finish().await;
    guard.release().await.unwrap();
    assert_no_nodes_left(&client().await, &path).await;
}

/// `zookeeper-client`'s `Client::lock` with `LockPrefix::new_curator(dir, "lock-")` on the path
/// of our mutex, holding for `hold` after its grant; returns when and what was ahead at the grant.
fn zkc_lock(client: zk::Client, path: &str, hold: Duration) -> tokio::task::JoinHandle<(Instant, Vec<String>, String)> {
    let path = path.to_owned();
    tokio::spawn(async move {
        let prefix = zk::LockPrefix::new_curator(&path, "lock-").unwrap();
        let lock = client.lock(prefix, b"zkc", zk::LockOptions::new(zk::Acls::anyone_all())).await.unwrap();
        let granted = Instant::now();
        let ahead = nodes_ahead(&client, &path, lock.lock_path()).await;
        let node = lock.lock_path().to_owned();
        tokio::time::sleep(hold).await;
        drop(lock); // deletes its node in the background
        (granted, ahead, node)
    })
}

/// `zookeeper-client` 0.11's own lock is safe on our (and Curator's) path: Curator's node names,
/// sorted by the sequence after `lock-`, and it waits for the node right before its own. Ours,
/// then zkc, then ours: granted in that order, each only after the node ahead was gone; and zkc
/// waits for us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_client_lock_and_zk_recipes_share_one_queue() {
    let path = unique_path("zkc");
    let first = InterProcessMutex::new(client().await, &path).unwrap();
    let held = first.acquire().await.unwrap();
    let hold = Duration::from_millis(1000);
    let zkc = zkc_lock(client().await, &path, hold);
    let queue = queued(&first, 2, "zkc queued").await;
    assert!(is_curator_format(&queue[1]), "zkc's node: {queue:?}");
    let last_client = client().await;
    let last = InterProcessMutex::new(last_client.clone(), &path).unwrap();
    let waiter = tokio::spawn({
        let path = path.clone();
        async move {
            let guard = last.acquire().await.unwrap();
            let granted = Instant::now();
            let ahead = nodes_ahead(&last_client, &path, guard.lock_path()).await;
            (guard, granted, ahead)
        }
    });
    queued(&first, 3, "ours queued behind zkc").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!zkc.is_finished() && !waiter.is_finished(), "granted while we hold the lock");

    held.release().await.unwrap();
    let (zkc_granted, zkc_ahead, zkc_node) =
        tokio::time::timeout(Duration::from_secs(30), zkc).await.expect("zkc granted").unwrap();
    assert_eq!(zkc_ahead, Vec::<String>::new(), "zkc granted while nodes ahead of {zkc_node} still existed");
    let (guard, granted, ahead) =
        tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("ours granted").unwrap();
    assert_eq!(ahead, Vec::<String>::new(), "ours granted while nodes ahead still existed");
    let after_zkc = granted.duration_since(zkc_granted);
    assert!(after_zkc + SCHED_SLACK >= hold, "ours granted {after_zkc:?} after zkc, which holds {hold:?}");

    // zkc waits for us.
    let zkc = zkc_lock(client().await, &path, Duration::ZERO);
    queued(&first, 2, "zkc queued").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!zkc.is_finished(), "zkc granted while we hold the lock");
    guard.release().await.unwrap();
    let (_, zkc_ahead, _) = tokio::time::timeout(Duration::from_secs(30), zkc).await.expect("zkc granted").unwrap();
    assert_eq!(zkc_ahead, Vec::<String>::new(), "zkc granted while our node still existed");
    assert_no_nodes_left(&client().await, &path).await;
}

/// `zookeeper-client`'s lock keeps only children whose name contains its lock name (`lock-`):
/// a kazoo node (`__lock__`) is invisible to it, so it is granted over a kazoo holder — unsafe
/// with kazoo, like Curator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_client_lock_ignores_a_kazoo_holder() {
    if !kazoo_available() {
        return;
    }
    let zk = zookeeper().await;
    let path = unique_path("zkc-kazoo");
    let hold = Duration::from_secs(5);
    let mut kazoo =
        Holder::kazoo(zk.connect_string(), &path, Duration::from_secs(60), hold, KazooPatterns::CuratorNodes);
    kazoo.expect("CONNECTED").await;
    kazoo.expect("ACQUIRED").await;
    let kazoo_node = children(&client().await, &path).await.pop().expect("kazoo's node");
    let (_, ahead, _) = tokio::time::timeout(Duration::from_secs(30), zkc_lock(client().await, &path, Duration::ZERO))
        .await
        .expect("zkc granted at once")
        .unwrap();
    assert_eq!(ahead, [kazoo_node], "zkc granted while kazoo's node, ahead of its own, exists");
    kazoo.expect("RELEASING").await;
    kazoo.expect("RELEASED").await;
    kazoo.finish().await;
    assert_no_nodes_left(&client().await, &path).await;
}
