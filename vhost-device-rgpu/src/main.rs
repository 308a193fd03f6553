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
use rgpu_executor::cpu_list::CpuList;
use rgpu_executor::Executor;
use rgpu_session::{
    ComputeGate, Counters, IpcRegistry, MemoryBudget, SessionSettings, ShareableRegistry, Tenant,
};
use vhost_device_rgpu::config::{parse_size, Config, DaemonSettings, TenantSettings};
use vhost_device_rgpu::shareable_broker::BrokerClient;
use vhost_device_rgpu::signals::CreatedFiles;
use vhost_device_rgpu::supervisor::{Message, Notifier};
use vhost_device_rgpu::tenant_page::TenantPage;
use vhost_device_rgpu::tenants::{Endpoint, TenantLaunch, TenantSpec, Tenants, DEFAULT_TENANT};
use vhost_device_rgpu::virtio_gpu::DaemonShared;
use vhost_device_rgpu::worker_process::containment::WorkerLimits;
use vhost_device_rgpu::worker_process::link::Link;
use vhost_device_rgpu::worker_process::seccomp::{self, SeccompMode};
use vhost_device_rgpu::worker_process::{Accounting, WorkerLauncher};
use vhost_device_rgpu::{
    control, ctl, daemon, handoff, limits, metrics, scheduler, shared_counters, signals, socket,
    stats, top, worker_process,
};

/// What QEMU's vhost-user.rst "Backend program conventions" ask
/// `--print-capabilities` to print.
const CAPABILITIES: &str = "{\n  \"type\": \"gpu\"\n}";

/// How long the parent waits for a tenant's connection processes to end
/// (at exit, or when the tenant is removed).
const CHILDREN_GRACE: Duration = Duration::from_secs(3);

/// A feature on or off, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

impl Switch {
    fn name(self) -> &'static str {
        match self {
            Switch::On => "on",
            Switch::Off => "off",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExecutorKind {
    /// NVIDIA's driver (libcuda), the real thing.
    Cuda,
    /// Host memory and a few reference kernels: a test fixture for machines
    /// without a GPU, not a way to run real programs (left out of the
    /// packaged daemon).
    #[cfg(feature = "sim")]
    Sim,
}

impl ExecutorKind {
    /// The name on the command line, as `Executor::kind` reports it.
    fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            #[cfg(feature = "sim")]
            Self::Sim => "sim",
        }
    }
}

