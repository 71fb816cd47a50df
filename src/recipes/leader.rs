//! Leader election: [`LeaderLatch`] and [`LeaderSelector`] (Curator's), each a lock on the shared
//! engine — leadership *is* a hold, so it inherits the mutex's loss signal, loss deadline, fencing
//! token, fenced writes, cancel safety and managed-client behaviour instead of re-implementing
//! them.
//!
//! - A [`LeaderLatch`] queues `_c_<uuid>-latch-<seq>` nodes holding the participant id, as
//!   Curator's `LeaderLatch` does: the first node in sequence order leads; everyone else watches
//!   its immediate predecessor. Curator's `LeaderLatch` on the same path is a peer. Started, the
//!   latch stays in the election until it is closed: a task of the latch queues it and ends at
//!   the grant, the latch keeps the guard while the leadership lasts, and the leadership's loss
//!   starts the next task, which queues again (Curator's `reset()`); a close ends the hold
//!   however many guards of it were handed out (`Holds::end_all`: they are told
//!   `Lost(LatchClosed)` before the node's delete is sent).
//! - A [`LeaderSelector`] is a mutex with Curator's `lock-` names and the participant id as node
//!   data, as Curator's `LeaderSelector` is, with Curator's `autoRequeue` loop around it: wait for
//!   leadership, lead, step down, queue again.
//!
//! # Two leaders never act at once
//! A leadership is a [`LockGuard`]. What the mutex proves for its holder holds for a leader
//! (`session/monitor.rs`, `engine/view.rs`): the next leader is elected only once the previous
//! leader's node is gone, and a leader whose session the ZooKeeper leader could expire is told
//! `Lost` before that can happen. [`LeaderSelector::run`] drops the leader's future as soon as the
//! leadership is `Lost` — before anyone else can be elected — re-checking it against the clock
//! before every poll, so a freeze cannot buy the leader one more step; so does any code that
//! races its work against [`LockGuard::lost`] polled first (`biased;`). What runs between two polls of that future (a blocking call)
//! cannot be stopped: fence what it writes with [`LockGuard::fenced_writer`] or the
//! [`fencing_token`](LockGuard::fencing_token), which grows with every leadership.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tracing::{info, info_span, warn, Instrument};

use crate::engine::driver::StandardDriver;
use crate::engine::naming::{Queue, MUTEX_LOCK_NAME};
use crate::error::{transient, Error, Result};
use crate::hold::guard::{FencingToken, LockGuard, LossSignal};
use crate::hold::holds::{Ended, Holds};
use crate::metrics::{LEADER_LATCH, LEADER_SELECTOR};
use crate::recipes::builder::LockBuilder;
use crate::recipes::mutex::{InterProcessMutex, Participant, MUTEX_DRIVER};
use crate::session::client::RecipeClient;
use crate::session::monitor::{check_runtime, LossHook};
use crate::state::LossReason;
use crate::sync::lock;

/// Curator's `LeaderLatch` lock name.
const LATCH_LOCK_NAME: &str = "latch-";
const LATCH_QUEUE: Queue = &[LATCH_LOCK_NAME];
static LATCH_DRIVER: StandardDriver = StandardDriver { queue: LATCH_QUEUE, kind: 0, max_leases: 1 };

/// Leader election on a lock path: Curator's `LeaderLatch`, node for node and with its
/// lifecycle — [`start`](Self::start) once, in the election until [`close`](Self::close).
///
/// While started, the latch keeps a node `_c_<uuid>-latch-<seq>` (data: the participant
/// [`id`](LeaderLatchBuilder::id)) in the queue; it leads while that node is the first. Each
/// leadership is a hold of the lock — the [`LockGuard`] that [`await_leadership`](Self::await_leadership)
/// returns — with its [`state`](LockGuard::state), [`lost`](LockGuard::lost) signal (told before
/// the next leader can be elected: see the README's *Leader election*), a
/// [`fencing_token`](LockGuard::fencing_token) that grows with every leadership, and a
/// [`fenced_writer`](LockGuard::fenced_writer) that writes only while it leads.
///
/// - **Stays in the election.** A lost leadership (expired session, stalled or lost connection,
///   node deleted) is followed by a new node at the end of the queue, by itself, as Curator's
///   `reset()`: on a [`ManagedClient`](crate::ManagedClient), on the new session once the client
///   has one — never from a node of an earlier session. Under
///   [`LossPolicy::SessionDeadline`](crate::LossPolicy::SessionDeadline) a brief disconnection is
///   `Suspended`, not a loss: the latch keeps its node and its leadership, as Curator 5.4+ does with
///   its session error policy. (Under the default policy, Curator's standard, the disconnection
///   costs the leadership and the node: the latch queues again at the end.)
/// - **On a plain `zookeeper_client::Client`** the latch cannot rejoin once the session expired:
///   it *stops* — a [`LatchEvent::Stopped`] with [`Error::SessionLost`], and `await_leadership`
///   fails with that error. Build a new client and a new latch, or use a `ManagedClient`.
/// - **Changes are reported** to every [`subscribe`](Self::subscribe)r, in order and none skipped
///   ([`LatchEvent`]: Curator's `isLeader` / `notLeader` listener calls), and
///   [`has_leadership`](Self::has_leadership) says whether it leads right now.
/// - **Waiting keeps the place.** [`await_leadership`](Self::await_leadership) (Curator's
///   `await()`) and [`await_leadership_timeout`](Self::await_leadership_timeout) (`await(timeout)`)
///   only watch the latch: giving up or cancelling them leaves its node where it is.
/// - **Leaving.** [`close`](Self::close) steps down and deletes the node (cancel safe: the delete
///   is sent before its first `.await`). Dropping the last clone of a started latch does the same in
///   the background: nothing stays queued for longer than that delete takes.
/// - Fair and herd-free: each participant watches only the one queued ahead of it.
///
/// The one-shot form, without `start`: [`acquire_once`](Self::acquire_once) joins, returns the
/// leadership once elected, and leaves with that guard's release. Asking a latch that already
/// leads to acquire is [`Error::AlreadyLeading`], never a wait behind its own node.
///
/// Cheap to clone (clones are the same latch), `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// let latch = zk_recipes::LeaderLatch::builder(&client, "/election/orders").id("host-a:4242").build()?;
/// latch.start()?; // joins the election; returns at once
/// loop {
///     let leadership = latch.await_leadership().await?; // waits until this participant leads
///     tokio::select! {
///         // Loss first: once leadership is known lost, the work gets no further poll.
///         biased;
///         reason = leadership.lost() => eprintln!("no longer the leader: {reason}; the latch rejoins by itself"),
///         _ = async { /* lead: schedule jobs, fenced by leadership.fencing_token() */ } => break,
///     }
/// }
/// latch.close().await?; // step down and leave the election
/// # Ok(())
/// # }
/// ```
pub struct LeaderLatch {
    /// Shared with the latch's task and its leadership's loss hook, which do not count as clones:
    /// the last clone's drop ends a started latch's election ([`Election::handles`]).
    election: Arc<Election>,
}

