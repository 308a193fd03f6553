//! The drm carrier (VM mode): the render node of the stock Linux
//! `virtio_gpu` driver, whose device offers the rgpu capset. No kernel
//! module of ours: contexts, guest blobs, submissions and fences are the
//! driver's own ioctls (`include/uapi/drm/virtgpu_drm.h`).
//!
//! - A DRM file holds exactly one virtio-gpu context, so every
//!   [`Carrier::create_context`] opens its own file of the node and runs
//!   `CONTEXT_INIT` on it; closing the file makes the kernel send
//!   `CTX_DETACH_RESOURCE` for its blobs and `CTX_DESTROY`.
//! - A blob is `RESOURCE_CREATE_BLOB` (guest memory, mappable) on its
//!   context's file, mapped with `VIRTGPU_MAP` + `mmap`; the kernel attaches
//!   it to that context when the GEM handle opens. Another context gets it
//!   through PRIME: export from the owner's file, import into the other one;
//!   importing a buffer of the same device returns the same GEM object and
//!   opening the new handle sends `CTX_ATTACH_RESOURCE` for the importer's
//!   context (`virtgpu_gem_prime_import`, `virtio_gpu_gem_object_open`).
//! - The mapping holds a reference to the DRM file it was made from: a
//!   context whose blobs are still mapped is destroyed on the host only once
//!   they are unmapped ([`Carrier::destroy_blob`]) or the process exits.
//! - A fenced submission returns a sync_file; the host signals it when it
//!   completes the `SUBMIT_3D`. Waiting polls it briefly (`RGPU_SPIN_US`),
//!   then blocks in `poll`; after `RGPU_FENCE_TIMEOUT_S` (default 600, 0 =
//!   never) the wait is an error.
//!
//! Seen in a Debian 13 guest (kernel 6.12, stock virtio_gpu, QEMU 11.1 TCG,
//! vhost-device-rgpu with the sim executor): `rgpu-diag` and the driver-API
//! C test pass as a non-root member of `render`; the daemon logs
//! `CTX_ATTACH_RESOURCE` for the importing context on PRIME import and one
//! `CTX_DETACH_RESOURCE` per context when the handles close; a process
//! killed with SIGKILL has its session freed (the kernel closes its files).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rgpu_proto::batch::encode_batch;
use rgpu_proto::capset::Capset;
use rgpu_proto::process_group::tagged_debug_name;
use rgpu_proto::{ControlCommand, CAPSET_ID_RGPU, PROTOCOL_VERSION};

use super::{BlobMapping, Carrier, CarrierError, FenceToken};
use crate::process_tag::process_tag;

/// Where render nodes live.
pub const DRI_DIR: &str = "/dev/dri";
/// The kernel driver name of virtio-gpu devices (`DRM_IOCTL_VERSION`).
pub const VIRTIO_GPU_DRIVER: &str = "virtio_gpu";
/// Largest capset accepted (the rgpu capset is 32 bytes plus about 1 KiB
/// per GPU, at most 64 GPUs).
const MAX_CAPSET_BYTES: usize = 128 << 10;
/// Longest debug name the kernel keeps (`DEBUG_NAME_MAX_LEN - 1`).
const DEBUG_NAME_BYTES: usize = 63;
/// Default of `RGPU_FENCE_TIMEOUT_S`: a fence wait longer than this is an
/// error (a hung host), not a slow kernel.
const DEFAULT_FENCE_TIMEOUT_S: u64 = 600;

/// The Linux DRM and virtio-gpu uapi: structures and ioctl numbers, written
/// from `include/uapi/drm/drm.h` and `include/uapi/drm/virtgpu_drm.h`.
pub mod uapi {
    use std::marker::PhantomData;

    const IOC_WRITE: u64 = 1;
    const IOC_READ: u64 = 2;
    const DRM_IOCTL_BASE: u64 = b'd' as u64;
    pub const DRM_COMMAND_BASE: u64 = 0x40;

