//! The session layer: one monitor per ZooKeeper session, shared by every hold on it.
//!
//! A lock is held by a *session*, so what a holder can know about its lock is mostly what can be
//! known about the session: is it connected, is it dead, and — the hard part — how long can we
//! still be sure the **leader** has not expired it. The monitor works that out once per session
//! (not once per hold), and turns it into each hold's [`LockState`]:
//!
//! 1. It follows the client's session state (`Client::state_watcher`).
//! 2. While anyone acquires or holds a lock on the session (and for T after), it sends a heartbeat
//!    round (a `sync`) `0.22 T` after the previous answer — and at once when the client
//!    reconnects, none while it is disconnected — and derives the **loss deadline** from
//!    the answers (below). The engine's creates count as rounds too, and its listings as answers.
//! 3. It tells every hold its state: `Lost(reason)` once the session is dead, the deadline has
//!    passed, or (under [`LossPolicy::Suspended`]) the connection is lost or stalled; under
//!    [`LossPolicy::SessionDeadline`] a lost connection is only `Suspended`. A hold told
//!    it is lost because of the connection or the deadline has its node deleted should the
//!    session come back, so no waiter waits for a lock its holder gave up.
//! 4. Each hold watches its own node (a data watch, set when the holder first looks at its state,
//!    or after [`OWN_NODE_WATCH_DELAY`]) and is `Lost(NodeDeleted)` when someone deletes it. One
//!    task per session drives every hold's watch ([`drive_own_watches`]); a hold keeps only its
//!    watch's waiting state.
//! 5. If the monitor stops for any reason but the end of its work — a panic, the runtime shutting
//!    down — every hold it feeds becomes `Lost(MonitorStopped)`: no hold is left saying `Held`
//!    with nobody watching.
//!
//! # The loss deadline
//! T is the session timeout the **leader** uses for our session (see *Which T* below). Only the
//! leader expires sessions, at the earliest T after the last *touch* of the session it knows of
//! (rounded up to its next tick). A client talks to one server; a follower touches our session on
//! each request it receives from us and passes its touches to the leader in its reply to the
//! leader's `PING`, which the leader sends every `tickTime/2`. A follower cut off from the leader
//! goes on answering our pings and reads for up to `syncLimit × tickTime` — so an answer from our
//! server proves nothing about the leader. A `sync` (or a write) is different: the follower
//! forwards it to the leader and answers only once the leader did. We call such a request, sent at
//! local time `s` and answered at `r`, a *leader round*; any other answered request of ours (a
//! read) is just an *answer*.
//!
//! **Assumptions**, each with what breaks without it:
//! - (A1) While a follower's forwarded requests are answered by the leader, the leader's pings
//!   reach it at most `G = 0.22 T` (on our clock) apart: `tickTime/2` plus delivery jitter, which
//!   holds when `tickTime ≤ T/3` (ZooKeeper's default `minSessionTimeout` is `2 × tickTime`; the
//!   sample config's 2 s tick with a 6 s session is exactly `T/3`, leaving `0.053 T` for jitter).
//!   *Without it* a touch we pair with may not have reached the leader yet: the evidence below is
//!   too new, by the excess.
//! - (A3) The local clock — monotonic time plus time spent suspended ([`clock`](crate::session::clock)) — and the
//!   leader's run at rates within 3 % of each other over an interval of T. *Without it* our
//!   `0.8 T` may be longer than the leader's T.
//! - (A4) A leader that lost its quorum stops answering syncs no later than one `tickTime`
//!   (`≤ T/3`) after its successor takes over. (The deposed leader checks its quorum once a tick
//!   and steps down at the first check more than `syncLimit` ticks after its followers' last
//!   acknowledgement; they give up on it `syncLimit` ticks after its last packet, and a successor
//!   exists only after an election. The successor tracks every session afresh from its takeover,
//!   so it cannot expire ours before takeover + T.) *Without it* a round answered by the deposed
//!   leader can vouch for more than the successor knows, by the excess.
//!
//! Messages cannot arrive before they are sent.
//!
//! **Claim.** If leader round `k` is answered, the leader has a touch of our session made no
//! earlier than `s_j`, where `j` is any answered request of ours with `r_j ≤ s_k − G`.
//!
//! *Proof.* The follower received round `k` at `f_k ≥ s_k` and forwarded it; the leader answered,
//! so by (A1) the follower got a ping in `[f_k − G, f_k]` and sent the reply — with every touch it
//! had made until then — ahead of forwarding round `k` on the same ordered stream. Request `j` was
//! received at `f_j ≤ r_j ≤ s_k − G ≤ f_k − G`, so its touch, made at `f_j ≥ s_j`, was in that
//! reply or an earlier one. If the client switched servers between `j` and `k`, the new server
//! revalidated the session with the leader, which touches it at the leader after `r_j`. ∎
//!
//! So the leader cannot expire us before `E + T` (its clock), `E` the latest such `s_j` (or of
//! those *Reconnections* admits, below). A leader
//! that took over since cannot before its takeover + T; a round answered by its deposed
//! predecessor at `a` gives `E ≤ a − G` (the pairing rule), and by (A4) the takeover was no
//! earlier than `a − tickTime`, so that expiry is no earlier than `E + T − (tickTime − G)`, and
//! `tickTime − G ≤ T/3 − 0.22 T < 0.12 T`. We declare the deadline passed at **`E + 0.8 T`** on our
//! clock: the `0.2 T` margin covers those `0.12 T` for (A4) and `0.03 T` for (A3), with `0.05 T`
//! to spare. The next holder is granted only after the expiry has been committed and its watch
//! fired, later still. **The holder is told before the
//! leader can expire the session, so before anyone else can be granted the lock** — also when its
//! server is a follower cut off from the leader that keeps answering it (the zone partition of
//! `tests/ensembles/ensemble.rs`), where the connection looks healthy throughout. Heartbeat rounds are sent
//! `G` after the previous answer, so `r_{k−1} ≤ s_k − G` and in steady state `E = s_{k−1}`: the
//! deadline sits about `0.58 T` after the latest send, and a heartbeat must be late by about
//! `0.36 T` before a healthy session is declared lost, however busy (*Busy sessions*). The monitor keeps heartbeating for T after
//! the session's last acquire or hold, so a session in use always has evidence. A round that is
//! slow (answered more than `G` after it was sent) is paired like any other: the deadline it gives
//! is older, never borrowed from (A2).
//!
//! **Reconnections.** A round sent after a reconnection also pairs with the answers from before
//! it, however recent. When the client comes back with its session — to the same server or
//! another — the server revalidates the session with the leader before it answers the connect
//! (ZooKeeper 3.8: `Learner.validateSession` sends `REVALIDATE`, the leader's
//! `checkIfValidGlobalSession` touches the session with the timeout negotiated on that
//! connection; the leader, or a standalone server, touches it itself). A server closes all its
//! client connections when it stops following its leader or stops leading (`Learner.shutdown`,
//! `Leader.shutdown`), so every request answered on a connection is answered through the leader
//! that revalidated it. And `zookeeper-client` 0.11 serves one connection at a time in one task:
//! it reads no reply of a connection after it publishes `Disconnected` (replies not read by then
//! are dropped, their requests failed), and on the next connection processes the connect
//! response, and publishes `SyncConnected`, before any reply.
//! So when the monitor reads the state `Disconnected`, with the clock read at `b` just before the
//! read and at `a` just after it:
//!
//! > every answer `j` recorded before `b` came on a connection that had ended at the read, and
//! > every leader round `k` sent at `s_k ≥ a` is answered on a later connection, revalidated by
//! > the leader that answers `k` after `j`'s reply was processed: a touch no earlier than `s_j`.
//!
//! A leader deposed when it answers `k` (at or after `s_k`) has a successor that took over no
//! earlier than `s_k − tickTime` by (A4), exactly as for a pair; so such a `j` gives
//! `E = min(s_j, s_k − G)`, which the margin above covers as it covers a pair (a pair has
//! `s_j ≤ s_k − G`, so both rules take `min(s_j, s_k − G)` over the answers they admit). *Without
//! it* a hold could not ride out a disconnection under [`LossPolicy::SessionDeadline`]: a round
//! sent after the reconnection pairs only with answers `G` older than itself, and the deadline
//! moves only with the round after it — past the deadline if the client came back in its last
//! `G`. So the monitor sends no round while disconnected (the client would only queue it) and
//! one at once on the reconnection, also if an earlier one is still unanswered. (Sessions must be
//! global, as every session holding an ephemeral node is: a local session is not revalidated with
//! the leader.) The rule reads the state of the monitor's client, so every client whose requests
//! feed the monitor must be that connection: a clone of it, or of it with another chroot — which
//! is what recipes are given. Two `zookeeper_client::Client`s connected separately to one session
//! (`Connector::with_session`) are two connections, and must not share recipes' sessions.
//!
//! **Busy sessions.** Every answered request is a possible pairing partner, and a session may
//! answer hundreds a second, so the monitor keeps them in entries: an entry is opened by an
//! answer and takes every answer that comes in within `W = G/8` after the one that opened it;
//! it keeps the latest send and the latest answer of its members. It is a sound partner: if its
//! latest answer `a` has `a ≤ s_k − G`, every member `j` has `r_j ≤ a ≤ s_k − G` and pairs with
//! `k` by the Claim, the member with the latest send too; likewise under *Reconnections*, where
//! `a < b` admits every member. And it is never far behind its best member: any answer `j` is
//! in an entry whose latest answer is at most `r_j + W`, so the entry pairs with every round sent
//! from `r_j + W + G` on. The answer of one of the monitor's own heartbeat rounds *closes* its
//! entry (later answers open a new one), and the next round is sent `G` after that entry's latest
//! answer — which is the heartbeat's own answer (an entry only ever takes answers no earlier than
//! its latest). So round `k` always pairs with the entry of round `k − 1`, and in steady state
//! `E = s_{k−1}` however busy the session:
//! were an acquire's answers that come in just after a heartbeat's answer let into its entry,
//! round `k` would pair only with round `k − 2`, and a heartbeat late by `0.14 T` instead of
//! `0.36 T` would lose the locks (unit test `a_lone_answer_after_a_heartbeat_does_not_cost_a_round`).
//! Entries are opened at least `W` apart but for those a heartbeat closed (one per round), so
//! the 64 kept span well over `T`.
//! *Without the bound* — merging each answer into the previous entry whenever it comes within
//! `W` of that entry's latest answer — a stream of answers less than `W` apart chains into one
//! entry whose latest answer is always recent: no round ever pairs with it, the deadline stops
//! moving, and a healthy session is declared past its deadline (the unit test
//! `a_busy_session_never_passes_its_deadline`).
//!
//! **A window of creates.** A server answers a session's requests in order, so a round waits at
//! the server behind every request of ours sent before it, and the evidence it brings trails the
//! clock by the time the server takes to work through them, plus `G`. A burst of thousands of
//! acquires sent at once puts all their creates and listings ahead of the next round: on a slow
//! server (seen: 10,000 acquires, the round answered 3.2 s after it was sent, `T` = 10 s) the
//! deadline passed while the burst was being answered, and every hold granted before it was
//! told `Lost(SessionDeadlinePassed)` on a healthy session — after a cold start, whose first
//! deadline is only `0.36 T` away, in 3 of 19 runs. So at most [`CREATE_WINDOW`] acquires of a
//! session have their create in flight ([`Session::create_slot`]: one place per attempt, from
//! before its create — and a lock-delay's read — is sent until the create and its retries are
//! answered, so a new lock path's `NoNode` and the `multi` after it do not queue twice); the
//! others wait for a place in the process, in order, and a round waits behind a few hundred
//! requests at most. A place is never held while waiting for a lock or a holder (a semaphore's
//! round of lease creates holds one under its internal lock, which waits for no place). This is
//! for liveness only: the deadline is derived as above whatever the queue, and a round that is
//! slow still only makes it older. The window is the monitor's, so one per session and owner
//! (a managed client's recipes and its plain client's count apart). An acquire future that is
//! not polled keeps a place handed to it: acquires frozen on a runtime that no longer runs (a
//! `block_on` that returned) can hold places that others of the session, on other runtimes,
//! wait for.
//!
//! **Cold start.** The first leader round after the monitor (re)starts — a session's first
//! acquire, or the first one after an idle period of more than T, when the monitor had stopped
//! and forgot its answers — has no earlier answer to pair with. Only then, while no answered
//! request can be paired (for about `G`), the deadline counts from `s_k − 2G` instead, which
//! additionally assumes (A2) that the session's requests reached its server in the `2G` before
//! `s_k` — true unless the client→server direction stalled while the server kept sending (the
//! client library pings after `0.15 T` of silence, and gives up on a connection that delivers
//! nothing for `0.4 T`). *Without it* a hold granted in that window may have a deadline up to `2G`
//! too late. Once any answer can be paired, pairing alone decides.
//!
//! **Which T.** `zookeeper_client::Client::session_timeout()` is the timeout negotiated at the
//! first connect. Every server clamps the requested timeout into its own
//! `[minSessionTimeout, maxSessionTimeout]` again when the client reconnects to it, and the leader
//! expires the session by that renegotiated value; the client library does not expose it. So the
//! monitor counts with `min(first negotiated, floor)`, where the floor is what the application
//! states as the smallest timeout any server may negotiate
//! ([`ManagedClientBuilder::min_session_timeout`](crate::ManagedClientBuilder::min_session_timeout),
//! [`MutexBuilder::min_session_timeout`](crate::MutexBuilder::min_session_timeout); the smallest
//! stated for a session wins). Without a floor the bound holds only when every server would
//! negotiate the same timeout (same `tickTime`, `minSessionTimeout` and `maxSessionTimeout`, or
//! the requested T inside every server's range) — the README's Guarantees say what to configure.
//! The floor is sound for any sequence of reconnections: the client asks each server for the
//! previously negotiated value, clamping is monotone, and `clamp_s(m) ≥ m` for
//! `m = min_s clamp_s(T_requested)` (as `m ≤ maxSessionTimeout_s`), so no negotiated value ever
//! falls below `m`.
//!
//! The deadline is per session, not per hold: a hold granted on a watch event (which sent no
//! request) inherits the session's evidence, which is no fresher than the last round actually
//! answered — never the grant instant. A hold's state is also re-evaluated whenever it is read,
//! so a busy runtime that starves the monitor cannot make it say `Held` past the deadline.
//!
//! **Identity.** A monitor belongs to one connection: a [`ManagedClient`](crate::ManagedClient)'s
//! sessions each get a monitor keyed by that managed client, so evidence from one ensemble can
//! never feed the holds of another even if the two hand out the same session id. Plain
//! `zookeeper_client::Client`s (which expose no identity of their connection) share a monitor per
//! session id: clones of one client (also with another chroot) are one connection, as the
//! monitor assumes; a second client connected to the same session on its own
//! (`Connector::with_session`) must not be given to recipes beside the first (*Reconnections*).
//!
//! **Stalls and blips.** Under [`LossPolicy::Suspended`] a connection on which nothing has been
//! answered for `0.4 T`, or a round has been outstanding for `0.25 T` (counted from the last
//! answer to a request sent before it, if later: `Health::stalled_at`), counts as lost, like one
//! the client library gave up on (it does so after `0.4 T` without receiving a byte; a server that
//! stops answering while still sending — watch events, a one-way partition — never trips that).
//! So does a disconnection however short, also one seen only as a heartbeat failing with
//! `ConnectionLoss` or as a state change back to the same state.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tracing::{debug, error, warn};
use zookeeper_client as zk;

