//! Three replicas of a scheduler, one active: each runs a [`LeaderSelector`] on its own
//! [`ManagedClient`], and only the leader schedules (a tick every 100 ms, stamped with its
//! fencing token). The example checks itself:
//!
//! 1. the active replica "crashes" (its connection is cut and refused, its task gone, no
//!    `closeSession`): another replica takes over once ZooKeeper expires the dead one's session;
//! 2. the new leader's connection stalls: it is told it lost leadership and stops scheduling
//!    *before* the third replica starts — then it gets a new session by itself and queues again;
//! 3. no two leaderships ever overlap, and fencing tokens grow with every leadership.
//!
//! ```sh
//! cargo run --example leader     # starts ZooKeeper (a container, or a local process)
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zk_recipes::{FencingToken, LeaderSelector, ManagedClient};
use zk_testcontainers::{FaultProxy, ZooKeeper};

const REPLICAS: usize = 3;
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
const ELECTION: &str = "/election/scheduler";

/// One leadership, as the scheduler saw it.
#[derive(Clone, Debug)]
struct Reign {
    replica: usize,
    token: FencingToken,
    started: Instant,
    /// When it stopped scheduling (its future completed or was dropped).
    stopped: Option<Instant>,
    ticks: u32,
}

#[derive(Default)]
struct Log(Mutex<Vec<Reign>>);

impl Log {
    fn reigns(&self) -> Vec<Reign> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Reign>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Marks the reign stopped when the scheduler's future ends, however it ends.
struct Stop(Arc<Log>, usize);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.with(|reigns| reigns[self.1].stopped = Some(Instant::now()));
    }
}

async fn replica(i: usize, zk: ManagedClient, log: Arc<Log>) -> zk_recipes::Result<()> {
    let selector = LeaderSelector::builder(&zk, ELECTION).id(format!("replica-{i}")).build()?;
    selector
        .run(|leadership| {
            let log = log.clone();
            async move {
                let at = log.with(|reigns| {
                    reigns.push(Reign {
                        replica: i,
                        token: leadership.fencing_token(),
                        started: Instant::now(),
                        stopped: None,
                        ticks: 0,
                    });
                    reigns.len() - 1
                });
                let _stop = Stop(log.clone(), at);
                println!("replica-{i}: leading (fencing token {})", leadership.fencing_token());
                // Schedule until the leadership is taken away (the future is dropped then).
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    log.with(|reigns| reigns[at].ticks += 1);
                }
            }
        })
        .await
        .map(|never| match never {})
}

async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("not within {limit:?}: {what}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let zookeeper = ZooKeeper::start().await?;
    let connect = zookeeper.connect_string().to_owned();
    println!("ZooKeeper at {connect}");
    let log = Arc::new(Log::default());
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..REPLICAS {
        let proxy = FaultProxy::start(&connect).await?;
        let zk = ManagedClient::builder(proxy.addr()).session_timeout(SESSION_TIMEOUT).connect().await?;
        tasks.push(tokio::spawn(replica(i, zk, log.clone())));
        proxies.push(proxy);
    }
    let leader = |log: &Log| log.reigns().last().filter(|r| r.stopped.is_none()).map(|r| r.replica);
    until("a leader", Duration::from_secs(20), || leader(&log).is_some()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. The leader crashes: its connection is cut and refused, its process gone.
    let first = leader(&log).ok_or("no leader")?;
    println!("-- replica-{first} crashes");
    proxies[first].refuse(true);
    proxies[first].cut();
    tasks[first].abort();
    let crashed_at = Instant::now();
    until("a second leader", SESSION_TIMEOUT * 3, || leader(&log).is_some_and(|r| r != first)).await?;
    let second = leader(&log).ok_or("no leader")?;
    println!("replica-{second} took over {:.1} s after the crash", crashed_at.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 2. The second leader's connection stalls: it must stop before the third starts.
    println!("-- replica-{second}'s connection stalls");
    let stalled_at = Instant::now();
    proxies[second].stall();
    until("a third leader", SESSION_TIMEOUT * 3, || leader(&log).is_some_and(|r| r != second)).await?;
    let reigns = log.reigns();
    let (old, new) = (&reigns[reigns.len() - 2], &reigns[reigns.len() - 1]);
    let stopped = old.stopped.ok_or("the stalled leader never stopped")?;
    println!(
        "replica-{second} stopped {:.2} s after the stall, replica-{} started {:.2} s after it",
        (stopped - stalled_at).as_secs_f64(),
        new.replica,
        (new.started - stalled_at).as_secs_f64()
    );
    if stopped >= new.started {
        return Err("the stalled leader was still scheduling when the next one started".into());
    }
    // It comes back with a new session (the old one expired) and queues again.
    proxies[second].pass();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 3. No two reigns overlap; tokens grow.
    let reigns = log.reigns();
    for pair in reigns.windows(2) {
        let ended = pair[0].stopped.ok_or("an earlier reign never stopped")?;
        if ended > pair[1].started {
            return Err(format!("two leaders at once: {:?} and {:?}", pair[0], pair[1]).into());
        }
        if pair[0].token >= pair[1].token {
            return Err(format!("fencing tokens did not grow: {:?} then {:?}", pair[0], pair[1]).into());
        }
    }
    if reigns.len() < 3 || reigns.iter().any(|r| r.ticks == 0) {
        return Err(format!("every leader should have scheduled: {reigns:?}").into());
    }
    println!(
        "{{\"reigns\":{},\"ticks\":{},\"replicas_that_led\":{}}}",
        reigns.len(),
        reigns.iter().map(|r| r.ticks).sum::<u32>(),
        {
            let mut led: Vec<usize> = reigns.iter().map(|r| r.replica).collect();
            led.sort_unstable();
            led.dedup();
            led.len()
        }
    );
    for task in tasks {
        task.abort();
    }
    Ok(())
}
