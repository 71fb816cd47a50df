//! Helpers shared by the harness's integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use zk_testcontainers::zookeeper_client::{self as zk, SessionState};

/// A node path unique within this test process.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("/{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Waits until the client's state is `want` (seeing every transition), returning the last
/// state seen.
pub async fn wait_state(client: &zk::Client, want: SessionState, within: Duration) -> SessionState {
    let deadline = Instant::now() + within;
    let mut watcher = client.state_watcher();
    let mut state = client.state();
    while state != want {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match tokio::time::timeout(deadline - now, watcher.changed()).await {
            Ok(s) => state = s,
            Err(_) => break,
        }
    }
    state
}
