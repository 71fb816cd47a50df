//! Lock-delay (Chubby's, Consul's; `LockBuilder::lock_delay`): when a holder's node disappears
//! without a clean release, no hold of the lock is granted until `delay` after it.
//!
//! # Counting deletions without a mark
//! A hold of a lock with a lock-delay that ends cleanly — released by its owner, or a latch
//! closed — deletes its node in one `multi` with a write of the lock directory's data
//! (`session/cleanup.rs`, `Target::Released`): one request, as a plain delete. Everything else
//! deletes without that write: an expired or closed session (the server deletes the node), an
//! operator's delete, a hold whose lease ran out (the library released it for a holder that may
//! still be running), and Curator's and kazoo's releases, which know nothing of it. (A node never
//! handed to the application is deleted with the write too: *Give-ups and waits cut short*.) The directory's stat counts both, and no client can rewrite either count:
//! - `version` is the number of writes of its data. Nothing but a clean release writes it (the
//!   directory's data is the lock-delay's: documented), so it counts clean releases.
//! - The server keeps the number of children ever created and reports `cversion` as creates plus
//!   deletes (`2 × creates − numChildren`: ZooKeeper's `DataNode.copyStat`), so
//!   `deletes = (cversion + numChildren) / 2 − numChildren`.
//!
//! So [`unmarked`]`(stat) = deletes − version` counts the children of this directory ever deleted
//! without a mark, in the order the server applied them. It only grows, and it counts every
//! unclean end of a hold. (Both
//! counts are 32-bit on the server; the sequence counter's end — `naming`, *The counter's end* —
//! comes first. A directory deleted and created again starts from zero: its `czxid` tells them
//! apart.)
//!
//! # Served marks
//! What a clean release writes is a number `m`, its *served mark*, with this claim:
//!
//! **S(m)**: each of the first `m` deletions without a mark in this directory happened at least
//! `delay` ago.
//!
//! Time only moves forward, so once S(m) holds it holds for good, and S(m) implies S(k) for k ≤ m:
//! an old mark is still true, only weaker. A hold writes the served mark it established at its
//! grant (below), so every mark a directory holds satisfies S — even one overwritten by an older
//! one (concurrent releases of a shared lock), which only makes later grants wait more.
//!
//! # The grant rule
//! Every grant of a lock with a lock-delay (all recipes: the mutex, leader election, the
//! read/write lock's both modes, the semaphores' leases) first takes:
//! - `s`, the directory's stat from a listing taken **on our session, after the deletions the grant
//!   rests on**: the listing that decides the grant — the one pipelined behind our create, or, for
//!   a waiter granted from the shared view (whose events may come from other sessions, through
//!   other servers), a listing taken then, which must itself show the grant (a server that has not
//!   applied the deletion yet shows the node, and we wait for it on our session). Any node whose
//!   presence would have kept us waiting — any holder our grant conflicts with — is absent from
//!   that listing, so its deletion is counted in `unmarked(s)`.
//! - `m`, the largest served mark read from this directory instance (same `czxid`): the data read
//!   before our create, in its round trip, and for a waiter the data read with the listing.
//!
//! If `unmarked(s) ≤ m`, every deletion without a mark counted in `s` is one of the first `m`: by
//! S(m) each happened at least `delay` ago, and the grant stands; its served mark is `m`.
//! Otherwise each of them happened before the server answered `s`, so before we received it: the
//! grant waits `delay` from then (watching our node), after which S(unmarked(s)) holds — its served
//! mark. A directory that was missing, an unreadable or foreign mark, or counts that do not add up
//! (someone else wrote the data) give no `m`: the grant waits.
//!
//! A deletion we count but that our grant does not conflict with (a waiter behind us, a reader
//! beside us) costs a wait, never safety. What the rule cannot see is a deletion after `s` of a
//! node our grant does not wait for — by definition not a holder we exclude.
//!
//! # What it costs
//! - A clean release: nothing (a `multi` instead of a delete, one request either way).
//! - An acquire: one read of the directory's data in the round trip of its create; a waiter
//!   granted after a handoff lists the directory and reads its data (one round trip, as a grant
//!   confirmed by a listing); a semaphore lists with its stat where it listed without.
//! - After any deletion without a mark the next grant waits the delay, once (then its mark covers
//!   it). A directory that does not exist counts as unclean: it
//!   may have been reaped by the server (a container, left empty by an unclean loss), so a lock
//!   with a delay creates its directory *persistent* (never reaped), and only the first acquire on
//!   a new path pays the delay.
//!
//! # Give-ups and waits cut short
//! Two things would otherwise keep an acquire that does not wait the delay out — `try_acquire`, an
//! `acquire_timeout` shorter than the delay — from ever being granted after an unclean loss, since
//! nothing but a grant that waited writes a larger mark:
//! - **A give-up keeps the count.** A node never handed to the application (a waiter that gave
//!   up, timed out or was dropped; a `try_acquire` refused) ended no hold, so its deletion need not
//!   be served. It is deleted in the same `multi` as a clean release, writing the largest mark
//!   this acquire read from the directory instance its node lives in, so `unmarked` does not move
//!   — or, when it read none, empty data: no mark (below, *A directory's past*). (A read lock's downgrade node given up, and
//!   a give-up whose `multi` is retried after a lost reply, go unmarked: only more waiting.) A mark read is true for good; writing it over
//!   a newer one only makes a later grant wait more (never less), and only when the two race.
//! - **Waits seen by this process count.** A verdict `Wait(Some(u))` received at `t` proves that
//!   the first `u` deletions without a mark happened before `t`, so S(u) holds from `t + delay`.
//!   The process keeps the earliest such sighting per directory instance (its path as the
//!   server names it, chroot included, with `czxid` and `ctime`, as the shared view is keyed:
//!   `view.rs`; at most [`MAX_SIGHTINGS`]): a later verdict that needs
//!   `u' ≤ u` stands once `t + delay` has passed, or waits only until then. A `try_acquire` refused
//!   once is granted when it comes back after the delay (if nothing else was lost meanwhile); a
//!   grant that waited partly in an earlier, timed-out acquire waits only the rest.
//!
//! `try_acquire` itself never waits: while the delay runs it finds the lock not available.
//!
//! # A directory's past
//! A directory instance's counts start at its creation, but a lock path may have had holders
//! before it: a directory that was missing may have been reaped after an unclean loss (or deleted
//! by someone). So a directory with no mark gives no `m`, and its first grant waits the delay —
//! from when this process first saw the instance, which existed then, so every deletion of an
//! earlier instance came before. Hence:
//!
//! **P**: every mark in a directory instance was established by a grant that waited the delay
//! after seeing that instance, or copied from such a mark (a give-up writes only a mark it read
//! from the instance; a clean release, the mark its grant established). A mark the directory was
//! created with (a copy made by a tool: its `version` is 0) is not counted: no grant in this
//! instance waited for it (review AG).
//!
//! So a mark also vouches for the instance's past, and a grant that stands on one (`unmarked ≤
//! m`) comes at least `delay` after every deletion before the instance existed. That is why a
//! give-up that read no mark writes none (a mark 0 would be true of the instance's counts, S(0),
//! but would vouch for a past nobody waited for: a refused `try_acquire` on a new path then let the
//! next one in at once — review AF). Its `multi` still writes the data, so the give-up is not
//! counted as unclean and a waiter's sighting still covers it: a `try_acquire` on a new path is
//! granted once the delay since the process first saw the directory has passed.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::driver::{Decision, LockDriver};
use super::naming::LockChild;
use super::{OnSession, Turn};
use crate::engine::listing::Listing;
use crate::error::{session_dead, Error, Result};
use crate::session::cleanup::{mark_of, retry_unknown};
use crate::session::watch::{NodeWatch, Watched};
use crate::sync::lock;

