//! Benchmark of `InterProcessMutex` (W1–W4), `InterProcessReadWriteLock` (W5, W6) and
//! `InterProcessSemaphoreV2` (W7) with the workloads of `../shared/bench-peers` (same sizes,
//! same environment knobs, same JSON line per workload), so it can run side by side with Curator,
//! kazoo and `zookeeper-client`'s own lock on one server:
//!
//! ```sh
//! cargo build --release --example bench
//! target/release/examples/bench 127.0.0.1:2181 W1,W2,W3,W4,W5,W6
//! PROJECT_BENCH="$PWD/target/release/examples/bench" ../shared/bench-peers/run_all.sh
//! PROJECT_BENCH="$PWD/target/release/examples/bench" WORKLOADS=W5,W6 ../shared/bench-peers/run_all.sh
//! PROJECT_BENCH="$PWD/target/release/examples/bench" WORKLOADS=W7 ../shared/bench-peers/run_all.sh
//! ```
//!
//! Release is dropping the guard (the delete is sent before `drop` returns and confirmed in the
//! background), as in the `zkc` peer; W1, W3 and W7 are also run with `release().await`
//! (`zk-recipes-await`). W1 reports the requests per cycle counted by the server (`mntr`
//! `zk_packets_received`, pings included).
//!
//! `LOCK_DELAY_MS=<ms>` gives W1's and W2's mutexes a lock-delay (`LockBuilder::lock_delay`) and
//! names them `zk-recipes+delay`: the cost of the clean paths (a clean release is never delayed,
//! so only the requests and round trips differ). Run it beside a plain run on the same server.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zk_recipes::{InterProcessMutex, InterProcessReadWriteLock};
use zookeeper_client as zk;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A mutex for W1 and W2: with the lock-delay of `LOCK_DELAY_MS`, if set.
fn w_mutex(client: zk::Client, path: impl Into<String>) -> Result<InterProcessMutex, BoxError> {
    let builder = InterProcessMutex::builder(client, path);
    Ok(match env("LOCK_DELAY_MS", 0) {
        0 => builder.build()?,
        ms => builder.lock_delay(Duration::from_millis(ms)).build()?,
    })
}

/// `imp`, marked `+delay` when `LOCK_DELAY_MS` is set.
fn delay_name(imp: &'static str) -> &'static str {
    match env("LOCK_DELAY_MS", 0) {
        0 => imp,
        _ => Box::leak(format!("{imp}+delay").into_boxed_str()),
    }
}

static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Nearest-rank percentile of ns samples, in microseconds.
fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted[rank - 1] as f64 / 1000.0
}

struct Report {
    imp: &'static str,
    workload: &'static str,
    ops: u64,
    secs: f64,
    lat_ns: Vec<u64>,
    lat_kind: &'static str,
    violations: u64,
    clients: usize,
    per_client: Option<Vec<u64>>,
    notes: String,
    /// Extra JSON fields (W5, W6), each starting with a comma.
    extra: String,
}

fn emit(mut r: Report) {
    r.lat_ns.sort_unstable();
    let per = match &r.per_client {
        Some(v) => format!("[{}]", v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        None => "null".into(),
    };
    let fair = match r.per_client.as_deref() {
        Some(v) => match (v.iter().min(), v.iter().max()) {
            (Some(&min), Some(&max)) if min > 0 => format!("{:.3}", max as f64 / min as f64),
            _ => "null".into(),
        },
        None => "null".into(),
    };
    println!(
        "{{\"impl\":\"{}\",\"workload\":\"{}\",\"ops_per_s\":{:.1},\"p50_us\":{:.1},\"p99_us\":{:.1},\"violations\":{},\"clients\":{},\"ops\":{},\"secs\":{:.3},\"lat\":\"{}\",\"samples\":{},\"per_client\":{},\"fairness_max_min\":{},\"notes\":\"{}\"{}}}",
        r.imp,
        r.workload,
        r.ops as f64 / r.secs,
        pct_us(&r.lat_ns, 0.50),
        pct_us(&r.lat_ns, 0.99),
        r.violations,
        r.clients,
        r.ops,
        r.secs,
        r.lat_kind,
        r.lat_ns.len(),
        per,
        fair,
        r.notes,
        r.extra
    );
}

async fn connect(addr: &str) -> Result<zk::Client, BoxError> {
    Ok(zk::Client::connector().with_session_timeout(Duration::from_secs(10)).connect(addr).await?)
}

async fn connect_n(addr: &str, n: usize) -> Result<Vec<zk::Client>, BoxError> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(connect(addr).await?);
    }
    Ok(clients)
}

