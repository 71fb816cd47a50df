//! A TCP proxy that injects network faults between a ZooKeeper client and server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), zk_testcontainers::HarnessError> {
//! use zk_testcontainers::{op, FaultProxy, ZooKeeper};
//! let zk = ZooKeeper::shared().await?;
//! let proxy = FaultProxy::start(zk.connect_string()).await?;
//! let client = zk.connector().connect(&proxy.addr()).await.map_err(|e| {
//!     zk_testcontainers::HarnessError::Proxy { action: "connect".into(), reason: e.to_string() }
//! })?;
//! proxy.stall();          // partition: the server will expire the session on its own
//! proxy.stall_upstream(); // asymmetric: the server hears nothing, the client still hears it
//! proxy.pass();           // heal
//! proxy.cut();            // connection loss, session survives
//! proxy.drop_reply_to_next(&[op::CREATE2]); // the next create is applied, its reply is lost
//! # Ok(()) }
//! ```
//!
//! The proxy's tasks run on the tokio runtime that called [`FaultProxy::start`] and stop when
//! the proxy is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::HarnessError;

/// ZooKeeper request type codes (`OpCode`s) for [`FaultProxy::drop_reply_to_next`].
pub mod op {
    /// `create` (old style, no Stat in the reply).
    pub const CREATE: i32 = 1;
    /// `delete`.
    pub const DELETE: i32 = 2;
    /// `getData`.
    pub const GET_DATA: i32 = 4;
    /// `setData`.
    pub const SET_DATA: i32 = 5;
    /// `getChildren2` (children + Stat).
    pub const GET_CHILDREN2: i32 = 12;
    /// `multi` (transaction).
    pub const MULTI: i32 = 14;
    /// `create2` (create returning a Stat; what `zookeeper-client` sends for `create`).
    pub const CREATE2: i32 = 15;
    /// `createContainer`.
    pub const CREATE_CONTAINER: i32 = 19;
    /// `createTTL`.
    pub const CREATE_TTL: i32 = 21;
    /// `exists`.
    pub const EXISTS: i32 = 3;
    /// `getChildren` (without stat).
    pub const GET_CHILDREN: i32 = 8;
    /// `ping`.
    pub const PING: i32 = 11;
    /// `sync`.
    pub const SYNC: i32 = 9;
    /// `removeWatches`.
    pub const REMOVE_WATCHES: i32 = 18;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Stall,
    /// Only client→server is held back; server→client flows.
    StallUp,
}

struct Shared {
    upstream: String,
    mode: watch::Sender<Mode>,
    /// Incremented by `cut()`; connections end when it changes.
    cut: watch::Sender<u64>,
    /// Set on drop; everything ends.
    shutdown: watch::Sender<bool>,
    refuse: AtomicBool,
    drop_ops: Mutex<Option<Vec<i32>>>,
    /// Requests of these op codes are held this long before they (and all after them) go on.
    delay_ops: Mutex<Option<(Vec<i32>, Duration)>>,
    connections: AtomicUsize,
    /// Requests forwarded, by op code.
    requests: Mutex<std::collections::BTreeMap<i32, u64>>,
}

