//! `Error::Connect` says why no session could be established, with the cause in `source()`.

use std::error::Error as _;
use std::time::Duration;

use zk_recipes::{Error, ManagedClient};

/// Nobody listens on the port: the error says the connection was refused, naming the host, and
/// carries the I/O error as its source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_named_as_such() {
    // A port nobody listens on, held for the whole test.
    let (_held, port) = crate::common::refusing_port();
    let hosts = format!("127.0.0.1:{port}/app");
    let err = ManagedClient::builder(&hosts).connect_timeout(Duration::from_secs(1)).connect().await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(message.contains(&format!("127.0.0.1:{port}: cannot connect")), "{message}");
    assert!(message.to_lowercase().contains("refused"), "{message}");
    let source = err.source().expect("the cause is the source");
    let io = source.downcast_ref::<std::sync::Arc<std::io::Error>>().expect("an I/O error");
    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// A server that accepts TCP connections but never answers: the hosts are reachable, so the
/// error says that instead of blaming the network, and has no I/O source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_not_blamed_on_the_network() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hosts = listener.local_addr().unwrap().to_string();
    let _accepting = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(64) {
            held.push(stream);
        }
    });
    let err = ManagedClient::builder(&hosts).connect_timeout(Duration::from_secs(1)).connect().await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(message.contains("accept TCP connections"), "{message}");
    assert!(err.source().is_none(), "{:?}", err.source());
}