impl Clone for LeaderLatch {
    fn clone(&self) -> LeaderLatch {
        // As `Arc`'s own count: the clone is made from a live one, so the count cannot reach zero
        // meanwhile.
        self.election.handles.fetch_add(1, Ordering::Relaxed);
        LeaderLatch { election: self.election.clone() }
    }
}

impl std::fmt::Debug for LeaderLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderLatch")
            .field("path", &self.path())
            .field("phase", &lock(&self.election.state).phase)
            .field("has_leadership", &self.has_leadership())
            .finish_non_exhaustive()
    }
}

/// The latch, as its clones, its task and its leadership's loss hook share it.
struct Election {
    /// How many clones of the latch are alive. The last one's drop ends a started latch's
    /// election; the task and the hook, which hold the election but are no clones, cannot keep it
    /// going. A count here rather than a record the clones share: one allocation less per latch
    /// (issue 24).
    handles: AtomicUsize,
    /// The outcome of the latch's close once its work is done (`None` until then): every `close`
    /// call, the first, concurrent ones and those retried after a cancelled one, returns it.
    /// Made by the first `close` (a channel is 400 B, and most latches are never closed; issue 24).
    closed: OnceLock<Arc<watch::Sender<Option<Result<()>>>>>,
    lock: InterProcessMutex,
    state: Mutex<LatchState>,
    /// Notified after every change of `state` (wakes `await_leadership`). Inline: a `watch`
    /// channel here was a 344 B allocation per latch (issue 24).
    changed: Notify,
    /// The latch's task, behind a lock of its own: the leadership's loss hook starts the next
    /// task from whatever thread told the loss, possibly one holding `state`'s lock (see
    /// [`LossHook`]). Taken after `state`'s lock, never before it.
    task: Mutex<TaskSlot>,
}

/// A started latch's task — queueing, from its start or a lost leadership until the grant (none
/// runs while it leads: issue 24, a task per latch was 512 B) — and where it runs.
#[derive(Default)]
struct TaskSlot {
    /// The task queueing the latch, while one does: what `close` stops. The task takes its own
    /// handle out at the grant, before the hook that may start the next task is set, so a
    /// finished task's memory is freed at once and the next task's handle is never dropped.
    task: Option<JoinHandle<()>>,
    /// The runtime `start` ran on: a loss told on any thread (or none) queues the latch there.
    runtime: Option<Handle>,
    /// Set by `close` and by the last clone's drop, before their holds end: from then on no task
    /// starts (a hook told `Lost(LatchClosed)` by the close finds it set).
    stopped: bool,
}

struct LatchState {
    phase: Phase,
    /// The latch's own guard of its current leadership (a started latch's); what
    /// `await_leadership` hands out more guards of.
    leadership: Option<LockGuard>,
    listeners: Vec<mpsc::UnboundedSender<LatchEvent>>,
    /// One-shot acquires in flight (`acquire_once` and friends), each with what drops its attempt
    /// in its place: registered while the latch is latent, under this lock, so `close` (which
    /// closes the latch under it) cancels every one that may still send a create — also one whose
    /// future nobody polls.
    one_shots: Vec<(u64, Arc<dyn Fn() + Send + Sync>)>,
    next_one_shot: u64,
}

/// Curator's `LeaderLatch.State` (`LATENT`, `STARTED`, `CLOSED`), and stopped: started on a
/// session that ended for good.
#[derive(Clone, Debug)]
enum Phase {
    Latent,
    Started,
    /// Boxed: an error is 72 B, and a latch that never stops would carry it (issue 24).
    Stopped(Box<Error>),
    Closed,
}

impl LatchState {
    /// Tells every listener, forgetting those that went away.
    fn emit(&mut self, event: &LatchEvent) {
        self.listeners.retain(|listener| listener.send(event.clone()).is_ok());
    }
}

impl Election {
    /// Changes the state under its lock, then wakes whoever awaits a change.
    fn update<T>(&self, change: impl FnOnce(&mut LatchState) -> T) -> T {
        let output = change(&mut lock(&self.state));
        self.changed.notify_waiters();
        output
    }

    /// Starts the latch's task running `work` on the runtime it was started on, unless it was
    /// stopped ([`stop_task`](Self::stop_task)) or never started.
    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let mut slot = lock(&self.task);
        if slot.stopped {
            return;
        }
        let Some(runtime) = slot.runtime.as_ref() else { return };
        let span = info_span!("leader_latch", election = %self.lock.path());
        slot.task = Some(runtime.spawn(work.instrument(span)));
    }

    /// Stops the latch's task for good: the running one is aborted (returned, for its end to be
    /// awaited: a queued node's delete is sent once its future is dropped), and none starts from
    /// now on.
    fn stop_task(&self) -> Option<JoinHandle<()>> {
        let mut slot = lock(&self.task);
        slot.stopped = true;
        let task = slot.task.take();
        if let Some(task) = &task {
            task.abort();
        }
        task
    }
}