/// A TCP proxy on `127.0.0.1:<ephemeral port>` forwarding to a ZooKeeper server, with switches
/// for network faults. See the [module docs](self).
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("mode", &*self.shared.mode.borrow())
            .field("refuse", &self.shared.refuse.load(Ordering::SeqCst))
            .field("connections", &self.connections())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy forwarding to `upstream` (`"host:port"`; for a connect string only the
    /// first host is used). Must be called inside a tokio runtime, whose tasks then run it.
    pub async fn start(upstream: &str) -> Result<FaultProxy, HarnessError> {
        let upstream =
            upstream.split(',').next().unwrap_or(upstream).split('/').next().unwrap_or(upstream).trim().to_string();
        if upstream.is_empty() {
            return Err(HarnessError::proxy(
                "parsing the upstream address",
                "it is empty; pass ZooKeeper::connect_string()",
            ));
        }
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| HarnessError::proxy("binding 127.0.0.1:0", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::proxy("reading the listener address", e))?;
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::channel(Mode::Pass).0,
            cut: watch::channel(0).0,
            shutdown: watch::channel(false).0,
            refuse: AtomicBool::new(false),
            drop_ops: Mutex::new(None),
            delay_ops: Mutex::new(None),
            requests: Mutex::new(std::collections::BTreeMap::new()),
            connections: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy { addr, shared, accept })
    }

    /// The address clients should connect to, `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Normal forwarding (the default). Data held back by [`FaultProxy::stall`] flows again.
    pub fn pass(&self) {
        self.shared.mode.send_replace(Mode::Pass);
    }

    /// Blackhole: connections stay open, new ones are accepted, but nothing is forwarded in
    /// either direction (bytes wait in socket buffers, like a network partition). The client
    /// soon sees `Disconnected`; the server expires the session after its timeout.
    pub fn stall(&self) {
        self.shared.mode.send_replace(Mode::Stall);
    }

    /// An asymmetric partition: client→server bytes are held back (the server hears nothing
    /// from the client, and expires its session after the timeout), server→client bytes still
    /// flow (replies already due, watch events). [`FaultProxy::pass`] heals it.
    pub fn stall_upstream(&self) {
        self.shared.mode.send_replace(Mode::StallUp);
    }

    /// Closes every current connection, both sides, now. New connections are accepted and
    /// handled per the current mode.
    pub fn cut(&self) {
        self.shared.cut.send_modify(|g| *g += 1);
    }

    /// While `on`, new connections are accepted and closed immediately (existing ones are not
    /// touched; combine with [`FaultProxy::cut`]).
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Arms a one-shot fault: the next client→server request whose type is one of `op_codes`
    /// (see [`op`]) is forwarded to the server, and then its connection is cut before the reply
    /// can reach the client. The request is applied by the server but the client never learns
    /// the outcome (it typically gets `ConnectionLoss`). Re-arming replaces the previous set;
    /// an empty slice disarms.
    pub fn drop_reply_to_next(&self, op_codes: &[i32]) {
        let mut guard = self.shared.drop_ops.lock().unwrap_or_else(|p| p.into_inner());
        *guard = if op_codes.is_empty() { None } else { Some(op_codes.to_vec()) };
    }

    /// Holds every client→server request whose type is one of `op_codes` (see [`op`]) for
    /// `delay` before forwarding it, and with it everything the client sent after it (the order
    /// of a session's requests is kept). The held request's reply, and every later one, comes
    /// `delay` late: a slow link for chosen requests. An empty slice stops delaying.
    pub fn delay_requests(&self, op_codes: &[i32], delay: Duration) {
        let mut guard = self.shared.delay_ops.lock().unwrap_or_else(|p| p.into_inner());
        *guard = if op_codes.is_empty() { None } else { Some((op_codes.to_vec(), delay)) };
    }

    /// Whether a [`FaultProxy::drop_reply_to_next`] is still armed (has not fired yet).
    pub fn drop_reply_armed(&self) -> bool {
        self.shared.drop_ops.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Client requests seen so far, by op code (see [`op`]). Counted as they pass the proxy,
    /// whatever the mode.
    pub fn requests(&self) -> std::collections::BTreeMap<i32, u64> {
        self.shared.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Number of client connections currently open through the proxy.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let client = match accepted {
            Ok((s, _)) => s,
            Err(_) => {
                // e.g. EMFILE: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            },
        };
        if shared.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        tokio::spawn(handle_connection(client, shared.clone()));
    }
}

/// Decrements the connection count when both directions are done.
struct ConnGuard(Arc<Shared>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Open,
    /// The armed request with this xid was forwarded: nothing more goes to the client; the
    /// connection is cut as soon as the server's reply to it arrived (so it surely was
    /// applied) and swallowed.
    ReplyDropped {
        xid: i32,
    },
    Closed,
}

impl ConnState {
    fn dropped_xid(self) -> Option<i32> {
        match self {
            ConnState::ReplyDropped { xid } => Some(xid),
            _ => None,
        }
    }
}

/// Per-connection control shared by the two directions.
struct Conn {
    shared: Arc<Shared>,
    state: watch::Sender<ConnState>,
    cut_generation: u64,
}

impl Conn {
    /// Resolves when this connection must end (cut, shutdown, or the other direction ended).
    async fn ended(&self) {
        let mut cut = self.shared.cut.subscribe();
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut state = self.state.subscribe();
        let gen = self.cut_generation;
        tokio::select! {
            _ = cut.wait_for(|g| *g != gen) => {}
            _ = shutdown.wait_for(|s| *s) => {}
            _ = state.wait_for(|s| *s == ConnState::Closed) => {}
        }
    }

    /// Resolves once the proxy is in pass mode.
    async fn passing(&self) {
        let mut mode = self.shared.mode.subscribe();
        let _ = mode.wait_for(|m| *m == Mode::Pass).await;
    }

    /// Resolves once server→client bytes may flow.
    async fn passing_down(&self) {
        let mut mode = self.shared.mode.subscribe();
        let _ = mode.wait_for(|m| *m == Mode::Pass || *m == Mode::StallUp).await;
    }

    /// Resolves once an armed request was sent on this connection; returns its xid.
    async fn reply_dropped(&self) -> i32 {
        let mut state = self.state.subscribe();
        let xid = state.wait_for(|s| s.dropped_xid().is_some()).await.map(|s| s.dropped_xid());
        match xid {
            Ok(Some(xid)) => xid,
            _ => std::future::pending().await,
        }
    }

    fn close(&self) {
        self.state.send_replace(ConnState::Closed);
    }
}

async fn handle_connection(client: TcpStream, shared: Arc<Shared>) {
    shared.connections.fetch_add(1, Ordering::SeqCst);
    let guard = Arc::new(ConnGuard(shared.clone()));
    let cut_generation = *shared.cut.borrow();
    let conn = Arc::new(Conn { shared: shared.clone(), state: watch::channel(ConnState::Open).0, cut_generation });

    let server = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(shared.upstream.as_str())) => match r {
            Ok(Ok(s)) => s,
            _ => return, // upstream unreachable: close the client
        },
        _ = conn.ended() => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();

    let up = tokio::spawn(client_to_server(client_r, server_w, conn.clone(), guard.clone()));
    let down = tokio::spawn(server_to_client(server_r, client_w, conn.clone(), guard));
    let _ = up.await;
    let _ = down.await;
}

