//! `zklock`: flock(1) for a ZooKeeper ensemble, built on `zk-recipes`.
//!
//! `zklock run LOCK_PATH -- COMMAND...` takes a fair `InterProcessMutex` (Curator-compatible), runs
//! the command with the lock's fencing token in its environment, forwards SIGINT/SIGTERM to it,
//! and releases the lock when it exits, exiting with its status. When the lock is lost while the
//! command runs, the command gets SIGTERM (SIGKILL after `--kill-after`) and `zklock` exits with
//! [`exit::LOST`]. A supervisor between `zklock` and the command ([`supervisor`]) sees to it that
//! nothing the command started outlives the lock, `zklock`'s death by SIGKILL included.
//! `zklock status LOCK_PATH` lists the holder and the waiters.
//!
//! The path through `run`, top to bottom:
//!
//! 1. Parse arguments (usage errors exit [`exit::USAGE`]), validate the lock path and read the
//!    auth file before anything touches the network.
//! 2. Connect a `ManagedClient` (bounded by `--connect-timeout`; [`exit::UNAVAILABLE`]).
//! 3. Acquire: `--nonblock` tries once (conflict exit code), `--timeout` bounds the wait
//!    ([`exit::TIMEOUT`]); a progress line on a terminal while waiting; SIGINT/SIGTERM while
//!    waiting give the queued node up before exiting.
//! 4. Run the command under the supervisor; watch `guard.lost()` beside it.
//! 5. Once the supervisor has exited (nothing the command started is left), release (confirmed
//!    by ZooKeeper) and exit with the command's status.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use zk_recipes::{Error, InterProcessMutex, LeaderLatch, LockGuard, ManagedClient, Participant};

mod supervisor;

/// Exit codes (the command's own status when it ran; these otherwise).
mod exit {
    /// The lock is taken (`--nonblock`); `--conflict-exit-code` changes it.
    pub const CONFLICT: u8 = 1;
    /// Bad usage: unknown option, invalid lock path, unreadable auth file (`EX_USAGE`).
    pub const USAGE: u8 = 64;
    /// Cannot connect to ZooKeeper, or its chroot does not exist (`EX_UNAVAILABLE`).
    pub const UNAVAILABLE: u8 = 69;
    /// Any other ZooKeeper error (`EX_SOFTWARE`).
    pub const ERROR: u8 = 70;
    /// `--timeout` passed before the lock was granted (`EX_TEMPFAIL`).
    pub const TIMEOUT: u8 = 75;
    /// The lock was lost while the command ran; the command was stopped.
    pub const LOST: u8 = 76;
    /// ZooKeeper's ACLs refused us (`EX_NOPERM`).
    pub const NOPERM: u8 = 77;
    /// `status`: the lock path does not exist — mistyped, never used, or removed by the server
    /// once its last lock node went (`EX_NOINPUT`).
    pub const NO_SUCH_PATH: u8 = 66;
    /// The command was found but could not be run.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// `zklock run --help`: every status `run` can exit with.
macro_rules! run_exit_codes {
    () => {
        "\
Exit status:
  the command's  when it ran (128+N if it was killed by signal N)
  1    the lock is taken and --nonblock was given (see --conflict-exit-code)
  64   bad usage: unknown option, invalid lock path, unreadable auth file
  69   cannot connect to ZooKeeper (within --connect-timeout), or its chroot does not exist
  70   any other ZooKeeper error
  75   --timeout passed before the lock was granted
  76   the lock was lost while the command (or what it left running) ran — the command and
       everything it started got SIGTERM, then SIGKILL — or before it started (it was not
       started); or zklock, stopped or starved, could not renew its supervisor's lease on the
       lock in time, and the supervisor killed them at the lock's loss deadline
  77   ZooKeeper's ACLs refused us
  126  the command could not be executed
  127  the command was not found
  128+N  zklock got signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT) while waiting for the lock;
       while the command runs, these are forwarded to its process group
"
    };
}

/// `zklock leader --help`: every status `leader` can exit with (it runs until asked to stop).
macro_rules! leader_exit_codes {
    () => {
        "\
Exit status (zklock leader runs until it is asked to stop or cannot go on):
  the command's  SIGINT, SIGTERM or SIGQUIT arrived while the command ran: forwarded, and zklock
       exited with the command's status once it ended (128+N if it was killed by signal N)
  64   bad usage: unknown option, invalid election path, unreadable auth file
  69   cannot connect to ZooKeeper (within --connect-timeout), or its chroot does not exist
  70   any other ZooKeeper error
  77   ZooKeeper's ACLs refused us
  126  zklock's supervisor could not be started
  128+N  zklock got signal N (SIGINT, SIGTERM, SIGQUIT) while not leading, between runs, or as
       the leadership was lost
A lost leadership, a command that exits by itself (whatever its status, 126 and 127 included)
and SIGHUP do not end zklock leader: it stops the command or forwards SIGHUP to it, and runs it
again when it leads (SIGHUP while no command runs is ignored).
"
    };
}