/// `zk_packets_received` from the server's `mntr` four-letter word.
async fn packets_received(addr: &str) -> Result<u64, BoxError> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(b"mntr").await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let value = reply.lines().find_map(|line| line.strip_prefix("zk_packets_received")).ok_or("no mntr")?;
    Ok(value.trim().parse()?)
}

/// One acquire → release cycle.
async fn cycle(mutex: &InterProcessMutex, await_release: bool) -> Result<(), BoxError> {
    let guard = mutex.acquire().await?;
    if await_release {
        guard.release().await?;
    } else {
        drop(guard);
    }
    Ok(())
}

async fn w1(addr: &str, base: &str, imp: &'static str, await_release: bool) -> Result<(), BoxError> {
    let client = connect(addr).await?;
    let imp = delay_name(imp);
    let warm = w_mutex(client.clone(), format!("{base}/warm-{imp}"))?;
    for _ in 0..env("WARMUP_CYCLES", 500) {
        cycle(&warm, await_release).await?;
    }
    let n = env("W1_CYCLES", 2000);
    let mutex = w_mutex(client, format!("{base}/W1/{imp}"))?;
    cycle(&mutex, await_release).await?; // creates the lock path (container parents)
    tokio::time::sleep(Duration::from_millis(50)).await;
    let packets_before = packets_received(addr).await.ok();
    let mut lat = Vec::with_capacity(n as usize);
    let t0 = Instant::now();
    for _ in 0..n {
        let s = now_ns();
        cycle(&mutex, await_release).await?;
        lat.push(now_ns() - s);
    }
    let secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(50)).await; // let the last background delete land
    let per_cycle = match (packets_before, packets_received(addr).await.ok()) {
        (Some(before), Some(after)) => format!("{:.2}", (after - before - 1) as f64 / n as f64),
        _ => "n/a".into(),
    };
    let release = if await_release { "release().await" } else { "drop(guard): delete sent before drop returns" };
    emit(Report {
        imp,
        workload: "W1",
        ops: n,
        secs,
        lat_ns: lat,
        lat_kind: "cycle",
        violations: 0,
        clients: 1,
        per_client: None,
        extra: String::new(),
        notes: format!(
            "cycle=acquire (create+getChildren pipelined) + {release}; requests_per_cycle={per_cycle} (mntr zk_packets_received, incl. pings)"
        ),
    });
    Ok(())
}

