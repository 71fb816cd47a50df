//! The harness against a real server: start, connect, 4lw, restart, session expiry.

use std::time::{Duration, Instant};

use zk_testcontainers::zookeeper_client::{self as zk, Acls, CreateMode, SessionState};
use zk_testcontainers::{expire_session, Backend, ZooKeeper};

mod common;

use common::{unique, wait_state};

#[tokio::test]
async fn shared_server_create_and_read() {
    let zk = ZooKeeper::shared().await.expect("a ZooKeeper server");
    eprintln!("backend: {:?} at {}", zk.backend(), zk.connect_string());
    let client = zk.client().await.expect("client");
    let path = unique("harness-create");
    let opts = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.create(&path, b"hello", &opts).await.expect("create");
    let (data, stat) = client.get_data(&path).await.expect("get_data");
    assert_eq!(data, b"hello");
    assert_eq!(stat.version, 0);
    client.delete(&path, None).await.expect("delete");
}

#[tokio::test]
async fn shared_is_one_server_across_runtimes() {
    let a = ZooKeeper::shared().await.expect("server");
    let b = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
            let zk = ZooKeeper::shared().await.expect("server");
            // A client on another runtime works too.
            let c = zk.client().await.expect("client");
            c.check_stat("/").await.expect("stat /");
            zk.connect_string().to_string()
        })
    })
    .join()
    .expect("thread");
    assert_eq!(a.connect_string(), b);
}

#[tokio::test]
async fn four_letter_words() {
    let zk = ZooKeeper::shared().await.expect("server");
    assert_eq!(zk.four_letter_word("ruok").await.expect("ruok"), "imok");
    let mntr = zk.four_letter_word("mntr").await.expect("mntr");
    assert!(mntr.contains("zk_version"), "mntr: {mntr}");
    assert!(mntr.contains("zk_server_state\tstandalone"), "mntr: {mntr}");
    let cons = zk.four_letter_word("cons").await.expect("cons");
    assert!(cons.contains("queued="), "cons: {cons}");
    assert!(zk.four_letter_word("toolong").await.is_err());
}

#[tokio::test]
async fn restart_keeps_address_and_persistent_data() {
    let zk = ZooKeeper::start().await.expect("server");
    if *zk.backend() == Backend::External {
        eprintln!("skipped: external server");
        return;
    }
    let before = zk.connect_string().to_string();
    let client = zk.client().await.expect("client");
    let opts = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.create("/survivor", b"v1", &opts).await.expect("create");
    let eph = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    client.create("/ephemeral", b"", &eph).await.expect("create");

    let t = Instant::now();
    zk.restart().await.expect("restart");
    eprintln!("restart took {:?}", t.elapsed());
    assert_eq!(zk.connect_string(), before);
    assert_eq!(zk.four_letter_word("ruok").await.expect("ruok"), "imok");

    // The old session survives a quick restart: it reconnects to the same address.
    let (data, _) = client.get_data("/survivor").await.expect("old client get_data");
    assert_eq!(data, b"v1");
    let fresh = zk.client().await.expect("client after restart");
    let (data, _) = fresh.get_data("/survivor").await.expect("get_data");
    assert_eq!(data, b"v1");

    // stop: clients lose the connection; the data is kept.
    zk.stop().await.expect("stop");
    assert!(zk.four_letter_word("ruok").await.is_err());
    zk.restart().await.expect("restart after stop");
    let (data, _) = fresh.get_data("/survivor").await.expect("get_data after stop");
    assert_eq!(data, b"v1");
}

#[tokio::test]
async fn pause_and_unpause() {
    let zk = ZooKeeper::start().await.expect("server");
    if *zk.backend() == Backend::External {
        return;
    }
    let client = zk.client_with_timeout(Duration::from_secs(2)).await.expect("client");
    zk.pause().await.expect("pause");
    assert_eq!(
        wait_state(&client, SessionState::Disconnected, Duration::from_secs(5)).await,
        SessionState::Disconnected
    );
    zk.unpause().await.expect("unpause");
    assert_eq!(zk.four_letter_word("ruok").await.expect("ruok"), "imok");
}

