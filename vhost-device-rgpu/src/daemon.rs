//! Serving vhost-user connections: each accepted connection gets a fresh
//! backend (device model) and a `VhostUserDaemon` of its own, so many VMs
//! and local processes are served at once. When a frontend goes away, its
//! connection is torn down: every session of it ends, its epoll worker
//! exits, and its memory mappings go with the last blob that used them.

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::thread;
use std::time::Duration;

use log::{error, info, warn};
use rgpu_session::{AtomicGuestMemory, Counters, GuestMemory};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserDaemon;

use crate::virtio_gpu::{DaemonShared, GpuBackend};

type Daemon = VhostUserDaemon<Arc<RwLock<GpuBackend>>>;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create a connection's backend: {0}")]
    Backend(std::io::Error),
    #[error("cannot create a vhost-user daemon: {0}")]
    Daemon(vhost_user_backend::Error),
}

/// Pause after a failed accept so a persistent failure does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` forever, serving each on threads of its
/// own. Returns only when a connection's backend cannot be created at all.
pub fn serve(listener: UnixListener, shared: DaemonShared) -> Result<(), ServeError> {
    let mut listener = Listener::from(listener);
    let next_id = AtomicU64::new(1);
    loop {
        let memory = AtomicGuestMemory::new(GuestMemory::new());
        let backend = Arc::new(RwLock::new(
            GpuBackend::new(shared.clone(), memory.clone()).map_err(ServeError::Backend)?,
        ));
        let mut daemon = Daemon::new("vhost-device-rgpu".into(), backend.clone(), memory)
            .map_err(ServeError::Daemon)?;
        if let Err(e) = daemon.start(&mut listener) {
            error!("accepting a connection failed: {e}");
            thread::sleep(ACCEPT_RETRY);
            continue;
        }
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        Counters::add(&shared.counters.connections_active, 1);
        Counters::add(&shared.counters.connections_total, 1);
        info!("connection {id} accepted");
        let counters = shared.counters.clone();
        let spawned = thread::Builder::new()
            .name(format!("rgpu-conn-{id}"))
            .spawn(move || teardown_when_closed(id, daemon, backend, counters));
        if let Err(e) = spawned {
            // The closure, and with it the daemon, is dropped: that closes
            // the connection and the backend's Drop ends its sessions.
            error!("connection {id}: cannot start its watcher thread: {e}");
        }
    }
}

/// Waits for the frontend to go away, then frees everything of the
/// connection.
fn teardown_when_closed(
    id: u64,
    mut daemon: Daemon,
    backend: Arc<RwLock<GpuBackend>>,
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
        let mut backend = backend.write().unwrap_or_else(PoisonError::into_inner);
        let sessions = backend.device().session_count();
        backend.shutdown();
        sessions
    };
    // Dropping the daemon joins its epoll worker thread.
    drop(daemon);
    Counters::sub(&counters.connections_active, 1);
    info!("connection {id} torn down ({sessions} contexts ended)");
}