use crate::error::{outcome_unknown, session_dead, Error, Result};
use crate::session::cleanup::{Cleanup, Searches, Target};
use crate::session::clock::Clock;
use crate::session::timers::{Driver, Due, Start, TimerKey, Timers};
use crate::session::watch::{arm, NodeWatch, WatchFuture, Watched};
use crate::state::{LockState, LossPolicy, LossReason};
use crate::sync::{lock, Record, Records, WeakRecord};

/// How long a hold nobody asked about goes without a watch on its own node.
pub(crate) const OWN_NODE_WATCH_DELAY: Duration = Duration::from_millis(100);

/// (A1)'s `G`, and the pause between an answered heartbeat and the next: `0.22 T`.
fn report_lag(t: Duration) -> Duration {
    t * 11 / 50
}

/// The deadline: `E + 0.8 T` (the margin: `0.12 T` for (A4), `0.03 T` for (A3), `0.05 T` spare).
fn deadline_after(evidence: Instant, t: Duration) -> Instant {
    evidence + t * 4 / 5
}

/// `W`, the longest span of answer times kept as one entry: `G / 8`.
fn merge_span(t: Duration) -> Duration {
    report_lag(t) / 8
}

/// Without an answer for this long, a connection counts as stalled (the client library gives up
/// on a connection after `0.4 T` without receiving a byte).
fn stall_after(t: Duration) -> Duration {
    t * 2 / 5
}

/// A round outstanding for this long also means a stalled connection.
fn round_stall_after(t: Duration) -> Duration {
    t / 4
}

/// The monitor of one ZooKeeper session. Cheap to clone; every lock recipe on a session shares it.
#[derive(Clone)]
pub(crate) struct Session {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:#x}", self.shared.id))
            .field("owner", &self.shared.owner)
            .finish_non_exhaustive()
    }
}

struct Shared {
    id: i64,
    /// The connection's owner: a managed client's id, `0` for a plain client.
    owner: u64,
    /// The runtime the monitor, the own-node watches and cleanup run on: the one current when
    /// the session's first recipe was built (`Cleanup::new`), else at its first acquire.
    runtime: Arc<OnceLock<tokio::runtime::Handle>>,
    /// The background deletions in flight on the session, by GUID or by path
    /// (`Cleanup::searches_done`).
    searches: Arc<Searches>,
    /// A client of the session, for heartbeats and its state only: paths are always sent
    /// through the recipe's own client, whose chroot may differ.
    client: zk::Client,
    /// The timeout negotiated at the first connect.
    negotiated: Duration,
    /// The smallest timeout any server may negotiate, as stated by the application (nanoseconds;
    /// `u64::MAX`: none stated). Only ever lowered.
    floor_nanos: AtomicU64,
    clock: Clock,
    inner: Mutex<Inner>,
    /// Wakes the monitor task: users, holds or evidence changed.
    wake: Notify,
    /// Notified whenever the monitor finds the session's condition changed.
    health: Notify,
    /// Own-node watches handed to the task that drives them ([`drive_own_watches`]).
    own_watches: Mutex<OwnWatchQueue>,
    /// Wakes the own-node watch driver: a watch was queued.
    own_watches_wake: Notify,
    /// The runtime the monitor was last started on, which the own-node watch driver is spawned
    /// on too: it shares the monitor's fate (review K: a driver started from another runtime
    /// stalled with it, or ended with it and took healthy holds along).
    monitor_runtime: Mutex<Option<tokio::runtime::Handle>>,
    /// Places for acquires whose create is in flight ([`CREATE_WINDOW`]).
    create_window: Semaphore,
    /// The session's timers (its holds' leases), driven by one task while any is set.
    timers: Timers,
}

/// How many acquires of one session may have their create in flight at once (*A window of
/// creates* in the module docs); the rest wait for a place, in order.
pub(crate) const CREATE_WINDOW: usize = 512;

/// Own-node watches not yet taken in by the driver, and whether the driver task runs.
#[derive(Default)]
struct OwnWatchQueue {
    incoming: Vec<(WeakRecord<HoldFeed>, Option<WatchFuture>)>,
    running: bool,
    /// The driver took the queue and waits (or is about to): a watch queued now must wake it.
    waiting: bool,
}

#[derive(Default)]
struct Inner {
    /// Whether the monitor task runs.
    running: bool,
    /// Acquires in flight.
    acquires: usize,
    /// When the last acquire or hold ended (the monitor lingers for T after it).
    idle_since: Option<Instant>,
    holds: HashMap<u64, Record<HoldFeed>>,
    next_hold: u64,
    /// Answered requests of the last `2 T`, in entries of at most `W` of answer times, ordered
    /// by answer time.
    answers: VecDeque<Kept>,
    health: Health,
    /// What the holds were last told, to re-evaluate them only when it changes.
    told: Option<Class>,
    /// Holds waiting for their own-node watch, in the order their delay ends.
    watch_queue: VecDeque<(Instant, WeakRecord<HoldFeed>)>,
    /// The managed client was closed: no lingering once idle.
    closed: bool,
    /// The latest disconnection the monitor read: the clock just before and just after a read of
    /// the client's state that said `Disconnected` (*Reconnections* in the module docs).
    disconnection: Option<Disconnection>,
}