/// A started latch's leadership was lost: it queues again, on a task of its own (Curator's
/// `reset()`). Nothing waits for the loss: the session tells it (issue 24).
impl LossHook for Election {
    fn lost(self: Arc<Self>, reason: LossReason) {
        let election = self.clone();
        self.spawn(rejoin(election, reason));
    }
}

/// A change of a [`LeaderLatch`]'s leadership, as [`LeaderLatch::subscribe`] reports it: Curator's
/// `LeaderLatchListener` calls (`isLeader`, `notLeader`), and the end of a latch that cannot
/// rejoin.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum LatchEvent {
    /// This latch leads (Curator's `isLeader()`): a new leadership, a new hold.
    Elected {
        /// The leadership's fencing token (larger than every earlier leader's).
        fencing_token: FencingToken,
        /// Full path of the latch's node.
        lock_path: String,
        /// The leadership's loss signal: resolves when it is lost, before anyone else can be
        /// elected (it keeps no node; [`LeaderLatch::await_leadership`] gives the full guard).
        loss: LossSignal,
    },
    /// The leadership ended (Curator's `notLeader()`): lost for `reason`, or
    /// [`LossReason::LatchClosed`] when the latch was closed. A started latch queues again by
    /// itself after a loss.
    NotLeader {
        /// Why.
        reason: LossReason,
    },
    /// The latch left the election for good and cannot rejoin: its plain client's session ended
    /// ([`Error::SessionLost`]), its `ManagedClient` was closed ([`Error::Closed`]) or gave up, or
    /// the server refuses its node (an ACL). The last event.
    Stopped {
        /// Why; also what [`LeaderLatch::await_leadership`] returns from now on.
        error: Error,
    },
}

/// The leadership changes of a [`LeaderLatch`], in order: see [`LeaderLatch::subscribe`].
#[derive(Debug)]
pub struct LatchEvents {
    events: mpsc::UnboundedReceiver<LatchEvent>,
}

impl LatchEvents {
    /// The next change; `None` once the latch is closed, stopped or dropped and every earlier
    /// event was taken. Cancel safe (no event is lost).
    pub async fn next(&mut self) -> Option<LatchEvent> {
        self.events.recv().await
    }

    /// The next change if one is waiting, without waiting.
    pub fn try_next(&mut self) -> Option<LatchEvent> {
        self.events.try_recv().ok()
    }
}

/// Builds a [`LeaderLatch`] with options: the participant [`id`](Self::id), and every option of
/// [`MutexBuilder`](crate::MutexBuilder) (loss policy, ACLs, request size limit, minimum session
/// timeout); see [`LeaderLatch::builder`].
pub type LeaderLatchBuilder = LockBuilder<LeaderLatch>;

impl LockBuilder<LeaderLatch> {
    /// The participant id, stored in the latch's node (UTF-8, as Curator stores its id): what
    /// [`LeaderLatch::leader`] and Curator's `getLeader().getId()` show. Default: empty.
    pub fn id(self, id: impl Into<String>) -> LeaderLatchBuilder {
        self.node_data(id.into().into_bytes())
    }

    /// Validates the path and the sizes (as [`MutexBuilder::build`](crate::MutexBuilder::build))
    /// and builds the latch, not started. Nothing is sent to ZooKeeper until
    /// [`start`](LeaderLatch::start) (or a one-shot acquire).
    ///
    /// # Errors
    /// As [`MutexBuilder::build`](crate::MutexBuilder::build).
    pub fn build(self) -> Result<LeaderLatch> {
        let internals = Arc::new(self.internals(LATCH_LOCK_NAME)?);
        let lock = InterProcessMutex::of_kind(internals, Holds::new(LEADER_LATCH), &LATCH_DRIVER, None);
        let state = LatchState {
            phase: Phase::Latent,
            leadership: None,
            listeners: Vec::new(),
            one_shots: Vec::new(),
            next_one_shot: 0,
        };
        let election = Arc::new(Election {
            handles: AtomicUsize::new(1),
            closed: OnceLock::new(),
            lock,
            state: Mutex::new(state),
            changed: Notify::new(),
            task: Mutex::new(TaskSlot::default()),
        });
        Ok(LeaderLatch { election })
    }
}

