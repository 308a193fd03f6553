//! A context's launch thread: kernel launches handed to the driver on a
//! thread of their own, so that the session's thread reads and checks the
//! next command while the driver spends its few microseconds on this one
//! (issue 9: a launch through rgpu cost the driver's time plus the
//! session's, one after the other; on the H200 host cuLaunchKernel alone
//! takes 3.2–4.2 µs of CPU time).
//!
//! Launches keep their order (one queue, one thread). Every other call of
//! the context is ordered after them by [`LaunchThread::fence`], which the
//! session calls before anything but a launch. A launch's error reaches the
//! session at the next fence, as the error of an unanswered command does.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use log::warn;

use rgpu_proto::cuda_result::CUDA_SUCCESS;

use crate::CuResult;

/// Launches queued at most; a session that gets further ahead waits.
const QUEUE_DEPTH: usize = 256;
/// Polls of the fence before it yields the CPU between them.
const FENCE_SPINS: u32 = 2_000;
/// Pauses between two looks at a full queue: each look takes the line the
/// launch thread writes next, so the session looks a few times per launch
/// rather than continually.
const FULL_QUEUE_PAUSES: u32 = 64;

/// One kernel launch, as `cuLaunchKernel` takes it.
pub(crate) struct Launch {
    pub function: sys::CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: sys::CUstream,
    pub params: Vec<u8>,
}

// SAFETY: the function and stream are driver handles, valid on any thread
// of the process; the session keeps them alive until a fence has seen the
// launch through (destroying either is a command, which fences first).
unsafe impl Send for Launch {}

/// On cache lines of their own: the thread counts `done` at every launch,
/// the session reads `failure` after every command.
struct Shared {
    /// Launches the driver has had.
    done: CacheLine<AtomicU64>,
    /// The first error a launch met since the session last asked (0: none).
    failure: CacheLine<AtomicU32>,
}

#[repr(align(64))]
struct CacheLine<T>(T);

/// The context handle, for the thread to make current.
struct ContextHandle(sys::CUcontext);
// SAFETY: only passed to cuCtxSetCurrent; the context outlives the thread
// (joined before the context is destroyed).
unsafe impl Send for ContextHandle {}

pub(crate) struct LaunchThread {
    queue: Option<SyncSender<Launch>>,
    queued: u64,
    /// How long a full queue is polled before the session blocks on it.
    spin: Duration,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LaunchThread {
    /// A thread that makes `ctx` current with `make_current`, then launches
    /// with `launch` (both call the driver; tests pass their own), polling
    /// its queue for `spin` before it sleeps.
    pub fn start(
        ctx: sys::CUcontext,
        make_current: fn(sys::CUcontext) -> CuResult<()>,
        launch: fn(&Launch) -> CuResult<()>,
        spin: Duration,
    ) -> std::io::Result<LaunchThread> {
        let (queue, receiver) = sync_channel(QUEUE_DEPTH);
        let shared = Arc::new(Shared {
            done: CacheLine(AtomicU64::new(0)),
            failure: CacheLine(AtomicU32::new(CUDA_SUCCESS)),
        });
        let context = ContextHandle(ctx);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rgpu-launch".into())
            .spawn(move || {
                run(
                    &context,
                    &receiver,
                    &thread_shared,
                    make_current,
                    launch,
                    spin,
                )
            })?;
        Ok(LaunchThread {
            queue: Some(queue),
            queued: 0,
            spin,
            shared,
            thread: Some(thread),
        })
    }

    /// Queues `launch`; gives it back if the thread is gone (the caller
    /// launches it itself).
    ///
    /// A session that launches faster than the driver takes its launches
    /// fills the queue (unless the scheduler's fences drain it first, as
    /// on the H200 host, ARCHITECTURE 7a). It waits for room by polling the
    /// thread's count of launches done, as long as the thread polls for
    /// work (the spin time), before it blocks:
    /// - a blocked sender must be woken by the launch thread, a futex call
    ///   on the thread that bounds the launch rate;
    /// - polling the channel itself reads the line the thread
    ///   compare-and-swaps at every launch, and the thread waits for it;
    ///   the count is a plain store there.
    ///
    /// On the build host, two threads modelling a launch (3.5 µs) and a
    /// decode (1 µs) reached 0.73-0.86 of the launch thread's rate with a
    /// blocking send (28% of sends parked), 0.87-0.93 polling the channel,
    /// and 0.95 polling the count.
    pub fn queue(&mut self, mut launch: Launch) -> Result<(), Launch> {
        let Some(queue) = &self.queue else {
            return Err(launch);
        };
        let room = |done: u64| self.queued.saturating_sub(done) < QUEUE_DEPTH as u64;
        let mut full_since: Option<Instant> = None;
        let sent = loop {
            if room(self.shared.done.0.load(Ordering::Acquire)) {
                match queue.try_send(launch) {
                    Ok(()) => break Ok(()),
                    Err(TrySendError::Disconnected(returned)) => break Err(returned),
                    Err(TrySendError::Full(returned)) => launch = returned,
                }
            }
            if full_since.get_or_insert_with(Instant::now).elapsed() >= self.spin {
                break queue.send(launch).map_err(|returned| returned.0);
            }
            for _ in 0..FULL_QUEUE_PAUSES {
                std::hint::spin_loop();
            }
        };
        if sent.is_ok() {
            self.queued += 1;
        }
        sent
    }

    /// Returns once the driver has had every queued launch.
    pub fn fence(&self) {
        let mut spins = 0u32;
        while self.shared.done.0.load(Ordering::Acquire) < self.queued {
            if spins < FENCE_SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            if self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                break;
            }
        }
    }