/// A read of the client's state that said `Disconnected`, between two readings of the clock.
#[derive(Clone, Copy, Debug)]
struct Disconnection {
    /// Read before the state: every answer recorded earlier came on a connection that had ended.
    before: Instant,
    /// Read after the state: every request sent later is answered on a connection established
    /// since, which the leader revalidated.
    after: Instant,
}

#[derive(Clone, Copy, Debug)]
struct Answer {
    sent: Instant,
    answered: Instant,
}

/// Answered requests kept as one pairing partner: the latest send and the latest answer of the
/// answers it holds, which all came in within `W` after the first (`opened`). If the latest answer
/// is old enough to pair with a round, so is every answer in it — also the one with the latest
/// send — so the entry vouches for exactly what its best member vouches for (*Busy sessions*).
#[derive(Clone, Copy, Debug)]
struct Kept {
    sent: Instant,
    answered: Instant,
    opened: Instant,
    /// Closed by a heartbeat round's answer: later answers open a new entry, so the entry's latest
    /// answer stays what the next round is paced from (*Busy sessions*).
    closed: bool,
}

/// What the monitor knows about the session.
#[derive(Clone, Copy, Debug, Default)]
struct Health {
    connected: bool,
    terminal: Option<LossReason>,
    /// `E`: the latest touch of the session the leader is known to have (`None` until a first
    /// leader round was answered). The deadline is derived from it with the current T, so a
    /// lower T stated later counts at once (*Which T*).
    evidence: Option<Instant>,
    /// The last answer on the current connection (or when it was established).
    last_answer: Option<Instant>,
    /// When the heartbeat in flight, if any, was sent.
    in_flight_since: Option<Instant>,
    /// The latest answer to a request of ours sent before the heartbeat in flight (while one
    /// was): the round had not reached the head of the session's queue then (see
    /// [`stalled_at`](Self::stalled_at)). Needs no reset: recorded only while a round is in
    /// flight, from an answer to a request sent before it, so a value left from an earlier round
    /// is no later than the next round's sending, or came from a request sent before that round
    /// too (one recorded late by a busy runtime), and would count for it anyway.
    ahead_answered: Option<Instant>,
}

/// The session's condition, as far as holds care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Dead(LossReason),
    DeadlinePassed,
    Disconnected,
    /// Connected, but the server does not answer our heartbeats (a stalled or one-way connection).
    Stalled,
    Healthy,
}

impl Health {
    /// The loss deadline, `E + 0.8 T`.
    fn deadline(&self, t: Duration) -> Option<Instant> {
        self.evidence.map(|evidence| deadline_after(evidence, t))
    }

    fn class(&self, t: Duration, now: Instant) -> Class {
        if let Some(reason) = self.terminal {
            return Class::Dead(reason);
        }
        if self.deadline(t).is_none_or(|deadline| now >= deadline) {
            return Class::DeadlinePassed;
        }
        if !self.connected {
            return Class::Disconnected;
        }
        if self.stalled_at(t).is_some_and(|at| now >= at) {
            return Class::Stalled;
        }
        Class::Healthy
    }

    /// When the connection counts as stalled if nothing is answered before.
    ///
    /// A round's `0.25 T` runs from its sending, or from the latest answer to a request we sent
    /// before it, if later. A server answers a session's requests in order, so until those are
    /// answered the round is not at the head of the queue, and a busy session (a burst of
    /// thousands of acquires) would read as stalled while its answers flow (seen: every lock of
    /// a 10,000-lock burst lost on a slow machine, the round answered 0.3 s after the verdict).
    /// A follower cut off from the leader answers what is ahead of the round that it can (reads)
    /// and then nothing — ours behind the round wait for it — so the round's time runs from its
    /// last answer. This rule only tells `Suspended` holders earlier than the deadline; the
    /// deadline, which alone keeps exclusion, does not depend on it. (So a real stall is told
    /// 0.25 T after the server answered what it had received of ours before the round, at the
    /// latest at the deadline: on a busy session that can be the deadline.)
    fn stalled_at(&self, t: Duration) -> Option<Instant> {
        let by_answer = self.last_answer.map(|at| at + stall_after(t));
        let by_round =
            self.in_flight_since.map(|at| self.ahead_answered.map_or(at, |ahead| ahead.max(at)) + round_stall_after(t));
        by_answer.into_iter().chain(by_round).min()
    }
}

fn verdict(class: Class, policy: LossPolicy) -> LockState {
    match (class, policy) {
        (Class::Dead(reason), _) => LockState::Lost(reason),
        (Class::DeadlinePassed, _) => LockState::Lost(LossReason::SessionDeadlinePassed),
        (Class::Disconnected | Class::Stalled, LossPolicy::Suspended) => {
            LockState::Lost(LossReason::ConnectionSuspended)
        },
        (Class::Disconnected, LossPolicy::SessionDeadline) => LockState::Suspended,
        // Under `SessionDeadline` the deadline covers a connection that stays up but stops
        // answering.
        (Class::Stalled | Class::Healthy, _) => LockState::Held,
    }
}

/// Every hold's feed, side by side (see [`Records`]: the feeds of a burst of grants would
/// otherwise pin the pages the acquires' transient state leaves free).
static FEEDS: Records<HoldFeed> = Records::new();

/// The session-side record of one hold: its state, and what is needed to keep it true.
///
/// Kept small (every held lock has one): the state behind a plain mutex, one `Notify` for
/// `lost()`, the node's path shared with its watch; placed beside the other holds' feeds
/// ([`FEEDS`]).
pub(crate) struct HoldFeed {
    id: u64,
    path: Arc<str>,
    policy: LossPolicy,
    /// Deletes the node through the recipe's own client (its chroot) when the hold is lost.
    cleanup: Arc<Cleanup>,
    state: Mutex<Told>,
    /// Notified on every change of `state`.
    changed: Notify,
    /// Set when the owner released the hold (before the node's delete is sent): from then on
    /// nothing that happens to the node is a loss.
    released: AtomicBool,
    /// Whether the watch on our own node was started.
    watching: AtomicBool,
}

/// What a hold was told, and who is told once it is lost.
#[derive(Debug)]
struct Told {
    state: LockState,
    /// Called once when the hold is newly lost ([`HoldFeed::on_lost`]); taken when called.
    on_lost: Option<Weak<dyn LossHook>>,
    /// Lost, and the hook not called yet: its owner ended it and is sending its node's delete
    /// ([`Session::relinquish`], [`HookDue`]). A hook set meanwhile is kept for that call.
    hook_due: bool,
}

/// Told once when a hold is newly lost (see [`HoldFeed::on_lost`]): how an owner that must act
/// on a loss (a started [`LeaderLatch`](crate::LeaderLatch) queues again) does so without a
/// task of its own waiting for it (issue 24).
pub(crate) trait LossHook: Send + Sync {
    /// The hold was lost for `reason`. Called after the hold's state was set and its waiters
    /// woken, on whatever thread told it — the session monitor's task (or its guard, dropped as
    /// its runtime shuts down), the own-node watch driver, the lease timers' task, a close (of a
    /// latch, of a managed client), or a caller reading a hold's state, which may hold any lock
    /// of its own and be outside a runtime: so it only schedules work, and takes no lock that
    /// such a caller may hold. For a hold its owner ended ([`Session::relinquish`]: a lease run
    /// out, a latch closed), after its node's delete was sent.
    fn lost(self: Arc<Self>, reason: LossReason);
}

/// A relinquished hold's loss hook, called when this is dropped ([`Session::relinquish`]): also
/// when a panic unwinds through the owner, so a latch is never left out of its election.
pub(crate) struct HookDue<'feed> {
    feed: &'feed HoldFeed,
    /// `None`: the hold was lost already; its hook had its turn then.
    reason: Option<LossReason>,
}

impl Drop for HookDue<'_> {
    fn drop(&mut self) {
        let Some(reason) = self.reason.take() else { return };
        if std::thread::panicking() {
            // Dropped by a panic's unwind (the application's subscriber or metrics recorder, in
            // `Hold::end`): a second panic in the hook would abort the process (review AG).
            let call = std::panic::AssertUnwindSafe(|| self.feed.call_hook(reason));
            let _ = std::panic::catch_unwind(call);
        } else {
            self.feed.call_hook(reason);
        }
    }
}

impl std::fmt::Debug for dyn LossHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LossHook")
    }
}

impl std::fmt::Debug for HoldFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldFeed").field("path", &self.path).field("state", &self.current()).finish()
    }
}