impl LeaderLatch {
    /// A latch on the election path `path` (absolute, relative to the client's chroot if any),
    /// with an empty participant id.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it
    /// is too long for the server.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<LeaderLatch> {
        Self::builder(client, path).build()
    }

    /// A builder for a latch with options (the participant [`id`](LeaderLatchBuilder::id) first
    /// of all).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> LeaderLatchBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The election path.
    pub fn path(&self) -> &str {
        self.lock().path()
    }

    fn lock(&self) -> &InterProcessMutex {
        &self.election.lock
    }

    fn state_error(&self, reason: &'static str) -> Error {
        Error::LatchState { path: self.path().to_owned(), reason }
    }

    /// Joins the election (Curator's `start()`): returns at once; a task of the latch, on the
    /// current runtime, queues its node, and from then on the latch stays in the election — after
    /// each lost leadership a task queues a new node at the end, on a `ManagedClient`'s new
    /// session after an expiry — until [`close`](Self::close) or the last clone is dropped. Watch it with
    /// [`await_leadership`](Self::await_leadership), [`subscribe`](Self::subscribe) and
    /// [`has_leadership`](Self::has_leadership).
    ///
    /// # Errors
    /// [`Error::LatchState`] if the latch was started before (a latch starts once, as Curator's),
    /// or while a one-shot leadership of it ([`acquire_once`](Self::acquire_once)) is held;
    /// [`Error::Runtime`] outside a tokio runtime with timers.
    pub fn start(&self) -> Result<()> {
        check_runtime()?;
        let election = &self.election;
        let started = election.update(|state| {
            if !matches!(state.phase, Phase::Latent) {
                return Err(self.state_error("a LeaderLatch is started once (as Curator's); build a new one"));
            }
            if election.lock.is_acquired_in_this_process() {
                return Err(self.state_error("a one-shot leadership of this latch is still held; release it first"));
            }
            state.phase = Phase::Started;
            lock(&election.task).runtime = Some(Handle::current());
            election.spawn(elect(election.clone()));
            Ok(())
        });
        if started.is_ok() {
            info!(election = self.path(), "leader latch started");
        }
        started
    }

    /// Waits until this started latch leads (Curator's `await()`), and returns a guard of the
    /// leadership: at once if it leads now. The guard is one more guard of the latch's hold:
    /// dropping or releasing it does not step down (the latch leads until the leadership is lost
    /// or the latch is closed; [`close`](Self::close) tells it `Lost(LatchClosed)`).
    ///
    /// Cancel safe, and waiting keeps the latch's place in the queue: the latch's own task holds
    /// the node, this future only watches.
    ///
    /// # Errors
    /// [`Error::LatchState`] if the latch is not started or is closed (also when it is closed
    /// while waiting); the error that stopped it ([`Error::SessionLost`] for a plain client's
    /// expired session, see [`LatchEvent::Stopped`]).
    pub async fn await_leadership(&self) -> Result<LockGuard> {
        let election = &self.election;
        loop {
            // Registered before the state is read: a change in between wakes it (`update` notifies
            // after changing the state).
            let changed = election.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let state = lock(&election.state);
                match &state.phase {
                    Phase::Latent => return Err(self.state_error("not started: call start() first")),
                    Phase::Closed => return Err(self.state_error("closed: it left the election")),
                    Phase::Stopped(err) => return Err((**err).clone()),
                    Phase::Started => {},
                }
                // `None` once the leadership is lost, before the task takes it away.
                if let Some(leadership) = state.leadership.as_ref().and_then(LockGuard::another) {
                    return Ok(leadership);
                }
            }
            changed.await;
        }
    }

    /// Waits at most `timeout` for leadership (Curator's `await(timeout)`); `Ok(None)` if this
    /// latch does not lead by then. The latch stays in the election, in its place.
    ///
    /// Cancel safe, like [`await_leadership`](Self::await_leadership).
    ///
    /// # Errors
    /// As [`await_leadership`](Self::await_leadership); [`Error::Runtime`] on a runtime without
    /// timers.
    pub async fn await_leadership_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        check_runtime()?;
        match tokio::time::timeout(timeout, self.await_leadership()).await {
            Ok(leadership) => leadership.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The latch's leadership changes from now on, in order, none skipped (a channel per
    /// subscriber: drop it to unsubscribe). Starts with [`LatchEvent::Elected`] if the latch leads
    /// now; ends (`None`) when the latch is closed or dropped, after [`LatchEvent::Stopped`] when
    /// it stops. Reports a started latch's leaderships only (not one-shot acquires).
    pub fn subscribe(&self) -> LatchEvents {
        let (sender, events) = mpsc::unbounded_channel();
        let mut state = lock(&self.election.state);
        match &state.phase {
            Phase::Latent | Phase::Started => {
                if let Some(leadership) = &state.leadership {
                    let _ = sender.send(elected(leadership));
                }
                state.listeners.push(sender);
            },
            Phase::Stopped(error) => {
                let _ = sender.send(LatchEvent::Stopped { error: (**error).clone() });
            },
            Phase::Closed => {},
        }
        LatchEvents { events }
    }

    /// Leaves the election (Curator's `close()`): steps down if leading — every guard of the
    /// leadership still alive reads `Lost(LatchClosed)` *before* the node's delete is sent —,
    /// stops the latch's task (a queued node's delete is sent too), tells subscribers
    /// `NotLeader(LatchClosed)` and ends their streams, and returns once ZooKeeper confirmed the
    /// deletes. A closed latch stays closed: [`start`](Self::start) fails. Closing a latch that
    /// is not started ends its one-shot leadership, if any, and makes a one-shot acquire still
    /// waiting fail with [`Error::LatchState`], its node deleted before `close` returns. Every
    /// call — concurrent ones, and one retried after a cancelled or timed-out `close` — returns
    /// the outcome of the same work, once it is done.
    ///
    /// Cancel safe: everything that leaves the election happens before the first `.await`, and
    /// the confirmation runs on a task of its own: a dropped `close` only stops waiting for it
    /// (the deletes go on in the background, retried until the nodes are gone or the session is
    /// dead), and the next `close` waits for it again. Polled outside any tokio runtime, `close`
    /// runs that task on the runtime the session remembered (the one current when its first
    /// recipe was built, else at its first acquire): if that runtime has shut down, `close`
    /// returns [`Error::LatchState`]; if it is alive but no longer driven, `close` does not
    /// return.
    ///
    /// # Errors
    /// As [`LockGuard::release`] for the delete of the leadership's node, and the errors of a
    /// listing of the election path ([`Error::ZooKeeper`], [`Error::NoAuth`]) with which the delete
    /// of a queued node is confirmed. A dead session is no error: its nodes are gone with it.
    pub async fn close(&self) -> Result<()> {
        let closed = self.election.closed.get_or_init(|| Arc::new(watch::Sender::new(None)));
        let mut outcome = closed.subscribe();
        let election = &self.election;
        let first = election.update(|state| {
            if matches!(std::mem::replace(&mut state.phase, Phase::Closed), Phase::Closed) {
                return None;
            }
            if state.leadership.is_some() {
                state.emit(&LatchEvent::NotLeader { reason: LossReason::LatchClosed });
            }
            state.listeners.clear();
            // One-shot acquires start only while latent, registered under this lock: these are
            // all that may still send a create.
            let one_shots: Vec<_> = state.one_shots.drain(..).map(|(_, cancel)| cancel).collect();
            Some((state.leadership.take(), one_shots))
        });
        if let Some((leadership, one_shots)) = first {
            // Each one-shot's attempt is dropped here (its node's delete starts), or, if it is
            // being polled right now, it ends first (a grant during the close given back).
            for cancel in one_shots {
                cancel();
            }
            // Before the holds end: their hooks, told `Lost(LatchClosed)`, start no task.
            let task = election.stop_task();
            if lock(&election.task).runtime.is_some() {
                info!(election = self.path(), "leader latch closed");
            }
            // Every hold of the latch ends now, guards handed out or not; their deletes are sent.
            let ended = election.lock.holds().end_all(LossReason::LatchClosed);
            drop(leadership);
            let work = Outcome { closed: closed.clone(), path: self.path().to_owned(), result: None };
            let confirm = confirm_close(election.clone(), task, ended, work);
            // On a task, also when `close` is polled outside any runtime (the one the session
            // remembered): a dropped `close` must not drop the work the next one waits for.
            // (Polled outside any runtime, `close` returns once that runtime ran it: a runtime
            // no longer driven never does. A known limit, in the method's docs: reviews R and S.)
            match election.lock.runtime() {
                Some(runtime) => drop(runtime.spawn(confirm)),
                None => confirm.await,
            }
        }
        let result = match outcome.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or(Ok(())),
            Err(_) => Err(self.state_error("closed, but its close did not finish")),
        };
        result
    }

    /// One-shot election, without [`start`](Self::start): joins the election and waits until this
    /// participant leads; the guard is the leadership, and releasing (or dropping) it steps down
    /// and leaves the election. Keeps waiting across disconnections; on a `ManagedClient`, across
    /// session expiries (queued again on the new session). A leadership lost is not rejoined:
    /// call again, or use `start`.
    ///
    /// Cancel safe: dropping the future leaves the election (its node is deleted in the
    /// background, retried until it is gone or the session is dead).
    ///
    /// # Errors
    /// [`Error::AlreadyLeading`] if this latch (or a clone) leads now: the acquire would wait
    /// behind its own node. [`Error::LatchState`] on a started or closed latch. Otherwise as
    /// [`InterProcessMutex::acquire`].
    pub async fn acquire_once(&self) -> Result<LockGuard> {
        let lock = self.lock().clone();
        self.one_shot(async move { lock.acquire().await }).await
    }

    /// One-shot: leads if nobody else leads or waits ahead right now; `Ok(None)` otherwise (and
    /// while the connection is down), leaving the election at once.
    ///
    /// # Errors
    /// As [`acquire_once`](Self::acquire_once) and [`InterProcessMutex::try_acquire`].
    pub async fn try_acquire_once(&self) -> Result<Option<LockGuard>> {
        let lock = self.lock().clone();
        self.one_shot(async move { lock.try_acquire().await }).await
    }

    /// One-shot: waits at most `timeout` for leadership; `Ok(None)` if not elected in time (the
    /// election is then left — a started latch's [`await_leadership_timeout`](Self::await_leadership_timeout)
    /// keeps its place instead).
    ///
    /// # Errors
    /// As [`acquire_once`](Self::acquire_once) and [`InterProcessMutex::acquire_timeout`].
    pub async fn acquire_once_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let lock = self.lock().clone();
        self.one_shot(async move { lock.acquire_timeout(timeout).await }).await
    }

    /// Runs a one-shot acquire on a latent latch that does not lead. Its attempt lives in a slot
    /// that `close` can empty in its place (dropping the attempt deletes its node), so a close
    /// never waits for this future to be polled; polled after that, it fails.
    async fn one_shot<L: Leadership + Send + 'static>(
        &self,
        acquire: impl Future<Output = Result<L>> + Send + 'static,
    ) -> Result<L> {
        let election = &self.election;
        let slot = Arc::new(Mutex::new(OneShotSlot::<L> { attempt: Some(Box::pin(acquire)), waker: None }));
        let _registered = {
            let mut state = lock(&election.state);
            match state.phase {
                Phase::Latent => {},
                Phase::Started | Phase::Stopped(_) => {
                    return Err(self.state_error("started: it is in the election until close(); use await_leadership()"))
                },
                Phase::Closed => return Err(self.state_error("closed: it left the election")),
            }
            if self.has_leadership() {
                return Err(Error::AlreadyLeading { path: self.path().to_owned() });
            }
            // Registered while latent, under the lock `close` takes to close the latch.
            let id = state.next_one_shot;
            state.next_one_shot += 1;
            let cancel = {
                let slot = slot.clone();
                Arc::new(move || {
                    let (attempt, waker) = {
                        let mut slot = lock(&slot);
                        (slot.attempt.take(), slot.waker.take())
                    };
                    drop(attempt);
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }) as Arc<dyn Fn() + Send + Sync>
            };
            state.one_shots.push((id, cancel));
            OneShot { election, id }
        };
        let ended = std::future::poll_fn(|cx| {
            // Held while the attempt is polled and its outcome settled: a `close` cancelling it
            // waits for that.
            let mut slot = lock(&slot);
            let Some(attempt) = slot.attempt.as_mut() else {
                return Poll::Ready(None); // cancelled by `close`
            };
            match attempt.as_mut().poll(cx) {
                Poll::Pending => {
                    slot.waker = Some(cx.waker().clone());
                    Poll::Pending
                },
                Poll::Ready(result) => {
                    slot.attempt = None;
                    Poll::Ready(Some(result.and_then(|leadership| {
                        if matches!(lock(&election.state).phase, Phase::Closed) {
                            // Granted while closing: given back (the delete is sent as the guard
                            // drops, before `close` is done cancelling this acquire).
                            drop(leadership);
                            return Err(self.state_error("closed: it left the election"));
                        }
                        Ok(leadership)
                    })))
                },
            }
        })
        .await;
        let leadership = ended.unwrap_or_else(|| Err(self.state_error("closed: it left the election")))?;
        if let Some(leadership) = leadership.guard() {
            info!(election = self.path(), node = leadership.lock_path(), fencing_token = %leadership.fencing_token(), "leadership taken");
        }
        Ok(leadership)
    }

    /// Whether this process leads through this latch (or a clone) right now: a leadership is
    /// held and not [`Lost`](crate::LockState::Lost) (re-evaluated now, so a lost leadership
    /// says `false` from the moment it is lost, also while a guard of it is still held).
    pub fn has_leadership(&self) -> bool {
        self.lock().holds().any_not_lost()
    }

    /// The current leader: the first participant in the queue, with its id
    /// ([`Participant::id`]), session and node; `None` if nobody is in the election.
    ///
    /// # Errors
    /// As [`participants`](Self::participants).
    pub async fn leader(&self) -> Result<Option<Participant>> {
        leader_of(self.lock()).await
    }

    /// Every participant in queue order, the leader first.
    ///
    /// # Errors
    /// As [`InterProcessMutex::participants`].
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.lock().participants().await
    }
}

