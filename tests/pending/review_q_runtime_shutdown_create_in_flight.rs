//! NOT COMPILED (tests/pending/ is not a test target): review Q's reproduction of a defect older
//! than `92da35d`, kept here until it is fixed; then move it back into
//! `tests/review_q_latch_runtime_shutdown.rs` (it uses that file's `start_then_shut_down`).
//!
//! A latch started on a runtime of its own, on a session whose client runs on another; that
//! runtime is shut down while the latch's create is in flight. The dropped acquire's delete by
//! GUID is spawned on the runtime that is shutting down (`Cleanup::delete_and_forget` prefers
//! `Handle::try_current()`), so it never runs, and `close` from the other runtime returns `Ok`
//! with the node still there (a few rounds of 40).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latch_runtime_shut_down_while_its_create_is_in_flight_leaves_its_node() {
    let observer = client().await;
    let session = client().await;
    let mut grants = Vec::new();
    for _ in 0..3 {
        let latch = LeaderLatch::new(session.clone(), unique_path("rq-rt-calibrate")).unwrap();
        let started = Instant::now();
        latch.start().unwrap();
        drop(latch.await_leadership().await.unwrap());
        grants.push(started.elapsed());
        latch.close().await.unwrap();
    }
    grants.sort();
    let grant = grants[1];
    for round in 0..40u32 {
        let path = unique_path("rq-rt-in-flight");
        let latch = LeaderLatch::builder(session.clone(), &path).id(format!("r{round}")).build().unwrap();
        // Swept across the create: 0.3 .. 1.3 x the time a grant takes from `start`.
        let delay = grant * (6 + round % 20) / 20;
        start_then_shut_down(&latch, |_| async {}, delay).await;
        let leads = latch.has_leadership();
        latch.close().await.unwrap();
        let left = children(&observer, &path).await;
        assert!(!session.state().is_terminated());
        assert!(
            left.is_empty(),
            "round {round} (shut down {delay:?} after start, leading: {leads}): close returned Ok with {left:?} left"
        );
    }
}
