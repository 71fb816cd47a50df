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
                release_capacity(&mut slots);
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

/// How many other acquires of a directory may be setting up in this process for an acquire still
/// to pipeline its own listing behind its create (one round trip). With more, it waits for its
/// create's reply and takes a listing one of them takes ([`Setup::listing_for`]).
const PIPELINED_UP_TO: usize = 1;

/// Process-wide: the acquires of one lock directory (as the server names it, chroot included)
/// and queue that are *setting up* — from before their create is sent until they have a listing
/// that shows their node — with the latest listing of the directory any of them had, and the one
/// in flight.
///
/// # Why a listing of another session may serve
/// A waiter decides from a listing that shows every node alive ahead of its own (`view.rs`). A
/// listing sent on our session after our create does, by the order in which the server answers a
/// session. A listing taken on *any* session, from any server, that *contains our node* does too:
/// it shows the directory at some zxid `Z` at or after our create (a server's state is a prefix of
/// the committed history), every node with a lower sequence number was created before ours, and a
/// node alive now was alive at `Z` (deletion is final) — so it is listed. Nodes created beside
/// another (`view.rs`, assumption B) are no different from our own listing's case: a writer
/// confirms its grant from the latest listing's nodes ahead, whoever took it. The test is the
/// listing's *content*, never its timing: a listing sent after our create's reply on another
/// session, answered by a lagging follower, may lack our node, and is then not used.
///
/// *Contains our node* means: a node of our name, in a listing of the directory *instance* our node
/// was created in. The name alone is not enough (review L): an attempt keeps its GUID when it
/// creates again after a create of unknown outcome (since review S it takes a new one after its
/// node was deleted under it), and a directory deleted and made again restarts its sequence
/// numbers, so our new node can bear exactly the name a node of ours had in the old directory —
/// whose listing, still kept here, would then show it, and nodes long gone ahead of it. So a
/// listing must also be of a state at or after our create: the directory's `pzxid` (the zxid of the
/// last create or delete of a child, which the server only ever raises: `DataTree.createNode`,
/// `deleteNode`) at least our node's `czxid`. A listing of the old instance has a lower one (that
/// instance was gone before ours was made); a listing of ours taken after our create has ours or a
/// later one. Another ensemble's directory never shows our GUID.
///
/// A lock with a lock-delay never uses another session's listing: its grant rule reads the stat
/// of a listing taken on its own session (`delay.rs`).
///
/// # What it saves
/// N acquires of one directory at once on N sessions each read a listing of about N names when
/// each lists for itself: O(N²) names for the server to read and send while the drain that
/// follows waits behind them (BENCHMARKS.md, W4). Shared, a burst takes two or three listings.
pub(crate) struct Setup {
    key: DirKey,
    /// Fewer than [`PIPELINED_UP_TO`] others were setting up when this one began.
    pipelined: bool,
}

/// Directory as the server names it, and queue.
type DirKey = (String, Queue);

#[derive(Default)]
struct DirSlot {
    /// Acquires setting up.
    setting_up: usize,
    /// The latest listing any of them had (highest directory `pzxid`).
    latest: Option<Arc<Listing>>,
    /// The listing last sent for them, by number, until answered.
    in_flight: Option<(u64, watch::Receiver<Shared>)>,
    /// Listings numbered so far.
    sent: u64,
}

type DirSlots = Mutex<HashMap<DirKey, DirSlot>>;