/// W2: sessions hammer one lock; holders must never exceed 1 and a deliberately unsynchronised
/// read-modify-write of a shared counter must never lose an update.
async fn w2(addr: &str, base: &str) -> Result<(), BoxError> {
    let n = env("W2_CLIENTS", 8) as usize;
    let (warm, run) = (env("W2_WARMUP_SECS", 1), env("W2_SECS", 10));
    let path = format!("{base}/W2/lock");
    let clients = connect_n(addr, n).await?;
    let holders = Arc::new(AtomicI64::new(0));
    let (counter, total, violations) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let last_release = Arc::new(AtomicU64::new(0));
    let (measuring, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for client in clients {
        let mutex = w_mutex(client, path.as_str())?;
        let (holders, counter, total, violations, last_release, measuring, stop) = (
            holders.clone(),
            counter.clone(),
            total.clone(),
            violations.clone(),
            last_release.clone(),
            measuring.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let (mut mine, mut lat) = (0u64, Vec::new());
            while !stop.load(SeqCst) {
                let guard = mutex.acquire().await?;
                let t = now_ns();
                if holders.fetch_add(1, SeqCst) != 0 {
                    violations.fetch_add(1, SeqCst);
                }
                let v = counter.load(SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, SeqCst);
                total.fetch_add(1, SeqCst);
                if measuring.load(SeqCst) {
                    mine += 1;
                    let prev = last_release.load(SeqCst);
                    if prev != 0 {
                        lat.push(t - prev);
                    }
                }
                holders.fetch_sub(1, SeqCst);
                last_release.store(now_ns(), SeqCst);
                drop(guard);
            }
            Ok::<_, BoxError>((mine, lat))
        }));
    }
    tokio::time::sleep(Duration::from_secs(warm)).await;
    measuring.store(true, SeqCst);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(run)).await;
    measuring.store(false, SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, SeqCst);
    let (mut per, mut lat) = (Vec::new(), Vec::new());
    for task in tasks {
        let (mine, l) = task.await??;
        per.push(mine);
        lat.extend(l);
    }
    let lost = total.load(SeqCst) - counter.load(SeqCst);
    emit(Report {
        imp: delay_name("zk-recipes"),
        workload: "W2",
        ops: per.iter().sum(),
        secs,
        lat_ns: lat,
        lat_kind: "handoff",
        violations: violations.load(SeqCst) + lost,
        clients: n,
        per_client: Some(per),
        extra: String::new(),
        notes: format!("{n} sessions, {warm}s warm-up then {run}s; latency=release->next acquire; lost_updates={lost}"),
    });
    Ok(())
}

async fn w3(addr: &str, base: &str, imp: &'static str, await_release: bool) -> Result<(), BoxError> {
    let n = env("W3_CLIENTS", 8) as usize;
    let cycles = env("W3_CYCLES", 1000);
    let warm = env("WARMUP_CYCLES", 500) / 5;
    let clients = connect_n(addr, n).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let warm_mutex = InterProcessMutex::new(client.clone(), format!("{base}/W3/{imp}-warm-{i}"))?;
        let mutex = InterProcessMutex::new(client, format!("{base}/W3/{imp}-lock-{i}"))?;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..warm {
                cycle(&warm_mutex, await_release).await?;
            }
            cycle(&mutex, await_release).await?; // creates the lock path
            barrier.wait().await;
            let start = now_ns();
            let mut lat = Vec::with_capacity(cycles as usize);
            for _ in 0..cycles {
                let s = now_ns();
                cycle(&mutex, await_release).await?;
                lat.push(now_ns() - s);
            }
            Ok::<_, BoxError>((start, now_ns(), lat))
        }));
    }
    let (mut start, mut end, mut lat) = (u64::MAX, 0, Vec::new());
    for task in tasks {
        let (s, e, l) = task.await??;
        (start, end) = (start.min(s), end.max(e));
        lat.extend(l);
    }
    emit(Report {
        imp,
        workload: "W3",
        ops: n as u64 * cycles,
        secs: (end - start) as f64 / 1e9,
        lat_ns: lat,
        lat_kind: "cycle",
        violations: 0,
        clients: n,
        per_client: Some(vec![cycles; n]),
        extra: String::new(),
        notes: format!("{n} sessions, one lock path each, {warm} warm-up cycles each then {cycles} cycles"),
    });
    Ok(())
}