/// `zklock status --help`.
macro_rules! status_exit_codes {
    () => {
        "\
Exit status:
  0    listed (also an existing lock path nobody holds: free)
  64   bad usage: unknown option, invalid lock path, unreadable auth file
  66   no such lock path (mistyped, never used, or removed once its last node went)
  69   cannot connect to ZooKeeper (within --connect-timeout), or its chroot does not exist
  70   any other ZooKeeper error
  77   ZooKeeper's ACLs refused us
"
    };
}

/// What every command's help ends with.
macro_rules! environment {
    () => {
        "\
Environment:
  ZK_CONNECT          default for --connect
  ZKLOCK_AUTH         digest credentials user:password (never pass secrets in argv)
  ZKLOCK_AUTH_FILE    default for --auth-file
  ZKLOCK_CONTAINMENT  default for --containment (run, leader)

The command gets ZKLOCK_PATH (the lock path), ZKLOCK_NODE (our lock node) and
ZKLOCK_FENCING_TOKEN (a number, larger for every later holder of the lock)."
    };
}

/// flock(1) for a ZooKeeper ensemble: run a command under a fair distributed lock.
#[derive(Parser, Debug)]
#[command(name = "zklock", version, after_help = environment!())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire the lock, run a command while holding it, release it when the command exits.
    ///
    /// Waits in a fair queue (Curator-compatible `InterProcessMutex`, so Curator clients contend
    /// on the same path). If the lock is lost while the command runs — the session expired, the
    /// connection to ZooKeeper stalled or was lost, someone deleted our node — the command gets
    /// SIGTERM, SIGKILL after --kill-after, and zklock exits with 76. Nothing the command starts
    /// (setsid and double-forked processes included) outlives the lock: it is all stopped when
    /// the lock is lost, when the command exits, and when zklock dies, even by SIGKILL.
    #[command(after_help = concat!(run_exit_codes!(), "\n", environment!()))]
    Run(RunArgs),
    /// Run a command while this process is the leader of an election, for ever: one active
    /// instance of a service among many.
    ///
    /// Joins the election (a Curator-compatible `LeaderLatch`: Curator's `LeaderLatch` on the same
    /// path is a peer) and starts the command once elected, with ZKLOCK_PATH, ZKLOCK_NODE and
    /// ZKLOCK_FENCING_TOKEN. If leadership is lost, the command and everything it started are
    /// stopped exactly as `run` stops them, and zklock joins the election again (on a new session
    /// if the old one expired) and restarts the command when it leads again. If the command exits
    /// by itself, zklock steps down, waits --restart-delay and joins again. SIGINT, SIGTERM and
    /// SIGQUIT are forwarded to a running command, and zklock then exits with its status (128+N
    /// while not leading). SIGHUP is forwarded to a running command (to reload, or to be
    /// restarted if it exits) and otherwise ignored: it never ends zklock leader.
    #[command(after_help = concat!(leader_exit_codes!(), "\n", environment!()))]
    Leader(LeaderArgs),
    /// Show who holds a lock (or leads an election) and who waits, in queue order.
    #[command(after_help = concat!(status_exit_codes!(), "\n", environment!()))]
    Status(StatusArgs),
}

#[derive(Args, Debug)]
struct Connection {
    /// ZooKeeper connect string: host:port, comma-separated for an ensemble, optionally ending in
    /// a /chroot.
    #[arg(long, env = "ZK_CONNECT", default_value = "127.0.0.1:2181")]
    connect: String,
    /// Give up connecting after this long (e.g. 500ms, 10s, 2m).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    connect_timeout: Duration,
    /// The ZooKeeper session timeout to ask for. A lost lock is noticed within about 0.4 of it.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    session_timeout: Duration,
    /// A file holding digest credentials `user:password` (instead of ZKLOCK_AUTH).
    #[arg(long, env = "ZKLOCK_AUTH_FILE")]
    auth_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    connection: Connection,
    /// Wait at most this long for the lock, then exit 75.
    #[arg(short = 'w', long, value_parser = parse_duration, conflicts_with = "nonblock")]
    timeout: Option<Duration>,
    /// Do not wait: if the lock is taken, exit with the conflict exit code.
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// The exit status when the lock is taken and --nonblock was given.
    #[arg(short = 'E', long, default_value_t = exit::CONFLICT)]
    conflict_exit_code: u8,
    /// No progress line while waiting (it is shown only when stderr is a terminal anyway).
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    job: JobArgs,
}