impl HoldFeed {
    /// Resolves once the hold is lost, with the reason (cancel safe).
    pub(crate) async fn lost(&self) -> LossReason {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the state is read: a change in between is not missed.
            notified.as_mut().enable();
            if let LockState::Lost(reason) = self.current() {
                return reason;
            }
            notified.await;
        }
    }

    /// The state as last told (no re-evaluation, no side effects).
    pub(crate) fn current(&self) -> LockState {
        lock(&self.state).state
    }

    /// Calls `hook` once when the hold is newly lost (told `Lost` by the monitor, its own-node
    /// watch, a close, or its owner ending it: [`Session::relinquish`]). Never called once the
    /// hold was released cleanly ([`Session::release`]: nothing is a loss from then on), nor when
    /// a loss is only refined. Returns the reason, and keeps no hook, if the hold was already told
    /// it is lost and its hook's turn has passed (it will not come again); replaces an earlier
    /// hook. A hold its owner is ending ([`Session::relinquish`]) keeps the hook until its node's
    /// delete is sent, and calls it then.
    pub(crate) fn on_lost(&self, hook: Weak<dyn LossHook>) -> Option<LossReason> {
        let mut told = lock(&self.state);
        match told.state {
            LockState::Lost(reason) if !told.hook_due => Some(reason),
            _ => {
                told.on_lost = Some(hook);
                None
            },
        }
    }

    /// Wakes whoever waits for a change and, if the hold was newly lost, calls its hook.
    fn changed(&self, newly_lost: Option<LossReason>) {
        self.changed.notify_waiters();
        if let Some(reason) = newly_lost {
            self.call_hook(reason);
        }
    }

    /// Calls the hook, if one is set (taken under the state's lock, so at most once), and ends
    /// its turn.
    fn call_hook(&self, reason: LossReason) {
        let hook = {
            let mut told = lock(&self.state);
            told.hook_due = false;
            told.on_lost.take()
        };
        if let Some(hook) = hook.and_then(|hook| hook.upgrade()) {
            hook.lost(reason);
        }
    }

    /// Whether the owner released the hold.
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Sets the state (`Lost` is final, but see [`refines`]); returns whether the hold was newly
    /// lost.
    fn tell(&self, new: LockState) -> bool {
        let newly_lost = {
            let mut told = lock(&self.state);
            if told.state == new || self.is_released() {
                return false;
            }
            let newly_lost = match (told.state, new) {
                (LockState::Lost(from), LockState::Lost(to)) if refines(from, to) => false,
                (LockState::Lost(_), _) => return false,
                (_, new) => matches!(new, LockState::Lost(_)),
            };
            debug!(lock_node = &*self.path, from = ?told.state, to = ?new, "lock state");
            told.state = new;
            newly_lost
        };
        let newly_lost = match (newly_lost, new) {
            (true, LockState::Lost(reason)) => {
                warn!(lock_node = &*self.path, %reason, "lock lost");
                crate::metrics::lost(reason);
                Some(reason)
            },
            _ => None,
        };
        // Waiters are woken, then the hook told, once the state is recorded. (A hold lost to its
        // connection or its deadline has its node's delete queued after this, by `apply`.)
        self.changed(newly_lost);
        newly_lost.is_some()
    }

    /// Tells the hold its verdict; a hold lost to the connection or the deadline gives up its
    /// node.
    fn apply(&self, state: LockState) {
        if self.tell(state) {
            if let LockState::Lost(LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed) = state {
                // If the same session comes back, nobody must wait for a node whose holder was
                // told it lost the lock. The delete queues until the connection is back, or fails
                // harmlessly if the session is gone.
                self.cleanup.delete(Target::Path(self.path.to_string()));
            }
        }
    }
}

/// Whether a hold lost for `from` is told `Lost(to)` instead once that is known: a hold lost to
/// its connection or its deadline whose session then turns out expired says so (the reason gets
/// more precise; the hold stays lost).
fn refines(from: LossReason, to: LossReason) -> bool {
    matches!(from, LossReason::ConnectionSuspended | LossReason::SessionDeadlinePassed)
        && to == LossReason::SessionExpired
}