/// Reads from `r` unless the connection ends; `None` on end/EOF/error.
async fn read_some<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8], conn: &Conn) -> Option<usize> {
    tokio::select! {
        n = r.read(buf) => match n {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        _ = conn.ended() => None,
    }
}

/// Waits for pass mode, then writes; `false` if the connection ended meanwhile or failed.
async fn forward<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8], conn: &Conn) -> bool {
    forward_dir(w, data, conn, false).await
}

async fn forward_dir<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8], conn: &Conn, down: bool) -> bool {
    tokio::select! {
        _ = async { if down { conn.passing_down().await } else { conn.passing().await } } => {}
        _ = conn.ended() => return false,
    }
    tokio::select! {
        r = w.write_all(data) => r.is_ok(),
        _ = conn.ended() => false,
    }
}

const MAX_FRAME: usize = 64 << 20;

/// Splits ZooKeeper frames (4-byte big-endian length + body) off a byte stream.
struct Framer {
    pending: Vec<u8>,
    /// Not ZooKeeper framing (e.g. a four-letter word): pass bytes through unparsed.
    raw: bool,
    /// The first frame of each direction (ConnectRequest / ConnectResponse) has no header.
    first: bool,
}

impl Framer {
    fn new() -> Self {
        Framer { pending: Vec::new(), raw: false, first: true }
    }

    /// Length of the next complete frame in `pending[at..]`, if there is one.
    fn next_len(&mut self, at: usize) -> Option<usize> {
        let head = &self.pending[at..];
        if self.raw || head.len() < 4 {
            return None;
        }
        let len = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        if len < 0 || len as usize > MAX_FRAME {
            self.raw = true;
            return None;
        }
        let total = 4 + len as usize;
        (head.len() >= total).then_some(total)
    }
}

