//! `rgpu-diag`: tells a user what is wrong when rgpu does not work.
//!
//! Guest mode (default without `RGPU_SOCKET`): the render nodes, the
//! virtio-gpu device's features, the rgpu capset and protocol version, the
//! GPUs behind it, then a context and a round trip through the drm carrier.
//! Host mode (`--socket PATH` or `RGPU_SOCKET`): the same through the local
//! carrier; `--stats PATH` prints the daemon's stats line.
//! Prints OK/FAIL per step with a hint for each failure; exits 1 on failure.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rgpu_proto::capset::{device_attribute, Capset};
use rgpu_proto::cuda_result::CUDA_SUCCESS;
use rgpu_proto::reply::decode_u64s;
use rgpu_proto::{BlobRange, Command, CAPSET_ID_RGPU, PROTOCOL_VERSION};
use rgpu_transport::carrier::drm::{self, DrmCarrier, NodeStatus};
use rgpu_transport::carrier::local::LocalCarrier;
use rgpu_transport::{Carrier, CarrierError, Channel};

const USAGE: &str = "usage: rgpu-diag [--socket PATH] [--stats PATH] [--dri DIR]
  (no option)    guest mode: check the virtio-gpu render nodes in /dev/dri
  --socket PATH  host mode: check the vhost-device-rgpu daemon at PATH
                 (also taken from RGPU_SOCKET)
  --stats PATH   print the daemon's stats line from its stats socket
  --dri DIR      look for render nodes in DIR instead of /dev/dri";

const STATS_TIMEOUT: Duration = Duration::from_secs(5);

struct Options {
    socket: Option<PathBuf>,
    stats: Option<PathBuf>,
    dri: PathBuf,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        socket: std::env::var_os("RGPU_SOCKET")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        stats: None,
        dri: PathBuf::from(drm::DRI_DIR),
    };
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .map(PathBuf::from)
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match arg.to_str() {
            Some("--socket") => options.socket = Some(value("--socket")?),
            Some("--stats") => options.stats = Some(value("--stats")?),
            Some("--dri") => options.dri = value("--dri")?,
            Some("-h") | Some("--help") => return Err(String::new()),
            _ => return Err(format!("unknown argument {}", arg.to_string_lossy())),
        }
    }
    Ok(options)
}

/// Collects the outcome of the steps.
#[derive(Default)]
struct Steps {
    failed: bool,
}

impl Steps {
    fn ok(&self, what: &str) {
        println!("OK    {what}");
    }

    fn info(&self, what: &str) {
        println!("      {what}");
    }

    fn fail(&mut self, what: &str, hint: &str) {
        self.failed = true;
        println!("FAIL  {what}");
        if !hint.is_empty() {
            println!("      hint: {hint}");
        }
    }
}

fn yes(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "NO"
    }
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

