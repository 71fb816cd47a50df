//! Auth data never reaches `Debug` output or logs. A test binary of its own: the capture below is
//! a thread-local `tracing` subscriber, and a test running on another thread at the same time
//! could leave callsites cached as uninteresting before it is installed.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{unique_path, zookeeper};
use zk_recipes::{InterProcessMutex, ManagedClient};
use zookeeper_client as zk;

const AUTH: &[u8] = b"orders:s3cret-for-acl-test";
const SECRET: &str = "s3cret-for-acl-test";

/// A `tracing` writer collecting everything into a buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Auth bytes never reach `Debug` output or logs (at the most verbose level, every target).
/// A current-thread runtime, so every task — ours and the client library's — logs into the
/// capture installed for this thread.
#[tokio::test]
async fn auth_never_in_debug_or_logs() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

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
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(logs.contains("ZooKeeper session established"), "the capture works: {logs}");
    assert!(!logs.contains(SECRET), "a log line shows the secret");
    assert!(!logs.contains(&format!("{:?}", AUTH)), "a log line shows the auth bytes");
}