/// What `run` and `leader` run: a command under a lock path.
#[derive(Args, Debug)]
struct JobArgs {
    /// Text stored in our node, shown by `zklock status` (for `leader`: the participant id)
    /// [default: hostname:pid].
    #[arg(long)]
    data: Option<String>,
    /// After the lock (or leadership) is lost, how long the command gets between SIGTERM and
    /// SIGKILL — SIGKILL comes at the lock's loss deadline if that is sooner (also what the
    /// command left running when it exits gets between the two, before the release) [default: a
    /// quarter of the session timeout].
    #[arg(long, value_parser = parse_duration)]
    kill_after: Option<Duration>,
    /// How the command and everything it starts are kept from outliving the lock (the README's
    /// *Containment* table): `pid-namespace` (the kernel kills everything when the supervisor
    /// dies, however it dies; inside, the command sees the namespace's PIDs: `$$` and `$!` are
    /// not the host's), `trace` (the supervisor traces every process the command starts, and the
    /// kernel kills them when it dies; PIDs are the host's, but nothing inside can be traced by a
    /// debugger), `subreaper` (PIDs as usual; covers zklock killed on its own, not zklock and its
    /// supervisor killed together), `auto` (the first of these three the system allows).
    #[arg(long, value_enum, env = "ZKLOCK_CONTAINMENT", default_value = "auto")]
    containment: ContainmentArg,
    /// Say on stderr which containment is in force.
    #[arg(long)]
    verbose: bool,
    /// The lock path (for `leader`: the election path), e.g. /locks/nightly-backup.
    lock_path: String,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// `--containment`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ContainmentArg {
    Auto,
    PidNamespace,
    Trace,
    Subreaper,
}

impl ContainmentArg {
    /// As the supervisor takes it (its third argument).
    fn as_arg(self) -> &'static str {
        match self {
            ContainmentArg::Auto => supervisor::CONTAIN_AUTO,
            ContainmentArg::PidNamespace => supervisor::CONTAIN_PID_NAMESPACE,
            ContainmentArg::Trace => supervisor::CONTAIN_TRACE,
            ContainmentArg::Subreaper => supervisor::CONTAIN_SUBREAPER,
        }
    }
}

#[derive(Args, Debug)]
struct LeaderArgs {
    #[command(flatten)]
    connection: Connection,
    /// After the command exits by itself while leading, how long to wait before joining the
    /// election again (it is restarted once this process leads again).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    restart_delay: Duration,
    #[command(flatten)]
    job: JobArgs,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print JSON: {"lock_path", "kind": "lock" or "election", "participants": [{"position",
    /// "node", "sequence", "data", "session", "holder", "role": "holder", "leader" or
    /// "waiting"}, ...] (holder or leader first), "containment_here": what `--containment auto`
    /// gives a command started on this host}.
    #[arg(long)]
    json: bool,
    /// The lock path.
    lock_path: String,
}

/// A failure that ends zklock: a one-line message and an exit status.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }

    /// The exit status and message for a library error.
    fn from_lock(err: Error) -> Failure {
        let code = match &err {
            Error::InvalidPath { .. } | Error::TooLarge { .. } => exit::USAGE,
            Error::Connect { .. } | Error::ChrootMissing { .. } => exit::UNAVAILABLE,
            Error::NoAuth { .. } => exit::NOPERM,
            _ => exit::ERROR,
        };
        Failure::new(code, err.to_string())
    }
}

fn main() -> ExitCode {
    // The supervisor `run` starts between itself and the command: single-threaded, no runtime.
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == supervisor::ARG) {
        return supervisor::main(&args[2..]);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { exit::USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("zklock: cannot start: {err}");
            return ExitCode::from(exit::ERROR);
        },
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Leader(args) => leader(args).await,
            Command::Status(args) => status(args).await,
        }
    });
    // Background work (the session's close) must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("zklock: {}", failure.message);
            ExitCode::from(failure.code)
        },
    }
}

/// Digest credentials from ZKLOCK_AUTH or the auth file (never from argv).
fn auth(connection: &Connection) -> Result<Option<Vec<u8>>, Failure> {
    if let Some(file) = &connection.auth_file {
        let text = std::fs::read(file)
            .map_err(|err| Failure::new(exit::USAGE, format!("cannot read the auth file {}: {err}", file.display())))?;
        let trimmed = text.trim_ascii().to_vec();
        if !trimmed.contains(&b':') {
            return Err(Failure::new(exit::USAGE, format!("the auth file {} must hold user:password", file.display())));
        }
        return Ok(Some(trimmed));
    }
    match std::env::var_os("ZKLOCK_AUTH") {
        Some(value) if !value.is_empty() => {
            let bytes = value.into_encoded_bytes();
            if !bytes.contains(&b':') {
                return Err(Failure::new(exit::USAGE, "ZKLOCK_AUTH must be user:password"));
            }
            Ok(Some(bytes))
        },
        _ => Ok(None),
    }
}

async fn connect(connection: &Connection) -> Result<ManagedClient, Failure> {
    let mut builder = ManagedClient::builder(connection.connect.as_str())
        .session_timeout(connection.session_timeout)
        .connect_timeout(connection.connect_timeout);
    if let Some(credentials) = auth(connection)? {
        builder = builder.auth("digest", credentials);
    }
    builder.connect().await.map_err(Failure::from_lock)
}