/// Monitors by (session id, owner): see *Identity* in the module docs.
type Registry = Mutex<HashMap<(i64, u64), Weak<Shared>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Session {
    /// The monitor of `client`'s session for `owner` (a managed client's id, `0` for a plain
    /// client), created on first use; nothing runs until an acquire.
    pub(crate) fn of(client: &zk::Client, owner: u64) -> Session {
        let key = (client.session_id().0, owner);
        let mut sessions = lock(registry());
        if let Some(shared) = sessions.get(&key).and_then(Weak::upgrade) {
            return Session { shared };
        }
        sessions.retain(|_, shared| shared.strong_count() > 0);
        let shared = Arc::new(Shared {
            id: key.0,
            owner,
            runtime: Arc::new(OnceLock::new()),
            searches: Arc::default(),
            client: client.clone(),
            negotiated: client.session_timeout(),
            floor_nanos: AtomicU64::new(u64::MAX),
            clock: Clock::default(),
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            health: Notify::new(),
            own_watches: Mutex::default(),
            own_watches_wake: Notify::new(),
            monitor_runtime: Mutex::default(),
            create_window: Semaphore::new(CREATE_WINDOW),
            timers: Timers::default(),
        });
        sessions.insert(key, Arc::downgrade(&shared));
        Session { shared }
    }

    /// States that no server may negotiate a session timeout below `floor` for this session (see
    /// *Which T* in the module docs); the smallest floor stated wins.
    pub(crate) fn min_session_timeout(&self, floor: Option<Duration>) {
        if let Some(floor) = floor {
            let nanos = u64::try_from(floor.as_nanos()).unwrap_or(u64::MAX - 1);
            if self.shared.floor_nanos.fetch_min(nanos, Ordering::SeqCst) > nanos {
                // Counted with from now on; the monitor re-reads T when it wakes.
                self.shared.wake.notify_one();
            }
        }
    }

    /// Now, on the monitor's clock (which counts time spent suspended): for the send time of a
    /// request whose answer is passed to [`answered`](Self::answered).
    pub(crate) fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Sets a timer that calls `due` once `at` has passed on the session's clock ([`now`](Self::now)),
    /// unless cancelled first ([`cancel_timer`](Self::cancel_timer)). One task drives every timer
    /// of the session (`session/timers.rs`), on the runtime of the caller that starts it (else the
    /// monitor's), moved off this worker when this starts or wakes it.
    pub(crate) fn set_timer(&self, at: Instant, due: Weak<dyn Due>) -> TimerKey {
        let (key, start) = self.shared.timers.set(at, due, self.now());
        match start {
            Start::Nothing => {},
            Start::Woken => off_this_worker(),
            Start::Spawn => {
                let driver = Driver::new(self.shared.clone(), |shared| &shared.timers, |shared| shared.clock.now());
                // On the runtime of the task setting the timer (a lease's holder), as a task per
                // lease was: the monitor's may be another, and shut down with its holds while this
                // one's go on (review AD). Dropped unspawned, the driver lets the next timer spawn.
                let runtime =
                    tokio::runtime::Handle::try_current().ok().or_else(|| lock(&self.shared.monitor_runtime).clone());
                match runtime {
                    Some(runtime) => drop(runtime.spawn(driver.drive())),
                    None => self.shared.spawn(driver.drive()),
                }
                off_this_worker();
            },
        }
        key
    }

    /// Cancels the timer `key` if it has not fired (the last one ends the driver: it is woken,
    /// and moved off this worker).
    pub(crate) fn cancel_timer(&self, key: TimerKey) {
        if self.shared.timers.cancel(key) == Start::Woken {
            off_this_worker();
        }
    }

    /// Where the session remembers its runtime (shared with the cleanup of its recipes).
    pub(crate) fn runtime_slot(&self) -> Arc<OnceLock<tokio::runtime::Handle>> {
        self.shared.runtime.clone()
    }

    /// The session's deletions by GUID in flight (shared by the cleanup of its recipes).
    pub(crate) fn searches(&self) -> Arc<Searches> {
        self.shared.searches.clone()
    }

    /// Registers an acquire in flight (the monitor heartbeats while there is one), starting the
    /// monitor if needed. Fails if the current runtime cannot run it.
    pub(crate) fn begin_acquire(&self) -> Result<AcquireTicket> {
        check_runtime()?;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let _ = self.shared.runtime.set(handle);
        }
        let mut inner = lock(&self.shared.inner);
        inner.acquires += 1;
        let start = self.ensure_running(&mut inner);
        drop(inner);
        self.start(start);
        Ok(AcquireTicket { shared: self.shared.clone() })
    }

    /// A place in the session's window of creates ([`CREATE_WINDOW`]), held by an acquire attempt
    /// from before its create is sent until the create (with its retries) is answered; waits (in
    /// order) while the window is full. Cancel safe: a place is given back when dropped.
    pub(crate) async fn create_slot(&self) -> Option<SemaphorePermit<'_>> {
        match self.shared.create_window.try_acquire() {
            Ok(slot) => Some(slot),
            // Boxed: laid out beside every acquire's other states otherwise. (`None` only if the
            // semaphore were closed, which it never is: the create goes on without a place.)
            Err(_) => Box::pin(self.shared.create_window.acquire()).await.ok(),
        }
    }

    /// Records an answered request of ours: sent at `sent` (read with [`now`](Self::now)),
    /// answered now. `leader` if the leader answered it (a write or a `sync`), not only our server
    /// (a read).
    pub(crate) fn answered(&self, sent: Instant, leader: bool) {
        let answered = self.now();
        let mut inner = lock(&self.shared.inner);
        // No wake-up: a later deadline needs no action (the monitor recomputes when its timer
        // for the earlier one fires).
        inner.answered(Answer { sent, answered }, leader, self.shared.timeout());
    }

    /// Starts tracking a granted hold of the node `path` (deleted through `cleanup` if the hold
    /// is lost). `own_watch` is the watch on it set while waiting, if any.
    ///
    /// Refused — nothing tracked, the watch handed back — when the monitor cannot vouch for the
    /// session right now (dead, deadline passed, or under [`LossPolicy::Suspended`] a lost or
    /// stalled connection), and once the managed client was closed ([`close_holds`](Self::close_holds)
    /// ran): a hold is never born lost, and none is tracked after a close told the holds. The decision and the tracking are one step
    /// under the session's lock, so no deadline can pass in between.
    pub(crate) fn track(
        &self,
        cleanup: &Arc<Cleanup>,
        path: &Arc<str>,
        policy: LossPolicy,
        own_watch: Option<NodeWatch>,
    ) -> std::result::Result<Record<HoldFeed>, Unvouched> {
        let now = self.now();
        let mut inner = lock(&self.shared.inner);
        let state = verdict(self.shared.class_now(&inner, now), policy);
        if let LockState::Lost(reason) = state {
            return Err(Unvouched { reason, own_watch });
        }
        let id = inner.next_hold;
        inner.next_hold += 1;
        let feed = FEEDS.insert(HoldFeed {
            id,
            path: path.clone(),
            policy,
            cleanup: cleanup.clone(),
            state: Mutex::new(Told { state: LockState::Held, on_lost: None, hook_due: false }),
            changed: Notify::new(),
            released: AtomicBool::new(false),
            watching: AtomicBool::new(own_watch.is_some()),
        });
        inner.holds.insert(id, feed.clone());
        // The monitor is woken only when it must wake earlier than it planned: for the first
        // queued own-node watch. (Every other change here can wait for its next timer.)
        let mut wake = false;
        if own_watch.is_none() {
            wake = inner.watch_queue.is_empty();
            inner.watch_queue.push_back((now + OWN_NODE_WATCH_DELAY, Record::downgrade(&feed)));
        }
        let start = self.ensure_running(&mut inner);
        drop(inner);
        self.start(start);
        // `Held`, or `Suspended` (a lost connection under `SessionDeadline`).
        feed.apply(state);
        if wake {
            self.shared.wake.notify_one();
        }
        let woke_driver = own_watch.is_some_and(|watch| self.spawn_own_watch(&feed, Some(watch)));
        if wake || woke_driver {
            off_this_worker();
        }
        Ok(feed)
    }

    /// The managed client was closed: every hold is told `Lost(SessionClosed)` (its node is
    /// deleted by the close), and the monitor stops as soon as nothing uses the session.
    pub(crate) fn close_holds(&self) {
        let holds: Vec<Record<HoldFeed>> = {
            let mut inner = lock(&self.shared.inner);
            inner.closed = true;
            inner.holds.drain().map(|(_, feed)| feed).collect()
        };
        for feed in holds {
            feed.tell(LockState::Lost(LossReason::SessionClosed));
        }
        self.shared.wake.notify_one();
    }

    /// How long until the loss deadline, if the monitor vouches for the session now (`None` when
    /// it is dead or the deadline has passed).
    pub(crate) fn certain_for(&self) -> Option<Duration> {
        let now = self.now();
        let inner = lock(&self.shared.inner);
        match self.shared.class_now(&inner, now) {
            Class::Dead(_) | Class::DeadlinePassed => None,
            _ => inner.health.deadline(self.shared.timeout()).map(|deadline| deadline.saturating_duration_since(now)),
        }
    }

    /// Why the session ended, if it has (expired, closed, authentication refused).
    pub(crate) fn ended(&self) -> Option<LossReason> {
        match self.shared.class_now(&lock(&self.shared.inner), self.now()) {
            Class::Dead(reason) => Some(reason),
            _ => None,
        }
    }

    /// Waits until the monitor vouches for the session again under `policy` (a new leader round
    /// answered, the connection back); `Err` with the reason once the session is dead. Cancel
    /// safe.
    pub(crate) async fn until_vouched(&self, policy: LossPolicy) -> std::result::Result<(), LossReason> {
        loop {
            let changed = self.shared.health.notified();
            tokio::pin!(changed);
            // Registered before the condition is read: a change in between is not missed.
            changed.as_mut().enable();
            let class = self.shared.class_now(&lock(&self.shared.inner), self.now());
            match (class, verdict(class, policy)) {
                (Class::Dead(reason), _) => return Err(reason),
                (_, LockState::Lost(_)) => changed.await,
                _ => return Ok(()),
            }
        }
    }

    /// The hold's state now: re-evaluated against the clock (the monitor may not have run yet),
    /// and the own-node watch started if it was not.
    pub(crate) fn state(&self, feed: &Record<HoldFeed>) -> LockState {
        if !feed.watching.load(Ordering::Relaxed) && self.spawn_own_watch(feed, None) {
            off_this_worker();
        }
        // Also for a lost hold: its reason becomes `SessionExpired` once the client knows (see
        // `refines`; the monitor may have stopped since the loss).
        let now = self.now();
        let class = self.shared.class_now(&lock(&self.shared.inner), now);
        feed.apply(verdict(class, feed.policy));
        feed.current()
    }

    /// The hold's state now, re-evaluated against the clock like [`state`](Self::state) but
    /// without side effects: nothing is told, no watch is started (for a hold about to end).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn peek(&self, feed: &HoldFeed) -> LockState {
        match feed.current() {
            lost @ LockState::Lost(_) => lost,
            _ => verdict(self.shared.class_now(&lock(&self.shared.inner), self.now()), feed.policy),
        }
    }

    /// The owner released the hold: nothing that happens to its node is a loss any more. Call
    /// before sending the node's delete.
    pub(crate) fn release(&self, feed: &HoldFeed) {
        feed.released.store(true, Ordering::SeqCst);
        let now = self.now();
        let mut inner = lock(&self.shared.inner);
        inner.holds.remove(&feed.id);
        if inner.acquires == 0 && inner.holds.is_empty() {
            // The monitor notices at its next timer (a heartbeat at the latest) and lingers.
            inner.idle_since = Some(now);
        }
    }

    /// The owner ends the hold while guards of it may still be alive (a closed
    /// [`LeaderLatch`](crate::LeaderLatch)): released like [`release`](Self::release), and told
    /// `Lost(reason)` — *before* its node's delete is sent, so no guard reads `Held` once the node
    /// may be gone. Not counted as a loss (metrics, `lock lost` log): the owner chose it.
    ///
    /// Its loss hook is called when the returned [`HookDue`] is dropped: the owner drops it once
    /// the node's delete is sent, so what the hook sends next on the session (a started latch's
    /// next create) comes after that delete, and a latch never has two nodes at once (review AE's
    /// `leases_lost_around_every_handover_requeue_once_per_term`). A hook set in between (a latch
    /// handing over the leadership) waits for that call too.
    #[must_use = "the loss hook is called when this is dropped: drop it once the node's delete is sent"]
    pub(crate) fn relinquish<'feed>(&self, feed: &'feed HoldFeed, reason: LossReason) -> HookDue<'feed> {
        self.release(feed);
        let newly_lost = {
            let mut told = lock(&feed.state);
            match told.state {
                LockState::Lost(_) => None,
                _ => {
                    told.state = LockState::Lost(reason);
                    told.hook_due = true;
                    Some(reason)
                },
            }
        };
        feed.changed.notify_waiters();
        HookDue { feed, reason: newly_lost }
    }

    /// Marks the monitor running; returns what the caller must spawn, after releasing `inner`
    /// (a task dropped at once by a runtime shutting down would take `inner` in its drop).
    #[must_use]
    fn ensure_running(&self, inner: &mut Inner) -> Option<StopGuard> {
        inner.idle_since = None;
        if inner.running {
            return None;
        }
        inner.running = true;
        inner.told = None;
        // What the stopped monitor knew of the connection is stale, and so are its answers: the
        // first leader round from now on is a cold start (the only one until an answer can be
        // paired). Its deadline is kept: a past deadline stays past.
        inner.answers.clear();
        let connected = self.shared.client.state() == zk::SessionState::SyncConnected;
        inner.health.connected = connected;
        inner.health.last_answer = connected.then(|| self.now());
        inner.health.in_flight_since = None;
        // Made before the task is spawned: should the task never run (a runtime shutting down),
        // dropping it still tells the holds.
        Some(StopGuard { shared: self.shared.clone(), finished: false })
    }

    fn start(&self, stop: Option<StopGuard>) {
        if let Some(stop) = stop {
            *lock(&self.shared.monitor_runtime) = self.shared.runtime_here();
            self.shared.spawn(monitor(self.shared.clone(), stop));
        }
    }

    /// Starts the watch on the hold's own node (`armed`: the one set while waiting, if any),
    /// unless it was started. The watch is driven by the session's own-node watch task
    /// ([`drive_own_watches`]), not by a task of its own.
    ///
    /// A watch that is never sent ([`NodeWatch::never`]) is not queued: the hold needs none.
    /// Returns whether it woke or spawned the driver (see [`off_this_worker`]).
    #[must_use]
    fn spawn_own_watch(&self, feed: &Record<HoldFeed>, armed: Option<NodeWatch>) -> bool {
        let armed = match armed {
            Some(watch) => match watch.into_future() {
                Some(watch) => Some(watch),
                None => {
                    feed.watching.store(true, Ordering::SeqCst);
                    return false;
                },
            },
            None if feed.watching.swap(true, Ordering::SeqCst) => return false,
            None => None,
        };
        let (start, wake) = {
            let mut queue = lock(&self.shared.own_watches);
            queue.incoming.push((Record::downgrade(feed), armed));
            let start = !std::mem::replace(&mut queue.running, true);
            (start, !start && std::mem::replace(&mut queue.waiting, false))
        };
        if start {
            let guard = OwnWatchesGuard { shared: self.shared.clone(), finished: false };
            let driver = drive_own_watches(self.shared.clone(), guard);
            match lock(&self.shared.monitor_runtime).clone() {
                Some(runtime) => drop(runtime.spawn(driver)),
                None => self.shared.spawn(driver),
            }
        } else if wake {
            self.shared.own_watches_wake.notify_one();
        }
        start || wake
    }
}

/// The task that drives every own-node watch of a session, while there is one: a hold costs
/// its watch's future in one `FuturesUnordered`, not a task and a boxed future (issue 24). Each
/// watch is still polled only when its own waker fires, so 10,000 held locks cost nothing while
/// nothing happens to them. The task ends once no watch is left (every one fired: a hold's own
/// release fires it) and is started again by the next.
async fn drive_own_watches(shared: Arc<Shared>, mut guard: OwnWatchesGuard) {
    let mut watches = FuturesUnordered::new();
    loop {
        let incoming = {
            let mut queue = lock(&shared.own_watches);
            if queue.incoming.is_empty() && watches.is_empty() {
                queue.running = false;
                queue.waiting = false;
                guard.finished = true;
                return;
            }
            // Set in the step that takes the queue: whoever queues a watch after it wakes us.
            queue.waiting = true;
            std::mem::take(&mut queue.incoming)
        };
        for (feed, armed) in incoming {
            watches.push(own_watch(feed, armed));
        }
        // `notify_one` keeps a permit while nobody waits: a watch queued after the queue was
        // read and before this waits wakes it all the same (and a stale permit costs one pass).
        tokio::select! {
            _ = shared.own_watches_wake.notified() => {},
            Some(()) = watches.next() => {},
        }
    }
}

/// Moves a task this worker just woke or spawned out of the worker's LIFO slot, which no other
/// worker steals from: a holder that blocks its thread after starting its hold's watch (its first
/// `state()`, a grant) would otherwise stall the one task that drives every hold's watch, and
/// what the session's other holds are told (review K); likewise the monitor, woken by a grant. A
/// no-op task takes the slot instead and pushes the woken one to the worker's queue, which the
/// other workers steal from. (With a task per hold, only the blocking holder's own watch waited.)
fn off_this_worker() {
    if tokio::runtime::Handle::try_current().is_ok() {
        drop(tokio::spawn(async {}));
    }
}