    /// `_IOC(dir, 'd', nr, size)`.
    pub const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
        (dir << 30) | ((size as u64) << 16) | (DRM_IOCTL_BASE << 8) | nr
    }

    /// An ioctl number tied to the structure it passes.
    pub struct Request<T> {
        pub number: u64,
        pub name: &'static str,
        _arg: PhantomData<T>,
    }

    impl<T> Request<T> {
        const fn iowr(nr: u64, name: &'static str) -> Self {
            Self {
                number: ioc(IOC_READ | IOC_WRITE, nr, std::mem::size_of::<T>()),
                name,
                _arg: PhantomData,
            }
        }

        const fn iow(nr: u64, name: &'static str) -> Self {
            Self {
                number: ioc(IOC_WRITE, nr, std::mem::size_of::<T>()),
                name,
                _arg: PhantomData,
            }
        }
    }

    #[repr(C)]
    #[derive(Debug)]
    pub struct DrmVersion {
        pub version_major: libc::c_int,
        pub version_minor: libc::c_int,
        pub version_patchlevel: libc::c_int,
        pub name_len: libc::size_t,
        pub name: *mut libc::c_char,
        pub date_len: libc::size_t,
        pub date: *mut libc::c_char,
        pub desc_len: libc::size_t,
        pub desc: *mut libc::c_char,
    }

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct DrmGemClose {
        pub handle: u32,
        pub pad: u32,
    }

    pub const DRM_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
    pub const DRM_RDWR: u32 = libc::O_RDWR as u32;

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct DrmPrimeHandle {
        pub handle: u32,
        pub flags: u32,
        pub fd: i32,
    }

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuMap {
        pub offset: u64,
        pub handle: u32,
        pub pad: u32,
    }

    pub const VIRTGPU_EXECBUF_FENCE_FD_OUT: u32 = 0x02;
    pub const VIRTGPU_EXECBUF_RING_IDX: u32 = 0x04;

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuExecbuffer {
        pub flags: u32,
        pub size: u32,
        pub command: u64,
        pub bo_handles: u64,
        pub num_bo_handles: u32,
        pub fence_fd: i32,
        pub ring_idx: u32,
        pub syncobj_stride: u32,
        pub num_in_syncobjs: u32,
        pub num_out_syncobjs: u32,
        pub in_syncobjs: u64,
        pub out_syncobjs: u64,
    }

    pub const VIRTGPU_PARAM_3D_FEATURES: u64 = 1;
    pub const VIRTGPU_PARAM_RESOURCE_BLOB: u64 = 3;
    pub const VIRTGPU_PARAM_CONTEXT_INIT: u64 = 6;
    pub const VIRTGPU_PARAM_SUPPORTED_CAPSET_IDS: u64 = 7;
    pub const VIRTGPU_PARAM_EXPLICIT_DEBUG_NAME: u64 = 8;

    /// `value` is the address of an `int` the kernel writes.
    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuGetparam {
        pub param: u64,
        pub value: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuGetCaps {
        pub cap_set_id: u32,
        pub cap_set_ver: u32,
        pub addr: u64,
        pub size: u32,
        pub pad: u32,
    }

    pub const VIRTGPU_BLOB_MEM_GUEST: u32 = 0x0001;
    pub const VIRTGPU_BLOB_FLAG_USE_MAPPABLE: u32 = 0x0001;

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuResourceCreateBlob {
        pub blob_mem: u32,
        pub blob_flags: u32,
        pub bo_handle: u32,
        pub res_handle: u32,
        pub size: u64,
        pub pad: u32,
        pub cmd_size: u32,
        pub cmd: u64,
        pub blob_id: u64,
    }

    pub const VIRTGPU_CONTEXT_PARAM_CAPSET_ID: u64 = 0x0001;
    pub const VIRTGPU_CONTEXT_PARAM_NUM_RINGS: u64 = 0x0002;
    pub const VIRTGPU_CONTEXT_PARAM_DEBUG_NAME: u64 = 0x0004;

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct VirtgpuContextSetParam {
        pub param: u64,
        pub value: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default)]
    pub struct VirtgpuContextInit {
        pub num_params: u32,
        pub pad: u32,
        pub ctx_set_params: u64,
    }

    pub const DRM_IOCTL_VERSION: Request<DrmVersion> = Request::iowr(0x00, "DRM_IOCTL_VERSION");
    pub const DRM_IOCTL_GEM_CLOSE: Request<DrmGemClose> = Request::iow(0x09, "DRM_IOCTL_GEM_CLOSE");
    pub const DRM_IOCTL_PRIME_HANDLE_TO_FD: Request<DrmPrimeHandle> =
        Request::iowr(0x2d, "DRM_IOCTL_PRIME_HANDLE_TO_FD");
    pub const DRM_IOCTL_PRIME_FD_TO_HANDLE: Request<DrmPrimeHandle> =
        Request::iowr(0x2e, "DRM_IOCTL_PRIME_FD_TO_HANDLE");
    pub const DRM_IOCTL_VIRTGPU_MAP: Request<VirtgpuMap> =
        Request::iowr(DRM_COMMAND_BASE + 0x01, "DRM_IOCTL_VIRTGPU_MAP");
    pub const DRM_IOCTL_VIRTGPU_EXECBUFFER: Request<VirtgpuExecbuffer> =
        Request::iowr(DRM_COMMAND_BASE + 0x02, "DRM_IOCTL_VIRTGPU_EXECBUFFER");
    pub const DRM_IOCTL_VIRTGPU_GETPARAM: Request<VirtgpuGetparam> =
        Request::iowr(DRM_COMMAND_BASE + 0x03, "DRM_IOCTL_VIRTGPU_GETPARAM");
    pub const DRM_IOCTL_VIRTGPU_GET_CAPS: Request<VirtgpuGetCaps> =
        Request::iowr(DRM_COMMAND_BASE + 0x09, "DRM_IOCTL_VIRTGPU_GET_CAPS");
    pub const DRM_IOCTL_VIRTGPU_RESOURCE_CREATE_BLOB: Request<VirtgpuResourceCreateBlob> =
        Request::iowr(
            DRM_COMMAND_BASE + 0x0a,
            "DRM_IOCTL_VIRTGPU_RESOURCE_CREATE_BLOB",
        );
    pub const DRM_IOCTL_VIRTGPU_CONTEXT_INIT: Request<VirtgpuContextInit> =
        Request::iowr(DRM_COMMAND_BASE + 0x0b, "DRM_IOCTL_VIRTGPU_CONTEXT_INIT");
}

use uapi::Request;

/// Runs one ioctl, restarting it when a signal interrupted it (as libdrm's
/// `drmIoctl` does).
///
/// # Safety
/// Every address inside `arg` must be valid for what the kernel does with
/// it (read or write the described bytes) for the duration of the call.
unsafe fn ioctl<T>(fd: RawFd, request: &Request<T>, arg: &mut T) -> Result<(), CarrierError> {
    loop {
        // SAFETY: `request.number` encodes the size of `T`, `arg` is a
        // valid, exclusive `T`, and the caller vouches for the addresses
        // inside it.
        let r = unsafe { libc::ioctl(fd, request.number as _, arg as *mut T) };
        if r != -1 {
            return Ok(());
        }
        let source = io::Error::last_os_error();
        match source.raw_os_error() {
            Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
            _ => {
                return Err(CarrierError::Ioctl {
                    ioctl: request.name,
                    source,
                })
            }
        }
    }
}

fn open_node(path: &Path) -> io::Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.into())
}

/// The driver name of a DRM file (`DRM_IOCTL_VERSION`).
fn driver_name(fd: RawFd) -> Result<String, CarrierError> {
    let mut name = [0u8; 64];
    let mut version = uapi::DrmVersion {
        version_major: 0,
        version_minor: 0,
        version_patchlevel: 0,
        name_len: name.len(),
        name: name.as_mut_ptr().cast(),
        date_len: 0,
        date: std::ptr::null_mut(),
        desc_len: 0,
        desc: std::ptr::null_mut(),
    };
    // SAFETY: `name` is writable for `name_len` bytes; date and desc have
    // length 0, so the kernel writes nothing there.
    unsafe { ioctl(fd, &uapi::DRM_IOCTL_VERSION, &mut version)? };
    // The kernel reports the full length but copies at most name_len bytes.
    let len = version.name_len.min(name.len());
    let bytes = name.get(..len).unwrap_or_default();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(bytes.get(..end).unwrap_or_default()).into_owned())
}

/// `VIRTGPU_GETPARAM`: the kernel writes an `int`.
fn getparam(fd: RawFd, param: u64) -> Result<u32, CarrierError> {
    let mut value: libc::c_int = 0;
    let mut arg = uapi::VirtgpuGetparam {
        param,
        value: std::ptr::addr_of_mut!(value) as u64,
    };
    // SAFETY: `value` is a writable int that outlives the call.
    unsafe { ioctl(fd, &uapi::DRM_IOCTL_VIRTGPU_GETPARAM, &mut arg)? };
    Ok(value as u32)
}

