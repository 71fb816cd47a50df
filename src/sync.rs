//! The poison-tolerant lock shared by the crate's process-wide tables (sessions, directory
//! views, listing slots, holds), and the slab that keeps every hold's records together
//! ([`Records`]). At the bottom of the crate: every layer may use them.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex whose data every update leaves consistent at each step (single map
/// operations, a few field writes), so that a lock poisoned by a panic elsewhere is still usable.
/// Shared by the crate's process-wide tables (sessions, directory views, listing slots).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A process-wide slab of records of one type, each shared like an `Arc` ([`Record`],
/// [`WeakRecord`]), kept together in chunks of [`CHUNK`] slots.
///
/// # Why
/// A held lock's long-lived records (its hold, its session feed) are allocated while thousands of
/// acquires allocate and free their transient state: placed one by one by the allocator, they
/// land among the holes those leave, and pin pages that are otherwise free (BENCHMARKS.md,
/// *Whose records a held lock keeps*). Here they sit side by side, 64 to a chunk, and a freed
/// slot is reused before a new chunk is made.
///
/// # Soundness
/// - A slot's `strong` counts its [`Record`]s; its `weak` counts its [`WeakRecord`]s plus one for
///   all the records together, as `Arc`'s counts do (with the same orderings: a decrement is a
///   release, and whoever takes a count to zero fences with an acquire before dropping or
///   freeing, so every use through another handle happens before).
/// - The value is written once, when the slot is taken, before any handle to it exists, and
///   dropped in place exactly once, by whoever takes `strong` to zero; no handle reads it after
///   (a [`Record`] exists only while `strong > 0`, and [`WeakRecord::upgrade`] increments only a
///   non-zero `strong`).
/// - A slot is given back by whoever takes `weak` to zero (after the value was dropped: the
///   records' shared weak count is released last), under the pool's lock, which is the only
///   place slots are taken and chunks freed: a slot is never taken while a handle to it exists,
///   and a chunk is freed only when every slot of it is free (then no handle points into it).
/// - Chunks are never moved (boxed), and a slot finds its chunk from its index (the slots are
///   the chunk's first field, `repr(C)`).
pub(crate) struct Records<T: 'static> {
    pool: Mutex<Pool<T>>,
}

/// Slots per chunk (a bit each in the chunk's free mask).
pub(crate) const CHUNK: usize = 64;

struct Pool<T: 'static> {
    /// Chunks with a free slot; the last one is taken from first.
    with_room: Vec<NonNull<Chunk<T>>>,
}

// SAFETY: the pool only holds pointers to chunks, which it owns (with the handles into them);
// the values they hold are `Send + Sync`, as the impls on `Record` require.
unsafe impl<T: Send + Sync> Send for Pool<T> {}

#[repr(C)]
struct Chunk<T: 'static> {
    /// First: a slot's chunk is found from its address and index.
    slots: [Slot<T>; CHUNK],
    /// A bit per slot, set when free; read and written under the pool's lock only.
    free: UnsafeCell<u64>,
    records: &'static Records<T>,
}

struct Slot<T> {
    strong: AtomicUsize,
    weak: AtomicUsize,
    index: usize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A strong handle on a record of a [`Records`] slab: like `Arc<T>`.
pub(crate) struct Record<T: 'static> {
    slot: NonNull<Slot<T>>,
}

/// A weak handle on a record of a [`Records`] slab: like `std::sync::Weak<T>`.
pub(crate) struct WeakRecord<T: 'static> {
    slot: NonNull<Slot<T>>,
}

// SAFETY: as `Arc<T>` and `Weak<T>`: handles on a `T` shared between threads, dropped by
// whichever thread drops the last one.
unsafe impl<T: Send + Sync> Send for Record<T> {}
unsafe impl<T: Send + Sync> Sync for Record<T> {}
unsafe impl<T: Send + Sync> Send for WeakRecord<T> {}
unsafe impl<T: Send + Sync> Sync for WeakRecord<T> {}

/// Past this many handles on one record, the process aborts (as `Arc` does: a count that could
/// wrap would free a record still in use).
const MAX_COUNT: usize = isize::MAX as usize;

