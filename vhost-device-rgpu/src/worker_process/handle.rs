//! A worker process as the connection process sees it: the link to send on,
//! the completions waiting for its `Done`s, and a reader thread that
//! completes them, reaps the worker when it ends and completes whatever was
//! still waiting then (the worker's death released all its GPU work).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::os::fd::RawFd;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use rgpu_session::Completion;

use super::accounting::Accounting;
use super::launcher::WorkerLauncher;
use super::link::Link;
use super::message::{FromWorker, ToWorker, MAX_MESSAGE_BYTES};
use crate::shared_counters::SharedCounters;

/// How long a worker whose link ended may take to exit on its own.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Tokens are unique in the connection process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, Box<dyn Completion>>,
    /// The worker has ended: nothing will be completed by it any more.
    ended: bool,
    /// Completions still waiting when the worker ended are dropped, not
    /// completed (the device was reset: their guest requests are void).
    discard: bool,
    /// This process killed it (a reset, the connection's end, a retirement
    /// past its grace): its end is no news.
    killed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One worker process and what the connection has told it.
pub struct WorkerHandle {
    id: u64,
    pid: u32,
    link: Arc<Link>,
    shared: Arc<Shared>,
    accounting: Arc<Accounting>,
    /// The page it counts into, until it is adopted.
    counters: Option<SharedCounters>,
    reader: Option<JoinHandle<()>>,
    /// Blobs mapped in the worker.
    pub blobs_mapped: HashSet<u32>,
    /// Contexts it runs.
    pub contexts: BTreeSet<u32>,
}

