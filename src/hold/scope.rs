//! Lock scopes: where an acquire re-enters a hold instead of queueing (Curator's re-entrancy,
//! made sound for async tasks). Shared by every recipe: a lock kind is identified by its
//! [`Holds`] table.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use crate::hold::holds::{Hold, Holds};
use crate::sync::{lock, Record};

tokio::task_local! {
    /// The lock scopes the current future runs in (innermost last); see [`Scope`] for who may
    /// re-enter them.
    static LOCK_SCOPES: Vec<Scope>;
}

/// One lock scope of [`InterProcessMutex::with_lock`](crate::InterProcessMutex::with_lock): which lock, which hold, and which tokio
/// task is polling the scope's future.
///
/// # Who may re-enter a scope
/// The rule: an acquire of the scope's lock re-enters the scope's hold only if it sees the scope
/// in `LOCK_SCOPES` **and** the current tokio task (`tokio::task::try_id()`) is the one recorded as
/// polling the scope's future (`owner`). The invariant this keeps:
///
/// > Every re-entering acquire is part of the scope's own future — code it runs, awaits, joins or
/// > selects while it is being polled — and never another task.
///
/// 1. `LOCK_SCOPES` is a task-local: tokio sets it (on this thread) only while the scope's future
///    is polled or dropped, so an acquire that sees the scope runs inside that poll. Besides the
///    scope's own future, that can be a task some executor polls from inside it: a `LocalSet`
///    driven by `run_until`, a runtime's `block_on` under `block_in_place` (the review found the
///    first: a task-local alone let a `LocalSet` task re-enter — two holders). A task spawned onto
///    a runtime runs in a poll of its own and does not see the scope at all.
/// 2. Right before each poll of the scope's future, `with_lock` records the id of the task polling
///    it (`None` when it is polled outside any tokio task, e.g. by `Runtime::block_on`).
/// 3. Tokio sets the current task id for exactly the span of each task's poll and restores the
///    previous one when that poll returns, also for tasks polled inside another's poll (`LocalSet`
///    tasks, tasks of a nested runtime); task ids are unique in the process. So during the poll of
///    the scope's future by task T, code running with T's id is T's own poll — the scope's future
///    and the futures it polls in place with the same context (`join!`, `select!`, `timeout`,
///    a `block_on` it blocks on): they must re-enter, and do. A tokio task driven from inside has
///    its own id, differs from the owner and queues like any other task. Futures joined in place
///    keep re-entering, since nothing but a task poll changes the id.
/// 4. The owner is recorded per poll, not once at entry: a scope future moved to another task
///    between polls has the new task as owner, and the task that entered the scope cannot come
///    back through a later poll by someone else.
///
/// Limit: executors other than tokio's set no task id. Tasks of such an executor (e.g.
/// `futures::executor::LocalPool`) driven from inside a critical section carry the id of the task
/// polling the scope (or none) and cannot be told apart from the scope's own future: do not drive
/// them from inside `with_lock`.
#[derive(Clone)]
struct Scope {
    /// The lock (one kind of it: a read/write lock's read and write locks have a table each).
    holds: Weak<Holds>,
    hold: Record<Hold>,
    owner: Arc<ScopeOwner>,
}

/// The tokio task polling a scope's future now (`None` outside any tokio task).
#[derive(Default)]
struct ScopeOwner(Mutex<Option<tokio::task::Id>>);

impl ScopeOwner {
    fn set(&self, task: Option<tokio::task::Id>) {
        *lock(&self.0) = task;
    }

    fn is(&self, task: Option<tokio::task::Id>) -> bool {
        *lock(&self.0) == task
    }
}

/// Runs `section` inside a lock scope of `holds` whose hold is `hold`: acquires of the same lock
/// made by the task polling it re-enter `hold` ([`scope_hold`]).
pub(crate) async fn run_in_scope<Fut: Future>(holds: &Arc<Holds>, hold: Record<Hold>, section: Fut) -> Fut::Output {
    let mut scopes = LOCK_SCOPES.try_with(Clone::clone).unwrap_or_default();
    let owner = Arc::new(ScopeOwner::default());
    scopes.push(Scope { holds: Arc::downgrade(holds), hold, owner: owner.clone() });
    let mut scoped = std::pin::pin!(LOCK_SCOPES.scope(scopes, section));
    // Who may re-enter: the task polling the scope's future, recorded at every poll (`Scope`).
    std::future::poll_fn(|cx| {
        owner.set(tokio::task::try_id());
        scoped.as_mut().poll(cx)
    })
    .await
}

/// The hold of the innermost lock scope of `holds` the current future runs in, if the current
/// task is the one polling that scope's future (see [`Scope`] for why).
pub(crate) fn scope_hold(holds: &Arc<Holds>) -> Option<Record<Hold>> {
    let me = Arc::as_ptr(holds);
    let task = tokio::task::try_id();
    LOCK_SCOPES
        .try_with(|scopes| {
            scopes
                .iter()
                .rev()
                .find(|scope| scope.holds.as_ptr() == me && scope.owner.is(task))
                .map(|scope| scope.hold.clone())
        })
        .ok()
        .flatten()
}
