//! The error type of the harness.

use std::fmt;

/// Everything that can go wrong while providing, controlling or talking to a test server.
///
/// Every message says what happened *and* what to do about it. The payloads are plain
/// strings so the error is `Clone` (the failure of [`ZooKeeper::shared`](crate::ZooKeeper::shared)
/// is remembered and handed to every test of the process). `Debug` prints the same message as
/// `Display`, so `.expect(..)` and `-> Result<(), HarnessError>` tests show it readably.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No way to get a ZooKeeper server was found. `attempts` lists what was tried and why it
    /// did not work.
    #[error(
        "no ZooKeeper server available for tests.\n{attempts}\nTo fix, do ONE of:\n  \
         * point the tests at a running server: ZK_CONNECT=127.0.0.1:2181 cargo test\n  \
         * build the offline Docker image (needs root, Docker, apt): sudo {script}\n  \
         * let Docker pull the official image: docker pull zookeeper:3.9\n  \
         * install a local server the harness can run: sudo apt-get install -y libzookeeper-java openjdk-17-jre-headless"
    )]
    NoServer {
        /// What was tried, one line per attempt.
        attempts: String,
        /// Path of `build-image.sh`.
        script: String,
    },

    /// A Docker operation failed.
    #[error("docker: {action} failed: {reason}. {hint}")]
    Docker {
        /// What was being done.
        action: String,
        /// The error reported by Docker.
        reason: String,
        /// What to do about it.
        hint: String,
    },

    /// Building the offline image with `build-image.sh` failed.
    #[error(
        "building the ZooKeeper image {image} with {script} failed: {reason}. Run `sudo {script}` by \
         hand to see the full output, or set ZK_AUTOBUILD=0 to skip the automatic build"
    )]
    ImageBuild {
        /// The image tag.
        image: String,
        /// The script path.
        script: String,
        /// Why it failed.
        reason: String,
    },

    /// The server was started but did not become ready.
    #[error("ZooKeeper server ({what}) did not become ready within {secs} s: {reason}{log}")]
    Startup {
        /// Which server (image / pid / address).
        what: String,
        /// How long we waited.
        secs: u64,
        /// Why it is considered not ready.
        reason: String,
        /// Tail of the server log, if any (starts with a newline).
        log: String,
    },

    /// A client session could not be established.
    #[error(
        "cannot connect a ZooKeeper client to {addr}: {reason}. Is the server running and \
         reachable? (check `echo srvr | nc {addr_host} {addr_port}`)"
    )]
    Connect {
        /// The connect string.
        addr: String,
        /// The client's error.
        reason: String,
        /// Host part of `addr` (for the hint).
        addr_host: String,
        /// Port part of `addr` (for the hint).
        addr_port: String,
    },

    /// The operation needs a server this harness manages, but the server is external
    /// (`ZK_CONNECT`).
    #[error(
        "{op}() is not possible on an external server (ZK_CONNECT={addr}): the harness does not \
         manage it. Unset ZK_CONNECT to let the harness start its own server, or skip this test \
         when ZooKeeper::backend() is Backend::External"
    )]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The external connect string.
        addr: String,
    },

    /// A four-letter-word command failed.
    #[error(
        "four-letter word '{cmd}' to {addr} failed: {reason}. The server must allow it \
         (4lw.commands.whitelist=* / ZOO_4LW_COMMANDS_WHITELIST=*)"
    )]
    FourLetterWord {
        /// The command.
        cmd: String,
        /// Server address.
        addr: String,
        /// What went wrong.
        reason: String,
    },

    /// Forcing a session to expire failed.
    #[error("expiring session {session} at {addr} failed: {reason}")]
    ExpireSession {
        /// Session id (hex).
        session: String,
        /// Server address.
        addr: String,
        /// What went wrong.
        reason: String,
    },

    /// A local process or file operation failed.
    #[error("{action} failed: {reason}. {hint}")]
    Io {
        /// What was being done.
        action: String,
        /// The OS error.
        reason: String,
        /// What to do about it.
        hint: String,
    },

    /// The fault proxy could not be set up.
    #[error("fault proxy: {action} failed: {reason}")]
    Proxy {
        /// What was being done.
        action: String,
        /// The OS error.
        reason: String,
    },
}

impl fmt::Debug for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl HarnessError {
    pub(crate) fn docker(action: impl fmt::Display, reason: impl fmt::Display) -> Self {
        HarnessError::Docker {
            action: action.to_string(),
            reason: reason.to_string(),
            hint: "Check that the Docker daemon is running and usable by this user \
                   (`docker info`), or set REQUIRE_DOCKER=0 / unset it to allow other backends"
                .to_string(),
        }
    }

    pub(crate) fn io(action: impl fmt::Display, reason: impl fmt::Display, hint: impl fmt::Display) -> Self {
        HarnessError::Io { action: action.to_string(), reason: reason.to_string(), hint: hint.to_string() }
    }

    pub(crate) fn connect(addr: &str, reason: impl fmt::Display) -> Self {
        let (host, port) = match addr.split(',').next().unwrap_or(addr).rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.to_string()),
            None => (addr.to_string(), "2181".to_string()),
        };
        HarnessError::Connect { addr: addr.to_string(), reason: reason.to_string(), addr_host: host, addr_port: port }
    }

    pub(crate) fn proxy(action: impl fmt::Display, reason: impl fmt::Display) -> Self {
        HarnessError::Proxy { action: action.to_string(), reason: reason.to_string() }
    }
}