/// vhost-user backend of a compute-only virtio-gpu device that runs guests'
/// CUDA on a host GPU.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Tools that talk to a running daemon.
    #[command(subcommand)]
    tool: Option<Tool>,
    /// Listen for vhost-user frontends on this Unix socket (a stale socket
    /// there is replaced). Each connection is a VM or a local process.
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present_any = ["fd", "config", "listen"],
        conflicts_with_all = ["fd", "config"]
    )]
    socket_path: Option<PathBuf>,
    /// Serve remote clients (guest-lib with RGPU_SERVER=tls://HOST:PORT)
    /// on this TCP address, with mutual TLS 1.3 (--tls-cert, --tls-key,
    /// --tls-client-ca). A client certificate's common name is its
    /// tenant's name (any client of the CA is the one tenant's without
    /// --config). Works without --socket-path.
    #[arg(long, value_name = "ADDR", conflicts_with = "fd")]
    listen: Option<std::net::SocketAddr>,
    /// The daemon's certificate chain (PEM) for --listen and tenants'
    /// `listen`.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_client_ca"])]
    tls_cert: Option<PathBuf>,
    /// The daemon's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) whose certificates clients must show.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Also serve plaintext clients (RGPU_SERVER=tcp://HOST:PORT) on
    /// listeners of one tenant, unauthenticated: for loopback tests only.
    #[arg(long)]
    allow_plaintext: bool,
    /// Serve the daemon settings and tenants a TOML file declares (see
    /// the README); --socket-path alone serves one tenant, "default".
    #[arg(long, value_name = "FILE", conflicts_with = "fd")]
    config: Option<PathBuf>,
    /// Serve an inherited listening Unix socket instead of --socket-path.
    #[arg(long, value_name = "N")]
    fd: Option<RawFd>,
    /// Host GPU ordinal offered to guests (they see it as device 0); a
    /// tenant's `gpu` in --config overrides it.
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
    /// memory. Default: no limit. With --config, each tenant's
    /// `memory_limit` says it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "config")]
    memory_limit: Option<u64>,
    /// Answer `vhost-device-rgpu ctl` on this Unix socket (for the
    /// daemon's user only): list the tenants, change their settings, add
    /// and remove tenants, live. Overrides `control_socket` of --config.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (for example
    /// 127.0.0.1:9400; port 0 picks a free port, which the log names).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// How long a session's host thread polls its ring for more work
    /// before it sleeps, in microseconds.
    #[arg(long, value_name = "US", env = "RGPU_HOST_SPIN_US", default_value_t = rgpu_session::settings::DEFAULT_SPIN_US)]
    host_spin_us: u64,
    /// How often, while commands keep coming, a session asks the driver
    /// whether the events and streams the guest may query are done, in
    /// microseconds (more: fewer driver calls between launches, staler
    /// query answers).
    #[arg(long, value_name = "US", env = "RGPU_HOST_LOOK_US", default_value_t = rgpu_session::settings::DEFAULT_LOOK_US)]
    host_look_us: u64,
    /// Diagnosis: each session times every kernel launch it runs (reading
    /// it from the ring, executing it, the bookkeeping after) and logs the
    /// averages at info level when it ends.
    #[arg(long, env = "RGPU_PROFILE_LAUNCHES", value_parser = clap::builder::BoolishValueParser::new())]
    profile_launches: bool,
    /// Module images kept for reuse across the guest processes of a
    /// tenant, in MiB (0: none).
    #[arg(long, value_name = "MIB", env = "RGPU_MODULE_CACHE_MB", default_value_t = rgpu_session::module_cache::DEFAULT_CAPACITY_MB)]
    module_cache_mb: u64,
    /// Also keep module images in this directory, for every process that
    /// names it (default: a private directory per tenant).
    #[arg(long, value_name = "DIR", env = "RGPU_MODULE_CACHE_DIR")]
    module_cache_dir: Option<PathBuf>,
    /// Internal: the tenant's memory budget page.
    #[arg(long, value_name = "N", hide = true)]
    tenant_fd: Option<RawFd>,
    /// Internal: the tenant's registry of shareable handles.
    #[arg(long, value_name = "N", hide = true)]
    shareable_fd: Option<RawFd>,
    /// Tests: map at most N page runs of blobs per worker process (fewer
    /// than the kernel's `vm.max_map_count` allows), so that too scattered
    /// a blob is refused without a huge one.
    #[arg(long, value_name = "N", env = "RGPU_MAX_MAPPED_RUNS", hide = true)]
    max_mapped_runs: Option<usize>,
    /// Internal: the tenant a connection or worker process serves (its
    /// log lines say so).
    #[arg(long, value_name = "NAME", hide = true)]
    tenant_name: Option<String>,
    /// What a worker process (one per guest process) does about a system
    /// call outside its seccomp allow-list: end (enforce), let the kernel
    /// log it (log), or no filter (off).
    #[arg(long, value_enum, default_value_t = SeccompMode::Enforce)]
    worker_seccomp: SeccompMode,
    /// Whether each guest context's kernel launches go to the driver from a
    /// thread of their own, while the session's thread reads the next
    /// command (on: launches overlap the session's work; off: one thread
    /// does both, one after the other). That thread polls for more as long
    /// as the session's (--host-spin-us).
    #[arg(long, value_enum, env = "RGPU_LAUNCH_THREAD", default_value_t = Switch::On)]
    launch_thread: Switch,
    /// The CPUs each launch thread runs on, as `taskset -c` lists them
    /// (`2`, `0,4-7`); by default the scheduler's choice. The driver's
    /// launch rate depends on the CPU that calls it, so a thread the
    /// scheduler moves launches at a rate that moves with it.
    #[arg(long, value_name = "LIST", env = "RGPU_LAUNCH_CPUS")]
    launch_cpus: Option<CpuList>,
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

