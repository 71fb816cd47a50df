//! The supervisor: a small process between `zklock` and the command that sees to it that nothing
//! the command started outlives the lock.
//!
//! `zklock run` re-executes itself (`/proc/self/exe`, first argument [`ARG`]) once the lock is
//! granted; this process makes itself a child subreaper, starts the command in a process group of
//! its own and then only waits: for the command and its descendants, for signals, and for
//! requests from `zklock` on a control socket. It exits once no descendant is left, with the
//! command's status (128+N if a signal N killed it), which `zklock` passes on.
//!
//! # Invariant
//!
//! Whenever ZooKeeper can grant the lock to another holder, no process descended from the command
//! is alive (zombies aside). Proof, for each way the hold ends:
//!
//! 1. **Closure.** The supervisor is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process whose
//!    parent dies is re-parented to its nearest living subreaper ancestor, which is the supervisor
//!    or a subreaper below it, never init. `setsid`, a new process group or a double fork change
//!    the session or group, not the parentage. So every live process the command started,
//!    directly or not, has the supervisor on its parent chain (`D`, found by walking the `ppid`
//!    of `/proc/*/stat`); and `D` is empty exactly when the supervisor has no child left
//!    (`waitpid` fails with `ECHILD`), because the top-most live members of `D` are always its
//!    direct children.
//! 2. **zklock dies.** `zklock`'s end of the control socket is close-on-exec and `zklock` starts
//!    no other process, so it is open in `zklock` alone. However `zklock` ends — exit, panic, any
//!    signal, SIGKILL included — the kernel closes it, and the supervisor's `poll` sees end of
//!    file. Unlike `PR_SET_PDEATHSIG` this is tied to the process, not to the thread that forked
//!    us, and no race can lose it: the socket exists before the supervisor does, so a `zklock`
//!    dead before the supervisor first polls leaves the end of file waiting. The supervisor then
//!    sends SIGKILL to the command's group and to every member of `D`, reaps, and repeats until
//!    `ECHILD`. A process with SIGKILL pending cannot fork any more, so each round leaves only
//!    processes forked before their parent was killed, which the next round finds: it ends.
//! 3. **Timing.** `zklock`'s ZooKeeper session outlives `zklock`: the server does not end it when
//!    the TCP connection closes, only when it has not heard from it for the session timeout T,
//!    and only then can the next waiter be granted the lock — no earlier than about 0.7 T after
//!    `zklock`'s death (the bound the README states for a stalled connection: `zklock` was last
//!    heard at most one ping interval before). The supervisor must therefore have killed `D`
//!    within a small fraction of T: it wakes at once on the end of file and SIGKILL needs no
//!    grace, so that takes milliseconds (the tests require under T/4).
//! 4. **The lock is lost** (`zklock` is told at about 0.4 T after a stall, before ZooKeeper can
//!    grant the lock elsewhere): `zklock` sends [`STOP`]: SIGTERM to the group and to `D`,
//!    SIGKILL after `--kill-after` (T/4 by default) or when the lease ends (*zklock's word*:
//!    the hold's loss deadline, which zklock no longer renews once the lock is lost), whichever
//!    comes first; `zklock` exits 76 only once the supervisor has exited, that is once `D` is
//!    empty. So nothing the command started runs past the loss deadline, however long the grace.
//! 5. **The command exits** while `zklock` holds the lock: what it left behind gets SIGTERM, then
//!    SIGKILL after `--kill-after`; `zklock` releases the lock once the supervisor has exited.
//!
//! Signals are sent through pidfds (`pidfd_open`, then a check that the process still has the
//! start time it had in the walk), so a pid recycled since the walk is never hit.
//!
//! Not covered: a process the command has someone else start (`systemd-run`, `at`, `docker run`,
//! `ssh`: it is no descendant); a descendant we may not signal (it runs as another user, e.g.
//! under `sudo`) or that does not die of SIGKILL (uninterruptible sleep: after [`KILL_WAIT`] the
//! supervisor names it and gives up); a descendant in a PID namespace that is not ours or a
//! descendant of ours (`/proc` must be our namespace's).
//!
//! The supervisor itself killed on its own (SIGKILL: other signals it forwards): the command dies
//! with it (`PR_SET_PDEATHSIG`), and `zklock`, a child subreaper too, adopts what the command
//! started and kills it ([`kill_orphans`]) before it releases the lock.
//!
//! # zklock's word
//!
//! Case 2 covers a `zklock` that dies. A `zklock` that is alive but does not run — stopped
//! (SIGSTOP, a debugger), starved of CPU, swapped out — keeps its end of the socket open, and
//! until it runs again it neither sees the loss nor sends [`STOP`]; meanwhile its session can
//! expire and the lock can go to the next holder. So the supervisor needs zklock's word that the
//! lock is still certain, renewed: it holds a *lease*, an instant of [`boottime_nanos`]'s clock
//! (passed as an argument at start, then in each [`RENEW`]), and kills everything (SIGKILL, no
//! grace) once it passes without a renewal.
//!
//! zklock's lease is the hold's own loss deadline (`LockGuard::certain_for`, zk-recipes'
//! `session/monitor.rs`, *The loss deadline*): the instant at which the hold itself becomes
//! `Lost(SessionDeadlinePassed)` unless an answered heartbeat moves it on — which that module
//! proves is before the leader can expire the session, with a margin of at least `0.05 T`.
//! zklock re-reads it every `T/20` and sends it on. If zklock stops, the lease stops moving, and
//! the supervisor kills at the deadline — exactly when zklock, had it run, would have been told
//! the lock was lost; SIGKILL takes effect within milliseconds (the tests allow `SCHED_SLACK`),
//! inside the margin. A lease never ends *later* than the deadline it was read from: both count
//! suspended time (`CLOCK_BOOTTIME`), and the supervisor re-reads the clock at least every
//! [`LEASE_CHECK`], so a suspend cannot stretch it. A healthy zklock never trips it: the deadline
//! is about `0.58 T` ahead after each heartbeat and moves every `0.22 T`, while zklock sends it on
//! within `T/20` — a renewal would have to be late by about `0.3 T`, and the hold itself is
//! already `Lost` when a heartbeat is `0.25 T` late. Except at a session's cold start: right
//! after its first grant the deadline is only about `0.36 T` ahead until the first heartbeat
//! moves it (`0.22 T` later), so a stop of about `0.15 T` then lets the lease run out although
//! the answer that would have moved it may be waiting in zklock's socket. The supervisor kills
//! anyway (it cannot know) and tells zklock ([`LEASE_LAPSED`]); zklock exits 76 like for a lost
//! lock, giving the lock back if the hold survived — never the command's own 137. The test: zklock SIGSTOPped, its command's
//! last sign of life precedes the next holder's command (`tests/cli.rs`,
//! `a_frozen_zklock_has_its_command_stopped_before_the_next_holder_starts`).
//!
//! The supervisor itself stopped (SIGSTOP to it) is not covered: nothing runs to kill anything.
//!
//! # zklock and the supervisor killed together
//!
//! (`pkill -9 -f zklock`, a SIGKILL to their process group.) Nobody is left to walk `/proc`:
//! under the subreaper alone, what the command started is re-parented past both to init and runs
//! on. The two other containments hand this case to the kernel:
//!
//! - **PID namespace** ([`enter_pid_namespace`]): the supervisor is the namespace's init; when an
//!   init dies, the kernel sends SIGKILL to every process in its namespace, and no process can
//!   leave a PID namespace. The shim outside is killed with zklock; the init dies of its
//!   `PR_SET_PDEATHSIG`.
//! - **Tracing** ([`spawn`]): the command is seized (`PTRACE_SEIZE`) before it executes its first
//!   instruction, with `PTRACE_O_EXITKILL` and the fork, vfork and clone events. The kernel
//!   attaches each child of a tracee to the same tracer, with the same options, inside `fork`
//!   itself — before the child can run — so every live process descended from the command is
//!   traced by the supervisor. When a tracer exits, for any reason, the kernel sends SIGKILL to
//!   every tracee with `PTRACE_O_EXITKILL`; a tracee in the middle of a fork then has SIGKILL
//!   pending and the kernel abandons the fork. The one exception the kernel makes is a clone with
//!   `CLONE_UNTRACED` (its child is not attached): the command runs under a seccomp filter
//!   ([`untraced_clone_filter`]) that refuses that flag, and `clone3` (whose flags a filter cannot
//!   see) altogether. So no descendant outlives the supervisor. Tracees
//!   stop on every signal they are sent and on each fork; [`resume_traced`] lets them go on at
//!   once, delivering the signal (a group-stop is kept with `PTRACE_LISTEN`, so SIGSTOP and
//!   SIGCONT behave as untraced). A tracee cannot detach itself, and no other tracer can attach
//!   to it.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `zklock __zklock-supervisor FD KILL_AFTER_MS CONTAINMENT LEASE -- COMMAND...`: how `zklock run`
/// starts us.
pub const ARG: &str = "__zklock-supervisor";

