//! The real `zklock` binary against a real ZooKeeper: serialisation, exit codes, the fencing
//! token, loss of the lock under a stalled connection, `status --json`, bad input, the progress
//! line in a pseudo-terminal.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use zk_testcontainers::{FaultProxy, ZooKeeper, SCHED_SLACK};

const ZKLOCK: &str = env!("CARGO_BIN_EXE_zklock");

async fn zookeeper() -> &'static ZooKeeper {
    match ZooKeeper::shared().await {
        Ok(zk) => zk,
        Err(err) => panic!("no ZooKeeper for tests: {err}"),
    }
}

fn unique_path(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("/zklock-tests/{name}-{}-{nanos}", std::process::id())
}

/// `zklock ARGS...` against the test server.
async fn zklock(args: &[&str]) -> Command {
    let mut command = Command::new(ZKLOCK);
    command
        .args(args)
        .env("ZK_CONNECT", zookeeper().await.connect_string())
        .env_remove("ZKLOCK_AUTH")
        .env_remove("ZKLOCK_AUTH_FILE")
        .env_remove("ZKLOCK_CONTAINMENT")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

async fn output(mut command: Command) -> Output {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), command.output()).await.expect("zklock ends").unwrap();
    let out = Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    };
    assert!(!out.stderr.contains("panicked"), "zklock panicked: {}", out.stderr);
    out
}

/// Waits until a session that just got its first lock is past its cold start: its first
/// heartbeat (0.22 T after the grant) moves the hold's loss deadline from about 0.36 T after the
/// acquire to 0.58 T after the heartbeat. Until then a stall is noticed only at that deadline,
/// where the supervisor gives SIGKILL at once (no time is left for `--kill-after`), and the tests
/// that call this look at the SIGTERM before it.
async fn past_cold_start(t: Duration) {
    tokio::time::sleep(t / 2).await;
}

async fn run(args: &[&str]) -> Output {
    output(zklock(args).await).await
}

/// The containments in which the command sees the host's PIDs: tests that hand a pid from
/// inside the command to the test run in each (inside a PID namespace the pid would be the
/// namespace's).
const HOST_PIDS: [&str; 2] = ["trace", "subreaper"];

/// `zklock SUBCOMMAND --containment CONTAINMENT ARGS...`.
async fn zklock_in(containment: &str, args: &[&str]) -> Command {
    let (subcommand, rest) = args.split_first().expect("a subcommand");
    let mut all = vec![*subcommand, "--containment", containment];
    all.extend_from_slice(rest);
    zklock(&all).await
}

async fn run_in(containment: &str, args: &[&str]) -> Output {
    output(zklock_in(containment, args).await).await
}

/// The parsed `zklock status --json` of `path`.
async fn status(path: &str) -> serde_json::Value {
    let out = run(&["status", "--json", path]).await;
    if out.code == Some(66) {
        // No such lock path (yet, or any more): nobody queued.
        assert!(out.stderr.contains("no such lock path"), "{}", out.stderr);
        return serde_json::json!({ "lock_path": path, "participants": [] });
    }
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|err| panic!("status --json is not JSON ({err}): {}", out.stdout))
}

async fn queue_len(path: &str) -> usize {
    status(path).await["participants"].as_array().map_or(0, Vec::len)
}