impl Drop for LeaderLatch {
    /// The last clone of the latch is gone: a started latch leaves the election in the background
    /// (its task is stopped, which deletes a queued node; its leadership's node is deleted), and
    /// its subscribers are told `NotLeader(LatchClosed)` if it led, as by `close`.
    fn drop(&mut self) {
        // As `Arc`'s own count: the last clone sees every other clone's drop before it ends the
        // election.
        if self.election.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let (leadership, started) = {
            let mut state = lock(&self.election.state);
            let started = matches!(state.phase, Phase::Started);
            if started {
                state.phase = Phase::Closed;
                if state.leadership.is_some() {
                    state.emit(&LatchEvent::NotLeader { reason: LossReason::LatchClosed });
                }
            }
            state.listeners.clear();
            (state.leadership.take(), started)
        };
        // Before the holds end: their hooks, told `Lost(LatchClosed)`, start no task.
        drop(self.election.stop_task());
        if started {
            drop(self.election.lock.holds().end_all(LossReason::LatchClosed));
        }
        drop(leadership);
    }
}

/// A one-shot acquire in flight, registered in `LatchState::one_shots` until it ends.
struct OneShot<'a> {
    election: &'a Election,
    id: u64,
}

impl Drop for OneShot<'_> {
    fn drop(&mut self) {
        lock(&self.election.state).one_shots.retain(|(id, _)| *id != self.id);
    }
}

