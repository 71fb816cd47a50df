//! The reviews' reproductions: each module is one review's tests (a fresh-eyes reviewer tried to
//! break a promise; these keep what it found fixed). One test binary for all of them: each file
//! was its own binary, and compiling and linking 34 of them was most of CI's test build. Kept
//! apart: `review_k_leak` (a counting global allocator), `review_p_latch_grant_close` and
//! `review_q_latch_slow_handover` (each sets the process's global tracing subscriber),
//! `review_c` and `review_timeout` (each serialises its tests around servers of its own),
//! `review_f_lease` (one test keeps five threads spinning for 25 s, which would starve whatever
//! ran beside it) and `review_h_counting` (a 750 ms bound on a restarted server; review Y).
//!
//! Tests here run beside tests of other reviews (two at a time): none may assume it is alone in
//! the process or on the shared server.

#[path = "../common/mod.rs"]
mod common;

mod review_ae_latch_hook;
mod review_af_cancel;
mod review_af_internals;
mod review_af_latch;
mod review_af_timer_panic;
mod review_ag_release_panic;
mod review_ah_near_watch;
mod review_b;
mod review_d;
mod review_e_cancel;
mod review_e_chaos;
mod review_e_multi;
mod review_h_try_acquire;
mod review_i_chroot;
mod review_i_leases;
mod review_j_final;
mod review_j_latch;
mod review_k_blocking;
mod review_k_promises;
mod review_k_runtimes;
mod review_l_burst;
mod review_l_reuse;
mod review_latch_close;
mod review_latch_close_b;
mod review_m_cancel;
mod review_m_errors;
mod review_m_race;
mod review_m_token;
mod review_n_burst_requests;
mod review_n_own_watch;
mod review_p_latch_close_calls;
mod review_p_latch_wakeups;
mod review_q_latch_managed_terms;
mod review_q_latch_requeue_close;
mod review_q_latch_runtime_shutdown;
mod review_r_shutdown_during_close;
mod review_r_undriven_runtimes;
mod review_s_close_cost;
mod review_s_path_reuse;
mod review_t_close;
mod review_w_window;
