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
//! (export, import) are not supported: an allocation may ask for POSIX
//! file descriptors (not exported), other handle types are
//! CUDA_ERROR_NOT_SUPPORTED, and allocators fall back.

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
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: taken when asked for
/// (PyTorch's expandable segments ask for it), though the export itself is
/// not supported.
const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_*`.
const ACCESS_NONE: u32 = 0;
const ACCESS_READ: u32 = 1;
const ACCESS_READ_WRITE: u32 = 3;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    kind: u32,
    id: c_int,
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
    location: MemLocation,
    flags: u32,
}

pub(crate) struct Physical {
    context: Arc<Context>,
    handle: u32,
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
    read_prop(&ctx, prop)?;
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
            requested_handle_types: 0,
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