/// `hostname:pid`, what `zklock status` shows for our node by default.
fn default_node_data() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

async fn run(args: RunArgs) -> Result<u8, Failure> {
    let (zk, mut signals) = match open(&args.connection, &args.job.lock_path, true).await? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    let outcome = run_connected(&args, &zk, &mut signals).await;
    close(&zk, &args.connection, &outcome).await;
    outcome
}

/// Steps 1 and 2: validates the path and the credentials, installs the signal handlers and
/// connects; a signal while connecting ends zklock (`Err(128 + N)` inside).
async fn open(
    connection: &Connection,
    path: &str,
    hangup_ends: bool,
) -> Result<std::result::Result<(ManagedClient, Signals), u8>, Failure> {
    zk_recipes::validate_lock_path(path).map_err(Failure::from_lock)?;
    auth(connection)?;
    let mut signals = Signals::install(hangup_ends)?;
    tokio::select! {
        zk = connect(connection) => Ok(Ok((zk?, signals))),
        signal = signals.recv_idle() => Ok(Err(128 + signal as u8)),
    }
}

/// Nothing of our session stays behind: anything left is deleted at once, not a session timeout
/// after we exit. Not after a lost lock: the session is in trouble then (its nodes go with it),
/// and the exit must not wait for it. Bounded: the server may be unreachable.
async fn close(zk: &ManagedClient, connection: &Connection, outcome: &Result<u8, Failure>) {
    if !matches!(outcome, Ok(exit::LOST)) && zk.state() != zk_recipes::ConnectionState::Suspended {
        let bound = connection.connect_timeout.min(connection.session_timeout / 4);
        let _ = tokio::time::timeout(bound, zk.close()).await;
    }
}

async fn run_connected(args: &RunArgs, zk: &ManagedClient, signals: &mut Signals) -> Result<u8, Failure> {
    warn_kill_after(&args.connection, &args.job);
    let data = args.job.data.clone().unwrap_or_else(default_node_data);
    let mutex = InterProcessMutex::builder(zk, args.job.lock_path.as_str())
        .node_data(data.clone())
        .build()
        .map_err(Failure::from_lock)?;

    let progress = Progress::new(!args.quiet && std::io::stderr().is_terminal());
    let acquire = async {
        if args.nonblock {
            return mutex.try_acquire().await.map(|guard| guard.ok_or(Waited::Conflict));
        }
        match args.timeout {
            Some(timeout) => mutex.acquire_timeout(timeout).await.map(|guard| guard.ok_or(Waited::TimedOut)),
            None => mutex.acquire().await.map(Ok),
        }
    };
    let mut acquire = Box::pin(acquire);
    let acquired = loop {
        let signal = tokio::select! {
            acquired = &mut acquire => break acquired,
            // Reports until the acquire ends (it returns only if it cannot report at all).
            () = progress.report(&mutex, zk) => continue,
            signal = signals.recv_idle() => signal,
        };
        // Dropping the acquire sends the deletion of our queued node; wait for it to be done.
        drop(acquire);
        progress.finish();
        wait_until_gone(|| mutex.participants(), zk).await;
        return Ok(128 + signal as u8);
    };
    progress.finish();
    drop(acquire);
    let guard = match acquired {
        Ok(Ok(guard)) => guard,
        Ok(Err(Waited::Conflict)) => return Ok(args.conflict_exit_code),
        Ok(Err(Waited::TimedOut)) => {
            // The timed-out acquire deletes our queued node in the background: see it done.
            wait_until_gone(|| mutex.participants(), zk).await;
            return Err(Failure::new(exit::TIMEOUT, format!("timed out waiting for {}", args.job.lock_path)));
        },
        Err(err) => {
            wait_until_gone(|| mutex.participants(), zk).await;
            return Err(Failure::from_lock(err));
        },
    };
    supervise(&args.connection, &args.job, guard, signals).await.map(run_status)
}

fn warn_kill_after(connection: &Connection, job: &JobArgs) {
    if let Some(kill_after) = job.kill_after {
        if kill_after > connection.session_timeout * 7 / 20 {
            eprintln!(
                "zklock: warning: --kill-after {kill_after:?} is over 0.35 × the session timeout: after a lost lock \
                 the command gets SIGKILL at the lock's loss deadline, before --kill-after ends"
            );
        }
    }
}

/// `leader`: joins the election, runs the command while leading, for ever (see its help).
async fn leader(args: LeaderArgs) -> Result<u8, Failure> {
    let (zk, mut signals) = match open(&args.connection, &args.job.lock_path, false).await? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    let outcome = lead(&args, &zk, &mut signals).await;
    close(&zk, &args.connection, &outcome).await;
    outcome
}