    /// The first error of a launch since the last call, if any.
    pub fn take_failure(&self) -> Option<u32> {
        // A load first: a swap would take the line from the thread's core
        // after every command.
        if self.shared.failure.0.load(Ordering::Acquire) == CUDA_SUCCESS {
            return None;
        }
        match self.shared.failure.0.swap(CUDA_SUCCESS, Ordering::AcqRel) {
            CUDA_SUCCESS => None,
            code => Some(code),
        }
    }
}

impl Drop for LaunchThread {
    fn drop(&mut self) {
        self.fence();
        // Closing the queue ends the thread.
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!("cuda: a context's launch thread panicked");
            }
        }
    }
}

fn run(
    context: &ContextHandle,
    receiver: &Receiver<Launch>,
    shared: &Shared,
    make_current: fn(sys::CUcontext) -> CuResult<()>,
    launch: fn(&Launch) -> CuResult<()>,
    spin: Duration,
) {
    let code = match make_current(context.0) {
        Ok(()) => CUDA_SUCCESS,
        Err(code) => {
            warn!("cuda: a launch thread cannot make its context current: CUDA error {code}");
            code
        }
    };
    let mut idle_since: Option<Instant> = None;
    // This thread alone counts: a store, not a locked add, per launch.
    let mut done = 0u64;
    loop {
        let next = match receiver.try_recv() {
            Ok(next) => next,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < spin {
                    std::hint::spin_loop();
                    continue;
                }
                match receiver.recv() {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
        };
        idle_since = None;
        let result = match code {
            CUDA_SUCCESS => launch(&next),
            failed => Err(failed),
        };
        if let Err(failed) = result {
            let _ = shared.failure.0.compare_exchange(
                CUDA_SUCCESS,
                failed,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        done += 1;
        shared.done.0.store(done, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::without_provenance_mut;
    use std::sync::Mutex;

    use rgpu_proto::cuda_result::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES};

    use super::*;

    const SPIN: Duration = Duration::from_micros(50);

    /// What the fake driver saw, per test (the function's address names
    /// the test, its grid's x the launch).
    static SEEN: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());

    fn made_current(_: sys::CUcontext) -> CuResult<()> {
        Ok(())
    }

    /// Slow, so that a fence has something to wait for; launch 3 of a
    /// function at address 2 fails.
    fn fake_launch(launch: &Launch) -> CuResult<()> {
        std::thread::sleep(Duration::from_micros(300));
        let test = launch.function as usize;
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((test, launch.grid[0]));
        match (test, launch.grid[0]) {
            (2, 3) => Err(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
            _ => Ok(()),
        }
    }

    fn launch(test: usize, n: u32) -> Launch {
        Launch {
            function: without_provenance_mut(test),
            grid: [n, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
            stream: std::ptr::null_mut(),
            params: vec![0; 8],
        }
    }

    fn seen_by(test: usize) -> Vec<u32> {
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(t, _)| *t == test)
            .map(|(_, n)| *n)
            .collect()
    }

    fn thread() -> LaunchThread {
        LaunchThread::start(std::ptr::null_mut(), made_current, fake_launch, SPIN)
            .unwrap_or_else(|e| panic!("no thread: {e}"))
    }

    #[test]
    fn a_fence_returns_after_every_queued_launch_in_order() {
        let mut launcher = thread();
        for n in 0..20 {
            assert!(launcher.queue(launch(1, n)).is_ok());
        }
        launcher.fence();
        assert_eq!(seen_by(1), (0..20).collect::<Vec<_>>());
        assert_eq!(launcher.take_failure(), None);
    }

    #[test]
    fn a_failed_launch_is_reported_once_and_later_ones_still_run() {
        let mut launcher = thread();
        for n in 0..6 {
            assert!(launcher.queue(launch(2, n)).is_ok());
        }
        launcher.fence();
        assert_eq!(
            launcher.take_failure(),
            Some(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        );
        assert_eq!(launcher.take_failure(), None);
        assert_eq!(seen_by(2), (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn launches_past_a_full_queue_wait_for_room_and_keep_their_order() {
        let mut launcher = thread();
        let count = u32::try_from(QUEUE_DEPTH).unwrap_or(u32::MAX) + 40;
        for n in 0..count {
            assert!(launcher.queue(launch(5, n)).is_ok());
        }
        launcher.fence();
        assert_eq!(seen_by(5), (0..count).collect::<Vec<_>>());
    }

    #[test]
    fn dropping_the_thread_runs_what_was_queued_first() {
        let mut launcher = thread();
        for n in 0..10 {
            assert!(launcher.queue(launch(3, n)).is_ok());
        }
        drop(launcher);
        assert_eq!(seen_by(3).len(), 10);
    }

    #[test]
    fn a_context_that_cannot_be_made_current_fails_every_launch() {
        fn refused(_: sys::CUcontext) -> CuResult<()> {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        let mut launcher = LaunchThread::start(std::ptr::null_mut(), refused, fake_launch, SPIN)
            .unwrap_or_else(|e| panic!("no thread: {e}"));
        assert!(launcher.queue(launch(4, 0)).is_ok());
        launcher.fence();
        assert_eq!(launcher.take_failure(), Some(CUDA_ERROR_INVALID_VALUE));
        assert!(seen_by(4).is_empty());
    }
}