/// One hold's own-node watch: `armed` if set while waiting, else set now; the hold is told
/// `Lost(NodeDeleted)` (or its session's end) when it fires, unless released by then.
///
/// Kept for as long as the hold lasts, so it keeps little (issue 24): while it waits, the hold's
/// `Weak` feed and the client's watcher future. What setting the watch needs (the session's
/// cleanup, the path, the retries) lives in a box freed once the watch is set, and is found again
/// from the feed when the watch must be set anew.
#[allow(clippy::manual_async_fn)] // on purpose: see the comment inside
fn own_watch(feed: WeakRecord<HoldFeed>, mut armed: Option<WatchFuture>) -> impl Future<Output = ()> + Send + 'static {
    // An `async` block over the arguments, not an `async fn`: the arguments stay its only copy
    // (an `async fn` keeps them twice, rust-lang/rust#62958), and while the watch waits only
    // the client's watcher future, the `Weak` feed, the emptied `armed` slot and a flag are kept
    // (checked with `-Zprint-type-sizes`: 200 B).
    async move {
        // Whether the node proved readable: a node we may not read is watched through its
        // directory.
        let mut readable = true;
        'watch: loop {
            // Awaited even once the hold is released: our own delete fires it, and dropping an
            // armed watch would cost a request to remove it.
            let event = 'event: {
                if let Some(watch) = armed.take() {
                    break 'event watch.await;
                }
                let watcher = match Box::pin(arm_own_watch(&feed, &mut readable)).await {
                    None => return,
                    Some(Err(watched)) => break 'event watched,
                    Some(Ok(watcher)) => watcher,
                };
                match Watched::from_event(watcher.changed().await) {
                    Some(watched) => watched,
                    // The directory changed (a node not readable): is the node still listed?
                    None => continue 'watch,
                }
            };
            let Some(feed) = feed.upgrade().filter(|feed| !feed.is_released()) else { return };
            let reason = match event {
                Watched::Deleted => LossReason::NodeDeleted,
                Watched::SessionDead(state) => terminal_reason(state),
                Watched::Other => continue,
                Watched::Refused(err) => {
                    error!(lock_node = &*feed.path, %err, "cannot watch our own lock node; a deletion by another client will only be noticed by fenced writes");
                    return;
                },
            };
            feed.tell(LockState::Lost(reason));
            return;
        }
    }
}

/// Sets the watch on the node of the hold `feed` feeds (see [`arm`]); `None` once the hold is
/// gone.
async fn arm_own_watch(
    feed: &WeakRecord<HoldFeed>,
    readable: &mut bool,
) -> Option<Result<zk::OneshotWatcher, Watched>> {
    let (cleanup, path) = feed.upgrade().map(|feed| (feed.cleanup.clone(), feed.path.clone()))?;
    tracing::trace!(path = &*path, "setting a data watch on our own node");
    Some(arm(&cleanup, &path, readable).await)
}

/// Should the own-node watch driver end any other way than by running out of watches (a
/// panic, a runtime shutting down) or never start, the session's holds are no longer watched:
/// every hold it tracks is told `Lost(MonitorStopped)`, as when the monitor stops that way (the
/// driver runs on the monitor's runtime: its shutdown stops both).
struct OwnWatchesGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl Drop for OwnWatchesGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        {
            let mut queue = lock(&self.shared.own_watches);
            queue.running = false;
            queue.waiting = false;
        }
        self.shared.stop_holds("own-node watch driver stopped (runtime shutdown or panic): its holds are lost");
    }
}

/// Why [`Session::track`] refused a grant: the session's verdict, and the watch handed back.
pub(crate) struct Unvouched {
    pub(crate) reason: LossReason,
    pub(crate) own_watch: Option<NodeWatch>,
}

/// An acquire in flight; keeps the monitor heartbeating until dropped.
pub(crate) struct AcquireTicket {
    shared: Arc<Shared>,
}

impl Drop for AcquireTicket {
    fn drop(&mut self) {
        let now = self.shared.clock.now();
        let mut inner = lock(&self.shared.inner);
        inner.acquires -= 1;
        if inner.acquires == 0 && inner.holds.is_empty() {
            inner.idle_since = Some(now);
        }
    }
}

impl Inner {
    /// Takes in the answer of one of the monitor's heartbeat rounds (a leader round), and closes
    /// its entry: returns the entry's latest answer, which the next round is sent `G` after
    /// (*Busy sessions*).
    fn heartbeat_answered(&mut self, answer: Answer, t: Duration) -> Instant {
        match self.record(answer, true, t).and_then(|i| self.answers.get_mut(i)) {
            Some(kept) => {
                kept.closed = true;
                kept.answered
            },
            None => answer.answered,
        }
    }

    /// Takes in an answered request and moves the deadline (see the module docs for the rule).
    fn answered(&mut self, answer: Answer, leader: bool, t: Duration) {
        self.record(answer, leader, t);
    }

    /// [`answered`](Self::answered), returning where the answer is kept (`None`: not kept).
    fn record(&mut self, answer: Answer, leader: bool, t: Duration) -> Option<usize> {
        if leader {
            let g = report_lag(t);
            // Answers recorded before a disconnection read before this round was sent: the
            // reconnection in between was revalidated by the leader (*Reconnections*).
            let revalidated_before = self.disconnection.filter(|d| d.after < answer.sent).map(|d| d.before);
            let round_less_g = answer.sent.checked_sub(g);
            let paired = self
                .answers
                .iter()
                .filter_map(|j| {
                    if j.answered + g <= answer.sent {
                        // Paired (the Claim): `s_j ≤ s_k − G` here.
                        Some(j.sent)
                    } else if revalidated_before.is_some_and(|before| j.answered < before) {
                        round_less_g.map(|limit| j.sent.min(limit))
                    } else {
                        None
                    }
                })
                .max();
            // No answer to pair with (the first rounds since the monitor started): a cold start,
            // relying on (A2). Otherwise pairing alone decides, however old its evidence.
            let evidence = match paired {
                Some(paired) => Some(paired),
                None => answer.sent.checked_sub(g * 2),
            };
            if let Some(evidence) = evidence {
                self.health.evidence = Some(self.health.evidence.map_or(evidence, |e| e.max(evidence)));
            }
        }
        self.health.last_answer = Some(self.health.last_answer.map_or(answer.answered, |a| a.max(answer.answered)));
        if self.health.in_flight_since.is_some_and(|round| answer.sent <= round) {
            // Ahead of the round in the session's queue: it has not stalled yet (`stalled_at`).
            self.health.ahead_answered =
                Some(self.health.ahead_answered.map_or(answer.answered, |a| a.max(answer.answered)));
        }
        // Answers close together share an entry (*Busy sessions* in the module docs): an entry
        // spans at most `W` of answer times from the answer that opened it, so a steady stream of
        // answers leaves a partner at most `W` older than its latest answer.
        let at = self.answers.partition_point(|j| j.answered <= answer.answered);
        let index = match at.checked_sub(1).and_then(|i| self.answers.get_mut(i)) {
            Some(previous) if !previous.closed && answer.answered < previous.opened + merge_span(t) => {
                previous.sent = previous.sent.max(answer.sent);
                previous.answered = previous.answered.max(answer.answered);
                at - 1
            },
            _ => {
                let kept =
                    Kept { sent: answer.sent, answered: answer.answered, opened: answer.answered, closed: false };
                self.answers.insert(at, kept);
                at
            },
        };
        // Evicted from the front: what is older than `2 T`, and beyond 64 entries the oldest.
        let mut index = Some(index);
        while self.answers.front().is_some_and(|oldest| oldest.answered + t * 2 < answer.answered)
            || self.answers.len() > 64
        {
            self.answers.pop_front();
            index = index.and_then(|i| i.checked_sub(1));
        }
        index
    }
}

impl Shared {
    /// The session timeout the deadline counts with: the first negotiated one, or the stated
    /// floor if lower (see *Which T* in the module docs).
    fn timeout(&self) -> Duration {
        match self.floor_nanos.load(Ordering::SeqCst) {
            u64::MAX => self.negotiated,
            floor => self.negotiated.min(Duration::from_nanos(floor)),
        }
    }

    /// The session's condition now: the monitor's view, unless the client already knows the
    /// session is dead (the monitor may not have run since).
    fn class_now(&self, inner: &Inner, now: Instant) -> Class {
        let state = self.client.state();
        if state.is_terminated() {
            return Class::Dead(terminal_reason(state));
        }
        if inner.closed {
            // The managed client was closed: nothing is tracked from then on (`track`), and
            // waiting acquires end rather than wait for a session being given up.
            return Class::Dead(LossReason::SessionClosed);
        }
        inner.health.class(self.timeout(), now)
    }

    /// Tells every tracked hold `Lost(MonitorStopped)` and stops tracking them (`why` is logged
    /// if there were any): a task the holds rely on ended early.
    fn stop_holds(&self, why: &'static str) {
        let holds: Vec<Record<HoldFeed>> = lock(&self.inner).holds.drain().map(|(_, feed)| feed).collect();
        if !holds.is_empty() {
            error!(session = format_args!("{:#x}", self.id), holds = holds.len(), "{why}");
        }
        for feed in holds {
            feed.tell(LockState::Lost(LossReason::MonitorStopped));
        }
    }

    /// The runtime [`spawn`](Self::spawn) spawns on from here.
    fn runtime_here(&self) -> Option<tokio::runtime::Handle> {
        tokio::runtime::Handle::try_current().ok().or_else(|| self.runtime.get().cloned())
    }

    /// Spawns on the current runtime, or the one the session's first acquire ran on. A runtime
    /// that has shut down drops the task at once (the holds it would feed are lost, see
    /// [`StopGuard`]).
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        match self.runtime_here() {
            Some(runtime) => drop(runtime.spawn(task)),
            None => warn!(session = format_args!("{:#x}", self.id), "no tokio runtime to run the session monitor on"),
        }
    }

    /// Re-evaluates every hold if the session's condition changed since they were last told.
    fn tell_holds(&self, class: Class) {
        let holds: Vec<Record<HoldFeed>> = {
            let mut inner = lock(&self.inner);
            if inner.told == Some(class) {
                return;
            }
            inner.told = Some(class);
            inner.holds.values().cloned().collect()
        };
        debug!(session = format_args!("{:#x}", self.id), ?class, holds = holds.len(), "session condition");
        self.health.notify_waiters();
        // Told outside the lock: readers of `state()` and acquires need not wait for 10,000 holds.
        for feed in &holds {
            feed.apply(verdict(class, feed.policy));
        }
        // Lost holds need no more attention.
        lock(&self.inner).holds.retain(|_, feed| !matches!(feed.current(), LockState::Lost(_)));
    }
}

