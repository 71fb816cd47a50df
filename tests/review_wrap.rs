//! Review 20: what ZooKeeper really does when a directory's sequence counter reaches 2³¹ − 1, and
//! what the lock does then.
//!
//! 2³¹ creates are out of reach of a test, so the server starts from a snapshot in which `/wrap`'s
//! internal `cversion` is already near `Integer.MAX_VALUE`: a `DataTree` is built with ZooKeeper's
//! own classes (a child created with an explicit parent cversion, as a replayed txn carries it,
//! then deleted) and saved with `FileTxnSnapLog`, inside the test image (its JVM can run a
//! single-file Java program). Needs Docker and the image `zk-recipes/zookeeper:3.8-local`.
//!
//! ZooKeeper 3.5.5+ (`DataTree.createNode`, ZOOKEEPER-3249) only ever *raises* the stored
//! cversion (`if (parentCVersion > parent.stat.getCversion())`): the create that computes
//! `Integer.MIN_VALUE` leaves it at `Integer.MAX_VALUE`, so the next create (once the previous one
//! is committed) is named `…2147483647` again. Only creates in flight together (an outstanding
//! `ChangeRecord` in `PrepRequestProcessor`) see `-2147483648`, `-2147483647`, ….

use std::process::Command;
use std::time::Duration;

use zk_recipes::InterProcessMutex;
use zookeeper_client as zk;

const IMAGE: &str = "zk-recipes/zookeeper:3.8-local";

const MAKE_SNAP: &str = r#"
import java.io.File;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.server.DataTree;
import org.apache.zookeeper.server.persistence.FileTxnSnapLog;

public class MakeSnap {
    public static void main(String[] args) throws Exception {
        int start = Integer.parseInt(args[0]);
        DataTree dt = new DataTree();
        long now = System.currentTimeMillis();
        dt.createNode("/wrap", new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, 0L, -1, 1L, now);
        dt.createNode("/wrap/x", new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, 0L, start, 2L, now);
        dt.deleteNode("/wrap/x", 3L);
        dt.lastProcessedZxid = 3L;
        new FileTxnSnapLog(new File("/datalog"), new File("/data")).save(dt, new ConcurrentHashMap<>(), false);
    }
}
"#;

/// A standalone server whose `/wrap` has its internal cversion at `start`. Removed on drop.
struct WrapServer {
    name: String,
    connect: String,
}

impl Drop for WrapServer {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.name]).output();
    }
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn wrap_server(start: i32) -> WrapServer {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("review-wrap-{id}"));
    for sub in ["data", "datalog", "src"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("src/MakeSnap.java"), MAKE_SNAP).unwrap();
    let mount = |sub: &str| format!("{}:/{sub}", dir.join(sub).display());
    let (data, datalog, src) = (mount("data"), mount("datalog"), mount("src"));
    let start = start.to_string();
    docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "java",
        "-v",
        &data,
        "-v",
        &datalog,
        "-v",
        &src,
        IMAGE,
        "-cp",
        "/usr/share/java/*",
        "/src/MakeSnap.java",
        &start,
    ]);
    let name = format!("review-wrap-{id}");
    docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "-p",
        "127.0.0.1::2181",
        "-v",
        &data,
        "-v",
        &datalog,
        "-e",
        "ZOO_TICK_TIME=500",
        "-e",
        "ZOO_ADMINSERVER_ENABLED=false",
        IMAGE,
    ]);
    let port = docker(&["port", &name, "2181/tcp"]);
    let server = WrapServer { name, connect: port.lines().next().unwrap().to_owned() };
    for _ in 0..120 {
        if let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(2), connect(&server.connect)).await {
            if client.check_stat("/wrap").await.ok().flatten().is_some() {
                return server;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("server {} did not come up", server.connect);
}

async fn connect(addr: &str) -> Result<zk::Client, zk::Error> {
    zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(addr).await
}

fn ephemeral_sequential() -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all())
}

/// What the server names sequential children once the counter reached 2³¹ − 1: one create at a
/// time, the same positive name again and again (not `-2147483648`); pipelined, negatives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_sticks_at_2147483647_it_does_not_wrap() {
    let server = wrap_server(i32::MAX - 3).await;
    let client = connect(&server.connect).await.unwrap();
    let mut one_at_a_time = Vec::new();
    // The same prefix twice at 2147483647 fails with NodeExists (Curator's unprotected `lock-`
    // nodes would): one prefix per create.
    let again = client.create("/wrap/same-", b"", &ephemeral_sequential()).await.unwrap().1.into_i64();
    let same = client.create("/wrap/same-", b"", &ephemeral_sequential()).await.unwrap().1.into_i64();
    let third = client.create("/wrap/same-", b"", &ephemeral_sequential()).await.unwrap().1.into_i64();
    println!("same prefix: {again} {same} {third}");
    for i in 0..5 {
        let (_, sequence) = client.create(&format!("/wrap/n{i}-"), b"", &ephemeral_sequential()).await.unwrap();
        one_at_a_time.push(sequence.into_i64());
    }
    println!("one at a time: {one_at_a_time:?}");
    let prefixes: Vec<_> = (0..5).map(|i| format!("/wrap/p{i}-")).collect();
    let pipelined: Vec<_> = prefixes.iter().map(|p| client.create(p, b"", &ephemeral_sequential())).collect();
    let mut together = Vec::new();
    for create in pipelined {
        together.push(create.await.unwrap().1.into_i64());
    }
    println!("pipelined: {together:?}");
    let mut names = client.list_children("/wrap").await.unwrap();
    names.sort();
    println!("children: {names:?}");
    assert_eq!((again, same, third), (2147483644, 2147483645, 2147483646));
    assert_eq!(one_at_a_time, [2147483647; 5]);
    assert!(together.iter().any(|s| *s < 0), "{together:?}");
}

/// Two mutexes of ours on a path whose counter reached 2³¹ − 1: the holder's node and every later
/// one are named `…-lock-2147483647`, none negative, so `SequenceWrapped` never fires; ours sorts
/// equal sequences by name (a random GUID), so a later acquire whose GUID sorts first is granted
/// at once while the holder holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_counter_reaches_2147483647_a_second_holder_is_granted() {
    let server = wrap_server(i32::MAX - 1).await;
    let (a, b) = (connect(&server.connect).await.unwrap(), connect(&server.connect).await.unwrap());
    let holder_lock = InterProcessMutex::new(a, "/wrap").unwrap();
    let other_lock = InterProcessMutex::new(b, "/wrap").unwrap();
    // Acquire and release until the holder's node is named with the counter's last value.
    let holder = loop {
        let guard = holder_lock.acquire().await.unwrap();
        if guard.lock_path().ends_with("2147483647") {
            break guard;
        }
        guard.release().await.unwrap();
    };
    println!("holder: {}", holder.lock_path());
    for attempt in 0..20 {
        match other_lock.try_acquire().await {
            Ok(Some(second)) => {
                println!("attempt {attempt}: second holder {} while {} holds", second.lock_path(), holder.lock_path());
                println!("states: {:?} {:?}", holder.state(), second.state());
                panic!(
                    "two holders of /wrap: {} and {} (no SequenceWrapped: the names are positive)",
                    holder.lock_path(),
                    second.lock_path()
                );
            },
            Ok(None) => {},
            Err(err) => panic!("attempt {attempt}: {err}"),
        }
    }
}
