//! Large copies between the application's memory and a channel's shared
//! areas, split across a few threads.
//!
//! A pageable copy passes through the guest's CPU: one thread's `memcpy`
//! reaches about half of what NVIDIA's driver stages natively, so a copy of
//! many MiB is the guest's copy speed, not the GPU's. The helpers live only
//! for the one API call that needs them (nothing survives into a `fork`ed
//! child, nothing runs between calls).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Default of `RGPU_COPY_THREADS` (the calling thread included).
pub const DEFAULT_COPY_THREADS: usize = 4;
/// Most threads a copy uses, whatever the environment asks.
pub const MAX_COPY_THREADS: usize = 16;
/// A copy shorter than this stays on the calling thread: starting helpers
/// would cost more than they save.
pub const CREW_MIN_BYTES: usize = 8 << 20;
/// Smallest part of one piece handed to a thread.
const MIN_PART: usize = 256 << 10;
/// How long an idle helper polls for the next part before sleeping: the
/// parts of one copy follow each other within tens of microseconds.
const HELPER_SPIN: Duration = Duration::from_micros(200);

/// Threads a large copy uses: `RGPU_COPY_THREADS` (1 turns helpers off),
/// at most the CPUs this process may run on.
pub fn copy_threads_from_env() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let asked = match std::env::var("RGPU_COPY_THREADS") {
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                log::warn!(
                    "RGPU_COPY_THREADS={value:?} is not a positive number; using {DEFAULT_COPY_THREADS}"
                );
                DEFAULT_COPY_THREADS
            }
        },
        Err(_) => DEFAULT_COPY_THREADS,
    };
    asked.min(cpus).clamp(1, MAX_COPY_THREADS)
}

/// One part of a copy.
struct Part {
    dst: *mut u8,
    src: *const u8,
    len: usize,
}

// SAFETY: a part names memory that `Crew::copy` keeps valid, and that no
// other thread touches, until the helper that took it reports it done;
// `copy` does not return before that.
unsafe impl Send for Part {}

#[derive(Default)]
struct Queue {
    parts: Vec<Part>,
    closing: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Parts in the queue, read by polling helpers without the lock.
    queued: AtomicUsize,
    /// Parts copied by helpers since the crew started.
    finished: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_all();
    }

    fn next_part(&self) -> Option<Part> {
        let deadline = Instant::now() + HELPER_SPIN;
        while self.queued.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        let mut queue = self.lock();
        loop {
            if let Some(part) = queue.parts.pop() {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Some(part);
            }
            if queue.closing {
                return None;
            }
            queue = self
                .wake
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn help(&self) {
        while let Some(part) = self.next_part() {
            // SAFETY: see `Part`: both ranges are valid for `len` bytes and
            // do not overlap (`Crew::copy`'s contract).
            unsafe { std::ptr::copy_nonoverlapping(part.src, part.dst, part.len) };
            self.finished.fetch_add(1, Ordering::Release);
        }
    }
}

/// Closes the crew when the call that runs it ends, even by unwinding, so
/// that the scope's join does not wait for helpers forever.
struct CloseOnDrop<'a>(&'a Shared);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The helper threads of one API call.
pub struct Crew<'a> {
    shared: &'a Shared,
    helpers: usize,
    handed_out: std::cell::Cell<usize>,
}

impl Crew<'_> {
    /// Copies `len` bytes from `src` to `dst`, split among the calling
    /// thread and the helpers; returns once every byte is copied.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// the two ranges must not overlap, and nothing else may write either
    /// range until this returns.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        let parts = (len / MIN_PART).clamp(1, self.helpers + 1);
        if parts == 1 {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            return;
        }
        // Cache-line aligned parts; the calling thread takes the last one.
        let part_len = len.div_ceil(parts).next_multiple_of(64);
        let mut handed = 0;
        let mut offset = 0;
        {
            let mut queue = self.shared.lock();
            while len - offset > part_len {
                queue.parts.push(Part {
                    // SAFETY: offset < len: inside both ranges.
                    dst: unsafe { dst.add(offset) },
                    // SAFETY: as above.
                    src: unsafe { src.add(offset) },
                    len: part_len,
                });
                handed += 1;
                offset += part_len;
            }
            self.shared.queued.fetch_add(handed, Ordering::AcqRel);
        }
        self.shared.wake.notify_all();
        // SAFETY: the caller's contract; [offset, len) is this thread's part.
        unsafe { std::ptr::copy_nonoverlapping(src.add(offset), dst.add(offset), len - offset) };
        let target = self.handed_out.get() + handed;
        let mut polls = 0u32;
        while self.shared.finished.load(Ordering::Acquire) < target {
            polls = polls.saturating_add(1);
            if polls < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.handed_out.set(target);
    }
}

/// Runs `work` with a crew of `threads - 1` helpers when `bytes` is large
/// enough to gain from one, else with a crew of none (every copy on the
/// calling thread).
pub fn with_crew<R>(threads: usize, bytes: usize, work: impl FnOnce(&Crew<'_>) -> R) -> R {
    let shared = Shared::default();
    let wanted = if bytes >= CREW_MIN_BYTES {
        threads.clamp(1, MAX_COPY_THREADS) - 1
    } else {
        0
    };
    if wanted == 0 {
        return work(&Crew {
            shared: &shared,
            helpers: 0,
            handed_out: std::cell::Cell::new(0),
        });
    }
    std::thread::scope(|scope| {
        let _close = CloseOnDrop(&shared);
        let mut helpers = 0;
        for _ in 0..wanted {
            let spawned = std::thread::Builder::new()
                .name("rgpu-copy".into())
                .spawn_scoped(scope, || shared.help());
            match spawned {
                Ok(_) => helpers += 1,
                Err(e) => {
                    log::debug!("copy helper not started ({e}); copying with {helpers}");
                    break;
                }
            }
        }
        work(&Crew {
            shared: &shared,
            helpers,
            handed_out: std::cell::Cell::new(0),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn a_crew_copies_every_byte_of_uneven_pieces() {
        let src = pattern(CREW_MIN_BYTES + 12345);
        let mut dst = vec![0u8; src.len()];
        with_crew(4, src.len(), |crew| {
            assert_eq!(crew.helpers, 3);
            // Pieces of odd sizes, as a copy's last piece is.
            let mut offset = 0;
            for piece in [3 << 20, 1, (1 << 20) + 7, MIN_PART - 1] {
                // SAFETY: both ranges lie inside their vectors, which are
                // distinct.
                unsafe {
                    crew.copy(
                        dst.as_mut_ptr().add(offset),
                        src.as_ptr().add(offset),
                        piece,
                    )
                };
                offset += piece;
            }
            let rest = src.len() - offset;
            // SAFETY: as above.
            unsafe { crew.copy(dst.as_mut_ptr().add(offset), src.as_ptr().add(offset), rest) };
        });
        assert!(dst == src, "copied bytes differ");
    }

    #[test]
    fn a_small_copy_starts_no_helpers() {
        let src = pattern(MIN_PART * 3);
        let mut dst = vec![0u8; src.len()];
        with_crew(8, src.len(), |crew| {
            assert_eq!(crew.helpers, 0);
            // SAFETY: distinct vectors of the same length.
            unsafe { crew.copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
        });
        assert!(dst == src);
    }

    #[test]
    fn helpers_end_when_the_work_panics() {
        let result = std::panic::catch_unwind(|| {
            with_crew(3, CREW_MIN_BYTES, |_crew| -> () { panic!("work failed") })
        });
        assert!(
            result.is_err(),
            "the panic reaches the caller; the scope joined"
        );
    }
}
