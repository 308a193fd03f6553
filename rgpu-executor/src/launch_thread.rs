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
//!
//! The queue is a ring of slots with one writer (the session) and one
//! reader (this thread), each launch's parameter block inline in its slot
//! (ARCHITECTURE 7a). Through a channel, the thread, which bounds the
//! launch rate, missed on the channel's counters, the message's slot, and
//! the parameter block behind a pointer, one after the other, and freed
//! the session's allocation: on the H200 host it took 3.45-3.67 µs per
//! launch against the driver's 2.92-3.03 natively. Here it reads the
//! session's count of queued launches once per run of them, and a slot's
//! lines, which the processor fetches together.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use log::{info, warn};

use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::stage_samples::StageSamples;

use crate::cpu_list::CpuList;
use crate::CuResult;

/// Launches queued at most; a session that gets further ahead waits.
const QUEUE_DEPTH: usize = 256;
/// Launches between two stores of the thread's count while it has more
/// queued (it stores it too whenever it catches up with the session).
/// Each store after the session read the count takes its line back from
/// the session's core, and the driver's next locked instruction waits for
/// that: once per launch while the session polls a full queue or looks at
/// a stream's completion, when the count was stored after each launch.
const DONE_STORED_EVERY: u64 = 16;
/// Parameter bytes a slot carries inline; a larger block (rare: most
/// kernels take a few pointers and sizes) travels in its own allocation.
const INLINE_PARAMS: usize = 192;
/// Polls of the fence before it yields the CPU between them.
const FENCE_SPINS: u32 = 2_000;
/// Launches left queued when a session that found the queue full queues
/// again: it refills half the queue in one go instead of one slot per
/// launch the driver takes, so it can sleep in between.
const REFILL_BELOW: u64 = QUEUE_DEPTH as u64 / 2;
/// Pauses between two looks at a full queue: each look takes the line the
/// launch thread writes next, so the session looks a few times per launch
/// rather than continually.
const FULL_QUEUE_PAUSES: u32 = 64;
/// How long a session waiting for its queue to drain to [`REFILL_BELOW`]
/// sleeps between looks once it has polled for the spin time: half a
/// queue holds hundreds of microseconds of launches, so the thread never
/// runs dry meanwhile.
const FULL_QUEUE_NAP: Duration = Duration::from_micros(20);
/// A wait for the session between two launches that the thread's profile
/// counts as one (shorter ones are the queue's own cost).
const COUNTED_GAP: Duration = Duration::from_micros(1);

/// One kernel launch, as `cuLaunchKernel` takes it, but its parameters.
#[derive(Clone, Copy)]
pub(crate) struct Launch {
    pub function: sys::CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: sys::CUstream,
}

// SAFETY: the function and stream are driver handles, valid on any thread
// of the process; the session keeps them alive until a fence has seen the
// launch through (destroying either is a command, which fences first).
unsafe impl Send for Launch {}

/// A queued launch and its parameter block, in this order: the thread
/// reads the launch, the length and a small block from the slot's first
/// line or two, and `spilled`, at its end, only for a block that did not
/// fit inline. It writes none of it for an inline block: a line the
/// session wrote last that the thread wrote too would go back and forth
/// between their cores (377-419 ns a transfer between two vCPUs of the
/// H200 host).
#[repr(C)]
struct Slot {
    launch: Launch,
    params_len: usize,
    inline: [u8; INLINE_PARAMS],
    /// A block larger than `inline`.
    spilled: Option<Vec<u8>>,
}

impl Slot {
    fn is_spilled(&self) -> bool {
        self.params_len > INLINE_PARAMS
    }

    fn params(&self) -> &[u8] {
        if self.is_spilled() {
            self.spilled.as_deref().unwrap_or_default()
        } else {
            self.inline.get(..self.params_len).unwrap_or_default()
        }
    }
}

/// A slot on cache lines of its own.
#[repr(align(64))]
struct SlotCell(UnsafeCell<Slot>);