/// CONTAINMENT: a PID namespace where the system allows one, else tracing, else a subreaper.
pub const CONTAIN_AUTO: &str = "auto";
/// CONTAINMENT: a child subreaper that traces every process the command starts (`ptrace` with
/// `PTRACE_O_EXITKILL`), or fail.
pub const CONTAIN_TRACE: &str = "trace";
/// CONTAINMENT: a PID namespace, or fail.
pub const CONTAIN_PID_NAMESPACE: &str = "pid-namespace";
/// CONTAINMENT: a child subreaper.
pub const CONTAIN_SUBREAPER: &str = "subreaper";

/// Control message `[FORWARD, N]`: send signal N to the command's process group.
pub const FORWARD: u8 = b'F';
/// Control message `[STOP, 0]`: the lock is lost: SIGTERM to everything, SIGKILL after the grace.
pub const STOP: u8 = b'S';
/// Control message `[RENEW, 0, U64 LE]`: the lock is certain until this instant of
/// [`boottime_nanos`]'s clock (the hold's loss deadline): the supervisor's lease, see *zklock's
/// word* in the module docs.
pub const RENEW: u8 = b'R';

/// The control socket: a pair of `SOCK_SEQPACKET` Unix sockets, close-on-exec (zklock keeps the
/// first, the supervisor gets the second). Each message is one packet, sent whole or not at all,
/// so a message dropped because the supervisor stopped reading cannot leave half of itself.
pub fn control_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into `fds`, which we then own.
    unsafe {
        if libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Sends one control message without ever blocking: if the supervisor is gone (its exit tells
/// zklock) or has stopped reading (its buffer is full), the message is dropped.
pub fn send(control: &OwnedFd, message: &[u8]) {
    // SAFETY: send(2) reads `message.len()` bytes from `message`.
    unsafe {
        libc::send(control.as_raw_fd(), message.as_ptr().cast(), message.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
}

/// Message `[LEASE_LAPSED, 0]` from the supervisor to zklock: the lease ran out unrenewed and
/// everything was killed (see *zklock's word*).
pub const LEASE_LAPSED: u8 = b'L';

/// Whether the supervisor, which has exited, said [`LEASE_LAPSED`] (read without waiting).
pub fn lease_lapsed(control: &OwnedFd) -> bool {
    let mut said = false;
    let mut message = [0u8; 16];
    loop {
        // SAFETY: recv(2) writes at most `message.len()` bytes into `message`.
        let n =
            unsafe { libc::recv(control.as_raw_fd(), message.as_mut_ptr().cast(), message.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return said;
        }
        said |= message[0] == LEASE_LAPSED;
    }
}

/// The length of a control message that starts with `kind`.
fn message_len(kind: u8) -> usize {
    if kind == RENEW {
        10
    } else {
        2
    }
}

/// `CLOCK_BOOTTIME` in nanoseconds: monotonic, and counting time the machine spent suspended (as
/// the hold's loss deadline does), the same in every process of the machine.
pub fn boottime_nanos() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only `now`.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// The longest the supervisor sleeps while it holds a lease: it re-reads [`boottime_nanos`] at
/// least this often (poll's timeout counts on the monotonic clock, which stops during a suspend).
const LEASE_CHECK: Duration = Duration::from_millis(250);

/// How long SIGKILL gets to take effect before the supervisor names the survivors and exits.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// How often the SIGKILL round is repeated while descendants remain.
const KILL_ROUND: Duration = Duration::from_millis(5);

use crate::exit::{CANNOT_EXECUTE, ERROR, NOT_FOUND, USAGE};

/// The supervisor's `main`: `args` are the arguments after [`ARG`].
pub fn main(args: &[OsString]) -> ExitCode {
    let parsed = (|| {
        let fd: RawFd = args.first()?.to_str()?.parse().ok()?;
        let grace = Duration::from_millis(args.get(1)?.to_str()?.parse().ok()?);
        let wanted = args.get(2)?.to_str()?.to_owned();
        [CONTAIN_AUTO, CONTAIN_PID_NAMESPACE, CONTAIN_TRACE, CONTAIN_SUBREAPER]
            .contains(&wanted.as_str())
            .then_some(())?;
        let lease: u64 = args.get(3)?.to_str()?.parse().ok()?;
        (args.get(4)?.as_os_str() == "--").then_some(())?;
        let (program, rest) = args[5..].split_first()?;
        Some((fd, grace, wanted, lease, program, rest))
    })();
    let Some((fd, grace, wanted, lease, program, rest)) = parsed else {
        eprintln!("zklock: {ARG} is for zklock run's own use");
        return ExitCode::from(USAGE);
    };
    // SAFETY: zklock passed us this descriptor (a socket) and nothing else here owns it. F_SETFD
    // only sets its close-on-exec flag, so the command does not inherit it.
    let control = unsafe {
        if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
            eprintln!("zklock: supervisor: bad control descriptor {fd}");
            return ExitCode::from(USAGE);
        }
        OwnedFd::from_raw_fd(fd)
    };
    let verbose = std::env::var_os(VERBOSE_ENV).is_some();
    let entered = if wanted == CONTAIN_SUBREAPER || wanted == CONTAIN_TRACE {
        Err(Unavailable(format!("--containment {wanted}")))
    } else {
        enter_pid_namespace()
    };
    let containment = match entered {
        Ok(Entered::Init(containment)) => containment,
        Ok(Entered::Shim(init)) => {
            // The init has its own copy of the control socket: the shim needs none.
            drop(control);
            return ExitCode::from(shim(init));
        },
        Ok(Entered::Failed(code)) => return ExitCode::from(code),
        Err(Unavailable(reason)) if wanted == CONTAIN_PID_NAMESPACE => {
            eprintln!("zklock: --containment pid-namespace: no PID namespace can be made here ({reason})");
            return ExitCode::from(ERROR);
        },
        Err(Unavailable(reason)) => {
            if verbose && wanted == CONTAIN_AUTO {
                eprintln!("zklock: no PID namespace ({reason})");
            }
            Containment::Subreaper
        },
    };
    let tracing = match (containment, wanted.as_str()) {
        (Containment::PidNamespace { .. }, _) | (_, CONTAIN_SUBREAPER) => Tracing::No,
        (_, CONTAIN_TRACE) => Tracing::Required,
        _ => Tracing::IfAllowed,
    };
    let setup = Setup { control, grace, lease, containment, tracing, verbose };
    match Supervisor::start(setup, program, rest) {
        Ok(supervisor) => ExitCode::from(supervisor.run()),
        Err(code) => ExitCode::from(code),
    }
}

/// Set by `zklock --verbose` for the supervisor: say which containment is in force.
pub const VERBOSE_ENV: &str = "ZKLOCK_SUPERVISOR_VERBOSE";

/// How the supervisor keeps what the command starts from outliving the lock (the README's
/// *Containment* table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containment {
    /// A PID namespace whose init (PID 1) is the supervisor: when the supervisor dies, by any
    /// signal, the kernel kills every process in it, and none can leave it. `user`: entered
    /// through a user namespace (unprivileged). `proc`: `/proc` is the namespace's own (a mount
    /// namespace of ours), so `$$`, `ps` and `/proc/PID` agree inside.
    PidNamespace { user: bool, proc: bool },
    /// A child subreaper that walks `/proc` for the command's descendants and traces every one
    /// of them (`ptrace` with `PTRACE_O_EXITKILL`): when the supervisor dies, by any signal, the
    /// kernel sends SIGKILL to every process it traces, and a traced process's children are
    /// traced from their first instruction. PIDs are the host's.
    Traced,
    /// A child subreaper that walks `/proc` for the command's descendants: covers what the
    /// command starts as long as the supervisor or zklock lives to kill it.
    Subreaper,
}

/// Whether the supervisor traces the command and its descendants ([`Containment::Traced`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tracing {
    /// `--containment trace`: fail if `ptrace` is refused.
    Required,
    /// `--containment auto` without a PID namespace: trace if allowed, else only a subreaper.
    IfAllowed,
    No,
}

impl Containment {
    /// One line for `--verbose` and `zklock status`.
    pub fn describe(self) -> &'static str {
        match self {
            Containment::PidNamespace { user: false, proc: true } => "PID namespace (the supervisor is its init)",
            Containment::PidNamespace { user: true, proc: true } => {
                "PID namespace through a user namespace (the supervisor is its init)"
            },
            Containment::PidNamespace { user: false, proc: false } => {
                "PID namespace (the supervisor is its init; /proc is the host's)"
            },
            Containment::PidNamespace { user: true, proc: false } => {
                "PID namespace through a user namespace (the supervisor is its init; /proc is the host's)"
            },
            Containment::Traced => {
                "traced (the supervisor traces every process the command starts; the kernel kills them when it dies)"
            },
            Containment::Subreaper => "child subreaper",
        }
    }
}

/// What `--containment auto` would give a command started on this host now: `pid-namespace`,
/// `trace` or `subreaper` (for `zklock status`). Probed the way the supervisor enters each, in a
/// throw-away child: fork, `unshare` (as we are, else through a user namespace); else fork a child
/// and `PTRACE_SEIZE` it.
pub fn auto_containment_here() -> &'static str {
    // SAFETY: the children only call async-signal-safe functions (unshare, pause, _exit) before
    // they exit; the parent waits for or kills and reaps them.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            libc::_exit(if unshare_pid_namespace().is_some() { 0 } else { 1 });
        }
        if child > 0 {
            let mut status = 0;
            libc::waitpid(child, &mut status, 0);
            if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                return CONTAIN_PID_NAMESPACE;
            }
        }
        let child = libc::fork();
        if child == 0 {
            libc::pause();
            libc::_exit(0);
        }
        if child > 0 {
            let traced = libc::ptrace(libc::PTRACE_SEIZE, child, 0 as libc::c_long, 0 as libc::c_long) == 0;
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), libc::__WALL);
            if traced {
                return CONTAIN_TRACE;
            }
        }
    }
    CONTAIN_SUBREAPER
}

