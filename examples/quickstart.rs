//! Quickstart: several contenders, each with its own ZooKeeper session, take turns on one lock.
//!
//! ```sh
//! cargo run --example quickstart                      # starts ZooKeeper through zk-testcontainers
//! ZK_CONNECT=127.0.0.1:2181 cargo run --example quickstart   # or use a running server
//! ```
//! Prints the order in which the lock was granted, with each holder's fencing token.

use std::time::Duration;

use zk_recipes::InterProcessMutex;
use zk_testcontainers::ZooKeeper;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();

    // ZK_CONNECT, else a container (building the image offline if needed), else a local install.
    let zookeeper = ZooKeeper::start().await?;
    println!("ZooKeeper at {} ({:?})", zookeeper.connect_string(), zookeeper.backend());

    let path = format!("/quickstart/orders-{}", std::process::id());
    // (grant number, fencing token) of every grant, in grant order.
    let grants = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut contenders = Vec::new();
    for name in ["alpha", "bravo", "charlie", "delta"] {
        // One session per contender, as if each were a separate process.
        let client = zookeeper.client().await?;
        let mutex = InterProcessMutex::builder(client, path.as_str()).node_data(name).build()?;
        let grants = grants.clone();
        contenders.push(tokio::spawn(async move {
            for round in 0..2 {
                let guard = mutex.acquire().await?;
                println!(
                    "{name:>8} holds {} (round {round}, sequence {}, fencing token {})",
                    guard.lock_path(),
                    guard.sequence(),
                    guard.fencing_token()
                );
                grants.lock().map_err(|_| "poisoned")?.push(guard.fencing_token());
                tokio::time::sleep(Duration::from_millis(50)).await; // the critical section
                guard.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for contender in contenders {
        contender.await?.map_err(|err| err.to_string())?;
    }
    let tokens = grants.lock().map_err(|_| "poisoned")?.clone();
    let increasing = tokens.windows(2).all(|pair| pair[0] < pair[1]);
    println!("{} grants; fencing tokens strictly increase in grant order: {increasing}", tokens.len());
    if !increasing {
        return Err("fencing tokens out of order".into());
    }
    Ok(())
}