/// Tools of the same binary that talk to a running daemon.
#[derive(Debug, clap::Subcommand)]
enum Tool {
    /// List tenants, change their settings live, add or remove them,
    /// through the daemon's control socket.
    Ctl(ctl::CtlArgs),
    /// Each tenant's use, as a table refreshed in place.
    Top(top::TopArgs),
}

/// How the cuda executor's contexts launch: the launch thread's spin time
/// (`None`: no thread), whether it profiles itself, and its CPUs.
#[derive(Debug, Clone)]
struct Launching {
    thread_spin: Option<Duration>,
    profile: bool,
    cpus: Option<CpuList>,
}

fn launching(args: &Args) -> Launching {
    Launching {
        thread_spin: (args.launch_thread == Switch::On)
            .then(|| Duration::from_micros(args.host_spin_us)),
        profile: args.profile_launches,
        cpus: args.launch_cpus.clone(),
    }
}

/// The executor; `announce` says once (in the connection process) that a
/// `sim` one is no GPU.
#[cfg_attr(not(feature = "sim"), allow(unused_variables))]
fn make_executor(
    kind: ExecutorKind,
    gpu: u32,
    launching: Launching,
    announce: bool,
) -> Result<Arc<dyn Executor>, String> {
    match kind {
        ExecutorKind::Cuda => rgpu_executor::cuda::CudaExecutor::new(gpu)
            .map(|e| {
                Arc::new(
                    e.with_launch_thread(launching.thread_spin)
                        .with_launch_profile(launching.profile)
                        .with_launch_cpus(launching.cpus),
                ) as Arc<dyn Executor>
            })
            .map_err(|e| e.to_string()),
        #[cfg(feature = "sim")]
        ExecutorKind::Sim => {
            if announce {
                warn!("executor `sim`: a test fixture without a GPU; real programs will not run");
            }
            Ok(Arc::new(rgpu_executor::sim::SimExecutor::new()))
        }
    }
}

/// What the parent serves: the tenants of --config with its daemon
/// settings, or the one tenant "default" of --socket-path or --fd.
fn what_to_serve(
    args: &Args,
    created: &CreatedFiles,
) -> Result<(DaemonSettings, Vec<TenantSpec>), String> {
    if let Some(path) = &args.config {
        let config = Config::load(path).map_err(|e| e.to_string())?;
        let specs = config.tenants.into_iter().map(TenantSpec::from).collect();
        return Ok((config.daemon, specs));
    }
    let endpoint = match (&args.socket_path, args.fd, args.listen) {
        (Some(path), None, _) => Endpoint::Socket(path.clone()),
        (None, Some(fd), None) => Endpoint::InheritedFd(fd),
        // Remote clients only: the tenant's socket (where the gateway
        // connects for them) is private.
        (None, None, Some(_)) => Endpoint::Socket(private_socket(created)?),
        _ => return Err("give exactly one of --socket-path, --fd and --config".into()),
    };
    let default = TenantSpec {
        name: DEFAULT_TENANT.into(),
        endpoint,
        gpu: None,
        listen: None,
        settings: TenantSettings {
            memory_limit: args.memory_limit,
            ..TenantSettings::default()
        },
    };
    Ok((DaemonSettings::default(), vec![default]))
}

/// A socket path in a directory of the daemon's own (mode 0700, in
/// `created`), for a tenant that only remote clients use. A directory of
/// that name that exists already is someone else's, or what a daemon that
/// had this pid before left when it was killed: the next name is tried.
fn private_socket(created: &CreatedFiles) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    const NAMES_TRIED: u32 = 100;
    let pid = std::process::id();
    for attempt in 0..NAMES_TRIED {
        let name = match attempt {
            0 => format!("rgpu-remote-{pid}"),
            n => format!("rgpu-remote-{pid}-{n}"),
        };
        let dir = std::env::temp_dir().join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                created.add(dir.clone());
                return Ok(dir.join("tenant.sock"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "cannot create a private socket directory in {}: {NAMES_TRIED} names for pid {pid} exist",
        std::env::temp_dir().display()
    ))
}

