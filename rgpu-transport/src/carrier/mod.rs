//! Carriers: how commands reach the host (ARCHITECTURE.md §6).
//!
//! - [`local`]: a host process is its own vhost-user frontend over a memfd
//!   ("guest memory"), talking to the daemon's socket directly
//!   (`RGPU_SOCKET=PATH`);
//! - [`drm`] (VM mode): the render node of the stock virtio_gpu driver whose
//!   device offers the rgpu capset;
//! - [`remote`]: a daemon's `--listen` address over TLS
//!   (`RGPU_SERVER=tls://HOST:PORT`), with no shared memory.
//!
//! `RGPU_DEVICES` lists several carriers, one CUDA device each
//! ([`device_list`]).
//!
//! Everything above this trait (the channel, the CUDA API) is shared.

pub mod device_list;
pub mod drm;
pub mod local;
pub mod remote;
pub mod scattered;
pub mod virtqueue;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use rgpu_proto::capset::Capset;
use thiserror::Error;

/// Why a carrier operation failed.
#[derive(Debug, Error)]
pub enum CarrierError {
    /// The host completed a wait without answering: the host process that
    /// ran this context is gone (it faulted fatally, was killed, or the
    /// device was reset). Every later call of the context fails the same way.
    #[error("the host ended this context: {0}")]
    ContextLost(String),
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
    #[error("no rgpu carrier configured: set RGPU_SOCKET=/path/to/daemon.sock to use a local vhost-device-rgpu daemon, or run in a VM with the rgpu virtio-gpu device")]
    NotConfigured,
    #[error("fence {0} was never issued by this carrier or was already waited for")]
    UnknownFence(u64),
    #[error("the host broke the channel protocol: {0}")]
    Protocol(String),
    /// No render node serves rgpu; the text says what was looked for and
    /// what was found.
    #[error("{0}")]
    NoDevice(String),
    #[error("{ioctl} failed: {source}")]
    Ioctl {
        ioctl: &'static str,
        source: std::io::Error,
    },
    #[error("context {0} was never created by this carrier or was destroyed")]
    UnknownContext(u32),
    #[error("blob resource {0} was never created by this carrier or was destroyed")]
    UnknownResource(u32),
    #[error("not available on this carrier: {0}")]
    Unsupported(&'static str),
    #[error("timed out: {0}")]
    Timeout(String),
    /// The network carrier's settings are wrong (the text says which).
    #[error("{0}")]
    RemoteSetup(String),
    /// The daemon refused this client (the text says why and what to do).
    #[error("{0}")]
    Refused(String),
    /// `RGPU_DEVICES` as a whole cannot be read.
    #[error("RGPU_DEVICES: {0}")]
    BadDeviceList(String),
    /// An `RGPU_DEVICES` entry that is not a carrier.
    #[error("RGPU_DEVICES entry {index} ({entry:?}): {reason}")]
    BadDeviceEntry {
        index: usize,
        entry: String,
        reason: String,
    },
    /// An `RGPU_DEVICES` entry whose carrier did not open.
    #[error("RGPU_DEVICES entry {index} ({entry:?}): {source}")]
    DeviceEntry {
        index: usize,
        entry: String,
        source: Box<CarrierError>,
    },
}

impl CarrierError {
    /// The error itself, without the `RGPU_DEVICES` entry it came from.
    pub fn root(&self) -> &CarrierError {
        match self {
            Self::DeviceEntry { source, .. } => source.root(),
            other => other,
        }
    }
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
    /// [`Carrier::create_blob`] for page-locked memory: the host is asked
    /// to map the blob for its GPU at the address it has in this process,
    /// so that kernels reach it by this process's pointer, as with unified
    /// addressing natively. Where it cannot, the host maps it elsewhere
    /// (`HostDevicePointer` says where).
    fn create_same_address_blob(
        &self,
        ctx_id: u32,
        size: u64,
    ) -> Result<BlobMapping, CarrierError> {
        self.create_blob(ctx_id, size)
    }
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
    /// Whether this process shares the host daemon's kernel and the memory
    /// files of its blobs (local mode): a futex in a blob wakes the host.
    fn shares_host_kernel(&self) -> bool {
        false
    }
    /// The network carrier, which shares no memory with the host: channels
    /// open connections of their own, and there are no blobs.
    fn remote(&self) -> Option<&remote::RemoteCarrier> {
        None
    }
}

/// Opens every carrier the environment selects, in device order:
/// `RGPU_DEVICES`' entries when it is set, otherwise the one carrier of
/// [`open_from_env`].
pub fn open_list_from_env() -> Result<Vec<Arc<dyn Carrier>>, CarrierError> {
    match device_list::from_env()? {
        Some(specs) => device_list::open_all(&specs, Path::new(drm::DRI_DIR)),
        None => open_from_env().map(|carrier| vec![carrier]),
    }
}

/// Opens the one carrier the environment selects: the first entry of
/// `RGPU_DEVICES` when it is set (for users of one carrier, such as rgpu's
/// NVML: they see the first device); else `RGPU_SERVER=tls://HOST:PORT`
/// connects to a remote daemon; `RGPU_SOCKET=PATH` to a local one;
/// otherwise the render node of `/dev/dri` whose virtio-gpu device offers
/// the rgpu capset; otherwise an error that says what was looked for and
/// found ([`CarrierError::NoDevice`]).
pub fn open_from_env() -> Result<Arc<dyn Carrier>, CarrierError> {
    if let Some(first) = device_list::from_env()?.and_then(|specs| specs.into_iter().next()) {
        return device_list::open_all(&[first], Path::new(drm::DRI_DIR))?
            .pop()
            .ok_or(CarrierError::NotConfigured);
    }
    if let Some(url) = std::env::var("RGPU_SERVER").ok().filter(|u| !u.is_empty()) {
        let name = crate::process_tag::process_name();
        return Ok(Arc::new(remote::RemoteCarrier::connect(&url, &name)?));
    }
    open_selected(
        std::env::var_os("RGPU_SOCKET").as_deref(),
        Path::new(drm::DRI_DIR),
    )
}

/// [`open_from_env`] with the socket setting and the render-node directory
/// given.
pub fn open_selected(
    socket: Option<&OsStr>,
    dri_dir: &Path,
) -> Result<Arc<dyn Carrier>, CarrierError> {
    match socket {
        Some(path) if !path.is_empty() => {
            let carrier = local::LocalCarrier::connect(Path::new(path))?;
            Ok(Arc::new(carrier))
        }
        _ => Ok(Arc::new(drm::DrmCarrier::open_in(dri_dir)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A scratch directory standing in for /dev/dri, removed on drop.
    struct FakeDri(PathBuf);

    impl FakeDri {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("rgpu-transport-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for FakeDri {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn error_of(result: Result<Arc<dyn Carrier>, CarrierError>) -> CarrierError {
        match result {
            Ok(_) => panic!("a carrier opened"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_missing_dri_directory_is_explained() {
        let dir = FakeDri::new("missing");
        let missing = dir.0.join("dri");
        let err = error_of(open_selected(None, &missing));
        let text = err.to_string();
        assert!(matches!(err, CarrierError::NoDevice(_)), "{text}");
        assert!(text.contains("does not exist"), "{text}");
        assert!(text.contains("modprobe virtio_gpu"), "{text}");
        assert!(text.contains("RGPU_SOCKET=/path/to/daemon.sock"), "{text}");
    }

    #[test]
    fn a_directory_without_render_nodes_is_explained() {
        let dir = FakeDri::new("empty");
        std::fs::write(dir.0.join("card0"), b"").unwrap();
        let text = error_of(open_selected(None, &dir.0)).to_string();
        assert!(text.contains("has no render node"), "{text}");
    }

    #[test]
    fn nodes_that_are_not_drm_devices_are_listed() {
        let dir = FakeDri::new("notdrm");
        std::fs::write(dir.0.join("renderD128"), b"").unwrap();
        std::fs::create_dir(dir.0.join("renderD129")).unwrap();
        std::fs::write(dir.0.join("renderDx"), b"").unwrap();
        let text = error_of(open_selected(None, &dir.0)).to_string();
        let first = text.find("renderD128").expect("renderD128 listed");
        let second = text.find("renderD129").expect("renderD129 listed");
        assert!(first < second, "{text}");
        assert!(
            text.contains("not a DRM device (DRM_IOCTL_VERSION failed"),
            "{text}"
        );
        assert!(text.contains("renderD129 (d"), "{text}");
        assert!(text.contains("cannot open"), "{text}");
        assert!(!text.contains("renderDx"), "{text}");
    }

    #[test]
    fn permission_and_capset_problems_name_the_fix() {
        let report = |group: &str, mode: u32, status| drm::NodeReport {
            path: PathBuf::from("/dev/dri/renderD128"),
            mode: libc::S_IFCHR | mode,
            owner: "root".into(),
            group: group.into(),
            status,
        };
        let denied =
            || drm::NodeStatus::CannotOpen(std::io::Error::from_raw_os_error(libc::EACCES));
        let text = drm::no_device_message(
            Path::new("/dev/dri"),
            &Ok(vec![report("render", 0o660, denied())]),
        );
        assert!(text.contains("crw-rw---- root:render"), "{text}");
        assert!(text.contains("add the user to group render"), "{text}");

        let text = drm::no_device_message(
            Path::new("/dev/dri"),
            &Ok(vec![report("root", 0o600, denied())]),
        );
        assert!(text.contains("chgrp render /dev/dri/renderD128"), "{text}");

        let params = drm::VirtioGpuParams {
            three_d: true,
            resource_blob: true,
            context_init: true,
            capset_mask: 0x1,
            explicit_debug_name: true,
        };
        let text = drm::no_device_message(
            Path::new("/dev/dri"),
            &Ok(vec![report(
                "render",
                0o660,
                drm::NodeStatus::VirtioGpu(params),
            )]),
        );
        assert!(text.contains("without the rgpu capset 23"), "{text}");
        assert!(text.contains("capset mask 0x1"), "{text}");

        let params = drm::VirtioGpuParams {
            resource_blob: false,
            context_init: false,
            ..params
        };
        let text = drm::no_device_message(
            Path::new("/dev/dri"),
            &Ok(vec![report(
                "render",
                0o660,
                drm::NodeStatus::VirtioGpu(params),
            )]),
        );
        assert!(
            text.contains("without RESOURCE_BLOB, CONTEXT_INIT"),
            "{text}"
        );
        assert!(text.contains("vhost-user-test-device-pci"), "{text}");

        let text = drm::no_device_message(
            Path::new("/dev/dri"),
            &Ok(vec![report(
                "video",
                0o660,
                drm::NodeStatus::OtherDriver("i915".into()),
            )]),
        );
        assert!(text.contains("driver i915, not virtio_gpu"), "{text}");
    }

    #[test]
    fn a_socket_setting_selects_the_local_carrier() {
        let dir = FakeDri::new("socket");
        let socket = dir.0.join("absent.sock");
        let err = error_of(open_selected(Some(socket.as_os_str()), &dir.0));
        assert!(matches!(err, CarrierError::Connect { .. }), "{err}");
        // An empty setting counts as unset.
        let err = error_of(open_selected(Some(OsStr::new("")), &dir.0));
        assert!(matches!(err, CarrierError::NoDevice(_)), "{err}");
    }
}