async fn wait_for_queue(path: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue_len(path).await != len {
        assert!(Instant::now() < deadline, "queue of {path} never reached {len}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `zklock run PATH -- sh -c 'read _'` holding the lock until [`Holder::release`] closes its
/// standard input (no fixed sleep: a slow machine cannot make it release early).
struct Holder(Child);

async fn hold(path: &str, data: &str) -> Holder {
    let holder = zklock(&["run", "--data", data, path, "--", "sh", "-c", "read _; exit 0"])
        .await
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_queue(path, 1).await;
    Holder(holder)
}

impl Holder {
    async fn release(mut self) {
        drop(self.0.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(20), self.0.wait()).await.unwrap().unwrap();
        assert!(status.success(), "holder: {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_serialise_a_shell_command() {
    let path = unique_path("serialise");
    let log = std::env::temp_dir().join(format!("zklock-serialise-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let script = format!(
        "echo \"start $ZKLOCK_FENCING_TOKEN $(date +%s%N)\" >> {0}; sleep 0.4; echo \"end $ZKLOCK_FENCING_TOKEN $(date +%s%N)\" >> {0}",
        log.display()
    );
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(tokio::spawn(output(zklock(&["run", &path, "--", "sh", "-c", &script]).await)));
    }
    for run in runs {
        let out = run.await.unwrap();
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let lines: Vec<(String, i64, u128)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            (parts[0].to_owned(), parts[1].parse().unwrap(), parts[2].parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 6, "{lines:?}");
    // start/end pairs, never interleaved, in time order, with increasing fencing tokens.
    for (i, pair) in lines.chunks(2).enumerate() {
        assert_eq!((pair[0].0.as_str(), pair[1].0.as_str()), ("start", "end"), "{lines:?}");
        assert_eq!(pair[0].1, pair[1].1, "one holder per pair: {lines:?}");
        assert!(pair[0].2 < pair[1].2);
        if i > 0 {
            let previous = &lines[2 * i - 1];
            assert!(previous.2 <= pair[0].2, "overlap: {lines:?}");
            assert!(previous.1 < pair[0].1, "tokens increase: {lines:?}");
        }
    }
    let _ = std::fs::remove_file(&log);
    assert_eq!(queue_len(&path).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonblock_timeout_and_the_commands_status() {
    let path = unique_path("exit-codes");
    let holder = hold(&path, "holder").await;

    let out = run(&["run", "--nonblock", &path, "--", "true"]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let out = run(&["run", "-n", "-E", "42", &path, "--", "true"]).await;
    assert_eq!(out.code, Some(42), "{}", out.stderr);
    assert!(out.took < Duration::from_secs(5), "{:?}", out.took);

    let out = run(&["run", "--timeout", "1s", &path, "--", "true"]).await;
    assert_eq!(out.code, Some(75), "{}", out.stderr);
    assert!(out.took >= Duration::from_millis(900) && out.took < Duration::from_secs(6), "{:?}", out.took);
    assert!(out.stderr.contains("timed out"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "one line: {}", out.stderr);
    assert_eq!(queue_len(&path).await, 1, "the timed-out run left no node");

    holder.release().await;
    // The command's own status, and a signal's.
    assert_eq!(run(&["run", &path, "--", "sh", "-c", "exit 7"]).await.code, Some(7));
    assert_eq!(run(&["run", &path, "--", "sh", "-c", "kill -KILL $$"]).await.code, Some(128 + 9));
    // The command's own 76 is its status, not a lost lock: nothing said, the lock released.
    let out = run(&["run", &path, "--", "sh", "-c", "exit 76"]).await;
    assert_eq!(out.code, Some(76));
    assert!(!out.stderr.contains("lost"), "{}", out.stderr);
    assert_eq!(queue_len(&path).await, 0);
    // 126: found but not executable.
    let descendants = Descendants::new("not-executable");
    let file = descendants.file("data.txt");
    std::fs::write(&file, "not a program\n").unwrap();
    let out = run(&["run", &path, "--", &file]).await;
    assert_eq!(out.code, Some(126), "{}", out.stderr);
    assert!(out.stderr.contains("cannot run"), "{}", out.stderr);
    assert_eq!(queue_len(&path).await, 0, "released");
    // 70, any other ZooKeeper error: a lock path under an ephemeral node (no children allowed).
    use zk_recipes::zookeeper_client as zk;
    let owner = zookeeper().await.client().await.unwrap();
    let ephemeral = unique_path("ephemeral-parent");
    let parent = ephemeral.rsplit_once('/').map(|(parent, _)| parent).unwrap_or("/");
    owner.mkdir(parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    owner.create(&ephemeral, b"", &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let out = run(&["run", &format!("{ephemeral}/lock"), "--", "true"]).await;
    assert_eq!(out.code, Some(70), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "one line: {}", out.stderr);
}

/// `--kill-after` defaults to T/4: what the command left running when it exited, if it ignores
/// SIGTERM, gets SIGKILL T/4 after the command's exit (the lock is held meanwhile: the next
/// holder's command starts after). A grace up to 0.35 T gets no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_after_defaults_to_a_quarter_of_the_session_timeout() {
    let t = Duration::from_secs(4);
    let path = unique_path("default-grace");
    let descendants = Descendants::new("default-grace");
    let (beat, exited, next_file) = (descendants.file("beat"), descendants.file("exited"), descendants.file("next"));
    let leftover = format!("trap '' TERM; {}", heartbeat_script(&beat));
    let script = format!("setsid sh -c \"{leftover}\" & sleep 0.5; {}; exit 0", stamp(&exited));
    let first = zklock(&["run", "--session-timeout", "4s", &path, "--", "sh", "-c", &script]).await.spawn().unwrap();
    read_time(&beat, Duration::from_secs(20)).await;
    let next = next_holder(&path, &next_file).await;
    let first = tokio::time::timeout(Duration::from_secs(20), first.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(first.status.code(), Some(0));
    let exited_at = read_time(&exited, Duration::from_secs(1)).await;
    let next_started = read_time(&next_file, Duration::from_secs(20)).await;
    let last_beat = read_time(&beat, Duration::from_secs(1)).await;
    let grace = Duration::from_nanos(last_beat.saturating_sub(exited_at) as u64);
    eprintln!("the leftover ran {grace:?} after the command exited (T/4 = {:?})", t / 4);
    assert!(last_beat < next_started, "the leftover ran when the next holder's command started");
    // SIGKILL at T/4; the loop writes every 20 ms, and the exit is noticed at once.
    assert!(grace + Duration::from_millis(40) >= t / 4, "killed {grace:?} after the exit, before T/4");
    assert!(grace <= t / 4 + Duration::from_millis(20) + SCHED_SLACK, "killed {grace:?} after the exit");
    assert!(next.wait_with_output().await.unwrap().status.success());
    // A grace at 0.35 T is not warned about; above it is (a_long_kill_after_still_ends_at_the_loss_deadline).
    let out = run(&["run", "--session-timeout", "4s", "--kill-after", "1400ms", &path, "--", "true"]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let out = run(&["run", "--session-timeout", "4s", "--kill-after", "1500ms", &path, "--", "true"]).await;
    assert!(out.stderr.contains("warning: --kill-after"), "{}", out.stderr);
}

/// `zklock leader`'s defaults: a command that exits by itself is run again after 1 s
/// (`--restart-delay`), and the participant id (`--data`) is `hostname:pid`. The command's own
/// exit 76 is an exit like any other (restarted), not a lost leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_defaults_restart_delay_and_data() {
    let path = unique_path("leader-defaults");
    let script = "echo run $(date +%s%N); sleep 1; echo exit $(date +%s%N); exit 76";
    let mut child = zklock(&["leader", &path, "--", "sh", "-c", script])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let time = |line: &str, word: &str| -> u128 {
        line.strip_prefix(word).and_then(|t| t.trim().parse().ok()).unwrap_or_else(|| panic!("{word}: {line}"))
    };
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    time(&line, "run ");
    // The participant id while it leads (the command runs for 1 s).
    let document = status(&path).await;
    let data = document["participants"][0]["data"].as_str().unwrap_or_default().to_owned();
    assert!(data.ends_with(&format!(":{pid}")), "{document}");
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    let exited = time(&line, "exit ");
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    let again = time(&line, "run ");
    let gap = Duration::from_nanos((again - exited) as u64);
    eprintln!("restarted {gap:?} after the command exited");
    assert!(gap >= Duration::from_secs(1), "restarted after {gap:?}, before the default 1 s");
    // The delay, then stepping down and the election: a few round trips.
    assert!(gap <= Duration::from_secs(1) + SCHED_SLACK * 2, "restarted only after {gap:?}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).await.unwrap();
    assert!(stderr.contains("the command exited (76)"), "{stderr}");
    assert!(!stderr.contains("lost"), "the command's 76 is not a lost leadership: {stderr}");
    assert!(matches!(status.code(), Some(76) | Some(143)), "{status:?} {stderr}");
    wait_for_queue(&path, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_the_fencing_token() {
    let path = unique_path("token");
    let mut child =
        zklock(&["run", &path, "--", "sh", "-c", "echo \"$ZKLOCK_PATH $ZKLOCK_NODE $ZKLOCK_FENCING_TOKEN\"; sleep 2"])
            .await
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!(parts[0], path);
    assert!(parts[1].starts_with(&format!("{path}/_c_")), "{line}");
    let token: i64 = parts[2].parse().unwrap_or_else(|_| panic!("a number: {line}"));
    // The token is the czxid of the node we hold.
    let client = zookeeper().await.client().await.unwrap();
    let (_, stat) = client.get_data(parts[1]).await.unwrap();
    assert_eq!(stat.czxid, token);
    assert!(child.wait().await.unwrap().success());
}

/// The holder's connection stalls: zklock learns the lock is lost (before ZooKeeper could give it
/// to anyone else), stops the command and exits 76; SIGKILL follows when SIGTERM is ignored.
/// Timing (README: a stalled holder is told ≤ 0.4 T under the default policy): zklock has exited
/// — so the command's whole process group is gone — within 0.4 T, plus `--kill-after` when
/// SIGTERM is ignored, plus the documented scheduling slack; that is below T, so before the
/// server can expire the session and grant the lock to anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_stops_the_command() {
    let server = zookeeper().await;
    let t = Duration::from_secs(4);
    let kill_after = Duration::from_secs(1);
    for (script, expect_term) in [
        ("trap 'echo term; exit 0' TERM; echo started; sleep 30 & wait", true),
        ("trap '' TERM; echo started; sleep 30", false),
    ] {
        let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
        let path = unique_path("stalled");
        let started = Instant::now();
        let mut child = zklock(&[
            "run",
            "--connect",
            &proxy.addr(),
            "--session-timeout",
            &format!("{}s", t.as_secs()),
            "--kill-after",
            &format!("{}s", kill_after.as_secs()),
            &path,
            "--",
            "sh",
            "-c",
            script,
        ])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (first, _) = next_line(&mut lines, "zklock").await;
        assert_eq!(first, "started");
        past_cold_start(t).await;
        proxy.stall();
        let stalled_at = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
        let told_in = stalled_at.elapsed();
        // The command's whole process group is stopped: its `sleep` holds stdout open otherwise.
        let mut rest = String::new();
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push_str(&line);
            }
        })
        .await
        .expect("everything the command started was stopped");
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).await.unwrap();
        assert_eq!(status.code(), Some(76), "{stderr}");
        assert!(stderr.contains("lost"), "{stderr}");
        assert_eq!(rest.contains("term"), expect_term, "{rest}");
        // Told within 0.4 T of the stall (Suspended policy), plus the SIGKILL grace when needed.
        let bound = t * 2 / 5 + if expect_term { Duration::ZERO } else { kill_after };
        assert!(bound + SCHED_SLACK < t, "the test's own bound must be below T");
        assert!(
            told_in <= bound + SCHED_SLACK,
            "zklock exited {told_in:?} after the stall; bound 0.4 T{} = {bound:?} + SCHED_SLACK {SCHED_SLACK:?}",
            if expect_term { "" } else { " + --kill-after" }
        );
        eprintln!("lost after {told_in:?} (total {:?})", started.elapsed());
        proxy.pass();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_the_queue_in_order() {
    use zk_recipes::zookeeper_client as zk;
    let path = unique_path("status");
    // A path nobody used (or mistyped): said so, with its own status — not "free".
    let out = run(&["status", &path]).await;
    assert_eq!(out.code, Some(66), "{}", out.stderr);
    assert!(out.stderr.contains("no such lock path"), "{}", out.stderr);
    assert!(!out.stdout.contains("free"), "{}", out.stdout);
    // An existing lock path with nobody queued is free.
    let admin = zookeeper().await.client().await.unwrap();
    admin.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let out = run(&["status", &path]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("free"), "{}", out.stdout);

    let holder = hold(&path, "the-holder").await;
    let waiter = zklock(&["run", "--data", "the-waiter", &path, "--", "true"]).await.spawn().unwrap();
    wait_for_queue(&path, 2).await;
    let default_data = zklock(&["run", &path, "--", "true"]).await.spawn().unwrap();
    let default_pid = default_data.id().unwrap();
    wait_for_queue(&path, 3).await;
    let document = status(&path).await;
    assert_eq!(document["lock_path"], path.as_str());
    let participants = document["participants"].as_array().unwrap();
    assert_eq!(participants[0]["data"], "the-holder");
    assert_eq!(participants[0]["holder"], true);
    assert_eq!(participants[1]["data"], "the-waiter");
    assert_eq!(participants[1]["holder"], false);
    assert!(participants[2]["data"].as_str().unwrap().ends_with(&format!(":{default_pid}")), "{document}");
    for (i, p) in participants.iter().enumerate() {
        assert_eq!(p["position"], i);
        assert!(p["session"].as_str().unwrap().starts_with("0x"), "{document}");
        assert!(p["node"].as_str().unwrap().starts_with(&format!("{path}/_c_")), "{document}");
    }
    let sequences: Vec<i64> = participants.iter().map(|p| p["sequence"].as_i64().unwrap()).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    assert_eq!(participants[0]["role"], "holder", "{document}");
    assert_eq!(document["kind"], "lock", "{document}");
    let text = run(&["status", &path]).await.stdout;
    assert!(text.lines().next().unwrap().contains("holder"), "{text}");
    // The containment `auto` gives here, as a command started here with --verbose reports it.
    let here = document["containment_here"].as_str().unwrap_or_default().to_owned();
    assert!(text.ends_with(&format!("containment here (--containment auto): {here}\n")), "{text}");
    let verbose = run(&["run", "--verbose", &unique_path("status-probe"), "--", "true"]).await.stderr;
    let said = match here.as_str() {
        "pid-namespace" => "containment: PID namespace",
        "trace" => "containment: traced",
        "subreaper" => "containment: child subreaper",
        other => panic!("containment_here {other:?}"),
    };
    assert!(verbose.contains(said), "status says {here}, run --verbose says {verbose}");

    holder.release().await;
    for mut child in [waiter, default_data] {
        assert!(child.wait().await.unwrap().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_one_line_and_a_non_zero_exit() {
    let server = zookeeper().await;
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let unreachable = format!("127.0.0.1:{closed_port}");
    let missing_chroot = format!("{}/zklock-no-such-chroot", server.connect_string());
    let auth_file = "/nonexistent/zklock-auth";
    // (arguments, exit status, what stderr says, whether it is our one-line error: clap's usage
    // errors add a usage hint).
    let cases: Vec<(Vec<&str>, i32, &str, bool)> = vec![
        (vec!["run", "locks/relative", "--", "true"], 64, "must start with '/'", true),
        (vec!["run", "/locks/a/", "--", "true"], 64, "must not end with '/'", true),
        (vec!["status", "/zookeeper/quota"], 64, "reserved", true),
        (vec!["run", "/locks/a"], 64, "COMMAND", false),
        (vec!["run", "--nonblock", "--timeout", "1s", "/locks/a", "--", "true"], 64, "cannot be used with", false),
        (vec!["run", "--timeout", "soon", "/locks/a", "--", "true"], 64, "not a duration", false),
        (vec!["run", "--bogus", "/locks/a", "--", "true"], 64, "--bogus", false),
        (
            vec!["run", "--connect", &unreachable, "--connect-timeout", "1s", "/locks/a", "--", "true"],
            69,
            "cannot connect",
            true,
        ),
        (vec!["status", "--connect", &unreachable, "--connect-timeout", "1s", "/locks/a"], 69, &unreachable, true),
        (vec!["run", "--connect", &missing_chroot, "/locks/a", "--", "true"], 69, "chroot", true),
        (vec!["status", "--connect", &missing_chroot, "/locks/a"], 69, "chroot", true),
        (vec!["status", "/zklock-tests/no-such-lock-path"], 66, "no such lock path", true),
        (
            vec!["run", "--kill-after", "10000000000000000000", "/locks/a", "--", "true"],
            64,
            "longer than a year",
            false,
        ),
        (vec!["run", "--auth-file", auth_file, "/locks/a", "--", "true"], 64, "auth file", true),
        (vec!["run", "/zklock-tests/not-found", "--", "/no/such/command"], 127, "cannot run", true),
    ];
    for (args, code, says, one_line) in cases {
        let out = run(&args).await;
        assert_eq!(out.code, Some(code), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(out.took < Duration::from_secs(10), "{args:?} took {:?}", out.took);
        if one_line {
            assert_eq!(out.stderr.trim().lines().count(), 1, "{args:?}: {}", out.stderr);
        }
    }
    // --help is complete: every option and the exit codes.
    let help = run(&["run", "--help"]).await;
    assert_eq!(help.code, Some(0));
    for word in [
        "--connect",
        "--timeout",
        "--nonblock",
        "--conflict-exit-code",
        "--data",
        "--kill-after",
        "--quiet",
        "Exit status",
        "ZKLOCK_FENCING_TOKEN",
    ] {
        assert!(help.stdout.contains(word), "--help lacks {word}: {}", help.stdout);
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT while waiting: zklock gives its queued node up and exits
/// 128+N. While the command runs, each is forwarded to it, and zklock exits with its status
/// (128+N: the command died of it) once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_waiting_leaves_no_node() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        let path = unique_path("signal-waiting");
        let holder = hold(&path, "holder").await;
        let waiter = zklock(&["run", &path, "--", "true"]).await.spawn().unwrap();
        wait_for_queue(&path, 2).await;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(waiter.id().unwrap() as libc::pid_t, signal) };
        let out = tokio::time::timeout(Duration::from_secs(10), waiter.wait_with_output()).await.unwrap().unwrap();
        assert_eq!(out.status.code(), Some(128 + signal), "signal {signal} while waiting");
        assert_eq!(queue_len(&path).await, 1, "only the holder is left (signal {signal})");
        holder.release().await;

        // While the command runs, the signal is forwarded to it; zklock exits with its status.
        let running = zklock(&["run", &path, "--", "sh", "-c", "echo started; exec sleep 30"])
            .await
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = running.id().unwrap();
        let mut running = running;
        let mut lines = BufReader::new(running.stdout.take().unwrap()).lines();
        let (first, _) = next_line(&mut lines, "zklock").await;
        assert_eq!(first, "started");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
        let status = tokio::time::timeout(Duration::from_secs(10), running.wait()).await.unwrap().unwrap();
        assert_eq!(status.code(), Some(128 + signal), "the command was killed by the forwarded signal {signal}");
        wait_for_queue(&path, 0).await;
    }
}

/// SIGTSTP (Ctrl-Z) is ignored: zklock is not stopped (a stopped holder would lose the lock
/// while its command runs on), says so, and the command runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigtstp_is_ignored() {
    let path = unique_path("sigtstp");
    let mut child = zklock(&["run", &path, "--", "sh", "-c", "echo started; sleep 1; echo done"])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as libc::pid_t;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (first, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(first, "started");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGTSTP) };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rfind(')').and_then(|at| stat[at + 1..].split_whitespace().next()).unwrap_or("?").to_owned();
    assert_ne!(state, "T", "zklock was stopped by SIGTSTP");
    let (done, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(done, "done", "the command ran to its end");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).await.unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("ignoring SIGTSTP"), "{stderr}");
}

/// `zklock leader` and SIGHUP (a service manager's reload): forwarded to the running command; a
/// command that dies of it is restarted like any command that exits; while no command runs
/// (the restart delay) SIGHUP is ignored — it never ends zklock leader. SIGTERM then does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_forwards_sighup_and_is_not_ended_by_it() {
    let path = unique_path("leader-hup");
    let mut child = zklock(&["leader", "--restart-delay", "2s", &path, "--", "sh", "-c", "echo run; exec sleep 300"])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap() as libc::pid_t;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    assert_eq!(line, "run");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    // The command died of it; zklock steps down and is in its 2 s restart delay: SIGHUP again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    assert_eq!(line, "run", "restarted after the command died of SIGHUP");
    assert!(child.try_wait().unwrap().is_none(), "zklock leader ended on SIGHUP");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).await.unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("the command exited (129)"), "the forwarded SIGHUP killed the command: {stderr}");
    assert!(stderr.contains("ignoring SIGHUP"), "{stderr}");
    wait_for_queue(&path, 0).await;
}

/// The progress line: shown on a terminal (a pseudo-terminal from script(1)) while waiting
/// longer than a second, never when stderr is not a terminal, nor with --quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_line_only_on_a_terminal() {
    let path = unique_path("progress");
    let holder = hold(&path, "holder").await;
    let zk_connect = zookeeper().await.connect_string().to_owned();
    let in_pty = |quiet: bool| {
        let quiet = if quiet { "--quiet " } else { "" };
        let mut command = Command::new("script");
        command
            .args(["-qfec", &format!("{ZKLOCK} run {quiet}{path} -- true"), "/dev/null"])
            .env("ZK_CONNECT", &zk_connect)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    };
    let piped_args = ["run", path.as_str(), "--", "true"];
    let release_later = async {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        holder.release().await;
    };
    let (on_terminal, quiet, piped, ()) =
        tokio::join!(output(in_pty(false)), output(in_pty(true)), run(&piped_args), release_later);
    for waited in [&on_terminal, &quiet, &piped] {
        assert!(waited.took >= Duration::from_secs(2), "each run waited over a second: {:?}", waited.took);
    }
    assert_eq!(on_terminal.code, Some(0), "{}", on_terminal.stderr);
    assert!(
        on_terminal.stdout.contains(&format!("waiting for {path}: position")),
        "no progress line on a terminal: {:?}",
        on_terminal.stdout
    );
    assert!(!quiet.stdout.contains("waiting for"), "{:?}", quiet.stdout);
    assert_eq!(piped.code, Some(0));
    assert!(!piped.stderr.contains("waiting for"), "{:?}", piped.stderr);
}

/// Digest credentials come from ZKLOCK_AUTH or an auth file, never argv, and never show up in
/// output; a protected lock path refuses everyone else with exit 77.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_from_the_environment_or_a_file() {
    use zk_recipes::zookeeper_client as zk;
    let server = zookeeper().await;
    let path = unique_path("auth");
    let owner = zk::Client::connector()
        .with_auth("digest", b"ops:zklock-pw-123")
        .connect(server.connect_string())
        .await
        .unwrap();
    // The tests' root first, open to all: `mkdir` would otherwise create it with the protected
    // path's creator-only ACL when this test runs first, and refuse every other test.
    owner.mkdir("/zklock-tests", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    owner.mkdir(&path, &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())).await.unwrap();

    let refused = run(&["run", &path, "--", "true"]).await;
    assert_eq!(refused.code, Some(77), "{}", refused.stderr);
    assert!(refused.stderr.contains("not authorized"), "{}", refused.stderr);

    // The credentials are ours, not the command's: not in its environment.
    let mut with_env = zklock(&["run", &path, "--", "sh", "-c", "echo \"auth=${ZKLOCK_AUTH:-none}\""]).await;
    with_env.env("ZKLOCK_AUTH", "ops:zklock-pw-123");
    let out = output(with_env).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "auth=none");

    let file = std::env::temp_dir().join(format!("zklock-auth-{}", std::process::id()));
    std::fs::write(&file, "ops:zklock-pw-123\n").unwrap();
    let out = run(&["run", "--auth-file", file.to_str().unwrap(), &path, "--", "true"]).await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let status = run(&["status", "--auth-file", file.to_str().unwrap(), &path]).await;
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    let _ = std::fs::remove_file(&file);

    let mut wrong = zklock(&["run", &path, "--", "true"]).await;
    wrong.env("ZKLOCK_AUTH", "ops:wrong-password");
    let out = output(wrong).await;
    assert_eq!(out.code, Some(77), "{}", out.stderr);
    for shown in [&out.stdout, &out.stderr, &refused.stderr] {
        assert!(!shown.contains("zklock-pw-123") && !shown.contains("wrong-password"), "{shown}");
    }
    // There is no option that takes credentials.
    let help = run(&["run", "--help"]).await.stdout;
    assert!(!help.contains("--auth ") && !help.contains("--password"), "{help}");
}

/// zklock killed (SIGKILL: no chance to clean up) takes its command with it, so the command
/// never runs on without the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_dies_with_zklock() {
    for containment in HOST_PIDS {
        eprintln!("--containment {containment}");
        the_command_dies_with_zklock_in(containment).await;
    }
}

async fn the_command_dies_with_zklock_in(containment: &str) {
    let path = unique_path("dies-with");
    let mut zklock_process = zklock_in(containment, &["run", &path, "--", "sh", "-c", "echo $$; sleep 30"])
        .await
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(zklock_process.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    let command_pid: libc::pid_t = line.trim().parse().unwrap();
    zklock_process.start_kill().unwrap();
    zklock_process.wait().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    while unsafe { libc::kill(command_pid, 0) } == 0 {
        assert!(Instant::now() < deadline, "the command outlived zklock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Start time (field 22 of `/proc/PID/stat`) and session (field 6) of a live process, `None`
/// when it is gone or a zombie.
fn proc_stat(pid: libc::pid_t) -> Option<(u64, libc::pid_t)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = text.get(text.rfind(')')? + 1..)?.split_ascii_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some((fields.get(19)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}

/// Whether the process that started at `started` still runs as `pid` (a recycled pid is not it).
fn still_runs(pid: libc::pid_t, started: u64) -> bool {
    proc_stat(pid).is_some_and(|(now, _)| now == started)
}

/// Processes a test started through zklock: SIGKILLed on drop if they still run, so that a
/// failing test leaves no `sleep 300` behind; and a scratch directory for their pid files.
struct Descendants {
    dir: std::path::PathBuf,
    pids: Vec<(libc::pid_t, u64)>,
}

impl Descendants {
    fn new(name: &str) -> Descendants {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("zklock-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Descendants { dir, pids: Vec::new() }
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// Waits for the pid file `name` (written with a rename, so whole), and records that live
    /// process with its start time and session.
    async fn read(&mut self, name: &str) -> (libc::pid_t, u64, libc::pid_t) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let pid: libc::pid_t = loop {
            if let Ok(text) = std::fs::read_to_string(self.dir.join(name)) {
                break text.trim().parse().unwrap_or_else(|_| panic!("a pid in {name}: {text:?}"));
            }
            assert!(Instant::now() < deadline, "{name} was never written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (started, session) = proc_stat(pid).unwrap_or_else(|| panic!("{name} ({pid}) runs"));
        self.pids.push((pid, started));
        (pid, started, session)
    }
}

impl Drop for Descendants {
    fn drop(&mut self) {
        for &(pid, started) in &self.pids {
            if still_runs(pid, started) {
                // SAFETY: kill(2) on a process this test started (checked by its start time).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Watches `processes` (pid, start time) on a thread of its own, from now: when each was first
/// seen gone (nanoseconds since the epoch), `None` for one still running after 30 s.
fn watch_until_gone(processes: Vec<(libc::pid_t, u64)>) -> std::thread::JoinHandle<Vec<Option<u128>>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut gone_at: Vec<Option<u128>> = vec![None; processes.len()];
        while gone_at.iter().any(Option::is_none) && Instant::now() < deadline {
            for (i, &(pid, started)) in processes.iter().enumerate() {
                if gone_at[i].is_none() && !still_runs(pid, started) {
                    gone_at[i] = Some(epoch_nanos());
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        gone_at
    })
}

/// Nanoseconds since the epoch (what `date +%s%N` prints).
fn epoch_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// zklock killed by SIGKILL while its command has a grandchild (in the command's process group)
/// and a great-grandchild that left it (`setsid`, then orphaned by a double fork): both are dead
/// within T/4 of the kill, and before the next zklock on the lock starts its command (ZooKeeper
/// grants it no earlier than about 0.7 T after the kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_descendant_outlives_a_killed_zklock() {
    for containment in HOST_PIDS {
        eprintln!("--containment {containment}");
        no_descendant_outlives_a_killed_zklock_in(containment).await;
    }
}

async fn no_descendant_outlives_a_killed_zklock_in(containment: &str) {
    let session_timeout = Duration::from_secs(4);
    let path = unique_path("descendants");
    let mut descendants = Descendants::new("descendants");
    let (grandchild, setsid) = (descendants.file("grandchild"), descendants.file("setsid"));
    let script = format!(
        "sh -c 'sleep 300 & echo $! > {grandchild}.tmp; mv {grandchild}.tmp {grandchild}; \
         setsid sh -c \"sleep 300 & echo \\$! > {setsid}.tmp; mv {setsid}.tmp {setsid}\"; wait' & \
         echo started; wait"
    );
    let mut first = zklock_in(containment, &["run", "--session-timeout", "4s", &path, "--", "sh", "-c", &script])
        .await
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(line, "started");
    let (grandchild_pid, grandchild_started, grandchild_session) = descendants.read("grandchild").await;
    let (setsid_pid, setsid_started, setsid_session) = descendants.read("setsid").await;
    assert_ne!(setsid_session, grandchild_session, "the great-grandchild left the command's session");

    // Watches both from before the kill: when each was first seen gone.
    let watcher = watch_until_gone(vec![(grandchild_pid, grandchild_started), (setsid_pid, setsid_started)]);

    first.start_kill().unwrap();
    let killed_at = epoch_nanos();
    first.wait().await.unwrap();
    let next = run_in(containment, &["run", "--session-timeout", "4s", &path, "--", "sh", "-c", "date +%s%N"]).await;
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    let next_started: u128 = next.stdout.trim().parse().unwrap_or_else(|_| panic!("a time: {:?}", next.stdout));
    let gone_at = watcher.join().unwrap();
    for (name, gone_at) in [("the grandchild", gone_at[0]), ("the setsid great-grandchild", gone_at[1])] {
        let gone_at = gone_at.unwrap_or_else(|| panic!("{name} outlived zklock (30 s after the kill)"));
        let after_kill = Duration::from_nanos(gone_at.saturating_sub(killed_at) as u64);
        eprintln!(
            "{name} gone {after_kill:?} after the kill; the next command started {:?} after the kill",
            Duration::from_nanos(next_started.saturating_sub(killed_at) as u64)
        );
        assert!(gone_at < next_started, "{name} still ran when the next holder's command started");
        assert!(after_kill < session_timeout / 4, "{name} gone only {after_kill:?} after the kill");
    }
}

/// A lost lock (stalled connection) stops a descendant that left the command's process group
/// and session (`setsid` and a double fork) before zklock exits 76; and when the command exits,
/// what it left running is stopped before the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_or_the_commands_exit_stops_setsid_descendants() {
    for containment in HOST_PIDS {
        eprintln!("--containment {containment}");
        a_lost_lock_or_the_commands_exit_stops_setsid_descendants_in(containment).await;
    }
}

async fn a_lost_lock_or_the_commands_exit_stops_setsid_descendants_in(containment: &str) {
    let server = zookeeper().await;
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let path = unique_path("lost-setsid");
    let mut descendants = Descendants::new("lost-setsid");
    let daemon = descendants.file("daemon");
    let script =
        format!("setsid sh -c 'sleep 300 & echo $! > {daemon}.tmp; mv {daemon}.tmp {daemon}'; echo started; sleep 300");
    let mut child = zklock_in(
        containment,
        &[
            "run",
            "--connect",
            &proxy.addr(),
            "--session-timeout",
            "4s",
            "--kill-after",
            "1s",
            &path,
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(line, "started");
    let (pid, started, _) = descendants.read("daemon").await;
    // The next holder, queued on the server directly, says when its command started.
    let next_file = descendants.file("next");
    let next = next_holder(&path, &next_file).await;
    wait_for_queue(&path, 2).await;
    past_cold_start(Duration::from_secs(4)).await;
    let watcher = watch_until_gone(vec![(pid, started)]);
    let stalled_at = epoch_nanos();
    proxy.stall();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
    let exited_at = epoch_nanos();
    let next_started = read_time(&next_file, Duration::from_secs(30)).await;
    let gone_at = watcher.join().unwrap()[0].expect("the setsid descendant outlived the lost lock (30 s)");
    let stderr = stderr_of(&mut child).await;
    proxy.pass();
    assert!(next.wait_with_output().await.unwrap().status.success());
    let after = |ns: u128| Duration::from_nanos(ns.saturating_sub(stalled_at) as u64);
    eprintln!(
        "stalled: the setsid descendant gone after {:?}, zklock exited after {:?}, the next holder's command started \
         after {:?}",
        after(gone_at),
        after(exited_at),
        after(next_started)
    );
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(gone_at < next_started, "the setsid descendant ran when the next holder's command started");
    // Told within 0.4 T of the stall (README); `sleep` dies of the SIGTERM at once.
    let bound = Duration::from_secs(4) * 2 / 5 + SCHED_SLACK;
    assert!(
        after(gone_at) <= bound,
        "the setsid descendant gone {:?} after the stall; bound {bound:?}",
        after(gone_at)
    );
    assert!(after(exited_at) <= bound, "zklock exited {:?} after the stall; bound {bound:?}", after(exited_at));

    // The command exits, leaving a setsid descendant: it is gone before the next holder starts.
    let left = descendants.file("left");
    let holder = hold(&path, "holder").await;
    let script = format!("setsid sh -c 'sleep 300 & echo $! > {left}.tmp; mv {left}.tmp {left}'; sleep 1; exit 3");
    let mut leaving = zklock_in(containment, &["run", &path, "--", "sh", "-c", &script]).await.spawn().unwrap();
    wait_for_queue(&path, 2).await;
    let next_file = descendants.file("next-2");
    let next = zklock(&["run", &path, "--", "sh", "-c", &stamp(&next_file)]).await.spawn().unwrap();
    wait_for_queue(&path, 3).await;
    // Not awaited here: the holder's exit (after its release) may take longer than the command runs.
    let released = tokio::spawn(holder.release());
    let (pid, started, _) = descendants.read("left").await;
    let watcher = watch_until_gone(vec![(pid, started)]);
    released.await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), leaving.wait()).await.expect("zklock exits").unwrap();
    assert_eq!(status.code(), Some(3), "the command's status");
    let next_started = read_time(&next_file, Duration::from_secs(20)).await;
    let gone_at = watcher.join().unwrap()[0].expect("what the command left running outlived the lock (30 s)");
    assert!(gone_at < next_started, "what the command left running ran when the next holder's command started");
    assert!(next.wait_with_output().await.unwrap().status.success());
}

/// The supervisor killed on its own (SIGKILL): the command dies with it, and zklock, which adopts
/// what the command started, kills that before it releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_leaves_no_descendant() {
    for containment in HOST_PIDS {
        eprintln!("--containment {containment}");
        a_killed_supervisor_leaves_no_descendant_in(containment).await;
    }
}

async fn a_killed_supervisor_leaves_no_descendant_in(containment: &str) {
    let path = unique_path("supervisor-killed");
    let mut descendants = Descendants::new("supervisor-killed");
    let daemon = descendants.file("daemon");
    let script = format!(
        "setsid sh -c 'sleep 300 & echo $! > {daemon}.tmp; mv {daemon}.tmp {daemon}'; echo $PPID; sleep 300 & wait"
    );
    let mut child = zklock_in(containment, &["run", &path, "--", "sh", "-c", &script])
        .await
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    let supervisor: libc::pid_t = line.trim().parse().unwrap();
    let (pid, started, _) = descendants.read("daemon").await;
    let parent_of_supervisor = std::fs::read_to_string(format!("/proc/{supervisor}/stat")).unwrap();
    assert!(
        parent_of_supervisor.contains(&format!(") S {} ", child.id().unwrap()))
            || parent_of_supervisor.contains(&format!(") R {} ", child.id().unwrap())),
        "the command's parent is zklock's child: {parent_of_supervisor}"
    );
    // SAFETY: kill(2) on zklock's child, checked above.
    unsafe { libc::kill(supervisor, libc::SIGKILL) };
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
    let daemon_ran_on = still_runs(pid, started);
    assert_eq!(status.code(), Some(128 + 9));
    assert!(!daemon_ran_on, "the setsid descendant outlived the lock");
    wait_for_queue(&path, 0).await;
}

/// Prints these files (children's stderr) if the test is failing, and removes them.
struct ShowOnPanic(Vec<std::path::PathBuf>);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        for file in &self.0 {
            if std::thread::panicking() {
                let text = std::fs::read_to_string(file).unwrap_or_default();
                eprintln!("--- {} ---\n{text}", file.display());
            }
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The next line of a child's output, within 20 s, with the instant it was read.
async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    who: &str,
) -> (String, Instant) {
    match tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
        Ok(Ok(Some(line))) => (line, Instant::now()),
        other => panic!("no line from {who}: {other:?}"),
    }
}

/// `zklock leader`: one active instance among two. The leader's connection stalls: its command
/// is stopped (SIGTERM) within 0.4 T — before the other's command starts, which ZooKeeper allows
/// only once it expired the stalled session. The stalled one joins again on a new session and,
/// when the other is stopped with SIGTERM (forwarded; it exits with its command's status), leads
/// again and restarts its command. Fencing tokens grow; `status` lists the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_runs_one_active_instance() {
    let server = zookeeper().await;
    let t = Duration::from_secs(4);
    let path = unique_path("leader");
    // Each line carries the instant the command printed it (`date +%s%N`): the order of the two
    // commands' actions is read from those, not from when the test happened to read the lines.
    // (The trap ignores further TERMs: the supervisor signals the group and each process in it,
    // and a second TERM during the `date` would run the trap twice.)
    let script =
        "echo leading $ZKLOCK_FENCING_TOKEN $(date +%s%N); trap 'trap \"\" TERM; echo term $(date +%s%N); exit 0' TERM; sleep 300 & wait";
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let session_timeout = format!("{}s", t.as_secs());
    // Each instance's stderr goes to a file, shown if the test fails (CI saw `a` exit once under
    // load, with nothing to say why).
    let stderr_of = |id: &str| std::env::temp_dir().join(format!("zklock-leader-{id}-{}.err", std::process::id()));
    let _shown = ShowOnPanic(vec![stderr_of("a"), stderr_of("b")]);
    let spawn = |connect: String, id: &'static str| {
        let (path, session_timeout) = (path.clone(), session_timeout.clone());
        let stderr = std::fs::File::create(stderr_of(id)).unwrap();
        async move {
            zklock(&[
                "leader",
                "--connect",
                &connect,
                "--session-timeout",
                &session_timeout,
                "--data",
                id,
                &path,
                "--",
                "sh",
                "-c",
                script,
            ])
            .await
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap()
        }
    };
    // `leading <token> <ns>` → (token, ns); `term <ns>` → ns.
    let leading = |line: &str| -> (i64, u128) {
        let mut words = line.strip_prefix("leading ").expect(line).split(' ');
        (words.next().and_then(|t| t.parse().ok()).expect(line), words.next().and_then(|t| t.parse().ok()).expect(line))
    };
    let term = |line: &str| -> u128 { line.strip_prefix("term ").and_then(|t| t.parse().ok()).expect(line) };
    let mut a = spawn(proxy.addr(), "a").await;
    let mut a_lines = BufReader::new(a.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut a_lines, "a").await;
    let (first, _) = leading(&line);
    let mut b = spawn(server.connect_string().to_owned(), "b").await;
    let mut b_lines = BufReader::new(b.stdout.take().unwrap()).lines();
    wait_for_queue(&path, 2).await;
    let listed = status(&path).await;
    assert_eq!(listed["participants"][0]["data"], "a", "{listed}");
    assert_eq!(listed["participants"][0]["holder"], true, "{listed}");
    assert_eq!(listed["participants"][0]["role"], "leader", "{listed}");
    assert_eq!(listed["kind"], "election", "{listed}");

    past_cold_start(t).await;
    let stalled_at = epoch_nanos();
    proxy.stall();
    let (line, _) = next_line(&mut a_lines, "a").await;
    let stopped_at = term(&line);
    let (line, _) = next_line(&mut b_lines, "b").await;
    let (second, b_started_at) = leading(&line);
    let since_stall = |ns: u128| Duration::from_nanos(ns.saturating_sub(stalled_at) as u64);
    eprintln!(
        "leader stalled: its command stopped after {:?}, the other's started after {:?}",
        since_stall(stopped_at),
        since_stall(b_started_at)
    );
    assert!(stopped_at < b_started_at, "the stalled leader's command ran on after the other's started");
    assert!(
        since_stall(stopped_at) <= t * 2 / 5 + SCHED_SLACK,
        "stopped {:?} after the stall",
        since_stall(stopped_at)
    );
    assert!(second > first, "fencing tokens grow: {first} then {second}");

    // a comes back on a new session and queues; b is stopped from outside: a leads again.
    proxy.pass();
    wait_for_queue(&path, 2).await;
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(b.id().unwrap() as libc::pid_t, libc::SIGTERM) };
    let (line, _) = next_line(&mut b_lines, "b").await;
    term(&line);
    let status_b = tokio::time::timeout(Duration::from_secs(20), b.wait()).await.expect("b exits").unwrap();
    assert_eq!(status_b.code(), Some(0), "b exits with its command's status");
    let (line, _) = next_line(&mut a_lines, "a").await;
    let (third, _) = leading(&line);
    assert!(third > second, "fencing tokens grow: {second} then {third}");
    unsafe { libc::kill(a.id().unwrap() as libc::pid_t, libc::SIGTERM) };
    let (line, _) = next_line(&mut a_lines, "a").await;
    term(&line);
    let status_a = tokio::time::timeout(Duration::from_secs(20), a.wait()).await.expect("a exits").unwrap();
    assert_eq!(status_a.code(), Some(0));
    wait_for_queue(&path, 0).await;
}

/// A command that exits by itself while leading is restarted after `--restart-delay` (this
/// process steps down and joins again); SIGTERM during the delay ends zklock with 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_restarts_a_command_that_exits() {
    let path = unique_path("leader-restart");
    let delay = Duration::from_secs(2);
    let mut child =
        zklock(&["leader", "--restart-delay", "2s", &path, "--", "sh", "-c", "echo run $(date +%s%N); exit 3"])
            .await
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The instant the command printed its line (`date +%s%N`).
    let ran = |line: &str| -> u128 { line.strip_prefix("run ").and_then(|t| t.parse().ok()).expect(line) };
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    let first = ran(&line);
    let (line, _) = next_line(&mut lines, "zklock leader").await;
    let second = ran(&line);
    let gap = Duration::from_nanos((second - first) as u64);
    assert!(gap >= delay, "restarted after {gap:?}, before --restart-delay");
    // The command has exited (it exits right after its line); zklock is in its restart delay.
    tokio::time::sleep(delay / 2).await;
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id().unwrap() as libc::pid_t, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    wait_for_queue(&path, 0).await;
}

/// A unique `sleep` duration (`300.<n>`), so a test finds its own `sleep` among the host's
/// processes by its command line — also one started in a PID namespace, whose `$!` is not the
/// host's pid.
fn marked_sleep() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = std::process::id() as u64 * 1000 + N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("300.{n}")
}

/// The host pid and start time of the live process whose command line is `sleep <marker>`.
fn find_sleep(marker: &str) -> Option<(libc::pid_t, u64)> {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        (cmdline == wanted.as_bytes()).then_some(())?;
        Some((pid, proc_stat(pid)?.0))
    })
}

/// The children of `parent` (host pids).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|_| ppid_of(pid) == Some(parent)))
        .collect()
}

fn ppid_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text.get(text.rfind(')')? + 1..)?.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// `--containment pid-namespace` and `trace`: zklock and its supervisor SIGKILLed together (what
/// `pkill -9 -f zklock` does; review C case 1): the kernel kills the whole namespace, or every
/// process the supervisor traced — the command's child and a `setsid` descendant are gone within
/// T/4 of the kill and before the next holder's command starts. `--verbose` names the
/// containment. (With `subreaper` both run on: the README says so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_outlives_zklock_and_its_supervisor_killed_together() {
    for (containment, named) in [("pid-namespace", "containment: PID namespace"), ("trace", "containment: traced")] {
        eprintln!("--containment {containment}");
        both_killed_in(containment, named).await;
    }
}

async fn both_killed_in(containment: &str, named: &str) {
    let session_timeout = Duration::from_secs(4);
    let path = unique_path("both-killed");
    let (child_marker, setsid_marker) = (marked_sleep(), marked_sleep());
    let script = format!("sleep {child_marker} & setsid sh -c 'sleep {setsid_marker} & wait' & echo started; wait");
    let mut first = zklock(&[
        "run",
        "--containment",
        containment,
        "--verbose",
        "--session-timeout",
        "4s",
        &path,
        "--",
        "sh",
        "-c",
        &script,
    ])
    .await
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let zklock_pid = first.id().unwrap() as libc::pid_t;
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(line, "started");
    let mut errors = BufReader::new(first.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(Duration::from_secs(5), errors.next_line()).await.unwrap().unwrap();
    assert!(said.as_deref().is_some_and(|l| l.contains(named)), "--verbose said {said:?}");
    let mut watched = Vec::new();
    for marker in [&child_marker, &setsid_marker] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = loop {
            if let Some(found) = find_sleep(marker) {
                break found;
            }
            assert!(Instant::now() < deadline, "sleep {marker} never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        watched.push(found);
    }
    let watcher = watch_until_gone(watched.clone());
    kill_together(zklock_pid);
    let killed_at = epoch_nanos();
    first.wait().await.unwrap();
    let next = run(&["run", "--session-timeout", "4s", &path, "--", "sh", "-c", "date +%s%N"]).await;
    assert_eq!(next.code, Some(0), "{}", next.stderr);
    let next_started: u128 = next.stdout.trim().parse().unwrap_or_else(|_| panic!("a time: {:?}", next.stdout));
    let gone_at = watcher.join().unwrap();
    for ((name, gone_at), (pid, started)) in
        ["the child", "the setsid descendant"].into_iter().zip(gone_at).zip(watched)
    {
        let Some(gone_at) = gone_at else {
            // SAFETY: kill(2) on a process this test started (checked by its start time).
            if still_runs(pid, started) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("{name} outlived zklock and its supervisor (30 s after the kill)");
        };
        let after_kill = Duration::from_nanos(gone_at.saturating_sub(killed_at) as u64);
        eprintln!(
            "{name} gone {after_kill:?} after the kill; the next command started {:?} after the kill",
            Duration::from_nanos(next_started.saturating_sub(killed_at) as u64)
        );
        assert!(gone_at < next_started, "{name} still ran when the next holder's command started");
        assert!(after_kill < session_timeout / 4 + SCHED_SLACK, "{name} gone only {after_kill:?} after the kill");
    }
}

/// A program whose main thread exits while another thread sleeps (`pthread_exit`): its
/// `/proc/PID/stat` says `Z`, yet it runs. Python's ctypes calls `pthread_exit` on the main thread.
const LEADERLESS: &str = "import ctypes, sys, threading, time\n\
    threading.Thread(target=time.sleep, args=(300,)).start()\n\
    print(__import__('os').getpid(), flush=True)\n\
    ctypes.CDLL(None).pthread_exit(None)\n";

/// Whether any thread of `pid` still runs (not a zombie).
fn any_thread_runs(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|text| text.rfind(')').map(|at| text[at + 1..].trim_start().starts_with('Z')))
            == Some(false)
    })
}

/// Subreaper containment (the default): a `setsid` descendant whose main thread exited while
/// another runs (review C cases 2 and 3) is a live process: it is killed when zklock is killed,
/// and when the command exits it is stopped before the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descendant_whose_main_thread_exited_is_still_stopped() {
    for containment in HOST_PIDS {
        eprintln!("--containment {containment}");
        a_descendant_whose_main_thread_exited_is_still_stopped_in(containment).await;
    }
}

async fn a_descendant_whose_main_thread_exited_is_still_stopped_in(containment: &str) {
    let path = unique_path("leaderless");
    let descendants = Descendants::new("leaderless");
    let program = descendants.file("leaderless.py");
    std::fs::write(&program, LEADERLESS).unwrap();
    let pid_file = descendants.file("pid");
    let wait_leaderless = |pid: libc::pid_t| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie_leader = stat.rfind(')').is_some_and(|at| stat[at + 1..].trim_start().starts_with('Z'));
            if zombie_leader && any_thread_runs(pid) {
                return;
            }
            assert!(Instant::now() < deadline, "{pid} never showed a dead main thread beside a live one: {stat}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // zklock killed.
    let script =
        format!("setsid python3 {program} > {pid_file}.tmp & sleep 0.5; mv {pid_file}.tmp {pid_file}; sleep 300");
    let mut first = zklock_in(containment, &["run", "--session-timeout", "4s", &path, "--", "sh", "-c", &script])
        .await
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid: libc::pid_t = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the leaderless program never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    wait_leaderless(pid).await;
    // The next holder (granted once the killed zklock's session expired) says when its command
    // started; the program must be gone by then — and it is, within T/4 of the kill.
    let next_file = descendants.file("next");
    let next = next_holder(&path, &next_file).await;
    wait_for_queue(&path, 2).await;
    let watcher = watch_threads_until_gone(pid);
    first.start_kill().unwrap();
    let killed_at = epoch_nanos();
    first.wait().await.unwrap();
    let next_started = read_time(&next_file, Duration::from_secs(30)).await;
    let gone_at = watcher.join().unwrap();
    let Some(gone_at) = gone_at else {
        // SAFETY: kill(2) on the program this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("a descendant whose main thread exited outlived the killed zklock (30 s)");
    };
    assert!(gone_at < next_started, "it ran when the next holder's command started");
    let after_kill = Duration::from_nanos(gone_at.saturating_sub(killed_at) as u64);
    assert!(after_kill <= Duration::from_secs(1) + SCHED_SLACK, "gone {after_kill:?} after the kill (T/4 = 1 s)");
    assert!(next.wait_with_output().await.unwrap().status.success());
    std::fs::remove_file(&pid_file).unwrap();

    // The command exits, leaving it behind: gone before the next holder's command starts.
    let holder = hold(&path, "holder").await;
    let script =
        format!("setsid python3 {program} > {pid_file}.tmp & sleep 0.5; mv {pid_file}.tmp {pid_file}; sleep 1; exit 0");
    let mut leaving = zklock_in(
        containment,
        &["run", "--session-timeout", "4s", "--kill-after", "1s", &path, "--", "sh", "-c", &script],
    )
    .await
    .spawn()
    .unwrap();
    wait_for_queue(&path, 2).await;
    let next = zklock(&["run", &path, "--", "sh", "-c", &stamp(&next_file)]).await.spawn().unwrap();
    wait_for_queue(&path, 3).await;
    std::fs::remove_file(&next_file).unwrap();
    // Not awaited here: the holder's exit (after its release) may take longer than the command runs.
    let released = tokio::spawn(holder.release());
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid: libc::pid_t = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the leaderless program never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let watcher = watch_threads_until_gone(pid);
    released.await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), leaving.wait()).await.expect("zklock exits").unwrap();
    assert_eq!(status.code(), Some(0));
    let next_started = read_time(&next_file, Duration::from_secs(20)).await;
    let Some(gone_at) = watcher.join().unwrap() else {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("a descendant whose main thread exited outlived the released lock (30 s)");
    };
    assert!(gone_at < next_started, "it ran when the next holder's command started");
    assert!(next.wait_with_output().await.unwrap().status.success());
}

/// Watches `pid` on a thread of its own until none of its threads runs (a process whose main
/// thread exited shows `Z` in `/proc/PID/stat` while others run): when (epoch nanoseconds), or
/// `None` after 30 s.
fn watch_threads_until_gone(pid: libc::pid_t) -> std::thread::JoinHandle<Option<u128>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !any_thread_runs(pid) {
                return Some(epoch_nanos());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    })
}