/// The remote listeners of `--listen` and of tenants' `listen`, with the
/// TLS files read.
fn remote_listeners(
    args: &Args,
    specs: &[TenantSpec],
) -> Result<Vec<vhost_device_rgpu::remote::ListenerConfig>, String> {
    use vhost_device_rgpu::remote::{tls, Admission, ListenerConfig};
    let mut wanted: Vec<(std::net::SocketAddr, Admission)> = Vec::new();
    if let Some(address) = args.listen {
        let admission = match &args.config {
            Some(_) => Admission::Named,
            None => Admission::Only(DEFAULT_TENANT.into()),
        };
        wanted.push((address, admission));
    }
    for spec in specs {
        if let Some(address) = spec.listen {
            if wanted.iter().any(|(a, _)| *a == address) {
                return Err(format!(
                    "--listen {address} is tenant {:?}'s listen too",
                    spec.name
                ));
            }
            wanted.push((address, Admission::Tenant(spec.name.clone())));
        }
    }
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let tls =
        match (&args.tls_cert, &args.tls_key, &args.tls_client_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                Some(tls::server_config(cert, key, ca).map_err(|e| e.to_string())?)
            }
            _ if args.allow_plaintext => None,
            _ => return Err(
                "--listen and a tenant's listen need --tls-cert, --tls-key and --tls-client-ca \
                 (or --allow-plaintext for unauthenticated loopback tests)"
                    .into(),
            ),
        };
    wanted
        .into_iter()
        .map(|(address, admission)| {
            if tls.is_none() && !address.ip().is_loopback() {
                return Err(format!(
                    "listen {address}: plaintext is for loopback tests only; give TLS files"
                ));
            }
            Ok(ListenerConfig {
                address,
                tls: tls.clone(),
                allow_plaintext: args.allow_plaintext,
                admission,
                spin: Duration::from_micros(args.host_spin_us),
            })
        })
        .collect()
}

/// The parent: owns the sockets, keeps a process ready for each tenant's
/// next connection, answers the stats and control sockets; never touches
/// the GPU.
fn run(args: Args) -> Result<(), String> {
    signals::block_termination().map_err(|e| format!("cannot block signals: {e}"))?;
    let created = CreatedFiles::default();
    let served = what_to_serve(&args, &created).and_then(|served| match &args.launch_cpus {
        Some(cpus) => cpus
            .check_usable()
            .map(|()| served)
            .map_err(|e| format!("--launch-cpus {cpus}: cannot run a thread there: {e}")),
        None => Ok(served),
    });
    let (daemon_settings, specs) = served.inspect_err(|_| created.remove_all())?;
    let tenants = Arc::new(Tenants::new(
        TenantLaunch {
            executor: args.executor.name(),
            default_gpu: args.gpu,
            child_args: vec![
                "--executor".into(),
                args.executor.name().into(),
                "--handshake-timeout-s".into(),
                args.handshake_timeout_s.to_string().into(),
                "--kernel-timeout-s".into(),
                args.kernel_timeout_s.to_string().into(),
                "--worker-seccomp".into(),
                args.worker_seccomp.name().into(),
                "--launch-thread".into(),
                args.launch_thread.name().into(),
            ]
            .into_iter()
            .chain(session_args(&args))
            .collect(),
            private_module_cache: args.module_cache_dir.is_none(),
            max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
            handshake_timeout: Duration::from_secs(args.handshake_timeout_s),
            grace: CHILDREN_GRACE,
        },
        created.clone(),
    ));
    // Before anything is created: a signal during start-up cleans up too.
    let terminating = Arc::clone(&tenants);
    signals::exit_on_termination(created.clone(), move || terminating.terminate_all()).map_err(
        |e| {
            created.remove_all();
            format!("cannot start the signal thread: {e}")
        },
    )?;
    match start_serving(&args, &daemon_settings, specs, &tenants, &created) {
        Ok(_metrics_server) => {
            // Each tenant is served from a thread of its own until SIGTERM
            // or SIGINT, when the signal thread terminates them all and
            // exits the process.
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            tenants.terminate_all();
            created.remove_all();
            Err(e)
        }
    }
}

