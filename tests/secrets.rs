//! Auth data never reaches `Debug` output or logs. A test binary of its own: the capture below is
//! a thread-local `tracing` subscriber, and a test running on another thread at the same time
//! could leave callsites cached as uninteresting before it is installed.

mod common;

use std::time::Duration;

use common::{unique_path, zookeeper};
use zk_recipes::{InterProcessMutex, ManagedClient};
use zookeeper_client as zk;

const AUTH: &[u8] = b"orders:s3cret-for-acl-test";
const SECRET: &str = "s3cret-for-acl-test";

/// Auth bytes never reach `Debug` output or logs (at the most verbose level, every target).
/// A current-thread runtime, so every task — ours and the client library's — logs into the
/// capture installed for this thread.
#[tokio::test]
async fn auth_never_in_debug_or_logs() {
    let (captured, _default) = common::LogCapture::install(tracing::Level::TRACE);

    let builder = ManagedClient::builder(zookeeper().await.connect_string())
        .auth("digest", AUTH)
        .acls(zk::Acls::creator_all().to_vec());
    let builder_debug = format!("{builder:?}");
    let zk = builder.connect().await.unwrap();
    let mutex = InterProcessMutex::new(&zk, unique_path("acl-logs")).unwrap();
    let guard = mutex.acquire().await.unwrap();
    let debug =
        [builder_debug, format!("{zk:?}"), format!("{mutex:?}"), format!("{guard:?}"), format!("{:?}", zk.state())];
    guard.release().await.unwrap();
    drop((mutex, zk));
    tokio::time::sleep(Duration::from_millis(100)).await;

    for shown in &debug {
        assert!(!shown.contains(SECRET), "Debug shows the secret: {shown}");
        assert!(shown.len() < 400, "Debug is not compact ({} bytes): {shown}", shown.len());
    }
    let logs = captured.text();
    assert!(logs.contains("ZooKeeper session established"), "the capture works: {logs}");
    assert!(!logs.contains(SECRET), "a log line shows the secret");
    assert!(!logs.contains(&format!("{:?}", AUTH)), "a log line shows the auth bytes");
}