/// Why no PID namespace could be entered.
struct Unavailable(String);

/// Where [`enter_pid_namespace`] left this process.
enum Entered {
    /// The init of a new PID namespace: go on as the supervisor.
    Init(Containment),
    /// The shim outside it: wait for the init with [`shim`].
    Shim(libc::pid_t),
    /// In a new user namespace that could not be set up: exit with this status.
    Failed(u8),
}

/// `unshare` of a new PID and mount namespace for our children: as we are if we may (root), else
/// through a new user namespace. `Some(through a user namespace)`, or `None` (errno says why).
/// Async-signal-safe.
fn unshare_pid_namespace() -> Option<bool> {
    // SAFETY: unshare(2) has no memory effects.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) == 0 {
            Some(false)
        } else if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) == 0 {
            Some(true)
        } else {
            None
        }
    }
}

/// Enters a new PID namespace (and a mount namespace, for a `/proc` of its own): as we are if we
/// may (root), else through a new user namespace mapping our uid and gid to themselves. A PID
/// namespace takes in the *children* of the process that entered it, so we fork: the child is
/// the namespace's init and goes on as the supervisor; this process stays outside as a shim that
/// forwards signals to it and exits with its status (dying by the same signal if it was killed).
/// The init gets SIGKILL when the shim dies (`PR_SET_PDEATHSIG`; a pipe closes the race with a
/// shim dead before that), and every process in the namespace dies with the init: so killing
/// zklock and the supervisor together, as `pkill -f zklock` does, kills everything.
fn enter_pid_namespace() -> Result<Entered, Unavailable> {
    let errno = || std::io::Error::last_os_error().to_string();
    // SAFETY: getuid/getgid have no memory effects.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let Some(user) = unshare_pid_namespace() else {
        return Err(Unavailable(format!("unshare: {}", errno())));
    };
    if user {
        // Our own ids, mapped to themselves: the command runs as the same user. Once in the user
        // namespace there is no way back: a failure here is fatal, not a fallback.
        let mapped = std::fs::write("/proc/self/setgroups", "deny")
            .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
            .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")));
        if let Err(err) = mapped {
            eprintln!("zklock: supervisor: cannot map our ids in a new user namespace: {err}");
            return Ok(Entered::Failed(ERROR));
        }
    }
    let mut alive = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `alive`; sigprocmask gets an initialised set;
    // fork in a single-threaded process (we were just exec'd and started no thread).
    let child = unsafe {
        if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(Unavailable(format!("pipe: {}", errno())));
        }
        // Blocked before the fork: the shim waits for them with sigwaitinfo, the init inherits
        // the mask and reads them from its signalfd.
        let set = forwarded_signals();
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::fork()
    };
    match child {
        -1 => Err(Unavailable(format!("fork: {}", errno()))),
        0 => {
            // SAFETY: plain system calls; `alive` holds our two pipe descriptors.
            unsafe {
                libc::close(alive[1]);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The shim holds the write end while it lives: a hang-up means it died before
                // the prctl.
                let mut fd = libc::pollfd { fd: alive[0], events: libc::POLLIN, revents: 0 };
                libc::poll(&mut fd, 1, 0);
                if fd.revents & libc::POLLHUP != 0 {
                    libc::_exit(ERROR as i32);
                }
                libc::close(alive[0]);
            }
            Ok(Entered::Init(Containment::PidNamespace { user, proc: mount_own_proc() }))
        },
        init => {
            // SAFETY: our copy of the read end; the write end stays open while we live.
            unsafe { libc::close(alive[0]) };
            Ok(Entered::Shim(init))
        },
    }
}

