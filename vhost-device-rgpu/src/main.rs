//! vhost-device-rgpu: the rgpu host daemon (see the crate's library docs).
//!
//! Started by a user, it is the parent process ([`supervisor`]); started by
//! the parent with `--serve-one-connection`, it serves one connection.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use log::{error, info, warn};
use rgpu_executor::Executor;
use rgpu_session::{Counters, MemoryBudget};
use vhost_device_rgpu::supervisor::{Message, Notifier, Supervisor};
use vhost_device_rgpu::tenant_page::{TenantPage, UNLIMITED};
use vhost_device_rgpu::virtio_gpu::DaemonShared;
use vhost_device_rgpu::worker_process::containment::WorkerLimits;
use vhost_device_rgpu::worker_process::link::Link;
use vhost_device_rgpu::worker_process::seccomp::{self, SeccompMode};
use vhost_device_rgpu::worker_process::{Accounting, WorkerLauncher};
use vhost_device_rgpu::{daemon, handoff, shared_counters, signals, socket, stats, worker_process};

/// What QEMU's vhost-user.rst "Backend program conventions" ask
/// `--print-capabilities` to print.
const CAPABILITIES: &str = "{\n  \"type\": \"gpu\"\n}";

/// How long the parent waits for its connection processes at exit.
const CHILDREN_GRACE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExecutorKind {
    /// NVIDIA's driver (libcuda), the real thing.
    Cuda,
    /// Host memory and a few reference kernels: a test fixture for machines
    /// without a GPU, not a way to run real programs.
    Sim,
}

impl ExecutorKind {
    /// The name on the command line, as `Executor::kind` reports it.
    fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Sim => "sim",
        }
    }
}

/// vhost-user backend of a compute-only virtio-gpu device that runs guests'
/// CUDA on a host GPU.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Listen for vhost-user frontends on this Unix socket (a stale socket
    /// there is replaced). Each connection is a VM or a local process.
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "fd",
        conflicts_with = "fd"
    )]
    socket_path: Option<PathBuf>,
    /// Serve an inherited listening Unix socket instead of --socket-path.
    #[arg(long, value_name = "N")]
    fd: Option<RawFd>,
    /// Host GPU ordinal offered to guests (they see it as device 0).
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: u32,
    /// What runs the guests' CUDA work. `sim` is a test fixture for machines
    /// without a GPU (host memory, a few reference kernels).
    #[arg(long, value_enum, default_value_t = ExecutorKind::Cuda)]
    executor: ExecutorKind,
    /// Also answer a Unix socket here with one JSON line of counters per
    /// connection.
    #[arg(long, value_name = "PATH")]
    stats_socket: Option<PathBuf>,
    /// Serve at most N connections at once (each in a process of its own,
    /// the one waiting for the next connection included); further ones wait
    /// until one ends.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_connections: u32,
    /// Close a connection whose frontend has not started vhost-user
    /// negotiation (asked for the device features) this many seconds after
    /// connecting.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    handshake_timeout_s: u64,
    /// End a guest process's worker when its GPU work keeps one of its
    /// calls waiting longer than this many seconds (a kernel that does not
    /// end); the guest sees CUDA_ERROR_LAUNCH_TIMEOUT. 0: no watchdog.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    kernel_timeout_s: u64,
    /// Device memory the tenant's guests may take, all of them together
    /// (for example 256MiB, 16GiB); their devices show it as their total
    /// memory. Default: no limit.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<u64>,
    /// Internal: the tenant's memory budget page.
    #[arg(long, value_name = "N", hide = true)]
    tenant_fd: Option<RawFd>,
    /// What a worker process (one per guest process) does about a system
    /// call outside its seccomp allow-list: end (enforce), let the kernel
    /// log it (log), or no filter (off).
    #[arg(long, value_enum, default_value_t = SeccompMode::Enforce)]
    worker_seccomp: SeccompMode,
    /// Print the backend's capabilities as JSON and exit (other options are
    /// ignored).
    #[arg(long)]
    print_capabilities: bool,
    /// Internal: serve one connection, number N, that the parent process
    /// that started us hands over on --fd.
    #[arg(long, value_name = "N", hide = true, requires_all = ["fd", "notify_fd", "counters_fd"])]
    serve_one_connection: Option<u64>,
    /// Internal: the pipe to tell the parent how start-up went.
    #[arg(long, value_name = "N", hide = true, requires = "serve_one_connection")]
    notify_fd: Option<RawFd>,
    /// Internal: the shared page to count into.
    #[arg(long, value_name = "N", hide = true)]
    counters_fd: Option<RawFd>,
    /// Internal: be worker process ID (`CONN.N`) of a connection process,
    /// which talks to us on --fd.
    #[arg(
        long,
        value_name = "ID",
        hide = true,
        requires = "fd",
        conflicts_with = "serve_one_connection"
    )]
    serve_worker: Option<String>,
}

