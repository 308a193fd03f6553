//! Serving one vhost-user connection, in the process that the parent
//! started for it ([`crate::supervisor`]): the connection gets a fresh
//! backend (device model) and a `VhostUserDaemon`, which serves it through
//! a relay ([`crate::handoff`]). When the frontend goes away, the
//! connection is torn down: every session of it ends, its epoll worker
//! exits; then the process exits, which frees whatever the GPU driver still
//! held for it.
//!
//! The parent hands over only connections whose frontend sent something.
//! One that sends a few bytes and stops would still hold its process (and
//! a slot of the parent's `--max-connections`) forever, so a connection
//! whose frontend does not start vhost-user negotiation within the
//! handshake timeout is closed here too. "Started" means it asked for the
//! device features: every frontend (QEMU, cloud-hypervisor, crosvm,
//! guest-lib's local carrier) does so within its first two requests, as
//! soon as it connects. The memory table would be the wrong sign: a VMM
//! sends it only when the guest's driver starts the device, which can be
//! minutes after connecting.

use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::thread;
use std::time::Duration;

use log::{info, warn};
use rgpu_session::{AtomicGuestMemory, Counters, GuestMemory};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserShMemConfig, VhostUserSharedMsg,
};
use vhost::vhost_user::{Backend, Error as VhostUserError, GpuBackend as GpuSocket, Listener};
use vhost_user_backend::{VhostUserBackend, VhostUserBackendMut, VhostUserDaemon};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use crate::handoff::{self, HandoffError};
use crate::virtio_gpu::{DaemonShared, GpuBackend};

type Daemon = VhostUserDaemon<WatchedBackend>;
type Vring = <GpuBackend as VhostUserBackendMut>::Vring;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create a connection's backend: {0}")]
    Backend(std::io::Error),
    #[error("cannot create a vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
    #[error(transparent)]
    Handoff(HandoffError),
    #[error("cannot start serving the connection: {0}")]
    Start(vhost_user_backend::Error),
}

/// Waits for the connection the parent hands over on `control` (returns
/// at once if the parent closes it instead), calls `accepted`, and serves
/// the connection until its frontend goes away, or until
/// `handshake_timeout` if the frontend has not started negotiating by then.
pub fn serve_one(
    control: UnixStream,
    shared: DaemonShared,
    id: u64,
    handshake_timeout: Duration,
    accepted: impl FnOnce(),
) -> Result<(), ServeError> {
    // All set up before the connection comes, so it is served at once.
    let memory = AtomicGuestMemory::new(GuestMemory::new());
    let device = Arc::new(RwLock::new(
        GpuBackend::new(shared.clone(), memory.clone()).map_err(ServeError::Backend)?,
    ));
    let negotiating = Arc::new(AtomicBool::new(false));
    let backend = WatchedBackend {
        device: Arc::clone(&device),
        negotiating: Arc::clone(&negotiating),
    };
    let mut daemon =
        Daemon::new("vhost-device-rgpu".into(), backend, memory).map_err(ServeError::Daemon)?;
    let (listener, ours) = handoff::private_connection().map_err(ServeError::Handoff)?;

    let Some(frontend) = handoff::receive_connection(&control).map_err(ServeError::Handoff)? else {
        info!("connection {id}: the parent closed the hand-off socket; exiting");
        return Ok(());
    };
    drop(control);
    accepted();
    handoff::relay(id, frontend, ours).map_err(ServeError::Handoff)?;
    // Accepts our own connection, already waiting in its backlog.
    daemon
        .start(&mut Listener::from(listener))
        .map_err(ServeError::Start)?;
    Counters::add(&shared.counters.connections_active, 1);
    Counters::add(&shared.counters.connections_total, 1);
    info!("connection {id} accepted");
    close_if_silent(id, &daemon, negotiating, handshake_timeout);
    teardown_when_closed(id, daemon, device, shared.counters);
    Ok(())
}

/// Closes the connection after `timeout` unless its frontend has started
/// negotiating by then; the teardown follows as for any disconnection.
fn close_if_silent(id: u64, daemon: &Daemon, negotiating: Arc<AtomicBool>, timeout: Duration) {
    let Some(connection) = daemon.shutdown_handle() else {
        return;
    };
    let watchdog = thread::Builder::new()
        .name("rgpu-handshake".into())
        .spawn(move || {
            // A plain sleep: if the connection ends first, the process
            // exits and this thread with it.
            thread::sleep(timeout);
            if !negotiating.load(Ordering::Acquire) {
                warn!(
                    "connection {id}: the frontend did not start vhost-user negotiation within \
                     {timeout:?}; closing the connection"
                );
                connection.shutdown();
            }
        });
    if let Err(e) = watchdog {
        warn!("connection {id}: no handshake timeout (cannot start its thread: {e})");
    }
}

/// Waits for the frontend to go away, then frees everything of the
/// connection.
fn teardown_when_closed(
    id: u64,
    mut daemon: Daemon,
    device: Arc<RwLock<GpuBackend>>,
    counters: Arc<Counters>,
) {
    match daemon.wait() {
        // A frontend that exits (or dies) mid-message is the usual end.
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            VhostUserError::Disconnected | VhostUserError::PartialMessage,
        )) => info!("connection {id} closed"),
        Err(e) => warn!("connection {id} ended: {e}"),
    }
    // Stop the epoll worker first so no request races the teardown.
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    let sessions = {
        let mut backend = device.write().unwrap_or_else(PoisonError::into_inner);
        let sessions = backend.device().session_count();
        backend.shutdown();
        sessions
    };
    // Dropping the daemon joins its epoll worker thread.
    drop(daemon);
    Counters::sub(&counters.connections_active, 1);
    info!("connection {id} torn down ({sessions} contexts ended)");
}

/// The connection's backend as the vhost-user handler sees it: the device's
/// own, every call passed on, and a flag raised when the frontend asks for
/// the device features (the start of its negotiation), which
/// [`close_if_silent`] reads. Every method is passed on, defaults included,
/// so that whatever `GpuBackend` overrides keeps working.
#[derive(Clone)]
struct WatchedBackend {
    device: Arc<RwLock<GpuBackend>>,
    negotiating: Arc<AtomicBool>,
}

impl VhostUserBackend for WatchedBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.device.num_queues()
    }

    fn max_queue_size(&self) -> usize {
        self.device.max_queue_size()
    }

    fn features(&self) -> u64 {
        self.negotiating.store(true, Ordering::Release);
        self.device.features()
    }

    fn acked_features(&self, features: u64) {
        self.device.acked_features(features)
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.device.protocol_features()
    }

    fn reset_device(&self) {
        self.device.reset_device()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.device.set_event_idx(enabled)
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.device.get_config(offset, size)
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.device.set_config(offset, buf)
    }

    fn update_memory(&self, memory: AtomicGuestMemory) -> io::Result<()> {
        self.device.update_memory(memory)
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        self.device.set_backend_req_fd(backend)
    }

    fn get_shared_object(&self, uuid: VhostUserSharedMsg) -> io::Result<File> {
        self.device.get_shared_object(uuid)
    }

    fn set_gpu_socket(&self, socket: GpuSocket) -> io::Result<()> {
        self.device.set_gpu_socket(socket)
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.device.queues_per_thread()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.device.exit_event(thread_index)
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        self.device.stop_vring(queue_index)
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        self.device
            .handle_event(device_event, evset, vrings, thread_id)
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.device.set_device_state_fd(direction, phase, file)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.device.check_device_state()
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        self.device.get_shmem_config()
    }
}