/// A one-shot acquire's attempt (`None` once it ended or `close` dropped it), and the waker of
/// the task awaiting it, which `close` wakes.
struct OneShotSlot<L> {
    attempt: Option<Pin<Box<dyn Future<Output = Result<L>> + Send>>>,
    waker: Option<std::task::Waker>,
}

/// What a one-shot acquire returns: a guard, or maybe one.
trait Leadership {
    fn guard(&self) -> Option<&LockGuard>;
}

impl Leadership for LockGuard {
    fn guard(&self) -> Option<&LockGuard> {
        Some(self)
    }
}

impl Leadership for Option<LockGuard> {
    fn guard(&self) -> Option<&LockGuard> {
        self.as_ref()
    }
}

/// The outcome of a latch's close, published to every `close` call when this is dropped (also
/// when the task confirming it is dropped unfinished, with the runtime: then an error).
struct Outcome {
    closed: Arc<watch::Sender<Option<Result<()>>>>,
    path: String,
    result: Option<Result<()>>,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let result = self.result.take().unwrap_or_else(|| {
            Err(Error::LatchState {
                path: std::mem::take(&mut self.path),
                reason: "closed, but its close was stopped before it finished",
            })
        });
        self.closed.send_replace(Some(result));
    }
}

/// The part of a latch's close that waits: its task's end and the deletes of its holds; then
/// every background deletion on the session, and a round trip.
async fn confirm_close(election: Arc<Election>, task: Option<JoinHandle<()>>, ended: Ended, mut outcome: Outcome) {
    if let Some(task) = task {
        // Once the task's future is dropped, a queued node's delete has been sent.
        let _ = task.await;
    }
    let mut result = ended.confirmed().await;
    if result.is_ok() {
        // Every attempt of the latch is over: the task's (also one that queued once more while
        // `close` ran, polled on another thread before the abort took effect), the one-shots'
        // (cancelled above), and those that ended before (a timed-out or dropped one-shot, a
        // guard dropped). Their nodes are deleted in the background, by GUID or by path, each
        // retried until it is gone or the session is dead: the round trip waits for all of
        // them (`settled`), then lists.
        result = match election.lock.round_trip().await {
            Ok(()) | Err(Error::SessionLost { .. } | Error::Closed { .. }) => Ok(()),
            Err(err) => Err(err),
        };
    }
    outcome.result = Some(result);
}

/// The event of a leadership taken.
fn elected(leadership: &LockGuard) -> LatchEvent {
    LatchEvent::Elected {
        fencing_token: leadership.fencing_token(),
        lock_path: leadership.lock_path().to_owned(),
        loss: leadership.loss_signal(),
    }
}

/// A started latch's task: queues, then hands the leadership over and ends (Curator's `start()`,
/// and `reset()` after a loss: see [`rejoin`]).
///
/// The task lives only while the latch queues, so the acquire's state lives in it, not in a box
/// of its own: what a burst of latches allocates while they queue is freed as whole tasks at the
/// grant, and nothing of the latch's is allocated then (issue 24: a latch's resident memory in a
/// burst).
async fn elect(election: Arc<Election>) {
    match queue(&election).await {
        Some(leadership) => hand_over(&election, leadership),
        // Closed (`close` has taken the handle, or takes nothing), or stopped: no node of this
        // task's is left, and no hook was set.
        None => drop(lock(&election.task).task.take()),
    }
}

