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
//! The parent keeps one *standby* child waiting in accept(). Started with
//! `--serve-one-connection N`, a child initialises its executor, tells the
//! parent [`Message::Ready`], accepts one connection on the inherited
//! listening socket, tells the parent [`Message::Accepted`] (the parent then
//! starts the next standby, so a newcomer never waits for GPU start-up),
//! serves the connection and exits when it ends. Messages are lines on a
//! pipe. Each child counts into a page shared with the parent
//! ([`crate::shared_counters`]); the stats socket sums them
//! ([`Supervisor::totals`]). Module images are shared through a private
//! directory the parent creates (`RGPU_MODULE_CACHE_DIR`, see
//! `rgpu_session::ModuleCache`), so an image still crosses from guests once.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use rgpu_session::{CounterKind, Counters};

use crate::shared_counters::SharedCounters;

/// Pause before replacing a standby that ended without an error (someone
/// else signalled it), so that a loop of such ends does not spin.
const RESPAWN_PAUSE: Duration = Duration::from_millis(200);

/// Where the children's module caches keep images (rgpu_session reads it).
const MODULE_CACHE_DIR_ENV: &str = "RGPU_MODULE_CACHE_DIR";

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
    /// The child's own explanation, as the daemon gave it before.
    #[error("{0}")]
    ChildFailed(String),
    #[error("the process for connection {conn} (pid {pid}) ended before accepting one: {status}")]
    EndedEarly { conn: u64, pid: u32, status: String },
}

/// A child that has not accepted a connection yet, and its pipe.
struct Standby {
    conn: u64,
    child: Child,
    messages: BufReader<File>,
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
}

/// The parent: starts children, reaps them and sums their counters.
pub struct Supervisor {
    executable: PathBuf,
    listener: RawFd,
    child_args: Vec<OsString>,
    /// The module cache directory this process created for its children.
    module_directory: Option<PathBuf>,
    state: Mutex<State>,
    /// Signalled whenever a child was reaped.
    reaped: Condvar,
}