/// What the virtio_gpu driver says about its device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VirtioGpuParams {
    /// `VIRTGPU_PARAM_3D_FEATURES` (device feature VIRGL): EXECBUFFER works.
    pub three_d: bool,
    pub resource_blob: bool,
    pub context_init: bool,
    /// Bit n set: capset id n is offered.
    pub capset_mask: u32,
    /// Contexts can be named (`VIRTGPU_CONTEXT_PARAM_DEBUG_NAME`).
    pub explicit_debug_name: bool,
}

impl VirtioGpuParams {
    fn read(fd: RawFd) -> Self {
        let flag = |param| getparam(fd, param).map(|v| v != 0).unwrap_or(false);
        Self {
            three_d: flag(uapi::VIRTGPU_PARAM_3D_FEATURES),
            resource_blob: flag(uapi::VIRTGPU_PARAM_RESOURCE_BLOB),
            context_init: flag(uapi::VIRTGPU_PARAM_CONTEXT_INIT),
            capset_mask: getparam(fd, uapi::VIRTGPU_PARAM_SUPPORTED_CAPSET_IDS).unwrap_or(0),
            explicit_debug_name: flag(uapi::VIRTGPU_PARAM_EXPLICIT_DEBUG_NAME),
        }
    }

    /// The device features rgpu needs that this device lacks.
    pub fn missing_features(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.three_d {
            missing.push("3D (VIRGL)");
        }
        if !self.resource_blob {
            missing.push("RESOURCE_BLOB");
        }
        if !self.context_init {
            missing.push("CONTEXT_INIT");
        }
        missing
    }

    pub fn offers_rgpu(&self) -> bool {
        CAPSET_ID_RGPU < 32 && self.capset_mask & (1 << CAPSET_ID_RGPU) != 0
    }

    pub fn usable(&self) -> bool {
        self.missing_features().is_empty() && self.offers_rgpu()
    }
}

/// What a render node turned out to be.
#[derive(Debug)]
pub enum NodeStatus {
    /// It could not be opened read-write.
    CannotOpen(io::Error),
    /// `DRM_IOCTL_VERSION` failed: not a DRM device.
    NotDrm(CarrierError),
    /// A DRM device of another driver.
    OtherDriver(String),
    VirtioGpu(VirtioGpuParams),
}

/// One `renderD*` entry.
#[derive(Debug)]
pub struct NodeReport {
    pub path: PathBuf,
    /// `st_mode` (type and permission bits), 0 when stat failed.
    pub mode: u32,
    pub owner: String,
    pub group: String,
    pub status: NodeStatus,
}

impl NodeReport {
    /// `crw-rw---- root:render`.
    pub fn permissions(&self) -> String {
        format!("{} {}:{}", mode_string(self.mode), self.owner, self.group)
    }

    pub fn usable(&self) -> bool {
        matches!(&self.status, NodeStatus::VirtioGpu(p) if p.usable())
    }

    /// One line: what the node is and why it does (not) serve rgpu.
    pub fn describe(&self) -> String {
        let what = match &self.status {
            NodeStatus::CannotOpen(e) if is_permission(e) => {
                format!("cannot open: {e}; {}", self.permission_hint())
            }
            NodeStatus::CannotOpen(e) => format!("cannot open: {e}"),
            NodeStatus::NotDrm(e) => format!("not a DRM device ({e})"),
            NodeStatus::OtherDriver(name) => format!("driver {name}, not {VIRTIO_GPU_DRIVER}"),
            NodeStatus::VirtioGpu(p) => {
                let missing = p.missing_features();
                if !missing.is_empty() {
                    format!(
                        "{VIRTIO_GPU_DRIVER} without {}: not an rgpu device (QEMU's own \
                         vhost-user-gpu-pci hides these; attach vhost-device-rgpu as \
                         vhost-user-test-device-pci,virtio-id=16)",
                        missing.join(", ")
                    )
                } else if !p.offers_rgpu() {
                    format!(
                        "{VIRTIO_GPU_DRIVER} without the rgpu capset {CAPSET_ID_RGPU} \
                         (capset mask {:#x}): another virtio-gpu device, not vhost-device-rgpu",
                        p.capset_mask
                    )
                } else {
                    format!("{VIRTIO_GPU_DRIVER} offering the rgpu capset {CAPSET_ID_RGPU}")
                }
            }
        };
        format!("{} ({}): {what}", self.path.display(), self.permissions())
    }

    /// How to get access to a node this user may not open.
    pub fn permission_hint(&self) -> String {
        let node = self.path.display();
        if self.group == "root" || self.mode & 0o060 != 0o060 {
            // No udev rule ran (a minimal guest): the node is root's only.
            format!(
                "give the render group access (chgrp render {node}; chmod 0660 {node}, or \
                 let udev apply its standard rules) and add the user to group render"
            )
        } else {
            format!(
                "add the user to group {} (usermod -aG {} USER, then log in again)",
                self.group, self.group
            )
        }
    }
}

fn is_permission(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

/// `ls -l` style: type letter and nine permission letters.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFCHR => 'c',
        libc::S_IFDIR => 'd',
        libc::S_IFREG => '-',
        libc::S_IFLNK => 'l',
        0 => '?',
        _ => 'o',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    for (shift, letters) in [(6, "rwx"), (3, "rwx"), (0, "rwx")] {
        for (i, letter) in letters.chars().enumerate() {
            let bit = 1 << (shift + 2 - i);
            s.push(if mode & bit != 0 { letter } else { '-' });
        }
    }
    s
}

/// A group's name, or `gid N` when it has none here.
pub fn group_name(gid: u32) -> String {
    // SAFETY: an all-zero group is a valid value (null pointers, zero gid).
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; `buf` is as long as we
    // say; on success `result` points to `group`, whose strings live in
    // `buf`.
    let r = unsafe { libc::getgrgid_r(gid, &mut group, buf.as_mut_ptr(), buf.len(), &mut result) };
    if r == 0 && !result.is_null() && !group.gr_name.is_null() {
        // SAFETY: gr_name is a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(group.gr_name) };
        return name.to_string_lossy().into_owned();
    }
    format!("gid {gid}")
}

