//! Review S: the sentence added to `session/cleanup.rs`'s `Deletion` docs (commit 9805d04): a
//! deletion run again never finds another node in its place, however late it runs, because every
//! lock node's name carries a GUID.
//!
//! The GUID was chosen once per *attempt* (`OnSession::attempt`, before its loop), and an attempt
//! whose node vanished while it waited (`Turn::NodeGone`) handed the old path to the cleanup
//! (`abandon_node`) and created again *with the same GUID*. In a directory deleted and made again,
//! the counter starts over, so the new node could get the old sequence number: the very same path,
//! a different node — the one the attempt then waits with, and may be granted, and which a late
//! delete of the old path (a retry after a connection loss, or a `searches_done` run a second
//! after the deletion started) would delete.
//!
//! - `the_next_node_of_an_attempt_never_has_its_abandoned_path` (review: was
//!   `an_attempt_recreates_its_own_abandoned_path`, which demonstrated the reuse): a foreign holder
//!   `lock-0000000000` (a Curator-style name, by an observer session), our waiter
//!   `_c_<G>-lock-0000000001`; the observer then, in one `multi`, deletes both nodes and the
//!   directory, makes the directory again and its holder node again (`lock-0000000000`). Our
//!   attempt queues again — now with a fresh GUID, so at another path, while the old path stays
//!   free. Failed (the old path was made again, new czxid) before the fix.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// review: an_attempt_recreates_its_own_abandoned_path
async fn the_next_node_of_an_attempt_never_has_its_abandoned_path() {
    let observer = client().await;
    let session = client().await;
    let dir = unique_path("rs-reuse");
    let parent = dir.rsplit_once('/').unwrap().0;
    let _ = observer.create(parent, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await;
    observer.create(&dir, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let seq = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    observer.create(&format!("{dir}/lock-"), b"", &seq).await.unwrap();
    let holder = format!("{dir}/lock-0000000000");
    assert_eq!(children(&observer, &dir).await, vec!["lock-0000000000".to_owned()]);
    let mutex = InterProcessMutex::new(session.clone(), &dir).unwrap();
    let waiting = tokio::spawn(async move { mutex.acquire().await });
    let mut ours = None;
    for _ in 0..400 {
        ours = children(&observer, &dir).await.into_iter().find(|name| name.starts_with("_c_"));
        if ours.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let ours = ours.expect("our waiter's node");
    let old_path = format!("{dir}/{ours}");
    let old_czxid = observer.check_stat(&old_path).await.unwrap().unwrap().czxid;
    assert!(ours.ends_with("lock-0000000001"), "{ours}");
    // Let the waiter settle on its watches.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut multi = observer.new_multi_writer();
    multi.add_delete(&old_path, None).unwrap();
    multi.add_delete(&holder, None).unwrap();
    multi.add_delete(&dir, None).unwrap();
    multi.add_create(&dir, b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).unwrap();
    multi.add_create(&format!("{dir}/lock-"), b"", &seq).unwrap();
    multi.commit().await.unwrap();
    // Our attempt queues again: a node of our session in the directory made again.
    let mut again = None;
    for _ in 0..400 {
        again = children(&observer, &dir).await.into_iter().find(|name| name.starts_with("_c_"));
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let again = again.expect("our attempt queued again within 10 s");
    let stat = observer.check_stat(&format!("{dir}/{again}")).await.unwrap().expect("our new node");
    eprintln!("our waiter {old_path} (czxid {old_czxid:#x}); queued again as {again} (czxid {:#x})", stat.czxid);
    assert_eq!(stat.ephemeral_owner, session.session_id().0);
    assert_ne!(format!("{dir}/{again}"), old_path, "the attempt made its abandoned path again");
    assert!(
        !again.starts_with(&ours[..ours.len() - "lock-0000000001".len()]),
        "the attempt's next node kept the old GUID: {again} after {ours}"
    );
    assert!(observer.check_stat(&old_path).await.unwrap().is_none(), "the old path exists again");
    waiting.abort();
}