/// W4: one holder + N queued waiters; release -> next acquire while the queue drains.
async fn w4(addr: &str, base: &str) -> Result<(), BoxError> {
    let waiters = env("W4_WAITERS", 64) as usize;
    let rounds = env("W4_ROUNDS", 5);
    let path = format!("{base}/W4/lock");
    let clients = connect_n(addr, waiters + 1).await?;
    let observer = clients[0].clone();
    let mutexes: Vec<InterProcessMutex> =
        clients.into_iter().map(|c| InterProcessMutex::new(c, path.as_str())).collect::<Result<_, _>>()?;
    let holders = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let (mut lat, mut drain_ns) = (Vec::new(), 0u64);
    for round in 0..=rounds {
        let last_release = Arc::new(AtomicU64::new(0));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let last_acquire = Arc::new(AtomicU64::new(0));
        let guard = mutexes[0].acquire().await?;
        let mut tasks = Vec::new();
        for mutex in &mutexes[1..] {
            let mutex = mutex.clone();
            let (holders, violations, last_release, latencies, last_acquire) =
                (holders.clone(), violations.clone(), last_release.clone(), latencies.clone(), last_acquire.clone());
            tasks.push(tokio::spawn(async move {
                let g = mutex.acquire().await?;
                let t = now_ns();
                if holders.fetch_add(1, SeqCst) != 0 {
                    violations.fetch_add(1, SeqCst);
                }
                latencies.lock().map_err(|_| "poisoned")?.push(t - last_release.load(SeqCst));
                last_acquire.fetch_max(t, SeqCst);
                holders.fetch_sub(1, SeqCst);
                last_release.store(now_ns(), SeqCst);
                drop(g);
                Ok::<_, BoxError>(())
            }));
        }
        while observer.list_children(&path).await?.len() < waiters + 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let start = now_ns();
        last_release.store(start, SeqCst);
        drop(guard);
        for task in tasks {
            task.await??;
        }
        if round > 0 {
            drain_ns += last_acquire.load(SeqCst) - start;
            let mut latencies = latencies.lock().map_err(|_| "poisoned")?;
            if env("W4_DUMP", 0) == 1 {
                // Each handoff of the round in order, in µs: where in the drain the tail is.
                let us: Vec<String> = latencies.iter().map(|ns| (ns / 1000).to_string()).collect();
                eprintln!("W4 round {round}: {}", us.join(" "));
            }
            lat.extend(latencies.drain(..));
        }
    }
    emit(Report {
        imp: "zk-recipes",
        workload: "W4",
        ops: rounds * waiters as u64,
        secs: drain_ns as f64 / 1e9,
        lat_ns: lat,
        lat_kind: "handoff",
        violations: violations.load(SeqCst),
        clients: waiters + 1,
        per_client: None,
        extra: String::new(),
        notes: format!(
            "1 holder + {waiters} queued waiters ({} sessions), 1 warm-up round + {rounds} rounds; ops_per_s=handoffs/drain time",
            waiters + 1
        ),
    });
    Ok(())
}

/// The in-process occupancy of a read/write lock's critical section (W5, W6): counts every
/// overlap the lock forbids — a writer entering while anyone is inside, a reader while a writer is.
#[derive(Default)]
struct Occupancy {
    inside: Mutex<(u64, u64)>,
    violations: AtomicU64,
}

impl Occupancy {
    fn enter(&self, read: bool) {
        let Ok(mut inside) = self.inside.lock() else { return };
        let (readers, writers) = &mut *inside;
        if *writers != 0 || (!read && *readers != 0) {
            self.violations.fetch_add(1, SeqCst);
        }
        if read {
            *readers += 1;
        } else {
            *writers += 1;
        }
    }

    fn leave(&self, read: bool) {
        let Ok(mut inside) = self.inside.lock() else { return };
        if read {
            inside.0 -= 1;
        } else {
            inside.1 -= 1;
        }
    }

    /// Enters, yields inside, leaves.
    async fn visit(&self, read: bool) {
        self.enter(read);
        tokio::task::yield_now().await;
        self.leave(read);
    }
}

fn pct_pair(sorted: &[u64]) -> String {
    format!("{:.0}/{:.0}", pct_us(sorted, 0.50), pct_us(sorted, 0.99))
}