/// Starts every tenant (returning once each has a process ready, or with
/// the first failure), then the stats socket, the control socket and the
/// metrics endpoint, each if asked for; adds the sockets it creates to
/// `created`.
fn start_serving(
    args: &Args,
    daemon_settings: &DaemonSettings,
    specs: Vec<TenantSpec>,
    tenants: &Arc<Tenants>,
    created: &CreatedFiles,
) -> Result<Option<metrics::MetricsServer>, String> {
    let listeners = remote_listeners(args, &specs)?;
    tenants.start(specs).map_err(|e| e.to_string())?;
    let scheduled = Arc::downgrade(tenants);
    std::thread::Builder::new()
        .name("rgpu-scheduler".into())
        .spawn(move || scheduler::run(scheduled))
        .map_err(|e| format!("cannot start the scheduler: {e}"))?;
    if let Some(path) = &args.stats_socket {
        let stats_listener = socket::bind(path).map_err(|e| e.to_string())?;
        created.add(path.clone());
        // The sum over tenants, as the single tenant's before.
        let totals = Arc::clone(tenants);
        stats::spawn(stats_listener, args.executor.name(), move || {
            totals.totals()
        })
        .map_err(|e| format!("cannot start the stats socket: {e}"))?;
    }
    let control_socket = args
        .control_socket
        .as_ref()
        .or(daemon_settings.control_socket.as_ref());
    if let Some(path) = control_socket {
        let control_listener = socket::bind_owner_only(path).map_err(|e| e.to_string())?;
        created.add(path.clone());
        control::spawn(control_listener, Arc::clone(tenants))
            .map_err(|e| format!("cannot start the control socket: {e}"))?;
        info!("control socket on {}", path.display());
    }
    if !listeners.is_empty() {
        vhost_device_rgpu::remote::serve(listeners, tenants).map_err(|e| e.to_string())?;
    }
    start_metrics(
        args.metrics_listen.or(daemon_settings.metrics_listen),
        tenants,
    )
    .map_err(|e| e.to_string())
}

/// The Prometheus endpoint, if `--metrics-listen` or `metrics_listen` in
/// the config asks for it: one sample per tenant, from the registry.
fn start_metrics(
    listen: Option<std::net::SocketAddr>,
    tenants: &Arc<Tenants>,
) -> Result<Option<metrics::MetricsServer>, metrics::MetricsError> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let source: Arc<dyn metrics::MetricsSource> = Arc::clone(tenants) as _;
    metrics::serve(listen, source).map(Some)
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
    signals::exit_on_termination(CreatedFiles::default(), || {})
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
    let tenant = inherit_tenant(args.tenant_fd).map_err(other)?;
    // The capset shows the tenant's limit as its devices' memory.
    let capset_budget = tenant.clone().map(|t| t as Arc<dyn MemoryBudget>);
    let accounting = Accounting::start(Arc::new(Counters::shared(page)), tenant.clone())
        .map_err(|e| other(format!("cannot start the accounting thread: {e}")))?;
    let launcher = WorkerLauncher::new(
        std::env::current_exe().map_err(|e| other(format!("cannot find this executable: {e}")))?,
        conn,
        executor_args(&args),
        Arc::clone(&accounting),
        tenant,
        WorkerLimits::default(),
    )
    .with_shareable_fd(args.shareable_fd)
    .with_end_grace(if args.profile_launches {
        limits::PROFILE_END_GRACE
    } else {
        Duration::ZERO
    });
    let executor = match make_executor(args.executor, args.gpu, launching(&args), true) {
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
        capset_budget,
    );
    let handshake_timeout = Duration::from_secs(args.handshake_timeout_s);
    daemon::serve_one(control, shared, conn, handshake_timeout, move || {
        if let Err(e) = notifier.send(&Message::Accepted) {
            warn!("cannot tell the parent about the connection: {e}");
        }
    })
    .map_err(|e| other(e.to_string()))
}