/// The lock directory's data and stat read before our create, if the lock has a lock-delay.
/// Boxed: kept by a waiter for as long as it waits, and only a lock-delay reads it (issue 24).
pub(super) type Before = Option<Box<std::result::Result<(Vec<u8>, zk::Stat), zk::Error>>>;

/// How many children of the directory were ever deleted without a mark (module docs, *Counting
/// deletions without a mark*); `None` if the counts do not add up.
pub(super) fn unmarked(stat: &zk::Stat) -> Option<u32> {
    let children = u32::try_from(stat.num_children).ok()?;
    // 2 × creates − children, in the server's 32-bit arithmetic: creates stay below 2^31.
    let creates = (stat.cversion as u32).wrapping_add(children) / 2;
    let deletes = creates.checked_sub(children)?;
    deletes.checked_sub(u32::try_from(stat.version).ok()?)
}

/// What a grant must do before it stands (module docs, *The grant rule*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every deletion without a mark it counts is served: the grant stands, with this mark.
    Stands(u32),
    /// Wait `delay` from now; then the grant stands with this served mark (`None`: the counts
    /// could not be read, and the grant writes no mark).
    Wait(Option<u32>),
}

/// The grant rule for `counted` (the deciding listing's stat) and the marks read from the
/// directory (with the stat each was read with).
pub(super) fn verdict<'a>(counted: &zk::Stat, marks: impl IntoIterator<Item = (&'a [u8], &'a zk::Stat)>) -> Verdict {
    let Some(unmarked) = unmarked(counted) else { return Verdict::Wait(None) };
    let served = marks.into_iter().filter(|(_, stat)| ours(stat, counted)).filter_map(|(data, _)| mark_of(data)).max();
    match served {
        Some(served) if unmarked <= served => Verdict::Stands(served),
        _ => Verdict::Wait(Some(unmarked)),
    }
}