/// `(xid, type)` of a request frame / `xid` of a reply frame, from the header after the length.
fn header_i32(frame: &[u8], offset: usize) -> Option<i32> {
    frame.get(4 + offset..8 + offset).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

async fn client_to_server(
    mut client_r: tokio::net::tcp::OwnedReadHalf,
    mut server_w: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Conn>,
    _guard: Arc<ConnGuard>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut framer = Framer::new();
    'outer: loop {
        // Nothing is read while stalled: bytes wait in the socket buffers.
        tokio::select! {
            _ = conn.passing() => {}
            _ = conn.ended() => break,
        }
        let Some(n) = read_some(&mut client_r, &mut buf, &conn).await else {
            break;
        };
        framer.pending.extend_from_slice(&buf[..n]);
        // Forward complete frames, checking each request against the armed op codes.
        let mut consumed = 0;
        while let Some(total) = framer.next_len(consumed) {
            let frame = &framer.pending[consumed..consumed + total];
            let is_first = std::mem::replace(&mut framer.first, false);
            let armed_xid = if is_first {
                None
            } else {
                match (header_i32(frame, 0), header_i32(frame, 4)) {
                    (Some(xid), Some(op)) => {
                        *conn.shared.requests.lock().unwrap_or_else(|p| p.into_inner()).entry(op).or_default() += 1;
                        let mut armed = conn.shared.drop_ops.lock().unwrap_or_else(|p| p.into_inner());
                        if armed.as_ref().is_some_and(|ops| ops.contains(&op)) {
                            *armed = None;
                            Some(xid)
                        } else {
                            None
                        }
                    },
                    _ => None,
                }
            };
            let delay = if is_first {
                None
            } else {
                header_i32(frame, 4).and_then(|op| {
                    let delayed = conn.shared.delay_ops.lock().unwrap_or_else(|p| p.into_inner());
                    delayed.as_ref().filter(|(ops, _)| ops.contains(&op)).map(|(_, delay)| *delay)
                })
            };
            if let (Some(delay), None) = (delay, armed_xid) {
                // Everything before the delayed request goes on now; it and what follows wait.
                let before: Vec<u8> = framer.pending.drain(..consumed).collect();
                if !before.is_empty() && !forward(&mut server_w, &before, &conn).await {
                    break 'outer;
                }
                consumed = 0;
                tokio::select! {
                    () = tokio::time::sleep(delay) => {},
                    () = conn.ended() => break 'outer,
                }
                let frame: Vec<u8> = framer.pending.drain(..total).collect();
                if !forward(&mut server_w, &frame, &conn).await {
                    break 'outer;
                }
                continue;
            }
            if let Some(xid) = armed_xid {
                let before = framer.pending[..consumed].to_vec();
                let frame = frame.to_vec();
                if !before.is_empty() && !forward(&mut server_w, &before, &conn).await {
                    break 'outer;
                }
                // Stop the reply path *before* the server can answer, then send the request.
                conn.state.send_replace(ConnState::ReplyDropped { xid });
                let _ = forward(&mut server_w, &frame, &conn).await;
                let _ = server_w.flush().await;
                // Nothing more from the client; server_to_client ends the connection once
                // the reply has arrived.
                conn.ended().await;
                return;
            }
            consumed += total;
        }
        let data: Vec<u8> =
            if framer.raw { std::mem::take(&mut framer.pending) } else { framer.pending.drain(..consumed).collect() };
        if !data.is_empty() && !forward(&mut server_w, &data, &conn).await {
            break;
        }
    }
    conn.close();
}

async fn server_to_client(
    mut server_r: tokio::net::tcp::OwnedReadHalf,
    mut client_w: tokio::net::tcp::OwnedWriteHalf,
    conn: Arc<Conn>,
    _guard: Arc<ConnGuard>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut framer = Framer::new();
    let dropped_xid = loop {
        if let Some(xid) = conn.state.borrow().dropped_xid() {
            break xid;
        }
        tokio::select! {
            _ = conn.passing_down() => {}
            _ = conn.ended() => { conn.close(); return; }
            xid = conn.reply_dropped() => break xid,
        }
        let n = tokio::select! {
            n = read_some(&mut server_r, &mut buf, &conn) => n,
            xid = conn.reply_dropped() => break xid,
        };
        let Some(n) = n else {
            conn.close();
            return;
        };
        framer.pending.extend_from_slice(&buf[..n]);
        // Bytes read after the armed request was sent may hold its reply: never forward them.
        if let Some(xid) = conn.state.borrow().dropped_xid() {
            break xid;
        }
        let mut consumed = 0;
        while let Some(total) = framer.next_len(consumed) {
            framer.first = false;
            consumed += total;
        }
        let data: Vec<u8> =
            if framer.raw { std::mem::take(&mut framer.pending) } else { framer.pending.drain(..consumed).collect() };
        if !data.is_empty() && !forward_dir(&mut client_w, &data, &conn, true).await {
            conn.close();
            return;
        }
    };

    // An armed request was sent: swallow everything from the server until the reply to it
    // (same xid) arrived — proof that the server applied it — then cut both sides.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut consumed = 0;
            while let Some(total) = framer.next_len(consumed) {
                let frame = &framer.pending[consumed..consumed + total];
                let is_first = std::mem::replace(&mut framer.first, false);
                if !is_first && header_i32(frame, 0) == Some(dropped_xid) {
                    return;
                }
                consumed += total;
            }
            framer.pending.drain(..consumed);
            if framer.raw {
                return;
            }
            match server_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => framer.pending.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let _ = client_w.shutdown().await;
    drop(client_w);
    conn.close();
}