/// Queues the latch's node and waits for its turn; `None` once the latch is closed, or stopped by
/// an error no retry can fix.
///
/// Holds the [`Election`], never the latch: the latch's last clone going stops the task (aborted
/// at its next `.await`; dropping the acquire in progress deletes its node, as any cancelled
/// acquire).
async fn queue(election: &Election) -> Option<LockGuard> {
    loop {
        if !matches!(lock(&election.state).phase, Phase::Started) {
            return None; // closed: `close` aborts this task too, but may run while it is being polled
        }
        match election.lock.acquire().await {
            Ok(leadership) => return Some(leadership),
            Err(err) if retry_may_fix(&err) => {
                warn!(election = election.lock.path(), %err, "leader latch: acquire failed; queueing again");
                tokio::time::sleep(RETRY_PAUSE).await;
            },
            Err(error) => {
                warn!(election = election.lock.path(), %error, "leader latch stopped: it cannot rejoin the election");
                election.update(|state| {
                    if matches!(state.phase, Phase::Started) {
                        state.phase = Phase::Stopped(Box::new(error.clone()));
                    }
                    state.emit(&LatchEvent::Stopped { error });
                    state.listeners.clear();
                });
                return None;
            },
        }
    }
}

/// A started latch's leadership was lost (its hook, [`Election`]'s [`LossHook`]): tell the
/// subscribers, let the guard go, and queue again at the end (Curator's `reset()`).
async fn rejoin(election: Arc<Election>, reason: LossReason) {
    let lost = election.update(|state| {
        if !matches!(state.phase, Phase::Started) {
            return None; // closed (which told `NotLeader` and took the guard) or stopped
        }
        // The hook is set on the leadership in `state` only, and told once, so this is it.
        let lost = state.leadership.take()?;
        state.emit(&LatchEvent::NotLeader { reason });
        Some(lost)
    });
    let Some(lost) = lost else {
        drop(lock(&election.task).task.take());
        return;
    };
    warn!(election = election.lock.path(), %reason, "leadership lost; queueing again");
    // Its node is gone or going (deleted with the loss, or the session); released here all the
    // same, which deletes it if it is still there (a monitor stopped with its runtime).
    drop(lost);
    elect(election).await;
}

/// Hands a started latch's new `leadership` to its state, tells its subscribers, and sets the
/// leadership's loss hook ([`rejoin`]), unless the latch was closed while the grant came in (then
/// the leadership is dropped: stepped down). Called by the latch's task, which ends with it.
fn hand_over(election: &Arc<Election>, leadership: LockGuard) {
    info!(election = election.lock.path(), node = leadership.lock_path(), fencing_token = %leadership.fencing_token(), "leadership taken");
    let event = elected(&leadership);
    // This task's handle goes first (freeing the task as soon as it ends): once the hook is set
    // below, a loss may start the next task at once, whose handle must stay. (A `close` that took
    // it already has aborted this task: it ends at its next `.await`, and there is none.)
    drop(lock(&election.task).task.take());
    let hook = Arc::downgrade(election) as Weak<dyn LossHook>;
    let lost_already = election.update(|state| {
        if !matches!(state.phase, Phase::Started) {
            // Closed while the grant came in: step down at once (dropped with the closure's
            // output, outside the lock).
            return Err(leadership);
        }
        state.emit(&event);
        let lost = leadership.on_lost(hook);
        state.leadership = Some(leadership);
        Ok(lost)
    });
    match lost_already {
        // Lost before the hook was set (told, so it would never be called): queue again now.
        Ok(Some(reason)) => election.clone().lost(reason),
        Ok(None) => {},
        Err(stepped_down) => drop(stepped_down),
    }
}

/// Runs a leader again and again: Curator's `LeaderSelector` with `autoRequeue`.
///
/// [`run`](Self::run) waits for leadership, runs the leader's closure with the leadership (a
/// [`LockGuard`]) by value, steps down when its future completes, and queues again. The
/// closure's future is **dropped as soon as the leadership is `Lost`** — before the next leader
/// can be elected (the session monitor's bound; see the README's *Leader election*) — so a
/// leader that only acts inside that future never acts beside the next one. Code that blocks
/// the thread cannot be interrupted: fence its effects with the leadership's fencing token.
///
/// Nodes are a mutex's, `_c_<uuid>-lock-<seq>` holding the participant id: Curator's
/// `LeaderSelector` on the same path is a peer.
///
/// Cheap to clone, `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// let selector = zk_recipes::LeaderSelector::builder(&client, "/election/scheduler").id("host-a").build()?;
/// selector
///     .run(|leadership| async move {
///         // Lead until done; dropped at once if the leadership is lost.
///         println!("leading with fencing token {}", leadership.fencing_token());
///         tokio::time::sleep(std::time::Duration::from_secs(30)).await;
///     }) // returns, and queues again, when the closure's future completes
///     .await?; // never Ok: it ends only with an error no retry can fix
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LeaderSelector {
    lock: InterProcessMutex,
}

/// Builds a [`LeaderSelector`] with options: the participant [`id`](Self::id), and every option
/// of [`MutexBuilder`](crate::MutexBuilder); see [`LeaderSelector::builder`].
pub type LeaderSelectorBuilder = LockBuilder<LeaderSelector>;

impl LockBuilder<LeaderSelector> {
    /// The participant id, stored in the selector's node (UTF-8, as Curator's `LeaderSelector`
    /// stores its id). Default: empty.
    pub fn id(self, id: impl Into<String>) -> LeaderSelectorBuilder {
        self.node_data(id.into().into_bytes())
    }

    /// Validates the path and the sizes (as [`MutexBuilder::build`](crate::MutexBuilder::build))
    /// and builds the selector. Nothing is sent to ZooKeeper until `run`.
    ///
    /// # Errors
    /// As [`MutexBuilder::build`](crate::MutexBuilder::build).
    pub fn build(self) -> Result<LeaderSelector> {
        let internals = Arc::new(self.internals(MUTEX_LOCK_NAME)?);
        Ok(LeaderSelector {
            lock: InterProcessMutex::of_kind(internals, Holds::new(LEADER_SELECTOR), &MUTEX_DRIVER, None),
        })
    }
}

/// The pause before queueing again after an error a retry may fix.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

impl LeaderSelector {
    /// A selector on the election path `path`, with an empty participant id.
    ///
    /// # Errors
    /// [`Error::InvalidPath`] if `path` is not a valid ZooKeeper path, [`Error::TooLarge`] if it
    /// is too long for the server.
    pub fn new(client: impl Into<RecipeClient>, path: impl Into<String>) -> Result<LeaderSelector> {
        Self::builder(client, path).build()
    }