/// A user's name, or `uid N` when it has none here.
pub fn user_name(uid: u32) -> String {
    // SAFETY: an all-zero passwd is a valid value (null pointers, zeros).
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in `group_name`.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) };
    if r == 0 && !result.is_null() && !pw.pw_name.is_null() {
        // SAFETY: pw_name is a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(pw.pw_name) };
        return name.to_string_lossy().into_owned();
    }
    format!("uid {uid}")
}

/// The `renderD*` entries of `dir`, in number order.
pub fn render_nodes(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut nodes: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let number = name.to_str()?.strip_prefix("renderD")?.parse().ok()?;
            Some((number, entry.path()))
        })
        .collect();
    nodes.sort();
    Ok(nodes.into_iter().map(|(_, path)| path).collect())
}

/// Opens and identifies one render node.
pub fn probe_node(path: &Path) -> NodeReport {
    let (mode, owner, group) = match std::fs::metadata(path) {
        Ok(meta) => (meta.mode(), user_name(meta.uid()), group_name(meta.gid())),
        Err(_) => (0, "?".into(), "?".into()),
    };
    let status = match open_node(path) {
        Err(e) => NodeStatus::CannotOpen(e),
        Ok(fd) => match driver_name(fd.as_raw_fd()) {
            Err(e) => NodeStatus::NotDrm(e),
            Ok(name) if name == VIRTIO_GPU_DRIVER => {
                NodeStatus::VirtioGpu(VirtioGpuParams::read(fd.as_raw_fd()))
            }
            Ok(name) => NodeStatus::OtherDriver(name),
        },
    };
    NodeReport {
        path: path.to_path_buf(),
        mode,
        owner,
        group,
        status,
    }
}

/// Probes every render node of `dir`.
pub fn probe_nodes(dir: &Path) -> io::Result<Vec<NodeReport>> {
    Ok(render_nodes(dir)?.iter().map(|p| probe_node(p)).collect())
}

/// What rgpu looks for in a render-node directory.
pub fn wanted(dir: &Path) -> String {
    format!(
        "a {VIRTIO_GPU_DRIVER} render node in {} with 3D, blob resources, context init and \
         the rgpu capset (id {CAPSET_ID_RGPU})",
        dir.display()
    )
}

/// What was found instead of a usable node, and what to do about it.
pub fn no_device_reason(dir: &Path, probed: &io::Result<Vec<NodeReport>>) -> String {
    match probed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => format!(
            "{} does not exist: no DRM driver is loaded (load the virtio_gpu module, \
             `modprobe virtio_gpu`, and check that the VM has the rgpu device: \
             vhost-device-rgpu attached as vhost-user-test-device-pci,virtio-id=16)",
            dir.display()
        ),
        Err(e) => format!("cannot list {}: {e}", dir.display()),
        Ok(nodes) if nodes.is_empty() => format!(
            "{} has no render node (is the virtio_gpu module loaded? `modprobe virtio_gpu`)",
            dir.display()
        ),
        Ok(nodes) => {
            let lines: Vec<String> = nodes.iter().map(NodeReport::describe).collect();
            format!("found {}", lines.join("; "))
        }
    }
}

/// Why no render node of `dir` serves rgpu, for a person to act on.
pub fn no_device_message(dir: &Path, probed: &io::Result<Vec<NodeReport>>) -> String {
    format!(
        "no rgpu device: looked for {}; {}. To use a local vhost-device-rgpu daemon instead, \
         set RGPU_SOCKET=/path/to/daemon.sock",
        wanted(dir),
        no_device_reason(dir, probed)
    )
}

/// One virtio-gpu context: its own DRM file.
struct Context {
    fd: OwnedFd,
}

/// A GEM handle of a blob in one context's file.
#[derive(Debug, Clone, Copy)]
struct Handle {
    ctx_id: u32,
    handle: u32,
}

struct Blob {
    /// Address of the mapping (kept as an integer: the map is shared).
    addr: usize,
    len: usize,
    /// The creating context's handle first, then imports.
    handles: Vec<Handle>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

fn fence_timeout_from_env() -> Option<Duration> {
    let secs = std::env::var("RGPU_FENCE_TIMEOUT_S")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_FENCE_TIMEOUT_S);
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// The carrier over a virtio_gpu render node.
pub struct DrmCarrier {
    node: PathBuf,
    params: VirtioGpuParams,
    capset: Capset,
    contexts: Mutex<HashMap<u32, Arc<Context>>>,
    /// By resource id (the host's id, `res_handle`).
    blobs: Mutex<HashMap<u32, Blob>>,
    /// Sync files of fenced submissions and their contexts, by token.
    fences: Mutex<HashMap<u64, (u32, OwnedFd)>>,
    next_ctx: AtomicU32,
    next_fence: AtomicU64,
    spin: Duration,
    fence_timeout: Option<Duration>,
    /// Held while a blob is created: a `PlaceNextBlob` and its blob come
    /// one right after the other.
    creating: Mutex<()>,
}

impl DrmCarrier {
    /// Finds the render node of `/dev/dri` that serves rgpu and reads its
    /// capset.
    pub fn open() -> Result<DrmCarrier, CarrierError> {
        Self::open_in(Path::new(DRI_DIR))
    }

    /// [`DrmCarrier::open`] with another directory of render nodes.
    pub fn open_in(dir: &Path) -> Result<DrmCarrier, CarrierError> {
        let probed = probe_nodes(dir);
        let chosen = probed
            .as_ref()
            .ok()
            .and_then(|nodes| nodes.iter().find(|n| n.usable()));
        let Some(node) = chosen else {
            return Err(CarrierError::NoDevice(no_device_message(dir, &probed)));
        };
        let NodeStatus::VirtioGpu(params) = node.status else {
            return Err(CarrierError::NoDevice(no_device_message(dir, &probed)));
        };
        Self::open_node(&node.path, params)
    }

