//! Fencing: a holder that stops working the moment its lock is lost, writes only through
//! ZooKeeper transactions fenced by the lock, and a toy resource that rejects stale fencing
//! tokens.
//!
//! ```sh
//! cargo run --example fencing       # starts ZooKeeper through zk-testcontainers
//! ```
//!
//! The first holder's connection is stalled (through a fault proxy) in the middle of its work,
//! as in a network partition. It is told the lock is lost before the server expires its session
//! and grants the lock to the second holder; its fenced ZooKeeper write is refused, and the toy
//! resource rejects its stale token.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use zk_recipes::{FencedWriteError, FencingToken, InterProcessMutex, LockGuard};
use zk_testcontainers::{FaultProxy, ZooKeeper};
use zookeeper_client as zk;

/// A resource outside ZooKeeper that remembers the highest token it has seen.
#[derive(Default)]
struct Storage {
    highest: Option<FencingToken>,
    value: String,
}

impl Storage {
    fn write(&mut self, token: FencingToken, value: &str) -> Result<(), String> {
        if let Some(highest) = self.highest.filter(|highest| token < *highest) {
            return Err(format!("rejected write {value:?}: token {token} < {highest}"));
        }
        self.highest = Some(token);
        self.value = value.to_owned();
        Ok(())
    }
}

/// The work of a holder: write to the storage, and record progress in ZooKeeper, fenced.
async fn work(name: &str, guard: &LockGuard, storage: &Mutex<Storage>, progress: &str) -> Result<(), String> {
    for step in 0..20 {
        storage.lock().map_err(|_| "poisoned")?.write(guard.fencing_token(), &format!("{name} step {step}"))?;
        let mut write = guard.fenced_writer();
        write.add_set_data(progress, format!("{name} step {step}").as_bytes(), None).map_err(|e| e.to_string())?;
        match write.commit().await {
            Ok(_) => println!("{name}: step {step} written (token {})", guard.fencing_token()),
            Err(FencedWriteError::LockLost) => return Err(format!("{name}: fenced write refused: lock lost")),
            Err(err) => return Err(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let zookeeper = ZooKeeper::start().await?;
    let admin = zookeeper.client().await?;
    let progress = format!("/fencing-demo/progress-{}", std::process::id());
    admin.mkdir(&progress, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await?;
    let lock_path = format!("/fencing-demo/lock-{}", std::process::id());
    let storage = Arc::new(Mutex::new(Storage::default()));

    // Holder A talks to ZooKeeper through a proxy we can stall.
    let proxy = FaultProxy::start(zookeeper.connect_string()).await?;
    let client_a = zookeeper.connector().with_session_timeout(Duration::from_secs(3)).connect(&proxy.addr()).await?;
    let a = InterProcessMutex::new(client_a, lock_path.as_str())?;
    let guard_a = a.acquire().await?;
    println!("A holds the lock, token {}", guard_a.fencing_token());

    // Holder B waits in its own session.
    let b = InterProcessMutex::new(zookeeper.client().await?, lock_path.as_str())?;
    let b_task = {
        let (storage, progress) = (storage.clone(), progress.clone());
        tokio::spawn(async move {
            let guard = b.acquire().await.map_err(|e| e.to_string())?;
            println!("B holds the lock, token {}", guard.fencing_token());
            let result = tokio::select! {
                result = work("B", &guard, &storage, &progress) => result,
                reason = guard.lost() => Err(format!("B: lock lost ({reason})")),
            };
            guard.release().await.map_err(|e| e.to_string())?;
            result
        })
    };

    // A works until its lock is lost; the partition starts after a second.
    let partition = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("-- A's connection stalls (network partition)");
        proxy.stall();
        std::future::pending::<()>().await
    };
    tokio::select! {
        result = work("A", &guard_a, &storage, &progress) => println!("A finished: {result:?}"),
        reason = guard_a.lost() => println!("A: stopping, lock lost: {reason}"),
        _ = partition => {},
    }
    // A process that was paused instead would not have noticed; its writes are still refused:
    let stale = work("A", &guard_a, &storage, &progress).await;
    println!("A tries to write anyway: {}", stale.err().unwrap_or_default());
    b_task.await?.map_err(|e| -> Box<dyn std::error::Error> { e.into() })?;
    let token_a = guard_a.fencing_token();
    drop(guard_a);
    // A's stale token is rejected by the resource, whatever A believes.
    let rejected = storage.lock().map_err(|_| "poisoned")?.write(token_a, "A late write");
    println!("storage: {:?}", rejected.err().unwrap_or_default());
    let (data, _) = admin.get_data(&progress).await?;
    println!("final progress in ZooKeeper: {}", String::from_utf8_lossy(&data));
    Ok(())
}
