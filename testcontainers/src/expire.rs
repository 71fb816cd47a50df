//! Expiring a session on demand.
//!
//! The textbook way (Curator's `KillSession`) is to connect a second client with the same
//! session id and password and close it. With `zookeeper-client` that races: the server moves
//! the session to the second connection and drops the first, the original client reconnects
//! within a millisecond and takes the session back before the second client has finished its
//! handshake (it waits for a ping reply), and so on until the second client times out.
//!
//! So the second client's handshake is done at the wire level instead: a
//! `Connector::with_session(..)` client is pointed at a local listener only to capture its
//! `ConnectRequest` (the password is not accessible through the crate's API), and that request
//! is replayed to the server *together with* a `closeSession` request in a single write. The
//! server handles both before the original client can reconnect.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zookeeper_client::{Client, SessionState};

use crate::HarnessError;

const OP_CLOSE_SESSION: i32 = -11;
const CLOSE_XID: i32 = 1;

async fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = i32::from_be_bytes(len);
    if !(0..=(16 << 20)).contains(&len) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad frame length {len}")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await?;
    Ok(body)
}

/// Captures the `ConnectRequest` frame (length prefix included) a `zookeeper-client` sends to
/// resume `client`'s session.
async fn capture_connect_request(client: &Client, timeout: Duration) -> Result<Vec<u8>, String> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| format!("binding a capture listener: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("capture listener address: {e}"))?;
    let addr = addr.to_string();
    let connect =
        Client::connector().with_session(client.session().clone()).with_session_timeout(timeout).connect(&addr);
    let capture = async {
        let (mut s, _) = listener.accept().await?;
        let body = read_frame(&mut s).await?;
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        Ok::<_, std::io::Error>(frame)
    };
    let result = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            r = capture => r.map_err(|e| format!("capturing the connect request: {e}")),
            r = connect => Err(format!("the capturing client ended unexpectedly: {:?}", r.map(|_| ()))),
        }
    })
    .await;
    result.unwrap_or_else(|_| Err("capturing the connect request timed out".into()))
}

enum Attempt {
    /// The server answered the `closeSession`.
    Closed,
    /// The server said the session does not exist (already expired/closed).
    AlreadyGone,
    /// Lost a race or a transient error; try again.
    Retry(String),
}

async fn close_once(addr: &str, connect_frame: &[u8]) -> Attempt {
    let fut = async {
        let mut s = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => return Attempt::Retry(format!("connect: {e}")),
        };
        let _ = s.set_nodelay(true);
        let mut out = connect_frame.to_vec();
        out.extend_from_slice(&8i32.to_be_bytes());
        out.extend_from_slice(&CLOSE_XID.to_be_bytes());
        out.extend_from_slice(&OP_CLOSE_SESSION.to_be_bytes());
        if let Err(e) = s.write_all(&out).await {
            return Attempt::Retry(format!("write: {e}"));
        }
        // ConnectResponse: protocolVersion i32, timeOut i32, sessionId i64, passwd, readOnly.
        let resp = match read_frame(&mut s).await {
            Ok(b) => b,
            Err(e) => return Attempt::Retry(format!("reading the connect response: {e}")),
        };
        if resp.len() < 16 {
            return Attempt::Retry(format!("short connect response ({} bytes)", resp.len()));
        }
        let session = i64::from_be_bytes(resp[8..16].try_into().unwrap_or_default());
        if session == 0 {
            return Attempt::AlreadyGone;
        }
        // ReplyHeader: xid i32, zxid i64, err i32 (skipping pings / notifications).
        loop {
            let reply = match read_frame(&mut s).await {
                Ok(b) => b,
                Err(e) => return Attempt::Retry(format!("reading the close reply: {e}")),
            };
            if reply.len() < 16 {
                continue;
            }
            let xid = i32::from_be_bytes(reply[0..4].try_into().unwrap_or_default());
            let err = i32::from_be_bytes(reply[12..16].try_into().unwrap_or_default());
            if xid == CLOSE_XID {
                return if err == 0 {
                    Attempt::Closed
                } else {
                    Attempt::Retry(format!("closeSession answered with error code {err}"))
                };
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .unwrap_or_else(|_| Attempt::Retry("no answer within 10 s".into()))
}

pub(crate) async fn expire_session(connect_string: &str, client: &Client) -> Result<(), HarnessError> {
    let session = client.session().id();
    let err = |reason: String| HarnessError::ExpireSession {
        session: session.to_string(),
        addr: connect_string.to_string(),
        reason,
    };
    // Only the first host of a connect string; the session is global to the ensemble.
    let addr = connect_string.split(',').next().unwrap_or(connect_string);
    let addr = addr.split('/').next().unwrap_or(addr);

    let timeout = client.session_timeout().clamp(Duration::from_secs(1), Duration::from_secs(60));
    let frame = capture_connect_request(client, timeout).await.map_err(&err)?;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match close_once(addr, &frame).await {
            Attempt::Closed | Attempt::AlreadyGone => break,
            Attempt::Retry(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(err(format!(
                "the server did not close the session within 30 s (last: {last}); is {addr} a \
                 reachable ZooKeeper server?"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The server closed the session (and its connections): give the original client a moment
    // to reconnect and learn it is expired.
    let mut watcher = client.state_watcher();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match client.state() {
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => return,
                _ => {},
            }
            watcher.changed().await;
        }
    })
    .await;
    Ok(())
}