/// One SIGTERM per stop: a lost lock stops a command that traps SIGTERM (and keeps running)
/// with exactly one SIGTERM, then SIGKILL after `--kill-after`, in every containment. A C
/// program counts deliveries (a shell's trap would merge two that come close together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_sends_one_sigterm() {
    for containment in ["pid-namespace", "trace", "subreaper"] {
        one_sigterm_per_loss("run", containment).await;
    }
}

/// The same for `zklock leader`: one SIGTERM per lost leadership (the review saw two, 2.5–3.3 ms
/// apart, cutting a job's cleanup trap short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_leadership_sends_one_sigterm() {
    for containment in ["pid-namespace", "trace", "subreaper"] {
        one_sigterm_per_loss("leader", containment).await;
    }
}

async fn one_sigterm_per_loss(subcommand: &str, containment: &str) {
    let server = zookeeper().await;
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let path = unique_path("one-sigterm");
    let descendants = Descendants::new("one-sigterm");
    let (source, program, count) =
        (descendants.file("count.c"), descendants.file("count"), descendants.file("count.txt"));
    std::fs::write(
        &source,
        "#include <signal.h>\n#include <unistd.h>\n#include <fcntl.h>\n\
         static int fd;\n\
         static void on_term(int s) { (void)s; write(fd, \"T\", 1); }\n\
         int main(int argc, char **argv) { (void)argc; fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);\n\
         struct sigaction a = {0}; a.sa_handler = on_term; sigaction(SIGTERM, &a, 0);\n\
         write(1, \"started\\n\", 8); for (;;) pause(); }\n",
    )
    .unwrap();
    let compiled = std::process::Command::new("cc").args(["-o", &program, &source]).status().expect("run cc");
    assert!(compiled.success(), "cc failed");
    let mut child = zklock_in(
        containment,
        &[
            subcommand,
            "--connect",
            &proxy.addr(),
            "--session-timeout",
            "4s",
            "--kill-after",
            "1s",
            &path,
            "--",
            &program,
            &count,
        ],
    )
    .await
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "zklock").await;
    assert_eq!(line, "started");
    past_cold_start(Duration::from_secs(4)).await;
    proxy.stall();
    let mut errors = BufReader::new(child.stderr.take().unwrap()).lines();
    if subcommand == "run" {
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.expect("zklock exits").unwrap();
        assert_eq!(status.code(), Some(76), "{subcommand} --containment {containment}");
    } else {
        // The leader stays in the election; it says when the command was stopped.
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(line)) = errors.next_line().await {
                if line.contains("the command was stopped") {
                    return;
                }
            }
            panic!("zklock leader ended without saying the command was stopped");
        })
        .await
        .expect("the lost leadership is reported");
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }
    proxy.pass();
    let terms = std::fs::read_to_string(&count).unwrap_or_default();
    assert_eq!(terms, "T", "SIGTERMs the command got for one loss ({subcommand} --containment {containment})");
}

