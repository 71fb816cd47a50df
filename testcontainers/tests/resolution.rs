//! Backend resolution driven by environment variables. One test only: it changes the
//! process environment, so nothing may run concurrently in this binary.

use std::time::Duration;

use zk_testcontainers::{Backend, HarnessError, ZooKeeper};

#[tokio::test]
async fn environment_variables_select_the_backend() {
    // ZK_CONNECT: an external server, not managed.
    std::env::set_var("ZK_CONNECT", "127.0.0.1:1");
    let zk = ZooKeeper::start().await.expect("external");
    assert_eq!(zk.backend(), &Backend::External);
    assert_eq!(zk.connect_string(), "127.0.0.1:1");
    for e in [
        zk.stop().await.expect_err("stop"),
        zk.restart().await.expect_err("restart"),
        zk.pause().await.expect_err("pause"),
        zk.unpause().await.expect_err("unpause"),
    ] {
        assert!(matches!(e, HarnessError::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("ZK_CONNECT=127.0.0.1:1"), "{e}");
    }
    let e = zk.client_with_timeout(Duration::from_secs(1)).await.expect_err("nothing listens on port 1");
    eprintln!("{e}");
    assert!(matches!(e, HarnessError::Connect { .. }), "{e}");
    assert!(zk.four_letter_word("ruok").await.is_err());
    drop(zk);
    std::env::remove_var("ZK_CONNECT");

    // REQUIRE_DOCKER=1 without a usable Docker: an error, no fallback.
    std::env::set_var("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    std::env::set_var("REQUIRE_DOCKER", "1");
    let e = ZooKeeper::start().await.expect_err("docker is required");
    eprintln!("{e}");
    assert!(matches!(e, HarnessError::Docker { .. }), "{e}");
    assert!(e.to_string().contains("REQUIRE_DOCKER"), "{e}");
    std::env::remove_var("REQUIRE_DOCKER");
    std::env::remove_var("DOCKER_HOST");
}