impl WorkerHandle {
    /// Starts worker `id` of the connection.
    /// Starts worker `id` of the connection. It starts its executor at
    /// once, but counts as a worker only once [`WorkerHandle::adopt`]ed: a
    /// standby kept warm for the next guest process is no worker yet.
    pub fn start(launcher: &WorkerLauncher, id: u64) -> io::Result<WorkerHandle> {
        let (child, link, counters) = launcher.spawn(id)?;
        let pid = child.id();
        let accounting = Arc::clone(launcher.accounting());
        let link = Arc::new(link);
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
        });
        let reader = {
            let link = Arc::clone(&link);
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("rgpu-worker-{id}"))
                .spawn({
                    let accounting = Arc::clone(&accounting);
                    move || {
                        read_until_end(id, child, &link, &shared);
                        accounting.end_worker(id, pid);
                    }
                })?
        };
        debug!("worker {id}: process {pid} started");
        Ok(WorkerHandle {
            id,
            pid,
            link,
            shared,
            accounting,
            counters: Some(counters),
            reader: Some(reader),
            blobs_mapped: HashSet::new(),
            contexts: BTreeSet::new(),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// It serves a guest process from now on: its counters count.
    pub fn adopt(&mut self, guest_process: &str) {
        if let Some(counters) = self.counters.take() {
            self.accounting.add_worker(self.id, counters);
            info!(
                "worker {}: process {} serves guest process {guest_process}",
                self.id, self.pid
            );
            // Ended before it was added: account its end now.
            if !self.is_alive() {
                self.accounting.end_worker(self.id, self.pid);
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the worker still runs.
    pub fn is_alive(&self) -> bool {
        !self.shared.lock().ended
    }

    /// Sends `message` (with `fds`); false if the worker is gone.
    pub fn send(&self, message: &ToWorker, fds: &[RawFd]) -> bool {
        match self.link.send(&message.encode(), fds) {
            Ok(()) => true,
            Err(e) => {
                debug!("worker {}: cannot send {message:?}: {e}", self.id);
                false
            }
        }
    }

    /// Sends the message `make` builds with a fresh token, and completes
    /// `completion` when the worker says it is done with it, or when the
    /// worker ends, or now if it cannot be sent.
    pub fn send_then(&self, make: impl FnOnce(u64) -> ToWorker, completion: Box<dyn Completion>) {
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.shared.lock();
            if pending.ended {
                drop(pending);
                completion.complete();
                return;
            }
            pending.waiting.insert(token, completion);
        }
        if !self.send(&make(token), &[]) {
            let completion = self.shared.lock().waiting.remove(&token);
            if let Some(completion) = completion {
                completion.complete();
            }
        }
    }

    /// Completions waiting for this worker.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting.len()
    }

    /// Kills the worker and waits until it is reaped. With `discard`, what
    /// still waited for it is dropped instead of completed.
    pub fn kill(mut self, discard: bool) {
        self.stop(discard);
    }

    /// Lets the worker end on its own (it sees the end of its link), its
    /// answers from now on dropped, as a kill's would be.
    fn end_unanswered(&self) {
        {
            let mut pending = self.shared.lock();
            pending.discard = true;
            pending.killed = true;
        }
        self.link.shutdown_write();
    }

    /// Whether the worker has been reaped.
    fn has_ended(&self) -> bool {
        self.reader.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Sends SIGKILL unless the worker was reaped already.
    fn signal_kill(&self, discard: bool) {
        signal_kill(self.pid, &self.shared, discard);
    }

    /// Lets the worker end its sessions and exit on its own (it sees the
    /// end of its link), from a thread of its own; kills it if it has not
    /// exited after `grace` (a kernel that never ends). What waits for it
    /// is completed once it is gone. The caller keeps the [`Retiring`] so
    /// that its own end waits for (or cuts short) the retirement.
    pub fn retire(self, grace: Duration) -> Option<Retiring> {
        self.link.shutdown_write();
        let id = self.id;
        let pid = self.pid;
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("rgpu-retire-{id}"))
            .spawn(move || {
                let deadline = Instant::now() + grace;
                while !self.reader.as_ref().is_none_or(JoinHandle::is_finished)
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                drop(self);
            });
        match spawned {
            Ok(thread) => Some(Retiring {
                pid,
                shared,
                thread,
            }),
            Err(e) => {
                warn!("worker {id}: cannot start its retirement: {e}");
                None
            }
        }
    }

    fn stop(&mut self, discard: bool) {
        let Some(reader) = self.reader.take() else {
            return;
        };
        self.signal_kill(discard);
        if reader.join().is_err() {
            warn!("worker {}: reader thread panicked", self.id);
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// A worker that is ending on its own ([`WorkerHandle::retire`]).
pub struct Retiring {
    pid: u32,
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

impl Retiring {
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Sends SIGKILL to `pid` unless the reader reaped it already (checked
/// under the lock it reaps under, so the pid is never a recycled one).
fn signal_kill(pid: u32, shared: &Shared, discard: bool) {
    let mut pending = shared.lock();
    pending.discard |= discard;
    pending.killed = true;
    if !pending.ended {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill only sends a signal to our unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Ends every worker, running or retiring, then waits until each is
/// reaped and accounted (a reset, or the connection's end: what waited for
/// them is dropped). With a `grace`, the running ones first get that long
/// to end their sessions on their own (which log their profiles as they
/// end); then, or at once, every one still there is killed.
pub fn kill_all(
    workers: impl IntoIterator<Item = WorkerHandle>,
    retiring: Vec<Retiring>,
    grace: Duration,
) {
    let workers: Vec<WorkerHandle> = workers.into_iter().collect();
    if !grace.is_zero() {
        for worker in &workers {
            worker.end_unanswered();
        }
        let deadline = Instant::now() + grace;
        while workers.iter().any(|w| !w.has_ended()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for worker in &workers {
        worker.signal_kill(true);
    }
    for worker in &retiring {
        signal_kill(worker.pid, &worker.shared, true);
    }
    for worker in workers {
        worker.kill(true);
    }
    for worker in retiring {
        let _ = worker.thread.join();
    }
}

/// The reader thread: completes `Done`s until the worker ends, then reaps
/// it and completes (or, after a reset, drops) what still waited.
fn read_until_end(id: u64, mut child: Child, link: &Link, shared: &Shared) {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES + 1];
    loop {
        match link.recv(&mut buf) {
            Ok(Some((len, _fds))) => {
                match buf.get(..len).map(FromWorker::decode) {
                    Some(Ok(FromWorker::Done { token })) => {
                        // Completed under the lock so that a reset (which
                        // takes it) never races a response into a reset
                        // queue; once it has, a worker still answering
                        // (killed, or ending on its own) answers no one.
                        let mut pending = shared.lock();
                        if let Some(completion) = pending.waiting.remove(&token) {
                            if !pending.discard {
                                completion.complete();
                            }
                        }
                    }
                    _ => {
                        warn!("worker {id}: undecodable message; ending it");
                        break;
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                warn!("worker {id}: link failed: {e}");
                break;
            }
        }
    }
    link.shutdown();
    let pid = child.id();
    // Its link ends as it exits; if it still runs a moment later, it spoke
    // nonsense or closed its link while running on: end it.
    let deadline = Instant::now() + EXIT_GRACE;
    while !has_exited(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    if !has_exited(pid) && !shared.lock().ended {
        let _ = child.kill();
    }
    wait_for_exit(pid);
    // Reaped under the lock, so a kill never meets a recycled pid; the
    // process is gone and with it all its GPU work: nothing it held can
    // still touch guest memory.
    let mut pending = shared.lock();
    pending.ended = true;
    match child.wait() {
        Ok(status) if status.success() => debug!("worker {id}: process {pid} exited"),
        Ok(status) if pending.killed => debug!("worker {id}: process {pid} stopped: {status}"),
        Ok(status) => rgpu_session::warn_limited!(
            "worker {id}: process {pid} ended: {status}; its contexts are lost"
        ),
        Err(e) => warn!("worker {id}: cannot reap process {pid}: {e}"),
    }
    let waiting: Vec<_> = pending.waiting.drain().map(|(_, c)| c).collect();
    if pending.discard {
        drop(waiting);
    } else {
        for completion in waiting {
            completion.complete();
        }
    }
}

/// Whether child `pid` has ended, leaving it to be reaped.
fn has_exited(pid: u32) -> bool {
    // SAFETY: waitid writes into `info`, a plain struct; WNOWAIT leaves the
    // child unreaped, WNOHANG returns at once.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        )
    };
    // SAFETY: si_pid is valid to read after waitid filled `info` (zero when
    // no child has ended).
    rc == 0 && unsafe { info.si_pid() } != 0
}

/// Blocks until child `pid` has ended, leaving it to be reaped.
fn wait_for_exit(pid: u32) {
    loop {
        // SAFETY: waitid writes into `info`, a plain struct; WNOWAIT leaves
        // the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc =
            unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}