/// Review C's script (`tests/review_c_zklock.sh`, kept as the review wrote it) against the built
/// binary: zklock and its supervisor killed together, and a descendant whose main thread exited,
/// both when zklock is killed and when the command exits. The script hands the pids the command
/// sees (`$!`) to its checks outside, so it runs with `--containment trace`, where they are the
/// host's (in a PID namespace they would be the namespace's, and the script would check, and at
/// exit kill, whatever host processes have those numbers). `.ci/run` runs this test again with its
/// output shown, so CI's log says which containment was in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_c_script_passes_as_written() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/review_c_zklock.sh");
    let connect = zookeeper().await.connect_string();
    let said = run_in("trace", &["run", "--verbose", &unique_path("review-c-probe"), "--", "true"]).await;
    assert_eq!(said.code, Some(0), "{}", said.stderr);
    let auto = run(&["run", "--verbose", &unique_path("review-c-probe"), "--", "true"]).await;
    eprintln!(
        "review_c_zklock.sh runs with ZKLOCK_CONTAINMENT=trace: {}\n(auto picks here: {})",
        said.stderr.trim(),
        auto.stderr.lines().filter(|line| line.contains("containment:")).collect::<Vec<_>>().join(" ")
    );
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        Command::new("bash")
            .arg(script)
            .env("ZKLOCK", ZKLOCK)
            .env("ZK_CONNECT", connect)
            .env("ZKLOCK_CONTAINMENT", "trace")
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("the script ends within 240 s")
    .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.matches("PASS ").count(), 3, "three cases, none skipped: {stdout}");
    assert!(out.status.success(), "review_c_zklock.sh failed: {stdout}");
}

