//! The fault proxy against a real server.

use std::time::{Duration, Instant};

use zk_testcontainers::zookeeper_client::{self as zk, Acls, CreateMode, SessionState};
use zk_testcontainers::{op, FaultProxy, ZooKeeper};

mod common;

use common::{unique, wait_state};

async fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

async fn connect_via(zk: &ZooKeeper, proxy: &FaultProxy, session_timeout: Duration) -> zk::Client {
    zk.connector()
        .with_session_timeout(session_timeout)
        .connect(&proxy.addr())
        .await
        .expect("connect through the proxy")
}

fn persistent() -> zk::CreateOptions<'static> {
    CreateMode::Persistent.with_acls(Acls::anyone_all())
}

#[tokio::test]
async fn pass_forwards_and_counts_connections() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    assert_eq!(proxy.connections(), 0);
    let client = connect_via(zk, &proxy, Duration::from_secs(4)).await;
    let path = unique("proxy-pass");
    client.create(&path, b"x", &persistent()).await.expect("create");
    assert_eq!(client.get_data(&path).await.expect("get").0, b"x");
    assert!(wait_until(Duration::from_secs(2), || proxy.connections() == 1).await);
    client.delete(&path, None).await.expect("delete");
    drop(client);
    assert!(wait_until(Duration::from_secs(5), || proxy.connections() == 0).await);
}

#[tokio::test]
async fn cut_loses_the_connection_but_not_the_session() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let client = connect_via(zk, &proxy, Duration::from_secs(4)).await;
    let session = client.session_id();
    let mut watcher = client.state_watcher();
    proxy.cut();
    let state = tokio::time::timeout(Duration::from_secs(5), watcher.changed()).await.expect("state change");
    assert_eq!(state, SessionState::Disconnected);
    assert_eq!(
        wait_state(&client, SessionState::SyncConnected, Duration::from_secs(5)).await,
        SessionState::SyncConnected
    );
    assert_eq!(client.session_id(), session);
    client.check_stat("/").await.expect("works after reconnect");
}

#[tokio::test]
async fn refuse_keeps_clients_out_until_lifted() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let client = connect_via(zk, &proxy, Duration::from_secs(6)).await;
    proxy.refuse(true);
    proxy.cut();
    assert_eq!(
        wait_state(&client, SessionState::Disconnected, Duration::from_secs(5)).await,
        SessionState::Disconnected
    );
    // Reconnects are refused for a while.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(client.state(), SessionState::Disconnected);
    assert_eq!(proxy.connections(), 0);
    proxy.refuse(false);
    assert_eq!(
        wait_state(&client, SessionState::SyncConnected, Duration::from_secs(6)).await,
        SessionState::SyncConnected
    );
}

#[tokio::test]
async fn stall_makes_the_server_expire_the_session() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let timeout = Duration::from_secs(2);
    let client = connect_via(zk, &proxy, timeout).await;
    let path = unique("proxy-stall");
    let eph = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    client.create(&path, b"", &eph).await.expect("create");

    let started = Instant::now();
    proxy.stall();
    assert_eq!(
        wait_state(&client, SessionState::Disconnected, timeout * 2).await,
        SessionState::Disconnected,
        "a stalled connection must be noticed"
    );
    eprintln!("Disconnected after {:?}", started.elapsed());

    // The server expires the session on its own: the ephemeral node disappears.
    let observer = zk.client().await.expect("direct client");
    let mut gone = false;
    let deadline = Instant::now() + timeout * 4;
    while Instant::now() < deadline {
        if observer.check_stat(&path).await.expect("stat").is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "server did not expire the stalled session");
    eprintln!("session expired on the server after {:?}", started.elapsed());

    proxy.pass();
    assert_eq!(wait_state(&client, SessionState::Expired, Duration::from_secs(10)).await, SessionState::Expired);
    assert!(matches!(client.check_stat("/").await, Err(zk::Error::SessionExpired)));
}

#[tokio::test]
async fn drop_reply_to_next_create_applies_it_but_loses_the_reply() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let client = connect_via(zk, &proxy, Duration::from_secs(4)).await;
    let path = unique("proxy-lost-reply");

    // Unrelated requests pass while armed.
    proxy.drop_reply_to_next(&[op::CREATE2, op::CREATE]);
    client.check_stat("/").await.expect("stat passes");
    assert!(proxy.drop_reply_armed());

    let result = client.create(&path, b"v", &persistent()).await;
    assert!(!proxy.drop_reply_armed(), "fired");
    match &result {
        Err(zk::Error::ConnectionLoss) => {},
        Err(zk::Error::Custom(_)) => {},
        other => panic!("expected a lost reply, got {other:?}"),
    }
    // Applied on the server.
    let observer = zk.client().await.expect("direct client");
    assert_eq!(observer.get_data(&path).await.expect("exists").0, b"v");
    // The session survives: the client reconnects (through the proxy, now passing).
    assert_eq!(
        wait_state(&client, SessionState::SyncConnected, Duration::from_secs(5)).await,
        SessionState::SyncConnected
    );
    assert!(matches!(client.create(&path, b"v", &persistent()).await, Err(zk::Error::NodeExists)));
    observer.delete(&path, None).await.expect("cleanup");
}

#[tokio::test]
async fn drop_reply_to_next_delete() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let client = connect_via(zk, &proxy, Duration::from_secs(4)).await;
    let path = unique("proxy-lost-delete");
    client.create(&path, b"", &persistent()).await.expect("create");
    proxy.drop_reply_to_next(&[op::DELETE]);
    assert!(client.delete(&path, None).await.is_err());
    let observer = zk.client().await.expect("direct client");
    assert_eq!(observer.check_stat(&path).await.expect("stat"), None);
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let zk = ZooKeeper::shared().await.expect("server");
    let proxy = FaultProxy::start(zk.connect_string()).await.expect("proxy");
    let addr = proxy.addr();
    let client = connect_via(zk, &proxy, Duration::from_secs(4)).await;
    drop(proxy);
    assert_eq!(
        wait_state(&client, SessionState::Disconnected, Duration::from_secs(5)).await,
        SessionState::Disconnected
    );
    assert!(tokio::net::TcpStream::connect(&addr).await.is_err());
}