#[tokio::test]
async fn expire_session_expires_the_original_client() {
    let zk = ZooKeeper::shared().await.expect("server");
    let client = zk.client().await.expect("client");
    let path = unique("harness-expire");
    let eph = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    client.create(&path, b"", &eph).await.expect("create");

    let t = Instant::now();
    expire_session(zk.connect_string(), &client).await.expect("expire_session");
    eprintln!("expire_session took {:?}", t.elapsed());
    assert_eq!(wait_state(&client, SessionState::Expired, Duration::from_secs(10)).await, SessionState::Expired);
    assert!(matches!(client.get_data(&path).await, Err(zk::Error::SessionExpired)));
    // The ephemeral node went with the session.
    let other = zk.client().await.expect("client");
    assert_eq!(other.check_stat(&path).await.expect("stat"), None);
}

/// An external server (what `ZK_CONNECT` gives) is used, never managed: stop, restart and pause
/// are refused with an error naming `ZK_CONNECT`, and the server keeps serving. Checked whatever
/// the environment, against the shared server seen as external.
#[tokio::test]
async fn external_backend_refuses_management() {
    let shared = ZooKeeper::shared().await.expect("server");
    let zk = ZooKeeper::external(shared.connect_string());
    assert_eq!(*zk.backend(), Backend::External);
    assert_eq!(zk.connect_string(), shared.connect_string());
    for (op, result) in [("stop", zk.stop().await), ("restart", zk.restart().await), ("pause", zk.pause().await)] {
        let e = result.expect_err("managing an external server");
        assert!(e.to_string().contains("ZK_CONNECT") && e.to_string().contains(op), "{op}: {e}");
    }
    let client = zk.client().await.expect("the external server still serves");
    assert!(client.check_stat("/").await.expect("stat /").is_some());
    drop(zk); // dropping an external server stops nothing
    let again = shared.client().await.expect("the server is still up after the external handle was dropped");
    assert!(again.check_stat("/").await.expect("stat /").is_some());
}

/// With `REQUIRE_DOCKER=1` (CI, which unsets `ZK_CONNECT`) the shared server is a container: the
/// container path cannot be skipped silently.
#[tokio::test]
async fn require_docker_gives_a_container() {
    if std::env::var("REQUIRE_DOCKER").as_deref() != Ok("1") {
        return;
    }
    assert!(std::env::var_os("ZK_CONNECT").is_none(), "ZK_CONNECT outranks REQUIRE_DOCKER: unset it");
    let zk = ZooKeeper::shared().await.expect("server");
    assert!(matches!(zk.backend(), Backend::Container { .. }), "{:?}", zk.backend());
}

#[tokio::test]
async fn container_and_ttl_nodes_are_cleaned_up_quickly() {
    let zk = ZooKeeper::shared().await.expect("server");
    if *zk.backend() == Backend::External {
        return; // the external server's settings are unknown
    }
    let client = zk.client().await.expect("client");
    let base = unique("harness-container");
    let container = CreateMode::Container.with_acls(Acls::anyone_all());
    client.create(&base, b"", &container).await.expect("create container");
    let child = format!("{base}/child");
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.create(&child, b"", &persistent).await.expect("create child");
    client.delete(&child, None).await.expect("delete child");

    let ttl_path = unique("harness-ttl");
    let ttl = CreateMode::Persistent.with_acls(Acls::anyone_all()).with_ttl(Duration::from_millis(200));
    client.create(&ttl_path, b"", &ttl).await.expect("create TTL node (extended types on)");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let container_gone = client.check_stat(&base).await.expect("stat").is_none();
        let ttl_gone = client.check_stat(&ttl_path).await.expect("stat").is_none();
        if container_gone && ttl_gone {
            break;
        }
        assert!(Instant::now() < deadline, "container gone: {container_gone}, ttl gone: {ttl_gone}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