impl<T: 'static> Records<T> {
    /// An empty slab (its first chunk is made by its first record).
    pub(crate) const fn new() -> Records<T> {
        Records { pool: Mutex::new(Pool { with_room: Vec::new() }) }
    }

    /// Places `value` in a free slot (a new chunk if none is free).
    pub(crate) fn insert(&'static self, value: T) -> Record<T> {
        let slot = {
            let mut pool = lock(&self.pool);
            let chunk = match pool.with_room.last() {
                Some(chunk) => *chunk,
                None => {
                    let chunk = Box::new(Chunk {
                        slots: std::array::from_fn(|index| Slot {
                            strong: AtomicUsize::new(0),
                            weak: AtomicUsize::new(0),
                            index,
                            value: UnsafeCell::new(MaybeUninit::uninit()),
                        }),
                        free: UnsafeCell::new(u64::MAX),
                        records: self,
                    });
                    let chunk = NonNull::from(Box::leak(chunk));
                    pool.with_room.push(chunk);
                    chunk
                },
            };
            // SAFETY: a chunk listed in the pool is alive (freed only once unlisted, under this
            // lock), and its free mask is only touched under this lock.
            let free = unsafe { &mut *chunk.as_ref().free.get() };
            let index = free.trailing_zeros() as usize;
            *free &= !(1u64 << index);
            if *free == 0 {
                pool.with_room.pop();
            }
            // SAFETY: the slots are the chunk's first field (`repr(C)`) and `index < CHUNK`. Made
            // from the chunk's own pointer, so that `give_back` may step back to the chunk.
            unsafe { chunk.cast::<Slot<T>>().add(index) }
        };
        // SAFETY: the slot was free: no handle to it exists, and its last user's writes happen
        // before (it was given back under the pool's lock, taken above).
        unsafe {
            let slot = slot.as_ref();
            (*slot.value.get()).write(value);
            slot.strong.store(1, Ordering::Relaxed);
            slot.weak.store(1, Ordering::Relaxed);
        }
        Record { slot }
    }

    /// Gives a slot back (its value already dropped); frees its chunk once every slot of it is
    /// free, unless it is the only chunk with room.
    ///
    /// # Safety
    /// `slot` is in a chunk of this slab, and no handle to it is left.
    unsafe fn give_back(slot: NonNull<Slot<T>>) {
        // SAFETY: the slots are the chunk's first field (`repr(C)`), and `index` is the slot's.
        let (chunk, index) = unsafe {
            let index = slot.as_ref().index;
            (slot.sub(index).cast::<Chunk<T>>(), index)
        };
        // SAFETY: the chunk is alive: this slot of it is not free yet.
        let records = unsafe { chunk.as_ref() }.records;
        let mut pool = lock(&records.pool);
        // SAFETY: touched under the pool's lock only.
        let free = unsafe { &mut *chunk.as_ref().free.get() };
        let was_full = *free == 0;
        *free |= 1u64 << index;
        if *free == u64::MAX && pool.with_room.len() > 1 {
            // Every slot free, and another chunk has room: no handle points into this one.
            pool.with_room.retain(|listed| *listed != chunk);
            drop(pool);
            // SAFETY: made by `Box::leak` in `insert`, unlisted, no slot in use.
            drop(unsafe { Box::from_raw(chunk.as_ptr()) });
        } else if was_full {
            pool.with_room.push(chunk);
        }
    }
}

impl<T: 'static> Record<T> {
    /// A weak handle on the same record.
    pub(crate) fn downgrade(this: &Record<T>) -> WeakRecord<T> {
        if this.slot().weak.fetch_add(1, Ordering::Relaxed) > MAX_COUNT {
            std::process::abort();
        }
        WeakRecord { slot: this.slot }
    }

    fn slot(&self) -> &Slot<T> {
        // SAFETY: a record's slot is taken for as long as a handle on it exists.
        unsafe { self.slot.as_ref() }
    }
}

/// Releases one weak count of `slot` (a weak handle's, or the records' shared one); gives the
/// slot back on the last.
///
/// # Safety
/// The caller holds the count it releases, and does not use the slot after.
unsafe fn release_weak<T: 'static>(slot: NonNull<Slot<T>>) {
    // SAFETY: the count held keeps the slot taken.
    if unsafe { slot.as_ref() }.weak.fetch_sub(1, Ordering::Release) != 1 {
        return;
    }
    fence(Ordering::Acquire);
    // SAFETY: that was the last count: no handle is left.
    unsafe { Records::give_back(slot) };
}

impl<T: 'static> Clone for Record<T> {
    fn clone(&self) -> Record<T> {
        if self.slot().strong.fetch_add(1, Ordering::Relaxed) > MAX_COUNT {
            std::process::abort();
        }
        Record { slot: self.slot }
    }
}

impl<T: 'static> Drop for Record<T> {
    fn drop(&mut self) {
        // SAFETY: this handle's count keeps the slot taken until released below.
        let slot = unsafe { self.slot.as_ref() };
        if slot.strong.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        // The records' shared weak count, released last — also should the value's drop panic
        // (the slot is given back all the same, as `Arc` does).
        let _shared_weak = WeakRecord { slot: self.slot };
        // SAFETY: the last strong handle: the value is dropped once, and nothing reads it after.
        unsafe { (*slot.value.get()).assume_init_drop() };
    }
}

impl<T: 'static> std::ops::Deref for Record<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: written before the first handle, dropped only after the last strong one.
        unsafe { (*self.slot().value.get()).assume_init_ref() }
    }
}

