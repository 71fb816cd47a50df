//! Listings of a lock directory, shared by the acquires of one session.
//!
//! An acquire needs a listing of the directory sent after its create (so that it shows every
//! node ahead of ours). When many tasks queue on the same session at once, one `getChildren`
//! sent after all of their creates serves them all: the server answers a session's requests in
//! order, so that listing was taken after each of those creates. Without this, N waiters queued
//! at once would read O(N²) names (each listing holds the whole queue).
//!
//! The listing is sent by a task of its own after one scheduler yield (so the acquires running
//! now can join), which also makes it independent of any one acquire being cancelled. An
//! uncontended acquire still costs one round trip: its create and the listing travel back to
//! back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::watch;
use zookeeper_client as zk;

use crate::naming::{self, LockChild};

/// A listing of the lock directory: its lock nodes in queue order and the directory's stat
/// (which identifies the directory instance).
#[derive(Debug)]
pub(crate) struct Listing {
    pub children: Vec<LockChild>,
    pub dir_stat: zk::Stat,
}

impl Listing {
    pub(crate) fn new(names: Vec<String>, dir_stat: zk::Stat, lock_name: &str) -> Listing {
        Listing { children: naming::sort_lock_children(names, lock_name), dir_stat }
    }

    /// Index of `child` in queue order, if listed.
    pub(crate) fn position(&self, child: &LockChild) -> Option<usize> {
        self.children
            .binary_search_by(|c| c.sequence.cmp(&child.sequence).then_with(|| c.name.as_str().cmp(&child.name)))
            .ok()
    }
}

type Shared = Option<Result<Arc<Listing>, zk::Error>>;
type Key = (i64, String, &'static str);
type Open = Mutex<HashMap<Key, watch::Receiver<Shared>>>;

/// Listings not sent yet, by session, directory and lock name.
fn open() -> &'static Open {
    static OPEN: OnceLock<Open> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock(open: &Open) -> MutexGuard<'_, HashMap<Key, watch::Receiver<Shared>>> {
    // Single insert/remove/get operations only: a poisoned map is still consistent.
    open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A listing of `dir` sent on `client`'s session after every request already sent on it — call
/// it right after sending the create. `None` if it could not be had (an error, or no runtime):
/// list again yourself.
pub(crate) fn after_sent_requests(
    client: &zk::Client,
    dir: &str,
    lock_name: &'static str,
) -> impl Future<Output = Option<Result<Arc<Listing>, zk::Error>>> + Send + 'static {
    let key: Key = (client.session_id().0, dir.to_owned(), lock_name);
    let mut receiver = {
        let mut open = lock(open());
        match open.get(&key) {
            // Not sent yet, so it will be sent after our create.
            Some(receiver) => Some(receiver.clone()),
            None => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let (sender, receiver) = watch::channel(None);
                    open.insert(key.clone(), receiver.clone());
                    runtime.spawn(send_listing(client.clone(), key, lock_name, sender));
                    Some(receiver)
                },
                Err(_) => None,
            },
        }
    };
    async move {
        let receiver = receiver.as_mut()?;
        let shared = receiver.wait_for(Option::is_some).await.ok()?;
        shared.clone()
    }
}

async fn send_listing(client: zk::Client, key: Key, lock_name: &'static str, sender: watch::Sender<Shared>) {
    // Let the acquires that are running now send their creates and join.
    tokio::task::yield_now().await;
    let reply = {
        let mut open = lock(open());
        open.remove(&key);
        // Sent while nobody can join any more.
        client.get_children(&key.1)
    };
    let result = reply.await.map(|(names, stat)| Arc::new(Listing::new(names, stat, lock_name)));
    let _ = sender.send(Some(result));
}