    /// Uses the render node at `path`, which [`probe_node`] found usable.
    pub fn open_node(path: &Path, params: VirtioGpuParams) -> Result<DrmCarrier, CarrierError> {
        let fd = open_node(path).map_err(|source| CarrierError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let capset = read_capset(fd.as_raw_fd())?;
        log::info!(
            "using {} (executor {}, {} device(s))",
            path.display(),
            capset.executor,
            capset.devices.len()
        );
        Ok(DrmCarrier {
            node: path.to_path_buf(),
            params,
            capset,
            contexts: Mutex::new(HashMap::new()),
            blobs: Mutex::new(HashMap::new()),
            fences: Mutex::new(HashMap::new()),
            next_ctx: AtomicU32::new(1),
            next_fence: AtomicU64::new(1),
            spin: super::local::spin_from_env(),
            fence_timeout: fence_timeout_from_env(),
            creating: Mutex::new(()),
        })
    }

    /// The render node in use.
    pub fn node(&self) -> &Path {
        &self.node
    }

    /// The driver's view of the device.
    pub fn params(&self) -> VirtioGpuParams {
        self.params
    }

    fn context(&self, ctx_id: u32) -> Result<Arc<Context>, CarrierError> {
        lock(&self.contexts)
            .get(&ctx_id)
            .cloned()
            .ok_or(CarrierError::UnknownContext(ctx_id))
    }

    /// [`Carrier::create_blob`]; with `same_address`, the host is asked to
    /// map the blob for its GPU where this process maps it, so kernels
    /// reach it by this process's pointer as with unified addressing
    /// natively. Linux's driver refuses a blob id for guest blobs, so a
    /// `PlaceNextBlob` submission says the address just before the blob is
    /// created (and attached); creations hold `creating` so that no other
    /// blob comes between.
    fn create_placed_blob(
        &self,
        ctx_id: u32,
        size: u64,
        same_address: bool,
    ) -> Result<BlobMapping, CarrierError> {
        let ctx = self.context(ctx_id)?;
        let fd = ctx.fd.as_raw_fd();
        let rounded = size
            .max(1)
            .checked_next_multiple_of(page_size())
            .filter(|s| usize::try_from(*s).is_ok())
            .ok_or(CarrierError::OutOfMemory(size))?;
        let _creating = lock(&self.creating);
        // The address first: the host learns it just before the blob.
        let reservation = if same_address {
            Some(reserve(rounded as usize).map_err(|_| CarrierError::OutOfMemory(size))?)
        } else {
            None
        };
        let release = |reservation: Option<*mut libc::c_void>| {
            if let Some(at) = reservation {
                // SAFETY: our own reservation, which nothing maps over now.
                unsafe { libc::munmap(at, rounded as usize) };
            }
        };
        if let Some(at) = reservation {
            let place = ControlCommand::PlaceNextBlob {
                address: at as u64,
                size: rounded,
            };
            if let Err(e) = self.submit(ctx_id, &encode_batch(&[(0, place)]), false) {
                release(reservation);
                return Err(e);
            }
        }
        let mut create = uapi::VirtgpuResourceCreateBlob {
            blob_mem: uapi::VIRTGPU_BLOB_MEM_GUEST,
            blob_flags: uapi::VIRTGPU_BLOB_FLAG_USE_MAPPABLE,
            size: rounded,
            ..Default::default()
        };
        // SAFETY: no command buffer (cmd_size 0): the structure holds no
        // addresses.
        let created = unsafe {
            ioctl(
                fd,
                &uapi::DRM_IOCTL_VIRTGPU_RESOURCE_CREATE_BLOB,
                &mut create,
            )
        }
        .map_err(|e| match &e {
            CarrierError::Ioctl { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => {
                CarrierError::OutOfMemory(size)
            }
            _ => e,
        });
        if let Err(e) = created {
            release(reservation);
            return Err(e);
        }
        let handle = create.bo_handle;
        let resource_id = create.res_handle;
        let mapped = (|| {
            let mut map = uapi::VirtgpuMap {
                handle,
                ..Default::default()
            };
            // SAFETY: the structure holds no addresses.
            unsafe { ioctl(fd, &uapi::DRM_IOCTL_VIRTGPU_MAP, &mut map)? };
            let offset = libc::off_t::try_from(map.offset).map_err(|_| CarrierError::Ioctl {
                ioctl: uapi::DRM_IOCTL_VIRTGPU_MAP.name,
                source: io::Error::from_raw_os_error(libc::EOVERFLOW),
            })?;
            let (at, fixed) = match reservation {
                Some(at) => (at, libc::MAP_FIXED),
                None => (std::ptr::null_mut(), 0),
            };
            // SAFETY: a fresh shared mapping, either where the kernel chooses
            // or over this process's own reservation for it; nothing else
            // in this process refers to that range.
            let ptr = unsafe {
                libc::mmap(
                    at,
                    rounded as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | fixed,
                    fd,
                    offset,
                )
            };
            if ptr == libc::MAP_FAILED {
                let source = io::Error::last_os_error();
                return Err(if source.raw_os_error() == Some(libc::ENOMEM) {
                    CarrierError::OutOfMemory(size)
                } else {
                    CarrierError::Ioctl {
                        ioctl: "mmap of the blob",
                        source,
                    }
                });
            }
            Ok(ptr.cast::<u8>())
        })();
        let ptr = match mapped {
            Ok(ptr) => ptr,
            Err(e) => {
                if let Err(close) = Self::gem_close(fd, handle) {
                    log::warn!("blob {resource_id}: {close}");
                }
                release(reservation);
                return Err(e);
            }
        };
        lock(&self.blobs).insert(
            resource_id,
            Blob {
                addr: ptr as usize,
                len: rounded as usize,
                handles: vec![Handle { ctx_id, handle }],
            },
        );
        log::debug!("blob {resource_id}: {rounded} bytes in context {ctx_id}");
        Ok(BlobMapping {
            resource_id,
            ptr,
            size: rounded,
        })
    }

    fn gem_close(fd: RawFd, handle: u32) -> Result<(), CarrierError> {
        let mut arg = uapi::DrmGemClose { handle, pad: 0 };
        // SAFETY: the structure holds no addresses.
        unsafe { ioctl(fd, &uapi::DRM_IOCTL_GEM_CLOSE, &mut arg) }
    }

    /// Closes `handle` in its context's file, if that context still exists
    /// (a closed file closed its handles itself).
    fn close_handle(&self, handle: Handle) -> Result<(), CarrierError> {
        match lock(&self.contexts).get(&handle.ctx_id).cloned() {
            Some(ctx) => Self::gem_close(ctx.fd.as_raw_fd(), handle.handle),
            None => Ok(()),
        }
    }
}

/// `VIRTGPU_GET_CAPS` for the rgpu capset; checks the protocol version.
fn read_capset(fd: RawFd) -> Result<Capset, CarrierError> {
    let mut buf = vec![0u8; MAX_CAPSET_BYTES];
    let read = |version: u32, buf: &mut Vec<u8>| {
        let mut arg = uapi::VirtgpuGetCaps {
            cap_set_id: CAPSET_ID_RGPU,
            cap_set_ver: version,
            addr: buf.as_mut_ptr() as u64,
            size: buf.len() as u32,
            pad: 0,
        };
        // SAFETY: `buf` is writable for `size` bytes during the call.
        unsafe { ioctl(fd, &uapi::DRM_IOCTL_VIRTGPU_GET_CAPS, &mut arg) }
    };
    // EINVAL for our version: the host's capset is older. Version 0 still
    // reads it, so the mismatch can be reported with the host's version.
    if let Err(e) = read(PROTOCOL_VERSION, &mut buf) {
        match &e {
            CarrierError::Ioctl { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
                read(0, &mut buf)?
            }
            _ => return Err(e),
        }
    }
    let capset = Capset::decode(&buf).map_err(CarrierError::BadCapset)?;
    if capset.protocol_version != PROTOCOL_VERSION {
        return Err(CarrierError::VersionMismatch {
            guest: PROTOCOL_VERSION,
            host: capset.protocol_version,
        });
    }
    Ok(capset)
}

/// `len` bytes of address space, reserved (no memory) for a blob to be
/// mapped over.
/// Where page-locked blobs are placed, one after the other: the host's
/// worker maps each at this process's address of it only where its own
/// address space is free, and left to the kernel, the process's mappings
/// sit below its randomised `mmap` base as the worker's (and its CUDA
/// driver's) do, where they can meet. Far below those bases and above any
/// heap, this window is empty in both (the local carrier's guest memory
/// lies at `0x3000_0000_0000`, below it).
const PLACEMENT_WINDOW: std::ops::Range<u64> = 0x3400_0000_0000..0x3c00_0000_0000;
/// Blobs start on a huge-page boundary in the window.
const PLACEMENT_ALIGN: u64 = 2 << 20;
/// The next address of the window to try.
static PLACEMENT_CURSOR: AtomicU64 = AtomicU64::new(PLACEMENT_WINDOW.start);

/// A fresh `PROT_NONE` reservation of `len` bytes: in the placement window
/// while it has room (a range taken there already is skipped), else where
/// the kernel chooses.
fn reserve(len: usize) -> io::Result<*mut libc::c_void> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let span = (len as u64).next_multiple_of(PLACEMENT_ALIGN);
    for _ in 0..PLACEMENT_TRIES {
        let at = PLACEMENT_CURSOR.fetch_add(span, Ordering::Relaxed);
        if at.saturating_add(span) > PLACEMENT_WINDOW.end {
            break;
        }
        // SAFETY: NOREPLACE never touches an existing mapping (the call
        // fails instead); the range is ours if it succeeds.
        let placed = unsafe {
            libc::mmap(
                std::ptr::without_provenance_mut(at as usize),
                len,
                libc::PROT_NONE,
                flags | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if placed as u64 == at {
            return Ok(placed);
        }
        if placed != libc::MAP_FAILED {
            // A kernel without NOREPLACE took the address as a hint.
            // SAFETY: the reservation just made, which nothing uses.
            unsafe { libc::munmap(placed, len) };
            break;
        }
    }
    // SAFETY: a fresh anonymous reservation nobody else uses.
    let at = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0) };
    if at == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(at)
}

/// Taken ranges of the placement window skipped before the kernel chooses.
const PLACEMENT_TRIES: usize = 4;

/// The debug name as the kernel takes it: no NULs, at most 63 bytes.
fn debug_name(name: &str) -> CString {
    let mut bytes: Vec<u8> = name.bytes().filter(|b| *b != 0).collect();
    bytes.truncate(DEBUG_NAME_BYTES);
    CString::new(bytes).unwrap_or_default()
}

impl Carrier for DrmCarrier {
    fn capset(&self) -> &Capset {
        &self.capset
    }