async fn lead(args: &LeaderArgs, zk: &ManagedClient, signals: &mut Signals) -> Result<u8, Failure> {
    warn_kill_after(&args.connection, &args.job);
    let path = &args.job.lock_path;
    let id = args.job.data.clone().unwrap_or_else(default_node_data);
    loop {
        // A started latch per turn: it stays in the election — rejoining by itself after a lost
        // leadership, on the new session after an expiry — until the turn ends, and its close
        // deletes its node before we go on (or exit).
        let latch = LeaderLatch::builder(zk, path.as_str()).id(id.clone()).build().map_err(Failure::from_lock)?;
        latch.start().map_err(Failure::from_lock)?;
        let turn = serve(args, &latch, signals).await;
        step_down(&latch, &args.connection).await;
        match turn? {
            Turn::Exit(code) => return Ok(code),
            Turn::Restart => {},
        }
        tokio::select! {
            () = tokio::time::sleep(args.restart_delay) => {},
            signal = signals.recv_idle() => return Ok(128 + signal as u8),
        }
    }
}

/// How a turn in the election ended.
enum Turn {
    /// Exit with this status (asked to stop).
    Exit(u8),
    /// The command exited by itself while leading: step down, join again after the restart delay.
    Restart,
}

/// One turn of `leader` on a started latch: runs the command whenever the latch leads, until it
/// exits by itself or we are asked to stop.
async fn serve(args: &LeaderArgs, latch: &LeaderLatch, signals: &mut Signals) -> Result<Turn, Failure> {
    let path = &args.job.lock_path;
    loop {
        let leadership = tokio::select! {
            elected = latch.await_leadership() => elected.map_err(Failure::from_lock)?,
            signal = signals.recv_idle() => return Ok(Turn::Exit(128 + signal as u8)),
        };
        eprintln!("zklock: leading {path} (fencing token {}); starting the command", leadership.fencing_token());
        signals.stop_requested = None;
        let ended = match supervise(&args.connection, &args.job, leadership, signals).await {
            Ok(ended) => ended,
            Err(failure) if failure.code == exit::LOST => {
                eprintln!("zklock: {}; the latch rejoins the election", failure.message);
                continue;
            },
            Err(failure) => return Err(failure),
        };
        let code = match ended {
            // Asked to stop (systemd, Ctrl-C): leave, with the command's status.
            Ended::Exited(code) | Ended::Signalled(code) if signals.stop_requested.is_some() => {
                return Ok(Turn::Exit(code))
            },
            // Asked to stop as the leadership was lost: the signal's status, as while not leading.
            Ended::Lost if signals.stop_requested.is_some() => {
                return Ok(Turn::Exit(128 + signals.stop_requested.unwrap_or(libc::SIGTERM) as u8))
            },
            Ended::Lost => {
                eprintln!("zklock: leadership of {path} lost; the command was stopped; the latch rejoins the election");
                continue;
            },
            Ended::Exited(code) | Ended::Signalled(code) => code,
        };
        eprintln!(
            "zklock: the command exited ({code}) while leading {path}; stepped down, joining the election again in {:?}",
            args.restart_delay
        );
        return Ok(Turn::Restart);
    }
}

/// Closes the latch — steps down, its node deleted — waiting for ZooKeeper's confirmation at
/// most `min(T, 5 s)`: beyond that ZooKeeper removes the node with the session.
async fn step_down(latch: &LeaderLatch, connection: &Connection) {
    let bound = connection.session_timeout.min(Duration::from_secs(5));
    match tokio::time::timeout(bound, latch.close()).await {
        Ok(Ok(())) => {},
        Ok(Err(err)) => eprintln!("zklock: leaving the election: {err}"),
        Err(_) => eprintln!("zklock: leaving the election timed out; ZooKeeper removes our node with the session"),
    }
}

enum Waited {
    Conflict,
    TimedOut,
}

/// Whether a participant's node is ours: owned by our current session.
fn is_ours(participant: &Participant, zk: &ManagedClient) -> bool {
    participant.session_id == zk.client().session_id().0
}