/// A size with an optional binary or decimal unit: `4096`, `256MiB`,
/// `16GiB`, `512MB`, `1TB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number of bytes, such as 256MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The executor; `announce` says once (in the connection process) that a
/// `sim` one is no GPU.
fn make_executor(
    kind: ExecutorKind,
    gpu: u32,
    announce: bool,
) -> Result<Arc<dyn Executor>, String> {
    match kind {
        ExecutorKind::Cuda => rgpu_executor::cuda::CudaExecutor::new(gpu)
            .map(|e| Arc::new(e) as Arc<dyn Executor>)
            .map_err(|e| e.to_string()),
        ExecutorKind::Sim => {
            if announce {
                warn!("executor `sim`: a test fixture without a GPU; real programs will not run");
            }
            Ok(Arc::new(rgpu_executor::sim::SimExecutor::new()))
        }
    }
}

/// The parent: owns the sockets, keeps a process ready for the next
/// connection, answers the stats socket; never touches the GPU.
fn run(args: Args) -> Result<(), String> {
    signals::block_termination().map_err(|e| format!("cannot block signals: {e}"))?;

    let mut created = Vec::new();
    let listener = match (&args.socket_path, args.fd) {
        (Some(path), None) => {
            let listener = socket::bind(path).map_err(|e| e.to_string())?;
            created.push(path.clone());
            listener
        }
        (None, Some(fd)) => socket::inherit(fd).map_err(|e| e.to_string())?,
        _ => return Err("give exactly one of --socket-path and --fd".into()),
    };
    let child_args: Vec<OsString> = vec![
        "--gpu".into(),
        args.gpu.to_string().into(),
        "--executor".into(),
        args.executor.name().into(),
        "--handshake-timeout-s".into(),
        args.handshake_timeout_s.to_string().into(),
        "--kernel-timeout-s".into(),
        args.kernel_timeout_s.to_string().into(),
        "--worker-seccomp".into(),
        args.worker_seccomp.name().into(),
    ];
    let max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    let handshake_timeout = Duration::from_secs(args.handshake_timeout_s);
    let tenant = match TenantPage::create(args.memory_limit.unwrap_or(UNLIMITED)) {
        Ok(page) => Arc::new(page),
        Err(e) => {
            remove_all(&created);
            return Err(format!("cannot create the tenant's memory budget: {e}"));
        }
    };
    let supervisor = match Supervisor::new(
        listener,
        child_args,
        max_connections,
        handshake_timeout,
        tenant,
    ) {
        Ok(supervisor) => Arc::new(supervisor),
        Err(e) => {
            remove_all(&created);
            return Err(e.to_string());
        }
    };
    let started = start_parent_threads(&args, &supervisor, &mut created);
    if let Err(e) = started {
        supervisor.terminate(CHILDREN_GRACE);
        remove_all(&created);
        return Err(e);
    }

    let where_ = args
        .socket_path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| format!("fd {}", args.fd.unwrap_or_default()));
    let error = supervisor.run(|gpus, driver| {
        info!(
            "serving on {where_} with executor {} ({gpus} GPU(s), driver {driver}), \
             one process per connection",
            args.executor.name()
        )
    });
    supervisor.terminate(CHILDREN_GRACE);
    remove_all(&created);
    Err(error.to_string())
}