/// The command writes the time (epoch nanoseconds) into `file` every 20 ms, until it is killed.
fn heartbeat_script(file: &str) -> String {
    format!("while :; do {}; sleep 0.02; done", stamp(file))
}

/// A shell command that writes the time (epoch nanoseconds) into `file`, whole (a rename).
fn stamp(file: &str) -> String {
    format!("date +%s%N > {file}.tmp; mv {file}.tmp {file}")
}

/// The next holder of `path` (T = 4 s): a `zklock run` whose command writes the time it started
/// into `file` — what the tests compare a stopped command's last sign of life with.
async fn next_holder(path: &str, file: &str) -> Child {
    zklock(&["run", "--session-timeout", "4s", path, "--", "sh", "-c", &stamp(file)]).await.spawn().unwrap()
}

/// SIGKILL to zklock and its supervisor together, as `pkill -9 -f zklock` does; both stopped
/// first, so that neither acts on the other's death.
fn kill_together(zklock_pid: libc::pid_t) {
    let supervisor = children_of(zklock_pid);
    assert_eq!(supervisor.len(), 1, "zklock's one child, the supervisor: {supervisor:?}");
    // SAFETY: kill(2) on zklock and its child, which the test started.
    unsafe {
        libc::kill(supervisor[0], libc::SIGSTOP);
        libc::kill(zklock_pid, libc::SIGSTOP);
        libc::kill(supervisor[0], libc::SIGKILL);
        libc::kill(zklock_pid, libc::SIGKILL);
    }
}

