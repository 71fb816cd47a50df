//! Three replicas of a cache warmer, one active: each *starts* a [`LeaderLatch`] on its own
//! [`ManagedClient`] and works only while it leads (a tick every 100 ms, stamped with its fencing
//! token) — Curator's `LeaderLatch` lifecycle, `start()` … `close()`. The example checks itself:
//!
//! 1. the leader's session expires (as after a long pause): it is told it lost leadership and
//!    stops working before another replica starts; then its latch rejoins the election on the
//!    new session *by itself* — nobody calls anything;
//! 2. the leaders close their latches one by one: each close steps down at once, and the
//!    replica whose session expired leads again from the place it rejoined at;
//! 3. no two leaderships overlap, fencing tokens grow, every replica's subscriber saw each of
//!    its changes, and no node is left once every latch is closed.
//!
//! ```sh
//! cargo run --example latch      # starts ZooKeeper (a container, or a local process)
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zk_recipes::{FencingToken, LatchEvent, LeaderLatch, ManagedClient};
use zk_testcontainers::{expire_session, ZooKeeper};

const REPLICAS: usize = 3;
const SESSION_TIMEOUT: Duration = Duration::from_secs(4);
const ELECTION: &str = "/election/cache-warmer";

/// One leadership, as the replica's work loop saw it.
#[derive(Clone, Debug)]
struct Reign {
    replica: usize,
    token: FencingToken,
    started: Instant,
    /// When its work loop saw the leadership end (told it is lost, or closed).
    stopped: Option<Instant>,
    ticks: u32,
    /// When it last worked: what must come before the next leader starts.
    last_tick: Option<Instant>,
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

    fn leader(&self) -> Option<usize> {
        self.reigns().last().filter(|r| r.stopped.is_none()).map(|r| r.replica)
    }
}

/// A replica's work: whenever its started latch leads, tick until the leadership is lost or the
/// latch is closed. The latch rejoins the election by itself after a loss; this loop only waits
/// for the next leadership.
async fn work(i: usize, latch: LeaderLatch, log: Arc<Log>) {
    while let Ok(leadership) = latch.await_leadership().await {
        let at = log.with(|reigns| {
            reigns.push(Reign {
                replica: i,
                token: leadership.fencing_token(),
                started: Instant::now(),
                stopped: None,
                ticks: 0,
                last_tick: None,
            });
            reigns.len() - 1
        });
        println!("replica-{i}: leading (fencing token {})", leadership.fencing_token());
        let reason = loop {
            tokio::select! {
                // Loss first: once the leadership is known lost, no further tick.
                biased;
                reason = leadership.lost() => break reason,
                () = tokio::time::sleep(Duration::from_millis(100)) => log.with(|reigns| {
                    reigns[at].ticks += 1;
                    reigns[at].last_tick = Some(Instant::now());
                }),
            }
        };
        log.with(|reigns| reigns[at].stopped = Some(Instant::now()));
        println!("replica-{i}: stopped working ({reason})");
    }
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
    let (mut clients, mut latches, mut tasks, mut subscribers) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..REPLICAS {
        let zk = ManagedClient::builder(connect.as_str()).session_timeout(SESSION_TIMEOUT).connect().await?;
        let latch = LeaderLatch::builder(&zk, ELECTION).id(format!("replica-{i}")).build()?;
        // Every change of this replica's leadership, in order.
        let mut events = latch.subscribe();
        subscribers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(event) = events.next().await {
                seen.push(match event {
                    LatchEvent::Elected { fencing_token, .. } => format!("elected({fencing_token})"),
                    LatchEvent::NotLeader { reason } => format!("not leader ({reason})"),
                    LatchEvent::Stopped { error } => format!("stopped ({error})"),
                    _ => "other".to_owned(),
                });
            }
            seen
        }));
        latch.start()?;
        tasks.push(tokio::spawn(work(i, latch.clone(), log.clone())));
        clients.push(zk);
        latches.push(latch);
    }
    until("a leader", Duration::from_secs(20), || log.leader().is_some()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. The leader's session expires: told, stopped, and back in the election by itself.
    let first = log.leader().ok_or("no leader")?;
    let old_session = clients[first].client().session_id().0;
    println!("-- replica-{first}'s session expires");
    expire_session(&connect, &clients[first].client()).await?;
    until("a second leader", SESSION_TIMEOUT * 3, || log.leader().is_some_and(|r| r != first)).await?;
    let reigns = log.reigns();
    let (old, new) = (&reigns[reigns.len() - 2], &reigns[reigns.len() - 1]);
    if old.last_tick.is_some_and(|worked| worked > new.started) {
        return Err("the expired leader was still working when the next one started".into());
    }
    let mut rejoined = false;
    for _ in 0..200 {
        // Listed through another replica: the expired one's client may still be between sessions.
        let observer = &latches[(first + 1) % REPLICAS];
        rejoined = observer.participants().await.is_ok_and(|participants| {
            participants.iter().any(|p| p.id() == format!("replica-{first}") && p.session_id != old_session)
        });
        if rejoined {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !rejoined {
        return Err(format!("replica-{first} did not rejoin the election on its new session").into());
    }
    println!("replica-{first} rejoined the election on its new session by itself");

    // 2. Leaders close their latches one by one until the rejoined replica leads.
    let mut closed = Vec::new();
    while log.leader() != Some(first) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let leader = log.leader().ok_or("no leader")?;
        println!("-- replica-{leader} closes its latch");
        latches[leader].close().await?;
        closed.push(leader);
        until("the next leader", Duration::from_secs(10), || log.leader().is_some_and(|r| r != leader)).await?;
    }
    println!("replica-{first} leads again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for latch in &latches {
        latch.close().await?;
    }
    for task in tasks {
        task.await?;
    }

    // 3. No two reigns overlap; tokens grow; every change was seen; nothing is left.
    let reigns = log.reigns();
    for pair in reigns.windows(2) {
        pair[0].stopped.ok_or("an earlier reign never stopped")?;
        if pair[0].last_tick.is_some_and(|worked| worked > pair[1].started) {
            return Err(format!("two leaders at once: {:?} and {:?}", pair[0], pair[1]).into());
        }
        if pair[0].token >= pair[1].token {
            return Err(format!("fencing tokens did not grow: {:?} then {:?}", pair[0], pair[1]).into());
        }
    }
    if reigns.iter().any(|r| r.ticks == 0) {
        return Err(format!("every leader should have worked: {reigns:?}").into());
    }
    for (i, subscriber) in subscribers.into_iter().enumerate() {
        let seen = subscriber.await?;
        let led = reigns.iter().filter(|r| r.replica == i).count();
        let elected = seen.iter().filter(|e| e.starts_with("elected")).count();
        println!("replica-{i} saw: {}", seen.join(", "));
        if elected != led || seen.len() != 2 * led {
            return Err(format!("replica-{i} led {led} times, its subscriber saw {seen:?}").into());
        }
    }
    let observer = clients[first].client();
    let left = match observer.list_children(ELECTION).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(err) => return Err(err.into()),
    };
    if !left.is_empty() {
        return Err(format!("nodes left after every latch closed: {left:?}").into());
    }
    println!(
        "{{\"reigns\":{},\"ticks\":{},\"closed_in_turn\":{}}}",
        reigns.len(),
        reigns.iter().map(|r| r.ticks).sum::<u32>(),
        closed.len()
    );
    for client in clients {
        let _ = client.close().await;
    }
    Ok(())
}