fn current_user() -> String {
    // SAFETY: geteuid has no memory effects.
    let uid = unsafe { libc::geteuid() };
    // SAFETY: a zero-length query returns the number of groups.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; usize::try_from(count).unwrap_or(0)];
    // SAFETY: `groups` has room for `count` entries.
    let got = unsafe { libc::getgroups(count.max(0), groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(got).unwrap_or(0));
    let names: Vec<String> = groups.iter().map(|g| drm::group_name(*g)).collect();
    format!(
        "{} (groups: {})",
        drm::user_name(uid),
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    )
}

/// The capset: protocol version, executor, GPUs.
fn report_capset(steps: &Steps, capset: &Capset) {
    steps.ok(&format!(
        "protocol version: host {}, guest {PROTOCOL_VERSION}",
        capset.protocol_version
    ));
    steps.ok(&format!(
        "executor {}, host driver {}, {} GPU(s)",
        capset.executor,
        capset.driver_version,
        capset.devices.len()
    ));
    if capset.executor == "sim" {
        steps.info("(sim is a test fixture without a GPU: results come from host memory)");
    }
    for (i, d) in capset.devices.iter().enumerate() {
        let cc = match (
            d.attribute(device_attribute::COMPUTE_CAPABILITY_MAJOR),
            d.attribute(device_attribute::COMPUTE_CAPABILITY_MINOR),
        ) {
            (Some(major), Some(minor)) => format!("compute {major}.{minor}"),
            _ => "compute capability unknown".into(),
        };
        steps.info(&format!(
            "GPU {i}: {}, {} MiB, {cc} (host GPU {})",
            d.name,
            mib(d.total_mem),
            d.host_ordinal
        ));
    }
}

fn capset_hint(e: &CarrierError) -> String {
    match e {
        CarrierError::VersionMismatch { guest, host } => format!(
            "the guest library speaks protocol {guest} and the daemon {host}: install the \
             same rgpu release on both sides"
        ),
        _ => "the daemon answered with a capset this library cannot read: install the same \
              rgpu release on both sides"
            .into(),
    }
}

/// Context creation and one round trip (`MemGetInfo`).
fn check_session(steps: &mut Steps, carrier: Arc<dyn Carrier>) {
    if carrier.capset().devices.is_empty() {
        steps.fail(
            "the host offers no GPU",
            "start the daemon with a GPU it can use (--gpu N), or --executor sim for tests",
        );
        return;
    }
    match carrier.create_context("rgpu-diag") {
        Ok(ctx) => {
            steps.ok(&format!("context created (capset {CAPSET_ID_RGPU})"));
            if let Err(e) = carrier.destroy_context(ctx) {
                steps.fail(&format!("context destroy: {e}"), "");
            }
        }
        Err(e) => {
            steps.fail(
                &format!("context creation: {e}"),
                "look at the daemon's log: it says why it refused the context",
            );
            return;
        }
    }
    let started = Instant::now();
    let channel = match Channel::open(carrier, "rgpu-diag") {
        Ok(channel) => channel,
        Err(e) => {
            steps.fail(
                &format!("channel: {e}"),
                "guest blobs or fenced submissions do not reach the daemon; look at its log \
                 (RGPU_LOG=debug) and at dmesg in the guest",
            );
            return;
        }
    };
    match channel.call(&Command::MemGetInfo) {
        Ok(reply) if reply.result == CUDA_SUCCESS => match decode_u64s::<2>(&reply.payload) {
            Ok([free, total]) => steps.ok(&format!(
                "round trip: MemGetInfo free {} MiB of {} MiB ({:.1} ms with setup)",
                mib(free),
                mib(total),
                started.elapsed().as_secs_f64() * 1e3
            )),
            Err(e) => steps.fail(&format!("round trip: bad MemGetInfo reply: {e}"), ""),
        },
        Ok(reply) => steps.fail(
            &format!(
                "round trip: MemGetInfo answered CUDA error {}",
                reply.result
            ),
            "the daemon could not use its GPU; look at its log",
        ),
        Err(e) => steps.fail(
            &format!("round trip: {e}"),
            "the daemon did not answer; look at its log (RGPU_LOG=debug)",
        ),
    }
    check_shared_blob(steps, &channel);
    if let Err(e) = channel.close() {
        steps.fail(&format!("channel close: {e}"), "");
    }
}

/// Pinned host memory as `cuMemAllocHost` uses it: a blob made in another
/// context, attached to the channel's, copied to the GPU and back straight
/// from and into guest memory.
fn check_shared_blob(steps: &mut Steps, channel: &Channel) {
    let carrier = channel.carrier().clone();
    let owner = match carrier.create_context("rgpu-diag-blob") {
        Ok(ctx) => ctx,
        Err(e) => return steps.fail(&format!("second context: {e}"), ""),
    };
    let result = shared_blob_round_trip(carrier.as_ref(), owner, channel);
    if let Err(e) = carrier.destroy_context(owner) {
        steps.fail(&format!("second context destroy: {e}"), "");
    }
    match result {
        Ok(()) => steps.ok(&format!(
            "pinned memory: a {} KiB blob shared by two contexts went to the GPU and back",
            SHARED_BLOB_BYTES >> 10
        )),
        Err(why) => steps.fail(
            &format!("pinned memory: {why}"),
            "blob memory is not shared with the daemon as it should be; look at its log",
        ),
    }
}

const SHARED_BLOB_BYTES: usize = 256 << 10;

fn shared_blob_round_trip(
    carrier: &dyn Carrier,
    owner: u32,
    channel: &Channel,
) -> Result<(), String> {
    let blob = carrier
        .create_blob(owner, SHARED_BLOB_BYTES as u64)
        .map_err(|e| format!("blob: {e}"))?;
    let result = (|| {
        let half = SHARED_BLOB_BYTES / 2;
        let len = usize::try_from(blob.size).unwrap_or(0);
        if len < SHARED_BLOB_BYTES {
            return Err(format!(
                "blob of {len} bytes, asked for {SHARED_BLOB_BYTES}"
            ));
        }
        // SAFETY: the mapping is `blob.size` bytes long and this function
        // is its only user until the blob is destroyed.
        let bytes = unsafe { std::slice::from_raw_parts_mut(blob.ptr, SHARED_BLOB_BYTES) };
        let pattern = |i: usize| (i.wrapping_mul(131) ^ (i >> 8)) as u8;
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = if i < half { pattern(i) } else { 0 };
        }
        carrier
            .attach_blob(channel.ctx_id(), blob.resource_id)
            .map_err(|e| format!("attach: {e}"))?;
        let call = |command: &Command| match channel.call(command) {
            Ok(reply) if reply.result == CUDA_SUCCESS => Ok(reply.payload),
            Ok(reply) => Err(format!("CUDA error {}", reply.result)),
            Err(e) => Err(e.to_string()),
        };
        let payload = call(&Command::MemAlloc { size: half as u64 })?;
        let [device] = decode_u64s::<1>(&payload).map_err(|e| format!("MemAlloc: {e}"))?;
        let range = |offset: usize| BlobRange {
            resource_id: blob.resource_id,
            offset: offset as u64,
            length: half as u64,
        };
        let copied = call(&Command::MemcpyHtoD {
            stream: 0,
            dst: device,
            src: range(0),
        })
        .and_then(|_| {
            call(&Command::MemcpyDtoH {
                stream: 0,
                dst: range(half),
                src: device,
            })
        });
        let freed = call(&Command::MemFree { device_ptr: device });
        copied?;
        freed?;
        let (sent, back) = bytes.split_at(half);
        match sent.iter().zip(back).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!(
                "byte {i} came back as {:#04x}, sent {:#04x}",
                back.get(i).copied().unwrap_or_default(),
                sent.get(i).copied().unwrap_or_default()
            )),
        }
    })();
    let destroyed = carrier.destroy_blob(owner, blob.resource_id);
    result?;
    destroyed.map_err(|e| format!("blob destroy: {e}"))
}