/// The stats socket (if asked for) and the signal thread; adds the sockets
/// it creates to `created`.
fn start_parent_threads(
    args: &Args,
    supervisor: &Arc<Supervisor>,
    created: &mut Vec<PathBuf>,
) -> Result<(), String> {
    if let Some(path) = &args.stats_socket {
        let stats_listener = socket::bind(path).map_err(|e| e.to_string())?;
        created.push(path.clone());
        let totals = Arc::clone(supervisor);
        stats::spawn(stats_listener, args.executor.name(), move || {
            totals.totals()
        })
        .map_err(|e| format!("cannot start the stats socket: {e}"))?;
    }
    let terminating = Arc::clone(supervisor);
    signals::exit_on_termination(created.clone(), move || {
        terminating.terminate(CHILDREN_GRACE)
    })
    .map_err(|e| format!("cannot start the signal thread: {e}"))
}

fn remove_all(paths: &[PathBuf]) {
    for path in paths {
        let _ = std::fs::remove_file(path);
    }
}

/// How a connection process ended badly.
enum ChildError {
    /// Told the parent already, which reports it.
    Reported,
    Other(String),
}

/// A child: starts the executor, takes one connection from the parent on
/// the inherited hand-off socket, serves it, and exits when it ends.
/// Exiting frees everything the GPU driver held for this tenant, whatever
/// state it was left in.
fn serve_one_connection(args: Args, conn: u64) -> Result<(), ChildError> {
    let other = ChildError::Other;
    signals::block_termination().map_err(|e| other(format!("cannot block signals: {e}")))?;
    // SIGTERM from the parent (or its death): the process exit is the
    // teardown.
    signals::exit_on_termination(Vec::new(), || {})
        .map_err(|e| other(format!("cannot start the signal thread: {e}")))?;
    let (Some(fd), Some(notify_fd), Some(counters_fd)) =
        (args.fd, args.notify_fd, args.counters_fd)
    else {
        return Err(other(
            "--serve-one-connection needs --fd, --notify-fd and --counters-fd".into(),
        ));
    };
    let mut notifier =
        Notifier::inherit(notify_fd).map_err(|e| other(format!("--notify-fd {notify_fd}: {e}")))?;
    let page = shared_counters::map_inherited(counters_fd)
        .map_err(|e| other(format!("--counters-fd {counters_fd}: {e}")))?;
    let tenant = match args.tenant_fd {
        Some(fd) => Some(Arc::new(
            TenantPage::inherit(fd).map_err(|e| other(format!("--tenant-fd {fd}: {e}")))?,
        )),
        None => None,
    };
    let budget = tenant.clone().map(|t| t as Arc<dyn MemoryBudget>);
    let memory_limit = budget.as_ref().and_then(|b| b.limit());
    let accounting = Accounting::start(Arc::new(Counters::shared(page)), budget)
        .map_err(|e| other(format!("cannot start the accounting thread: {e}")))?;
    let launcher = WorkerLauncher::new(
        std::env::current_exe().map_err(|e| other(format!("cannot find this executable: {e}")))?,
        conn,
        executor_args(&args),
        Arc::clone(&accounting),
        tenant,
        WorkerLimits::default(),
    );
    let executor = match make_executor(args.executor, args.gpu, true) {
        Ok(executor) => executor,
        Err(e) => {
            return Err(match notifier.send(&Message::Failed(e.clone())) {
                Ok(()) => ChildError::Reported,
                Err(_) => other(e),
            })
        }
    };
    notifier
        .send(&Message::Ready {
            gpus: executor.devices().len(),
            driver: executor.driver_version(),
        })
        .map_err(|e| other(format!("cannot tell the parent: {e}")))?;
    let control = handoff::inherit_control(fd).map_err(|e| other(e.to_string()))?;
    let shared = DaemonShared::new(
        executor,
        Arc::clone(accounting.own()),
        Arc::new(launcher),
        memory_limit,
    );
    let handshake_timeout = Duration::from_secs(args.handshake_timeout_s);
    daemon::serve_one(control, shared, conn, handshake_timeout, move || {
        if let Err(e) = notifier.send(&Message::Accepted) {
            warn!("cannot tell the parent about the connection: {e}");
        }
    })
    .map_err(|e| other(e.to_string()))
}