    /// A builder for a selector with options (the participant id first of all).
    pub fn builder(client: impl Into<RecipeClient>, path: impl Into<String>) -> LeaderSelectorBuilder {
        LockBuilder::new(client.into(), path.into())
    }

    /// The election path.
    pub fn path(&self) -> &str {
        self.lock.path()
    }

    /// Leads whenever elected, for ever: waits for leadership, runs `lead(leadership)`, steps
    /// down when its future completes, and queues again. The leadership lasts exactly as long as
    /// that future (a guard the closure keeps beyond it keeps it longer; one it drops early does
    /// not end it). The future is dropped at once when the leadership is lost, and the selector
    /// queues again too. `lead` is called, and its future polled, only while the leadership is
    /// not known lost (checked against the clock before each poll): a leadership lost before the
    /// closure runs is never given to it.
    ///
    /// Never returns by itself: drop the future to leave the election (cancel safe — a queued
    /// node is deleted in the background, a leadership held by the dropped closure is released).
    /// Errors a retry may fix (a failed request) are logged and retried after a pause.
    ///
    /// A closure whose future completes at once steps down at once: the selector queues again
    /// right away (two requests a turn), as Curator's does.
    ///
    /// # Errors
    /// Only what no retry can fix: [`Error::ChrootMissing`], [`Error::EphemeralParent`],
    /// [`Error::NoAuth`], [`Error::Runtime`], [`Error::Closed`], [`Error::ZooKeeper`] for a
    /// request the server refused (an invalid ACL, say), and [`Error::SessionLost`] when the client
    /// will have no new session (a plain client's expired session, a managed client that gave
    /// up). Failed requests whose outcome is unknown, and throttling, are retried.
    pub async fn run<F, Fut>(&self, mut lead: F) -> Result<Infallible>
    where
        F: FnMut(LockGuard) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let leadership = match self.lock.acquire().await {
                Ok(leadership) => leadership,
                Err(err) if retry_may_fix(&err) => {
                    warn!(election = self.path(), %err, "leader selector: acquire failed; queueing again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                },
                Err(err) => return Err(err),
            };
            let signal = leadership.loss_signal();
            // The leadership lasts as long as the leader's future, whatever the closure does with
            // its guard (`|_leadership| async { .. }` drops it at once).
            let kept = leadership.another();
            let (node, token) = (leadership.lock_path().to_owned(), leadership.fencing_token());
            info!(election = self.path(), node, fencing_token = %token, "leadership taken");
            let stepped_down = {
                // The closure is called inside the first checked poll, so even its synchronous
                // prelude runs only while the leadership is not known lost.
                let mut leadership = Some(leadership);
                let mut leading = std::pin::pin!(None::<Fut>);
                let lost = signal.lost();
                tokio::pin!(lost);
                // Loss wins a race with work: the leader's future is polled only while the leadership
                // is not known lost, checked anew before *every* poll. Polling `lost()` first
                // (`biased`) is not enough: it is woken by the session monitor, which re-evaluates the
                // loss deadline on its own timer. After a freeze (SIGSTOP, a long GC pause, a blocked
                // runtime thread) the leader's timer and the monitor's fire together, and the task
                // polled first wins: were it this one, the loss would not have been told yet and the
                // leader would run one more step after its loss deadline — possibly beside the next
                // leader. `reason()` re-evaluates the hold against the clock now (the deadline passed
                // is a loss at once), so the future is dropped before that step.
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                        return Poll::Ready(Err(reason));
                    }
                    if let Some(reason) = signal.reason() {
                        return Poll::Ready(Err(reason));
                    }
                    if let Some(leadership) = leadership.take() {
                        leading.set(Some(lead(leadership)));
                    }
                    match leading.as_mut().as_pin_mut() {
                        Some(leading) => leading.poll(cx).map(Ok),
                        None => Poll::Pending, // unreachable: set just above on the first poll
                    }
                })
                .await
                // The leader's future is dropped here, before its guard below.
            };
            match stepped_down {
                Ok(()) => info!(election = self.path(), node, "stepped down"),
                Err(reason) => {
                    warn!(election = self.path(), node, %reason, "leadership lost; the leader's future is dropped")
                },
            }
            drop(kept);
        }
    }

    /// Whether this process leads through this selector right now (see
    /// [`LeaderLatch::has_leadership`]).
    pub fn has_leadership(&self) -> bool {
        self.lock.holds().any_not_lost()
    }

    /// The current leader (see [`LeaderLatch::leader`]).
    ///
    /// # Errors
    /// As [`participants`](Self::participants).
    pub async fn leader(&self) -> Result<Option<Participant>> {
        leader_of(&self.lock).await
    }

    /// Every participant in queue order, the leader first.
    ///
    /// # Errors
    /// As [`InterProcessMutex::participants`].
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.lock.participants().await
    }
}

async fn leader_of(lock: &InterProcessMutex) -> Result<Option<Participant>> {
    Ok(lock.participants().await?.into_iter().find(|participant| participant.is_holder))
}

/// Whether an acquire that failed with `err` may succeed if tried again: a request whose outcome
/// is unknown or that the server throttled, or our node deleted under us again and again — not a
/// refusal (an invalid ACL, bad arguments), which would fail the same way for ever.
fn retry_may_fix(err: &Error) -> bool {
    match err {
        Error::ZooKeeper { source, .. } => transient(source),
        Error::LockNodeDeleted { .. } => true,
        // Granted, and lost before the acquire returned: a lease that ran out between the grant
        // and the lease's start (a lease shorter than a preemption; review AE), the node deleted
        // meanwhile. A leadership lost like any other: queue again (a plain client's ended
        // session then fails the next acquire with `SessionLost`).
        Error::LockLost { .. } => true,
        // The directory is deleted by the server once empty (a container): a fresh counter.
        Error::SequenceWrapped { .. } => true,
        _ => false,
    }
}
