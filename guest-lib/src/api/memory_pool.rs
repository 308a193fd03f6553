//! Memory pools (`cuMemPoolCreate`, `cuDeviceGetDefaultMemPool`,
//! `cuMemAllocFromPoolAsync`...), kept in the guest: an allocation from a
//! pool is an ordinary device allocation on the host (counted against the
//! tenant's memory limit like any other), valid at once and given back
//! when freed, so a pool holds no memory of its own. Its attributes are
//! kept as set, and its statistics count what is allocated from it now and
//! at most (reserved and used are the same: nothing is kept for reuse).
//! A pool made with POSIX file-descriptor handles exports itself as a
//! sealed memfd of this library's (the importing process gets a pool of
//! its own that only imports) and its allocations as their CUDA IPC
//! handles (`cuMemPoolExportPointer` is `cuIpcGetMemHandle`,
//! `cuMemPoolImportPointer` is `cuIpcOpenMemHandle`), so the tenant's IPC
//! registry decides, as for IPC. Per-pool access is not supported.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use rgpu_proto::cuda_result::*;

use crate::abi::{write_out, CUdevice, CUdeviceptr, CUstream};
use crate::api::memory::{alloc, free};
use crate::state::{current, driver, resolve_stream, Registry};

pub(crate) type CUmemoryPool = *mut c_void;

/// `CUmemPool_attribute`.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const RESERVED_MEM_HIGH: c_int = 6;
const USED_MEM_CURRENT: c_int = 7;
const USED_MEM_HIGH: c_int = 8;

#[derive(Debug, Default)]
struct PoolState {
    /// The three reuse flags (attributes 1-3), as set.
    reuse: [c_int; 3],
    release_threshold: u64,
    /// Live allocations from the pool: address -> size.
    allocations: HashMap<u64, u64>,
    used: u64,
    used_high: u64,
}