/// Waits (3 s at most) until our abandoned node is gone, so that no waiter queues behind a
/// process that left, for the session timeout, when we exit before the background deletion ran.
async fn wait_until_gone<F, Fut>(participants: F, zk: &ManagedClient)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = zk_recipes::Result<Vec<Participant>>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let _ = tokio::time::timeout_at(deadline, async {
        loop {
            match participants().await {
                Ok(participants) if !participants.iter().any(|p| is_ours(p, zk)) => return,
                // Still there, or cannot look (the connection is down): wait and look again.
                Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
}

/// The signals zklock handles itself: forwarded to the command's process group while it runs.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    /// Caught so that Ctrl-Z cannot stop zklock (its session would expire while the command, in
    /// a group of its own, runs on); ignored.
    stop: tokio::signal::unix::Signal,
    /// The last of SIGINT, SIGTERM or SIGQUIT that arrived (since last reset): asked to stop
    /// (SIGHUP is only forwarded).
    stop_requested: Option<i32>,
    /// Whether SIGHUP ends zklock while no command runs (`run`: a terminal hang-up), or is
    /// ignored then (`leader`: a service manager's reload, for the command only).
    hangup_ends: bool,
}

impl Signals {
    fn install(hangup_ends: bool) -> Result<Signals, Failure> {
        let install = |kind: SignalKind| signal(kind).map_err(|err| Failure::new(exit::ERROR, err.to_string()));
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            hangup: install(SignalKind::hangup())?,
            quit: install(SignalKind::quit())?,
            stop: install(SignalKind::from_raw(libc::SIGTSTP))?,
            stop_requested: None,
            hangup_ends,
        })
    }

    /// The next signal to act on (SIGTSTP is swallowed here).
    async fn recv(&mut self) -> i32 {
        let signal = loop {
            tokio::select! {
                _ = self.interrupt.recv() => break libc::SIGINT,
                _ = self.terminate.recv() => break libc::SIGTERM,
                _ = self.hangup.recv() => break libc::SIGHUP,
                _ = self.quit.recv() => break libc::SIGQUIT,
                _ = self.stop.recv() => eprintln!("zklock: ignoring SIGTSTP: a lock holder cannot be suspended"),
            }
        };
        if signal != libc::SIGHUP {
            self.stop_requested = Some(signal);
        }
        signal
    }

    /// The next signal to act on while no command runs: SIGHUP is ignored here unless it ends
    /// zklock (`hangup_ends`).
    async fn recv_idle(&mut self) -> i32 {
        loop {
            let signal = self.recv().await;
            if signal != libc::SIGHUP || self.hangup_ends {
                return signal;
            }
            eprintln!("zklock: ignoring SIGHUP: no command runs (it is forwarded to a running one)");
        }
    }

    /// A signal that already arrived while no command runs, if any (no wait).
    async fn pending(&mut self) -> Option<i32> {
        tokio::select! {
            biased;
            signal = self.recv_idle() => Some(signal),
            () = std::future::ready(()) => None,
        }
    }
}

/// Releases, waiting for ZooKeeper's confirmation at most `min(T, 5 s)`: beyond that ZooKeeper
/// removes the node with the session.
async fn release(guard: LockGuard, connection: &Connection) {
    let bound = connection.session_timeout.min(Duration::from_secs(5));
    match tokio::time::timeout(bound, guard.release()).await {
        Ok(Ok(())) => {},
        Ok(Err(err)) => eprintln!("zklock: releasing the lock: {err}"),
        Err(_) => eprintln!("zklock: releasing the lock timed out; ZooKeeper removes it with the session"),
    }
}

/// How a supervised command ended.
enum Ended {
    /// It exited with this status (what a shell would report) and the lock was released.
    Exited(u8),
    /// The lock was lost while it ran: it and everything it started were stopped.
    Lost,
    /// A signal (N) had arrived when the lock was granted: the command was not started (128+N).
    Signalled(u8),
}

/// The exit status of `run` for how the command ended.
fn run_status(ended: Ended) -> u8 {
    match ended {
        Ended::Exited(status) | Ended::Signalled(status) => status,
        Ended::Lost => exit::LOST,
    }
}