/// W5: sessions on one read/write lock, 90 % reads: how much readers gain from sharing.
async fn w5(addr: &str, base: &str) -> Result<(), BoxError> {
    use rand::{Rng, SeedableRng};
    let n = env("W5_CLIENTS", 8) as usize;
    let ops = env("W5_OPS", 1000);
    let read_pct = env("W5_READ_PCT", 90);
    let warm = env("WARMUP_CYCLES", 500) / 5;
    let clients = connect_n(addr, n).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let occupancy = Arc::new(Occupancy::default());
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let warm_lock = InterProcessReadWriteLock::new(client.clone(), format!("{base}/W5/warm"))?;
        let lock = InterProcessReadWriteLock::new(client, format!("{base}/W5/lock"))?;
        let (barrier, occupancy) = (barrier.clone(), occupancy.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + i as u64);
            let (read_lock, write_lock) = (warm_lock.read_lock(), warm_lock.write_lock());
            for _ in 0..warm {
                let lock = if rng.random_range(0..100) < read_pct { &read_lock } else { &write_lock };
                drop(lock.acquire().await?);
            }
            let (read_lock, write_lock) = (lock.read_lock(), lock.write_lock());
            barrier.wait().await;
            let start = now_ns();
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            for _ in 0..ops {
                let read = rng.random_range(0..100) < read_pct;
                let s = now_ns();
                let guard = if read { read_lock.acquire().await? } else { write_lock.acquire().await? };
                let waited = now_ns() - s;
                occupancy.visit(read).await;
                drop(guard);
                if read {
                    reads.push(waited)
                } else {
                    writes.push(waited)
                }
            }
            Ok::<_, BoxError>((start, now_ns(), reads, writes))
        }));
    }
    let (mut start, mut end, mut reads, mut writes) = (u64::MAX, 0, Vec::new(), Vec::new());
    for task in tasks {
        let (s, e, r, w) = task.await??;
        (start, end) = (start.min(s), end.max(e));
        reads.extend(r);
        writes.extend(w);
    }
    reads.sort_unstable();
    writes.sort_unstable();
    let (r, w) = (reads.len(), writes.len());
    let extra = format!(
        ",\"reads\":{r},\"writes\":{w},\"read_p50_us\":{:.1},\"read_p99_us\":{:.1},\"write_p50_us\":{:.1},\"write_p99_us\":{:.1}",
        pct_us(&reads, 0.50),
        pct_us(&reads, 0.99),
        pct_us(&writes, 0.50),
        pct_us(&writes, 0.99)
    );
    let notes = format!(
        "{n} sessions on one InterProcessReadWriteLock, {read_pct}% reads, {warm} warm-up ops each then {ops} ops each; reads={r} writes={w}; acquire p50/p99 us read={} write={}; release=drop(guard)",
        pct_pair(&reads),
        pct_pair(&writes)
    );
    emit(Report {
        imp: "zk-recipes",
        workload: "W5",
        ops: n as u64 * ops,
        secs: (end - start) as f64 / 1e9,
        lat_ns: reads.into_iter().chain(writes).collect(),
        lat_kind: "acquire",
        violations: occupancy.violations.load(SeqCst),
        clients: n,
        per_client: Some(vec![ops; n]),
        notes,
        extra,
    });
    Ok(())
}

