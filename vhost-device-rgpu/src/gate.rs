//! The parent's doorway: it accepts every connection and holds it until its
//! frontend speaks, then hands it to the standby connection process.
//!
//! A connection costs the parent only a descriptor until then, so silent
//! ones (a flood of them, or a frontend that connects and waits) neither
//! take a process nor hold up a frontend that speaks: a connection goes to
//! a process once it became readable (its first vhost-user message came;
//! checked with poll, not read, so the process gets the stream intact).
//! One that stays silent for the handshake timeout is closed; beyond
//! [`MAX_WAITING`] waiting connections, the oldest silent one is closed.
//! Connections that spoke wait, in order, for the next standby (the
//! supervisor keeps none while `--max-connections` processes live).
//!
//! The supervisor [`Gate::offer`]s each standby once it is ready; the next
//! connection that spoke is sent to it ([`handoff::send_connection`]). The
//! gate keeps its own copy until the supervisor says the standby has it
//! ([`Gate::taken`]): if the standby dies first, the connection goes to the
//! next one ([`Gate::withdraw`]).
//!
//! [`Gate::stop`] (a tenant removed, or the daemon exiting) ends the
//! accepting thread, which closes the listening socket and every waiting
//! connection.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};

use crate::handoff;

/// The most connections the parent holds at once (silent, or spoke and
/// waiting for a process). A new one beyond it closes the oldest silent
/// one; if none is silent, new ones wait in the listening socket's backlog.
pub const MAX_WAITING: usize = 1024;

/// Descriptors kept free of waiting connections: the parent's own (pipes
/// and counters of starting children, the stats socket, libraries).
const FD_RESERVE: usize = 128;

/// How often, at most, each kind of closing is logged (with a count).
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// How long to stop accepting after accept failed (out of descriptors,
/// say), so that a persistent failure does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// How often to look again when the waiting connections are at their
/// limit and none of them can be closed (they all spoke): handing one to a
/// standby makes room without waking the gate.
const FULL_RECHECK: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("cannot make the listening socket non-blocking: {0}")]
    NonBlocking(io::Error),
    #[error("cannot start the thread that accepts connections: {0}")]
    Thread(io::Error),
    #[error("cannot create the gate's stop event: {0}")]
    StopEvent(io::Error),
}

/// What the gate and the supervisor share.
#[derive(Default)]
struct Handoff {
    /// The ready standby (connection number, our end of its hand-off
    /// socket), while it has no connection yet.
    standby: Option<(u64, UnixStream)>,
    /// Connections whose frontend spoke, oldest first, waiting for a
    /// standby.
    ready: VecDeque<UnixStream>,
    /// Sent to a standby that has not said yet that it has them.
    in_flight: Vec<(u64, UnixStream)>,
}

impl Handoff {
    /// Sends the oldest connection that spoke to the standby, if there are
    /// both.
    fn dispatch(&mut self) {
        if self.ready.is_empty() {
            return;
        }
        let Some((conn, control)) = self.standby.take() else {
            return;
        };
        let Some(stream) = self.ready.pop_front() else {
            return;
        };
        match handoff::send_connection(&control, &stream) {
            Ok(()) => {
                debug!("connection {conn}: handed to its process");
                self.in_flight.push((conn, stream));
            }
            Err(e) => {
                // The standby is gone or broken; dropping our end of its
                // socket ends it if it is not, and the supervisor replaces
                // it when it ends.
                warn!("connection {conn}: cannot hand it to its process: {e}");
                self.ready.push_front(stream);
            }
        }
    }
}

/// The parent's accepting thread and what it shares with the supervisor.
pub struct Gate {
    handoff: Arc<Mutex<Handoff>>,
    /// An eventfd the accepting thread polls with everything else: written
    /// once, it makes the thread return.
    stop_event: Arc<OwnedFd>,
    doorway: Mutex<Option<JoinHandle<()>>>,
}

