//! The futex calls by which two processes sharing memory wake each other:
//! the tenant page's grant and drain words, and a local channel's wake word
//! (`channel::OFFSET_WAKE`). Shared (not private) futexes: the word lies in
//! a `MAP_SHARED` file mapping, which the kernel keys by file and offset,
//! so a waiter and a waker in different processes meet.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Waits while `word` holds `expected`, at most `timeout`. Returns early on
/// a wake-up, a signal or a spurious wake: callers look again.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos()),
    };
    // SAFETY: `word` is a live, aligned u32; the kernel reads it and the
    // timeout only.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &timeout as *const libc::timespec,
        )
    };
}

/// Wakes every waiter on `word`.
pub fn wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; waking touches nothing else.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_when_the_word_moved() {
        let word = AtomicU32::new(5);
        let started = Instant::now();
        wait(&word, 4, Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn wait_times_out_without_a_wake() {
        let word = AtomicU32::new(0);
        let started = Instant::now();
        wait(&word, 0, Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn wake_ends_a_wait() {
        let word = Arc::new(AtomicU32::new(0));
        let waker = Arc::clone(&word);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            waker.fetch_add(1, Ordering::SeqCst);
            wake(&waker);
        });
        let started = Instant::now();
        while word.load(Ordering::SeqCst) == 0 {
            wait(&word, 0, Duration::from_secs(10));
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        thread.join().unwrap();
    }
}
