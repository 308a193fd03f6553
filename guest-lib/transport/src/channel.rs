//! One CUDA context's channel to its host session (rgpu-proto `channel`):
//! the command ring the guest writes and the host worker drains, the reply
//! area, and the bounce area. Thread-safe: calls from several application
//! threads are serialised here.
//!
//! Asynchronous commands cost no round trip: they are written to the ring and
//! the doorbell is rung only if the host worker went idle. A call waits for
//! its reply by polling briefly, then sleeping on a fence.

use std::sync::Arc;

use rgpu_proto::{BlobRange, Command};

use crate::carrier::{Carrier, CarrierError};

/// The host's answer to a command that asked for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// A CUDA result code (`rgpu_proto::cuda_result`).
    pub result: u32,
    pub payload: Vec<u8>,
}

pub struct Channel {
    // Filled in by the implementation.
}

impl Channel {
    /// Creates a virtio-gpu context on `carrier`, allocates the channel blob
    /// and binds it (`BindChannel`).
    pub fn open(carrier: Arc<dyn Carrier>, debug_name: &str) -> Result<Self, CarrierError> {
        let _ = (carrier, debug_name);
        unimplemented!()
    }

    pub fn ctx_id(&self) -> u32 {
        unimplemented!()
    }

    pub fn carrier(&self) -> &Arc<dyn Carrier> {
        unimplemented!()
    }

    /// Queues a command that needs no reply (errors surface at the next call).
    pub fn send(&self, command: &Command) -> Result<(), CarrierError> {
        let _ = command;
        unimplemented!()
    }

    /// Queues a command and waits for its reply.
    pub fn call(&self, command: &Command) -> Result<Reply, CarrierError> {
        let _ = command;
        unimplemented!()
    }

    /// Copies `data` from anywhere in this process to device memory at `dst`
    /// through staging space in the ring (pipelined in chunks). With `sync`,
    /// waits for the host and returns its result; otherwise returns
    /// `CUDA_SUCCESS` once everything is queued.
    pub fn copy_to_device(
        &self,
        stream: u32,
        dst: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<u32, CarrierError> {
        let _ = (stream, dst, data, sync);
        unimplemented!()
    }

    /// Copies device memory at `src` into `dst` anywhere in this process
    /// through the bounce area; synchronous; returns the CUDA result.
    pub fn copy_from_device(&self, stream: u32, dst: &mut [u8], src: u64) -> Result<u32, CarrierError> {
        let _ = (stream, dst, src);
        unimplemented!()
    }

    /// Makes `data` visible to the host as a blob range (staged in the ring
    /// when small, in a temporary blob when large), builds the command with
    /// it, and waits for the reply. For module images.
    pub fn call_with_data(
        &self,
        data: &[u8],
        make_command: &dyn Fn(BlobRange) -> Command,
    ) -> Result<Reply, CarrierError> {
        let _ = (data, make_command);
        unimplemented!()
    }

    /// Destroys the channel's blob and the virtio-gpu context (the host frees
    /// the session).
    pub fn close(self) -> Result<(), CarrierError> {
        unimplemented!()
    }
}