impl<T: std::fmt::Debug + 'static> std::fmt::Debug for Record<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl<T: 'static> WeakRecord<T> {
    /// A strong handle, if the record's value is still alive.
    pub(crate) fn upgrade(&self) -> Option<Record<T>> {
        // SAFETY: this handle's weak count keeps the slot taken.
        let slot = unsafe { self.slot.as_ref() };
        let mut strong = slot.strong.load(Ordering::Relaxed);
        loop {
            if strong == 0 {
                return None;
            }
            if strong > MAX_COUNT {
                std::process::abort();
            }
            match slot.strong.compare_exchange_weak(strong, strong + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(Record { slot: self.slot }),
                Err(now) => strong = now,
            }
        }
    }
}

impl<T: 'static> Clone for WeakRecord<T> {
    fn clone(&self) -> WeakRecord<T> {
        // SAFETY: this handle's weak count keeps the slot taken.
        if unsafe { self.slot.as_ref() }.weak.fetch_add(1, Ordering::Relaxed) > MAX_COUNT {
            std::process::abort();
        }
        WeakRecord { slot: self.slot }
    }
}

impl<T: 'static> Drop for WeakRecord<T> {
    fn drop(&mut self) {
        // SAFETY: this handle's weak count, not used after.
        unsafe { release_weak(self.slot) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>, #[allow(dead_code)] [u64; 4]);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn chunks<T>(records: &Records<T>) -> usize {
        lock(&records.pool).with_room.len()
    }

    #[test]
    fn a_record_is_dropped_once_by_its_last_strong_handle_and_weak_handles_see_it_go() {
        static RECORDS: Records<Counted> = Records::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let record = RECORDS.insert(Counted(drops.clone(), [7; 4]));
        let weak = Record::downgrade(&record);
        let other = record.clone();
        assert_eq!(other.slot, record.slot);
        drop(record);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        let upgraded = weak.upgrade().expect("alive while a strong handle is");
        assert_eq!(upgraded.1, [7; 4]);
        drop((other, upgraded));
        assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped with its last strong handle");
        assert!(weak.upgrade().is_none());
        drop(weak);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn slots_are_reused_and_empty_chunks_freed() {
        static RECORDS: Records<Counted> = Records::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut records: Vec<Record<Counted>> =
            (0..10 * CHUNK).map(|i| RECORDS.insert(Counted(drops.clone(), [i as u64; 4]))).collect();
        // Full chunks are not listed; each record still reads its own value.
        assert_eq!(chunks(&RECORDS), 0);
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.1, [i as u64; 4]);
        }
        // One freed slot of a full chunk lists it; the next record takes that slot.
        let freed = records.swap_remove(3);
        let weak = Record::downgrade(&freed);
        drop(freed);
        assert_eq!(chunks(&RECORDS), 0, "a slot with a weak handle left is not free yet");
        drop(weak);
        assert_eq!(chunks(&RECORDS), 1);
        records.push(RECORDS.insert(Counted(drops.clone(), [99; 4])));
        assert_eq!(chunks(&RECORDS), 0, "the free slot was reused");
        // Everything dropped: the chunks are freed but one, kept for the next record.
        records.clear();
        assert_eq!(drops.load(Ordering::SeqCst), 10 * CHUNK + 1);
        assert_eq!(chunks(&RECORDS), 1);
    }

    /// Panics when dropped.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("dropped");
        }
    }

    #[test]
    fn a_value_whose_drop_panics_still_gives_its_slot_back() {
        static RECORDS: Records<Bomb> = Records::new();
        let first = RECORDS.insert(Bomb);
        let slot = first.slot;
        let weak = Record::downgrade(&first);
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(first))).is_err());
        assert!(weak.upgrade().is_none());
        drop(weak);
        // The slot is free again: the next record takes it.
        let next = RECORDS.insert(Bomb);
        assert_eq!(next.slot, slot);
        std::mem::forget(next);
    }

    #[test]
    fn handles_shared_across_threads_drop_every_record_once() {
        static RECORDS: Records<Counted> = Records::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let drops = drops.clone();
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for i in 0..5_000u64 {
                        let record = RECORDS.insert(Counted(drops.clone(), [t, i, 0, 0]));
                        let weak = Record::downgrade(&record);
                        let clone = record.clone();
                        let handed = std::thread::spawn(move || {
                            assert_eq!(clone.1[1], i);
                            drop(clone);
                            weak.upgrade().map(|record| record.1[1])
                        });
                        if i % 3 == 0 {
                            kept.push(record);
                        } else {
                            drop(record);
                        }
                        if let Ok(Some(read)) = handed.join() {
                            assert_eq!(read, i);
                        }
                        if kept.len() > 100 {
                            kept.drain(..50);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        assert_eq!(drops.load(Ordering::SeqCst), 4 * 5_000);
        assert_eq!(chunks(&RECORDS), 1, "every chunk freed but one");
    }
}
