//! vhost-device-rgpu: the rgpu host daemon (see the crate's library docs).

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use log::{error, info, warn};
use rgpu_executor::Executor;
use rgpu_session::Counters;
use vhost_device_rgpu::virtio_gpu::DaemonShared;
use vhost_device_rgpu::{daemon, signals, socket, stats};

/// What QEMU's vhost-user.rst "Backend program conventions" ask
/// `--print-capabilities` to print.
const CAPABILITIES: &str = "{\n  \"type\": \"gpu\"\n}";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExecutorKind {
    /// NVIDIA's driver (libcuda), the real thing.
    Cuda,
    /// Host memory and a few reference kernels: a test fixture for machines
    /// without a GPU, not a way to run real programs.
    Sim,
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
    /// Print the backend's capabilities as JSON and exit (other options are
    /// ignored).
    #[arg(long)]
    print_capabilities: bool,
}

fn make_executor(kind: ExecutorKind, gpu: u32) -> Result<Arc<dyn Executor>, String> {
    match kind {
        ExecutorKind::Cuda => rgpu_executor::cuda::CudaExecutor::new(gpu)
            .map(|e| Arc::new(e) as Arc<dyn Executor>)
            .map_err(|e| e.to_string()),
        ExecutorKind::Sim => {
            warn!("executor `sim`: a test fixture without a GPU; real programs will not run");
            Ok(Arc::new(rgpu_executor::sim::SimExecutor::new()))
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    signals::block_termination().map_err(|e| format!("cannot block signals: {e}"))?;

    let executor = make_executor(args.executor, args.gpu)?;
    let counters = Arc::new(Counters::default());
    let shared = DaemonShared::new(executor.clone(), counters.clone());

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
    if let Some(path) = &args.stats_socket {
        let stats_listener = socket::bind(path).map_err(|e| e.to_string())?;
        created.push(path.clone());
        stats::spawn(stats_listener, executor.kind(), counters)
            .map_err(|e| format!("cannot start the stats socket: {e}"))?;
    }
    signals::exit_on_termination(created.clone())
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

    info!(
        "serving on {} with executor {} ({} GPU(s), driver {})",
        args.socket_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("fd {}", args.fd.unwrap_or_default())),
        executor.kind(),
        executor.devices().len(),
        executor.driver_version()
    );
    let result = daemon::serve(listener, shared).map_err(|e| e.to_string());
    for path in &created {
        let _ = std::fs::remove_file(path);
    }
    result
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
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RGPU_LOG", "info")).init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