/// Runs the command under the lock: step 4 and 5.
async fn supervise(
    connection: &Connection,
    job: &JobArgs,
    guard: LockGuard,
    signals: &mut Signals,
) -> Result<Ended, Failure> {
    let (program, rest) = job.command.split_first().ok_or_else(|| Failure::new(exit::USAGE, "no command given"))?;
    // A signal that arrived while the lock was being granted, or a hold already lost: the
    // command is not started.
    if let Some(signal) = signals.pending().await {
        release(guard, connection).await;
        return Ok(Ended::Signalled(128 + signal as u8));
    }
    if let zk_recipes::LockState::Lost(reason) = guard.state() {
        return Err(Failure::new(
            exit::LOST,
            format!("lock {} lost before the command started ({reason})", job.lock_path),
        ));
    }
    let kill_after = job.kill_after.unwrap_or(connection.session_timeout / 4);
    // The supervisor's lease (supervisor.rs, *zklock's word*): the hold's loss deadline, renewed
    // below as heartbeats move it. Read after the state check above; a hold lost in between has
    // none (`lost()` below then stops the command at once).
    // The clock is read first: the lease then ends no later than the deadline.
    let lease = |guard: &LockGuard| {
        let now = supervisor::boottime_nanos();
        guard.certain_for().map(|left| now + left.as_nanos() as u64)
    };
    // The command runs under a supervisor, a copy of us (see supervisor.rs for the invariant and
    // its proof): a child subreaper that kills everything the command started when we die (it
    // sees the end of file on the control socket), when we ask (a lost lock) and when the command
    // exits, and exits only once nothing is left, with the command's status.
    // A child subreaper ourselves, so that if the supervisor is killed on its own, what the
    // command started is re-parented to us (not to init) and we can kill it (see below).
    // SAFETY: prctl(2) with integer arguments has no memory effects.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        let err = std::io::Error::last_os_error();
        release(guard, connection).await;
        return Err(Failure::new(exit::ERROR, format!("cannot become a child subreaper: {err}")));
    }
    let (control, theirs) = supervisor::control_pair()
        .map_err(|err| Failure::new(exit::ERROR, format!("cannot start the supervisor: {err}")))?;
    let theirs_fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg0("zklock")
        .arg(supervisor::ARG)
        .arg(theirs_fd.to_string())
        .arg(kill_after.as_millis().to_string())
        .arg(job.containment.as_arg())
        .arg(lease(&guard).unwrap_or(0).to_string())
        .arg("--")
        .arg(program)
        .args(rest)
        .env("ZKLOCK_PATH", &job.lock_path)
        .env("ZKLOCK_NODE", guard.lock_path())
        .env("ZKLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        // Our credentials are not the command's business.
        .env_remove(supervisor::VERBOSE_ENV)
        .env_remove("ZKLOCK_AUTH")
        .env_remove("ZKLOCK_AUTH_FILE")
        // A process group of its own (the command gets another one), so that a Ctrl-C on the
        // terminal reaches the command once, through us. Not killed on drop: a dropped
        // supervisor sees our end of the socket close and kills the command and its descendants,
        // while a killed one could not.
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only calls fcntl(2), which
    // is async-signal-safe: the supervisor's end of the socket survives the exec (ours stays
    // close-on-exec, so it is open in zklock alone).
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(theirs_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if job.verbose {
        command.env(supervisor::VERBOSE_ENV, "1");
    }
    let spawned = command.spawn();
    drop(theirs);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            release(guard, connection).await;
            return Err(Failure::new(exit::CANNOT_EXECUTE, format!("cannot start the supervisor: {err}")));
        },
    };
    // Two-byte messages; a failed write means the supervisor is gone, and its exit tells.
    let send = |message: &[u8]| supervisor::send(&control, message);
    let mut lost = false;
    // Renewed often enough that the lease ends at most T/20 after the deadline it was taken from
    // had moved on: the supervisor stops the command only if we fall that far behind.
    let mut renew = tokio::time::interval(connection.session_timeout / 20);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let status = loop {
        tokio::select! {
            // The supervisor's exit first: one that ended as the loss arrived ran under the lock.
            biased;
            status = child.wait() => break status,
            signal = signals.recv() => send(&[supervisor::FORWARD, signal as u8]),
            _ = renew.tick(), if !lost => {
                if let Some(until) = lease(&guard) {
                    let mut message = [supervisor::RENEW, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                    message[2..].copy_from_slice(&until.to_le_bytes());
                    send(&message);
                }
            },
            reason = guard.lost(), if !lost => {
                lost = true;
                eprintln!(
                    "zklock: lock {} lost ({reason}); stopping the command and everything it started (SIGTERM, \
                     SIGKILL after {kill_after:?})",
                    job.lock_path
                );
                send(&[supervisor::STOP, 0]);
            },
        }
    };
    let status = status.map_err(|err| Failure::new(exit::ERROR, format!("waiting for the command: {err}")))?;
    if std::os::unix::process::ExitStatusExt::signal(&status).is_some() {
        // The supervisor was killed (it exits normally, with the command's status, otherwise):
        // what the command started is ours now; it goes before the lock does.
        let orphans = tokio::task::block_in_place(supervisor::kill_orphans);
        if orphans > 0 {
            eprintln!("zklock: the supervisor was killed; killed {orphans} processes the command had started");
        }
    }
    if !lost {
        if let zk_recipes::LockState::Lost(reason) = guard.state() {
            // Lost while the supervisor ended: the command ran without the lock at the end.
            eprintln!("zklock: lock {} lost ({reason}) while the command ran; it was stopped", job.lock_path);
            drop(guard);
            return Ok(Ended::Lost);
        }
        if supervisor::lease_lapsed(&control) {
            // The supervisor stopped everything at the lock's loss deadline, which we did not
            // move on in time (we were stopped or starved). The hold may have survived (an
            // answer came in once we ran again): given back, confirmed, but the command was
            // stopped as for a lost lock.
            eprintln!(
                "zklock: the command was stopped: zklock could not renew the lock's lease before its loss deadline \
                 (it was stopped or starved)"
            );
            release(guard, connection).await;
            return Ok(Ended::Lost);
        }
    }
    if lost {
        // The supervisor exited: nothing the command started is left.
        drop(guard);
        return Ok(Ended::Lost);
    }
    // Confirmed by ZooKeeper before we exit (bounded), so the next waiter is not held up by us.
    release(guard, connection).await;
    Ok(Ended::Exited(exit_status(status)))
}

/// The status a shell would report for the command.
fn exit_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => exit::ERROR,
    }
}

