//! Serving one vhost-user connection, in the process that the parent
//! started for it ([`crate::supervisor`]): the connection gets a fresh
//! backend (device model) and a `VhostUserDaemon`. When the frontend goes
//! away, the connection is torn down: every session of it ends, its epoll
//! worker exits; then the process exits, which frees whatever the GPU
//! driver still held for it.

use std::os::unix::net::UnixListener;
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

/// Accepts one connection on `listener`, calls `accepted`, closes the
/// listener (the next connection is the next process's), and serves the
/// connection until its frontend goes away.
pub fn serve_one(
    listener: UnixListener,
    shared: DaemonShared,
    id: u64,
    accepted: impl FnOnce(),
) -> Result<(), ServeError> {
    let mut listener = Listener::from(listener);
    let (daemon, backend) = loop {
        let memory = AtomicGuestMemory::new(GuestMemory::new());
        let backend = Arc::new(RwLock::new(
            GpuBackend::new(shared.clone(), memory.clone()).map_err(ServeError::Backend)?,
        ));
        let mut daemon = Daemon::new("vhost-device-rgpu".into(), backend.clone(), memory)
            .map_err(ServeError::Daemon)?;
        match daemon.start(&mut listener) {
            Ok(()) => break (daemon, backend),
            Err(e) => {
                error!("accepting a connection failed: {e}");
                thread::sleep(ACCEPT_RETRY);
            }
        }
    };
    drop(listener);
    Counters::add(&shared.counters.connections_active, 1);
    Counters::add(&shared.counters.connections_total, 1);
    info!("connection {id} accepted");
    accepted();
    teardown_when_closed(id, daemon, backend, shared.counters);
    Ok(())
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
