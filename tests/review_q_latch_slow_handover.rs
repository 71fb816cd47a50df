//! Review Q (`92da35d`): a close or a drop that lands *inside* a grant's handover, deterministically.
//! `hand_over` logs "leadership taken" before it takes the state's lock; this binary's log writer
//! stalls that line for 80 ms, so the grant is in hand (the hold registered, the node created) and
//! the handover not yet done — the window between the acquire's end and the setting of the
//! leadership's loss hook (`hand_over`: the first grant, or a re-queue's; until `a802210`, the spawn
//! of `serve` or its next loss signal). The close or drop is issued in that
//! window, from the test's thread. Whatever the grant, afterwards: `close` returns `Ok` with no node
//! left (session open) — or, dropped, none soon after —, no node appears later (nothing keeps the
//! election running), the subscriber saw no `Elected` after `NotLeader(LatchClosed)`, and a waiter
//! returned.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use zk_recipes::{Error, LatchEvent, LeaderLatch, LossReason};

/// The path whose "leadership taken" line stalls, and how many such lines began.
#[derive(Clone, Default)]
struct Stall {
    path: Arc<Mutex<Option<String>>>,
    hits: Arc<AtomicU32>,
}

struct SlowWriter {
    stall: Stall,
    line: Vec<u8>,
}

impl Write for SlowWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for SlowWriter {
    fn drop(&mut self) {
        let line = String::from_utf8_lossy(&self.line);
        let target = self.stall.path.lock().unwrap().clone();
        if let Some(path) = target {
            if line.contains("leadership taken") && line.contains(path.as_str()) {
                self.stall.hits.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(80)); // the handover waits here
            }
        }
    }
}

async fn wait_for_hits(stall: &Stall, hits: u32) {
    eventually(Duration::from_secs(10), "the grant's handover began", || async {
        stall.hits.load(Ordering::SeqCst) >= hits
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_or_drop_inside_the_handover_leaves_nothing() {
    let stall = Stall::default();
    let make = stall.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("zk_recipes::recipes::leader=info"))
            .with_writer(move || SlowWriter { stall: make.clone(), line: Vec::new() })
            .with_ansi(false)
            .finish(),
    )
    .expect("the global subscriber");
    let observer = client().await;
    let session = client().await;
    for round in 0..8u32 {
        let (requeue, close) = (round & 1 == 1, round & 2 == 2);
        let path = unique_path("rq-slow-handover");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        let mut events = latch.subscribe();
        let mut hits = stall.hits.load(Ordering::SeqCst) + 1;
        let mut first = String::new();
        if !requeue {
            *stall.path.lock().unwrap() = Some(path.clone());
        }
        latch.start().unwrap();
        if requeue {
            let leadership = latch.await_leadership().await.unwrap();
            first = leadership.lock_path().to_owned();
            // Counted before the delete: the re-queue's grant may log its handover before the
            // delete's reply is read here (seen under load: the hit was counted before `hits`
            // was read, and the wait for one more timed out).
            hits = stall.hits.load(Ordering::SeqCst) + 1;
            *stall.path.lock().unwrap() = Some(path.clone());
            // Lost (node deleted): `rejoin` queues again alone, and its grant's handover stalls.
            observer.delete(leadership.lock_path(), None).await.unwrap();
            drop(leadership);
        }
        // A clone would keep a dropped latch alive: the waiter only with a close.
        let waiter = close.then(|| {
            let (latch, first) = (latch.clone(), first.clone());
            tokio::spawn(async move {
                // A waiter that needs the stalled grant: on the re-queue, wait for the second one.
                loop {
                    let leadership = latch.await_leadership().await?;
                    if leadership.lock_path() != first {
                        return Ok(leadership);
                    }
                    let _ = leadership.lost().await;
                }
            })
        });
        wait_for_hits(&stall, hits).await;
        assert_eq!(children(&observer, &path).await.len(), 1, "round {round}: the grant's node is there");
        if close {
            tokio::time::timeout(Duration::from_secs(20), latch.close())
                .await
                .unwrap_or_else(|_| panic!("round {round}: close did not return"))
                .unwrap_or_else(|err| panic!("round {round}: close: {err}"));
            let left = children(&observer, &path).await;
            assert!(left.is_empty(), "round {round} (re-queue: {requeue}): close returned Ok with {left:?} left");
            assert!(!latch.has_leadership());
        } else {
            drop(latch);
            eventually(Duration::from_secs(5), "a dropped latch leaves", || async {
                children(&observer, &path).await.is_empty()
            })
            .await;
        }
        if let Some(waiter) = waiter {
            let awaited = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a waiter hangs"))
                .unwrap();
            match &awaited {
                Err(Error::LatchState { .. }) => {},
                Ok(leadership) => panic!("round {round}: a waiter got {} from a closed grant", leadership.lock_path()),
                Err(err) => panic!("round {round}: the waiter: {err}"),
            }
        }
        // The stalled handover ends after the close; nothing runs the election then.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = children(&observer, &path).await;
        assert!(
            later.is_empty(),
            "round {round} (re-queue: {requeue}, close: {close}): a node appeared later: {later:?}"
        );
        assert!(!session.state().is_terminated());
        let mut seen = Vec::new();
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            seen.push(event);
        }
        let expected_len = if requeue { 2 } else { 0 };
        assert_eq!(seen.len(), expected_len, "round {round}: events {seen:?}");
        if requeue {
            assert!(
                matches!(
                    seen.as_slice(),
                    [LatchEvent::Elected { .. }, LatchEvent::NotLeader { reason: LossReason::NodeDeleted }]
                ),
                "round {round}: {seen:?}"
            );
        }
    }
    *stall.path.lock().unwrap() = None;
}