/// In the init of a new PID and mount namespace: a `/proc` of the namespace, mounted over the
/// host's in our mount namespace only. Whether it worked (if not, `/proc` shows the host).
fn mount_own_proc() -> bool {
    // SAFETY: mount(2) with valid NUL-terminated strings and null data.
    unsafe {
        let root = c"/";
        let (proc, fstype) = (c"/proc", c"proc");
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) == 0
            && libc::mount(
                fstype.as_ptr(),
                proc.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) == 0
    }
}

/// The signals the supervisor takes over: SIGCHLD, the four it forwards, and SIGTSTP.
fn forwarded_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGCHLD, libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGTSTP] {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// The shim outside the namespace: forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the init
/// (blocked there, so delivered to its signalfd although an init ignores signals it has no
/// handler for), swallows SIGTSTP, and returns the init's exit status once it ended — or dies of
/// the signal that killed it, so that zklock sees the same status as without a namespace.
fn shim(init: libc::pid_t) -> u8 {
    let set = forwarded_signals();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only `status`; sigwaitinfo reads the initialised set.
        unsafe {
            let ended = libc::waitpid(init, &mut status, libc::WNOHANG);
            if ended == init {
                if libc::WIFSIGNALED(status) {
                    let signal = libc::WTERMSIG(status);
                    libc::signal(signal, libc::SIG_DFL);
                    let mut only = std::mem::zeroed::<libc::sigset_t>();
                    libc::sigemptyset(&mut only);
                    libc::sigaddset(&mut only, signal);
                    libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
                    libc::kill(libc::getpid(), signal);
                }
                return if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) as u8 } else { ERROR };
            }
            if ended < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return ERROR;
            }
            let signal = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if matches!(signal, libc::SIGINT | libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT) {
                libc::kill(init, signal);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    /// The command runs.
    Running,
    /// SIGTERM was sent to everything; SIGKILL at this instant.
    Stopping(Instant),
    /// SIGKILL, again every [`KILL_ROUND`], until no descendant is left; since this instant.
    Killing(Instant),
}

