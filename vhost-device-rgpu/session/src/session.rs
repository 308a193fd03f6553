//! A session and its worker thread.
//!
//! Interface used by the device model:
//! - `Session::spawn(ctx_id, debug_name, device: u32, executor: Arc<dyn Executor>,
//!    counters: Arc<Counters>) -> Result<Session, SessionError>`
//! - `attach_blob(Arc<Blob>)`, `detach_blob(resource_id)`
//! - `submit(commands: Vec<rgpu_proto::command::Decoded>, completion: Option<Box<dyn Completion>>)`:
//!   a decoded SUBMIT_3D batch (BindChannel, Doorbell); the completion is
//!   completed once the worker has executed the ring up to the doorbell's
//!   `until` (or at once for a batch without a doorbell, or on shutdown);
//! - `shutdown(self)`: completes pending completions, frees every host
//!   resource of the session and joins the worker.

/// A deferred virtio response (a fenced SUBMIT_3D): completing it writes the
/// response into its descriptor chain and notifies the guest.
pub trait Completion: Send {
    fn complete(self: Box<Self>);
}

pub struct Session;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("placeholder")]
    Placeholder,
}