    fn create_context(&self, name: &str) -> Result<u32, CarrierError> {
        let fd = open_node(&self.node).map_err(|source| CarrierError::Connect {
            path: self.node.display().to_string(),
            source,
        })?;
        // The tag groups this process's contexts in one host worker.
        let name = debug_name(&tagged_debug_name(process_tag(), name, DEBUG_NAME_BYTES));
        let mut params = vec![
            uapi::VirtgpuContextSetParam {
                param: uapi::VIRTGPU_CONTEXT_PARAM_CAPSET_ID,
                value: u64::from(CAPSET_ID_RGPU),
            },
            uapi::VirtgpuContextSetParam {
                param: uapi::VIRTGPU_CONTEXT_PARAM_NUM_RINGS,
                value: 1,
            },
        ];
        if self.params.explicit_debug_name {
            params.push(uapi::VirtgpuContextSetParam {
                param: uapi::VIRTGPU_CONTEXT_PARAM_DEBUG_NAME,
                value: name.as_ptr() as u64,
            });
        }
        let mut init = uapi::VirtgpuContextInit {
            num_params: params.len() as u32,
            pad: 0,
            ctx_set_params: params.as_ptr() as u64,
        };
        // SAFETY: `params` holds `num_params` entries and `name` is a
        // NUL-terminated string; both outlive the call.
        unsafe {
            ioctl(
                fd.as_raw_fd(),
                &uapi::DRM_IOCTL_VIRTGPU_CONTEXT_INIT,
                &mut init,
            )?
        };
        let ctx_id = self.next_ctx.fetch_add(1, Ordering::Relaxed);
        lock(&self.contexts).insert(ctx_id, Arc::new(Context { fd }));
        log::debug!("context {ctx_id} on {}", self.node.display());
        Ok(ctx_id)
    }

    fn destroy_context(&self, ctx_id: u32) -> Result<(), CarrierError> {
        let ctx = lock(&self.contexts)
            .remove(&ctx_id)
            .ok_or(CarrierError::UnknownContext(ctx_id))?;
        // Its file closes its handles; forget them.
        for blob in lock(&self.blobs).values_mut() {
            blob.handles.retain(|h| h.ctx_id != ctx_id);
        }
        // Its pending fences still signal (sync files outlive the DRM file)
        // but nobody will wait for them now.
        lock(&self.fences).retain(|_, (owner, _)| *owner != ctx_id);
        // Closing the file (when no call still uses it) makes the kernel
        // detach its blobs and send CTX_DESTROY.
        drop(ctx);
        Ok(())
    }

    fn create_blob(&self, ctx_id: u32, size: u64) -> Result<BlobMapping, CarrierError> {
        self.create_placed_blob(ctx_id, size, false)
    }

