//! One process per connection: the parent process and its children.
//!
//! NVIDIA's driver treats some errors (a kernel's illegal address among
//! them) as fatal for the whole process: afterwards every new context and
//! every registration in that process fails. So each vhost-user connection
//! (a VM or a local process) is served by a process of its own, as a VMM
//! runs one vhost-user backend per VM: what one tenant breaks dies with its
//! process. The parent never touches the GPU; it owns the listening socket,
//! the stats socket and the children.
//!
//! The parent accepts every connection itself and holds it until its
//! frontend speaks ([`crate::gate`]), so that silent connections cost a
//! descriptor, not a process. It keeps one *standby* child ready. Started
//! with `--serve-one-connection N`, a child initialises its executor, tells
//! the parent [`Message::Ready`], receives one connection on the inherited
//! hand-off socket (`--fd`, see [`crate::handoff`]), tells the parent
//! [`Message::Accepted`] (the parent then starts the next standby, so a
//! newcomer never waits for GPU start-up), serves the connection and exits
//! when it ends. Messages are lines on a pipe.
//!
//! The parent runs one supervisor per tenant (`crate::tenants`), each on a
//! thread of its own; [`Supervisor::terminate`] ends one (the tenant was
//! removed, or the daemon exits).
//!
//! Nothing that happens to a standby takes the live connections down: one
//! that cannot be started, fails or dies before accepting is replaced after
//! a pause that grows while failures repeat (`Backoff`). Only a failure
//! before any child was ever ready (no driver, say) ends the daemon: then
//! nothing could ever be served. At most `max_connections` children live at
//! once, the standby included; at the limit the parent keeps no standby, so
//! connections that spoke wait in the gate until a connection ends.
//!
//! Each child counts into a page shared with the parent
//! ([`crate::shared_counters`]); the stats socket sums them
//! ([`Supervisor::totals`]). Module images are shared through a private
//! directory the parent creates (`--module-cache-dir` of its children, see
//! `rgpu_session::ModuleCache`), so an image still crosses from guests once.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use rgpu_session::{CounterKind, Counters, MemoryBudget};

use crate::gate::{Gate, GateError};
use crate::shared_counters::SharedCounters;
use crate::tenant_page::TenantPage;

/// The first pause before replacing a standby that failed; it doubles with
/// each failure in a row, up to [`BACKOFF_MAX`], so a persistent cause (a
/// pid limit, memory) costs little and a passing one is over soon.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long children killed with SIGKILL (after SIGTERM and its grace) may
/// take to be reaped.
const KILLED_GRACE: Duration = Duration::from_secs(2);

/// How often, at most, the parent says that it is at its connection limit.
const AT_LIMIT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Name of that directory: this prefix, the parent's pid, a random suffix.
const MODULE_DIRECTORY_PREFIX: &str = "rgpu-modules";

/// What a child tells the parent, one line each, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The executor is up: the number of GPUs offered, the driver version.
    Ready { gpus: usize, driver: i32 },
    /// The executor could not start: why (what the parent reports).
    Failed(String),
    /// A connection was accepted.
    Accepted,
}

impl Message {
    fn line(&self) -> String {
        match self {
            Self::Ready { gpus, driver } => format!("ready {gpus} {driver}\n"),
            // One line: the reader splits at newlines.
            Self::Failed(why) => format!("failed {}\n", why.replace('\n', " ")),
            Self::Accepted => "accepted\n".into(),
        }
    }

    fn parse(line: &str) -> Option<Self> {
        let line = line.trim_end_matches('\n');
        if line == "accepted" {
            return Some(Self::Accepted);
        }
        if let Some(why) = line.strip_prefix("failed ") {
            return Some(Self::Failed(why.to_owned()));
        }
        let mut words = line.strip_prefix("ready ")?.split(' ');
        let gpus = words.next()?.parse().ok()?;
        let driver = words.next()?.parse().ok()?;
        Some(Self::Ready { gpus, driver })
    }
}

