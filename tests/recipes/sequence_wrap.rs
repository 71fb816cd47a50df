//! Lock nodes at the wrap of ZooKeeper's sequence counter. ZooKeeper names a sequential child
//! after its parent's stored child version (`cversion`, a Java `int`, `%010d`): "the counter
//! will overflow when incremented beyond 2147483647" (ZooKeeper Programmer's Guide), to
//! `…-lock--2147483648`.
//!
//! No test can create 2³¹ nodes, so the server starts from a crafted snapshot
//! ([`sequence_wrap_server`], `tests/interop/WrapSnapshot.java`) whose lock directory `/wrap` is
//! two creates away from the wrap. That needs `java` (a JDK, for single-file source launch) and
//! Debian's `libzookeeper-java` and `libslf4j-java`; without them the test says so and passes,
//! unless `REQUIRE_CURATOR=1` (CI sets it and installs them), in which case it fails.
//!
//! What a ZooKeeper 3.8 server does there (the test below pins it): the name of a create comes
//! from the counter as the create is prepared (`PrepRequestProcessor`: the stored cversion, or
//! that of a create prepared but not yet applied, plus one), but applying a create only ever
//! raises the stored counter (`DataTree.createNode`, since ZOOKEEPER-3249). So once a child
//! named `…2147483647` is applied, the counter stays at 2147483647: every later create, one at a
//! time, is named `…2147483647` again (under another prefix it succeeds — sequence numbers repeat
//! —, under the same one it fails with `NodeExists`). A negative name appears only for a create
//! prepared while the one named `…2147483647` is still in flight: the next op of the same
//! `multi` (deterministic), or a create of any session that the server prepares before applying
//! that one (timing).

use crate::common;

use std::time::{Duration, Instant};

use common::interop::{lock_sequence, sequence_wrap_server, snapshot_writer_available};
use zk_recipes::{Error, InterProcessMutex, LockState};
use zookeeper_client as zk;

/// The crafted lock directory.
const DIR: &str = "/wrap";

/// A lock node prefix as Curator and zk-recipes write it, `<DIR>/_c_<uuid>-lock-`.
fn lock_prefix() -> String {
    format!("{DIR}/_c_{}-lock-", uuid::Uuid::new_v4())
}

/// Fixture check, nothing of the library yet: `/wrap` crafted at counter 2147483646, lock nodes
/// created with the plain client get 2147483646, 2147483647, then 2147483647 again one create
/// at a time, and -2147483648 for the second create of a `multi`: the wrap is crossed only by
/// creates in flight together (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crafted_server_names_lock_nodes_across_the_wrap() {
    if !snapshot_writer_available() {
        return;
    }
    let started = Instant::now();
    let zk = sequence_wrap_server(DIR, i32::MAX - 1).await;
    eprintln!("server on the crafted snapshot: {:?}, after {:?}", zk.backend(), started.elapsed());
    let client = zk.client().await.expect("connect to the crafted server");

    // A client sees another cversion than the stored counter: twice the child creates minus
    // the children (`DataNode.copyStat`), here 2 × 2147483646 wrapped to -4.
    let stat = client.check_stat(DIR).await.expect("stat /wrap").expect("/wrap exists on the crafted server");
    assert_eq!((stat.cversion, stat.num_children), ((i32::MAX - 1).wrapping_mul(2), 0), "/wrap as crafted: {stat:?}");

    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let mut names = Vec::new();

    // One create at a time: up to the last positive number, then stuck there.
    let mut prefixes = Vec::new();
    for expected in [2147483646, 2147483647, 2147483647] {
        let prefix = lock_prefix();
        let (_, sequence) = client.create(&prefix, b"", &options).await.expect("create a lock node");
        let name = format!("{prefix}{sequence}");
        assert_eq!(sequence.into_i64(), expected, "{name} (so far: {names:?})");
        names.push(name);
        prefixes.push(prefix);
    }
    let again = client.create(&prefixes[1], b"", &options).await;
    assert!(matches!(again, Err(zk::Error::NodeExists)), "a create under the prefix of …2147483647 again: {again:?}");

    // Two creates in one multi: the second is prepared before the first is applied.
    let pair = [lock_prefix(), lock_prefix()];
    let mut multi = client.new_multi_writer();
    for prefix in &pair {
        multi.add_create(prefix, b"", &options).expect("add a create to the multi");
    }
    let results = multi.commit().await.expect("the multi of two lock node creates");
    let created: Vec<String> = results
        .into_iter()
        .map(|result| match result {
            zk::MultiWriteResult::Create { path, .. } => path,
            other => panic!("a create in the multi answered {other:?}"),
        })
        .collect();
    assert_eq!(created, [format!("{}2147483647", pair[0]), format!("{}-2147483648", pair[1])]);
    names.extend(created);

    // And back to the stuck counter.
    let prefix = lock_prefix();
    let (_, sequence) = client.create(&prefix, b"", &options).await.expect("create a lock node after the multi");
    names.push(format!("{prefix}{sequence}"));
    assert_eq!(sequence.into_i64(), 2147483647, "{names:?}");

    eprintln!("the server named them, in order:\n  {}", names.join("\n  "));
    // As the server lists them, not only as the client composed them.
    let mut listed: Vec<String> = client
        .list_children(DIR)
        .await
        .expect("list /wrap")
        .into_iter()
        .map(|child| format!("{DIR}/{child}"))
        .collect();
    listed.sort();
    names.sort();
    assert_eq!(listed, names, "the children of {DIR}");
    let sequences: Vec<i64> = listed.iter().map(|name| lock_sequence(name).expect("a lock node")).collect();
    assert_eq!(sequences.iter().filter(|&&s| s == -2147483648).count(), 1, "{listed:?}");
    assert_eq!(sequences.iter().filter(|&&s| s == 2147483647).count(), 4, "{listed:?}");

    drop(client);
    drop(zk);
    eprintln!("took {:?}", started.elapsed());
}

