//! Small helpers: the harness's background runtime, ports, 4lw, readiness, locks.

use std::future::Future;
use std::net::TcpListener as StdTcpListener;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::HarnessError;

/// A multi-threaded runtime owned by the harness, on which all Docker and process management
/// runs. Test runtimes come and go (every `#[tokio::test]` has its own), but the shared server
/// and the Docker client's connection pool must outlive them.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, HarnessError> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("zk-testcontainers")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| {
        HarnessError::io(
            "creating the harness's tokio runtime",
            e,
            "the process is probably out of threads or file descriptors",
        )
    })
}

/// Runs `fut` on the harness runtime and awaits it from any runtime.
pub(crate) async fn on_bg<F, T>(fut: F) -> Result<T, HarnessError>
where
    F: Future<Output = Result<T, HarnessError>> + Send + 'static,
    T: Send + 'static,
{
    runtime()?.spawn(fut).await.map_err(|e| {
        HarnessError::io(
            "a harness background task",
            e,
            "this is a bug in zk-testcontainers (the task panicked or was cancelled)",
        )
    })?
}

/// Runs `fut` on the harness runtime and blocks the current thread until it is done (or
/// `timeout` passed). For `Drop` implementations; never call this on a harness runtime thread.
pub(crate) fn block_on_bg<F>(fut: F, timeout: Duration)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Ok(rt) = runtime() else { return };
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    rt.spawn(async move {
        fut.await;
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(timeout);
}

/// Picks a currently free TCP port on 127.0.0.1 (bind to port 0, read it, release it).
pub(crate) fn free_port() -> Result<u16, HarnessError> {
    let l = StdTcpListener::bind(("127.0.0.1", 0)).map_err(|e| {
        HarnessError::io("binding 127.0.0.1:0 to find a free port", e, "check that the loopback interface is up")
    })?;
    let port = l.local_addr().map_err(|e| HarnessError::io("reading a bound socket's address", e, "retry"))?.port();
    Ok(port)
}

/// Sends a four-letter word and returns the full response.
pub(crate) async fn four_letter_word(addr: &str, cmd: &str, timeout: Duration) -> Result<String, HarnessError> {
    let err = |reason: String| HarnessError::FourLetterWord { cmd: cmd.to_string(), addr: addr.to_string(), reason };
    if cmd.len() != 4 || !cmd.is_ascii() {
        return Err(err("a four-letter word has exactly 4 ASCII letters".into()));
    }
    // Only the first host of a connect string.
    let host = addr.split(',').next().unwrap_or(addr);
    let host = host.split('/').next().unwrap_or(host);
    let fut = async {
        let mut s = TcpStream::connect(host).await.map_err(|e| err(format!("connect: {e}")))?;
        s.write_all(cmd.as_bytes()).await.map_err(|e| err(format!("write: {e}")))?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map_err(|e| err(format!("read: {e}")))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| err(format!("no answer within {} ms", timeout.as_millis())))?
}

/// Waits until the server at `addr` serves requests (`srvr` reports a `Mode:`), or until the
/// deadline. Returns the last observation as the error.
pub(crate) async fn wait_serving(addr: &str, deadline: Instant) -> Result<(), String> {
    loop {
        let last = match four_letter_word(addr, "srvr", Duration::from_secs(2)).await {
            Ok(s) if s.contains("Mode:") => return Ok(()),
            Ok(s) if s.is_empty() => "srvr: empty answer".to_string(),
            Ok(s) => format!("srvr: {}", s.trim()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Is a process with this pid alive (on this host / pid namespace)?
pub(crate) fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The host name (used to scope container labels to this machine / pid namespace).
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// An exclusive `flock(2)` on a file, released on drop.
pub(crate) struct FileLock {
    file: std::fs::File,
}

impl FileLock {
    /// Blocks until the lock is acquired. Call from a blocking context.
    pub(crate) fn acquire(path: &Path) -> Result<FileLock, HarnessError> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| {
            HarnessError::io(
                format!("opening lock file {}", path.display()),
                e,
                "make sure the temp directory is writable (or remove a stale lock file owned by another user)",
            )
        })?;
        loop {
            // SAFETY: valid fd owned by `file`.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if r == 0 {
                return Ok(FileLock { file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(HarnessError::io(
                    format!("flock({})", path.display()),
                    e,
                    "the file system of the temp directory must support flock",
                ));
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: valid fd owned by `self.file`.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// An environment variable that is set and not empty.
pub(crate) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Last `n` lines of a text.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}
