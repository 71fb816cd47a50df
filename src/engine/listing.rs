//! Listings of a lock directory, shared by the acquires of one session.
//!
//! An acquire needs a listing of the directory sent after its create (so that it shows every
//! node ahead of ours). When many tasks queue on the same session at once, one `getChildren`
//! sent after all of their creates serves them all: the server answers a session's requests in
//! order, so that listing was taken after each of those creates. Without this, N waiters queued
//! at once would read O(N²) names (each listing holds the whole queue).
//!
//! When no listing is outstanding on the session, the acquire sends its own right behind its
//! create (an uncontended acquire: one round trip). When one is (a burst of acquires), the next
//! listing is sent by a task of its own after one scheduler yield, so the acquires running now can
//! join it; that task does not depend on any one acquire, which may be cancelled.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;
use zookeeper_client as zk;

use crate::engine::naming::{self, LockChild, Queue};
// Each update of the slots is a few field writes: a poisoned map is still consistent.
use crate::sync::lock;

/// A listing of the lock directory: its lock nodes in queue order and the directory's stat
/// (which identifies the directory instance).
#[derive(Debug)]
pub(crate) struct Listing {
    pub children: Vec<LockChild>,
    /// How many children the directory had, foreign ones included (a semaphore counts them all).
    pub all: usize,
    pub dir_stat: zk::Stat,
}

impl Listing {
    pub(crate) fn new(names: Vec<String>, dir_stat: zk::Stat, queue: Queue) -> Listing {
        let all = names.len();
        Listing { children: naming::sort_lock_children(names, queue), all, dir_stat }
    }

    /// Index of `child` in queue order, if listed.
    pub(crate) fn position(&self, child: &LockChild) -> Option<usize> {
        self.children.binary_search(child).ok()
    }
}

type Shared = Option<Result<Arc<Listing>, zk::Error>>;
/// Session, chroot, directory, queue.
type Key = (i64, String, String, Queue);

/// Per session, directory and lock name: the listing not sent yet (if any), and how many listings
/// are outstanding.
#[derive(Default)]
struct Slot {
    open: Option<watch::Receiver<Shared>>,
    outstanding: usize,
}

type Slots = Mutex<HashMap<Key, Slot>>;

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Counts an outstanding listing until dropped (also when its future is cancelled).
struct Outstanding(Key);

impl Outstanding {
    fn start(slots: &mut HashMap<Key, Slot>, key: &Key) -> Outstanding {
        slots.entry(key.clone()).or_default().outstanding += 1;
        Outstanding(key.clone())
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        let mut slots = lock(slots());
        if let Some(slot) = slots.get_mut(&self.0) {
            slot.outstanding -= 1;
            if slot.outstanding == 0 && slot.open.is_none() {
                slots.remove(&self.0);
            }
        }
    }
}

/// A listing of `dir` sent on `client`'s session after every request already sent on it — call
/// it right after sending the create. `None` if it could not be had (an error, or no runtime):
/// list again yourself.
///
/// With no other listing outstanding it is sent at once; otherwise (many acquires at the same
/// moment) it is sent shortly, shared with every acquire that asks meanwhile.
pub(crate) fn after_sent_requests(
    client: &zk::Client,
    dir: &str,
    queue: Queue,
) -> impl Future<Output = Option<Result<Arc<Listing>, zk::Error>>> + Send + 'static {
    enum Via {
        Direct(Outstanding, BoxedReply),
        Shared(watch::Receiver<Shared>),
        Nothing,
    }
    let key: Key = (client.session_id().0, client.path().to_owned(), dir.to_owned(), queue);
    let via = {
        let mut slots = lock(slots());
        let slot = slots.entry(key.clone()).or_default();
        if let Some(receiver) = &slot.open {
            // Not sent yet, so it will be sent after our create.
            Via::Shared(receiver.clone())
        } else if slot.outstanding == 0 {
            let outstanding = Outstanding::start(&mut slots, &key);
            Via::Direct(outstanding, Box::pin(client.get_children(dir)))
        } else {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let (sender, receiver) = watch::channel(None);
                    slot.open = Some(receiver.clone());
                    runtime.spawn(send_listing(client.clone(), key, queue, sender));
                    Via::Shared(receiver)
                },
                Err(_) => Via::Nothing,
            }
        }
    };
    async move {
        match via {
            Via::Direct(outstanding, reply) => {
                let result = reply.await.map(|(names, stat)| Arc::new(Listing::new(names, stat, queue)));
                drop(outstanding);
                Some(result)
            },
            Via::Shared(mut receiver) => receiver.wait_for(Option::is_some).await.ok()?.clone(),
            Via::Nothing => None,
        }
    }
}

type BoxedReply = std::pin::Pin<Box<dyn Future<Output = Result<(Vec<String>, zk::Stat), zk::Error>> + Send>>;

async fn send_listing(client: zk::Client, key: Key, queue: Queue, sender: watch::Sender<Shared>) {
    // Let the acquires that are running now send their creates and join.
    tokio::task::yield_now().await;
    let (outstanding, reply) = {
        let mut slots = lock(slots());
        if let Some(slot) = slots.get_mut(&key) {
            slot.open = None;
        }
        // Sent while nobody can join any more.
        (Outstanding::start(&mut slots, &key), client.get_children(&key.2))
    };
    let result = reply.await.map(|(names, stat)| Arc::new(Listing::new(names, stat, queue)));
    drop(outstanding);
    let _ = sender.send(Some(result));
}