/// How a grant with a verdict settles, with what this process has seen of the directory (module
/// docs, *Waits seen by this process*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// The grant stands now, with this served mark.
    Stands(u32),
    /// The grant stands at this instant, with this served mark (`None`: it writes none).
    At(Instant, Option<u32>),
}

/// A directory instance, as the shared view keys it (`view.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Instance {
    dir: String,
    czxid: i64,
    ctime: i64,
}

/// The first `unmarked` deletions without a mark of a directory instance happened before `at`.
#[derive(Clone, Copy, Debug)]
struct Sighting {
    unmarked: u32,
    at: Instant,
}

/// The most sightings the process keeps: past it the oldest is forgotten (its lock's next grant
/// then waits a full delay: only ever more).
pub(super) const MAX_SIGHTINGS: usize = 1024;

type Sightings = Mutex<HashMap<Instance, Sighting>>;

fn sightings() -> &'static Sightings {
    static SIGHTINGS: OnceLock<Sightings> = OnceLock::new();
    SIGHTINGS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Settles `verdict`, decided from `counted` (the deciding listing's stat of `dir`, named as the
/// server names it, received no later than now), for a lock with this `delay` (module docs,
/// *Waits seen by this process*).
pub(super) fn settle(dir: &str, counted: &zk::Stat, verdict: Verdict, delay: Duration) -> Settled {
    let now = Instant::now();
    let instance = Instance { dir: dir.to_owned(), czxid: counted.czxid, ctime: counted.ctime };
    let mut seen = lock(sightings());
    match verdict {
        Verdict::Stands(served) => {
            // The directory's mark covers what we saw: the sighting is of no more use.
            if seen.get(&instance).is_some_and(|sighting| sighting.unmarked <= served) {
                seen.remove(&instance);
            }
            Settled::Stands(served)
        },
        Verdict::Wait(None) => Settled::At(now + delay, None),
        Verdict::Wait(Some(unmarked)) => {
            let at = match seen.get(&instance) {
                // Seen at `at`, at least as many: S(unmarked) holds from `at + delay`.
                Some(sighting) if sighting.unmarked >= unmarked => sighting.at,
                _ => {
                    // Seen now: the count only grows, so an older, smaller sighting is of no use.
                    if seen.len() >= MAX_SIGHTINGS && !seen.contains_key(&instance) {
                        let oldest = seen.iter().min_by_key(|(_, sighting)| sighting.at).map(|(key, _)| key.clone());
                        if let Some(oldest) = oldest {
                            seen.remove(&oldest);
                        }
                    }
                    seen.insert(instance, Sighting { unmarked, at: now });
                    now
                },
            };
            match at + delay {
                served_at if served_at <= now => Settled::Stands(unmarked),
                served_at => Settled::At(served_at, Some(unmarked)),
            }
        },
    }
}

/// The mark a give-up of a node in the directory instance of `counted` writes: the largest read
/// from that instance, else none (module docs, *Give-ups and waits cut short*).
pub(super) fn give_up_mark<'a>(
    counted: &zk::Stat,
    marks: impl IntoIterator<Item = (&'a [u8], &'a zk::Stat)>,
) -> Option<u32> {
    marks.into_iter().filter(|(_, stat)| ours(stat, counted)).filter_map(|(data, _)| mark_of(data)).max()
}

/// Whether a mark read with `stat` may count for the directory instance of `counted`: read from
/// that instance (a directory created again starts over), and written by a release or a give-up
/// — a write of the data (`version` ≥ 1) — not carried in the directory's create (a copy of a lock
/// directory made by a tool, which no grant in this instance waited for: claim P, review AG).
fn ours(stat: &zk::Stat, counted: &zk::Stat) -> bool {
    stat.czxid == counted.czxid && stat.version > 0
}