pub(crate) struct Pool {
    device: CUdevice,
    /// `CUmemAllocationHandleType`s it may be shared with (0 or POSIX_FD).
    handle_types: u32,
    /// Imported from another process: it holds only imported pointers.
    imported: bool,
    state: Mutex<PoolState>,
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// The content of an exported pool's descriptor: this, then the device.
const POOL_MAGIC: &[u8; 16] = b"rgpu-mem-pool-01";
const POOL_SHARE_LEN: usize = POOL_MAGIC.len() + 4;

static POOLS: Registry<Pool> = Registry::new();
/// Pools imported from other processes, made so far: while none was,
/// every free skips looking for imported pointers.
static IMPORTED_POOLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Per device: its default pool and its current pool.
static DEVICE_POOLS: Mutex<Option<HashMap<CUdevice, (usize, usize)>>> = Mutex::new(None);

impl Pool {
    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn new_pool(device: CUdevice) -> *mut c_void {
    new_pool_of(device, 0, false)
}

fn new_pool_of(device: CUdevice, handle_types: u32, imported: bool) -> *mut c_void {
    POOLS.insert(Arc::new(Pool {
        device,
        handle_types,
        imported,
        state: Mutex::new(PoolState {
            // The driver's defaults: reuse allowed.
            reuse: [1, 1, 1],
            ..PoolState::default()
        }),
    }))
}

/// The default and current pools of `device`, made on first use.
fn device_pools(device: CUdevice) -> Result<(usize, usize), u32> {
    let count = driver()?.device_count();
    if usize::try_from(device).map_or(true, |d| d >= count) {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    let pools = guard.get_or_insert_with(HashMap::new);
    Ok(*pools.entry(device).or_insert_with(|| {
        let pool = new_pool(device) as usize;
        (pool, pool)
    }))
}

fn pool(handle: CUmemoryPool) -> Result<Arc<Pool>, u32> {
    POOLS.get(handle).ok_or(CUDA_ERROR_INVALID_VALUE)
}

pub(crate) fn device_get_default_mem_pool(
    pool_out: *mut CUmemoryPool,
    device: CUdevice,
) -> Result<(), u32> {
    let (default, _) = device_pools(device)?;
    write_out(pool_out, default as CUmemoryPool)
}

pub(crate) fn device_get_mem_pool(
    pool_out: *mut CUmemoryPool,
    device: CUdevice,
) -> Result<(), u32> {
    let (_, current) = device_pools(device)?;
    write_out(pool_out, current as CUmemoryPool)
}

pub(crate) fn device_set_mem_pool(device: CUdevice, handle: CUmemoryPool) -> Result<(), u32> {
    let (default, _) = device_pools(device)?;
    if pool(handle)?.device != device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pools) = guard.as_mut() {
        pools.insert(device, (default, handle as usize));
    }
    Ok(())
}

/// `CUmemPoolProps`' head: allocation type, handle types, location.
#[repr(C)]
pub struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: c_int,
}

pub(crate) fn create(pool_out: *mut CUmemoryPool, props: *const PoolProps) -> Result<(), u32> {
    driver()?;
    if pool_out.is_null() || props.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract makes it a CUmemPoolProps, whose
    // first fields these are.
    let props = unsafe { props.read() };
    // Pinned memory of a device, shared (if at all) by file descriptor.
    if props.alloc_type != 1
        || props.location_type != 1
        || props.handle_types & !HANDLE_TYPE_POSIX_FD != 0
    {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    device_pools(props.location_id)?;
    write_out(
        pool_out,
        new_pool_of(props.location_id, props.handle_types, false),
    )
}

pub(crate) fn destroy(handle: CUmemoryPool) -> Result<(), u32> {
    let pool = pool(handle)?;
    let (default, current) = device_pools(pool.device)?;
    if handle as usize == default {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The driver frees what is still allocated from it (closes what was
    // imported into it).
    let left: Vec<u64> = pool.state().allocations.keys().copied().collect();
    for ptr in left {
        if pool.imported {
            crate::api::ipc::close_mem_handle(ptr)?;
            pool.state().allocations.remove(&ptr);
        } else {
            free(ptr)?;
        }
    }
    POOLS.remove(handle);
    if handle as usize == current {
        let mut guard = DEVICE_POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pools) = guard.as_mut() {
            pools.insert(pool.device, (default, default));
        }
    }
    Ok(())
}

pub(crate) fn set_attribute(
    handle: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut state = pool.state();
    match attribute {
        REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            // SAFETY: non-NULL; an int for these attributes.
            let flag = unsafe { value.cast::<c_int>().read() };
            state.reuse[(attribute - 1) as usize] = flag;
        }
        RELEASE_THRESHOLD => {
            // SAFETY: non-NULL; a cuuint64_t for this attribute.
            state.release_threshold = unsafe { value.cast::<u64>().read() };
        }
        RESERVED_MEM_HIGH | USED_MEM_HIGH => {
            // SAFETY: non-NULL; a cuuint64_t for these attributes.
            if unsafe { value.cast::<u64>().read() } != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            state.used_high = state.used;
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

pub(crate) fn get_attribute(
    handle: CUmemoryPool,
    attribute: c_int,
    value: *mut c_void,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    let state = pool.state();
    match attribute {
        REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            write_out(value.cast::<c_int>(), state.reuse[(attribute - 1) as usize])
        }
        RELEASE_THRESHOLD => write_out(value.cast::<u64>(), state.release_threshold),
        RESERVED_MEM_CURRENT | USED_MEM_CURRENT => write_out(value.cast::<u64>(), state.used),
        RESERVED_MEM_HIGH | USED_MEM_HIGH => write_out(value.cast::<u64>(), state.used_high),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The device a pool's access descriptor or query names: a device of
/// this process (CUDA_ERROR_INVALID_DEVICE else), and whether it is the
/// pool's own.
fn access_device(pool: &Pool, location: &crate::api::vmm::MemLocation) -> Result<bool, u32> {
    if location.kind() != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    driver()?.device(location.id())?;
    Ok(location.id() == pool.device)
}

/// `cuMemPoolSetAccess`: the pool's own device reads and writes its
/// memory, as it always does natively. Another device would need peer
/// access, which rgpu's devices do not have: CUDA_ERROR_NOT_SUPPORTED.
pub(crate) fn set_access(
    handle: CUmemoryPool,
    map: *const crate::api::vmm::AccessDesc,
    count: usize,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    if map.is_null() || count == 0 || count > MAX_ACCESS_DESCS {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the API contract gives `count` descriptors
    // (bounded above).
    let descs = unsafe { std::slice::from_raw_parts(map, count) };
    for desc in descs {
        let own = access_device(&pool, &desc.location)?;
        match (own, desc.flags) {
            (true, crate::api::vmm::ACCESS_READ_WRITE) => {}
            (true, _) => return Err(CUDA_ERROR_INVALID_VALUE),
            (false, _) => {
                log::debug!("rgpu: cuMemPoolSetAccess for another device: no peer access");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// `cuMemPoolGetAccess`: read and write for the pool's own device, none
/// for another. A device that does not exist is CUDA_ERROR_INVALID_VALUE
/// here (NVIDIA's driver on the H200), where `cuMemPoolSetAccess` says
/// CUDA_ERROR_INVALID_DEVICE.
pub(crate) fn get_access(
    flags: *mut c_int,
    handle: CUmemoryPool,
    location: *const crate::api::vmm::MemLocation,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    if location.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUmemLocation.
    let own = access_device(&pool, unsafe { &*location }).map_err(|code| match code {
        CUDA_ERROR_INVALID_DEVICE => CUDA_ERROR_INVALID_VALUE,
        other => other,
    })?;
    let access = if own {
        crate::api::vmm::ACCESS_READ_WRITE
    } else {
        0
    };
    write_out(flags, access as c_int)
}

/// Access descriptors one `cuMemPoolSetAccess` takes at most.
const MAX_ACCESS_DESCS: usize = 1024;

/// Nothing is kept for reuse: there is nothing to trim.
pub(crate) fn trim_to(handle: CUmemoryPool, _keep: usize) -> Result<(), u32> {
    pool(handle).map(|_| ())
}

fn alloc_from_pool_on(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    let (ctx, _) = resolve_stream(stream, per_thread)?;
    // An imported pool only imports.
    if ctx.device != pool.device || pool.imported {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    alloc(dptr, size)?;
    // SAFETY: `alloc` wrote the address there.
    let ptr = unsafe { dptr.read() };
    let mut state = pool.state();
    state.allocations.insert(ptr, size as u64);
    state.used += size as u64;
    state.used_high = state.used_high.max(state.used);
    Ok(())
}

pub(crate) fn alloc_from_pool_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
) -> Result<(), u32> {
    alloc_from_pool_on(dptr, size, handle, stream, false)
}

pub(crate) fn alloc_from_pool_async_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUmemoryPool,
    stream: CUstream,
) -> Result<(), u32> {
    alloc_from_pool_on(dptr, size, handle, stream, true)
}

/// `cuMemAllocAsync`: from the current context device's current pool.
pub(crate) fn alloc_async_from_current(
    dptr: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
    per_thread: bool,
) -> Result<(), u32> {
    let ctx = current()?;
    let (_, pool) = device_pools(ctx.device)?;
    alloc_from_pool_on(dptr, size, pool as CUmemoryPool, stream, per_thread)
}

/// The device a `CUmemLocation` and `CUmemAllocationType` name: pinned
/// memory of a device is what pools here hold (host and managed pools are
/// CUDA_ERROR_NOT_SUPPORTED).
fn device_at(
    location: *const crate::api::vmm::MemLocation,
    alloc_type: c_int,
) -> Result<CUdevice, u32> {
    if location.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUmemLocation.
    let location = unsafe { location.read() };
    if location.kind() != 1 || alloc_type != 1 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(location.id())
}

/// `cuMemGetDefaultMemPool` (CUDA 13): a device's default pool.
pub(crate) fn get_default_mem_pool(
    pool_out: *mut CUmemoryPool,
    location: *const crate::api::vmm::MemLocation,
    alloc_type: c_int,
) -> Result<(), u32> {
    device_get_default_mem_pool(pool_out, device_at(location, alloc_type)?)
}

/// `cuMemGetMemPool` (CUDA 13): a device's current pool.
pub(crate) fn get_mem_pool(
    pool_out: *mut CUmemoryPool,
    location: *const crate::api::vmm::MemLocation,
    alloc_type: c_int,
) -> Result<(), u32> {
    device_get_mem_pool(pool_out, device_at(location, alloc_type)?)
}

/// `cuMemSetMemPool` (CUDA 13): a device's current pool.
pub(crate) fn set_mem_pool(
    location: *const crate::api::vmm::MemLocation,
    alloc_type: c_int,
    handle: CUmemoryPool,
) -> Result<(), u32> {
    device_set_mem_pool(device_at(location, alloc_type)?, handle)
}

/// `cuMemPoolExportToShareableHandle`: a sealed memfd naming the pool's
/// device (its number travels as the descriptor), for a pool made with
/// POSIX file-descriptor handles.
pub(crate) fn export_to_shareable_handle(
    handle_out: *mut c_void,
    handle: CUmemoryPool,
    handle_type: c_int,
    flags: u64,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    let wanted = u32::try_from(handle_type).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if handle_out.is_null()
        || flags != 0
        || pool.imported
        || wanted != HANDLE_TYPE_POSIX_FD
        || pool.handle_types & HANDLE_TYPE_POSIX_FD == 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut content = POOL_MAGIC.to_vec();
    content.extend_from_slice(&pool.device.to_le_bytes());
    let fd = crate::api::vmm::sealed_memfd(&content).map_err(|e| {
        log::warn!("rgpu: cuMemPoolExportToShareableHandle: cannot make its descriptor: {e}");
        CUDA_ERROR_OUT_OF_MEMORY
    })?;
    write_out(handle_out.cast::<c_int>(), fd)
}

/// `cuMemPoolImportFromShareableHandle`: a pool of this process that
/// imports what the exporting process's pool exports.
pub(crate) fn import_from_shareable_handle(
    pool_out: *mut CUmemoryPool,
    os_handle: *mut c_void,
    handle_type: c_int,
    flags: u64,
) -> Result<(), u32> {
    driver()?;
    if pool_out.is_null() || flags != 0 || handle_type != HANDLE_TYPE_POSIX_FD as c_int {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The descriptor's number travels as the pointer's value.
    let fd = c_int::try_from(os_handle as usize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let mut content = [0u8; POOL_SHARE_LEN + 1];
    // SAFETY: reads at most `content.len()` bytes into it; a bad
    // descriptor fails.
    let read = unsafe { libc::pread(fd, content.as_mut_ptr().cast(), content.len(), 0) };
    let (magic, device) = content.split_at(POOL_MAGIC.len());
    let device = device
        .get(..4)
        .and_then(|d| d.try_into().ok())
        .map(CUdevice::from_le_bytes)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if usize::try_from(read).ok() != Some(POOL_SHARE_LEN) || magic != POOL_MAGIC {
        log::debug!("rgpu: cuMemPoolImportFromShareableHandle: descriptor {fd} is none of rgpu's");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    device_pools(device)?;
    IMPORTED_POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    write_out(pool_out, new_pool_of(device, HANDLE_TYPE_POSIX_FD, true))
}

/// `cuMemPoolExportPointer`: the IPC handle of an allocation of a pool
/// made with POSIX file-descriptor handles.
pub(crate) fn export_pointer(
    share_data: *mut crate::api::ipc::IpcHandle,
    ptr: CUdeviceptr,
) -> Result<(), u32> {
    let exportable = POOLS.values().into_iter().any(|pool| {
        !pool.imported
            && pool.handle_types & HANDLE_TYPE_POSIX_FD != 0
            && pool.state().allocations.contains_key(&ptr)
    });
    if !exportable {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::api::ipc::get_mem_handle(share_data, ptr)
}

/// `cuMemPoolImportPointer`: opens what another process exported, in an
/// imported pool (freed with `cuMemFree` or `cuMemFreeAsync`, which close
/// it).
pub(crate) fn import_pointer(
    ptr_out: *mut CUdeviceptr,
    handle: CUmemoryPool,
    share_data: *const crate::api::ipc::IpcHandle,
) -> Result<(), u32> {
    let pool = pool(handle)?;
    if !pool.imported || ptr_out.is_null() || share_data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passes a readable CUmemPoolPtrExportData.
    let data = unsafe { share_data.read() };
    // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as the driver opens them.
    crate::api::ipc::open_mem_handle(ptr_out, data, 1)?;
    // SAFETY: the open wrote the address there.
    let ptr = unsafe { ptr_out.read() };
    pool.state().allocations.insert(ptr, 0);
    Ok(())
}

/// Whether `ptr` was imported into a pool of this process: it goes from
/// that pool, and the caller closes it.
pub(crate) fn forget_imported(ptr: CUdeviceptr) -> bool {
    if IMPORTED_POOLS.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return false;
    }
    POOLS
        .values()
        .into_iter()
        .filter(|pool| pool.imported)
        .any(|pool| pool.state().allocations.remove(&ptr).is_some())
}

/// `cuMemFreeAsync` of an address: forgotten by the pool it came from.
pub(crate) fn forget(ptr: CUdeviceptr) {
    for pool in POOLS.values() {
        let mut state = pool.state();
        if let Some(size) = state.allocations.remove(&ptr) {
            state.used = state.used.saturating_sub(size);
            return;
        }
    }
}