fn terminal_reason(state: zk::SessionState) -> LossReason {
    match state {
        zk::SessionState::AuthFailed => LossReason::AuthFailed,
        zk::SessionState::Closed => LossReason::SessionClosed,
        _ => LossReason::SessionExpired,
    }
}

/// Whether the current tokio runtime can run the monitor (it needs timers).
pub(crate) fn check_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::Runtime { reason: "not called from within a tokio runtime" });
    }
    // Tokio has no way to ask whether timers are enabled short of creating one, which panics
    // when they are not (the panic hook prints tokio's message, which says the same).
    let has_timers =
        std::panic::catch_unwind(|| drop(tokio::time::sleep_until(Instant::now() + Duration::from_secs(1)))).is_ok();
    if !has_timers {
        return Err(Error::Runtime {
            reason: "the tokio runtime has timers disabled; build it with enable_all() or enable_time() \
                     (zk-recipes needs timers to tell a holder when its lock is lost)",
        });
    }
    Ok(())
}

type Heartbeat = Pin<Box<dyn Future<Output = (Instant, std::result::Result<(), zk::Error>)> + Send>>;

async fn poll_heartbeat(heartbeat: &mut Option<Heartbeat>) -> (Instant, std::result::Result<(), zk::Error>) {
    match heartbeat.as_mut() {
        Some(heartbeat) => heartbeat.await,
        None => std::future::pending().await,
    }
}

/// Marks every hold lost if the monitor task ends (or never starts) any other way than by
/// finishing its work.
struct StopGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        lock(&self.shared.inner).running = false;
        self.shared.stop_holds("session monitor stopped (runtime shutdown or panic): its holds are lost");
    }
}

/// Reads the client's state between two readings of the clock and records it if it says
/// `Disconnected` (*Reconnections* in the module docs).
fn note_disconnection(shared: &Shared, states: &zk::StateWatcher) {
    let before = shared.clock.now();
    if states.peek_state() == zk::SessionState::Disconnected {
        let after = shared.clock.now();
        lock(&shared.inner).disconnection = Some(Disconnection { before, after });
    }
}

