//! A session and its worker thread.
//!
//! Interface used by the device model:
//! - `Session::spawn(ctx_id, debug_name, device: u32, executor: Arc<dyn Executor>,
//!    counters: Arc<Counters>) -> Result<Session, SessionError>`: starts the
//!   worker thread (`rgpu-ctx-<id>`). A device the executor does not offer
//!   comes back from spawn as `CreateContext`. The device context itself is
//!   created LAZILY on the worker thread (CUDA contexts are per thread), by
//!   the first command that needs one: NVML's `DeviceStatus` does not, so an
//!   NVML-only session costs no context. A creation failure becomes the
//!   result of that command and of every later one that needs the context;
//! - `Session::spawn_in_tenant(.., tenant: Arc<Tenant>)`: the same, with the
//!   session counted in a [`crate::Tenant`] shared by the sessions of one
//!   guest (`spawn` gives each session a tenant of its own);
//! - `attach_blob(Arc<Blob>)`, `detach_blob(resource_id)`,
//!   `detach_blob_then(resource_id, completion)`;
//! - `submit(commands: Vec<Decoded<ControlCommand>>, completion: Option<Box<dyn Completion>>)`:
//!   a decoded SUBMIT_3D batch (BindChannel, Doorbell); the completion is
//!   completed once the worker has executed the ring up to the doorbell's
//!   `until` (or at once for a batch without a doorbell, or on shutdown);
//! - `wake()`: an unfenced doorbell, coalesced;
//! - `shutdown(self)`: completes pending completions, frees every host
//!   resource of the session and joins the worker;
//! - `ctx_id()`, `debug_name()`.
//!
//! Everything but `spawn` and `shutdown` only posts a message to the worker
//! and never blocks on the GPU.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use rgpu_executor::Executor;
use rgpu_proto::command::{ControlCommand, Decoded};
use rgpu_proto::cuda_result::CUDA_ERROR_INVALID_DEVICE;

use crate::mailbox_bell::MailboxBell;
use crate::worker::{Message, Worker};
use crate::{Blob, Counters, Tenant};

/// A deferred virtio response (a fenced SUBMIT_3D): completing it writes the
/// response into its descriptor chain and notifies the guest.
pub trait Completion: Send {
    fn complete(self: Box<Self>);
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot start the session worker thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("the executor cannot create a context on device {device}: CUDA error {code}")]
    CreateContext { device: u32, code: u32 },
    #[error("the session worker thread ended before it started")]
    WorkerDied,
}

/// One guest CUDA context on the host.
pub struct Session {
    ctx_id: u32,
    debug_name: String,
    sender: mpsc::Sender<Message>,
    /// Rung after each post (a worker may sleep on its channel's wake word).
    bell: Arc<MailboxBell>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ctx_id", &self.ctx_id)
            .field("debug_name", &self.debug_name)
            .finish()
    }
}

impl Session {
    pub fn spawn(
        ctx_id: u32,
        debug_name: String,
        device: u32,
        executor: Arc<dyn Executor>,
        counters: Arc<Counters>,
    ) -> Result<Session, SessionError> {
        Self::spawn_in_tenant(
            ctx_id,
            debug_name,
            device,
            executor,
            counters,
            Tenant::new(),
        )
    }

    /// [`Session::spawn`], the session counted in `tenant`.
    pub fn spawn_in_tenant(
        ctx_id: u32,
        debug_name: String,
        device: u32,
        executor: Arc<dyn Executor>,
        counters: Arc<Counters>,
        tenant: Arc<Tenant>,
    ) -> Result<Session, SessionError> {
        // The one creation failure known without creating the context.
        if usize::try_from(device).map_or(true, |d| d >= executor.devices().len()) {
            return Err(SessionError::CreateContext {
                device,
                code: CUDA_ERROR_INVALID_DEVICE,
            });
        }
        let (sender, receiver) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let name = debug_name.clone();
        let bell = Arc::new(MailboxBell::default());
        let worker_bell = Arc::clone(&bell);
        let worker = std::thread::Builder::new()
            .name(format!("rgpu-ctx-{ctx_id}"))
            .spawn(move || {
                let worker = Worker::new(
                    ctx_id,
                    name,
                    device,
                    executor,
                    tenant,
                    receiver,
                    counters,
                    worker_bell,
                );
                let _ = ready_tx.send(());
                worker.run();
            })?;
        if ready_rx.recv().is_err() {
            let _ = worker.join();
            return Err(SessionError::WorkerDied);
        }
        log::info!("session {ctx_id} ({debug_name}) started on device {device}");
        Ok(Session {
            ctx_id,
            debug_name,
            sender,
            bell,
            worker: Some(worker),
        })
    }

    pub fn ctx_id(&self) -> u32 {
        self.ctx_id
    }

    pub fn debug_name(&self) -> &str {
        &self.debug_name
    }

    pub fn attach_blob(&self, blob: Arc<Blob>) {
        self.post(Message::Attach(blob));
    }

    /// Blob `resource_id` could not be mapped: commands naming it fail
    /// (with `CUDA_ERROR_OUT_OF_MEMORY`) instead of waiting for it.
    pub fn unmappable_blob(&self, resource_id: u32) {
        self.post(Message::Unmappable(resource_id));
    }

    pub fn detach_blob(&self, resource_id: u32) {
        self.post(Message::Detach(resource_id, None));
    }

    /// [`Session::detach_blob`], then `completion` once no queued GPU work of
    /// the session can touch the blob any more (at once if the worker is
    /// gone).
    pub fn detach_blob_then(&self, resource_id: u32, completion: Box<dyn Completion>) {
        if let Err(mpsc::SendError(Message::Detach(_, Some(completion)))) =
            self.send(Message::Detach(resource_id, Some(completion)))
        {
            completion.complete();
        }
    }

    /// An unfenced doorbell: the worker looks at the ring. Coalesced: while
    /// one wake is queued, more add nothing (the worker drains the whole
    /// ring when it takes it).
    pub fn wake(&self) {
        if !self.bell.wake_queued.swap(true, Ordering::AcqRel) {
            self.post(Message::Wake);
        }
    }

    pub fn submit(
        &self,
        commands: Vec<Decoded<ControlCommand>>,
        completion: Option<Box<dyn Completion>>,
    ) {
        if let Err(mpsc::SendError(message)) = self.send(Message::Submit {
            commands,
            completion,
        }) {
            // The worker is gone: the guest must not wait for it.
            log::error!("session {}: worker gone, completing at once", self.ctx_id);
            if let Message::Submit {
                completion: Some(completion),
                ..
            } = message
            {
                completion.complete();
            }
        }
    }

    /// Completes pending completions, frees every host resource of the
    /// session and waits for its worker to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn post(&self, message: Message) {
        if self.send(message).is_err() {
            log::error!("session {}: worker gone", self.ctx_id);
        }
    }

    /// Every message to the worker goes here: it rings the bell after
    /// posting, for a worker asleep on its channel's wake word.
    fn send(&self, message: Message) -> Result<(), mpsc::SendError<Message>> {
        let sent = self.sender.send(message);
        self.bell.ring();
        sent
    }

    fn stop(&mut self) {
        if let Some(worker) = self.worker.take() {
            let _ = self.send(Message::Shutdown);
            if worker.join().is_err() {
                log::error!("session {}: worker panicked", self.ctx_id);
            }
            log::info!("session {} ({}) ended", self.ctx_id, self.debug_name);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop();
    }
}