/// The progress line shown on a terminal while waiting longer than a second.
struct Progress {
    enabled: bool,
    shown: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress { enabled, shown: std::sync::atomic::AtomicBool::new(false) }
    }

    /// Every second after the first, our position in the queue (never returns when enabled).
    async fn report(&self, mutex: &InterProcessMutex, zk: &ManagedClient) {
        if !self.enabled {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Ok(participants) = mutex.participants().await else { continue };
            // Our node (GUID-protected, of our session) is the one our session owns.
            let Some(position) = participants.iter().position(|p| is_ours(p, zk)) else { continue };
            let holder = participants.first().map(|p| printable(&p.data)).unwrap_or_default();
            let mut stderr = std::io::stderr();
            let _ = write!(
                stderr,
                "\rzklock: waiting for {}: position {} of {} in the queue (held by {holder})\x1b[K",
                mutex.path(),
                position,
                participants.len().saturating_sub(1),
            );
            let _ = stderr.flush();
            self.shown.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Ends the progress line, if one was shown.
    fn finish(&self) {
        if self.shown.swap(false, std::sync::atomic::Ordering::Relaxed) {
            eprintln!();
        }
    }
}

async fn status(args: StatusArgs) -> Result<u8, Failure> {
    zk_recipes::validate_lock_path(&args.lock_path).map_err(Failure::from_lock)?;
    let zk = connect(&args.connection).await?;
    let mutex = InterProcessMutex::new(&zk, args.lock_path.as_str()).map_err(Failure::from_lock)?;
    let mut participants = mutex.participants().await.map_err(Failure::from_lock)?;
    let mut election = false;
    if participants.is_empty() {
        // An election path (`zklock leader`, a LeaderLatch): its participants, the leader first.
        let latch = LeaderLatch::new(&zk, args.lock_path.as_str()).map_err(Failure::from_lock)?;
        participants = latch.participants().await.map_err(Failure::from_lock)?;
        election = !participants.is_empty();
    }
    let first = if election { "leader" } else { "holder" };
    let containment = supervisor::auto_containment_here();
    if participants.is_empty() {
        // A missing chroot, or a missing lock path, lists as an empty queue: say so instead of
        // "free".
        match zk.client().check_stat("/").await {
            Ok(Some(_)) => {},
            Ok(None) => {
                return Err(Failure::new(
                    exit::UNAVAILABLE,
                    format!("the chroot of {} does not exist on the server", args.connection.connect),
                ))
            },
            Err(err) => return Err(Failure::new(exit::ERROR, format!("checking the chroot: {err}"))),
        }
        match zk.client().check_stat(&args.lock_path).await {
            Ok(Some(_)) => {},
            Ok(None) => {
                return Err(Failure::new(
                    exit::NO_SUCH_PATH,
                    format!(
                        "no such lock path: {} (nobody holds or waits for it; check the spelling — the server \
                         also removes a lock path once its last lock node is gone)",
                        args.lock_path
                    ),
                ))
            },
            Err(err) => return Err(Failure::new(exit::ERROR, format!("checking {}: {err}", args.lock_path))),
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let listed: Vec<serde_json::Value> = participants
            .iter()
            .enumerate()
            .map(|(position, p)| {
                serde_json::json!({
                    "position": position,
                    "node": p.path,
                    "sequence": p.sequence,
                    "data": String::from_utf8_lossy(&p.data),
                    "session": format!("{:#x}", p.session_id),
                    "holder": p.is_holder,
                    "role": if p.is_holder { first } else { "waiting" },
                })
            })
            .collect();
        let document = serde_json::json!({
            "lock_path": args.lock_path,
            "kind": if election { "election" } else { "lock" },
            "participants": listed,
            "containment_here": containment,
        });
        let _ = writeln!(out, "{document}");
    } else if participants.is_empty() {
        let _ = writeln!(out, "{}: free", args.lock_path);
    } else {
        for (position, p) in participants.iter().enumerate() {
            let role = if p.is_holder { first } else { "waiting" };
            let _ = writeln!(
                out,
                "{position:>3} {role:<8} {:<24} session {:#x} sequence {} ({})",
                printable(&p.data),
                p.session_id,
                p.sequence,
                p.path
            );
        }
    }
    // Which containment `run` and `leader` get here by default (the holder's may be another
    // host's): the README's *Containment* table says what each covers.
    let _ = if args.json { Ok(()) } else { writeln!(out, "containment here (--containment auto): {containment}") };
    Ok(0)
}

/// Node data for a terminal: control characters escaped (node data is anyone's text).
fn printable(data: &[u8]) -> String {
    String::from_utf8_lossy(data)
        .chars()
        .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
        .collect()
}

/// The longest duration accepted (a year): anything longer is surely a mistake, and would
/// overflow the clock.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds (`1.5`), at most a year.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 10s, 2m)"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (use ms, s, m or h)")),
    };
    let duration = Duration::try_from_secs_f64(seconds).map_err(|err| format!("{text:?}: {err}"))?;
    if duration > MAX_DURATION {
        return Err(format!("{text:?} is longer than a year"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("10000000000000000000").is_err());
    }

    #[test]
    fn command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