/// The child's end of the pipe to the parent.
pub struct Notifier(File);

impl Notifier {
    /// Takes over the inherited pipe `fd` (`--notify-fd`). The caller must
    /// not use `fd` otherwise afterwards.
    pub fn inherit(fd: RawFd) -> io::Result<Self> {
        // SAFETY: fstat writes into a plain struct; a bad fd only fails.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
            return Err(io::Error::other(format!("descriptor {fd} is not a pipe")));
        }
        // SAFETY: fd is an open pipe (checked above) handed to us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fcntl on a descriptor we own; nothing we start needs it.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        Ok(Self(File::from(fd)))
    }

    pub fn send(&mut self, message: &Message) -> io::Result<()> {
        self.0.write_all(message.line().as_bytes())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot find this program to start connection processes: {0}")]
    Executable(io::Error),
    #[error("cannot start a connection process: {0}")]
    Spawn(io::Error),
    #[error(transparent)]
    Gate(GateError),
    /// The child's own explanation, as the daemon gave it before.
    #[error("{0}")]
    ChildFailed(String),
    #[error("the process for connection {conn} (pid {pid}) ended before accepting one: {status}")]
    EndedEarly { conn: u64, pid: u32, status: String },
}

/// Why [`Supervisor::run`]'s loop stops keeping a standby.
enum Interruption {
    /// [`Supervisor::terminate`] was called: not a failure.
    Terminating,
    Failed(SupervisorError),
}

impl From<SupervisorError> for Interruption {
    fn from(error: SupervisorError) -> Self {
        Self::Failed(error)
    }
}

/// [`Supervisor::terminate`] was called.
struct Terminating;

/// Pauses between attempts to replace a failed standby: `first`, doubling
/// with each failure in a row up to `max`; back to `first` once a standby
/// is ready.
#[derive(Debug, Clone)]
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The pause before the next attempt (the one after is longer).
    fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// A standby became ready: the next failure starts over.
    fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

/// A child that has not taken a connection yet, its pipe, and our end of
/// its hand-off socket until the gate has it.
struct Standby {
    conn: u64,
    child: Child,
    messages: BufReader<File>,
    control: Option<UnixStream>,
}

impl Standby {
    /// The next message; `None` once the child closed the pipe (it ended).
    fn next_message(&mut self) -> Option<Message> {
        loop {
            let mut line = String::new();
            match self.messages.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => match Message::parse(&line) {
                    Some(message) => return Some(message),
                    None => warn!("connection {}: unexpected message {line:?}", self.conn),
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!("connection {}: reading its messages: {e}", self.conn);
                    return None;
                }
            }
        }
    }
}

struct LiveChild {
    pid: u32,
    counters: SharedCounters,
}

#[derive(Default)]
struct State {
    /// Children by connection number, the standby included.
    live: BTreeMap<u64, LiveChild>,
    /// The totals of children that ended; their gauges ended with them (the
    /// process exit freed whatever they held).
    retired: Counters,
    terminating: bool,
    /// When the parent last said it was at its connection limit.
    at_limit_logged: Option<Instant>,
}

/// The parent: starts children, reaps them and sums their counters.
pub struct Supervisor {
    executable: PathBuf,
    /// Accepts the connections and hands them to the standby.
    gate: Gate,
    child_args: Vec<OsString>,
    /// The most children alive at once, the standby included.
    max_connections: usize,
    /// The module cache directory this process created for its children.
    module_directory: Option<PathBuf>,
    /// The tenant's memory budget, which every child takes from.
    tenant: Arc<TenantPage>,
    /// The children's end of the tenant's registry of shareable handles.
    shareable: OwnedFd,
    state: Mutex<State>,
    /// Signalled whenever a child was reaped, and when terminating begins.
    changed: Condvar,
}

