//! Review AF (`14483c4`, `56829f7`: the acquire's create, the listing still to come and a
//! lock-delay's `before` read are boxed; claimed behaviour-neutral, cancel safe at every `.await`).
//! Acquires dropped after growing timeouts (0 to ~25 ms in 250 µs steps), on a busy path (a
//! holder, so the acquire queues) and on lock-delay paths (the `before` read pipelined with the
//! create, then the delay's wait): no lock node is left while the sessions are open.

use crate::common;

use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;

async fn sweep(delay: Option<Duration>, busy: bool, name: &str) {
    let path = unique_path(name);
    let holder_session = client().await;
    let sessions = [client().await, client().await];
    let build = |session: &zookeeper_client::Client| {
        let builder = InterProcessMutex::builder(session.clone(), &path);
        match delay {
            Some(delay) => builder.lock_delay(delay).build().unwrap(),
            None => builder.build().unwrap(),
        }
    };
    let holder = build(&holder_session);
    let held = if busy {
        Some(tokio::time::timeout(Duration::from_secs(10), holder.acquire()).await.unwrap().unwrap())
    } else {
        None
    };
    let mut granted = 0;
    for i in 0..100u64 {
        let limit = Duration::from_micros(250 * i);
        let mut tasks = Vec::new();
        for (s, session) in sessions.iter().enumerate() {
            let mutex = build(session);
            tasks.push(tokio::spawn(async move {
                if s == 1 {
                    tokio::time::timeout(limit, mutex.try_acquire()).await.map(|r| r.unwrap())
                } else {
                    tokio::time::timeout(limit, mutex.acquire()).await.map(|r| Some(r.unwrap()))
                }
            }));
        }
        for task in tasks {
            if let Ok(Some(guard)) = task.await.unwrap() {
                granted += 1;
                drop(guard);
            }
        }
    }
    let open: Vec<_> = sessions.iter().cloned().chain([holder_session.clone()]).collect();
    if let Some(held) = held {
        // Only the holder's node may be left.
        eventually(Duration::from_secs(15), "only the holder's node is left", || async {
            children(&holder_session, &path).await.len() == 1
        })
        .await;
        held.release().await.unwrap();
    }
    assert_no_nodes_left_while_open(&holder_session, &path, &open, Duration::from_secs(15)).await;
    eprintln!("{name}: {granted} granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_dropped_acquires_on_a_busy_path_leave_nothing() {
    sweep(None, true, "raf-cancel-busy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_dropped_lock_delay_acquires_leave_nothing() {
    // Free path, first acquires wait the delay once (the `before` read, then the wait).
    sweep(Some(Duration::from_millis(15)), false, "raf-cancel-delay-free").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn af_dropped_lock_delay_acquires_on_a_busy_path_leave_nothing() {
    sweep(Some(Duration::from_millis(15)), true, "raf-cancel-delay-busy").await;
}
