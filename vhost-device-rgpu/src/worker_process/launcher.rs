//! Starting worker processes, in the connection process: the daemon's own
//! executable with `--serve-worker`, the worker's end of a [`super::link`]
//! and the counters page inherited, contained before exec
//! ([`super::containment`]), killed if the connection process dies.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use super::accounting::Accounting;
use super::containment::{self, WorkerLimits};
use super::link::{self, Link};
use crate::shared_counters::SharedCounters;
use crate::tenant_page::TenantPage;

/// A started worker: the process, this side's link, the page it counts
/// into.
pub type Started = (Child, Link, SharedCounters);

/// A request to the spawner thread, and where its answer goes.
type SpawnRequest = (u64, mpsc::SyncSender<io::Result<Started>>);

/// What every worker of a connection is started with.
pub struct WorkerLauncher {
    settings: SpawnSettings,
    /// Sums what the workers count, each into a page of its own.
    accounting: Arc<Accounting>,
    /// How long workers may take to end their sessions on their own when
    /// the connection ends, before they are killed (zero: killed at once).
    end_grace: Duration,
    /// The thread that starts every worker, from its first start on (one,
    /// however many threads ask for the first worker at once).
    spawner: Mutex<Option<mpsc::Sender<SpawnRequest>>>,
}

/// What a worker process is started with.
#[derive(Clone)]
struct SpawnSettings {
    executable: PathBuf,
    /// The connection's number, for the workers' log lines.
    conn: u64,
    /// `--executor`, `--gpu`.
    executor_args: Vec<OsString>,
    /// The tenant's memory budget, which the workers take from.
    tenant: Option<Arc<TenantPage>>,
    limits: WorkerLimits,
    /// `RGPU_LOG` for the workers; `None`: they inherit this process's.
    log_filter: Option<String>,
    /// The tenant's registry of shareable handles
    /// ([`crate::shareable_broker`]), which the workers reach.
    shareable_fd: Option<RawFd>,
}

impl WorkerLauncher {
    /// Workers run `executable` (this daemon's binary) with `executor_args`.
    pub fn new(
        executable: PathBuf,
        conn: u64,
        executor_args: Vec<OsString>,
        accounting: Arc<Accounting>,
        tenant: Option<Arc<TenantPage>>,
        limits: WorkerLimits,
    ) -> Self {
        Self {
            settings: SpawnSettings {
                executable,
                conn,
                executor_args,
                tenant,
                limits,
                log_filter: None,
                shareable_fd: None,
            },
            accounting,
            end_grace: Duration::ZERO,
            spawner: Mutex::new(None),
        }
    }

    /// Workers reach the tenant's registry of shareable handles through
    /// `fd` (this process's inherited end; it stays open while it lives).
    pub fn with_shareable_fd(mut self, fd: Option<RawFd>) -> Self {
        self.settings.shareable_fd = fd;
        self
    }

    /// Workers log with `RGPU_LOG=filter` (tests keep their output quiet).
    pub fn with_log_filter(mut self, filter: &str) -> Self {
        self.settings.log_filter = Some(filter.to_owned());
        self
    }

    /// At the connection's end (or a reset) workers get `grace` to end
    /// their sessions before they are killed: `--profile-launches`, whose
    /// profiles a session logs as it ends.
    pub fn with_end_grace(mut self, grace: Duration) -> Self {
        self.end_grace = grace;
        self
    }

    pub fn end_grace(&self) -> Duration {
        self.end_grace
    }

    pub fn accounting(&self) -> &Arc<Accounting> {
        &self.accounting
    }

    /// Starts worker number `worker`; returns it, this side's link and the
    /// page it counts into.
    ///
    /// Every worker is started from one thread that lives as long as this
    /// process: a worker's parent-death signal comes when the thread that
    /// started it exits, and the threads that ask (vhost-user's, the
    /// queues') end with the connection, before its teardown has let the
    /// workers end their sessions.
    pub fn spawn(&self, worker: u64) -> io::Result<Started> {
        let gone = || io::Error::other("the worker spawner thread is gone");
        let spawner = {
            let mut spawner = self.spawner.lock().unwrap_or_else(PoisonError::into_inner);
            match spawner.as_ref() {
                Some(requests) => requests.clone(),
                None => {
                    let (requests, incoming) = mpsc::channel::<SpawnRequest>();
                    let settings = self.settings.clone();
                    std::thread::Builder::new()
                        .name("rgpu-spawner".into())
                        .spawn(move || {
                            for (worker, reply) in incoming {
                                let _ = reply.send(settings.start(worker));
                            }
                        })?;
                    spawner.insert(requests).clone()
                }
            }
        };
        let (reply, answer) = mpsc::sync_channel(1);
        spawner.send((worker, reply)).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

impl SpawnSettings {
    /// Starts worker number `worker`, on the spawner thread.
    fn start(&self, worker: u64) -> io::Result<Started> {
        let (link, theirs) = link::pair()?;
        let (counters, counters_fd) = SharedCounters::create(c"rgpu-worker-counters")?;
        let tenant_fd = self.tenant.as_ref().map(|t| t.fd());
        let inherited: [RawFd; 4] = [
            theirs.as_raw_fd(),
            counters_fd.as_raw_fd(),
            tenant_fd.unwrap_or(-1),
            self.shareable_fd.unwrap_or(-1),
        ];
        let mut command = Command::new(&self.executable);
        command
            .arg("--serve-worker")
            .arg(format!("{}.{worker}", self.conn))
            .arg("--fd")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--counters-fd")
            .arg(counters_fd.as_raw_fd().to_string())
            .args(&self.executor_args)
            .stdin(Stdio::null());
        if let Some(fd) = tenant_fd {
            command.arg("--tenant-fd").arg(fd.to_string());
        }
        if let Some(fd) = self.shareable_fd {
            command.arg("--shareable-fd").arg(fd.to_string());
        }
        if let Some(filter) = &self.log_filter {
            command.env("RGPU_LOG", filter);
        }
        let limits = self.limits;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the hook runs in the forked child before exec and only
        // makes async-signal-safe system calls (fcntl, prctl, getppid,
        // getrlimit, setrlimit); it allocates nothing (`inherited` is an
        // array).
        unsafe {
            command.pre_exec(move || {
                for fd in inherited.iter().filter(|fd| **fd >= 0) {
                    if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // A worker never outlives its connection process (nor the
                // thread that started it: the signal comes when that
                // thread exits).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                containment::apply_in_child(limits)
            });
        }
        let child = command.spawn()?;
        // Our copy of the worker's end must go, or its death would not
        // show as the end of the link.
        drop(theirs);
        drop(counters_fd);
        Ok((child, link, counters))
    }
}
