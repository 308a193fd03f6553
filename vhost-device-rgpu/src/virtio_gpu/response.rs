//! Writing responses into descriptor chains and handing the chains back to
//! the guest, at once or later (a fenced `SUBMIT_3D`, an unref, detach or
//! destroy, completed when a worker process says it is done).

use std::io::Write;
use std::sync::Arc;

use log::{error, warn};
use rgpu_proto::virtio_gpu::{CtrlHdr, RESP_OK_NODATA};
use rgpu_session::{AtomicGuestMemory, Completion, GuestMemory};
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::{DescriptorChain, Writer};

/// The vring type of the daemon.
pub type Vring = VringRwLock<AtomicGuestMemory>;

/// A descriptor chain that keeps the guest memory it was read from mapped,
/// so it can be answered from another thread after the memory table changed.
pub type Chain = DescriptorChain<Arc<GuestMemory>>;

/// Why a chain could not be handed back to the guest.
#[derive(Debug, thiserror::Error)]
pub enum ReturnError {
    #[error("cannot add a used descriptor: {0}")]
    AddUsed(virtio_queue::Error),
    #[error("cannot read the guest's notification index: {0}")]
    NeedsNotification(virtio_queue::Error),
    #[error("cannot signal the guest: {0}")]
    Signal(std::io::Error),
}

/// Writes `response` into the device-writable part of `chain` and returns
/// how many bytes were written. A chain with too little writable space gets
/// what fits: the driver asked for that.
pub fn write_response(chain: &Chain, response: &[u8]) -> u32 {
    let mut writer: Writer<'_> = match Writer::new(chain.memory(), chain.clone()) {
        Ok(writer) => writer,
        Err(e) => {
            warn!(
                "descriptor chain {}: no writable buffer: {e}",
                chain.head_index()
            );
            return 0;
        }
    };
    let len = writer.available_bytes().min(response.len());
    if len < response.len() {
        warn!(
            "descriptor chain {}: response of {} bytes truncated to {len}",
            chain.head_index(),
            response.len()
        );
    }
    match writer.write_all(response.get(..len).unwrap_or_default()) {
        Ok(()) => u32::try_from(len).unwrap_or(u32::MAX),
        Err(e) => {
            warn!(
                "descriptor chain {}: writing the response failed: {e}",
                chain.head_index()
            );
            0
        }
    }
}

/// Puts `head` into the used ring with `len` bytes written.
pub fn add_used(vring: &Vring, head: u16, len: u32) -> Result<(), ReturnError> {
    vring.add_used(head, len).map_err(ReturnError::AddUsed)
}

/// Interrupts the guest if the used ring changed in a way it asked to hear
/// about (with EVENT_IDX: past its `used_event`; without: always).
pub fn notify_guest(vring: &Vring) -> Result<(), ReturnError> {
    if vring
        .needs_notification()
        .map_err(ReturnError::NeedsNotification)?
    {
        vring.signal_used_queue().map_err(ReturnError::Signal)?;
    }
    Ok(())
}

/// A deferred response: `OK_NODATA` with the request's fence fields echoed,
/// written when completed (a fenced `SUBMIT_3D` once the session executed up
/// to its doorbell; an unref, detach or destroy once no GPU work can touch
/// the memory). Dropped uncompleted (a device reset), it writes nothing.
pub struct DeferredResponse {
    vring: Vring,
    chain: Chain,
    response: Vec<u8>,
}

impl DeferredResponse {
    pub fn new(vring: Vring, chain: Chain, request: &CtrlHdr) -> Self {
        Self {
            vring,
            chain,
            response: request.response(RESP_OK_NODATA).to_bytes(),
        }
    }
}

impl Completion for DeferredResponse {
    fn complete(self: Box<Self>) {
        let len = write_response(&self.chain, &self.response);
        let head = self.chain.head_index();
        log::trace!("deferred response for descriptor chain {head} ({len} bytes)");
        if let Err(e) = add_used(&self.vring, head, len).and_then(|()| notify_guest(&self.vring)) {
            error!("deferred response for descriptor chain {head}: {e}");
        }
    }
}