/// The library at the counter's end (`src/engine/naming.rs`, *The counter's end*): on `/wrap`
/// crafted at 2147483646, the first acquire is granted with the last unique number below the
/// end; every later one is named `…2147483647` (repeated) by the server and fails at once with
/// `Error::SequenceWrapped`, its node deleted — `acquire`, `acquire_timeout` and `try_acquire`
/// alike — while the holder stays `Held` and its fenced write still commits. Nothing is left
/// while the sessions are open. Deleting the empty directory (what the container reaper does)
/// starts a fresh counter: the next acquire is granted at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_node_at_the_counters_end_is_never_granted() {
    if !snapshot_writer_available() {
        return;
    }
    let zk = sequence_wrap_server(DIR, i32::MAX - 1).await;
    let (holder_client, other_client, observer) =
        (zk.client().await.expect("connect"), zk.client().await.expect("connect"), zk.client().await.expect("connect"));
    let holder = InterProcessMutex::new(holder_client.clone(), DIR).unwrap();
    let held = holder.acquire().await.expect("the first acquire, below the counter's end");
    assert_eq!(held.sequence(), 2147483646);

    let other = InterProcessMutex::new(other_client.clone(), DIR).unwrap();
    for attempt in 0..3 {
        let refused = match attempt {
            // Bounded so that a node the library wrongly queues fails the test, not hangs it.
            0 => tokio::time::timeout(Duration::from_secs(10), other.acquire())
                .await
                .unwrap_or_else(|_| panic!("the acquire at the counter's end waited instead of failing"))
                .map(drop),
            1 => other.acquire_timeout(Duration::from_secs(10)).await.map(drop),
            _ => other.try_acquire().await.map(drop),
        };
        match refused {
            Err(Error::SequenceWrapped { path, name }) => {
                assert_eq!(path, DIR);
                assert!(name.ends_with("-lock-2147483647"), "attempt {attempt}: {name}");
            },
            other => panic!("attempt {attempt} at the counter's end: {other:?}"),
        }
        assert!(!other.is_acquired_in_this_process());
        assert_eq!(held.state(), LockState::Held, "the holder is unaffected");
        let left = observer.list_children(DIR).await.expect("list /wrap");
        assert_eq!(left.len(), 1, "attempt {attempt}: the refused node is deleted when the error returns: {left:?}");
    }
    let mut fenced = held.fenced_writer();
    fenced.add_check_version(DIR, -1).unwrap();
    fenced.commit().await.expect("the holder's fenced write");
    held.release().await.unwrap();
    assert!(observer.list_children(DIR).await.expect("list /wrap").is_empty(), "nothing left");

    // Recovery: the empty directory deleted, the counter starts again.
    observer.delete(DIR, None).await.expect("delete the empty lock directory");
    let fresh = other.acquire().await.expect("an acquire on a fresh counter");
    assert_eq!(fresh.sequence(), 0);
    fresh.release().await.unwrap();
    drop((holder_client, other_client));
}

/// A negative sequence (the counter wrapped: crafted at `i32::MIN`, as an older server, or a
/// create prepared beside the one at the end, names it) is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_node_with_a_negative_sequence_is_never_granted() {
    if !snapshot_writer_available() {
        return;
    }
    let zk = sequence_wrap_server(DIR, i32::MIN).await;
    let (client, observer) = (zk.client().await.expect("connect"), zk.client().await.expect("connect"));
    let lock = InterProcessMutex::new(client.clone(), DIR).unwrap();
    match lock.acquire().await {
        Err(Error::SequenceWrapped { name, .. }) => {
            assert_eq!(lock_sequence(&name), Some(-2147483648), "{name}")
        },
        other => panic!("a negative sequence: {other:?}"),
    }
    let left = observer.list_children(DIR).await.expect("list /wrap");
    assert!(left.is_empty(), "the refused node is deleted when the error returns: {left:?}");
    assert!(matches!(client.check_stat("/").await, Ok(Some(_))), "the session is still open");
}