/// What `main` worked out for [`Supervisor::start`].
struct Setup {
    control: OwnedFd,
    grace: Duration,
    lease: u64,
    containment: Containment,
    tracing: Tracing,
    verbose: bool,
}

struct Supervisor {
    me: libc::pid_t,
    containment: Containment,
    /// The command's pid, which is also its process group's id.
    command: libc::pid_t,
    /// Its status once reaped (a shell's: 128+N for signal N). Until then, `command` is our
    /// unreaped child, so its pid (and group id) cannot be anyone else's.
    status: Option<u8>,
    control: OwnedFd,
    /// Control bytes read but not yet a whole message.
    pending: Vec<u8>,
    signals: OwnedFd,
    grace: Duration,
    /// zklock's word: the lock is certain until this [`boottime_nanos`] instant (renewed by
    /// [`RENEW`]); once it passes, everything is killed.
    lease: u64,
    /// zklock sent [`STOP`] (the lock is lost).
    stop_asked: bool,
    phase: Phase,
}

impl Supervisor {
    fn start(setup: Setup, program: &OsString, rest: &[OsString]) -> Result<Supervisor, u8> {
        let Setup { control, grace, lease, mut containment, tracing, verbose } = setup;
        // SAFETY: plain system calls on our own process; the sigset is initialised by
        // sigemptyset before use.
        let (me, signals) = unsafe {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                eprintln!("zklock: supervisor: PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error());
                return Err(ERROR);
            }
            // SIGCHLD and the signals we forward arrive on a signalfd; SIGTSTP is swallowed (a
            // stopped supervisor could not act on zklock's death). The command starts with an
            // empty mask (see `spawn`).
            let set = forwarded_signals();
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                eprintln!("zklock: supervisor: signalfd: {}", std::io::Error::last_os_error());
                return Err(ERROR);
            }
            (libc::getpid(), OwnedFd::from_raw_fd(fd))
        };
        let mut command = std::process::Command::new(program);
        command.args(rest);
        let (command, traced) = spawn(me, command, program, tracing)?;
        if traced {
            containment = Containment::Traced;
        }
        if verbose {
            eprintln!("zklock: containment: {}", containment.describe());
        }
        Ok(Supervisor {
            me,
            containment,
            command,
            status: None,
            control,
            pending: Vec::new(),
            signals,
            grace,
            lease,
            stop_asked: false,
            phase: Phase::Running,
        })
    }

    /// Waits and acts until no descendant is left; returns the exit status.
    fn run(mut self) -> u8 {
        loop {
            if !self.reap() {
                // No child left, so no descendant (closure): the command was reaped too.
                return self.status.unwrap_or(ERROR);
            }
            let now = Instant::now();
            if self.status.is_some() && self.phase == Phase::Running {
                // The command exited; what it left behind does not outlive the lock.
                self.stop(now);
            }
            if let Phase::Stopping(at) = self.phase {
                if now >= at {
                    self.phase = Phase::Killing(now);
                }
            }
            let lease_left = Duration::from_nanos(self.lease.saturating_sub(boottime_nanos()));
            if lease_left.is_zero() && !matches!(self.phase, Phase::Killing(_)) {
                // The lock may be lost from now on (*zklock's word*), and no grace is left before
                // the server may expire the session: SIGKILL, whatever the phase.
                if self.stop_asked {
                    eprintln!("zklock: the lock's loss deadline came before --kill-after ended: SIGKILL now");
                } else {
                    eprintln!(
                        "zklock: zklock did not renew the lock's lease by its loss deadline (stopped or starved); \
                         killing the command and everything it started"
                    );
                    send(&self.control, &[LEASE_LAPSED, 0]);
                }
                self.phase = Phase::Killing(now);
            }
            if let Phase::Killing(since) = self.phase {
                self.signal_all(libc::SIGKILL);
                if now.duration_since(since) >= KILL_WAIT && self.status.is_some() {
                    if let Containment::PidNamespace { .. } | Containment::Traced = self.containment {
                        // Our exit (as the namespace's init, or as their tracer) kills them, once
                        // they can die.
                        eprintln!(
                            "zklock: processes the command started survived SIGKILL for {KILL_WAIT:?} \
                             (uninterruptible sleep); they die when the supervisor exits"
                        );
                        return self.status.unwrap_or(ERROR);
                    }
                    let left = descendants(self.me).into_iter().map(|(pid, _)| pid.to_string()).collect::<Vec<_>>();
                    eprintln!(
                        "zklock: processes the command started survived SIGKILL (not ours to kill, or in \
                         uninterruptible sleep): {}",
                        left.join(" ")
                    );
                    return self.status.unwrap_or(ERROR);
                }
            }
            let timeout = match self.phase {
                Phase::Running => lease_left.min(LEASE_CHECK),
                Phase::Stopping(at) => at.saturating_duration_since(now).min(lease_left).min(LEASE_CHECK),
                Phase::Killing(_) => KILL_ROUND,
            };
            // Rounded up: woken before the instant, we would only sleep again.
            let timeout = timeout.as_nanos().div_ceil(1_000_000).clamp(1, i32::MAX as u128) as i32;
            let mut fds = [
                libc::pollfd { fd: self.signals.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.control.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // Once zklock is gone, only the signals (SIGCHLD) matter.
            let watched = if matches!(self.phase, Phase::Killing(_)) { 1 } else { 2 };
            // SAFETY: `fds` is a valid array of `watched` pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), watched as libc::nfds_t, timeout) };
            if fds[0].revents != 0 {
                self.read_signals();
            }
            if watched == 2 && fds[1].revents != 0 {
                self.read_control();
            }
        }
    }

    /// Reaps every child that ended; whether any child is left.
    fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes only `status`.
            // __WALL: traced threads too; their stops are reported to us as their tracer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid == 0 {
                return true;
            }
            if pid > 0 && libc::WIFSTOPPED(status) {
                resume_traced(pid, status);
                continue;
            }
            if pid < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // ECHILD: none left.
                    _ => return false,
                }
            }
            if pid == self.command {
                self.status = Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status) as u8
                } else if libc::WIFSIGNALED(status) {
                    128u8.saturating_add(libc::WTERMSIG(status) as u8)
                } else {
                    ERROR
                });
            }
        }
    }

    fn read_signals(&mut self) {
        let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        loop {
            // SAFETY: reads at most `info.len()` bytes into `info`.
            let n = unsafe { libc::read(self.signals.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) };
            if n != info.len() as isize {
                return;
            }
            // ssi_signo is the first field, a u32 in native byte order.
            let signal = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]) as i32;
            // Sent to us directly: forwarded like zklock forwards them (SIGCHLD only wakes us;
            // SIGTSTP is swallowed).
            if matches!(signal, libc::SIGINT | libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT) {
                self.forward(signal);
            }
        }
    }

    fn read_control(&mut self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(self.control.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let read = if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) };
        match read {
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {},
            Ok(0) | Err(_) => {
                // zklock is gone (invariant, 2): kill everything now.
                self.phase = Phase::Killing(Instant::now());
                self.signal_all(libc::SIGKILL);
            },
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                while let Some(&kind) = self.pending.first() {
                    let len = message_len(kind);
                    if self.pending.len() < len {
                        break;
                    }
                    let message: Vec<u8> = self.pending.drain(..len).collect();
                    match kind {
                        FORWARD => self.forward(message[1] as i32),
                        STOP if self.phase == Phase::Running => {
                            self.stop_asked = true;
                            self.stop(Instant::now());
                        },
                        RENEW => {
                            let mut until = [0u8; 8];
                            until.copy_from_slice(&message[2..10]);
                            self.lease = u64::from_le_bytes(until);
                        },
                        _ => {},
                    }
                }
            },
        }
    }

    /// SIGTERM to everything, SIGKILL after the grace.
    fn stop(&mut self, now: Instant) {
        self.signal_all(libc::SIGTERM);
        // A stopped process acts on SIGTERM only once continued (as systemd does after its kill
        // signal).
        self.signal_all(libc::SIGCONT);
        self.phase = Phase::Stopping(now.checked_add(self.grace).unwrap_or(now));
    }

    /// A signal for the command: its process group while it runs, else everything it left.
    fn forward(&mut self, signal: i32) {
        // A signal that asks to stop is followed by SIGCONT, so that a stopped command acts on it
        // (else zklock would wait for it for ever).
        let then_continue = matches!(signal, libc::SIGINT | libc::SIGTERM | libc::SIGQUIT);
        if self.status.is_none() {
            // SAFETY: kill(2) has no memory effects; the group id is our unreaped child's pid.
            unsafe {
                libc::kill(-self.command, signal);
                if then_continue {
                    libc::kill(-self.command, libc::SIGCONT);
                }
            }
        } else {
            self.signal_all(signal);
            if then_continue {
                self.signal_all(libc::SIGCONT);
            }
        }
    }

    /// `signal`, once, to every process the command started and to the command.
    fn signal_all(&mut self, signal: i32) {
        if let Containment::PidNamespace { .. } = self.containment {
            // From the namespace's init, -1 is every other process in the namespace.
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(-1, signal) };
            return;
        }
        if self.status.is_none() {
            // SAFETY: as in `forward`.
            unsafe { libc::kill(-self.command, signal) };
        }
        for (pid, started) in descendants(self.me) {
            // The command's group had it already (once is the promise: a second SIGTERM cut a
            // job's cleanup trap short).
            if self.status.is_none() && group_of(pid) == Some(self.command) {
                continue;
            }
            signal_pinned(pid, started, signal);
        }
    }
}