impl Gate {
    /// Starts accepting on `listener`; connections whose frontend says
    /// nothing for `handshake_timeout` are closed.
    pub fn start(listener: UnixListener, handshake_timeout: Duration) -> Result<Self, GateError> {
        listener
            .set_nonblocking(true)
            .map_err(GateError::NonBlocking)?;
        let handoff = Arc::new(Mutex::new(Handoff::default()));
        // SAFETY: eventfd takes no pointers; a failure is checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(GateError::StopEvent(io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let stop_event = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let mut doorway = Doorway {
            listener,
            stop_event: Arc::clone(&stop_event),
            handshake_timeout,
            limit: waiting_limit(),
            silent: VecDeque::new(),
            handoff: Arc::clone(&handoff),
            timed_out: Tally::default(),
            evicted: Tally::default(),
            accept_failed: Tally::default(),
            accept_paused_until: None,
        };
        let doorway = thread::Builder::new()
            .name("rgpu-accept".into())
            .spawn(move || doorway.run())
            .map_err(GateError::Thread)?;
        Ok(Self {
            handoff,
            stop_event,
            doorway: Mutex::new(Some(doorway)),
        })
    }

    /// Stops accepting: the accepting thread ends (closing the listening
    /// socket and the connections still waiting), and nothing more is
    /// handed to a standby. Returns once the thread has ended.
    pub fn stop(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one` to our eventfd; a full counter
        // (it cannot be: written once per stop) only fails.
        unsafe {
            libc::write(
                self.stop_event.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        let doorway = self
            .doorway
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(doorway) = doorway {
            if doorway.join().is_err() {
                error!("the accepting thread panicked");
            }
        }
        let mut handoff = self.lock();
        handoff.standby = None;
        handoff.ready.clear();
        handoff.in_flight.clear();
    }

    fn lock(&self) -> MutexGuard<'_, Handoff> {
        lock(&self.handoff)
    }

    /// Standby `conn` is ready: the next connection that spoke (now, if
    /// one waits) is sent to it through `control`, its hand-off socket.
    pub fn offer(&self, conn: u64, control: UnixStream) {
        let mut handoff = self.lock();
        handoff.standby = Some((conn, control));
        handoff.dispatch();
    }

    /// Standby `conn` said it has its connection: the gate's copy closes.
    pub fn taken(&self, conn: u64) {
        self.lock().in_flight.retain(|(c, _)| *c != conn);
    }

    /// Standby `conn` ended without saying it has a connection: it is no
    /// longer offered, and one sent to it goes to the next standby, first.
    pub fn withdraw(&self, conn: u64) {
        let mut handoff = self.lock();
        if handoff.standby.as_ref().is_some_and(|(c, _)| *c == conn) {
            handoff.standby = None;
        }
        if let Some(i) = handoff.in_flight.iter().position(|(c, _)| *c == conn) {
            let (_, stream) = handoff.in_flight.swap_remove(i);
            info!("connection {conn}: its process ended before taking it; it goes to the next");
            handoff.ready.push_front(stream);
        }
    }
}

fn lock(handoff: &Mutex<Handoff>) -> MutexGuard<'_, Handoff> {
    // A queue of sockets: nothing a panicking holder leaves half-done
    // matters more than serving on.
    handoff.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many connections may wait, given our descriptor limit (raised to
/// its hard limit first if it is lower than we need: silent connections
/// are cheap, but each is a descriptor).
fn waiting_limit() -> usize {
    let wanted = (MAX_WAITING + FD_RESERVE) as libc::rlim_t;
    // SAFETY: getrlimit/setrlimit read and write a plain struct.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return MAX_WAITING;
    }
    if limit.rlim_cur < wanted {
        let raised = libc::rlimit {
            rlim_cur: wanted.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    let available = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    // At least one, or nothing could ever be served.
    available.saturating_sub(FD_RESERVE).clamp(1, MAX_WAITING)
}

/// Counts closings of one kind and says how many in the log, at most once
/// per [`LOG_INTERVAL`] (silent connections are anyone's to open).
#[derive(Default)]
struct Tally {
    /// Not logged yet.
    pending: u64,
    total: u64,
    logged: Option<Instant>,
}

impl Tally {
    fn note(&mut self) {
        self.pending += 1;
        self.total += 1;
    }

    /// The counts to log now (pending, total), if due.
    fn due(&mut self, now: Instant) -> Option<(u64, u64)> {
        if self.pending == 0 || self.logged.is_some_and(|at| now < at + LOG_INTERVAL) {
            return None;
        }
        self.logged = Some(now);
        let pending = std::mem::take(&mut self.pending);
        Some((pending, self.total))
    }

    /// When counts now pending may be logged.
    fn next(&self) -> Option<Instant> {
        (self.pending > 0).then(|| {
            self.logged
                .map_or_else(Instant::now, |at| at + LOG_INTERVAL)
        })
    }
}

/// A connection whose frontend has not spoken yet.
struct Silent {
    stream: UnixStream,
    since: Instant,
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The accepting thread's state.
struct Doorway {
    listener: UnixListener,
    /// Readable once the gate is stopped.
    stop_event: Arc<OwnedFd>,
    handshake_timeout: Duration,
    /// The most connections waiting at once, silent or spoke.
    limit: usize,
    /// Oldest first; all have the same timeout, so the first ends first.
    silent: VecDeque<Silent>,
    handoff: Arc<Mutex<Handoff>>,
    timed_out: Tally,
    evicted: Tally,
    accept_failed: Tally,
    accept_paused_until: Option<Instant>,
}

impl Doorway {
    fn run(&mut self) {
        let mut poll_fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let now = Instant::now();
            self.close_expired(now);
            self.log_due(now);

            let accepting = self.accepting(now);
            poll_fds.clear();
            poll_fds.push(pollfd(self.stop_event.as_raw_fd()));
            if accepting {
                poll_fds.push(pollfd(self.listener.as_raw_fd()));
            }
            poll_fds.extend(self.silent.iter().map(|s| pollfd(s.stream.as_raw_fd())));
            let timeout = self.poll_timeout(now, accepting);
            // SAFETY: poll reads and writes `poll_fds.len()` pollfd entries
            // of the vector, which lives across the call.
            let rc = unsafe {
                libc::poll(
                    poll_fds.as_mut_ptr(),
                    poll_fds.len() as libc::nfds_t,
                    timeout,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    // Cannot happen with valid arguments; do not spin.
                    error!("poll on waiting connections failed: {e}");
                    thread::sleep(ACCEPT_PAUSE);
                }
                continue;
            }
            if poll_fds[0].revents != 0 {
                debug!("the gate is stopped: no more connections are accepted");
                return;
            }
            let (listener_ready, silent_events) = if accepting {
                (poll_fds[1].revents != 0, &poll_fds[2..])
            } else {
                (false, &poll_fds[1..])
            };
            // Before accepting: the events are for `silent` as it is now.
            self.pass_on_the_speaking(silent_events);
            if listener_ready {
                self.accept_all();
            }
        }
    }

    /// Whether to poll the listener now.
    fn accepting(&mut self, now: Instant) -> bool {
        if self.accept_paused_until.is_some_and(|until| now < until) {
            return false;
        }
        self.accept_paused_until = None;
        // Full: accept only if a silent connection can make room.
        !self.silent.is_empty() || self.waiting() < self.limit
    }

    fn waiting(&self) -> usize {
        self.silent.len() + lock(&self.handoff).ready.len()
    }

    /// Milliseconds until the next thing to do without an event (-1: none).
    fn poll_timeout(&self, now: Instant, accepting: bool) -> libc::c_int {
        let deadlines = [
            self.silent
                .front()
                .map(|s| s.since + self.handshake_timeout),
            self.timed_out.next(),
            self.evicted.next(),
            self.accept_failed.next(),
            self.accept_paused_until,
            (!accepting).then(|| now + FULL_RECHECK),
        ];
        match deadlines.into_iter().flatten().min() {
            // Rounded up: waking early would only loop.
            Some(at) => {
                let ms = at.saturating_duration_since(now).as_micros().div_ceil(1000);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
            None => -1,
        }
    }

    fn close_expired(&mut self, now: Instant) {
        while self
            .silent
            .front()
            .is_some_and(|s| now >= s.since + self.handshake_timeout)
        {
            self.silent.pop_front();
            self.timed_out.note();
        }
    }

    fn log_due(&mut self, now: Instant) {
        if let Some((count, total)) = self.timed_out.due(now) {
            warn!(
                "closed {count} connection(s) whose frontend did not start vhost-user \
                 negotiation within {:?} ({total} since start)",
                self.handshake_timeout
            );
        }
        if let Some((count, total)) = self.evicted.due(now) {
            warn!(
                "closed {count} silent connection(s) early: {} connections were waiting \
                 ({total} since start)",
                self.limit
            );
        }
        if let Some((count, total)) = self.accept_failed.due(now) {
            warn!("accepting connections failed {count} time(s) ({total} since start)");
        }
    }

    /// Moves the silent connections that got events to the ready queue
    /// (their frontend spoke) or closes them (it left without a word).
    fn pass_on_the_speaking(&mut self, events: &[libc::pollfd]) {
        if !events.iter().any(|p| p.revents != 0) {
            return;
        }
        let mut spoke = Vec::new();
        let silent = std::mem::take(&mut self.silent);
        for (waiting, event) in silent.into_iter().zip(events) {
            if event.revents == 0 {
                self.silent.push_back(waiting);
            } else if bytes_waiting(&waiting.stream) {
                spoke.push(waiting.stream);
            } else {
                debug!("a connection closed before its frontend spoke");
            }
        }
        if !spoke.is_empty() {
            let mut handoff = lock(&self.handoff);
            handoff.ready.extend(spoke);
            handoff.dispatch();
        }
    }

    /// Accepts every pending connection there is room for.
    fn accept_all(&mut self) {
        loop {
            let full = self.waiting() >= self.limit;
            if full && self.silent.is_empty() {
                // All spoke: the rest wait in the backlog.
                return;
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if full {
                        self.silent.pop_front();
                        self.evicted.note();
                    }
                    self.silent.push_back(Silent {
                        stream,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    debug!("accept failed: {e}");
                    self.accept_failed.note();
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }
}

fn pollfd(fd: std::os::fd::RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Whether the frontend sent something (not merely closed): bytes are
/// queued on the socket. Looked at, not read.
fn bytes_waiting(stream: &UnixStream) -> bool {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int into `queued`.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut queued) };
    rc == 0 && queued > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A private directory, removed on drop.
    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn listener() -> (UnixListener, std::path::PathBuf, Dir) {
        let dir = Dir(crate::supervisor::private_directory("rgpu-gate-test").unwrap());
        let path = dir.0.join("s");
        (UnixListener::bind(&path).unwrap(), path, dir)
    }

    /// A standby stand-in: the far end of its hand-off socket.
    fn standby() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    fn received(child: &UnixStream) -> UnixStream {
        child
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        handoff::receive_connection(child).unwrap().unwrap()
    }

    /// Silent connections neither block a speaking one nor reach a
    /// standby; they are closed at the timeout.
    #[test]
    fn the_speaking_connection_passes_the_silent_ones() {
        let (listener, path, _dir) = listener();
        let gate = Gate::start(listener, Duration::from_millis(500)).unwrap();
        let silent: Vec<UnixStream> = (0..50)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let mut speaking = UnixStream::connect(&path).unwrap();
        speaking.write_all(b"hello").unwrap();

        let (ours, child) = standby();
        gate.offer(1, ours);
        let mut handed = received(&child);
        gate.taken(1);
        let mut got = [0u8; 5];
        handed.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello", "the stream arrives unread");
        handed.write_all(b"back").unwrap();
        let mut back = [0u8; 4];
        speaking.read_exact(&mut back).unwrap();

        let started = Instant::now();
        for mut s in silent {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut byte = [0u8; 1];
            assert_eq!(s.read(&mut byte).unwrap(), 0, "closed by the gate");
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    /// A connection sent to a standby that dies before taking it goes to
    /// the next standby.
    #[test]
    fn a_connection_outlives_a_standby_that_dies() {
        let (listener, path, _dir) = listener();
        let gate = Gate::start(listener, Duration::from_secs(30)).unwrap();
        let mut speaking = UnixStream::connect(&path).unwrap();
        speaking.write_all(b"x").unwrap();

        let (ours, child) = standby();
        gate.offer(1, ours);
        drop(received(&child));
        drop(child);
        gate.withdraw(1);

        let (ours, child) = standby();
        gate.offer(2, ours);
        let mut handed = received(&child);
        gate.taken(2);
        let mut got = [0u8; 1];
        handed.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
    }

    /// A stopped gate accepts nothing more and closes the connections it
    /// held.
    #[test]
    fn a_stopped_gate_closes_its_socket_and_waiting_connections() {
        let (listener, path, _dir) = listener();
        let gate = Gate::start(listener, Duration::from_secs(30)).unwrap();
        let mut waiting = UnixStream::connect(&path).unwrap();
        waiting.write_all(b"x").unwrap();
        gate.stop();
        waiting
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        // Closed by the gate (read 0), or reset if still in the backlog
        // when the listening socket closed; never left waiting.
        match waiting.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the waiting connection is still open: {other:?}"),
        }
        assert!(
            UnixStream::connect(&path).is_err(),
            "the listening socket still accepts"
        );
        // Stopping again (as dropping does) is harmless.
        gate.stop();
    }

    #[test]
    fn tally_logs_at_once_then_at_most_once_per_interval() {
        let mut tally = Tally::default();
        let t0 = Instant::now();
        assert_eq!(tally.due(t0), None);
        tally.note();
        assert_eq!(tally.due(t0), Some((1, 1)));
        tally.note();
        tally.note();
        assert_eq!(tally.due(t0 + LOG_INTERVAL / 2), None);
        assert_eq!(tally.next(), Some(t0 + LOG_INTERVAL));
        assert_eq!(tally.due(t0 + LOG_INTERVAL), Some((2, 3)));
        assert_eq!(tally.next(), None);
    }
}