/// What a child wrote to its piped stderr, read for at most 5 s (a surviving descendant would
/// hold the pipe open).
async fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    if let Some(pipe) = child.stderr.as_mut() {
        let read = tokio::io::AsyncReadExt::read_to_string(pipe, &mut stderr);
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    }
    stderr
}

/// Polls `file` until it holds a time; returns it.
async fn read_time(file: &str, within: Duration) -> u128 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(time) = std::fs::read_to_string(file).ok().and_then(|text| text.trim().parse().ok()) {
            return time;
        }
        assert!(Instant::now() < deadline, "{file} was never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A frozen zklock (SIGSTOP) stops vouching for the lock; its supervisor, which needs zklock's
/// renewed word (the hold's loss deadline, at most 0.8 T ahead), kills the command by then — so
/// before ZooKeeper expires the session and the next holder's command starts, compared with that
/// command's own start time. For `run` (the next `run` waits for the lock) and `leader` (the next
/// leader is elected). Without the lease the command runs on as long as zklock is frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_zklock_has_its_command_stopped_before_the_next_holder_starts() {
    let session_timeout = Duration::from_secs(4);
    for subcommand in ["run", "leader"] {
        let path = unique_path(&format!("frozen-{subcommand}"));
        let descendants = Descendants::new("frozen");
        let (beat, next_file) = (descendants.file("beat"), descendants.file("next"));
        let mut first =
            zklock(&[subcommand, "--session-timeout", "4s", &path, "--", "sh", "-c", &heartbeat_script(&beat)])
                .await
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
        read_time(&beat, Duration::from_secs(20)).await;
        // The next contender is queued before the freeze.
        let next_script = format!("{}; exec sleep 300", stamp(&next_file));
        let mut next = zklock(&[subcommand, "--session-timeout", "4s", &path, "--", "sh", "-c", &next_script])
            .await
            .spawn()
            .unwrap();
        wait_for_queue(&path, 2).await;
        let first_pid = first.id().unwrap() as libc::pid_t;
        // SAFETY: kill(2) on the zklock this test started.
        unsafe { libc::kill(first_pid, libc::SIGSTOP) };
        let frozen_at = epoch_nanos();
        let next_started = read_time(&next_file, Duration::from_secs(30)).await;
        let last_beat = read_time(&beat, Duration::from_secs(1)).await;
        // Still frozen: nothing but the supervisor can have stopped the command.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let still_beating = read_time(&beat, Duration::from_secs(1)).await != last_beat;
        // SAFETY: as above.
        unsafe { libc::kill(first_pid, libc::SIGCONT) };
        let after = |t: u128| Duration::from_nanos(t.saturating_sub(frozen_at) as u64);
        eprintln!(
            "{subcommand}: the frozen zklock's command last ran {:?} after the freeze; the next holder's command \
             started {:?} after it",
            after(last_beat),
            after(next_started)
        );
        assert!(!still_beating, "{subcommand}: the command runs on while zklock is frozen");
        assert!(last_beat < next_started, "{subcommand}: the command still ran when the next holder's started");
        // The lease ends at the hold's loss deadline, at most 0.8 T after the last renewal; the
        // loop writes every 20 ms.
        let bound = session_timeout * 4 / 5 + Duration::from_millis(20) + SCHED_SLACK;
        assert!(
            after(last_beat) <= bound,
            "{subcommand}: stopped {:?} after the freeze; bound {bound:?}",
            after(last_beat)
        );
        if subcommand == "run" {
            let status =
                tokio::time::timeout(Duration::from_secs(20), first.wait()).await.expect("zklock exits").unwrap();
            assert_eq!(status.code(), Some(76), "run: a lock lost while the command ran");
        } else {
            first.start_kill().unwrap();
            first.wait().await.unwrap();
        }
        let stderr = stderr_of(&mut first).await;
        assert!(stderr.contains("did not renew the lock's lease"), "{subcommand}: the supervisor says why: {stderr}");
        next.start_kill().unwrap();
        next.wait().await.unwrap();
    }
}

