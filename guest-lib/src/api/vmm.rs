//! The virtual-memory management API (`cuMemCreate`, `cuMemAddressReserve`,
//! `cuMemMap`...), backed by the host driver's own calls: the addresses
//! the guest gets back are the device addresses kernels dereference.
//! Physical allocations count against the tenant's memory limit on the
//! host (until released and unmapped), and a reserved range is one of the
//! context's device ranges (guest and host pointer checks), so copies may
//! span mappings side by side.
//!
//! Handles are guest objects (their addresses, as for streams); retaining
//! a mapping's handle (`cuMemRetainAllocationHandle`) counts a reference
//! that `cuMemRelease` gives back, as the driver does. Shareable handles
//! are POSIX file descriptors of this library's own: a sealed memfd
//! holding the token under which the tenant's registry on the host keeps
//! the driver's descriptor (rgpu_session::shareable); the application
//! passes it to another process as it would the driver's, and that
//! process's import hands the token back. Other handle types (fabric,
//! Windows) are CUDA_ERROR_NOT_SUPPORTED, and allocators fall back.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_proto::cuda_result::*;
use rgpu_proto::Command;

use crate::abi::{write_out, CUdeviceptr};
use crate::device_ranges;
use crate::state::{current, driver, Context, Registry};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (PyTorch's expandable
/// segments ask for it).
const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// What a shareable descriptor of this library holds: this tag, then the
/// host's token.
const SHAREABLE_MAGIC: &[u8; 16] = b"rgpu-shareable-1";
const SHAREABLE_LEN: usize = SHAREABLE_MAGIC.len() + 32;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_*`.
const ACCESS_NONE: u32 = 0;
const ACCESS_READ: u32 = 1;
pub(crate) const ACCESS_READ_WRITE: u32 = 3;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    kind: u32,
    id: c_int,
}

impl MemLocation {
    /// `CUmemLocationType` (1: a device).
    pub(crate) fn kind(&self) -> u32 {
        self.kind
    }

    pub(crate) fn id(&self) -> c_int {
        self.id
    }
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocationProp {
    kind: u32,
    requested_handle_types: u32,
    location: MemLocation,
    win32_handle_metadata: *mut c_void,
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    pub(crate) location: MemLocation,
    pub(crate) flags: u32,
}

pub(crate) struct Physical {
    context: Arc<Context>,
    handle: u32,
    /// The shareable handle types it was created with (or imported as).
    handle_types: u32,
    /// The creation's reference, and one per `cuMemRetainAllocationHandle`.
    references: AtomicU32,
}

static PHYSICAL: Registry<Physical> = Registry::new();

/// What the guest mapped where: address -> (size, physical handle key),
/// and each mapping's access flags.
struct Mapped {
    size: u64,
    physical: usize,
    access: u32,
}

static MAPPINGS: Mutex<BTreeMap<u64, Mapped>> = Mutex::new(BTreeMap::new());

/// The mapping holding device address `ptr`: its start and size, and the
/// context that created its physical memory (pointer attributes: XLA asks
/// the device ordinal of addresses in its virtual-memory pool).
pub(crate) fn mapping_at(ptr: u64) -> Option<(u64, u64, Arc<Context>)> {
    let (start, size, physical) = mapping_holding(&mappings(), ptr)
        .map(|(start, mapping)| (start, mapping.size, mapping.physical))?;
    let physical = PHYSICAL.get(physical as *mut c_void)?;
    Some((start, size, physical.context.clone()))
}

/// The mapping of `mapped` holding device address `ptr`, with its start.
fn mapping_holding(mapped: &BTreeMap<u64, Mapped>, ptr: u64) -> Option<(u64, &Mapped)> {
    mapped
        .range(..=ptr)
        .next_back()
        .filter(|(start, mapping)| ptr - **start < mapping.size)
        .map(|(start, mapping)| (*start, mapping))
}

fn mappings() -> std::sync::MutexGuard<'static, BTreeMap<u64, Mapped>> {
    MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The device a location names must be the context's.
fn check_location(ctx: &Context, location: &MemLocation) -> Result<(), u32> {
    if location.kind != LOCATION_TYPE_DEVICE || location.id != ctx.device {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(())
}

fn read_prop(ctx: &Context, prop: *const AllocationProp) -> Result<AllocationProp, u32> {
    let prop = read_prop_unchecked(prop)?;
    check_location(ctx, &prop.location)?;
    Ok(prop)
}

/// The property struct, before its device is checked against a context.
fn read_prop_unchecked(prop: *const AllocationProp) -> Result<AllocationProp, u32> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUmemAllocationProp.
    let prop = unsafe { prop.read() };
    if prop.kind != ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if prop.requested_handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
        // Said once: allocators (XLA's) ask with each handle type in turn
        // and settle on one that is taken.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            log::info!(
                "rgpu: shareable handle types {:#x} (fabric, Windows) are not supported: \
                 CUDA_ERROR_NOT_SUPPORTED",
                prop.requested_handle_types
            );
        });
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(prop)
}

/// A context of the device a granularity query names: the current one if
/// it is that device's, else the device's primary context while active.
/// The driver answers the query without any context; allocators (XLA's)
/// ask from threads where none is current.
fn context_of_device(device: c_int) -> Result<Arc<Context>, u32> {
    if let Ok(ctx) = current() {
        if ctx.device == device {
            return Ok(ctx);
        }
    }
    let primary = driver()?
        .primary(device)
        .map_err(|_| CUDA_ERROR_INVALID_DEVICE)?
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .context
        .clone();
    primary.ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

pub(crate) fn get_granularity(
    granularity: *mut usize,
    prop: *const AllocationProp,
    option: c_int,
) -> Result<(), u32> {
    let wanted = read_prop_unchecked(prop)?;
    if wanted.location.kind != LOCATION_TYPE_DEVICE {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let ctx = context_of_device(wanted.location.id)?;
    if granularity.is_null() || !(0..=1).contains(&option) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let payload = ctx.call(&Command::MemGranularity {
        option: option as u32,
    })?;
    let bytes: [u8; 8] = payload
        .as_slice()
        .try_into()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let value = usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    write_out(granularity, value)
}

pub(crate) fn create(
    handle: *mut c_ulonglong,
    size: usize,
    prop: *const AllocationProp,
    flags: c_ulonglong,
) -> Result<(), u32> {
    let ctx = current()?;
    let prop = read_prop(&ctx, prop)?;
    if handle.is_null() || size == 0 || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let guest_handle = ctx.new_handle()?;
    ctx.call(&Command::MemCreate {
        handle: guest_handle,
        size: size as u64,
    })?;
    let key = PHYSICAL.insert(Arc::new(Physical {
        context: ctx,
        handle: guest_handle,
        handle_types: prop.requested_handle_types,
        references: AtomicU32::new(1),
    }));
    write_out(handle, key as c_ulonglong)
}

/// Only POSIX file descriptors; fabric and Windows handles are not offered.
fn check_handle_type(handle_type: u32) -> Result<(), u32> {
    match handle_type {
        HANDLE_TYPE_POSIX_FD => Ok(()),
        _ => {
            log::info!(
                "rgpu: shareable handle type {handle_type:#x} (fabric, Windows) is not \
                 supported: CUDA_ERROR_NOT_SUPPORTED"
            );
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

/// `cuMemExportToShareableHandle`: a new descriptor naming the allocation,
/// for this tenant's processes to import.
pub(crate) fn export_to_shareable_handle(
    shareable: *mut c_void,
    handle: c_ulonglong,
    handle_type: u32,
    flags: c_ulonglong,
) -> Result<(), u32> {
    driver()?;
    check_handle_type(handle_type)?;
    if shareable.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let physical = PHYSICAL
        .get(handle as usize as *mut c_void)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // As the driver: only what the allocation asked to share.
    if physical.handle_types & HANDLE_TYPE_POSIX_FD == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let token = physical.context.call(&Command::MemExportShareable {
        handle: physical.handle,
    })?;
    if token.len() != SHAREABLE_LEN - SHAREABLE_MAGIC.len() {
        return Err(CUDA_ERROR_UNKNOWN);
    }
    let mut content = SHAREABLE_MAGIC.to_vec();
    content.extend_from_slice(&token);
    let fd = sealed_memfd(&content).map_err(|e| {
        log::warn!("rgpu: cuMemExportToShareableHandle: cannot make its descriptor: {e}");
        CUDA_ERROR_OUT_OF_MEMORY
    })?;
    write_out(shareable.cast::<c_int>(), fd)
}

/// A memfd holding `content`, sealed against change; its descriptor, which
/// the caller owns (not close-on-exec, as the driver's).
pub(crate) fn sealed_memfd(content: &[u8]) -> std::io::Result<c_int> {
    use std::io::Write;
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    // SAFETY: a NUL-terminated name and known flags.
    let raw = unsafe { libc::memfd_create(c"rgpu-shareable".as_ptr(), libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just created, ours until handed out.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(fd.try_clone()?).write_all(content)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: a memfd of ours made with MFD_ALLOW_SEALING.
    if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd.into_raw_fd())
}

/// `cuMemImportFromShareableHandle`: what another process of the tenant
/// exported, as a new allocation handle of the current context. A
/// descriptor this library did not make, or a token the host does not
/// know (another tenant's, a forged one, an allocation released since),
/// is CUDA_ERROR_INVALID_VALUE.
pub(crate) fn import_from_shareable_handle(
    handle: *mut c_ulonglong,
    os_handle: *mut c_void,
    handle_type: u32,
) -> Result<(), u32> {
    let ctx = current()?;
    check_handle_type(handle_type)?;
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The descriptor's number travels as the pointer's value.
    let fd = c_int::try_from(os_handle as usize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut content = [0u8; SHAREABLE_LEN + 1];
    // SAFETY: reads at most `content.len()` bytes into it; a bad
    // descriptor fails.
    let read = unsafe { libc::pread(fd, content.as_mut_ptr().cast(), content.len(), 0) };
    let (magic, token) = content.split_at(SHAREABLE_MAGIC.len());
    let token: [u8; 32] = token
        .get(..32)
        .and_then(|t| t.try_into().ok())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if usize::try_from(read).ok() != Some(SHAREABLE_LEN) || magic != SHAREABLE_MAGIC {
        log::debug!("rgpu: cuMemImportFromShareableHandle: descriptor {fd} is none of rgpu's");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let guest_handle = ctx.new_handle()?;
    ctx.call(&Command::MemImportShareable {
        handle: guest_handle,
        token,
    })?;
    let key = PHYSICAL.insert(Arc::new(Physical {
        context: ctx,
        handle: guest_handle,
        handle_types: HANDLE_TYPE_POSIX_FD,
        references: AtomicU32::new(1),
    }));
    write_out(handle, key as c_ulonglong)
}

pub(crate) fn release(handle: c_ulonglong) -> Result<(), u32> {
    driver()?;
    let key = handle as usize as *mut c_void;
    let physical = PHYSICAL.get(key).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if physical.references.fetch_sub(1, Ordering::AcqRel) > 1 {
        return Ok(());
    }
    PHYSICAL.remove(key);
    physical.context.call(&Command::MemRelease {
        handle: physical.handle,
    })?;
    Ok(())
}

pub(crate) fn address_reserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    address: CUdeviceptr,
    flags: c_ulonglong,
) -> Result<(), u32> {
    let ctx = current()?;
    if ptr.is_null() || size == 0 || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let payload = ctx.call(&Command::MemAddressReserve {
        size: size as u64,
        alignment: alignment as u64,
        address,
    })?;
    let bytes: [u8; 8] = payload
        .as_slice()
        .try_into()
        .map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let reserved = u64::from_le_bytes(bytes);
    device_ranges::add_allocation(ctx.space, ctx.id, reserved, size as u64);
    write_out(ptr, reserved)
}

pub(crate) fn address_free(ptr: CUdeviceptr, size: usize) -> Result<(), u32> {
    let ctx = current()?;
    ctx.call(&Command::MemAddressFree {
        address: ptr,
        size: size as u64,
    })?;
    device_ranges::remove_allocation(ctx.space, ptr);
    Ok(())
}

pub(crate) fn map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: c_ulonglong,
    flags: c_ulonglong,
) -> Result<(), u32> {
    driver()?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let key = handle as usize;
    let physical = PHYSICAL
        .get(key as *mut c_void)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    physical.context.call(&Command::MemMap {
        address: ptr,
        size: size as u64,
        offset: offset as u64,
        handle: physical.handle,
    })?;
    mappings().insert(
        ptr,
        Mapped {
            size: size as u64,
            physical: key,
            access: ACCESS_NONE,
        },
    );
    Ok(())
}

pub(crate) fn unmap(ptr: CUdeviceptr, size: usize) -> Result<(), u32> {
    let ctx = current()?;
    ctx.call(&Command::MemUnmap {
        address: ptr,
        size: size as u64,
    })?;
    mappings().remove(&ptr);
    Ok(())
}

pub(crate) fn set_access(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> Result<(), u32> {
    let ctx = current()?;
    if desc.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract gives `count` descriptors.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) };
    // One device per guest context: every descriptor must name it.
    let mut flags = None;
    for d in descs {
        check_location(&ctx, &d.location)?;
        if !matches!(d.flags, ACCESS_READ | ACCESS_READ_WRITE) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        flags = Some(d.flags);
    }
    let flags = flags.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    ctx.call(&Command::MemSetAccess {
        address: ptr,
        size: size as u64,
        flags,
    })?;
    let end = ptr.saturating_add(size as u64);
    for (_, mapped) in mappings().range_mut(ptr..end) {
        mapped.access = flags;
    }
    Ok(())
}

pub(crate) fn get_access(
    flags: *mut c_ulonglong,
    location: *const MemLocation,
    ptr: CUdeviceptr,
) -> Result<(), u32> {
    let ctx = current()?;
    if location.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUmemLocation.
    check_location(&ctx, unsafe { &*location })?;
    let access = mapping_holding(&mappings(), ptr)
        .map(|(_, m)| m.access)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_out(flags, c_ulonglong::from(access))
}

pub(crate) fn retain_allocation_handle(
    handle: *mut c_ulonglong,
    address: *mut c_void,
) -> Result<(), u32> {
    driver()?;
    let ptr = address as u64;
    let key = mapping_holding(&mappings(), ptr)
        .map(|(_, m)| m.physical)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let physical = PHYSICAL
        .get(key as *mut c_void)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    physical.references.fetch_add(1, Ordering::AcqRel);
    write_out(handle, key as c_ulonglong)
}

pub(crate) fn get_properties_from_handle(
    prop: *mut AllocationProp,
    handle: c_ulonglong,
) -> Result<(), u32> {
    driver()?;
    let physical = PHYSICAL
        .get(handle as usize as *mut c_void)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_out(
        prop,
        AllocationProp {
            kind: ALLOCATION_TYPE_PINNED,
            requested_handle_types: physical.handle_types,
            location: MemLocation {
                kind: LOCATION_TYPE_DEVICE,
                id: physical.context.device,
            },
            win32_handle_metadata: std::ptr::null_mut(),
            compression_type: 0,
            gpu_direct_rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    )
}