/// W6: a writer every 10 ms among 7 looping readers: what a periodic writer costs the readers.
async fn w6(addr: &str, base: &str) -> Result<(), BoxError> {
    let readers = env("W6_READERS", 7) as usize;
    let (warm, run) = (env("W6_WARMUP_SECS", 1), env("W6_SECS", 10));
    let interval = Duration::from_millis(env("W6_WRITE_INTERVAL_MS", 10));
    let hold = Duration::from_millis(env("W6_WRITE_HOLD_MS", 1));
    let path = format!("{base}/W6/lock");
    let clients = connect_n(addr, readers + 1).await?;
    let occupancy = Arc::new(Occupancy::default());
    let (measuring, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for client in &clients[1..] {
        let read_lock = InterProcessReadWriteLock::new(client.clone(), path.as_str())?.read_lock();
        let (occupancy, measuring, stop) = (occupancy.clone(), measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(SeqCst) {
                let s = now_ns();
                let guard = read_lock.acquire().await?;
                let waited = now_ns() - s;
                occupancy.visit(true).await;
                if measuring.load(SeqCst) {
                    lat.push(waited);
                }
                drop(guard);
            }
            Ok::<_, BoxError>(lat)
        }));
    }
    let write_lock = InterProcessReadWriteLock::new(clients[0].clone(), path.as_str())?.write_lock();
    let writer = tokio::spawn({
        let (occupancy, measuring, stop) = (occupancy.clone(), measuring.clone(), stop.clone());
        async move {
            let mut lat = Vec::new();
            let mut next = tokio::time::Instant::now();
            while !stop.load(SeqCst) {
                tokio::time::sleep_until(next).await;
                let s = now_ns();
                let guard = write_lock.acquire().await?;
                let waited = now_ns() - s;
                occupancy.enter(false);
                tokio::time::sleep(hold).await;
                occupancy.leave(false);
                drop(guard);
                if measuring.load(SeqCst) {
                    lat.push(waited);
                }
                // A late writer does not burst to catch up.
                next = (next + interval).max(tokio::time::Instant::now());
            }
            Ok::<_, BoxError>(lat)
        }
    });
    tokio::time::sleep(Duration::from_secs(warm)).await;
    measuring.store(true, SeqCst);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(run)).await;
    measuring.store(false, SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, SeqCst);
    let (mut per, mut lat) = (Vec::new(), Vec::new());
    for task in tasks {
        let l = task.await??;
        per.push(l.len() as u64);
        lat.extend(l);
    }
    let mut writes = writer.await??;
    writes.sort_unstable();
    let extra = format!(
        ",\"writer_ops\":{},\"writer_p50_us\":{:.1},\"writer_p99_us\":{:.1}",
        writes.len(),
        pct_us(&writes, 0.50),
        pct_us(&writes, 0.99)
    );
    let notes = format!(
        "1 writer (write lock every {} ms, held {} ms) + {readers} reader sessions looping; {warm}s warm-up then {run}s; ops_per_s=reader acquisitions/s; writes={} writer wait p50/p99 us={}; release=drop(guard)",
        interval.as_millis(),
        hold.as_millis(),
        writes.len(),
        pct_pair(&writes)
    );
    emit(Report {
        imp: "zk-recipes",
        workload: "W6",
        ops: per.iter().sum(),
        secs,
        lat_ns: lat,
        lat_kind: "read-acquire",
        violations: occupancy.violations.load(SeqCst),
        clients: readers + 1,
        per_client: Some(per),
        notes,
        extra,
    });
    Ok(())
}

/// Children of each of `dirs` (0 for a directory that does not exist).
async fn count_children(client: &zk::Client, dirs: &[String]) -> Result<usize, BoxError> {
    let mut n = 0;
    for dir in dirs {
        match client.list_children(dir).await {
            Ok(children) => n += children.len(),
            Err(zk::Error::NoNode) => {},
            Err(err) => return Err(err.into()),
        }
    }
    Ok(n)
}