/// `--kill-after` never outlasts the lock: a command that ignores SIGTERM, under a grace longer
/// than the session timeout, still gets SIGKILL at the hold's loss deadline — before the next
/// holder's command starts (its own timestamp) — and zklock warns about the long grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_kill_after_still_ends_at_the_loss_deadline() {
    let server = zookeeper().await;
    let proxy = FaultProxy::start(server.connect_string()).await.unwrap();
    let t = Duration::from_secs(4);
    let path = unique_path("long-grace");
    let descendants = Descendants::new("long-grace");
    let (beat, next_file) = (descendants.file("beat"), descendants.file("next"));
    let script = format!("trap '' TERM; {}", heartbeat_script(&beat));
    let mut first = zklock(&[
        "run",
        "--connect",
        &proxy.addr(),
        "--session-timeout",
        "4s",
        "--kill-after",
        "30s",
        &path,
        "--",
        "sh",
        "-c",
        &script,
    ])
    .await
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    read_time(&beat, Duration::from_secs(20)).await;
    let next = next_holder(&path, &next_file).await;
    wait_for_queue(&path, 2).await;
    past_cold_start(t).await;
    let stalled_at = epoch_nanos();
    proxy.stall();
    let status = tokio::time::timeout(Duration::from_secs(20), first.wait()).await.expect("zklock exits").unwrap();
    let last_beat = read_time(&beat, Duration::from_secs(1)).await;
    let next_started = read_time(&next_file, Duration::from_secs(30)).await;
    proxy.pass();
    let after = |ns: u128| Duration::from_nanos(ns.saturating_sub(stalled_at) as u64);
    eprintln!(
        "stalled: the command last ran {:?} after, the next holder's started {:?} after",
        after(last_beat),
        after(next_started)
    );
    let stderr = stderr_of(&mut first).await;
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("warning: --kill-after"), "{stderr}");
    assert!(last_beat < next_started, "the command outlived the lock: {stderr}");
    // The deadline is at most 0.8 T after the last answer, which came before the stall.
    let bound = t * 4 / 5 + Duration::from_millis(20) + SCHED_SLACK;
    assert!(after(last_beat) <= bound, "SIGKILL {:?} after the stall; bound {bound:?}", after(last_beat));
    drop(next);
}