// SAFETY: a slot is written only by the session, while the thread has
// finished with it (`done` past it), and read only by the thread, once the
// session published it (`queued` past it): never by both at once.
unsafe impl Sync for SlotCell {}

/// The ring and its counters, each counter on a cache line of its own:
/// the session writes `queued` per launch, the thread `done` every
/// [`DONE_STORED_EVERY`] launches and when it catches up, and the session
/// reads `failure` after every command.
struct Shared {
    slots: Box<[SlotCell]>,
    /// Launches the session queued.
    queued: CacheLine<AtomicU64>,
    /// Launches the driver has had, as the thread last stored it (behind by
    /// fewer than [`DONE_STORED_EVERY`] while it has more queued; exact once
    /// it caught up).
    done: CacheLine<AtomicU64>,
    /// The first error a launch met since the session last asked (0: none).
    failure: CacheLine<AtomicU32>,
    /// The thread is parked, or about to (it looks at `queued` once more
    /// after saying so): the session unparks it after queueing.
    parked: CacheLine<AtomicBool>,
    /// The session is gone: the thread ends once the ring is empty.
    closed: AtomicBool,
}

impl Shared {
    fn slot(&self, launch: u64) -> Option<&SlotCell> {
        self.slots.get(slot_index(launch))
    }
}

/// The slot (and the session's copy of its stream) of the `launch`-th
/// launch queued.
fn slot_index(launch: u64) -> usize {
    (launch % QUEUE_DEPTH as u64) as usize
}

#[repr(align(64))]
struct CacheLine<T>(T);

/// The context handle, for the thread to make current.
struct ContextHandle(sys::CUcontext);
// SAFETY: only passed to cuCtxSetCurrent; the context outlives the thread
// (joined before the context is destroyed).
unsafe impl Send for ContextHandle {}

/// What the thread calls for a launch (the driver's, or a test's).
pub(crate) type LaunchFn = fn(&Launch, &[u8]) -> CuResult<()>;

/// How a launch thread runs.
#[derive(Debug, Clone)]
pub(crate) struct LaunchThreadOptions {
    /// How long it polls an empty queue before it parks.
    pub spin: Duration,
    /// It logs where its time went when it ends ([`ThreadProfile`]).
    pub profile: bool,
    /// The CPUs it runs on (`None`: where the scheduler puts it).
    pub cpus: Option<CpuList>,
}