impl Supervisor {
    /// Starts accepting connections on `listener` (closing those whose
    /// frontend says nothing for `handshake_timeout`) for children that
    /// get `child_args` (`--gpu`, `--executor`...) after their own; at most
    /// `max_connections` (at least 1) live at once.
    pub fn new(
        listener: UnixListener,
        child_args: Vec<OsString>,
        max_connections: usize,
        handshake_timeout: Duration,
        tenant: Arc<TenantPage>,
        private_module_cache: bool,
    ) -> Result<Self, SupervisorError> {
        let executable = std::env::current_exe().map_err(SupervisorError::Executable)?;
        let module_directory = if !private_module_cache {
            None
        } else {
            match private_directory(MODULE_DIRECTORY_PREFIX) {
                Ok(dir) => Some(dir),
                Err(e) => {
                    warn!("no module cache shared between connections: {e}");
                    None
                }
            }
        };
        // The broker's ledger carries what importers hold after their
        // exporter let go: charged to the tenant.
        let shareable = crate::shareable_broker::start(Some(
            Arc::clone(&tenant) as Arc<dyn rgpu_session::MemoryBudget>
        ))
        .map_err(SupervisorError::Spawn)?;
        Ok(Self {
            executable,
            gate: Gate::start(listener, handshake_timeout).map_err(SupervisorError::Gate)?,
            child_args,
            max_connections: max_connections.max(1),
            module_directory,
            tenant,
            shareable,
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters and a map: nothing a panicking holder leaves half-done
        // matters more than serving on.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a standby child while fewer than `max_connections` children
    /// live, until [`Supervisor::terminate`] is called (then returns
    /// `Ok`). Calls `serving` once, when the first child is ready (its
    /// executor started). Fails only when the first child failed before any
    /// was ready (its executor cannot start, it crashed, or it could not be
    /// started): later failures are retried.
    ///
    /// Call it on a thread that lasts as long as the tenant is served: a
    /// child gets SIGTERM when the thread that started it ends
    /// (PR_SET_PDEATHSIG).
    pub fn run(self: &Arc<Self>, serving: impl FnOnce(usize, i32)) -> Result<(), SupervisorError> {
        let mut serving = Some(serving);
        let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        let mut conn = 0;
        loop {
            if self.wait_for_a_free_slot().is_err() {
                return Ok(());
            }
            conn += 1;
            let failure = match self.spawn(conn) {
                Ok(Some(standby)) => match self.until_accepted(standby, &mut serving, &mut backoff)
                {
                    Ok(()) => continue,
                    Err(Interruption::Terminating) => return Ok(()),
                    Err(Interruption::Failed(e)) => e,
                },
                Ok(None) => return Ok(()),
                Err(e) => e,
            };
            if serving.is_some() {
                // No child was ever ready: nothing could be served, and
                // retrying would only hide why.
                return Err(failure);
            }
            let pause = backoff.next_pause();
            warn!(
                "a standby failed: {failure}; starting another in {pause:?} (live connections \
                 go on)"
            );
            if self.pause(pause).is_err() {
                return Ok(());
            }
        }
    }

    /// Follows the standby until it took a connection (then hands it to a
    /// reaper thread), or fails. Offers it to the gate once it is ready.
    fn until_accepted(
        self: &Arc<Self>,
        mut standby: Standby,
        serving: &mut Option<impl FnOnce(usize, i32)>,
        backoff: &mut Backoff,
    ) -> Result<(), Interruption> {
        loop {
            match standby.next_message() {
                Some(Message::Ready { gpus, driver }) => {
                    backoff.reset();
                    if let Some(serving) = serving.take() {
                        serving(gpus, driver);
                    }
                    if let Some(control) = standby.control.take() {
                        self.gate.offer(standby.conn, control);
                    }
                }
                Some(Message::Accepted) => {
                    self.gate.taken(standby.conn);
                    self.watch(standby);
                    return Ok(());
                }
                Some(Message::Failed(why)) => {
                    self.gate.withdraw(standby.conn);
                    // The caller reports the failure, which says it all.
                    let _ = self.reap(standby.conn, standby.child, |_| {});
                    return Err(SupervisorError::ChildFailed(why).into());
                }
                None => {
                    let (conn, pid) = (standby.conn, standby.child.id());
                    // Before it is reaped: a connection sent to it goes to
                    // the next standby.
                    self.gate.withdraw(conn);
                    let status = self.reap(conn, standby.child, |_| {});
                    if self.lock().terminating {
                        return Err(Interruption::Terminating);
                    }
                    return Err(SupervisorError::EndedEarly {
                        conn,
                        pid,
                        status: match status {
                            Ok(status) => status.to_string(),
                            Err(e) => e.to_string(),
                        },
                    }
                    .into());
                }
            }
        }
    }

    /// Blocks while `max_connections` children live; fails once
    /// terminating. Says so in the log, now and then.
    fn wait_for_a_free_slot(&self) -> Result<(), Terminating> {
        let mut state = self.lock();
        let mut logged = false;
        loop {
            if state.terminating {
                return Err(Terminating);
            }
            if state.live.len() < self.max_connections {
                return Ok(());
            }
            if !logged {
                logged = true;
                let due = state
                    .at_limit_logged
                    .is_none_or(|at| at.elapsed() >= AT_LIMIT_LOG_INTERVAL);
                if due {
                    state.at_limit_logged = Some(Instant::now());
                    info!(
                        "serving {} connections, the most --max-connections allows: new ones \
                         wait until one ends",
                        state.live.len()
                    );
                }
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Sleeps for `pause`; fails at once if terminating begins meanwhile.
    fn pause(&self, pause: Duration) -> Result<(), Terminating> {
        let deadline = Instant::now() + pause;
        let mut state = self.lock();
        loop {
            if state.terminating {
                return Err(Terminating);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Starts the child for connection `conn`; `None` once terminating.
    fn spawn(&self, conn: u64) -> Result<Option<Standby>, SupervisorError> {
        let (counters, counters_fd) =
            SharedCounters::create(c"rgpu-counters").map_err(SupervisorError::Spawn)?;
        let (read_end, write_end) = pipe().map_err(SupervisorError::Spawn)?;
        // Close-on-exec, both.
        let (control, child_control) = UnixStream::pair().map_err(SupervisorError::Spawn)?;
        let inherited = [
            child_control.as_raw_fd(),
            write_end.as_raw_fd(),
            counters_fd.as_raw_fd(),
            self.tenant.fd(),
            self.shareable.as_raw_fd(),
        ];
        let mut command = Command::new(&self.executable);
        command
            .arg("--serve-one-connection")
            .arg(conn.to_string())
            .arg("--fd")
            .arg(child_control.as_raw_fd().to_string())
            .arg("--notify-fd")
            .arg(write_end.as_raw_fd().to_string())
            .arg("--counters-fd")
            .arg(counters_fd.as_raw_fd().to_string())
            .arg("--tenant-fd")
            .arg(self.tenant.fd().to_string())
            .arg("--shareable-fd")
            .arg(self.shareable.as_raw_fd().to_string())
            .args(&self.child_args)
            .stdin(Stdio::null());
        if let Some(dir) = &self.module_directory {
            command.arg("--module-cache-dir").arg(dir);
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the hook runs in the forked child before exec and only
        // makes system calls (fcntl, prctl, getppid), which are
        // async-signal-safe; it touches no memory of the parent's threads.
        unsafe {
            command.pre_exec(move || {
                // Our descriptors are close-on-exec; these, in this child
                // only, are not.
                for fd in inherited {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // A child must not outlive the parent (nor serve on alone).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        // Spawned under the lock, so that `terminate` signals every child.
        let mut state = self.lock();
        if state.terminating {
            return Ok(None);
        }
        let child = command.spawn().map_err(SupervisorError::Spawn)?;
        debug!("connection {conn}: standby process {}", child.id());
        state.live.insert(
            conn,
            LiveChild {
                pid: child.id(),
                counters,
            },
        );
        Ok(Some(Standby {
            conn,
            child,
            messages: BufReader::new(File::from(read_end)),
            control: Some(control),
        }))
    }

    /// Reaps the child of a connection once it ends, from a thread of its
    /// own.
    fn watch(self: &Arc<Self>, standby: Standby) {
        let Standby { conn, child, .. } = standby;
        let pid = child.id();
        let supervisor = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name(format!("rgpu-reap-{conn}"))
            .spawn(move || {
                supervisor.reap(conn, child, |status| match status {
                    Ok(status) if status.success() => {
                        debug!("connection {conn}: process {pid} exited")
                    }
                    Ok(status) => {
                        warn!("connection {conn}: process {pid} ended abnormally: {status}")
                    }
                    Err(e) => error!("connection {conn}: cannot reap process {pid}: {e}"),
                })
            });
        if let Err(e) = spawned {
            // The child serves on; it stays a zombie (in the gauges, and
            // counted against --max-connections) until the daemon exits.
            error!("connection {conn} (pid {pid}): cannot start its reaper thread: {e}");
        }
    }

    /// Waits for the child of `conn` to end, reaps it, calls `report` with
    /// how it ended and retires its counters.
    fn reap(
        &self,
        conn: u64,
        mut child: Child,
        report: impl FnOnce(&io::Result<ExitStatus>),
    ) -> io::Result<ExitStatus> {
        // Wait without reaping: the pid stays ours until it leaves `live`
        // (under the lock), so `terminate` never signals a recycled pid.
        wait_for_exit(child.id());
        let mut state = self.lock();
        // Its workers die with it: the IPC handles they exported go, while
        // its pid cannot name another process yet.
        self.tenant.forget_connection(child.id());
        let status = child.wait();
        // Before the gauges drop: whoever sees them drop (the stats socket
        // takes the lock) finds the end already logged.
        report(&status);
        if let Some(ended) = state.live.remove(&conn) {
            state
                .retired
                .add_from(ended.counters.page(), &[CounterKind::Total]);
            // What its workers held and could not give back (killed).
            self.tenant
                .release(Counters::get(&ended.counters.page().device_memory_bytes));
        }
        self.changed.notify_all();
        status
    }

    /// Whether a guest holds a CUDA context in one of its children now
    /// (reads the children's pages; no sum is made).
    pub fn has_sessions(&self) -> bool {
        self.lock()
            .live
            .values()
            .any(|child| Counters::get(&child.counters.page().sessions_active) > 0)
    }

    /// The counters of every child, ended or alive; gauges of live ones only.
    pub fn totals(&self) -> Counters {
        let state = self.lock();
        let sum = Counters::default();
        sum.add_from(&state.retired, &[CounterKind::Total]);
        for child in state.live.values() {
            sum.add_from(
                child.counters.page(),
                &[CounterKind::Gauge, CounterKind::Total],
            );
        }
        sum
    }

    /// Stops accepting connections (the listening socket closes), sends
    /// SIGTERM to every child, starts no more (`run` returns), waits up to
    /// `grace` for them to end, and removes the module cache directory.
    /// Any still running get SIGTERM again when the thread that ran `run`
    /// ends, or this process exits (PR_SET_PDEATHSIG); with
    /// `kill_after_grace`, SIGKILL now (a tenant removed while the daemon
    /// goes on must not leave processes behind).
    pub fn terminate(&self, grace: Duration, kill_after_grace: bool) {
        self.gate.stop();
        self.stop_children(grace, kill_after_grace);
        if let Some(dir) = &self.module_directory {
            match std::fs::remove_dir_all(dir) {
                // Terminated twice (a tenant that failed while the daemon
                // was exiting).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => warn!("cannot remove {}: {e}", dir.display()),
                Ok(()) => {}
            }
        }
    }

    fn stop_children(&self, grace: Duration, kill_after_grace: bool) {
        let mut state = self.lock();
        state.terminating = true;
        // The supervising thread may be waiting for a slot or pausing.
        self.changed.notify_all();
        state = self.signal_children_and_wait(state, libc::SIGTERM, grace);
        if state.live.is_empty() {
            return;
        }
        if !kill_after_grace {
            info!(
                "{} connection process(es) still running at exit",
                state.live.len()
            );
            return;
        }
        warn!(
            "{} connection process(es) still running {grace:?} after SIGTERM: killing them",
            state.live.len()
        );
        state = self.signal_children_and_wait(state, libc::SIGKILL, KILLED_GRACE);
        if !state.live.is_empty() {
            error!(
                "{} connection process(es) still running after SIGKILL",
                state.live.len()
            );
        }
    }

    /// Sends `signal` to every live child, then waits up to `grace` for
    /// them all to be reaped.
    fn signal_children_and_wait<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        signal: libc::c_int,
        grace: Duration,
    ) -> MutexGuard<'a, State> {
        let deadline = Instant::now() + grace;
        for child in state.live.values() {
            if let Ok(pid) = libc::pid_t::try_from(child.pid) {
                // SAFETY: kill only sends a signal; the pid is a child that
                // has not been reaped (see `reap`).
                unsafe { libc::kill(pid, signal) };
            }
        }
        while !state.live.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state
    }
}

/// Creates a fresh directory only we can use (mkdtemp: mode 0700, a name
/// nobody could have prepared), in /dev/shm (memory) if there is one, named
/// `<prefix>-<pid>-XXXXXX`. Directories that daemons killed before they
/// could remove theirs left there are removed first.
pub(crate) fn private_directory(prefix: &str) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let shm = std::path::Path::new("/dev/shm");
    let parent = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    remove_stale_directories(&parent, prefix);
    let template = parent.join(format!("{prefix}-{}-XXXXXX", std::process::id()));
    let mut bytes = template.into_os_string().into_vec();
    if bytes.contains(&0) {
        return Err(io::Error::other("temporary directory path holds a NUL"));
    }
    bytes.push(0);
    // SAFETY: `bytes` is a NUL-terminated template that mkdtemp rewrites in
    // place (same length).
    if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    bytes.pop();
    Ok(PathBuf::from(OsString::from_vec(bytes)))
}

/// Removes our user's `<prefix>-<pid>-*` directories in `parent` whose
/// daemon (`pid`) is gone.
fn remove_stale_directories(parent: &std::path::Path, prefix: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix)?.strip_prefix('-')?.split('-').next())
            .and_then(|pid| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let ours = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if ours && gone {
            debug!("removing {}, left by daemon {pid}", entry.path().display());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Blocks until child `pid` has ended, leaving it to be reaped.
fn wait_for_exit(pid: u32) {
    let id: libc::id_t = pid;
    loop {
        // SAFETY: waitid writes into `info`, a plain struct; WNOWAIT leaves
        // the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are fresh descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for message in [
            Message::Ready {
                gpus: 1,
                driver: 13000,
            },
            Message::Failed("cannot load libcuda.so.1".into()),
            Message::Accepted,
        ] {
            assert_eq!(Message::parse(&message.line()), Some(message));
        }
        assert_eq!(
            Message::Failed("a\nb".into()).line(),
            "failed a b\n".to_string()
        );
        assert_eq!(Message::parse("ready x 1\n"), None);
        assert_eq!(Message::parse("hello\n"), None);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_starts_over_when_ready() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        let pauses: Vec<Duration> = (0..9).map(|_| backoff.next_pause()).collect();
        assert_eq!(
            pauses,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000),
                ms(5000)
            ]
        );
        backoff.reset();
        assert_eq!(backoff.next_pause(), ms(100));
        assert_eq!(backoff.next_pause(), ms(200));

        // A first pause beyond the cap is the cap; a zero one stays zero.
        assert_eq!(Backoff::new(ms(900), ms(500)).next_pause(), ms(500));
        let mut zero = Backoff::new(Duration::ZERO, ms(500));
        assert_eq!(zero.next_pause(), Duration::ZERO);
        assert_eq!(zero.next_pause(), Duration::ZERO);
    }
}