/// W7: a lease pool — sessions looping acquire 1 lease → hold 2 ms → return, on one
/// `InterProcessSemaphoreV2` of 3 leases (Curator's layout). `await_release`: the lease is
/// returned with `release().await` (as Curator's `lease.close()`), else dropped.
async fn w7(addr: &str, base: &str, imp: &'static str, await_release: bool) -> Result<(), BoxError> {
    let n = env("W7_CLIENTS", 8) as usize;
    let max_leases = env("W7_MAX_LEASES", 3) as usize;
    let (warm, run) = (env("W7_WARMUP_SECS", 1), env("W7_SECS", 10));
    let hold = Duration::from_millis(env("W7_HOLD_MS", 2));
    let path = format!("{base}/W7/{imp}/sem");
    let node_dirs = [format!("{path}/leases"), format!("{path}/locks")];
    let clients = connect_n(addr, n).await?;
    // The sessions and the clock start together.
    let barrier = Arc::new(tokio::sync::Barrier::new(n + 1));
    let (holders, peak, violations) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (measuring, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for client in &clients {
        let semaphore = zk_recipes::InterProcessSemaphoreV2::new(client.clone(), path.as_str(), max_leases)?;
        let (barrier, holders, peak, violations, measuring, stop) =
            (barrier.clone(), holders.clone(), peak.clone(), violations.clone(), measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            barrier.wait().await;
            while !stop.load(SeqCst) {
                let s = now_ns();
                let lease = semaphore.acquire().await?;
                let t1 = now_ns();
                // The grant's time decides the window.
                let counted = measuring.load(SeqCst);
                let h = holders.fetch_add(1, SeqCst) + 1;
                if h > max_leases as u64 {
                    violations.fetch_add(1, SeqCst);
                }
                peak.fetch_max(h, SeqCst);
                // The hold: a thread sleeps, as in the peers (tokio's timer rounds a 2 ms sleep up
                // to the next millisecond tick, which would hold ~25 % longer than Curator does).
                tokio::task::spawn_blocking(move || std::thread::sleep(hold)).await?;
                holders.fetch_sub(1, SeqCst);
                if counted {
                    lat.push(t1 - s);
                }
                if await_release {
                    lease.release().await?;
                } else {
                    drop(lease);
                }
            }
            Ok::<_, BoxError>(lat)
        }));
    }
    barrier.wait().await;
    tokio::time::sleep(Duration::from_secs(warm)).await;
    measuring.store(true, SeqCst);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(run)).await;
    measuring.store(false, SeqCst);
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, SeqCst);
    let (mut per, mut lat) = (Vec::new(), Vec::new());
    for task in tasks {
        let l = task.await??;
        per.push(l.len() as u64);
        lat.extend(l);
    }
    // Every lease returned, the sessions still open: what is left was orphaned. A dropped lease's
    // delete is confirmed in the background: give those a moment.
    let mut leftover_open = count_children(&clients[0], &node_dirs).await?;
    let settle = Instant::now();
    while leftover_open > 0 && settle.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        leftover_open = count_children(&clients[0], &node_dirs).await?;
    }
    drop(clients);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let check = connect(addr).await?;
    let leftover = count_children(&check, &node_dirs).await?;
    drop(check);
    let peak = peak.load(SeqCst);
    let release = if await_release { "release().await" } else { "drop(lease)" };
    emit(Report {
        imp,
        workload: "W7",
        ops: per.iter().sum(),
        secs,
        lat_ns: lat,
        lat_kind: "acquire",
        violations: violations.load(SeqCst),
        clients: n,
        per_client: Some(per),
        notes: format!(
            "{n} sessions on one InterProcessSemaphoreV2, max leases {max_leases}, each lease held {} ms; {warm}s warm-up then {run}s; ops_per_s=leases/s; hold=thread sleep (spawn_blocking); peak holders {peak} (in-process counter); leftover lease+lock nodes open/closed={leftover_open}/{leftover}; release={release}",
            hold.as_millis()
        ),
        extra: format!(
            ",\"max_leases\":{max_leases},\"hold_ms\":{},\"peak_holders\":{peak},\"leftover_open\":{leftover_open},\"leftover_nodes\":{leftover}",
            hold.as_millis()
        ),
    });
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `BENCH_LOG=<filter>` (e.g. `zk_recipes=debug`): the library's tracing on stderr, to see
    // where a run's time goes (off by default: it costs).
    if let Ok(filter) = std::env::var("BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let Some(addr) = args.get(1) else {
        eprintln!("usage: {} HOST:PORT [W1,W2,W3,W4,W5,W6,W7]", args[0]);
        std::process::exit(2);
    };
    let workloads = args.get(2).cloned().unwrap_or_else(|| "W1,W2,W3,W4".into());
    now_ns();
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis()
    );
    let base = format!("/peers/zk-recipes/{run_id}");
    for workload in workloads.split(',') {
        match workload {
            "W1" => {
                w1(addr, &base, "zk-recipes", false).await?;
                w1(addr, &base, "zk-recipes-await", true).await?;
            },
            "W2" => w2(addr, &base).await?,
            "W3" => {
                w3(addr, &base, "zk-recipes", false).await?;
                w3(addr, &base, "zk-recipes-await", true).await?;
            },
            "W4" => w4(addr, &base).await?,
            "W5" => w5(addr, &base).await?,
            "W6" => w6(addr, &base).await?,
            "W7" => {
                w7(addr, &base, "zk-recipes", false).await?;
                w7(addr, &base, "zk-recipes-await", true).await?;
            },
            other => return Err(format!("unknown workload {other}").into()),
        }
    }
    Ok(())
}