fn guest_mode(steps: &mut Steps, dri: &Path) {
    println!(
        "rgpu-diag: guest mode (render nodes in {}), user {}",
        dri.display(),
        current_user()
    );
    let probed = drm::probe_nodes(dri);
    if let Ok(nodes) = &probed {
        for node in nodes {
            steps.info(&node.describe());
        }
    }
    let chosen = probed
        .as_ref()
        .ok()
        .and_then(|nodes| nodes.iter().find(|n| n.usable()));
    let Some(node) = chosen else {
        let hint = match &probed {
            Ok(nodes) if !nodes.is_empty() => {
                "each node listed above says why it does not serve rgpu".to_string()
            }
            _ => drm::no_device_reason(dri, &probed),
        };
        steps.fail(
            &format!(
                "no render node serves rgpu: looked for {}",
                drm::wanted(dri)
            ),
            &hint,
        );
        return;
    };
    let NodeStatus::VirtioGpu(params) = node.status else {
        return;
    };
    steps.ok(&format!(
        "render node {} ({}, {})",
        node.path.display(),
        drm::VIRTIO_GPU_DRIVER,
        node.permissions()
    ));
    steps.ok(&format!(
        "virtio-gpu: 3D {}, blob {}, context_init {}, capset mask {:#x}, debug names {}",
        yes(params.three_d),
        yes(params.resource_blob),
        yes(params.context_init),
        params.capset_mask,
        yes(params.explicit_debug_name)
    ));
    steps.ok(&format!("rgpu capset {CAPSET_ID_RGPU} offered"));
    let carrier = match DrmCarrier::open_node(&node.path, params) {
        Ok(carrier) => carrier,
        Err(e) => {
            let hint = capset_hint(&e);
            steps.fail(&format!("capset: {e}"), &hint);
            return;
        }
    };
    report_capset(steps, carrier.capset());
    check_session(steps, Arc::new(carrier));
}

fn host_mode(steps: &mut Steps, socket: &Path) {
    println!("rgpu-diag: host mode (daemon socket {})", socket.display());
    let carrier = match LocalCarrier::connect(socket) {
        Ok(carrier) => carrier,
        Err(e) => {
            let hint = match &e {
                CarrierError::Connect { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    "no socket there: is vhost-device-rgpu running with --socket-path at that path?"
                        .to_string()
                }
                CarrierError::Connect { source, .. }
                    if source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    "the socket's permissions do not let this user connect".to_string()
                }
                CarrierError::Connect { .. } => {
                    "nothing accepts connections there: is the daemon running?".to_string()
                }
                CarrierError::VersionMismatch { .. } | CarrierError::BadCapset(_) => {
                    capset_hint(&e)
                }
                _ => "the peer is not a working vhost-device-rgpu; look at its log".to_string(),
            };
            steps.fail(&format!("daemon: {e}"), &hint);
            return;
        }
    };
    steps.ok("connected; vhost-user handshake done; rgpu capset read");
    report_capset(steps, carrier.capset());
    check_session(steps, Arc::new(carrier));
}

fn print_stats(steps: &mut Steps, path: &Path) {
    let read = || -> std::io::Result<String> {
        let mut stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(STATS_TIMEOUT))?;
        let mut line = String::new();
        stream.read_to_string(&mut line)?;
        Ok(line)
    };
    match read() {
        Ok(line) => {
            steps.ok(&format!("stats from {}:", path.display()));
            steps.info(line.trim_end());
        }
        Err(e) => steps.fail(
            &format!("stats socket {}: {e}", path.display()),
            "start the daemon with --stats-socket PATH",
        ),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RGPU_LOG", "warn")).init();
    let options = match parse_args() {
        Ok(options) => options,
        Err(why) => {
            if !why.is_empty() {
                eprintln!("rgpu-diag: {why}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut steps = Steps::default();
    match &options.socket {
        Some(socket) => host_mode(&mut steps, socket),
        None if options.stats.is_none() => guest_mode(&mut steps, &options.dri),
        None => {}
    }
    if let Some(stats) = &options.stats {
        print_stats(&mut steps, stats);
    }
    if steps.failed {
        println!("rgpu-diag: FAILED");
        ExitCode::FAILURE
    } else {
        println!("rgpu-diag: all checks passed");
        ExitCode::SUCCESS
    }
}
