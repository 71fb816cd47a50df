//! A global allocator that counts live heap bytes, to measure what a waiter or a held lock
//! keeps allocated. Included with `#[path]` by the binaries that measure (one allocator per
//! binary: it is process-wide).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live heap bytes.
pub struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Live allocations by size, in 8-byte classes up to 4 KiB (the last class: everything larger).
const CLASSES: usize = 513;
static LIVE_BY_CLASS: [AtomicUsize; CLASSES] = [const { AtomicUsize::new(0) }; CLASSES];

/// Live bytes of allocations larger than 4 KiB, by the power of two at or above their size.
static LIVE_LARGE_BYTES: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

fn large(size: usize) -> Option<usize> {
    (size > 4096).then(|| size.next_power_of_two().trailing_zeros() as usize)
}

fn class(size: usize) -> usize {
    size.div_ceil(8).min(CLASSES - 1)
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BY_CLASS[class(layout.size())].fetch_add(1, Ordering::Relaxed);
            if let Some(log2) = large(layout.size()) {
                LIVE_LARGE_BYTES[log2].fetch_add(layout.size(), Ordering::Relaxed);
            }
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BY_CLASS[class(layout.size())].fetch_sub(1, Ordering::Relaxed);
        if let Some(log2) = large(layout.size()) {
            LIVE_LARGE_BYTES[log2].fetch_sub(layout.size(), Ordering::Relaxed);
        }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Live heap bytes of the process now.
pub fn live_heap_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed) as u64
}

/// Live allocations now, by size class: `(largest size of the class, count)`, for every class
/// (the last: larger than 4 KiB). Compare two of them to see what a phase left allocated.
#[allow(dead_code)]
pub fn live_by_size() -> Vec<(usize, i64)> {
    LIVE_BY_CLASS.iter().enumerate().map(|(class, live)| (class * 8, live.load(Ordering::Relaxed) as i64)).collect()
}

/// Live bytes of allocations larger than 4 KiB, by size (`(largest size of the bucket, bytes)`,
/// buckets of powers of two).
#[allow(dead_code)]
pub fn live_large_bytes() -> Vec<(usize, i64)> {
    LIVE_LARGE_BYTES
        .iter()
        .enumerate()
        .map(|(log2, bytes)| (1usize << log2, bytes.load(Ordering::Relaxed) as i64))
        .collect()
}