pub(crate) struct LaunchThread {
    /// Launches queued, the session's own count.
    queued: u64,
    /// `done` as last read: room is known without reading it again.
    done_seen: u64,
    /// The stream of each slot's launch, the session's own copy (the
    /// thread never reads it): what [`LaunchThread::has_queued_on`] looks
    /// at without touching the slots the thread reads.
    streams: Box<[sys::CUstream]>,
    /// How long a full queue is polled before the session naps between
    /// looks.
    spin: Duration,
    /// When the caller last launched itself ([`Self::launch_here_after_idle`]).
    launched_here_at: Option<Instant>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LaunchThread {
    /// A thread that makes `ctx` current with `make_current`, then launches
    /// with `launch` (both call the driver; tests pass their own), as
    /// `options` say.
    pub fn start(
        ctx: sys::CUcontext,
        make_current: fn(sys::CUcontext) -> CuResult<()>,
        launch: LaunchFn,
        options: &LaunchThreadOptions,
    ) -> std::io::Result<LaunchThread> {
        let LaunchThreadOptions {
            spin,
            profile,
            ref cpus,
        } = *options;
        let cpus = cpus.clone();
        let null_launch = Launch {
            function: std::ptr::null_mut(),
            grid: [0; 3],
            block: [0; 3],
            shared_mem_bytes: 0,
            stream: std::ptr::null_mut(),
        };
        let slots = (0..QUEUE_DEPTH)
            .map(|_| {
                SlotCell(UnsafeCell::new(Slot {
                    launch: null_launch,
                    params_len: 0,
                    inline: [0; INLINE_PARAMS],
                    spilled: None,
                }))
            })
            .collect();
        let shared = Arc::new(Shared {
            slots,
            queued: CacheLine(AtomicU64::new(0)),
            done: CacheLine(AtomicU64::new(0)),
            failure: CacheLine(AtomicU32::new(CUDA_SUCCESS)),
            parked: CacheLine(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
        });
        let context = ContextHandle(ctx);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rgpu-launch".into())
            .spawn(move || {
                if let Some(cpus) = cpus {
                    if let Err(e) = cpus.pin_current_thread() {
                        // The daemon pinned a thread to them at start-up:
                        // only a cpuset changed since refuses them.
                        warn!("cuda: a launch thread stays unpinned: CPUs {cpus}: {e}");
                    }
                }
                let mut profile = profile.then(ThreadProfile::default);
                run(
                    &context,
                    &thread_shared,
                    make_current,
                    launch,
                    spin,
                    profile.as_mut(),
                );
                if let Some(summary) = profile.and_then(|p| p.summary()) {
                    info!("launch thread: {summary}");
                }
            })?;
        Ok(LaunchThread {
            queued: 0,
            done_seen: 0,
            streams: vec![std::ptr::null_mut(); QUEUE_DEPTH].into_boxed_slice(),
            spin,
            launched_here_at: None,
            shared,
            thread: Some(thread),
        })
    }

    fn thread_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Queues `launch` with its parameter block; gives both back if the
    /// thread is gone (the caller launches itself).
    ///
    /// A session that launches faster than the driver takes its launches
    /// fills the queue. It then waits until the thread has taken half of
    /// it ([`REFILL_BELOW`]), polling the thread's count of launches done
    /// for the spin time, then napping between looks (the thread never
    /// wakes a waiting session: that would be a system call on the thread
    /// that bounds the launch rate). Waiting for one free slot kept the
    /// session's CPU busy for as long as the burst lasted, one slot per
    /// driver call, beside the guest's thread and the launch thread.
    pub fn queue(&mut self, launch: Launch, params: Vec<u8>) -> Result<(), (Launch, Vec<u8>)> {
        if self.queued.saturating_sub(self.done_seen) >= QUEUE_DEPTH as u64 {
            self.done_seen = self.shared.done.0.load(Ordering::Acquire);
            let mut full_since: Option<Instant> = None;
            while self.queued.saturating_sub(self.done_seen) > REFILL_BELOW {
                if !self.thread_alive() {
                    return Err((launch, params));
                }
                if full_since.get_or_insert_with(Instant::now).elapsed() < self.spin {
                    for _ in 0..FULL_QUEUE_PAUSES {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::sleep(FULL_QUEUE_NAP);
                }
                self.done_seen = self.shared.done.0.load(Ordering::Acquire);
            }
        }
        if !self.thread_alive() {
            return Err((launch, params));
        }
        let Some(cell) = self.shared.slot(self.queued) else {
            return Err((launch, params));
        };
        // SAFETY: the slot of launch `queued` is the thread's again: `done`
        // (read with acquire) is past `queued - QUEUE_DEPTH`, the launch
        // that last used it, which the thread finished with before it
        // stored `done`; the thread reads it again only once `queued`
        // below is published.
        let slot = unsafe { &mut *cell.0.get() };
        if let Some(stream) = self.streams.get_mut(slot_index(self.queued)) {
            *stream = launch.stream;
        }
        slot.launch = launch;
        slot.params_len = params.len();
        match slot.inline.get_mut(..params.len()) {
            // `params` is dropped here: freed on the thread that allocated
            // it. A spilled block before it went when the thread was done.
            Some(inline) => inline.copy_from_slice(&params),
            None => slot.spilled = Some(params),
        }
        self.queued += 1;
        // Sequentially consistent with the thread's `parked` store and
        // `queued` load: one of the two sees the other (no lost wake-up).
        self.shared.queued.0.store(self.queued, Ordering::SeqCst);
        if self.shared.parked.0.load(Ordering::SeqCst) {
            if let Some(thread) = &self.thread {
                thread.thread().unpark();
            }
        }
        Ok(())
    }

    /// Whether the caller should make this launch itself: the thread is
    /// parked with nothing queued, and the caller made none so within the
    /// spin time. The first launch after an idle spell then runs at once
    /// instead of after the thread's wake-up on another CPU (tens of
    /// microseconds on a VM's idle vCPU), and a lone launch wakes nobody;
    /// the next one of a burst is queued, which wakes the thread.
    pub fn launch_here_after_idle(&mut self) -> bool {
        if !self.shared.parked.0.load(Ordering::SeqCst) {
            return false;
        }
        self.done_seen = self.shared.done.0.load(Ordering::Acquire);
        if self.done_seen < self.queued {
            return false;
        }
        let now = Instant::now();
        if self
            .launched_here_at
            .is_some_and(|at| now.saturating_duration_since(at) < self.spin)
        {
            return false;
        }
        self.launched_here_at = Some(now);
        true
    }

    /// Returns once the driver has had every queued launch.
    pub fn fence(&mut self) {
        let mut spins = 0u32;
        loop {
            self.done_seen = self.shared.done.0.load(Ordering::Acquire);
            if self.done_seen >= self.queued {
                break;
            }
            if spins < FENCE_SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            if !self.thread_alive() {
                break;
            }
        }
    }

    /// Whether launches may be queued that the driver has not had, by the
    /// thread's count as last read (at a fence, or when the queue looked
    /// full): `false` is exact, as the count only grows; reading it anew
    /// here would take its line from the thread's core.
    pub fn may_have_queued(&self) -> bool {
        self.done_seen < self.queued
    }

    /// Whether a launch on `stream` is queued and not yet handed to the
    /// driver: the driver would call the stream idle without it, so a query
    /// of the stream must not ask the driver then. Launches are queued on
    /// the session's thread alone, the caller's: none can come meanwhile.
    pub fn has_queued_on(&self, stream: sys::CUstream) -> bool {
        let done = self.shared.done.0.load(Ordering::Acquire);
        (done..self.queued).any(|launch| self.streams.get(slot_index(launch)) == Some(&stream))
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
        self.shared.closed.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                warn!("cuda: a context's launch thread panicked");
            }
        }
    }
}

fn run(
    context: &ContextHandle,
    shared: &Shared,
    make_current: fn(sys::CUcontext) -> CuResult<()>,
    launch: LaunchFn,
    spin: Duration,
    mut profile: Option<&mut ThreadProfile>,
) {
    let code = match make_current(context.0) {
        Ok(()) => CUDA_SUCCESS,
        Err(code) => {
            warn!("cuda: a launch thread cannot make its context current: CUDA error {code}");
            code
        }
    };
    let mut idle_since: Option<Instant> = None;
    // This thread alone counts: a store, not a locked add.
    let mut done = 0u64;
    let mut stored = 0u64;
    // The session's count as last read: launches below it are read without
    // loading it again.
    let mut queued = 0u64;
    loop {
        if done == queued {
            // Caught up with what it saw: a fence may wait for this count.
            if stored != done {
                shared.done.0.store(done, Ordering::Release);
                stored = done;
            }
            queued = shared.queued.0.load(Ordering::Acquire);
        }
        if done == queued {
            if shared.closed.load(Ordering::Acquire) {
                // Queued before the close: the session fenced them first.
                return;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            shared.parked.0.store(true, Ordering::SeqCst);
            if shared.queued.0.load(Ordering::SeqCst) == done
                && !shared.closed.load(Ordering::SeqCst)
            {
                if let Some(profile) = profile.as_deref_mut() {
                    profile.parked();
                }
                // Spurious returns are fine: the loop looks again.
                std::thread::park();
            }
            shared.parked.0.store(false, Ordering::Relaxed);
            idle_since = None;
            continue;
        }
        idle_since = None;
        let Some(cell) = shared.slot(done) else {
            return;
        };
        // SAFETY: the session wrote this slot before it published `queued`
        // past it (read with acquire), and writes it again only after
        // `done` passes it (below, after the last use).
        let slot = unsafe { &mut *cell.0.get() };
        let called_at = profile.as_ref().map(|_| Instant::now());
        let result = match code {
            CUDA_SUCCESS => launch(&slot.launch, slot.params()),
            failed => Err(failed),
        };
        if let (Some(profile), Some(called_at)) = (profile.as_deref_mut(), called_at) {
            profile.launched(called_at, Instant::now());
        }
        if slot.is_spilled() {
            // Only a spilled block's slot: its last line stays the
            // session's otherwise.
            slot.spilled = None;
        }
        if let Err(failed) = result {
            let _ = shared.failure.0.compare_exchange(
                CUDA_SUCCESS,
                failed,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        done += 1;
        if done.is_multiple_of(DONE_STORED_EVERY) {
            shared.done.0.store(done, Ordering::Release);
            stored = done;
        }
    }
}

/// Where a launch thread's time went (`--profile-launches`, issue 9): the
/// driver's calls, and the waits between two of them while the thread
/// polled an empty queue (the session had not queued the next launch yet:
/// reading the ring, or draining the queue for a call that must follow
/// the launches). The rate a burst reaches is the driver's time alone only
/// if those waits are nothing.
#[derive(Debug, Default)]
struct ThreadProfile {
    launches: u64,
    driver: Duration,
    /// Waits between launches of [`COUNTED_GAP`] or more, not ended by
    /// parking.
    waits: u64,
    waited: Duration,
    /// All time between two launches the thread did not park in.
    between: Duration,
    parks: u64,
    last_return: Option<Instant>,
    /// Each launch's driver call and the gap before it (0 after a park).
    samples: StageSamples<2>,
}

impl ThreadProfile {
    fn launched(&mut self, called_at: Instant, returned_at: Instant) {
        self.launches += 1;
        let call = returned_at.saturating_duration_since(called_at);
        self.driver += call;
        let gap = self
            .last_return
            .map_or(Duration::ZERO, |t| called_at.saturating_duration_since(t));
        self.between += gap;
        if gap >= COUNTED_GAP {
            self.waits += 1;
            self.waited += gap;
        }
        self.samples.push([call, gap]);
        self.last_return = Some(returned_at);
    }

    /// The thread parks: the next gap is not a wait within a burst.
    fn parked(&mut self) {
        self.parks += 1;
        self.last_return = None;
    }

    fn summary(&self) -> Option<String> {
        if self.launches == 0 {
            return None;
        }
        let busy = self.driver + self.between;
        Some(format!(
            "{} launches, driver {} ns each (median {} ns); between launches {} ns each \
             (median {} ns), {} waits of 1 us or more for {:.2} ms: {:.1}% of the time \
             between parks; parked {} times",
            self.launches,
            self.driver.as_nanos() / u128::from(self.launches),
            self.samples.median(0),
            self.between.as_nanos() / u128::from(self.launches),
            self.samples.median(1),
            self.waits,
            self.waited.as_secs_f64() * 1e3,
            100.0 * self.waited.as_secs_f64() / busy.as_secs_f64().max(1e-9),
            self.parks,
        ))
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
    /// the test, its grid's x the launch), with the parameter block.
    static SEEN: Mutex<Vec<(usize, u32, Vec<u8>)>> = Mutex::new(Vec::new());

    fn made_current(_: sys::CUcontext) -> CuResult<()> {
        Ok(())
    }

    /// Test 8's launches wait until this opens.
    static GATE_OF_TEST_8: AtomicBool = AtomicBool::new(false);

    /// Slow, so that a fence has something to wait for; launch 3 of a
    /// function at address 2 fails.
    fn fake_launch(launch: &Launch, params: &[u8]) -> CuResult<()> {
        std::thread::sleep(Duration::from_micros(300));
        let test = launch.function as usize;
        while test == 8 && !GATE_OF_TEST_8.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(50));
        }
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((test, launch.grid[0], params.to_vec()));
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
        }
    }

    fn params() -> Vec<u8> {
        vec![0; 8]
    }

    fn seen_with_params(test: usize) -> Vec<(u32, Vec<u8>)> {
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(t, _, _)| *t == test)
            .map(|(_, n, params)| (*n, params.clone()))
            .collect()
    }

    fn seen_by(test: usize) -> Vec<u32> {
        seen_with_params(test).into_iter().map(|(n, _)| n).collect()
    }

    fn options() -> LaunchThreadOptions {
        LaunchThreadOptions {
            spin: SPIN,
            profile: false,
            cpus: None,
        }
    }

    fn thread() -> LaunchThread {
        LaunchThread::start(std::ptr::null_mut(), made_current, fake_launch, &options())
            .unwrap_or_else(|e| panic!("no thread: {e}"))
    }

    #[test]
    fn a_fence_returns_after_every_queued_launch_in_order() {
        let mut launcher = thread();
        for n in 0..20 {
            assert!(launcher.queue(launch(1, n), params()).is_ok());
        }
        launcher.fence();
        assert_eq!(seen_by(1), (0..20).collect::<Vec<_>>());
        assert_eq!(launcher.take_failure(), None);
    }

    /// Test 12's launches wait until this opens.
    static GATE_OF_TEST_12: AtomicBool = AtomicBool::new(false);

    fn launch_of_test_12(_: &Launch, _: &[u8]) -> CuResult<()> {
        while !GATE_OF_TEST_12.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// After an idle spell the caller makes the first launch itself (the
    /// thread is parked, nothing queued), and leaves the next of a burst to
    /// the thread; while a launch is queued it never launches itself.
    #[test]
    fn a_launch_after_idle_is_the_callers_and_the_rest_of_a_burst_the_threads() {
        // A spin long enough that the burst below falls within it.
        let options = LaunchThreadOptions {
            spin: Duration::from_millis(200),
            ..options()
        };
        let mut launcher = LaunchThread::start(
            std::ptr::null_mut(),
            made_current,
            launch_of_test_12,
            &options,
        )
        .unwrap_or_else(|e| panic!("no thread: {e}"));
        let parked = |launcher: &LaunchThread| launcher.shared.parked.0.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !parked(&launcher) {
            assert!(Instant::now() < deadline, "the thread never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(launcher.launch_here_after_idle());
        assert!(parked(&launcher), "a lone launch woke the thread");
        assert!(
            !launcher.launch_here_after_idle(),
            "a burst stayed on the caller"
        );
        // Held at the gate: queued and not done, parked or not.
        assert!(launcher.queue(launch(12, 0), params()).is_ok());
        assert!(!launcher.launch_here_after_idle());
        GATE_OF_TEST_12.store(true, Ordering::Release);
        launcher.fence();
        assert_eq!(launcher.take_failure(), None);
        assert!(!launcher.may_have_queued());
    }

    #[test]
    fn queued_launches_are_known_without_asking_the_thread_until_a_fence() {
        let mut launcher = thread();
        assert!(!launcher.may_have_queued());
        assert!(launcher.queue(launch(11, 0), params()).is_ok());
        assert!(launcher.may_have_queued());
        // Done by now, but not looked at: still "maybe".
        std::thread::sleep(Duration::from_millis(5));
        assert!(launcher.may_have_queued());
        launcher.fence();
        assert!(!launcher.may_have_queued());
    }

    #[test]
    fn a_failed_launch_is_reported_once_and_later_ones_still_run() {
        let mut launcher = thread();
        for n in 0..6 {
            assert!(launcher.queue(launch(2, n), params()).is_ok());
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
            assert!(launcher.queue(launch(5, n), params()).is_ok());
            // The launch that found the queue full waited for half of it.
            if n as usize == QUEUE_DEPTH {
                let done = launcher.shared.done.0.load(Ordering::Acquire);
                assert!(
                    launcher.queued - done <= QUEUE_DEPTH as u64 / 2 + 1,
                    "{} launches still queued",
                    launcher.queued - done
                );
            }
        }
        launcher.fence();
        assert_eq!(seen_by(5), (0..count).collect::<Vec<_>>());
    }

    #[test]
    fn parameter_blocks_arrive_whole_inline_and_spilled() {
        let mut launcher = thread();
        let sizes = [
            0,
            1,
            8,
            INLINE_PARAMS - 1,
            INLINE_PARAMS,
            INLINE_PARAMS + 1,
            4096,
        ];
        let block = |n: usize| {
            (0..sizes[n])
                .map(|i| (i * 7 + n) as u8)
                .collect::<Vec<u8>>()
        };
        // Twice round the ring: every slot is reused, after a spilled
        // block and after an inline one.
        let count = 2 * QUEUE_DEPTH + 3;
        for i in 0..count {
            let n = i % sizes.len();
            assert!(launcher.queue(launch(6, i as u32), block(n)).is_ok());
        }
        launcher.fence();
        let seen = seen_with_params(6);
        assert_eq!(seen.len(), count);
        for (i, (n, params)) in seen.into_iter().enumerate() {
            assert_eq!(n, i as u32);
            assert_eq!(params, block(i % sizes.len()), "launch {i}");
        }
    }

    #[test]
    fn a_parked_thread_is_woken_by_the_next_launch() {
        let mut launcher = thread();
        assert!(launcher.queue(launch(7, 0), params()).is_ok());
        launcher.fence();
        // Past the spin time the thread parks.
        std::thread::sleep(SPIN * 20);
        assert!(launcher.shared.parked.0.load(Ordering::SeqCst));
        assert!(launcher.queue(launch(7, 1), params()).is_ok());
        launcher.fence();
        assert_eq!(seen_by(7), vec![0, 1]);
    }

    #[test]
    fn dropping_the_thread_runs_what_was_queued_first() {
        let mut launcher = thread();
        for n in 0..10 {
            assert!(launcher.queue(launch(3, n), params()).is_ok());
        }
        drop(launcher);
        assert_eq!(seen_by(3).len(), 10);
    }

    #[test]
    fn a_context_that_cannot_be_made_current_fails_every_launch() {
        fn refused(_: sys::CUcontext) -> CuResult<()> {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        let mut launcher =
            LaunchThread::start(std::ptr::null_mut(), refused, fake_launch, &options())
                .unwrap_or_else(|e| panic!("no thread: {e}"));
        assert!(launcher.queue(launch(4, 0), params()).is_ok());
        launcher.fence();
        assert_eq!(launcher.take_failure(), Some(CUDA_ERROR_INVALID_VALUE));
        assert!(seen_by(4).is_empty());
    }

    #[test]
    fn the_profile_counts_waits_within_bursts_not_across_parks() {
        let us = Duration::from_micros;
        let t0 = Instant::now();
        let mut profile = ThreadProfile::default();
        assert_eq!(profile.summary(), None);
        profile.launched(t0, t0 + us(3));
        // Half a microsecond between: the queue's own cost, not a wait.
        profile.launched(
            t0 + Duration::from_nanos(3_500),
            t0 + Duration::from_nanos(6_500),
        );
        profile.launched(t0 + us(10), t0 + us(13));
        profile.parked();
        profile.launched(t0 + us(500), t0 + us(503));
        assert_eq!(profile.launches, 4);
        assert_eq!(profile.driver, us(12));
        assert_eq!(profile.waits, 1);
        assert_eq!(profile.waited, Duration::from_nanos(3_500));
        assert_eq!(profile.between, us(4));
        assert_eq!(profile.parks, 1);
        let summary = profile.summary().unwrap_or_default();
        assert!(
            summary.starts_with("4 launches, driver 3000 ns each (median 3000 ns)"),
            "{summary}"
        );
        // 3.5 us waited of 12 us in the driver and 4 us between launches.
        assert!(
            summary.contains("1 waits of 1 us or more for 0.00 ms: 21.9%"),
            "{summary}"
        );
    }

    /// Test 10's launches wait until this opens.
    static GATE_OF_TEST_10: AtomicBool = AtomicBool::new(false);

    /// Each launch takes 1 ms once the gate opens, so every stored count
    /// stays up for 16 ms: an observer on a loaded machine (20 µs each
    /// let a busy two-core host skip the step between) still sees it.
    fn gated_launch(_: &Launch, _: &[u8]) -> CuResult<()> {
        while !GATE_OF_TEST_10.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(50));
        }
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    }

    #[test]
    fn the_count_of_launches_done_is_stored_in_steps_and_exactly_when_caught_up() {
        let mut launcher =
            LaunchThread::start(std::ptr::null_mut(), made_current, gated_launch, &options())
                .unwrap_or_else(|e| panic!("no thread: {e}"));
        let count = 2 * DONE_STORED_EVERY + 5;
        for n in 0..count {
            assert!(launcher.queue(launch(10, n as u32), params()).is_ok());
        }
        GATE_OF_TEST_10.store(true, Ordering::Release);
        let mut seen = vec![];
        loop {
            let done = launcher.shared.done.0.load(Ordering::Acquire);
            if seen.last() != Some(&done) {
                seen.push(done);
            }
            if done == count {
                break;
            }
            std::thread::yield_now();
        }
        // Never a count between two steps but the last, which a fence
        // waits for; never one going back.
        assert!(
            seen.iter()
                .all(|&done| done.is_multiple_of(DONE_STORED_EVERY) || done == count),
            "{seen:?}"
        );
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert!(seen.contains(&DONE_STORED_EVERY), "{seen:?}");
        launcher.fence();
        assert!(!launcher.has_queued_on(std::ptr::null_mut()));
    }

    /// The CPUs test 9's launches ran on.
    static CPUS_OF_TEST_9: Mutex<Vec<Vec<usize>>> = Mutex::new(Vec::new());

    fn record_cpus(_: &Launch, _: &[u8]) -> CuResult<()> {
        CPUS_OF_TEST_9
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(crate::cpu_list::allowed_cpus());
        Ok(())
    }

    #[test]
    fn a_thread_given_cpus_launches_on_them_alone() {
        let before = crate::cpu_list::allowed_cpus();
        let last = before.last().copied().unwrap_or_default();
        let cpus = CpuList::parse(&last.to_string(), crate::cpu_list::present_cpus())
            .unwrap_or_else(|e| panic!("{e}"));
        let options = LaunchThreadOptions {
            cpus: Some(cpus),
            ..options()
        };
        let mut launcher =
            LaunchThread::start(std::ptr::null_mut(), made_current, record_cpus, &options)
                .unwrap_or_else(|e| panic!("no thread: {e}"));
        for n in 0..3 {
            assert!(launcher.queue(launch(9, n), params()).is_ok());
        }
        launcher.fence();
        let seen = std::mem::take(
            &mut *CPUS_OF_TEST_9
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        assert_eq!(seen, vec![vec![last]; 3]);
        // The session's thread is not pinned with it.
        assert_eq!(crate::cpu_list::allowed_cpus(), before);
    }

    #[test]
    fn a_stream_is_known_busy_while_a_launch_on_it_is_queued() {
        let mut launcher = thread();
        let (one, two) = (without_provenance_mut(0x10), without_provenance_mut(0x20));
        assert!(!launcher.has_queued_on(one));
        for n in 0..4 {
            let on_one = Launch {
                stream: one,
                ..launch(8, n)
            };
            assert!(launcher.queue(on_one, params()).is_ok());
        }
        // The first waits at the gate: none has reached the "driver".
        assert!(launcher.has_queued_on(one));
        assert!(!launcher.has_queued_on(two));
        GATE_OF_TEST_8.store(true, Ordering::Release);
        launcher.fence();
        assert!(!launcher.has_queued_on(one));
        assert_eq!(seen_by(8), vec![0, 1, 2, 3]);
    }
}