/// `--executor` and `--gpu` as the children get them.
fn executor_args(args: &Args) -> Vec<OsString> {
    vec![
        "--gpu".into(),
        args.gpu.to_string().into(),
        "--executor".into(),
        args.executor.name().into(),
        "--kernel-timeout-s".into(),
        args.kernel_timeout_s.to_string().into(),
        "--worker-seccomp".into(),
        args.worker_seccomp.name().into(),
    ]
}

/// A worker process: runs one guest process's contexts for the connection
/// process that started it, until that one closes the link.
fn serve_worker(args: Args) -> Result<(), String> {
    signals::block_termination().map_err(|e| format!("cannot block signals: {e}"))?;
    signals::exit_on_termination(Vec::new(), || {})
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    let fd = args.fd.ok_or("--serve-worker needs --fd")?;
    // SAFETY: the connection process passed us this descriptor to own.
    let link = Link::from_fd(unsafe { OwnedFd::from_raw_fd(fd) });
    let counters = match args.counters_fd {
        Some(fd) => Counters::shared(
            shared_counters::map_inherited(fd).map_err(|e| format!("--counters-fd {fd}: {e}"))?,
        ),
        None => Counters::default(),
    };
    let executor = make_executor(args.executor, args.gpu, false)?;
    // From here on NVIDIA's driver is loaded and its devices are open.
    seccomp::install(args.worker_seccomp).map_err(|e| e.to_string())?;
    let kernel_timeout =
        (args.kernel_timeout_s > 0).then(|| Duration::from_secs(args.kernel_timeout_s));
    let budget = match args.tenant_fd {
        Some(fd) => Some(Arc::new(
            TenantPage::inherit(fd).map_err(|e| format!("--tenant-fd {fd}: {e}"))?,
        ) as Arc<dyn MemoryBudget>),
        None => None,
    };
    worker_process::serve::serve(link, executor, Arc::new(counters), kernel_timeout, budget)
        .map_err(|e| e.to_string())
}

/// Logging of a connection process: the daemon's stderr, each line naming
/// the connection and the process.
fn init_child_logging(conn: impl std::fmt::Display + Send + Sync + 'static) {
    let pid = std::process::id();
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RGPU_LOG", "info"))
        .format(move |buf, record| {
            writeln!(
                buf,
                "[{} {:<5} {} {conn} pid {pid}] {}",
                buf.timestamp(),
                record.level(),
                record.target(),
                record.args()
            )
        })
        .init();
}

fn main() -> ExitCode {
    // QEMU runs `--print-capabilities` alone, but other options must not
    // make it fail.
    if std::env::args()
        .skip(1)
        .any(|a| a == "--print-capabilities")
    {
        println!("{CAPABILITIES}");
        return ExitCode::SUCCESS;
    }
    let args = Args::parse();
    if let Some(id) = args.serve_worker.clone() {
        init_child_logging(format!("worker {id}"));
        // The GPU driver prints device printf output on this process's
        // stdout: capture it for the guests (the log stays on stderr).
        if let Err(e) = rgpu_session::console::capture_stdout() {
            warn!("cannot capture stdout for GPU printf output: {e}");
        }
        return match serve_worker(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(conn) = args.serve_one_connection {
        init_child_logging(format!("conn {conn}"));
        return match serve_one_connection(args, conn) {
            Ok(()) => ExitCode::SUCCESS,
            Err(ChildError::Reported) => ExitCode::FAILURE,
            Err(ChildError::Other(e)) => {
                error!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RGPU_LOG", "info")).init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size(" 1TB "), Ok(1_000_000_000_000));
        for bad in ["", "MiB", "12XB", "-1GiB", "1.5GiB", "99999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
