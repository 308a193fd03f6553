//! Carriers: how commands reach the host (ARCHITECTURE.md §6).
//!
//! - [`local`]: a host process is its own vhost-user frontend over a memfd
//!   ("guest memory"), talking to the daemon's socket directly
//!   (`RGPU_SOCKET=PATH`);
//! - `drm` (VM mode, a later issue): the render node of the stock virtio_gpu
//!   driver.
//!
//! Everything above this trait (the channel, the CUDA API) is shared.

pub mod local;
pub mod virtqueue;

use std::sync::Arc;

use rgpu_proto::capset::Capset;
use thiserror::Error;

/// Why a carrier operation failed.
#[derive(Debug, Error)]
pub enum CarrierError {
    #[error("cannot connect to the rgpu daemon at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("vhost-user handshake with the daemon failed: {0}")]
    Handshake(String),
    #[error("the device answered {command} with response type {response:#x}")]
    DeviceError {
        command: &'static str,
        response: u32,
    },
    #[error("the device does not offer the rgpu capset")]
    NoCapset,
    #[error("bad capset from the device: {0}")]
    BadCapset(rgpu_proto::DecodeError),
    #[error("protocol version mismatch: guest speaks {guest}, host speaks {host}")]
    VersionMismatch { guest: u32, host: u32 },
    #[error("out of guest memory for a {0}-byte blob")]
    OutOfMemory(u64),
    #[error("the connection to the daemon is gone")]
    Disconnected,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no rgpu carrier configured: set RGPU_SOCKET=/path/to/daemon.sock to use a local vhost-device-rgpu daemon (VM mode through the virtio-gpu render node is not available yet)")]
    NotConfigured,
    #[error("fence {0} was never issued by this carrier or was already waited for")]
    UnknownFence(u64),
    #[error("the host broke the channel protocol: {0}")]
    Protocol(String),
}

/// A blob resource: guest memory that the host sees too, mapped here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobMapping {
    pub resource_id: u32,
    pub ptr: *mut u8,
    pub size: u64,
}

// SAFETY: the mapping is plain shared memory that lives as long as the
// carrier; the pointer is only an address.
unsafe impl Send for BlobMapping {}
// SAFETY: as above.
unsafe impl Sync for BlobMapping {}

/// A fence the guest can wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceToken(pub u64);

/// The transport below the channel.
pub trait Carrier: Send + Sync {
    /// The rgpu capset, read when the carrier was opened.
    fn capset(&self) -> &Capset;
    /// A new virtio-gpu context with the rgpu capset (one per CUDA context).
    fn create_context(&self, debug_name: &str) -> Result<u32, CarrierError>;
    /// Destroys a context; the host frees everything the session held.
    fn destroy_context(&self, ctx_id: u32) -> Result<(), CarrierError>;
    /// Allocates `size` bytes (rounded up to pages) of guest memory as a blob
    /// resource attached to `ctx_id`, mapped in this process.
    fn create_blob(&self, ctx_id: u32, size: u64) -> Result<BlobMapping, CarrierError>;
    /// Attaches an existing blob to another context.
    fn attach_blob(&self, ctx_id: u32, resource_id: u32) -> Result<(), CarrierError>;
    /// Detaches and frees a blob.
    fn destroy_blob(&self, ctx_id: u32, resource_id: u32) -> Result<(), CarrierError>;
    /// Sends a `SUBMIT_3D` with `payload` (an rgpu-proto batch) to `ctx_id`.
    /// With `fenced`, returns a token that signals when the host completes
    /// the submission.
    fn submit(
        &self,
        ctx_id: u32,
        payload: &[u8],
        fenced: bool,
    ) -> Result<Option<FenceToken>, CarrierError>;
    /// Blocks until the fence signalled.
    fn wait_fence(&self, ctx_id: u32, fence: FenceToken) -> Result<(), CarrierError>;
    /// Sends raw virtio-gpu control-queue bytes and returns the raw response
    /// (tests of the device's input checking use this).
    fn raw_control(&self, request: &[u8], response_len: usize) -> Result<Vec<u8>, CarrierError>;
}

/// Opens the carrier the environment selects: `RGPU_SOCKET=PATH` connects
/// to a local daemon.
pub fn open_from_env() -> Result<Arc<dyn Carrier>, CarrierError> {
    match std::env::var_os("RGPU_SOCKET") {
        Some(path) if !path.is_empty() => {
            let carrier = local::LocalCarrier::connect(std::path::Path::new(&path))?;
            Ok(Arc::new(carrier))
        }
        _ => Err(CarrierError::NotConfigured),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_socket_the_error_says_what_to_set() {
        if std::env::var_os("RGPU_SOCKET").is_some() {
            return;
        }
        let err = open_from_env()
            .err()
            .expect("no carrier without RGPU_SOCKET");
        assert!(matches!(err, CarrierError::NotConfigured));
        assert!(err.to_string().contains("RGPU_SOCKET=/path/to/daemon.sock"));
    }
}