    fn create_same_address_blob(
        &self,
        ctx_id: u32,
        size: u64,
    ) -> Result<BlobMapping, CarrierError> {
        self.create_placed_blob(ctx_id, size, true)
    }

    fn attach_blob(&self, ctx_id: u32, resource_id: u32) -> Result<(), CarrierError> {
        let target = self.context(ctx_id)?;
        let mut blobs = lock(&self.blobs);
        let blob = blobs
            .get_mut(&resource_id)
            .ok_or(CarrierError::UnknownResource(resource_id))?;
        if blob.handles.iter().any(|h| h.ctx_id == ctx_id) {
            return Ok(());
        }
        // Export through any context that still holds it.
        let (source_ctx, source_handle) = {
            let contexts = lock(&self.contexts);
            blob.handles
                .iter()
                .find_map(|h| contexts.get(&h.ctx_id).map(|c| (c.clone(), h.handle)))
                .ok_or(CarrierError::UnknownResource(resource_id))?
        };
        let mut export = uapi::DrmPrimeHandle {
            handle: source_handle,
            flags: uapi::DRM_CLOEXEC | uapi::DRM_RDWR,
            fd: -1,
        };
        // SAFETY: the structure holds no addresses.
        unsafe {
            ioctl(
                source_ctx.fd.as_raw_fd(),
                &uapi::DRM_IOCTL_PRIME_HANDLE_TO_FD,
                &mut export,
            )?
        };
        // SAFETY: the kernel just gave us this dma-buf file descriptor.
        let dmabuf = unsafe { OwnedFd::from_raw_fd(export.fd) };
        let mut import = uapi::DrmPrimeHandle {
            handle: 0,
            flags: 0,
            fd: dmabuf.as_raw_fd(),
        };
        // SAFETY: the structure holds no addresses.
        unsafe {
            ioctl(
                target.fd.as_raw_fd(),
                &uapi::DRM_IOCTL_PRIME_FD_TO_HANDLE,
                &mut import,
            )?
        };
        blob.handles.push(Handle {
            ctx_id,
            handle: import.handle,
        });
        log::debug!("blob {resource_id} attached to context {ctx_id}");
        Ok(())
    }

    fn destroy_blob(&self, _ctx_id: u32, resource_id: u32) -> Result<(), CarrierError> {
        let blob = lock(&self.blobs)
            .remove(&resource_id)
            .ok_or(CarrierError::UnknownResource(resource_id))?;
        // Unmap first: the mapping holds the GEM object (and its file).
        // SAFETY: the range is a mapping this carrier made and nothing else
        // unmaps; its users gave it up by destroying the blob.
        if unsafe { libc::munmap(blob.addr as *mut libc::c_void, blob.len) } != 0 {
            log::warn!("blob {resource_id}: munmap: {}", io::Error::last_os_error());
        }
        // Closing the last handle sends CTX_DETACH_RESOURCE per context and
        // RESOURCE_UNREF.
        let mut result = Ok(());
        for handle in blob.handles {
            if let Err(e) = self.close_handle(handle) {
                log::warn!("blob {resource_id}: {e}");
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }

    fn submit(
        &self,
        ctx_id: u32,
        payload: &[u8],
        fenced: bool,
    ) -> Result<Option<FenceToken>, CarrierError> {
        let ctx = self.context(ctx_id)?;
        let size = u32::try_from(payload.len())
            .map_err(|_| CarrierError::OutOfMemory(payload.len() as u64))?;
        let mut flags = uapi::VIRTGPU_EXECBUF_RING_IDX;
        if fenced {
            flags |= uapi::VIRTGPU_EXECBUF_FENCE_FD_OUT;
        }
        let mut exec = uapi::VirtgpuExecbuffer {
            flags,
            size,
            command: payload.as_ptr() as u64,
            fence_fd: -1,
            ring_idx: 0,
            ..Default::default()
        };
        // SAFETY: `payload` is readable for `size` bytes during the call;
        // no buffer handles, no sync objects.
        unsafe {
            ioctl(
                ctx.fd.as_raw_fd(),
                &uapi::DRM_IOCTL_VIRTGPU_EXECBUFFER,
                &mut exec,
            )?
        };
        if !fenced {
            return Ok(None);
        }
        if exec.fence_fd < 0 {
            return Err(CarrierError::Protocol(
                "EXECBUFFER returned no fence fd".into(),
            ));
        }
        // SAFETY: the kernel just installed this sync_file descriptor for us.
        let fence = unsafe { OwnedFd::from_raw_fd(exec.fence_fd) };
        let token = self.next_fence.fetch_add(1, Ordering::Relaxed);
        lock(&self.fences).insert(token, (ctx_id, fence));
        Ok(Some(FenceToken(token)))
    }

    fn wait_fence(&self, _ctx_id: u32, fence: FenceToken) -> Result<(), CarrierError> {
        let (_, fd) = lock(&self.fences)
            .remove(&fence.0)
            .ok_or(CarrierError::UnknownFence(fence.0))?;
        let spin_until = Instant::now() + self.spin;
        let deadline = self.fence_timeout.map(|t| Instant::now() + t);
        loop {
            let spinning = Instant::now() < spin_until;
            let timeout_ms = if spinning {
                0
            } else {
                match deadline {
                    // Wake up now and then to re-check the deadline.
                    Some(d) => d
                        .saturating_duration_since(Instant::now())
                        .as_millis()
                        .min(1000) as i32,
                    None => 1000,
                }
            };
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(CarrierError::Io(e));
            }
            if n > 0 {
                if pfd.revents & libc::POLLIN != 0 {
                    return Ok(());
                }
                return Err(CarrierError::Protocol(format!(
                    "fence {} poll error (revents {:#x})",
                    fence.0, pfd.revents
                )));
            }
            if let Some(d) = deadline {
                if !spinning && Instant::now() >= d {
                    return Err(CarrierError::Timeout(format!(
                        "fence {} not signalled after {} s (RGPU_FENCE_TIMEOUT_S): the host \
                         daemon is stuck or gone",
                        fence.0,
                        self.fence_timeout.unwrap_or_default().as_secs()
                    )));
                }
            }
        }
    }

    fn raw_control(&self, _request: &[u8], _response_len: usize) -> Result<Vec<u8>, CarrierError> {
        Err(CarrierError::Unsupported(
            "raw control-queue requests: the kernel's virtio_gpu driver owns the control \
             queue (use the local carrier, RGPU_SOCKET, for such tests)",
        ))
    }
}

impl Drop for DrmCarrier {
    fn drop(&mut self) {
        let blobs = std::mem::take(&mut *lock(&self.blobs));
        for (resource_id, blob) in blobs {
            // SAFETY: as in destroy_blob; the carrier is going away, so no
            // user of the mapping is left.
            if unsafe { libc::munmap(blob.addr as *mut libc::c_void, blob.len) } != 0 {
                log::warn!("blob {resource_id}: munmap: {}", io::Error::last_os_error());
            }
        }
        // The files close with their OwnedFds: the kernel frees the rest.
    }
}

#[cfg(test)]
mod tests {
    use super::uapi::*;
    use super::*;
    use std::mem::size_of;