/// The monitor task of one session: runs while acquires or holds exist, and T after.
async fn monitor(shared: Arc<Shared>, mut stop: StopGuard) {
    let client = shared.client.clone();
    let mut states = client.state_watcher();
    let mut seen = states.state();
    note_disconnection(&shared, &states);
    let mut heartbeat: Option<Heartbeat> = None;
    let mut next_heartbeat = shared.clock.now();
    // A disconnection too short for the state to show it when we look.
    let mut blip = false;
    let mut counted_with = shared.timeout();
    loop {
        // Re-read at every wake-up: a recipe may have stated a lower floor meanwhile. The deadline
        // counts with it at once (it is derived from the evidence); a round goes out at once too,
        // as the next one was planned with the old `G`.
        let t = shared.timeout();
        if t < counted_with {
            counted_with = t;
            next_heartbeat = shared.clock.now();
        }
        let now = shared.clock.now();
        let (wake_at, send, class) = {
            let mut inner = lock(&shared.inner);
            let connected = seen == zk::SessionState::SyncConnected;
            if connected && !inner.health.connected {
                // A (re)established connection: nothing answered on it yet. A round goes out on it
                // at once, also if one sent earlier is still unanswered: sent after the
                // disconnection was read, the new one pairs with every answer from before it
                // (*Reconnections*), and its answer is what lets a hold ride the outage out.
                inner.health.last_answer = Some(now);
                inner.health.in_flight_since = None;
                heartbeat = None;
                next_heartbeat = now;
            }
            inner.health.connected = connected;
            if seen.is_terminated() {
                inner.health.terminal = Some(terminal_reason(seen));
            }
            let idle_for_long = inner.idle_since.is_some_and(|since| now >= since + t);
            let done = idle_for_long || inner.health.terminal.is_some() || inner.closed;
            if inner.acquires == 0 && inner.holds.is_empty() && done {
                // Done; the next acquire starts a new task (the evidence stays with the session).
                inner.running = false;
                stop.finished = true;
                break;
            }
            // Own-node watches whose delay ended.
            let mut due = Vec::new();
            while inner.watch_queue.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, feed)) = inner.watch_queue.pop_front() {
                    due.extend(feed.upgrade());
                }
            }
            // Not while disconnected: the client would only queue the request until it reconnects,
            // and the round sent then pairs better.
            let send = connected && heartbeat.is_none() && now >= next_heartbeat && inner.health.terminal.is_none();
            if send {
                inner.health.in_flight_since = Some(now);
            }
            let health = inner.health;
            let wake_at = [
                health.deadline(t),
                health.stalled_at(t),
                inner.watch_queue.front().map(|(at, _)| *at),
                (heartbeat.is_none() && !send).then_some(next_heartbeat),
                inner.idle_since.map(|since| since + t),
            ]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min()
            .unwrap_or(now + t);
            let class = match health.class(t, now) {
                // A blip is told as a disconnection, unless the session is worse off anyway.
                Class::Healthy | Class::Stalled if blip => Class::Disconnected,
                class => class,
            };
            drop(inner);
            let session = Session { shared: shared.clone() };
            // (The monitor never blocks its worker: the driver it wakes needs no moving.)
            for feed in due.into_iter().filter(|feed| !feed.is_released()) {
                let _ = session.spawn_own_watch(&feed, None);
            }
            (wake_at, send, class)
        };
        shared.tell_holds(class);
        if blip {
            // Told; from now on the holds follow the session's condition again.
            blip = false;
            continue;
        }
        if send {
            // Recorded before the request leaves: the evidence can only be older than the truth.
            let sent = shared.clock.now();
            let client = client.clone();
            heartbeat = Some(Box::pin(async move { (sent, client.sync("/").await) }));
        }
        tokio::select! {
            _ = shared.wake.notified() => {},
            state = states.changed() => {
                note_disconnection(&shared, &states);
                // A change that leaves the state as it was went through another state.
                blip = state == seen && state == zk::SessionState::SyncConnected;
                seen = state;
            },
            (sent, result) = poll_heartbeat(&mut heartbeat) => {
                heartbeat = None;
                lock(&shared.inner).health.in_flight_since = None;
                let answered = shared.clock.now();
                match result {
                    Ok(()) => {
                        let paced_from = lock(&shared.inner).heartbeat_answered(Answer { sent, answered }, t);
                        next_heartbeat = paced_from + report_lag(t);
                    },
                    Err(err) => {
                        debug!(%err, "heartbeat not answered");
                        blip = outcome_unknown(&err) && !session_dead(&err);
                        next_heartbeat = answered + report_lag(t) / 4;
                    },
                }
            },
            // The timer runs on the monotonic clock; a suspension only makes it fire late, and the
            // next pass reads the suspend-counting clock again.
            _ = tokio::time::sleep_until(shared.clock.monotonic(wake_at)) => {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Duration {
        Duration::from_secs(10)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A round's `0.25 T` runs from its sending, or from the last answer to a request sent
    /// before it; an answer to a request sent after it (it cannot come first on a session, but a
    /// busy runtime may record it first) does not move it, nor does a value left from an earlier
    /// round; a stall behind answers that stop is still seen `0.25 T` after the last one.
    #[test]
    fn a_round_stalls_a_quarter_t_after_the_last_answer_ahead_of_it() {
        // Long enough that the cold start's deadline (`s − 2G + 0.8 T`) stays out of the way.
        let t = Duration::from_secs(60);
        let base = Instant::now();
        let mut inner = Inner::default();
        inner.health.connected = true;
        inner.answered(Answer { sent: base, answered: base + ms(5) }, true, t);
        // A leftover from an earlier round, before this round's sending.
        inner.health.ahead_answered = Some(base + ms(5));
        let round = base + ms(100);
        inner.health.in_flight_since = Some(round);
        assert_eq!(inner.health.stalled_at(t), Some(round + t / 4), "from the round's sending");
        // Answers to requests sent before the round, coming in one after another.
        for k in 1..=5u64 {
            let answered = round + ms(1000) * k as u32;
            inner.answered(Answer { sent: round - ms(10), answered }, true, t);
            assert_eq!(inner.health.stalled_at(t), Some(answered + t / 4));
            assert_eq!(inner.health.class(t, answered + t / 4 - ms(1)), Class::Healthy);
        }
        let last_ahead = round + ms(5000);
        // One sent after the round: not ahead of it (the 0.4 T rule still counts it).
        inner.answered(Answer { sent: round + ms(1), answered: round + ms(5500) }, false, t);
        assert_eq!(inner.health.stalled_at(t), Some(last_ahead + t / 4));
        // Nothing more: stalled a quarter of T after the last answer ahead.
        assert_eq!(inner.health.class(t, last_ahead + t / 4), Class::Stalled);
    }

    /// Steady state: each round pairs with the previous one; the deadline is `E + 0.8 T`.
    #[test]
    fn rounds_pair_with_the_previous_answer() {
        let base = Instant::now();
        let mut inner = Inner::default();
        // A cold start: nothing to pair with, evidence from `s − 2G`.
        inner.answered(Answer { sent: base, answered: base + ms(5) }, true, t());
        assert_eq!(inner.health.deadline(t()), Some(base - report_lag(t()) * 2 + t() * 4 / 5));
        // G after the answer: paired with the first round.
        let s2 = base + ms(5) + report_lag(t());
        inner.answered(Answer { sent: s2, answered: s2 + ms(5) }, true, t());
        assert_eq!(inner.health.deadline(t()), Some(base + t() * 4 / 5));
    }

    /// A slow round (answered more than G after it was sent) is paired with the last answer before
    /// it, however old: (A2) is not relied on again once the session has answers (the module
    /// docs' *Cold start*). Before this rule, a slow round counted from `s − 2G`.
    #[test]
    fn a_slow_round_is_paired_not_a_cold_start() {
        let base = Instant::now();
        let mut inner = Inner::default();
        inner.answered(Answer { sent: base, answered: base + ms(5) }, true, t());
        let cold_deadline = inner.health.deadline(t());
        // The next round is sent G later but answered only 0.3 T after it was sent; then a round
        // sent G after that answer.
        let s2 = base + ms(5) + report_lag(t());
        inner.answered(Answer { sent: s2, answered: s2 + t() * 3 / 10 }, true, t());
        let s3 = s2 + t() * 3 / 10 + report_lag(t());
        inner.answered(Answer { sent: s3, answered: s3 + ms(5) }, true, t());
        // Round 3 pairs with round 2 (answered G before it was sent): E = s2. The old rule took
        // the later of that and `s3 − 2G`, which is later here (round 2 was slow).
        assert!(s3 - report_lag(t()) * 2 > s2, "the test must tell the two rules apart");
        assert_eq!(inner.health.deadline(t()), Some(s2 + t() * 4 / 5));
        assert!(cold_deadline < inner.health.deadline(t()));
    }

    /// *Reconnections*: a round sent after a disconnection was read pairs with the answers
    /// recorded before the read, however recent, as `min(s_j, s_k − G)`; a round sent before the
    /// read (still in flight at the cut) does not.
    #[test]
    fn a_round_after_a_reconnection_pairs_with_the_answers_before_it() {
        let g = report_lag(t());
        let base = Instant::now() + t();
        let mut inner = Inner::default();
        inner.answered(Answer { sent: base, answered: base + ms(5) }, true, t());
        let s2 = base + ms(5) + g;
        inner.answered(Answer { sent: s2, answered: s2 + ms(5) }, true, t());
        assert_eq!(inner.health.deadline(t()), Some(base + t() * 4 / 5));
        // The connection is cut 100 ms after round 2's answer; the disconnection is read at once.
        let read = s2 + ms(105);
        inner.disconnection = Some(Disconnection { before: read, after: read + ms(1) });
        // A round sent before the read (in flight at the cut), answered after the reconnection:
        // only the first rule, which pairs it with round 1.
        inner.answered(Answer { sent: read - ms(2), answered: read + ms(600) }, true, t());
        assert_eq!(inner.health.deadline(t()), Some(base + t() * 4 / 5));
        // The round sent at the reconnection, 500 ms after the cut: paired with round 2 although
        // round 2 was answered less than G before it was sent. Round 2's `s_j` is later than
        // `s_k − G` here, so the evidence is `s_k − G`.
        let s3 = read + ms(500);
        inner.answered(Answer { sent: s3, answered: s3 + ms(5) }, true, t());
        assert!(s3 - g < s2, "the test must tell `min(s_j, s_k − G)` from `s_j`");
        assert_eq!(inner.health.deadline(t()), Some(s3 - g + t() * 4 / 5));
        // Without the disconnection read, the same round pairs with round 1 only.
        let mut without = Inner::default();
        without.answered(Answer { sent: base, answered: base + ms(5) }, true, t());
        without.answered(Answer { sent: s2, answered: s2 + ms(5) }, true, t());
        without.answered(Answer { sent: s3, answered: s3 + ms(5) }, true, t());
        assert_eq!(without.health.deadline(t()), Some(base + t() * 4 / 5));
    }

    /// A busy session (app requests answered every 50 ms, as a hot read-lock
    /// cache produces) plus heartbeat rounds G after each answer, all answered in 5 ms. A healthy
    /// session must never be classed DeadlinePassed.
    #[test]
    fn a_busy_session_never_passes_its_deadline() {
        let t = Duration::from_secs(6);
        let g = report_lag(t);
        let base = Instant::now();
        let mut inner = Inner::default();
        inner.health.connected = true;
        let mut next_hb = base;
        let mut next_app = base;
        let mut worst: Option<(Duration, Duration)> = None;
        let end = base + Duration::from_secs(60);
        let mut now = base;
        let mut heartbeats = 0;
        let mut app_n = 0u64;
        let (mut episodes, mut in_episode) = (0, false);
        // Bursts of 40 answers (the review measured with 40).
        let burst: u64 = 40;
        while now < end {
            if next_hb <= next_app {
                now = next_hb;
                // the monitor checks the class when it wakes to send
                if heartbeats > 0 && inner.health.class(t, now) == Class::DeadlinePassed {
                    worst.get_or_insert((now - base, inner.health.deadline(t).unwrap() - base));
                }
                // As the monitor records its rounds, and paces the next from the answer.
                let paced_from = inner.heartbeat_answered(Answer { sent: now, answered: now + ms(5) }, t);
                heartbeats += 1;
                next_hb = paced_from + g;
            } else {
                now = next_app;
                inner.answered(Answer { sent: now, answered: now + ms(5) }, true, t);
                app_n += 1;
                // bursts: 60 ms apart, a 200 ms pause every `burst` answers
                next_app = now + if app_n.is_multiple_of(burst) { ms(200) } else { ms(60) };
            }
            let passed = inner.health.deadline(t).is_none_or(|d| d <= now);
            if passed && !in_episode {
                episodes += 1;
                eprintln!(
                    "episode at {:?}: deadline {:?}",
                    now - base,
                    inner.health.deadline(t).map(|d| d.saturating_duration_since(base))
                );
                worst.get_or_insert((now - base, Duration::ZERO));
            }
            in_episode = passed;
        }
        eprintln!("episodes in 60 s: {episodes}");
        assert!(
            worst.is_none(),
            "healthy busy session declared DeadlinePassed at {:?} (deadline at {:?})",
            worst.unwrap().0,
            worst.unwrap().1
        );
    }

    /// *Busy sessions*: an answer that comes in just after a heartbeat round's answer (an
    /// acquire's create and listing, within `W`) does not cost the next round its partner: the
    /// heartbeat's answer closes its entry, and the next round is paced from that entry's latest
    /// answer, so round `k` still pairs with round `k − 1` (`E = s_{k−1}`). Before, the two
    /// answers joined the heartbeat's entry, round `k` paired only with round `k − 2`, and a
    /// heartbeat late by 0.14 T (not 0.36 T) lost the locks.
    #[test]
    fn a_lone_answer_after_a_heartbeat_does_not_cost_a_round() {
        let t = Duration::from_secs(6);
        let g = report_lag(t);
        for pollute in [false, true] {
            let base = Instant::now();
            let mut inner = Inner::default();
            inner.health.connected = true;
            let mut s = base;
            for _ in 0..8 {
                s = inner.heartbeat_answered(Answer { sent: s, answered: s + ms(5) }, t) + g;
            }
            let s0 = s;
            let paced = inner.heartbeat_answered(Answer { sent: s0, answered: s0 + ms(5) }, t);
            if pollute {
                // An acquire: its create (a leader round) and its listing, 50 ms later.
                inner.answered(Answer { sent: s0 + ms(50), answered: s0 + ms(55) }, true, t);
                inner.answered(Answer { sent: s0 + ms(50), answered: s0 + ms(56) }, false, t);
            }
            let sk = paced + g;
            inner.heartbeat_answered(Answer { sent: sk, answered: sk + ms(5) }, t);
            assert_eq!(
                inner.health.deadline(t),
                Some(s0 + t * 4 / 5),
                "round k pairs with round k − 1 (answers after it: {pollute})"
            );
        }
    }

    /// A stated floor below the negotiated timeout is what the deadline counts with.
    #[tokio::test]
    async fn a_floor_below_the_negotiated_timeout_is_counted_with() {
        let zk = zk_testcontainers::ZooKeeper::shared().await.expect("ZooKeeper for tests");
        let client = zk.client_with_timeout(Duration::from_secs(10)).await.expect("connect");
        let session = Session::of(&client, 0);
        assert_eq!(session.shared.timeout(), Duration::from_secs(10));
        session.min_session_timeout(Some(Duration::from_secs(3)));
        session.min_session_timeout(Some(Duration::from_secs(5))); // the lowest stated wins
        assert_eq!(session.shared.timeout(), Duration::from_secs(3));
        // Another owner (a managed client) of the same session id has a monitor of its own.
        let other = Session::of(&client, 7);
        assert!(!Arc::ptr_eq(&other.shared, &session.shared));
        assert_eq!(other.shared.timeout(), Duration::from_secs(10));
        assert!(Arc::ptr_eq(&Session::of(&client, 0).shared, &session.shared));
    }

    /// The machine is suspended while a lock is held (faked through the monitor's clock): when it
    /// resumes, the hold is lost at once when looked at, and `lost()` resolves within a heartbeat
    /// period even if nobody looks — the deadline counts suspended time, which the leader's clock
    /// counted too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_suspension_longer_than_the_deadline_loses_the_hold() {
        let zk = zk_testcontainers::ZooKeeper::shared().await.expect("ZooKeeper for tests");
        let t = Duration::from_secs(4);
        for look in [true, false] {
            let client = zk.client_with_timeout(t).await.expect("connect");
            let path = format!("/zkr-tests/suspend-{}", uuid::Uuid::new_v4().simple());
            let mutex = crate::InterProcessMutex::new(client.clone(), &path).expect("mutex");
            let guard = mutex.acquire().await.expect("acquire");
            tokio::time::sleep(ms(300)).await;
            assert_eq!(guard.state(), LockState::Held);
            // A suspension of T: monotonic time did not move, the leader's clock did.
            let session = Session::of(&client, 0);
            session.shared.clock.fake_suspend_nanos.store(t.as_nanos() as u64, Ordering::SeqCst);
            let resumed = std::time::Instant::now();
            if look {
                assert_eq!(guard.state(), LockState::Lost(LossReason::SessionDeadlinePassed));
            } else {
                let reason = tokio::time::timeout(t, guard.lost()).await.expect("told without looking");
                assert_eq!(reason, LossReason::SessionDeadlinePassed);
                // The monitor wakes at its next heartbeat (0.22 T after the last answer) at the
                // latest; 0.1 T of slack for a loaded machine.
                assert!(resumed.elapsed() <= t * 32 / 100, "told {:?} after the resume", resumed.elapsed());
            }
        }
    }
}