/// What the supervisor tells the command's process through the pipe once it is seized.
const TRACED: u8 = b'T';

/// `PTRACE_O_*` options for a traced command: every process and thread it starts is traced
/// from its first instruction (fork, vfork, clone) and gets SIGKILL when the tracer dies.
const TRACE_OPTIONS: libc::c_int =
    libc::PTRACE_O_EXITKILL | libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK | libc::PTRACE_O_TRACECLONE;

/// The seccomp filter a traced command runs under: a process it starts with `CLONE_UNTRACED`
/// (which the kernel does not attach to the tracer) would escape the tracing, so `clone` with
/// that flag fails with EPERM; `clone3`, whose flags a filter cannot read (they are in memory),
/// fails with ENOSYS, and the C libraries fall back to `clone` (as under Docker's default
/// profile); x32 system calls fail with ENOSYS. Covers the native ABI and the 32-bit one beside
/// it (i386 on x86_64, arm on aarch64); anything else passes.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn untraced_clone_filter() -> Vec<libc::sock_filter> {
    #[cfg(target_arch = "x86_64")]
    const ABIS: [(u32, u32, u32); 2] = [(0xC000_003E, 56, 435), (0x4000_0003, 120, 435)];
    #[cfg(target_arch = "aarch64")]
    const ABIS: [(u32, u32, u32); 2] = [(0xC000_00B7, 220, 435), (0x4000_0028, 120, 435)];
    const X32_BIT: u32 = 0x4000_0000;
    let op = |code: u32| code as u16;
    let stmt = |code: u32, k: u32| libc::sock_filter { code: op(code), jt: 0, jf: 0, k };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: op(code), jt, jf, k };
    let load = |offset: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    let eq = |k: u32, jt: u8, jf: u8| jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, k, jt, jf);
    let ret = |k: u32| stmt(libc::BPF_RET | libc::BPF_K, k);
    // seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits on these little-endian
    // targets: CLONE_UNTRACED is among them).
    let (native, compat) = (ABIS[0], ABIS[1]);
    vec![
        /* 0 */ load(4),
        /* 1 */ eq(native.0, 2, 0), // → 4
        /* 2 */ eq(compat.0, 6, 0), // → 9
        /* 3 */ ret(libc::SECCOMP_RET_ALLOW),
        /* 4 */ load(0),
        /* 5 */ jump(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, X32_BIT, 9, 0), // → 15
        /* 6 */ eq(native.2, 8, 0), // → 15
        /* 7 */ eq(native.1, 4, 0), // → 12
        /* 8 */ ret(libc::SECCOMP_RET_ALLOW),
        /* 9 */ load(0),
        /* 10 */ eq(compat.2, 4, 0), // → 15
        /* 11 */ eq(compat.1, 0, 2), // → 12, else → 14
        /* 12 */ load(16),
        /* 13 */
        jump(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, libc::CLONE_UNTRACED as u32, 2, 0), // → 16
        /* 14 */ ret(libc::SECCOMP_RET_ALLOW),
        /* 15 */ ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        /* 16 */ ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ]
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn untraced_clone_filter() -> Vec<libc::sock_filter> {
    Vec::new()
}