/// `--containment trace` and a process started with `clone(CLONE_UNTRACED)`, which the kernel
/// does not attach to the tracer (review 21): the seccomp filter the command runs under refuses
/// that flag (EPERM), so nothing escapes the tracing; with zklock and its supervisor killed
/// together, no descendant is left. Plain forks, threads and `posix_spawn` (through `clone` once
/// `clone3` says ENOSYS) still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_refuses_an_untraced_clone() {
    let path = unique_path("untraced-clone");
    let descendants = Descendants::new("untraced-clone");
    let (source, program) = (descendants.file("untraced.c"), descendants.file("untraced"));
    let marker = marked_sleep();
    std::fs::write(
        &source,
        "#define _GNU_SOURCE\n#include <errno.h>\n#include <pthread.h>\n#include <sched.h>\n#include <signal.h>\n\
         #include <spawn.h>\n#include <stdio.h>\n#include <sys/syscall.h>\n#include <sys/wait.h>\n#include <unistd.h>\n\
         extern char **environ;\n\
         static void *nothing(void *arg) { return arg; }\n\
         int main(int argc, char **argv) { (void)argc;\n\
           pthread_t t; int threads = pthread_create(&t, 0, nothing, 0) == 0 && pthread_join(t, 0) == 0;\n\
           pid_t spawned; char *args[] = {\"true\", 0};\n\
           int spawn = posix_spawnp(&spawned, \"true\", 0, 0, args, environ) == 0 && waitpid(spawned, 0, 0) == spawned;\n\
           long pid = syscall(SYS_clone, CLONE_UNTRACED | SIGCHLD, 0, 0, 0, 0);\n\
           if (pid == 0) { setsid(); execlp(\"sleep\", \"sleep\", argv[1], (char *)0); _exit(1); }\n\
           if (pid < 0) printf(\"refused %d threads %d spawn %d\\n\", errno, threads, spawn);\n\
           else printf(\"cloned %ld threads %d spawn %d\\n\", pid, threads, spawn);\n\
           fflush(stdout); pause(); return 0; }\n",
    )
    .unwrap();
    let compiled =
        std::process::Command::new("cc").args(["-pthread", "-o", &program, &source]).status().expect("run cc");
    assert!(compiled.success(), "cc failed");
    let mut first = zklock_in("trace", &["run", "--session-timeout", "4s", &path, "--", &program, &marker])
        .await
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let zklock_pid = first.id().unwrap() as libc::pid_t;
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "the command").await;
    kill_together(zklock_pid);
    first.wait().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let escaped = find_sleep(&marker);
    if let Some((pid, started)) = escaped {
        if still_runs(pid, started) {
            // SAFETY: kill(2) on the process this test's command started (checked by its start time).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    assert!(escaped.is_none(), "a process started with CLONE_UNTRACED outlived zklock and its supervisor: {line}");
    assert_eq!(line, format!("refused {} threads 1 spawn 1", libc::EPERM), "what the command saw");
}

/// A stopped command still ends when zklock is asked to stop: the forwarded SIGTERM is followed
/// by SIGCONT (as systemd does), so zklock exits 143 instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_command_still_gets_the_forwarded_sigterm() {
    let path = unique_path("stopped-command");
    let mut child =
        zklock(&["run", &path, "--", "sh", "-c", "echo started; kill -STOP $$; echo resumed; exec sleep 300"])
            .await
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (line, _) = next_line(&mut lines, "the command").await;
    assert_eq!(line, "started");
    // Stopped by now (give the shell its kill).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id().unwrap() as libc::pid_t, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await.expect("zklock exits").unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    wait_for_queue(&path, 0).await;
}

/// A brief stop of zklock just after the grant, while the session is cold and the hold's loss
/// deadline only about 0.36 T ahead (review 21b): the supervisor kills the command at the
/// deadline, and even when the hold survives (an answer waiting in the socket is read once zklock
/// runs again) zklock says why and exits 76 — never the command's 137 as if it had died by
/// itself — and gives the lock back at once (no node left for the session timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brief_stop_at_the_cold_start_is_reported_as_a_stop() {
    let descendants = Descendants::new("cold-stop");
    let beat = descendants.file("beat");
    for (attempt, offset_ms) in [720u64, 750, 780, 810, 840].into_iter().enumerate() {
        let path = unique_path("cold-stop");
        let _ = std::fs::remove_file(&beat);
        let mut child = zklock(&["run", "--session-timeout", "4s", &path, "--", "sh", "-c", &heartbeat_script(&beat)])
            .await
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id().unwrap() as libc::pid_t;
        read_time(&beat, Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        tokio::time::sleep(Duration::from_millis(600)).await;
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        tokio::time::sleep(Duration::from_millis(500)).await;
        if child.try_wait().unwrap().is_none() {
            eprintln!("attempt {attempt}: the command survived the stop");
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            child.wait().await.unwrap();
            wait_for_queue(&path, 0).await;
            continue;
        }
        let status = child.wait().await.unwrap();
        let ended_at = Instant::now();
        let stderr = stderr_of(&mut child).await;
        eprintln!("attempt {attempt}: zklock exited {status:?}: {stderr}");
        assert_eq!(status.code(), Some(76), "a stopped command is reported as such: {stderr}");
        if stderr.contains("could not renew the lock's lease") {
            // The hold survived: given back before zklock exited.
            assert_eq!(queue_len(&path).await, 0, "the lock was given back: {stderr}");
        } else {
            assert!(stderr.contains("lost"), "{stderr}");
            wait_for_queue(&path, 0).await;
        }
        assert!(ended_at.elapsed() < Duration::from_secs(20));
    }
}

/// `--containment pid-namespace` remounts `/proc` for the namespace where the system allows it
/// (review 21b: the mount named the wrong filesystem type and always failed), so `$$` and
/// `/proc/$$` agree inside; `--verbose` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_namespace_has_its_own_proc() {
    let path = unique_path("own-proc");
    let out =
        run(&["run", "--containment", "pid-namespace", "--verbose", &path, "--", "sh", "-c", "cat /proc/$$/comm"])
            .await;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("containment: PID namespace"), "{}", out.stderr);
    // Where unshare(1) --mount-proc works, ours must too.
    let unshare = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", "cat /proc/$$/comm"])
        .output()
        .expect("unshare(1) runs");
    if unshare.status.success() {
        assert_eq!(out.stdout.trim(), "sh", "/proc/$$ inside is the shell itself: {}", out.stderr);
        assert!(!out.stderr.contains("/proc is the host's"), "{}", out.stderr);
    } else {
        assert!(out.stderr.contains("/proc is the host's"), "{}", out.stderr);
    }
}