impl Supervisor {
    /// Children serve `listener` (which must stay open while this lives)
    /// and get `child_args` (`--gpu`, `--executor`) after their own.
    pub fn new(listener: RawFd, child_args: Vec<OsString>) -> Result<Self, SupervisorError> {
        let module_directory = if std::env::var_os(MODULE_CACHE_DIR_ENV).is_some() {
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
        Ok(Self {
            executable: std::env::current_exe().map_err(SupervisorError::Executable)?,
            listener,
            child_args,
            module_directory,
            state: Mutex::default(),
            reaped: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters and a map: nothing a panicking holder leaves half-done
        // matters more than serving on.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a standby child, forever. Calls `serving` once, when the first
    /// child is ready (its executor started). Returns only when a child
    /// failed before accepting a connection (its executor cannot start, or
    /// it crashed) or cannot be started.
    ///
    /// Call it on the main thread: a child gets SIGTERM when the thread
    /// that started it ends (PR_SET_PDEATHSIG), and the main thread lasts as
    /// long as the process.
    pub fn run(self: &Arc<Self>, serving: impl FnOnce(usize, i32)) -> SupervisorError {
        let mut serving = Some(serving);
        let mut conn = 0;
        loop {
            conn += 1;
            let mut standby = match self.spawn(conn) {
                Ok(Some(standby)) => standby,
                Ok(None) => park_until_exit(),
                Err(e) => return e,
            };
            loop {
                match standby.next_message() {
                    Some(Message::Ready { gpus, driver }) => {
                        if let Some(serving) = serving.take() {
                            serving(gpus, driver);
                        }
                    }
                    Some(Message::Accepted) => {
                        self.watch(standby);
                        break;
                    }
                    Some(Message::Failed(why)) => {
                        // `reap` logs anything unusual about the end.
                        let _ = self.reap(standby.conn, standby.child);
                        return SupervisorError::ChildFailed(why);
                    }
                    None => {
                        let pid = standby.child.id();
                        let status = self.reap(standby.conn, standby.child);
                        if self.lock().terminating {
                            park_until_exit();
                        }
                        if status.as_ref().is_ok_and(ExitStatus::success) {
                            warn!("the standby process {pid} was stopped; starting another");
                            thread::sleep(RESPAWN_PAUSE);
                            break;
                        }
                        return SupervisorError::EndedEarly {
                            conn,
                            pid,
                            status: match status {
                                Ok(status) => status.to_string(),
                                Err(e) => e.to_string(),
                            },
                        };
                    }
                }
            }
        }
    }

    /// Starts the child for connection `conn`; `None` once terminating.
    fn spawn(&self, conn: u64) -> Result<Option<Standby>, SupervisorError> {
        let (counters, counters_fd) =
            SharedCounters::create(c"rgpu-counters").map_err(SupervisorError::Spawn)?;
        let (read_end, write_end) = pipe().map_err(SupervisorError::Spawn)?;
        let inherited = [
            self.listener,
            write_end.as_raw_fd(),
            counters_fd.as_raw_fd(),
        ];
        let mut command = Command::new(&self.executable);
        command
            .arg("--serve-one-connection")
            .arg(conn.to_string())
            .arg("--fd")
            .arg(self.listener.to_string())
            .arg("--notify-fd")
            .arg(write_end.as_raw_fd().to_string())
            .arg("--counters-fd")
            .arg(counters_fd.as_raw_fd().to_string())
            .args(&self.child_args)
            .stdin(Stdio::null());
        if let Some(dir) = &self.module_directory {
            command.env(MODULE_CACHE_DIR_ENV, dir);
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the hook runs in the forked child before exec and only
        // makes system calls (fcntl, prctl, getppid), which are
        // async-signal-safe; it touches no memory of the parent's threads.
        unsafe {
            command.pre_exec(move || {
                // Our descriptors are close-on-exec; these three, in this
                // child only, are not.
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
                // `reap` logs anything unusual about the end.
                let _ = supervisor.reap(conn, child);
            });
        if let Err(e) = spawned {
            // The child serves on; it stays a zombie (and in the gauges)
            // until the daemon exits.
            error!("connection {conn} (pid {pid}): cannot start its reaper thread: {e}");
        }
    }

    /// Waits for the child of `conn` to end, retires its counters, reaps it
    /// and logs an abnormal end.
    fn reap(&self, conn: u64, mut child: Child) -> io::Result<ExitStatus> {
        let pid = child.id();
        // Wait without reaping: the pid stays ours until it leaves `live`,
        // so `terminate` never signals a recycled pid.
        wait_for_exit(pid);
        let status = {
            let mut state = self.lock();
            if let Some(ended) = state.live.remove(&conn) {
                state
                    .retired
                    .add_from(ended.counters.page(), &[CounterKind::Total]);
            }
            let status = child.wait();
            self.reaped.notify_all();
            status
        };
        match &status {
            Ok(status) if status.success() => {
                debug!("connection {conn}: process {pid} exited")
            }
            Ok(status) => warn!("connection {conn}: process {pid} ended abnormally: {status}"),
            Err(e) => error!("connection {conn}: cannot reap process {pid}: {e}"),
        }
        status
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

    /// Sends SIGTERM to every child, starts no more, waits up to `grace`
    /// for them to end, and removes the module cache directory. Any still
    /// running get SIGTERM again when this process exits (PR_SET_PDEATHSIG).
    pub fn terminate(&self, grace: Duration) {
        self.stop_children(grace);
        if let Some(dir) = &self.module_directory {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                warn!("cannot remove {}: {e}", dir.display());
            }
        }
    }

    fn stop_children(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        let mut state = self.lock();
        state.terminating = true;
        for child in state.live.values() {
            if let Ok(pid) = libc::pid_t::try_from(child.pid) {
                // SAFETY: kill only sends a signal; the pid is a child that
                // has not been reaped (see `reap`).
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        while !state.live.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                info!(
                    "{} connection process(es) still running at exit",
                    state.live.len()
                );
                return;
            }
            state = self
                .reaped
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Creates a fresh directory only we can use (mkdtemp: mode 0700, a name
/// nobody could have prepared), in /dev/shm (memory) if there is one, named
/// `<prefix>-<pid>-XXXXXX`. Directories that daemons killed before they
/// could remove theirs left there are removed first.
fn private_directory(prefix: &str) -> io::Result<PathBuf> {
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

/// The rest of the process's life belongs to the signal thread, which is
/// terminating it.
fn park_until_exit() -> ! {
    loop {
        thread::park();
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
}
