//! Review M: many acquirers racing on brand-new lock paths (b19ca63's `multi` guessing only the
//! directory is missing, the level lookup when it is not, the listing pipelined behind the
//! `multi`), on eight sessions — half of them chrooted to the paths' parent, so one server
//! directory is named two ways — with two acquirers per session (the session's shared listings
//! and the process's `listing::Setup`), mixing `acquire`, `try_acquire` and `acquire_timeout`.
//!
//! Checked: never two holders at once; the fencing tokens of one path's holders strictly increase
//! in grant order and each is its node's real czxid; the first holder's token is the directory's
//! czxid (its node was created with the directory); no node left while the sessions are open.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use zk_recipes::InterProcessMutex;
use zookeeper_client as zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_on_new_paths_under_two_names_excludes_and_fences() {
    let raw = client().await;
    let parent = unique_path("rm-race");
    raw.mkdir(&parent, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    let mut sessions = Vec::new();
    for i in 0..8 {
        let session = client().await;
        // (client, prefix the client puts before a server path relative to `parent`)
        sessions.push(if i % 2 == 0 {
            (session.chroot(parent.as_str()).unwrap(), String::new())
        } else {
            (session, parent.clone())
        });
    }
    let rounds = 16;
    for round in 0..rounds {
        // Alternate: only the directory missing, two levels missing, three.
        let relative = match round % 3 {
            0 => format!("/lock-{round}"),
            1 => format!("/l{round}/lock"),
            _ => format!("/l{round}/m/lock"),
        };
        let server_path = format!("{parent}{relative}");
        let holders = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicUsize::new(0));
        // (token, czxid read while held, sequence) in grant order.
        let grants = Arc::new(Mutex::new(Vec::<(i64, i64, i64)>::new()));
        let start = Arc::new(tokio::sync::Barrier::new(sessions.len() * 2));
        let mut tasks = Vec::new();
        for (s, (session, prefix)) in sessions.iter().enumerate() {
            for k in 0..2 {
                let mutex = InterProcessMutex::new(session.clone(), format!("{prefix}{relative}")).unwrap();
                let (start, holders, violations, grants) =
                    (start.clone(), holders.clone(), violations.clone(), grants.clone());
                let raw = raw.clone();
                let parent = parent.clone();
                let chrooted = prefix.is_empty();
                tasks.push(tokio::spawn(async move {
                    start.wait().await;
                    let guard = match (s + k + round) % 3 {
                        0 => mutex.acquire().await.unwrap(),
                        1 => mutex.acquire_timeout(Duration::from_secs(30)).await.unwrap().expect("granted in 30 s"),
                        _ => loop {
                            if let Some(guard) = mutex.try_acquire().await.unwrap() {
                                break guard;
                            }
                            tokio::time::sleep(Duration::from_millis(3)).await;
                        },
                    };
                    if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let node =
                        if chrooted { format!("{parent}{}", guard.lock_path()) } else { guard.lock_path().to_owned() };
                    let czxid = raw.get_data(&node).await.unwrap().1.czxid;
                    grants.lock().unwrap().push((guard.fencing_token().as_i64(), czxid, guard.sequence()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }));
            }
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(60), task).await.expect("every racer granted in turn").unwrap();
        }
        assert_eq!(violations.load(Ordering::SeqCst), 0, "round {round}: two holders of {server_path} at once");
        let grants = grants.lock().unwrap().clone();
        assert_eq!(grants.len(), sessions.len() * 2);
        for (token, czxid, sequence) in &grants {
            assert_eq!(token, czxid, "round {round}: token is not the node's czxid (sequence {sequence}): {grants:?}");
        }
        for pair in grants.windows(2) {
            assert!(pair[0].0 < pair[1].0, "round {round}: tokens not increasing in grant order: {grants:?}");
        }
        // The directory may have been reaped since the last release; if not, the first holder's
        // node was created with it.
        if let Ok((_, dir)) = raw.get_data(&server_path).await {
            if dir.czxid <= grants[0].0 {
                assert_eq!(
                    dir.czxid, grants[0].0,
                    "round {round}: the first holder's node is not the directory's first"
                );
            }
        }
    }
    let open: Vec<zk::Client> = sessions.iter().map(|(c, _)| c.clone()).collect();
    for round in 0..rounds {
        let relative = match round % 3 {
            0 => format!("/lock-{round}"),
            1 => format!("/l{round}/lock"),
            _ => format!("/l{round}/m/lock"),
        };
        assert_no_nodes_left_while_open(&raw, &format!("{parent}{relative}"), &open, Duration::from_secs(10)).await;
    }
}