/// Installs [`untraced_clone_filter`] on this process (it is inherited by everything it
/// starts, across `exec`, and cannot be removed). Without `CAP_SYS_ADMIN` the kernel requires
/// `no_new_privs` first (setuid programs then gain no privileges — which, traced and not root,
/// they do not anyway). Async-signal-safe: `filter` was built before the fork.
fn install_clone_filter(filter: &[libc::sock_filter]) -> bool {
    if filter.is_empty() {
        return false;
    }
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
    // SAFETY: prctl reads `program`, which points at `filter`, alive for the call.
    unsafe {
        let install = || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &program as *const _) == 0;
        install() || (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && install())
    }
}

/// `PTRACE_EVENT_STOP` (not in every libc target): a seized tracee's group-stop or first stop.
const PTRACE_EVENT_STOP: libc::c_int = 128;

/// Starts the command in a process group of its own (its pid is the group's id) and, if
/// `tracing` asks, traced by us; returns its pid and whether it is traced.
///
/// We fork; the child makes its group, asks for SIGKILL when we die (`PR_SET_PDEATHSIG`: we are
/// single-threaded, so the "parent" is our whole process), checks we did not die before that,
/// then waits on a pipe until we have seized it (`PTRACE_SEIZE` with [`TRACE_OPTIONS`]), and
/// only then restores the signal mask and executes the command: nothing it forks can run
/// untraced. If `exec` fails, the child says why and exits 127 (not found) or 126, which the
/// supervisor passes on like any status of the command.
fn spawn(
    me: libc::pid_t,
    mut command: std::process::Command,
    program: &OsString,
    tracing: Tracing,
) -> Result<(libc::pid_t, bool), u8> {
    // Built before the fork: the child only installs it.
    let filter = if tracing == Tracing::No { Vec::new() } else { untraced_clone_filter() };
    let mut go = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `go`.
    if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("zklock: supervisor: pipe: {}", std::io::Error::last_os_error());
        return Err(ERROR);
    }
    // SAFETY: we are single-threaded (just exec'd, no thread started), so the child may run any
    // code, allocation included, before its exec.
    let child = unsafe { libc::fork() };
    if child < 0 {
        eprintln!("zklock: supervisor: fork: {}", std::io::Error::last_os_error());
        return Err(ERROR);
    }
    if child == 0 {
        // SAFETY: plain system calls in the child; `go` holds our pipe's descriptors.
        unsafe {
            libc::close(go[1]);
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != me {
                libc::_exit(ERROR as i32);
            }
            let mut word = 0u8;
            let n = loop {
                let n = libc::read(go[0], (&mut word as *mut u8).cast(), 1);
                if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break n;
                }
            };
            if n != 1 {
                // The supervisor gave up on us (or died): nothing to run.
                libc::_exit(ERROR as i32);
            }
            libc::close(go[0]);
            if word == TRACED && !install_clone_filter(&filter) {
                let say = b"zklock: warning: no seccomp filter: a process the command starts with clone(CLONE_UNTRACED) would escape tracing\n";
                libc::write(2, say.as_ptr().cast(), say.len());
            }
            let mut empty = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        }
        let err = command.exec();
        eprintln!("zklock: cannot run {}: {err}", program.to_string_lossy());
        let code = if err.kind() == std::io::ErrorKind::NotFound { NOT_FOUND } else { CANNOT_EXECUTE };
        // SAFETY: _exit ends the child without running the parent's destructors or atexit.
        unsafe { libc::_exit(code as i32) };
    }
    // SAFETY: plain system calls on our child (unreaped, so its pid is its own); `go` holds our
    // pipe's descriptors.
    unsafe {
        libc::close(go[0]);
        // Also here: whichever of the two runs first, the group exists before the command runs.
        libc::setpgid(child, child);
        let traced = tracing != Tracing::No
            && libc::ptrace(libc::PTRACE_SEIZE, child, 0 as libc::c_long, TRACE_OPTIONS as libc::c_long) == 0;
        if tracing == Tracing::Required && !traced {
            let err = std::io::Error::last_os_error();
            eprintln!("zklock: --containment trace: cannot trace the command here (ptrace: {err})");
            libc::close(go[1]);
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            return Err(ERROR);
        }
        let word = if traced { TRACED } else { b'G' };
        let sent = libc::write(go[1], (&word as *const u8).cast(), 1);
        libc::close(go[1]);
        if sent != 1 {
            eprintln!("zklock: supervisor: cannot start the command: {}", std::io::Error::last_os_error());
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            return Err(ERROR);
        }
        Ok((child, traced))
    }
}