    #[test]
    fn reservations_lie_one_after_the_other_in_the_placement_window() {
        const LEN: usize = 3 << 20;
        let unmap = |at: *mut libc::c_void| {
            // SAFETY: a reservation this test made and nothing uses.
            unsafe { libc::munmap(at, LEN) };
        };
        let Ok(first) = reserve(LEN) else {
            panic!("reserve: {}", io::Error::last_os_error())
        };
        let Ok(second) = reserve(LEN) else {
            panic!("reserve: {}", io::Error::last_os_error())
        };
        for at in [first as u64, second as u64] {
            assert!(PLACEMENT_WINDOW.contains(&at), "{at:#x}");
            assert_eq!(at % PLACEMENT_ALIGN, 0);
        }
        assert!(second as u64 >= first as u64 + LEN as u64);
        // A range of the window something else took is skipped.
        let next = PLACEMENT_CURSOR.load(Ordering::Relaxed);
        // SAFETY: NOREPLACE: nothing existing is touched.
        let squatter = unsafe {
            libc::mmap(
                std::ptr::without_provenance_mut(next as usize),
                LEN,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(squatter as u64, next);
        let Ok(third) = reserve(LEN) else {
            panic!("reserve: {}", io::Error::last_os_error())
        };
        assert!(PLACEMENT_WINDOW.contains(&(third as u64)));
        assert_ne!(third as u64, next);
        for at in [first, second, squatter, third] {
            unmap(at);
        }
    }

    #[test]
    fn structures_have_the_uapi_sizes() {
        assert_eq!(size_of::<DrmVersion>(), 64);
        assert_eq!(size_of::<DrmGemClose>(), 8);
        assert_eq!(size_of::<DrmPrimeHandle>(), 12);
        assert_eq!(size_of::<VirtgpuMap>(), 16);
        assert_eq!(size_of::<VirtgpuExecbuffer>(), 64);
        assert_eq!(size_of::<VirtgpuGetparam>(), 16);
        assert_eq!(size_of::<VirtgpuGetCaps>(), 24);
        assert_eq!(size_of::<VirtgpuResourceCreateBlob>(), 48);
        assert_eq!(size_of::<VirtgpuContextSetParam>(), 16);
        assert_eq!(size_of::<VirtgpuContextInit>(), 16);
    }

    #[test]
    fn field_offsets_match_the_uapi() {
        assert_eq!(std::mem::offset_of!(VirtgpuExecbuffer, fence_fd), 28);
        assert_eq!(std::mem::offset_of!(VirtgpuExecbuffer, ring_idx), 32);
        assert_eq!(std::mem::offset_of!(VirtgpuExecbuffer, in_syncobjs), 48);
        assert_eq!(std::mem::offset_of!(VirtgpuResourceCreateBlob, size), 16);
        assert_eq!(std::mem::offset_of!(VirtgpuResourceCreateBlob, blob_id), 40);
        assert_eq!(std::mem::offset_of!(VirtgpuGetCaps, size), 16);
        assert_eq!(std::mem::offset_of!(DrmVersion, name_len), 16);
        assert_eq!(std::mem::offset_of!(DrmVersion, desc), 56);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Values of the C macros on x86_64 / aarch64 Linux.
        assert_eq!(DRM_IOCTL_VERSION.number, 0xC040_6400);
        assert_eq!(DRM_IOCTL_GEM_CLOSE.number, 0x4008_6409);
        assert_eq!(DRM_IOCTL_PRIME_HANDLE_TO_FD.number, 0xC00C_642D);
        assert_eq!(DRM_IOCTL_PRIME_FD_TO_HANDLE.number, 0xC00C_642E);
        assert_eq!(DRM_IOCTL_VIRTGPU_MAP.number, 0xC010_6441);
        assert_eq!(DRM_IOCTL_VIRTGPU_EXECBUFFER.number, 0xC040_6442);
        assert_eq!(DRM_IOCTL_VIRTGPU_GETPARAM.number, 0xC010_6443);
        assert_eq!(DRM_IOCTL_VIRTGPU_GET_CAPS.number, 0xC018_6449);
        assert_eq!(DRM_IOCTL_VIRTGPU_RESOURCE_CREATE_BLOB.number, 0xC030_644A);
        assert_eq!(DRM_IOCTL_VIRTGPU_CONTEXT_INIT.number, 0xC010_644B);
    }

    #[test]
    fn the_rgpu_capset_bit_is_recognised() {
        let mut p = VirtioGpuParams {
            three_d: true,
            resource_blob: true,
            context_init: true,
            capset_mask: 0x800000,
            explicit_debug_name: true,
        };
        assert!(p.usable());
        p.capset_mask = 0x1;
        assert!(!p.offers_rgpu());
        p.capset_mask = 0x800000;
        p.resource_blob = false;
        assert_eq!(p.missing_features(), vec!["RESOURCE_BLOB"]);
        assert!(!p.usable());
    }

    #[test]
    fn debug_names_are_cut_to_what_the_kernel_keeps() {
        assert_eq!(debug_name("python3").as_bytes(), b"python3");
        assert_eq!(debug_name("a\0b").as_bytes(), b"ab");
        assert_eq!(debug_name(&"x".repeat(100)).as_bytes().len(), 63);
    }

    #[test]
    fn mode_strings_read_like_ls() {
        assert_eq!(mode_string(libc::S_IFCHR | 0o660), "crw-rw----");
        assert_eq!(mode_string(libc::S_IFCHR | 0o600), "crw-------");
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
    }

    #[test]
    fn group_zero_is_named() {
        assert_eq!(group_name(0), "root");
        assert_eq!(user_name(0), "root");
    }
}