fn dir_slots() -> &'static DirSlots {
    static SLOTS: OnceLock<DirSlots> = OnceLock::new();
    SLOTS.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Setup {
    /// Counts an acquire of `server_dir` as setting up until dropped.
    pub(crate) fn begin(server_dir: String, queue: Queue) -> Setup {
        let key = (server_dir, queue);
        let mut slots = lock(dir_slots());
        let slot = slots.entry(key.clone()).or_default();
        let pipelined = slot.setting_up < PIPELINED_UP_TO;
        slot.setting_up += 1;
        Setup { key, pipelined }
    }

    /// Whether this acquire pipelines its own listing behind its create.
    pub(crate) fn pipelined(&self) -> bool {
        self.pipelined
    }

    /// Keeps `listing` as the latest of the directory if it is (by the directory's `pzxid`, which
    /// only grows; a newer directory instance replaces an older one).
    pub(crate) fn offer(&self, listing: &Arc<Listing>) {
        let mut slots = lock(dir_slots());
        let Some(slot) = slots.get_mut(&self.key) else { return };
        let newer = slot.latest.as_ref().is_none_or(|latest| {
            let (old, new) = (&latest.dir_stat, &listing.dir_stat);
            (new.czxid, new.pzxid) > (old.czxid, old.pzxid)
        });
        if newer {
            slot.latest = Some(listing.clone());
        }
    }

    /// A listing that shows `ours` (created at `czxid`), taken by any acquire of the process (see
    /// the type's docs, *Why a listing of another session may serve*), or
    /// failing that one sent on our session now; `None` if none could be had (list again
    /// yourself). Call it once our create's reply is in.
    ///
    /// 1. The latest listing shows our node: no request.
    /// 2. Else join the listing in flight, if any: it may have been answered after our create.
    /// 3. Else — or if it did not show our node — join one sent since our create's reply (on one
    ///    server it shows our node), or send one on our session that others may join.
    ///
    /// A listing of another session is awaited for at most `patience`: a stalled connection of
    /// one session must not hold up another's acquire for longer. Cancel safe: a listing we send
    /// is published when answered, or dropped (its joiners then list for themselves).
    pub(crate) async fn listing_for(
        &self,
        client: &zk::Client,
        dir: &str,
        ours: &LockChild,
        czxid: i64,
        patience: std::time::Duration,
    ) -> Option<Arc<Listing>> {
        // Listings numbered above this one were sent after our create's reply (set in the
        // first round, right after it); the first round may join any listing in flight.
        let mut since: Option<u64> = None;
        for _round in 0..2 {
            let (joined, reply) = {
                let mut slots = lock(dir_slots());
                let slot = slots.entry(self.key.clone()).or_default();
                if let Some(latest) = slot.latest.as_ref().filter(|latest| shows(latest, ours, czxid)) {
                    return Some(latest.clone());
                }
                let joinable = slot
                    .in_flight
                    .as_ref()
                    .filter(|(number, _)| since.is_none_or(|since| *number > since))
                    .map(|(_, receiver)| receiver.clone());
                since.get_or_insert(slot.sent);
                match joinable {
                    Some(receiver) => (Some(receiver), None),
                    None => {
                        let (sender, receiver) = watch::channel(None);
                        slot.sent += 1;
                        slot.in_flight = Some((slot.sent, receiver));
                        {
                            // Boxed: sent by a few acquires of a burst, but laid out in every one's
                            // future (every queued waiter's memory) if held inline.
                            (None, Some((sender, Box::pin(client.get_children(dir)))))
                        }
                    },
                }
            };
            if let Some((sender, reply)) = reply {
                // Ours, on our session after our create: used whatever it shows (our node missing
                // means it is gone, which the waiter finds out by listing once more). Published
                // for those who joined it; should this future be dropped first, the sender goes
                // with it and they list elsewhere.
                let queue = self.key.1;
                let listing = reply.await.ok().map(|(names, stat)| Arc::new(Listing::new(names, stat, queue)));
                if let Some(listing) = &listing {
                    self.offer(listing);
                }
                // A failed listing is published as nothing: its joiners go on without it.
                let _ = sender.send(Some(listing.clone().ok_or(zk::Error::ConnectionLoss)));
                return listing;
            }
            let mut receiver = joined?;
            let shared = match tokio::time::timeout(patience, receiver.wait_for(Option::is_some)).await {
                Ok(Ok(shared)) => shared.clone(),
                _ => None,
            };
            if let Some(Ok(listing)) =
                shared.filter(|shared| matches!(shared, Ok(listing) if shows(listing, ours, czxid)))
            {
                return Some(listing);
            }
        }
        // Two listings of other sessions did not show our node (lagging servers, or stalled):
        // list on our own.
        None
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let mut slots = lock(dir_slots());
        if let Some(slot) = slots.get_mut(&self.key) {
            slot.setting_up -= 1;
            if slot.setting_up == 0 {
                slots.remove(&self.key);
                release_capacity(&mut slots);
            }
        }
    }
}

/// Whether `listing` shows our node `ours`, created at `czxid`: listed, in a listing of a state
/// at or after our create (see [`Setup`]: a node of the same name in an older instance of the
/// directory is not ours).
fn shows(listing: &Listing, ours: &LockChild, czxid: i64) -> bool {
    listing.dir_stat.pzxid >= czxid && listing.position(ours).is_some()
}

/// Gives back most of a table's room once it is mostly empty: a burst of 10,000 acquires grows
/// these tables to 10,000 entries for a moment, and a `HashMap` keeps its capacity for good
/// (about 100 B per acquire of that burst, heap each held lock was charged for). Halving when a
/// quarter full keeps the cost per removal constant on average.
fn release_capacity<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst leaves the table of acquires setting up no larger than a quiet process needs.
    #[test]
    fn a_burst_gives_its_room_back() {
        let queue: Queue = &["lock-"];
        let burst: Vec<Setup> = (0..5_000).map(|i| Setup::begin(format!("/listing-test/burst-{i}"), queue)).collect();
        assert!(lock(dir_slots()).capacity() >= 5_000);
        drop(burst);
        let capacity = lock(dir_slots()).capacity();
        assert!(capacity <= 64, "the table kept room for {capacity} entries after the burst");
    }
}