/// A traced process (or thread) stopped: let it go on. A signal it was about to receive is
/// delivered (we only watch); a group-stop (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU) is kept with
/// `PTRACE_LISTEN`, so job control works as untraced; events (fork, vfork, clone, a new tracee's
/// first stop) just continue. A process that died meanwhile (`ESRCH`) needs nothing.
fn resume_traced(pid: libc::pid_t, status: libc::c_int) {
    let signal = libc::WSTOPSIG(status);
    let event = status >> 16;
    let (request, deliver) = match event {
        0 => (libc::PTRACE_CONT, signal),
        PTRACE_EVENT_STOP if matches!(signal, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU) => {
            (libc::PTRACE_LISTEN, 0)
        },
        _ => (libc::PTRACE_CONT, 0),
    };
    // SAFETY: ptrace on a tracee of ours in a ptrace-stop, with no pointer arguments.
    unsafe { libc::ptrace(request, pid, 0 as libc::c_long, deliver as libc::c_long) };
}

/// For `zklock`, itself a child subreaper, when the supervisor died by a signal: what the command
/// started was re-parented to `zklock`; SIGKILL it, in rounds, until none is alive (at most
/// [`KILL_WAIT`]). Returns how many were found.
pub fn kill_orphans() -> usize {
    // SAFETY: getpid has no memory effects.
    let me = unsafe { libc::getpid() };
    let deadline = Instant::now() + KILL_WAIT;
    let mut found = std::collections::BTreeSet::new();
    loop {
        let left = descendants(me);
        if left.is_empty() || Instant::now() >= deadline {
            return found.len();
        }
        for (pid, started) in left {
            found.insert(pid);
            signal_pinned(pid, started, libc::SIGKILL);
        }
        std::thread::sleep(KILL_ROUND);
    }
}

/// One line of `/proc/PID/stat`: (state, ppid, start time in clock ticks after boot).
fn stat(pid: libc::pid_t) -> Option<(u8, libc::pid_t, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything: parse after the last ')'.
    let mut fields = text.get(text.rfind(')')? + 1..)?.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    // Fields 3 and 4 were state and ppid; start time is field 22.
    let started = fields.nth(17)?.parse().ok()?;
    Some((state, ppid, started))
}

/// The live (not zombie) processes whose parent chain leads to `root`, with their start times.
fn descendants(root: libc::pid_t) -> Vec<(libc::pid_t, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut processes = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<libc::pid_t>().ok()) else { continue };
        if let Some((state, ppid, started)) = stat(pid) {
            processes.push((pid, ppid, state, started));
        }
    }
    let mut tree = vec![root];
    let mut found = Vec::new();
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for &(pid, ppid, state, started) in &processes {
            if ppid == parent && !tree.contains(&pid) {
                tree.push(pid);
                // A process whose main thread exited shows `Z` while its other threads run: it is
                // alive while any thread is.
                if state != b'Z' || has_live_thread(pid) {
                    found.push((pid, started));
                }
            }
        }
        i += 1;
    }
    found
}

/// Whether a thread of `pid` other than a zombie one runs (`/proc/PID/task/*/stat`).
fn has_live_thread(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat")).ok().is_some_and(|text| {
            text.rfind(')').and_then(|at| text[at + 1..].split_ascii_whitespace().next()).is_some_and(|s| s != "Z")
        })
    })
}

/// The process group of `pid` (field 5 of `/proc/PID/stat`).
fn group_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text.get(text.rfind(')')? + 1..)?.split_ascii_whitespace().nth(2)?.parse().ok()
}

/// `signal` to `pid` if it is still the process that started at `started`: pinned by a pidfd
/// first, so a pid recycled since the walk is not hit.
fn signal_pinned(pid: libc::pid_t, started: u64, signal: i32) {
    // SAFETY: pidfd_open and pidfd_send_signal have no memory effects (the siginfo pointer is
    // null); the pidfd is closed by OwnedFd.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as RawFd;
        if fd < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                // Before Linux 5.3: no pinning; the start-time check still narrows the window.
                if stat(pid).is_some_and(|(_, _, now)| now == started) {
                    libc::kill(pid, signal);
                }
            }
            return;
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if stat(pid).is_some_and(|(_, _, now)| now == started) {
            libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_stat_parses() {
        // SAFETY: getpid/getppid have no memory effects.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        let (state, ppid, started) = stat(me).expect("our stat");
        assert_eq!(ppid, parent);
        assert!(state == b'R' || state == b'S', "{}", state as char);
        assert!(started > 0);
        assert!(descendants(parent).iter().any(|&(pid, _)| pid == me));
    }
}
