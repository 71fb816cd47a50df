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

mod common;

use std::time::Instant;

use common::interop::{lock_sequence, sequence_wrap_server, snapshot_writer_available};
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
