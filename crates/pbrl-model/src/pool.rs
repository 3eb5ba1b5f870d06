//! Data-parallel loops on candle's CPU thread pool.
//!
//! candle runs its element-wise ops on its own pool (the calling thread and
//! `CANDLE_NUM_THREADS − 1` workers, which spin between ops so the next one starts at once).
//! Work sent to a second pool (rayon's) runs while those workers spin: on a 2-core machine
//! three threads then share two cores and every product waits for the one descheduled. So
//! pbrl's own kernels (matrix products, fused ops, AdamW) run on candle's pool too, through
//! [`map`] and [`Chunks`].
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

/// The threads a loop here runs on: the caller and candle's pool workers.
pub fn threads() -> usize {
    candle_core::utils::barrier_pool().n_workers() + 1
}

thread_local! {
    /// Whether this thread is running a loop's share: a loop started inside another runs on
    /// the thread that started it (candle's pool takes one caller at a time and would wait
    /// for itself; its own workers run nested work inline the same way).
    static IN_LOOP: Cell<bool> = const { Cell::new(false) };
}

/// `f(0), …, f(n − 1)` on the pool, their results in index order (so a sum over them is the
/// same under any thread count).
pub fn map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    if IN_LOOP.with(Cell::get) {
        return (0..n).map(f).collect();
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_LOOP.with(|l| l.set(false));
        }
    }
    IN_LOOP.with(|l| l.set(true));
    let _reset = Reset;
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    let slots = Chunks::new(&mut out, 1);
    candle_core::utils::barrier_pool().execute_chunked(n, |range| {
        for i in range {
            slots.get(i)[0] = Some(f(i));
        }
    });
    out.into_iter().map(|r| r.expect("every index ran")).collect()
}

/// A mutable slice cut into chunks of `len` elements (the last may be shorter) that threads
/// take one each: [`Chunks::get`] hands each chunk out once, so no two threads alias it.
pub struct Chunks<'a, T> {
    ptr: *mut T,
    total: usize,
    len: usize,
    taken: Vec<AtomicBool>,
    _data: PhantomData<&'a mut [T]>,
}

// SAFETY: a chunk goes to one thread only (`get` checks), so sharing `Chunks` shares disjoint
// `&mut [T]`s, which is what `T: Send` allows.
unsafe impl<T: Send> Sync for Chunks<'_, T> {}
unsafe impl<T: Send> Send for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    pub fn new(data: &'a mut [T], len: usize) -> Self {
        let len = len.max(1);
        let count = data.len().div_ceil(len);
        Chunks {
            ptr: data.as_mut_ptr(),
            total: data.len(),
            len,
            taken: (0..count).map(|_| AtomicBool::new(false)).collect(),
            _data: PhantomData,
        }
    }

    /// How many chunks there are.
    pub fn count(&self) -> usize {
        self.taken.len()
    }

    /// Chunk `i`. Panics when it was taken before: a loop visits each index once.
    #[allow(clippy::mut_from_ref)]
    pub fn get(&self, i: usize) -> &'a mut [T] {
        assert!(!self.taken[i].swap(true, Ordering::Relaxed), "chunk {i} taken twice");
        let start = i * self.len;
        let len = self.len.min(self.total - start);
        // SAFETY: in bounds (i < count), and this chunk was never handed out before, so no
        // other reference to these elements exists.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// `f(i, chunk i of data)` for every chunk of `len` elements, on the pool.
pub fn for_each_chunk_mut<T: Send>(data: &mut [T], len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunks = Chunks::new(data, len);
    map(chunks.count(), |i| f(i, chunks.get(i)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once_and_results_keep_their_order() {
        let mut data = vec![0u32; 1003];
        for_each_chunk_mut(&mut data, 10, |i, c| c.iter_mut().for_each(|v| *v += i as u32 + 1));
        assert!(data.iter().enumerate().all(|(j, &v)| v == (j / 10) as u32 + 1));
        assert_eq!(map(257, |i| i * i), (0..257).map(|i| i * i).collect::<Vec<_>>());
        assert!(map(0, |i| i).is_empty());
    }

    /// A loop inside a loop's body runs (on the thread that started it) instead of waiting for
    /// the pool it is part of. Only a pool of two or more threads can wait for itself, so this
    /// checks something when run as `CANDLE_NUM_THREADS=2 cargo test --lib pool` (the test
    /// script pins one thread).
    #[test]
    fn a_loop_inside_a_loop_runs() {
        let sums = map(8, |i| map(100, |j| i * j).into_iter().sum::<usize>());
        assert_eq!(sums, (0..8).map(|i| i * 4950).collect::<Vec<_>>());
    }

    #[test]
    #[should_panic(expected = "taken twice")]
    fn a_chunk_is_handed_out_once() {
        let mut data = vec![0u8; 4];
        let chunks = Chunks::new(&mut data, 2);
        let _a = chunks.get(1);
        let _b = chunks.get(1);
    }
}