/// The marks in `before`, if it was read.
pub(super) fn marks_before(before: &Before) -> Option<(&[u8], &zk::Stat)> {
    match before.as_deref() {
        Some(Ok((data, stat))) => Some((data.as_slice(), stat)),
        _ => None,
    }
}

/// What a waiter granted from the shared view learns from its own listing (`delay_verdict`).
pub(super) enum DelayCheck {
    /// Our node is gone.
    NodeGone,
    /// Our server still shows this node, which keeps us waiting: wait for it on our session.
    Behind(LockChild),
    /// The listing shows the grant: its directory stat, and the rule's verdict.
    Verdict(zk::Stat, Verdict),
}

impl OnSession<'_> {
    /// For a waiter granted from the shared view: a listing on our session with the directory's
    /// data read behind it (one round trip), which must itself show the grant; then the rule's
    /// verdict from its stat and every mark read (module docs, *The grant rule*).
    pub(super) async fn delay_verdict(
        &self,
        driver: &dyn LockDriver,
        ours: &LockChild,
        before: &Before,
    ) -> Result<DelayCheck> {
        let client = self.context.client();
        let dir = &self.lock.dir;
        let read = retry_unknown(|| {
            // Both sent now, the data read after the listing on the same server.
            let listed = client.get_children(dir);
            let data = client.get_data(dir);
            async move {
                let listed = listed.await?;
                Ok((listed, data.await))
            }
        })
        .await;
        let ((names, dir_stat), data) = match read {
            Ok(read) => read,
            // Our node was in it: the directory is gone, and our node with it.
            Err(zk::Error::NoNode) => return Ok(DelayCheck::NodeGone),
            Err(err) if session_dead(&err) => return Err(self.session_lost(err.to_string())),
            Err(err) => return Err(Error::zk("list", dir, err)),
        };
        let listing = Listing::new(names, dir_stat, driver.queue());
        let Some(ours_at) = listing.position(ours) else { return Ok(DelayCheck::NodeGone) };
        if let Decision::WaitFor(blocker) = driver.decide(ours.kind, &mut listing.children[..ours_at].iter().rev()) {
            return Ok(DelayCheck::Behind(blocker));
        }
        let after = data.as_ref().ok().map(|(data, stat)| (data.as_slice(), stat));
        let verdict = verdict(&listing.dir_stat, marks_before(before).into_iter().chain(after));
        Ok(DelayCheck::Verdict(listing.dir_stat, verdict))
    }

    /// Waits until `until` (a settled verdict's), watching our node (`own_watch`, set again if its
    /// data changes): `Some(NodeGone)` if it goes meanwhile.
    pub(super) async fn serve_delay(
        &self,
        node_path: &str,
        until: Instant,
        own_watch: &mut NodeWatch,
    ) -> Result<Option<Turn>> {
        let rest = until.saturating_duration_since(Instant::now());
        tracing::debug!(path = node_path, ?rest, "lock-delay: a node went without a clean release");
        loop {
            tokio::select! {
                biased;
                event = &mut *own_watch => match event {
                    Watched::Deleted => return Ok(Some(Turn::NodeGone)),
                    Watched::SessionDead(state) => return Err(self.session_lost(state.to_string())),
                    Watched::Refused(err) => return Err(Error::zk("watch the lock node", node_path, err)),
                    Watched::Other => *own_watch = self.watch(node_path.into()),
                },
                () = tokio::time::sleep_until(until) => return Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::cleanup::mark_data;

    fn stat(czxid: i64, cversion: i32, num_children: i32, version: i32) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: 0,
            pzxid: 0,
            ctime: 0,
            mtime: 0,
            version,
            cversion,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children,
        }
    }

    #[test]
    fn counts_deletions_without_a_mark() {
        // 3 creates, 2 deletes, 1 of them marked: cversion = 2 × 3 − 1 = 5.
        assert_eq!(unmarked(&stat(1, 5, 1, 1)), Some(1));
        // All marked.
        assert_eq!(unmarked(&stat(1, 5, 1, 2)), Some(0));
        // More writes than deletes: someone else wrote the data.
        assert_eq!(unmarked(&stat(1, 5, 1, 3)), None);
        // Past 2^30 creates the reported cversion wraps; the count does not.
        let creates: u32 = (1 << 30) + 10;
        let cversion = (2 * creates - 4) as i32;
        assert!(cversion < 0);
        assert_eq!(unmarked(&stat(1, cversion, 4, 6)), Some(creates - 4 - 6));
    }

    #[test]
    fn a_grant_stands_only_on_a_mark_of_this_directory_that_covers_the_count() {
        let counted = stat(7, 5, 1, 1); // one deletion without a mark
        let one = mark_data(1);
        let zero = mark_data(0);
        // Read with the data written once (a release's or a give-up's mark).
        let same = stat(7, 0, 0, 1);
        let other = stat(8, 0, 0, 1);
        assert_eq!(verdict(&counted, [(one.as_slice(), &same)]), Verdict::Stands(1));
        // A mark the directory was created with (a copy): no grant in this instance waited for it.
        assert_eq!(verdict(&counted, [(one.as_slice(), &stat(7, 0, 0, 0))]), Verdict::Wait(Some(1)));
        assert_eq!(verdict(&counted, [(zero.as_slice(), &same)]), Verdict::Wait(Some(1)));
        assert_eq!(verdict(&counted, [(one.as_slice(), &other)]), Verdict::Wait(Some(1)));
        assert_eq!(verdict(&counted, [(zero.as_slice(), &same), (one.as_slice(), &same)]), Verdict::Stands(1));
        assert_eq!(verdict(&counted, [(b"_c_x-lock-0000000001".as_slice(), &same)]), Verdict::Wait(Some(1)));
        assert_eq!(verdict(&counted, []), Verdict::Wait(Some(1)));
        assert_eq!(verdict(&stat(7, 5, 1, 3), [(one.as_slice(), &same)]), Verdict::Wait(None));
    }

    #[test]
    fn a_wait_seen_once_is_not_waited_again_and_a_larger_count_starts_over() {
        let delay = Duration::from_secs(3600);
        let dir = "/delay-unit/seen";
        let counted = stat(11, 5, 1, 1);
        let Settled::At(first, Some(1)) = settle(dir, &counted, Verdict::Wait(Some(1)), delay) else { panic!() };
        // Seen again: the same instant, not a new wait.
        assert_eq!(settle(dir, &counted, Verdict::Wait(Some(1)), delay), Settled::At(first, Some(1)));
        // A smaller count is covered by the sighting.
        assert_eq!(settle(dir, &counted, Verdict::Wait(Some(0)), delay), Settled::At(first, Some(0)));
        // Another directory instance (czxid) knows nothing of it.
        let Settled::At(other, _) = settle(dir, &stat(12, 5, 1, 1), Verdict::Wait(Some(1)), delay) else { panic!() };
        assert!(other >= first);
        // A larger count: seen now, a full delay from now.
        std::thread::sleep(Duration::from_millis(5));
        let Settled::At(later, Some(2)) = settle(dir, &counted, Verdict::Wait(Some(2)), delay) else { panic!() };
        assert!(later > first);
        // A grant standing on a mark that covers it forgets the sighting.
        assert_eq!(settle(dir, &counted, Verdict::Stands(2), delay), Settled::Stands(2));
        let Settled::At(again, _) = settle(dir, &counted, Verdict::Wait(Some(2)), delay) else { panic!() };
        assert!(again > later);
    }

    #[test]
    fn a_wait_seen_a_delay_ago_stands() {
        let delay = Duration::from_millis(20);
        let dir = "/delay-unit/served";
        let counted = stat(13, 5, 1, 1);
        assert!(matches!(settle(dir, &counted, Verdict::Wait(Some(1)), delay), Settled::At(_, Some(1))));
        std::thread::sleep(delay * 2);
        assert_eq!(settle(dir, &counted, Verdict::Wait(Some(1)), delay), Settled::Stands(1));
        // Counts that do not add up are never settled by a sighting.
        assert!(matches!(settle(dir, &counted, Verdict::Wait(None), delay), Settled::At(_, None)));
    }

    #[test]
    fn a_give_up_writes_only_a_mark_of_its_own_directory_instance() {
        let counted = stat(7, 5, 1, 1);
        let (one, three) = (mark_data(1), mark_data(3));
        assert_eq!(give_up_mark(&counted, [(one.as_slice(), &stat(7, 0, 0, 1))]), Some(1));
        assert_eq!(give_up_mark(&counted, [(one.as_slice(), &stat(7, 0, 0, 0))]), None);
        assert_eq!(give_up_mark(&counted, [(three.as_slice(), &stat(8, 0, 0, 1))]), None);
        assert_eq!(give_up_mark(&counted, [(b"foreign".as_slice(), &stat(7, 0, 0, 1))]), None);
        assert_eq!(give_up_mark(&counted, []), None);
    }
}