/// `--executor`, `--gpu` (and the tenant's name) as the children get them.
fn executor_args(args: &Args) -> Vec<OsString> {
    let tenant_name = args
        .tenant_name
        .iter()
        .flat_map(|name| ["--tenant-name".into(), name.into()]);
    tenant_name
        .chain([
            "--gpu".into(),
            args.gpu.to_string().into(),
            "--executor".into(),
            args.executor.name().into(),
            "--kernel-timeout-s".into(),
            args.kernel_timeout_s.to_string().into(),
            "--worker-seccomp".into(),
            args.worker_seccomp.name().into(),
            "--launch-thread".into(),
            args.launch_thread.name().into(),
        ])
        .chain(session_args(args))
        .collect()
}

/// The sessions' settings as a child gets them.
fn session_args(args: &Args) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        "--host-spin-us".into(),
        args.host_spin_us.to_string().into(),
        "--host-look-us".into(),
        args.host_look_us.to_string().into(),
        "--module-cache-mb".into(),
        args.module_cache_mb.to_string().into(),
    ];
    if let Some(dir) = &args.module_cache_dir {
        out.push("--module-cache-dir".into());
        out.push(dir.into());
    }
    if args.profile_launches {
        out.push("--profile-launches".into());
    }
    if let Some(cpus) = &args.launch_cpus {
        out.push("--launch-cpus".into());
        out.push(cpus.to_string().into());
    }
    if let Some(runs) = args.max_mapped_runs {
        out.push("--max-mapped-runs".into());
        out.push(runs.to_string().into());
    }
    out
}

/// A worker process: runs one guest process's contexts for the connection
/// process that started it, until that one closes the link.
fn serve_worker(args: Args) -> Result<(), String> {
    signals::block_termination().map_err(|e| format!("cannot block signals: {e}"))?;
    signals::exit_on_termination(CreatedFiles::default(), || {})
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
    let executor = make_executor(args.executor, args.gpu, launching(&args), false)?;
    // From here on NVIDIA's driver is loaded and its devices are open.
    seccomp::install(args.worker_seccomp).map_err(|e| e.to_string())?;
    let kernel_timeout =
        (args.kernel_timeout_s > 0).then(|| Duration::from_secs(args.kernel_timeout_s));
    let settings = SessionSettings {
        profile_launches: args.profile_launches,
        ..SessionSettings::new(
            args.host_spin_us,
            args.host_look_us,
            args.module_cache_mb,
            args.module_cache_dir.clone(),
        )
    };
    // SAFETY: the connection process passed us this descriptor to own.
    let broker = args
        .shareable_fd
        .map(|fd| Arc::new(unsafe { BrokerClient::inherit(fd) }));
    let tenant = match inherit_tenant(args.tenant_fd)? {
        Some(page) => Tenant::with_shares(
            Some(Arc::clone(&page) as Arc<dyn MemoryBudget>),
            Some(Arc::clone(&page) as Arc<dyn ComputeGate>),
            Some(page as Arc<dyn IpcRegistry>),
            broker.clone().map(|b| b as Arc<dyn ShareableRegistry>),
            broker.map(|b| b as Arc<dyn rgpu_session::ShareLedger>),
            settings,
        ),
        None => Tenant::with_settings(settings),
    };
    worker_process::serve::serve(
        link,
        executor,
        Arc::new(counters),
        kernel_timeout,
        args.max_mapped_runs,
        tenant,
    )
    .map_err(|e| e.to_string())
}

/// The tenant's budget page a child inherited as `--tenant-fd`, if any.
fn inherit_tenant(fd: Option<RawFd>) -> Result<Option<Arc<TenantPage>>, String> {
    fd.map(|fd| {
        TenantPage::inherit(fd)
            .map(Arc::new)
            .map_err(|e| format!("--tenant-fd {fd}: {e}"))
    })
    .transpose()
}

/// `what` a child process is, with its tenant's name when it has one.
fn child_label(args: &Args, what: String) -> String {
    match &args.tenant_name {
        Some(tenant) => format!("{tenant} {what}"),
        None => what,
    }
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
    match args.tool {
        Some(Tool::Ctl(ctl)) => return ctl::run(ctl),
        Some(Tool::Top(top)) => return top::run(top),
        None => {}
    }
    if let Some(id) = args.serve_worker.clone() {
        init_child_logging(child_label(&args, format!("worker {id}")));
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
        init_child_logging(child_label(&args, format!("conn {conn}")));
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
